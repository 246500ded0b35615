"""End-to-end trainer tests on a tiny random model: every preset trains, bad input is reported (resume after a kill:
test_resume.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from xrpo.algo.presets import list_presets
from xrpo.cli import main
from xrpo.rundir.checkpoints import CheckpointError, list_checkpoints
from xrpo.sim.runner import read_rounds_rates
from xrpo.trainer.config_loader import build_config
from xrpo.trainer.loop import NonFiniteLossError, train


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def quiet(*_):
    pass


@pytest.mark.parametrize("method", list_presets())
def test_every_preset_trains_one_step(trainer_env, tmp_path, method):
    out = tmp_path / method
    cfg = build_config(None, trainer_env["overrides"](out, method))
    summary = train(cfg, log=quiet)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1
    assert torch.isfinite(torch.tensor(rows[0]["loss/policy"]))
    before, after = weights(trainer_env["model"]), weights(Path(summary["final_checkpoint"]) / "model")
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert not unchanged, f"{method}: parameters not updated: {unchanged}"
    assert (out / "summary.json").exists() and (out / "config.yaml").exists()
    s = json.loads((out / "summary.json").read_text())
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    # validation before and after the step (4 held-out problems x 2 samples: pass@1 in eighths), as summarised
    assert [e["step"] for e in evals] == [0, 1]
    assert (s["pass@1_before"], s["pass@1_after"]) == (evals[0]["eval/pass@1"], evals[1]["eval/pass@1"])
    assert all(float(e["eval/pass@1"] * 8).is_integer() for e in evals)


def test_xrpo_step_metrics_hold_the_values_of_the_step(trainer_env, tmp_path):
    from xrpo.algo.advantages import group_advantages

    reports, corpus_ids = [], []

    def on_step(rep):
        reports.append(rep)
        corpus_ids.append(set(rep.corpus.problem_ids()))  # the corpus object keeps changing after the step

    summary = train(
        build_config(None, trainer_env["overrides"](tmp_path / "x", "xrpo", steps=3)), log=quiet, on_step=on_step
    )
    rows = [json.loads(line) for line in (tmp_path / "x" / "metrics.jsonl").read_text().splitlines()]
    solved_ids: set = set()
    for row, rep, in_corpus in zip(rows, reports, corpus_ids, strict=True):
        assert row == {"step": rep.step, **rep.metrics}
        plan = rep.plan
        rewards, groups = plan.rewards, plan.group_ids
        per = [rewards[groups == q] for q in range(4)]
        planned = [r for r in plan.rounds if r["round"] > 0]
        assert row["rollout/count"] == len(plan.records) == 16
        assert row["rollout/reward_mean"] == pytest.approx(rewards.mean(), abs=1e-12)
        assert row["rollout/solved_prompt_frac"] == sum(bool((r >= 1).any()) for r in per) / 4
        assert row["rollout/zero_variance_group_frac"] == sum(bool((r == r[0]).all()) for r in per) / 4
        sizes = [len(r) for r in per]
        assert (row["rollout/group_size_min"], row["rollout/group_size_max"]) == (min(sizes), max(sizes))
        assert row["alloc/rounds"] == len(planned) == 2
        assert row["icl/seeded_prompts"] == sum(len(r["seeded"]) for r in planned)
        assert row["icl/seeded_rollouts"] == sum(x.seeded for x in plan.records)
        flips = sum(
            any(x.reward >= 1 for x in plan.records if x.round == r["round"] and x.problem_index == q)
            for r in planned
            for q in r["seeded"]
        )
        assert row["icl/flips"] == flips
        bonus = plan.advantages - group_advantages(rewards, groups)
        assert row["adv/sharpened_count"] == int((bonus > 0).sum())
        solved_ids |= {rep.problems[x.problem_index].id for x in plan.records if x.reward >= 1 and x.text.strip()}
        assert in_corpus == solved_ids
        assert row["icl/corpus_problems"] == len(solved_ids)
    # the run's totals are the sums of its steps
    x = summary["xrpo"]
    assert x["planned_rounds"] == sum(r["alloc/rounds"] for r in rows) == 6
    assert (x["seeded_prompts"], x["flips"], x["sharpened"]) == tuple(
        sum(r[k] for r in rows) for k in ("icl/seeded_prompts", "icl/flips", "adv/sharpened_count")
    )
    assert any(r["rollout/group_size_max"] > r["rollout/group_size_min"] for r in rows)


def test_rounds_jsonl_holds_per_problem_successes_for_the_simulator(trainer_env, tmp_path, capsys):
    out = tmp_path / "x"
    train(build_config(None, trainer_env["overrides"](out, "xrpo", steps=3)), log=quiet)
    rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    metrics = {r["step"]: r for r in (json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines())}
    wins: dict[str, int] = {}
    trials: dict[str, int] = {}
    for step in (1, 2, 3):
        rows = [r for r in rounds if r["step"] == step]
        # 0/1 rewards (parity verifier): the step's successes over its rollouts are its mean reward
        n = sum(sum(r["alloc"]) for r in rows)
        k = sum(sum(r["successes"]) for r in rows)
        assert n == metrics[step]["rollout/count"] == 16
        assert k / n == pytest.approx(metrics[step]["rollout/reward_mean"], abs=1e-12)
        for r in rows:
            for pid, a, c in zip(r["problems"], r["alloc"], r["successes"]):
                trials[pid] = trials.get(pid, 0) + a
                wins[pid] = wins.get(pid, 0) + c
    rates, info = read_rounds_rates(out)
    ids = sorted(trials)
    assert rates.tolist() == [wins[i] / trials[i] for i in ids] and info["rollouts"] == 48
    assert main(["simulate", "--rounds-file", str(out), "--steps", "5", "--methods", "uniform,hrp"]) == 0
    assert f"rates of {len(ids)} problems" in capsys.readouterr().out


def test_bad_inputs(trainer_env, tmp_path):
    env = trainer_env
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "problem": "1+1"}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl.*1|answer"):
        train(build_config(None, env["overrides"](tmp_path / "o1") + [f"data.train={bad}"]), log=quiet)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty.jsonl"):
        train(build_config(None, env["overrides"](tmp_path / "o2") + [f"data.train={empty}"]), log=quiet)
    with pytest.raises(ValueError, match="more than data.max_prompt_tokens=4"):
        train(build_config(None, env["overrides"](tmp_path / "o3") + ["data.max_prompt_tokens=4"]), log=quiet)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train(build_config(None, env["overrides"](tmp_path / "o4") + [f"model.path={tmp_path}/nomodel"]), log=quiet)
    with pytest.raises(CheckpointError, match="is not a checkpoint"):
        train(None, resume=str(tmp_path), log=quiet)


def test_nan_loss_stops_without_overwriting_the_last_checkpoint(trainer_env, tmp_path):
    out = tmp_path / "nan"
    # Adam's first step moves each weight by about lr: 1e30 leaves finite but huge weights whose logits overflow
    ov = trainer_env["overrides"](out, "grpo", steps=5) + ["save_every=1", "optim.lr=1e30", "optim.grad_clip=0"]
    with pytest.raises(NonFiniteLossError, match="nothing was saved"):
        train(build_config(None, ov), log=quiet)
    ckpts = list_checkpoints(out)
    assert ckpts, "the first step's checkpoint should exist"
    for k, v in weights(ckpts[-1] / "model").items():
        assert torch.isfinite(v).all(), k


def test_cli_reports_bad_input_in_one_line(trainer_env, tmp_path, capsys):
    from xrpo.cli import main

    rc = main(["train", "model.path=/definitely/not/here", f"output={tmp_path}/o", "progress=false"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "model.path /definitely/not/here does not exist" in err and "Traceback" not in err


def test_nan_reward_from_a_user_verifier_is_reported(trainer_env, tmp_path):
    (trainer_env["root"] / "nan_verifier.py").write_text(
        "from xrpo.rewards import VerifyResult\n"
        "def verify(completion, reference):\n"
        "    return VerifyResult(score=float('nan'), answer=None)\n"
    )
    ov = trainer_env["overrides"](tmp_path / "nanr", "grpo") + ["data.verifier=nan_verifier:verify"]
    with pytest.raises(ValueError, match="rewards"):
        train(build_config(None, ov), log=quiet)


def test_engine_gets_the_updated_weights_every_step(trainer_env, tmp_path):
    # the engine comes through train's engine hook: a hook left unused leaves `calls` empty
    from xrpo.trainer.setup import build_engine

    calls = []

    def counting_build(cfg, model, tokenizer):
        engine = build_engine(cfg, model, tokenizer)
        original = engine.sync_weights

        def sync(m):
            calls.append(m is model)
            original(m)

        engine.sync_weights = sync
        return engine

    cfg = build_config(None, trainer_env["overrides"](tmp_path / "s", "xrpo", steps=3))
    train(cfg, log=quiet, engine_factory=counting_build)
    assert calls == [True, True, True]


def test_micro_batching_gives_the_full_batch_step(trainer_env, tmp_path):
    # one optimizer step accumulated over many small micro-batches equals the same step in one micro-batch
    runs, reports = {}, []
    for budget in (32, 100_000):
        out = tmp_path / f"mb{budget}"
        ov = trainer_env["overrides"](out, "xrpo-no-icl") + [f"optim.micro_batch_tokens={budget}", "threads=1"]
        summary = train(build_config(None, ov), log=quiet, on_step=reports.append)
        row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
        runs[budget] = (row, weights(Path(summary["final_checkpoint"]) / "model"))
    (small, w_small), (big, w_big) = runs[32], runs[100_000]
    # the loss is sum_t -A_i r_t / N with r_t ~ 1, a sum of terms of both signs (advantages are zero-mean per group):
    # its scale is S = sum_t |A_i| / N (or sum_i |A_i| / G for a per-sequence mean), not the small total. The two
    # runs sum the same rollouts (same seed) in other micro-batches: float32 order, at most n_tokens * u * S
    # (u = 2^-24), plus log-probs from forward passes of other batch shapes, within the log-prob envelope of
    # 1e-5 (CONTRIBUTING.md, "Tolerances"), which moves each r_t by as much
    rep = reports[0]
    lengths = [len(x.completion_ids) for x in rep.plan.records]
    adv = [abs(a) for a in rep.plan.advantages]
    scale = max(sum(a * n for a, n in zip(adv, lengths)) / sum(lengths), sum(adv) / len(adv))
    assert abs(small["loss/policy"] - big["loss/policy"]) <= (sum(lengths) * 2**-24 + 1e-5) * scale
    # KL to the reference at the first step: both are the initial model, so the exact k3 is ~ d^2 / 2 <= 5e-11 for
    # log-prob differences d within the same envelope; float32 exp(d) - d - 1 adds at most 2^-24 + 2^-25 < 2^-23 a
    # token (exp(d) rounded next to 1, then one more rounding; the - 1 is exact), so each run's mean is within 2^-23
    assert abs(small["loss/kl"] - big["loss/kl"]) <= 2 * (2**-23 + 5e-11)
    # the accumulated gradient itself (its norm is logged before the optimizer step): no short derived bound for the
    # norm of a cancelling sum of per-token gradients; rel=1e-5 is an envelope, held under 1 and 2 threads and on
    # both ends of CONTRIBUTING.md's version matrix
    assert small["loss/grad_norm"] == pytest.approx(big["loss/grad_norm"], rel=1e-5)
    # Adam's first step is about lr * g / (|g| + eps): for a gradient element near zero, summation-order noise in g
    # moves the update by a visible fraction of lr (seen: 6.9e-6, and 1.8e-5 with OpenBLAS 0.3.31, each on one of
    # 2048 elements, lr = 1e-2). So: all but 0.1% of the elements agree to 0.1% of the step size, and none differs
    # by more than one step size
    lr = 1e-2  # optim.lr of the trainer_env fixture
    for k in w_big:
        diff = (w_small[k] - w_big[k]).abs()
        assert int((diff > 1e-5).sum()) <= max(1, diff.numel() // 1000), k
        assert float(diff.max()) <= lr, k


def test_dapo_metrics_describe_the_kept_groups(trainer_env, tmp_path):
    out = tmp_path / "dapo"
    train(build_config(None, trainer_env["overrides"](out, "dapo", steps=2)), log=quiet)
    for row in (json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()):
        # dynamic sampling keeps only groups whose rewards differ
        assert row["rollout/zero_variance_group_frac"] == 0.0
        assert row["rollout/count"] == row["rollout/kept_groups"] * 4  # 16 rollouts / 4 prompts, uniform
        assert row["rollout/kept_groups"] >= 1


def test_every_training_prompt_is_length_checked(trainer_env, tmp_path):
    rows = [{"id": f"s{i}", "problem": f"{i % 10} + 1 = ?", "answer": str(i % 10 + 1)} for i in range(1200)]
    rows.append({"id": "long", "problem": " + ".join(["1"] * 200) + " = ?", "answer": "200"})
    f = tmp_path / "long_last.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="problem long: prompt has .* tokens, more than data.max_prompt_tokens=256"):
        train(
            build_config(
                None, trainer_env["overrides"](tmp_path / "o") + [f"data.train={f}", "data.max_prompt_tokens=256"]
            ),
            log=quiet,
        )


def test_correct_rollouts_with_a_blank_text_are_skipped_and_counted(trainer_env, tmp_path):
    # a verifier that rewards everything, one-token answers: the ones that are whitespace or EOS alone are correct
    # rollouts the ICL corpus cannot hold (ICLCorpus.add refuses a blank solution); the run goes on and counts them
    out = tmp_path / "blank"
    blank = []

    def on_step(rep):
        blank.append(sum(1 for x in rep.plan.records if not x.text.strip()))
        stored = [s.solution for pid in rep.corpus.problem_ids() for s in rep.corpus.entry(pid)[1]]
        assert all(s.strip() for s in stored)

    ov = trainer_env["learn_overrides"](out, "xrpo", 4) + [
        "data.verifier=always_verifier:verify",
        "rollout.max_new_tokens=1",
    ]
    train(build_config(None, ov), log=quiet, on_step=on_step)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum(blank) >= 2, blank  # the situation occurred
    assert [r["icl/skipped_empty_solutions"] for r in rows] == blank
    assert [r["icl/corpus_added"] for r in rows] == [r["rollout/count"] - b for r, b in zip(rows, blank)]
