"""The study harness (study/run_study.py, study/study_report.py): statistics by hand, steps-to-target, the
method check, the results document on synthetic runs, and resumability on a tiny real study."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import yaml

from xrpo.algo.presets import list_presets
from xrpo.trainer.config_loader import build_config, load_config_file, to_dict

ROOT = Path(__file__).resolve().parents[2]

# t_{0.975, 2} = 4.302652729749462 (scipy.stats.t.ppf(0.975, 2))
T975_2 = 4.302652729749462


# ================================================================================================ statistics
def test_group_signal_counts_a_prompts_rollouts_over_every_round_of_its_step(study_modules):
    _, rep = study_modules
    rounds = [
        # step 1: base round and one planning round; prompt a: 0/4 then 1/2 -> mixed over the step (6 rollouts)
        {"step": 1, "round": 0, "alloc": [4, 4], "successes": [0, 4], "problems": ["a", "b"]},
        {"step": 1, "round": 1, "alloc": [2, 0], "successes": [1, 0], "problems": ["a", "b"]},
        # step 2: two generation batches of other prompts (DAPO's refill): c mixed (8), d and e all wrong (8 + 8)
        {"step": 2, "round": 0, "alloc": [8, 8], "successes": [3, 0], "problems": ["c", "d"], "batch": 0},
        {"step": 2, "round": 0, "alloc": [8], "successes": [0], "problems": ["e"], "batch": 1},
        # a resumed step's row, written again identically: counted once
        {"step": 2, "round": 0, "alloc": [8], "successes": [0], "problems": ["e"], "batch": 1},
        {"step": 3, "round": 0, "alloc": [4]},  # no outcomes logged: skipped
    ]
    got = rep.group_signal(rounds)
    # groups a (6, mixed), b (4, all right), c (8, mixed), d (8), e (8): 14 of 34 rollouts, 3 of 5 groups flat
    # mixed groups a and c over 2 steps, of 6 and 8 rollouts; each step's update has one prompt with a gradient
    assert got == {
        "nonzero_share": 14 / 34,
        "zero_variance_groups": 3 / 5,
        "nonzero_per_step": 14 / 2,
        "mixed_groups_per_step": 2 / 2,
        "mixed_group_size": 14 / 2,
        "update_prompts": 1.0,
    }
    # two mixed prompts in one step, groups of 2 (1 of 2) and 8 (4 of 8): weights 2 sqrt(2 * 1 / 4) = sqrt(2) and
    # 2 sqrt(8 * 7 / 4) = 2 sqrt(14); effective prompts (w1 + w2)^2 / (w1^2 + w2^2)
    two = rep.group_signal([{"step": 1, "round": 0, "alloc": [2, 8], "successes": [1, 4], "problems": ["a", "b"]}])
    w1, w2 = 2**0.5, 2 * 14**0.5
    assert two["update_prompts"] == pytest.approx((w1 + w2) ** 2 / (w1 * w1 + w2 * w2), rel=1e-12)
    assert rep.group_signal([{"step": 1, "round": 0, "alloc": [4]}]) is None


def test_mean_ci_hand(study_modules):
    _, rep = study_modules
    s = rep.mean_ci([0.1, 0.2, 0.3])
    # mean 0.2; s = sqrt(((-.1)^2 + 0 + .1^2) / 2) = 0.1; half = t_{0.975,2} * 0.1 / sqrt(3) = 0.2484137711...
    assert s.mean == pytest.approx(0.2, abs=1e-15)
    assert s.half == pytest.approx(T975_2 * 0.1 / math.sqrt(3), rel=1e-12)
    assert s.half == pytest.approx(0.24841377117503302, rel=1e-12)
    assert s.n == 3
    assert s.fmt() == "20.00 ± 24.84"
    # n = 4: values 1, 2, 3, 4: mean 2.5, s = sqrt(5/3) = 1.2909944; t_{0.975,3} = 3.1824463;
    # half = 3.1824463 * 1.2909944 / 2 = 2.0542603
    s4 = rep.mean_ci([1, 2, 3, 4])
    assert s4.half == pytest.approx(3.1824463052837078 * math.sqrt(5 / 3) / 2, rel=1e-12)


def test_mean_ci_edge_cases(study_modules):
    _, rep = study_modules
    one = rep.mean_ci([0.25])
    assert one.mean == 0.25 and math.isnan(one.half) and one.n == 1 and one.fmt() == "25.00"
    empty = rep.mean_ci([])
    assert empty.n == 0 and empty.fmt() == "—"
    same = rep.mean_ci([0.5, 0.5, 0.5])
    assert same.half == 0.0
    with pytest.raises(ValueError, match="finite"):
        rep.mean_ci([0.1, float("nan")])


def test_paired_difference_uses_common_seeds(study_modules):
    _, rep = study_modules
    a = {0: 0.5, 1: 0.7, 2: 0.6}
    b = {0: 0.4, 1: 0.5, 2: 0.6, 3: 0.9}  # seed 3 has no partner: left out
    d = rep.paired_difference(a, b)
    # differences .1, .2, 0: mean .1, s = .1, half = t_{0.975,2} * .1 / sqrt(3)
    assert d.n == 3 and d.mean == pytest.approx(0.1, abs=1e-12)
    assert d.half == pytest.approx(0.24841377117503302, rel=1e-9)


def test_steps_to_target(study_modules):
    _, rep = study_modules
    steps, vals = [0, 20, 40], [0.05, 0.07, 0.11]
    # crossing between step 20 (0.07) and 40 (0.11): 20 + (0.09 - 0.07) / (0.11 - 0.07) * 20 = 30
    assert rep.steps_to_target(steps, vals, 0.09) == pytest.approx(30.0)
    # exactly at a validation: 0 + (0.07 - 0.05) / (0.07 - 0.05) * 20 = 20
    assert rep.steps_to_target(steps, vals, 0.07) == pytest.approx(20.0)
    # reached before training
    assert rep.steps_to_target(steps, vals, 0.05) == 0.0
    assert rep.steps_to_target(steps, vals, 0.01) == 0.0
    # never reached
    assert rep.steps_to_target(steps, vals, 0.2) is None
    # the first crossing counts, even when the curve falls back below later
    assert rep.steps_to_target([0, 10, 20, 30], [0.0, 0.4, 0.1, 0.5], 0.2) == pytest.approx(5.0)
    # order of the input does not matter
    assert rep.steps_to_target([40, 0, 20], [0.11, 0.05, 0.07], 0.09) == pytest.approx(30.0)
    with pytest.raises(ValueError, match="2 steps but 3 values"):
        rep.steps_to_target([0, 1], [0.1, 0.2, 0.3], 0.1)


def test_mean_curve_keeps_common_steps(study_modules):
    _, rep = study_modules
    steps, stats = rep.mean_curve([{0: 0.1, 10: 0.2, 20: 0.3}, {0: 0.3, 10: 0.4}])
    assert steps == [0, 10]
    assert [s.mean for s in stats] == pytest.approx([0.2, 0.3])


def test_read_jsonl_recovers_a_row_glued_to_a_partial_line(study_modules, tmp_path):
    _, rep = study_modules
    p = tmp_path / "metrics.jsonl"
    # a killed writer left '{"step": 3, "a' and the resumed run appended step 3 again right after it
    p.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n{"step": 3, "a{"step": 3, "a": 30}\n{"step": 4, "a": 4}\n')
    rows, bad = rep.read_jsonl(p)
    assert bad == 1
    assert [r["a"] for r in rep.last_per_step(rows)] == [1, 2, 30, 4]
    # a resumed run rewrites steps after its checkpoint: the last row of each step wins
    rows = [{"step": 1, "a": 1}, {"step": 2, "a": 2}, {"step": 2, "a": 9}]
    assert [r["a"] for r in rep.last_per_step(rows)] == [1, 9]


# ================================================================================================ the method check
def test_unknown_methods_are_listed_up_front(study_modules, capsys):
    study, _ = study_modules
    rc = study.main(["--methods", "grpo", "nosuch", "xrpo", "alsono", "--plan"], log=lambda *_: None)
    assert rc == 2
    err = capsys.readouterr().err
    assert "unknown method(s) nosuch, alsono" in err
    assert "valid: " + ", ".join(list_presets()) in err


def test_default_methods_name_the_paper_set(study_modules):
    study, _ = study_modules
    assert set(study.DEFAULT_METHODS) >= {
        "grpo",
        "dapo",
        "gspo",
        "treepo",
        "cures",
        "xrpo",
        "xrpo-no-icl",
        "xrpo-no-as",
        "xrpo-no-as-icl",
        "xrpo-no-hrp",
    }
    # every default method is a preset, so the default study starts; a list with one unknown name does not
    assert [m for m in study.DEFAULT_METHODS if m not in list_presets()] == []
    study.check_methods(list(study.DEFAULT_METHODS))
    with pytest.raises(study.StudyError, match="unknown method"):
        study.check_methods([*study.DEFAULT_METHODS, "treepo-typo"])


def test_overrides_of_the_study_settings_are_refused(study_modules, tmp_path, capsys):
    study, _ = study_modules
    rc = study.main(
        ["--methods", "grpo", "--config-overrides", "steps=5", "--plan", "--out", str(tmp_path)], log=lambda *_: None
    )
    assert rc == 2 and "steps is set by the study for every run; use --steps" in capsys.readouterr().err
    cfg = tmp_path / "c.yaml"
    cfg.write_text("method:\n  name: xrpo\nrollout:\n  prompts_per_step: 8\n")
    rc = study.main(["--methods", "grpo", "--config", str(cfg), "--plan", "--out", str(tmp_path)], log=lambda *_: None)
    assert rc == 2 and "sets method.name" in capsys.readouterr().err


def test_every_method_gets_the_same_overrides_but_its_name(study_modules, tmp_path):
    study, _ = study_modules
    args = study.parse_args(
        [
            "--methods",
            "grpo",
            "xrpo",
            "--seeds",
            "3",
            "--eval-samples",
            "8",
            "--out",
            str(tmp_path),
            "--config-overrides",
            "data.n_heldout=50",
        ]
    )
    specs = study.plan(args)
    assert [(s.method, s.seed) for s in specs] == [("grpo", 3), ("xrpo", 3)]
    strip = [[o for o in s.overrides if not o.startswith(("method.name=", "output="))] for s in specs]
    assert strip[0] == strip[1]
    assert "eval_k=[1, 4, 8]" in strip[0] and "data.n_heldout=50" in strip[0]
    cfgs = [build_config(None, s.overrides) for s in specs]
    assert cfgs[0].method.name == "grpo" and cfgs[1].method.name == "xrpo"
    assert cfgs[0].rollout.rollouts_per_step == cfgs[1].rollout.rollouts_per_step == 128
    assert cfgs[0].eval_samples == 8 and cfgs[0].eval_k == [1, 4, 8] and cfgs[0].data.n_heldout == 50


STUDY_CONFIGS = [
    "configs/study_gpu.yaml",
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "study").glob("*.yaml")),
]


@pytest.mark.parametrize("config", STUDY_CONFIGS)
def test_study_configs_build_for_every_preset(study_modules, tmp_path, config):
    """Every study config shipped (the GPU one, the regime, the SmolLM2 slice) is accepted by run_study (it sets no
    key the study owns) and builds a valid trainer config for every method."""
    study, _ = study_modules
    path = str(Path(study.ROOT) / config)
    args = study.parse_args(
        [
            "--methods",
            *list_presets(),
            "--config",
            path,
            "--steps",
            "300",
            "--eval-every",
            "30",
            "--eval-samples",
            "32",
            "--eval-k",
            "1",
            "4",
            "8",
            "16",
            "32",
            "--out",
            str(tmp_path),
        ]
    )
    # owned keys a base config sets are the study's to override, and it says so
    overridden = study.check_overrides(args.config_overrides, args.config)
    values, own = load_config_file(path)
    assert overridden == sorted(k for k in values if k in study.OWNED) and not any(k in study.OWNED for k in own)
    budget = values.get("rollout.rollouts_per_step", 128)
    for spec in study.plan(args):
        cfg = build_config(args.config, spec.overrides)
        assert cfg.method.name == spec.method and cfg.rollout.rollouts_per_step == budget
        assert cfg.eval_samples == 32 and cfg.eval_k == [1, 4, 8, 16, 32] and cfg.steps == 300


# ================================================================================================ the document
def _fake_run(
    root: Path,
    method: str,
    seed: int,
    final: float,
    history: dict,
    *,
    step_s: float,
    gen_batches: float | None = None,
    rounds: list[dict] | None = None,
    totals: dict | None = None,
):
    d = root / method / f"seed{seed}"
    d.mkdir(parents=True)
    cfg = to_dict(
        build_config(
            None,
            [
                f"method.name={method}",
                f"seed={seed}",
                "steps=20",
                "eval_samples=4",
                "eval_k=[1, 4]",
                "rollout.prompts_per_step=4",
                "rollout.rollouts_per_step=32",
                f"output={d}",
            ],
        )
    )
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))

    def ev(p):
        return {
            "eval/pass@1": p,
            "eval/pass@4": min(1.0, 2 * p),
            "eval/cons@4": p / 2,
            "eval/response_length_mean": 6.0,
            "eval/truncation_rate": 0.0,
        }

    hist = [{"step": s, **ev(v)} for s, v in sorted(history.items())] + [{"step": 20, **ev(final)}]
    summary = {
        "method": method,
        "steps": 20,
        "heldout_before": ev(history[0]),
        "heldout_after": ev(final),
        "pass@1_before": history[0],
        "pass@1_after": final,
        "eval_history": hist,
        "xrpo": totals
        or {
            "planned_rounds": 0,
            "nonuniform_round_share": 0.0,
            "max_extra": 0.0,
            "seeded_prompts": 0.0,
            "flips": 0.0,
            "sharpened": 0.0,
        },
        "wall_time_s": 100.0,
    }
    (d / "summary.json").write_text(json.dumps(summary))
    rows = []
    for s in range(1, 21):
        r = {
            "step": s,
            "rollout/count": 32.0,
            "loss/tokens": 200.0,
            "time/step": step_s,
            "rollout/reward_mean": 0.5,
            "rollout/response_length_mean": 6.25,
        }
        if gen_batches is not None:
            r["rollout/gen_batches"], r["rollout/kept_groups"] = gen_batches, 4.0
        rows.append(r)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (rounds or [])))
    (d / "study_run.json").write_text(
        json.dumps(
            {"segments": [{"mode": "new", "rc": 0, "wall_s": 10 * step_s, "load1_start": 1.0, "load1_end": 1.5}]}
        )
    )


@pytest.fixture()
def fake_study(tmp_path):
    out = tmp_path / "runs"
    for seed, final in zip((0, 1, 2), (0.10, 0.20, 0.30)):
        _fake_run(out, "grpo", seed, final, {0: 0.05, 10: 0.10}, step_s=1.0)
    # XRPO: finals .15/.25/.35 (each GRPO's + .05); at step 10 .20/.25/.30
    xr_rounds = []
    for s in range(1, 21):
        # prompt 1 is seeded in both rounds of every step: one seeded prompt-step per step
        xr_rounds += [
            {"step": s, "round": 0, "alloc": [4, 4, 4, 4], "seeded": [], "flips": 0},
            {"step": s, "round": 1, "alloc": [5, 0, 2, 1], "seeded": [1], "flips": 0, "nonuniform": True},
            {"step": s, "round": 2, "alloc": [2, 2, 2, 2], "seeded": [1], "flips": 0, "nonuniform": False},
        ]
    xr_rounds += xr_rounds[-3:]  # step 20 logged twice (a resumed run redoing it): counted once
    totals = {
        "planned_rounds": 40,
        "nonuniform_round_share": 0.5,
        "max_extra": 5.0,
        "seeded_prompts": 40.0,
        "flips": 5.0,
        "sharpened": 7.0,
    }
    for seed, final, mid in zip((0, 1, 2), (0.15, 0.25, 0.35), (0.20, 0.25, 0.30)):
        _fake_run(out, "xrpo", seed, final, {0: 0.05, 10: mid}, step_s=1.5, rounds=xr_rounds, totals=totals)
    _fake_run(out, "dapo", 0, 0.12, {0: 0.05, 10: 0.06}, step_s=2.0, gen_batches=3.0)
    return out


def test_aggregate_and_markdown_on_synthetic_runs(study_modules, fake_study):
    _, rep = study_modules
    runs = rep.load_runs(fake_study, ["grpo", "dapo", "xrpo"], [0, 1, 2])
    agg = rep.aggregate(runs, seeds=[0, 1, 2])
    M = agg["methods"]
    assert agg["metrics"] == ["eval/pass@1", "eval/pass@4", "eval/cons@4"]
    assert agg["budget_differences"] == {}
    # target = GRPO's mean final pass@1 = (.1 + .2 + .3) / 3 = .2
    assert agg["target"]["value"] == pytest.approx(0.2)
    # GRPO's mean curve: 0: .05, 10: .10, 20: .20 -> reaches .2 at 10 + (.2 - .1)/(.2 - .1) * 10 = 20
    assert M["grpo"]["steps_to_target"] == pytest.approx(20.0)
    # XRPO's mean curve: 0: .05, 10: .25 -> 0 + (.2 - .05)/(.25 - .05) * 10 = 7.5; speed-up 20 / 7.5 = 2.667
    assert M["xrpo"]["steps_to_target"] == pytest.approx(7.5)
    assert M["xrpo"]["speedup"]["value"] == pytest.approx(20 / 7.5)
    # per seed: .20 at 10 -> 10; .25 -> .15/.20*10 = 7.5; .30 -> .15/.25*10 = 6
    assert M["xrpo"]["steps_to_target_by_seed"] == pytest.approx([10.0, 7.5, 6.0])
    # DAPO: .05, .06, .12 never reaches .2 -> speed-up below 20 / 20 = 1
    assert M["dapo"]["steps_to_target"] is None and M["dapo"]["speedup"] == {"bound": "<", "value": 1.0}
    # XRPO - GRPO pass@1: .05 on every seed -> +5.00 ± 0.00
    assert agg["paired"]["grpo"]["eval/pass@1"]["mean"] == pytest.approx(0.05)
    assert agg["paired"]["grpo"]["eval/pass@1"]["ci95"] == pytest.approx(0.0, abs=1e-12)
    # ICL: 20 distinct seeded prompt-steps (prompt 1 in both rounds of 20 steps, step 20 logged twice), 5 flips
    assert M["xrpo"]["seeded_prompt_steps"]["mean"] == 20
    assert M["xrpo"]["flip_rate"]["mean"] == pytest.approx(5 / 20)
    # 80 trained prompt-steps (20 steps x 4 prompts) -> seeded share 20 / 80
    assert M["xrpo"]["seeded_share"]["mean"] == pytest.approx(0.25)
    # extras of rounds 1 and 2 over 20 steps: [5,0,2,1] and [2,2,2,2] -> counts of 0,1,2,5 per run = 20, 20, 100,
    # 20; the histogram pools the 3 seeds
    assert M["xrpo"]["extras_hist"] == [60, 60, 300, 0, 0, 60]
    assert M["xrpo"]["zero_extra_share"]["mean"] == pytest.approx(20 / 160)
    # DAPO generated 3 batches x 32 rollouts per step, trained on 32: 1920 vs 640; its generated tokens are unknown
    assert M["dapo"]["generated_rollouts"]["mean"] == 1920 and M["dapo"]["trained_rollouts"]["mean"] == 640
    assert M["dapo"]["generated_tokens"]["n"] == 0
    assert M["grpo"]["generated_tokens"]["mean"] == 4000

    md = rep.render_markdown(
        agg, {"methods": ["grpo", "dapo", "xrpo"], "setup_lines": ["x"]}, {"curves": "results/curves_pass1.png"}
    )
    # GRPO pass@1 .1/.2/.3: 20.00 ± 24.84 (see test_mean_ci_hand); XRPO .15/.25/.35: 25.00 ± 24.84, best: bold
    assert "| GRPO | 20.00 ± 24.84 | 40.00 ± 49.68 | 10.00 ± 12.42 |" in md
    assert "| XRPO | **25.00 ± 24.84** | **50.00 ± 49.68** | **12.50 ± 12.42** |" in md
    assert "| DAPO | 12.00 | 24.00 | 6.00 |" in md  # one seed: no interval
    assert "| XRPO − GRPO | +5.00 ± 0.00 | +2.50 ± 0.00 |" in md
    assert "| XRPO | 7.5 | 10, 8, 6 | 2.67× |" in md
    assert "| DAPO | not reached in 20 | — | < 1.00× |" in md
    assert "| XRPO | 80 ± 0 | 20 ± 0 | 25.0 ± 0.0 | 5.0 ± 0.0 | 25.00 ± 0.00 | 7 ± 0 |" in md
    # wall = the study's segments (10 x step_s); step time ratio 1.5 / 1.0
    assert "| XRPO | 15 ± 0 | 1.50 | 1.500 ± 0.000 | 1.50 |" in md
    assert "![held-out pass@1 during training](results/curves_pass1.png)" in md
    assert "XRPO − GRPO: pass@1 +5.00 ± 0.00 (the interval excludes 0)" in md


def test_a_target_within_grpos_seed_noise_is_flagged(study_modules, fake_study, tmp_path):
    """Steps to GRPO's final accuracy only time learning when GRPO's own gain is told apart from its start."""
    _, rep = study_modules
    meta = {"methods": ["grpo", "xrpo"], "setup_lines": []}
    note = "**GRPO's own gain is within seed noise**"
    # fake_study: GRPO from .05 to .10/.20/.30: gains .05/.15/.25, 15.00 ± 4.3027 (t, 2 df) x 10 / sqrt(3) = 24.84
    agg = rep.aggregate(rep.load_runs(fake_study, ["grpo", "xrpo"], [0, 1, 2]))
    g = agg["target"]["grpo_gain"]
    assert (g["mean"], g["ci95"], g["n"]) == (pytest.approx(0.15), pytest.approx(0.248414, abs=1e-6), 3)
    assert rep.target_within_noise(agg["target"])
    md = rep.render_markdown(agg, meta, {})
    assert f"{note} (+15.00 ± 24.84 points, final − before, paired over 3 seeds" in md
    assert "GRPO at 20.0: 2.67× (paper: 2.4–2.7×). GRPO's own gain is within seed noise" in md
    # GRPO from .05 to .20/.21/.22: gains .15/.16/.17, 16.00 ± 2.48: a real gain, no note
    out = tmp_path / "learnt"
    for seed, final in zip((0, 1, 2), (0.20, 0.21, 0.22)):
        _fake_run(out, "grpo", seed, final, {0: 0.05, 10: 0.10}, step_s=1.0)
        _fake_run(out, "xrpo", seed, final + 0.05, {0: 0.05, 10: 0.25}, step_s=1.0)
    agg = rep.aggregate(rep.load_runs(out, ["grpo", "xrpo"], [0, 1, 2]))
    assert agg["target"]["grpo_gain"]["ci95"] == pytest.approx(0.0248414, abs=1e-7)
    assert not rep.target_within_noise(agg["target"])
    md = rep.render_markdown(agg, meta, {})
    assert note not in md and "within seed noise, so" not in md
    # a target given with --target carries no GRPO gain: never flagged
    assert not rep.target_within_noise(
        rep.aggregate(rep.load_runs(fake_study, ["grpo"], [0, 1, 2]), target=0.2)["target"]
    )


def test_budget_differences_are_reported(study_modules, fake_study):
    _, rep = study_modules
    d = fake_study / "grpo" / "seed1" / "config.yaml"
    cfg = yaml.safe_load(d.read_text())
    cfg["rollout"]["rollouts_per_step"] = 64
    d.write_text(yaml.safe_dump(cfg))
    runs = rep.load_runs(fake_study, ["grpo", "xrpo"], [0, 1, 2])
    agg = rep.aggregate(runs)
    assert agg["budget_differences"] == {"rollout.rollouts_per_step": ["32", "64"]}
    md = rep.render_markdown(agg, {"methods": ["grpo", "xrpo"]}, {})
    assert "**Warning: the runs do not share one budget**: `rollout.rollouts_per_step`: 32, 64" in md


def test_write_report_keeps_the_hand_written_text(study_modules, fake_study, tmp_path):
    _, rep = study_modules
    doc = tmp_path / "docs" / "results.md"
    doc.parent.mkdir()
    doc.write_text(
        f"# Results\n\nhand-written header\n\n{rep.BEGIN}\nnot yet run\n{rep.END}\n\n## Interpretation\n"
        "hand-written tail\n"
    )
    runs = rep.load_runs(fake_study, ["grpo", "xrpo"], [0, 1, 2])
    figs = rep.write_report(doc, rep.aggregate(runs), {"methods": ["grpo", "xrpo"], "setup_lines": []})
    text = doc.read_text()
    assert text.startswith("# Results\n\nhand-written header\n\n" + rep.BEGIN)
    assert text.endswith(rep.END + "\n\n## Interpretation\nhand-written tail\n")
    assert "not yet run" not in text and "| GRPO | 20.00 ± 24.84 |" in text
    data = json.loads((tmp_path / "docs" / "results" / "results.json").read_text())
    assert data["methods"]["xrpo"]["steps_to_target"] == pytest.approx(7.5)
    pytest.importorskip("matplotlib")
    assert {p.name for p in figs.values()} == {"curves_pass1.png", "training_reward.png", "allocation.png"}
    for p in figs.values():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(rep.StudyDataError, match="only one of the markers"):
        rep.replace_generated(f"x {rep.BEGIN} y", "z")


# ================================================================================================ a real tiny study
@pytest.mark.slow
def test_study_runs_resumes_and_skips_finished_runs(study_modules, study_env, tmp_path, monkeypatch, capsys):
    study, rep = study_modules
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(study_env["root"]), os.environ.get("PYTHONPATH", "")]))
    out, doc = tmp_path / "runs", tmp_path / "doc" / "results.md"

    def args(steps: int = 2) -> list[str]:
        return [
            "--methods",
            "grpo",
            "xrpo",
            "--seeds",
            "0",
            "--steps",
            str(steps),
            "--eval-every",
            "1",
            "--eval-samples",
            "2",
            "--eval-k",
            "1",
            "2",
            "--out",
            str(out),
            "--doc",
            str(doc),
            "--config-overrides",
            *study_env["overrides"],
            "rollout.rollouts_per_step=32",
        ]

    argv = args()
    lines: list[str] = []
    assert study.main(argv, log=lines.append) == 0, lines
    assert "0 done, 0 to resume, 2 to start" in lines[0]
    for m in ("grpo", "xrpo"):
        run = rep.load_run(out / m / "seed0")
        assert run is not None and run.summary["steps"] == 2
        assert [h["step"] for h in run.summary["eval_history"]] == [0, 1, 2]
        assert set(run.summary["heldout_after"]) >= {"eval/pass@1", "eval/pass@2", "eval/cons@2"}
    assert "| GRPO |" in doc.read_text() and "| XRPO |" in doc.read_text()

    # the second invocation trains nothing
    stamps = {m: (out / m / "seed0" / "metrics.jsonl").stat().st_mtime_ns for m in ("grpo", "xrpo")}
    lines.clear()
    assert study.main(argv, log=lines.append) == 0
    assert "2 done, 0 to resume, 0 to start" in lines[0]
    assert not any("start " in line for line in lines)
    assert {m: (out / m / "seed0" / "metrics.jsonl").stat().st_mtime_ns for m in ("grpo", "xrpo")} == stamps
    assert len(json.loads((out / "grpo" / "seed0" / "study_run.json").read_text())["segments"]) == 1

    # a run killed after its last checkpoint (no summary.json) resumes from it: no training step is redone
    (out / "xrpo" / "seed0" / "summary.json").unlink()
    n_rows = len((out / "xrpo" / "seed0" / "metrics.jsonl").read_text().splitlines())
    lines.clear()
    assert study.main(argv, log=lines.append) == 0
    assert "1 done, 1 to resume, 0 to start" in lines[0]
    segs = json.loads((out / "xrpo" / "seed0" / "study_run.json").read_text())["segments"]
    assert [s["mode"] for s in segs] == ["new", "resume"] and segs[-1]["rc"] == 0
    assert len((out / "xrpo" / "seed0" / "metrics.jsonl").read_text().splitlines()) == n_rows
    assert rep.load_run(out / "xrpo" / "seed0").summary["steps"] == 2

    # asking for another budget over the same directory is an error, not a silent mix
    capsys.readouterr()
    assert study.main(args(steps=3), log=lines.append) == 2
    assert "another configuration (steps: saved 2, asked 3)" in capsys.readouterr().err

    # a run made before a knob existed (its config.yaml lacks the key) is read as a resume reads it: the knob's
    # default, so the same study still finds it done; a saved value that differs is still refused
    saved = out / "grpo" / "seed0" / "config.yaml"
    cfg = yaml.safe_load(saved.read_text())
    del cfg["rollout"]["icl_fewshot_position"]
    saved.write_text(yaml.safe_dump(cfg))
    lines.clear()
    assert study.main(argv, log=lines.append) == 0 and "2 done, 0 to resume, 0 to start" in lines[0]
    cfg["rollout"]["icl_fewshot_position"] = "question"
    saved.write_text(yaml.safe_dump(cfg))
    capsys.readouterr()
    assert study.main(argv, log=lines.append) == 2
    assert "icl_fewshot_position: saved 'question', asked 'start'" in capsys.readouterr().err


def test_committed_results_page_has_the_markers(study_modules):
    study, rep = study_modules
    text = (Path(study.ROOT) / "docs" / "results.md").read_text()
    assert text.count(rep.BEGIN) == 1 and text.count(rep.END) == 1
    assert text.index(rep.BEGIN) < text.index(rep.END)


def test_simulator_prediction_is_xrpo_simulate_on_grpos_rounds(study_modules, tmp_path):
    """The simulator's prediction in the report is `xrpo simulate --rounds-file` on each GRPO run, with GRPO's
    step and the HRP runs' own planning knobs, averaged over seeds; and it is shown beside the measured shares."""
    import numpy as np

    from xrpo.sim.runner import SimConfig, simulate

    _, rep = study_modules
    out = tmp_path / "runs"
    rng = np.random.default_rng(0)
    for seed in (0, 1):
        rounds = [
            {
                "step": s,
                "round": 0,
                "alloc": [8, 8, 8, 8],
                "seeded": [],
                "flips": 0,
                "problems": [f"p{(4 * s + j) % 12}" for j in range(4)],
                "successes": [int(x) for x in rng.binomial(8, [0.0, 0.3, 0.6, 1.0])],
            }
            for s in range(1, 21)
        ]
        _fake_run(out, "grpo", seed, 0.2, {0: 0.1}, step_s=1.0, rounds=rounds)
        _fake_run(out, "xrpo", seed, 0.25, {0: 0.1}, step_s=1.0, rounds=rounds)
        cfg_file = out / "xrpo" / f"seed{seed}" / "config.yaml"
        cfg = yaml.safe_load(cfg_file.read_text())
        cfg["method"].update(lam=0.5, alloc_mode="greedy", n_base=3)
        cfg_file.write_text(yaml.safe_dump(cfg))
    runs = rep.load_runs(out, ["grpo", "xrpo"], [0, 1])
    sim = rep.simulator_prediction(runs, steps=40)
    assert sim["hrp_method"] == "hrp-greedy" and sim["knobs"]["lam"] == 0.5 and sim["knobs"]["n_base"] == 3
    names = ["uniform", "hrp-greedy", "cures", "oracle"]
    direct = [
        simulate(
            SimConfig(
                rounds_file=str(out / "grpo" / f"seed{seed}"),
                methods=names,
                prompts=4,
                rollouts=32,
                n_base=3,
                rounds=2,
                alpha=0.05,
                lam=0.5,
                steps=40,
                seed=seed,
            ),
            latency=False,
        )
        for seed in (0, 1)
    ]
    for m in names:
        shares = [d["methods"][m]["informative_share"]["mean"] for d in direct]
        ratios = [d["methods"][m]["vs_uniform"]["informative_share"]["ratio"] for d in direct]
        assert sim["methods"][m]["share"]["mean"] == pytest.approx(np.mean(shares), abs=1e-12)
        assert sim["methods"][m]["share"]["values"] == pytest.approx(shares, abs=1e-12)
        assert sim["methods"][m]["vs_uniform"]["mean"] == pytest.approx(np.mean(ratios), abs=1e-12)
    # the knobs matter: the preset's proportional HRP at lambda 0.1 predicts something else
    other = simulate(
        SimConfig(
            rounds_file=str(out / "grpo" / "seed0"), methods=["uniform", "hrp"], prompts=4, rollouts=32, steps=40
        ),
        latency=False,
    )
    assert other["methods"]["hrp"]["informative_share"]["mean"] != pytest.approx(
        sim["methods"]["hrp-greedy"]["share"]["values"][0], abs=1e-9
    )
    agg = rep.aggregate(runs, seeds=[0, 1])
    agg["simulated"] = sim
    md = rep.render_markdown(agg, {"methods": ["grpo", "xrpo"], "setup_lines": []}, {})
    pred = sim["methods"]["hrp-greedy"]
    measured = agg["methods"]["xrpo"]["nonzero_share"]
    assert (
        f"| HRP greedy | {100 * pred['share']['mean']:.1f} ± {100 * pred['share']['ci95']:.1f} | "
        f"{pred['vs_uniform']['mean']:.3f} ± {pred['vs_uniform']['ci95']:.3f} | XRPO | "
        f"{100 * measured['mean']:.1f} ± {100 * measured['ci95']:.1f} |"
    ) in md
    assert "| best allocation in hindsight |" in md and "n_base 3, 2 rounds, alpha 0.05, lambda 0.5" in md
    # runs without per-prompt successes (or no HRP run): no prediction, no section
    assert rep.simulator_prediction(rep.load_runs(out, ["grpo"], [0, 1])) is None
