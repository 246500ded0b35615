"""Preemption, with real processes and real signals: `xrpo train` sent SIGTERM (or SIGINT) during generation, during
the update or during a checkpoint write finishes that step, checkpoints it and exits naming ``--resume DIR``; the
resumed run equals an uninterrupted one (weights bit for bit, every record). A second signal ends the process at
once, and the last complete checkpoint resumes to the same run.

To signal at a known point, the subprocess runs `xrpo train` behind HOOKS (written below, test code only): at the
chosen point it writes a marker file and waits until the test has sent its signal, so the signal arrives while
that phase is under way (Python runs the handler in the waiting loop, inside the phase)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from xrpo.rundir.checkpoints import list_checkpoints
from xrpo.trainer.config_loader import build_config
from xrpo.trainer.loop import train

STEPS, SAVE_EVERY = 4, 2

HOOKS = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path

    import xrpo.trainer.checkpoint as ckpt
    import xrpo.trainer.loop as loop
    import xrpo.trainer.update as update
    from xrpo.cli import main

    MARK = Path(os.environ["XRPO_TEST_MARK"])
    PAUSES = [tuple(p.split(":")) for p in os.environ["XRPO_TEST_PAUSE"].split(",")]  # [(phase, step), ...]
    now = {"step": 0, "phase": None, "calls": 0}

    def pause_if(phase):
        key = (phase, str(now["step"]))
        if key not in PAUSES:
            return
        PAUSES.remove(key)
        tmp = MARK.with_name(MARK.name + ".tmp")  # renamed into place: the test never reads a half-written mark
        tmp.write_text(":".join(key))
        os.replace(tmp, MARK)
        go = MARK.with_name(MARK.name + ".go")
        deadline = time.time() + 60
        while not go.exists() and time.time() < deadline:
            time.sleep(0.01)
        go.unlink()

    real_build_source, real_build_engine = loop.build_source, loop.build_engine
    real_update, real_lp, real_fsync = loop.policy_update, update.completion_logprobs, ckpt.fsync_dir

    def build_source(*a, **kw):
        src = real_build_source(*a, **kw)
        real_next = src.next_batch

        def next_batch(step):
            now["step"] = step
            return real_next(step)

        src.next_batch = next_batch
        return src

    def build_engine(*a, **kw):
        engine = real_build_engine(*a, **kw)
        real_generate = engine.generate

        def generate(*a, **kw):
            out = real_generate(*a, **kw)  # the first call of the step has sampled: pause inside generation
            pause_if("generation")
            return out

        engine.generate = generate
        return engine

    def policy_update(*a, **kw):
        now["phase"], now["calls"] = "update", 0
        try:
            return real_update(*a, **kw)
        finally:
            now["phase"] = None

    def completion_logprobs(*a, **kw):
        if now["phase"] == "update":
            now["calls"] += 1
            if now["calls"] == 2:  # one micro-batch's gradient is accumulated, the others are not
                pause_if("update")
        return real_lp(*a, **kw)

    def fsync_dir(path):
        real_fsync(path)
        if Path(path).name.endswith(".tmp"):  # every file written, the rename to step-N not made yet
            pause_if("checkpoint")

    loop.build_source, loop.build_engine, loop.policy_update = build_source, build_engine, policy_update
    update.completion_logprobs, ckpt.fsync_dir = completion_logprobs, fsync_dir
    sys.exit(main(sys.argv[1:]))
""")


def quiet(*_):
    pass


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def untimed(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("time/")}


def ckpt_steps(out: Path) -> list[int]:
    return [int(p.name.split("-")[1]) for p in list_checkpoints(out)]


@pytest.fixture(scope="module")
def overrides(trainer_env):
    ov = trainer_env["overrides"](None, "xrpo", steps=STEPS)
    # the same number of torch threads in the subprocesses and here: bit-exact equality
    return [o for o in ov if not o.startswith("output=")] + [
        f"save_every={SAVE_EVERY}",
        "keep_last=10",
        "method.kl_coef=0.01",
        "threads=1",
        "eval_every=3",
        "log_samples_every=1",
    ]


@pytest.fixture(scope="module")
def straight(trainer_env, overrides, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "run"
    return out, train(build_config(None, [f"output={out}", *overrides]), log=quiet)


def run_until_signalled(trainer_env, tmp_path, argv: list[str], pauses: str, signals: list[int]):
    """Run `xrpo train ARGV` behind HOOKS; at each pause (in order) send the next signal. Returns (exit code, stderr,
    the phases the signals were sent in)."""
    hooks = tmp_path / "hooks.py"
    hooks.write_text(HOOKS)
    mark = tmp_path / "mark"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(trainer_env["root"]), *sys.path]),
        XRPO_TEST_MARK=str(mark),
        XRPO_TEST_PAUSE=pauses,
    )
    proc = subprocess.Popen(
        [sys.executable, str(hooks), "train", *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    sent = []
    try:
        deadline = time.time() + 120
        for sig in signals:
            while not mark.exists() and proc.poll() is None and time.time() < deadline:
                time.sleep(0.01)
            assert mark.exists(), f"no pause (exit {proc.poll()}): {proc.stderr.read().decode()[-3000:]}"
            sent.append(mark.read_text())
            mark.unlink()
            proc.send_signal(sig)
            time.sleep(0.2)  # the handler runs in the waiting loop, inside the phase
            mark.with_name(mark.name + ".go").write_text("")
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return rc, proc.stderr.read().decode(), sent


def assert_same_run(out: Path, straight: tuple[Path, dict], summary: dict) -> None:
    ref_out, ref = straight
    a = load_file(str(Path(summary["final_checkpoint"]) / "model" / "model.safetensors"))
    b = load_file(str(Path(ref["final_checkpoint"]) / "model" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    for name in ("metrics.jsonl", "eval.jsonl", "rounds.jsonl", "samples.jsonl"):
        assert [untimed(r) for r in rows(out / name)] == [untimed(r) for r in rows(ref_out / name)], name
    assert summary["rollouts"] == ref["rollouts"] and summary["tokens"] == ref["tokens"]


@pytest.mark.parametrize(
    "phase, step, sig",
    [("generation", 3, signal.SIGTERM), ("update", 1, signal.SIGINT), ("checkpoint", 2, signal.SIGTERM)],
)
def test_a_signal_ends_the_step_checkpoints_it_and_the_resumed_run_is_one_run(
    trainer_env, tmp_path, overrides, straight, phase, step, sig
):
    out = tmp_path / "run"
    rc, err, sent = run_until_signalled(trainer_env, tmp_path, [f"output={out}", *overrides], f"{phase}:{step}", [sig])
    assert sent == [f"{phase}:{step}"]
    assert rc == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name} after step {step} of {STEPS}" in err, err
    assert f"Continue with: xrpo train --resume {out}" in err
    # the step under way was finished and checkpointed (the checkpoint step's own save: written once)
    assert ckpt_steps(out)[-1] == step
    assert [r["step"] for r in rows(out / "metrics.jsonl")] == list(range(1, step + 1))
    assert not (out / "summary.json").exists()
    state = json.loads((list_checkpoints(out)[-1] / "state.json").read_text())
    assert [(s["start_step"], s["end_step"], s["steps"]) for s in state["segments"]] == [(0, step, step)]

    logs: list[str] = []
    summary = train(None, resume=str(out), log=logs.append)
    assert_same_run(out, straight, summary)
    assert not rows(out / "metrics.discarded.jsonl")  # nothing was logged after the checkpoint: nothing redone
    assert [(s["start_step"], s["end_step"]) for s in summary["segments"]] == [(0, step), (step, STEPS)]


def test_a_second_signal_stops_at_once_and_the_last_checkpoint_stays_whole(trainer_env, tmp_path, overrides, straight):
    out = tmp_path / "run"
    # SIGTERM during step 3's update, a second one while step 3's checkpoint is being written
    rc, err, sent = run_until_signalled(
        trainer_env, tmp_path, [f"output={out}", *overrides], "update:3,checkpoint:3", [signal.SIGTERM] * 2
    )
    assert sent == ["update:3", "checkpoint:3"]
    assert rc == -signal.SIGTERM, err  # ended by the signal itself, no clean-up
    assert "second signal (SIGTERM): stopping at once" in err
    assert ckpt_steps(out) == [2]  # step 3's checkpoint was never completed ...
    assert (out / "checkpoints" / "step-00000003.tmp").is_dir()  # ... its temporary directory is left half-written
    summary = train(None, resume=str(out), log=quiet)
    assert_same_run(out, straight, summary)
    assert [r["step"] for r in rows(out / "metrics.discarded.jsonl")] == [3]  # step 3's row, logged before the kill
