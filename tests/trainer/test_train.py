"""End-to-end trainer tests on a tiny random model: every preset trains, resume is exact, bad input is reported."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from xrpo.algo.presets import list_presets
from xrpo.cli import main
from xrpo.sim.runner import read_rounds_rates
from xrpo.trainer.checkpoint import CheckpointError, list_checkpoints
from xrpo.trainer.config import build_config
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
    assert 0.0 <= s["pass@1_before"] <= 1.0 and 0.0 <= s["pass@1_after"] <= 1.0


def test_xrpo_mechanisms_report_metrics(trainer_env, tmp_path):
    cfg = build_config(None, trainer_env["overrides"](tmp_path / "x", "xrpo", steps=3))
    train(cfg, log=quiet)
    rows = [json.loads(line) for line in (tmp_path / "x" / "metrics.jsonl").read_text().splitlines()]
    for key in ["alloc/nonuniform_rounds", "icl/seeded_prompts", "icl/flips", "adv/sharpened_count",
                "time/generate", "time/verify", "time/update", "time/step", "rollout/zero_variance_group_frac"]:
        assert all(key in r for r in rows), key
    # groups have different sizes once the planner allocates by priority
    assert any(r["rollout/group_size_max"] > r["rollout/group_size_min"] for r in rows)
    assert rows[-1]["icl/corpus_problems"] > 0


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


def test_resume_after_kill_is_exact(trainer_env, tmp_path):
    ov = trainer_env["overrides"](None, "xrpo", steps=8)
    # bit-exact equality needs the same number of torch threads in the killed subprocess and in this process
    ov = [o for o in ov if not o.startswith("output=")] + ["save_every=2", "keep_last=10", "method.kl_coef=0.01",
                                                          "threads=1"]
    env = dict(os.environ, PYTHONPATH=str(trainer_env["root"]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "xrpo.cli", "train", f"output={killed}", *ov], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and len(list_checkpoints(killed)) < 1:
        time.sleep(0.02)
    assert proc.poll() is None, f"run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = list_checkpoints(killed)
    assert done and int(done[-1].name.split("-")[1]) < 8
    summary = train(None, resume=str(killed), log=quiet)
    assert summary["steps"] == 8

    straight = tmp_path / "straight"
    cfg = build_config(None, [f"output={straight}", *ov])
    ref = train(cfg, log=quiet)
    a = weights(Path(summary["final_checkpoint"]) / "model")
    b = weights(Path(ref["final_checkpoint"]) / "model")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    m_killed = [json.loads(x) for x in (killed / "metrics.jsonl").read_text().splitlines()]
    m_straight = [json.loads(x) for x in (straight / "metrics.jsonl").read_text().splitlines()]
    # the killed run may have logged steps after its last checkpoint; the resumed run repeats them identically
    last = {r["step"]: r["rollout/reward_mean"] for r in m_killed}
    assert last == {r["step"]: r["rollout/reward_mean"] for r in m_straight}
    # the simulator's reader counts a redone step once: the same per-problem rates as the uninterrupted run
    rk, ik = read_rounds_rates(killed)
    rs, is_ = read_rounds_rates(straight)
    assert rk.tolist() == rs.tolist() and ik["rollouts"] == is_["rollouts"] == 8 * 16


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
        train(build_config(None, env["overrides"](tmp_path / "o4") + [f"model.path={tmp_path}/nomodel"]),
              log=quiet)
    with pytest.raises(CheckpointError, match="is not a checkpoint"):
        train(None, resume=str(tmp_path), log=quiet)


def test_nan_loss_stops_without_overwriting_the_last_checkpoint(trainer_env, tmp_path):
    out = tmp_path / "nan"
    # Adam's first step moves each weight by about lr: 1e30 leaves finite but huge weights whose logits overflow
    ov = trainer_env["overrides"](out, "grpo", steps=5) + ["save_every=1", "optim.lr=1e30",
                                                              "optim.grad_clip=0"]
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


def test_engine_gets_the_updated_weights_every_step(trainer_env, tmp_path, monkeypatch):
    import xrpo.trainer.loop as loop

    calls = []
    real_build = loop.build_engine

    def counting_build(cfg, model, tokenizer):
        engine = real_build(cfg, model, tokenizer)
        original = engine.sync_weights

        def sync(m):
            calls.append(m is model)
            original(m)

        engine.sync_weights = sync
        return engine

    monkeypatch.setattr(loop, "build_engine", counting_build)
    train(build_config(None, trainer_env["overrides"](tmp_path / "s", "xrpo", steps=3)), log=quiet)
    assert calls == [True, True, True]


def test_micro_batching_gives_the_full_batch_step(trainer_env, tmp_path):
    # one optimizer step accumulated over many small micro-batches equals the same step in one micro-batch
    runs = {}
    for budget in (32, 100_000):
        out = tmp_path / f"mb{budget}"
        ov = trainer_env["overrides"](out, "xrpo-no-icl") + [f"optim.micro_batch_tokens={budget}", "threads=1"]
        summary = train(build_config(None, ov), log=quiet)
        row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
        runs[budget] = (row, weights(Path(summary["final_checkpoint"]) / "model"))
    (small, w_small), (big, w_big) = runs[32], runs[100_000]
    assert small["loss/policy"] == pytest.approx(big["loss/policy"], rel=1e-5, abs=1e-7)
    assert small["loss/kl"] == pytest.approx(big["loss/kl"], rel=1e-5, abs=1e-9)
    # the accumulated gradient itself: its norm is logged before the optimizer step
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
        train(build_config(None, trainer_env["overrides"](tmp_path / "o") + [f"data.train={f}",
                                                                              "data.max_prompt_tokens=256"]),
              log=quiet)
