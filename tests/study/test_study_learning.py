"""The learning-speed study (study/study_learning.py, study/run_learning.py): steps to GRPO's final held-out pass@1,
per seed and on the seed-mean curve, censoring, paired ratios and differences, AUC, the validation noise, the
section written between its markers, and a real tiny run that a second invocation skips."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
import yaml

from xrpo.algo.stats import mean_ci, ratio_ci
from xrpo.trainer.config_loader import build_config, to_dict

STUDY = Path(__file__).resolve().parents[2] / "study"


@pytest.fixture(scope="module")
def learning():
    sys.path.insert(0, str(STUDY))
    import run_learning
    import study_learning

    yield study_learning, run_learning
    sys.path.remove(str(STUDY))


def _run(root: Path, method: str, seed: int, curve: dict, *, step_s: float, rounds=(), gen_batches=None) -> None:
    """A finished run directory of the default regime's configuration: validations ``curve`` (step -> pass@1,
    pass@2 = 1.8 pass@1), 20 steps of ``rollouts_per_step`` rollouts taking ``step_s`` each."""
    import run_learning
    import run_study

    d = root / method / f"seed{seed}"
    d.mkdir(parents=True)
    ns = run_learning.study_args(run_learning.parse_args(["default", "--out", str(root)]))
    spec = next(s for s in run_study.plan(ns) if s.method == "grpo" and s.seed == seed)
    cfg = build_config(None, [*spec.overrides, f"method.name={method}", f"output={d}"])
    (d / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))

    def ev(p):
        return {"eval/pass@1": p, "eval/pass@2": 1.8 * p, "eval/cons@4": p / 2}

    hist = [{"step": s, **ev(v)} for s, v in sorted(curve.items())]
    summary = {
        "steps": 20,
        "heldout_problems": 400,
        "heldout_samples_per_problem": 4,
        "heldout_before": ev(curve[0]),
        "heldout_after": ev(curve[20]),
        "eval_history": hist,
    }
    (d / "summary.json").write_text(json.dumps(summary))
    rows = []
    for s in range(1, 21):
        r = {"step": s, "rollout/count": float(cfg.rollout.rollouts_per_step), "time/step": step_s}
        if gen_batches is not None:
            r["rollout/gen_batches"] = gen_batches
        rows.append(r)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    (d / "study_run.json").write_text(
        json.dumps(
            {"segments": [{"mode": "new", "rc": 0, "wall_s": 30 * step_s, "load1_start": 1.0, "load1_end": 1.5}]}
        )
    )


GRPO = {0: {0: 0.05, 10: 0.08, 20: 0.10}, 1: {0: 0.04, 10: 0.09, 20: 0.09}, 2: {0: 0.06, 10: 0.06, 20: 0.11}}
# seed 0 reaches GRPO seed 0's 0.10 at step 10, seed 1 never reaches 0.09 (censored at 20), seed 2 reaches 0.11 at 10
PLUS = {0: {0: 0.05, 10: 0.10, 20: 0.12}, 1: {0: 0.04, 10: 0.07, 20: 0.08}, 2: {0: 0.06, 10: 0.11, 20: 0.11}}
# per step: prompt a mixed (3 of 8), b all wrong (8): one group with a gradient, of 8 rollouts
ROUNDS = [{"step": s, "round": 0, "alloc": [8, 8], "successes": [3, 0], "problems": ["a", "b"]} for s in (1, 2)]


@pytest.fixture()
def runs(learning, tmp_path):
    out = tmp_path / "runs"
    for s in range(3):
        _run(out, "grpo", s, GRPO[s], step_s=1.0, rounds=ROUNDS)
        _run(out, "xrpo-plus", s, PLUS[s], step_s=2.0, gen_batches=1.5)
    return out


def test_first_reach_auc_and_noise_by_hand(learning):
    sl, _ = learning
    assert sl.first_reach({0: 0.05, 10: 0.08, 20: 0.10}, 0.08) == 10
    assert sl.first_reach({0: 0.05, 10: 0.08}, 0.09) is None
    assert sl.first_reach({0: 0.1 + 0.2, 10: 1.0}, 0.3) == 0  # 0.30000000000000004 reaches 0.3
    # (0.05 + 0.08) / 2 * 10 + (0.08 + 0.10) / 2 * 10 = 1.55, over 20 steps
    assert sl.auc({0: 0.05, 10: 0.08, 20: 0.10}) == pytest.approx(0.0775, rel=1e-12)
    with pytest.raises(ValueError, match="needs >= 2 validations"):
        sl.auc({0: 0.1})
    # pass@2 - pass@1 = mean p(1 - p) = 0.04 -> sqrt(0.04 / (400 x 4)) = 0.005;
    # 2 pass@1 - pass@2 - pass@1^2 = 0.1 - 0.09 - 0.0025 = 0.0075 -> sqrt(0.0075 / 400)
    n = sl.validation_noise({"eval/pass@1": 0.05, "eval/pass@2": 0.09}, 400, 4)
    assert n["sampling_se"] == pytest.approx(0.005, rel=1e-12)
    assert n["problem_se"] == pytest.approx(math.sqrt(0.0075 / 400), rel=1e-12)
    assert sl.validation_noise({"eval/pass@1": 0.05}, 400, 4) is None


def test_aggregate_learning_by_hand(learning, runs):
    sl, _ = learning
    from study_runs import load_runs

    agg = sl.aggregate_learning(load_runs(runs, ["grpo", "xrpo-plus"], [0, 1, 2]))
    assert agg["target"] == pytest.approx(0.10, rel=1e-12)
    g, x = agg["methods"]["grpo"], agg["methods"]["xrpo-plus"]
    # GRPO reaches its own finals at 20, 10, 20; xrpo-plus GRPO's at 10, censored (20), 10
    assert g["reach_by_seed"] == {0: 20, 1: 10, 2: 20} and g["censored"] == []
    assert x["reach_by_seed"] == {0: 10, 1: 20, 2: 10} and x["censored"] == [1]
    assert x["earlier_seeds"] == 2 and x["later_seeds"] == 1
    r, h = ratio_ci([10, 20, 10], [20, 10, 20])
    assert x["steps_ratio"] == {"ratio": r, "ci95": h, "n": 3} and r == pytest.approx(0.8)
    # rollouts: 1.5 generation batches a step for xrpo-plus, one for GRPO; training time 2 s vs 1 s a step
    assert x["rollouts_ratio"]["ratio"] == pytest.approx(1.5 * 0.8) and x["wall_ratio"]["ratio"] == pytest.approx(1.6)
    assert g["steps_ratio"]["ratio"] == 1.0
    # the seed-mean curves: GRPO 0.05, 0.0767, 0.10 (reaches its own mean final at 20); xrpo-plus 0.0933 at 10
    assert g["reach_mean_curve"] == 20 and x["reach_mean_curve"] == 20
    assert x["curve"]["mean"][1] == pytest.approx(0.28 / 3, rel=1e-12)
    # paired differences: finals +0.02, -0.01, 0.00; AUC by trapezoids
    m, h = mean_ci([0.02, -0.01, 0.0])
    assert x["final_diff"]["mean"] == pytest.approx(m, abs=1e-15) and x["final_diff"]["ci95"] == pytest.approx(h)
    aucs = {s: sl.auc(PLUS[s]) - sl.auc(GRPO[s]) for s in range(3)}
    assert x["auc_diff"]["mean"] == pytest.approx(sum(aucs.values()) / 3, rel=1e-12)
    assert x["cons_diff"]["mean"] == pytest.approx(m / 2, abs=1e-15)
    # the step at 10 of the difference curve: 0.02, -0.02, 0.05
    assert x["diff_curve"]["mean"][1] == pytest.approx(0.05 / 3, rel=1e-12)
    # GRPO's signal: one group of 8 with a gradient per step; xrpo-plus logged no rounds
    assert g["mixed_groups_per_step"]["mean"] == 1.0 and g["mixed_group_size"]["mean"] == 8.0
    assert g["nonzero_share"]["mean"] == 0.5 and x["nonzero_share"]["n"] == 0
    assert agg["noise"]["sampling_se"]["median"] > 0 and agg["cons_key"] == "eval/cons@4"
    with pytest.raises(ValueError, match="no finished grpo run"):
        sl.aggregate_learning(load_runs(runs, ["xrpo-plus"], [0, 1, 2]))


def test_report_only_writes_its_section_between_its_markers(learning, runs, tmp_path, monkeypatch):
    sl, rl = learning
    doc = tmp_path / "docs" / "results.md"
    doc.parent.mkdir()
    doc.write_text(f"# Results\n\nhand text\n\n{rl.begin_marker('default')}\nold\n{rl.end_marker('default')}\n\ntail\n")
    lines = []
    argv = [
        "default",
        "--methods",
        "grpo",
        "xrpo-plus",
        "--seeds",
        "0",
        "1",
        "2",
        "--out",
        str(runs),
        "--doc",
        str(doc),
    ]
    assert rl.main([*argv, "--report-only"], log=lines.append) == 0, lines
    text = doc.read_text()
    assert text.startswith("# Results\n\nhand text\n\n") and text.rstrip().endswith("tail") and "\nold\n" not in text
    assert "| xrpo-plus | 3 | 20 | 10, 20+, 10 | 1 | 2 / 1 | 0.80× ± " in text
    # the command a reader runs to train the same study: not where this machine kept its runs and its document
    assert "Command: `python study/run_learning.py default --methods grpo xrpo-plus --seeds 0 1 2`." in text
    assert (doc.parent / "results" / "learning-default" / "learning.json").is_file()
    # the plan: every run done, and its cost
    lines.clear()
    assert rl.main([*argv, "--plan"], log=lines.append) == 0
    assert "6 done, 0 to resume, 0 to start" in lines[0]
    assert any("xrpo-plus: 3 finished, 60 s a run" in line for line in lines)


def test_every_regime_gives_every_method_the_same_overrides(learning, tmp_path):
    sl, rl = learning
    import run_study

    for name, regime in rl.REGIMES.items():
        ns = rl.study_args(rl.parse_args([name, "--out", str(tmp_path / name)]))
        specs = run_study.plan(ns)
        assert {s.method for s in specs} == set(regime.methods) and {s.seed for s in specs} == set(regime.seeds)
        for s in specs:
            cfg = build_config(ns.config, s.overrides)
            assert cfg.method.name == s.method and cfg.eval_every == regime.eval_every and cfg.threads == 1
            rest = [o for o in s.overrides if not o.startswith(("method.name=", "seed=", "output="))]
            assert rest == [o for o in specs[0].overrides if not o.startswith(("method.name=", "seed=", "output="))]


@pytest.mark.slow
def test_a_regime_trains_once_and_a_second_call_skips_it(learning, study_env, tmp_path, monkeypatch):
    sl, rl = learning
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(study_env["root"]), os.environ.get("PYTHONPATH", "")]))
    tiny = rl.Regime(
        title="tiny",
        why="a test regime",
        overrides=(*study_env["overrides"], "rollout.rollouts_per_step=32"),
        steps=2,
        eval_every=1,
        eval_samples=2,
        eval_k=(1, 2),
        seeds=(0,),
        methods=("grpo", "xrpo-plus-sqrt"),
    )
    monkeypatch.setitem(rl.REGIMES, "tiny", tiny)
    out, doc = tmp_path / "runs", tmp_path / "doc" / "results.md"
    argv = ["tiny", "--out", str(out), "--doc", str(doc)]
    lines: list[str] = []
    assert rl.main(argv, log=lines.append) == 0, lines
    assert "0 done, 0 to resume, 2 to start" in lines[0]
    assert rl.begin_marker("tiny") in doc.read_text() and "| xrpo-plus-sqrt | 1 |" in doc.read_text()
    stamp = (out / "grpo" / "seed0" / "metrics.jsonl").stat().st_mtime_ns
    lines.clear()
    assert rl.main(argv, log=lines.append) == 0
    assert "2 done, 0 to resume, 0 to start" in lines[0]
    assert (out / "grpo" / "seed0" / "metrics.jsonl").stat().st_mtime_ns == stamp


def test_committed_results_page_has_every_regimes_markers(learning):
    _, rl = learning
    text = (rl.ROOT / "docs" / "results.md").read_text()
    for name in rl.REGIMES:
        b, e = rl.begin_marker(name), rl.end_marker(name)
        assert text.count(b) == 1 and text.count(e) == 1 and text.index(b) < text.index(e), name
