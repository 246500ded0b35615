"""A resumed run is one run: `xrpo train` killed with SIGKILL between checkpoints (twice), then resumed, leaves each
record with every step once, curves equal to an uninterrupted run's, and a summary that counts every segment. A run
directory another process holds is refused, to a new run and to a resume, and left as it was."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.conftest import hold_run_lock
from xrpo.rundir.checkpoints import CheckpointError, list_checkpoints
from xrpo.rundir.lock import LOCK_NAME, RunLockedError
from xrpo.trainer.config_loader import build_config, to_dict
from xrpo.trainer.loop import train

STEPS, SAVE_EVERY, EVAL_EVERY = 8, 2, 3
# the tensorboard extra: without it the runs write no event files and only those checks are left out
HAS_TB = importlib.util.find_spec("tensorboard") is not None


def quiet(*_):
    pass


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def untimed(row: dict) -> dict:
    # time/* are wall-clock measurements, the only figures a rerun may change
    return {k: v for k, v in row.items() if not k.startswith("time/")}


def last_step(out: Path) -> int:
    good = []
    for line in (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").exists() else []:
        try:
            good.append(json.loads(line)["step"])
        except json.JSONDecodeError:  # a line being written
            pass
    return max(good, default=0)


def ckpt_step(out: Path) -> int:
    found = list_checkpoints(out)
    return int(found[-1].name.split("-")[1]) if found else 0


def kill_between_checkpoints(cmd: list[str], out: Path, env: dict, after: int) -> tuple[int, int, bool]:
    """Run `cmd` and SIGKILL it once checkpoint `after` exists and metrics.jsonl has a step after the latest
    checkpoint. The process is stopped (SIGSTOP) while its files are looked at, so what is seen is what the kill
    leaves. Returns (latest checkpoint step, last logged step, whether the event files held an event of a step after
    the checkpoint: TensorBoard's writer thread may not have written the last step's events yet)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    try:
        while time.time() < deadline and proc.poll() is None:
            if ckpt_step(out) >= after and last_step(out) > after:
                proc.send_signal(signal.SIGSTOP)
                k, s = ckpt_step(out), last_step(out)
                if s > k:
                    late = HAS_TB and any(step > k for step, _ in raw_tb_counts(out / "tensorboard"))
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    return k, s, late
                proc.send_signal(signal.SIGCONT)
            time.sleep(0.01)
        raise AssertionError(
            f"not killed between checkpoints (exit {proc.poll()}): "
            f"{proc.stderr.read().decode()[-2000:] if proc.poll() is not None else 'timeout'}"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def tb_scalars(tb_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def raw_tb_counts(tb_dir: Path) -> Counter:
    """(step, tag) of every summary value in the event files, read record by record (no TensorBoard purging)."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event

    counts: Counter = Counter()
    for f in sorted(tb_dir.glob("*tfevents*")):
        for rec in RawEventFileLoader(str(f)).Load():
            ev = Event.FromString(rec)
            counts.update((ev.step, v.tag) for v in ev.summary.value)
    return counts


def check_tensorboard(tb_dir: Path, ref_dir: Path) -> None:
    """Each (step, tag) once, and the uninterrupted run's scalars (time/* aside), as TensorBoard reads them and
    record by record."""
    if not HAS_TB:
        return
    tb, tb_ref = tb_scalars(tb_dir), tb_scalars(ref_dir)
    assert set(tb) == set(tb_ref)
    for tag in tb:
        if not tag.startswith("time/"):
            assert tb[tag] == tb_ref[tag], tag
        assert [s for s, _ in tb[tag]] == [s for s, _ in tb_ref[tag]], tag
    assert [s for s, _ in tb["rollout/reward_mean"]] == list(range(1, STEPS + 1))
    assert [s for s, _ in tb["eval/pass@1"]] == [0, 3, 6, STEPS]
    raw = raw_tb_counts(tb_dir)
    assert raw == raw_tb_counts(ref_dir)
    assert max(raw.values()) == 1


@pytest.fixture(scope="module")
def overrides(trainer_env):
    ov = trainer_env["overrides"](None, "xrpo", steps=STEPS)
    # bit-exact equality needs the same number of torch threads in the killed subprocesses and in this process
    return [o for o in ov if not o.startswith("output=")] + [
        f"save_every={SAVE_EVERY}",
        "keep_last=10",
        "method.kl_coef=0.01",
        "threads=1",
        f"eval_every={EVAL_EVERY}",
        "log_samples_every=1",
        f"tensorboard={str(HAS_TB).lower()}",
    ]


def test_killed_twice_and_resumed_is_one_run(trainer_env, tmp_path, overrides):
    env = dict(os.environ, PYTHONPATH=str(trainer_env["root"]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cli = [sys.executable, "-m", "xrpo.cli", "train"]
    out = tmp_path / "killed"
    k1, s1, late1 = kill_between_checkpoints(cli + [f"output={out}", *overrides], out, env, after=SAVE_EVERY)
    logged1 = {r["step"]: r for r in rows(out / "metrics.jsonl")}
    k2, s2, late2 = kill_between_checkpoints(cli + ["--resume", str(out)], out, env, after=k1 + SAVE_EVERY)
    assert k1 < s1 and k1 < k2 < s2 < STEPS + 1
    logs: list[str] = []
    summary = train(None, resume=str(out), log=logs.append)
    assert summary["steps"] == STEPS

    straight = tmp_path / "straight"
    ref = train(build_config(None, [f"output={straight}", *overrides]), log=quiet)
    a = load_file(str(Path(summary["final_checkpoint"]) / "model" / "model.safetensors"))
    b = load_file(str(Path(ref["final_checkpoint"]) / "model" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)

    # -------- every record has every step once, with the uninterrupted run's values
    m, m_ref = rows(out / "metrics.jsonl"), rows(straight / "metrics.jsonl")
    assert [r["step"] for r in m] == list(range(1, STEPS + 1))
    assert [untimed(r) for r in m] == [untimed(r) for r in m_ref]
    for name in ("rounds.jsonl", "samples.jsonl"):
        got, want = rows(out / name), rows(straight / name)
        assert sorted({r["step"] for r in got}) == list(range(1, STEPS + 1)), name
        assert got == want, name
    # the simulator's reader (xrpo simulate --rounds-file) sees each step once: the uninterrupted run's rates
    from xrpo.sim.runner import read_rounds_rates

    (rk, ik), (rs, is_) = read_rounds_rates(out), read_rounds_rates(straight)
    assert rk.tolist() == rs.tolist() and ik["rollouts"] == is_["rollouts"] == sum(r["rollout/count"] for r in m_ref)
    evals, evals_ref = rows(out / "eval.jsonl"), rows(straight / "eval.jsonl")
    assert [r["step"] for r in evals] == [0, 3, 6, STEPS]  # before, eval_every, final
    assert [untimed(r) for r in evals] == [untimed(r) for r in evals_ref]

    # -------- TensorBoard: each step once per tag, read back as TensorBoard does and record by record
    check_tensorboard(out / "tensorboard", straight / "tensorboard")

    # -------- what the kills threw away is kept aside, and it is the run's own data
    gone = rows(out / "metrics.discarded.jsonl")
    assert [r["step"] for r in gone] == list(range(k1 + 1, s1 + 1)) + list(range(k2 + 1, s2 + 1))
    for r in gone:
        assert untimed(r) == untimed(m_ref[r["step"] - 1])
    assert gone[: s1 - k1] == [logged1[s] for s in range(k1 + 1, s1 + 1)]
    # events after a checkpoint are set aside when the kill found them written (on a loaded machine TensorBoard's
    # writer thread can lag the metrics row: then there is nothing to set aside)
    assert (out / "tensorboard" / "discarded-events.tfrecord").exists() == (late1 or late2)
    assert any("records brought back to step" in line for line in logs)

    # -------- the summary counts every segment
    segs = summary["segments"]
    assert summary["num_segments"] == 3 and ref["num_segments"] == 1
    assert [(s["start_step"], s["end_step"]) for s in segs] == [(0, k1), (k1, k2), (k2, STEPS)]
    assert [s["steps"] for s in segs] == [k1, k2 - k1, STEPS - k2]
    assert summary["rollouts"] == ref["rollouts"] == sum(r["rollout/count"] for r in m_ref)
    assert summary["tokens"] == ref["tokens"] == sum(r["loss/tokens"] for r in m_ref)
    assert summary["wall_time_s"] == pytest.approx(sum(s["wall_time_s"] for s in segs), rel=1e-12)
    assert all(s["wall_time_s"] > 0 for s in segs)
    # the killed segments' work after their checkpoints: the steps discarded on the next start, their logged time
    assert [s.get("discarded_steps", 0) for s in segs] == [0, s1 - k1, s2 - k2]
    gone_evals = rows(out / "eval.discarded.jsonl")
    assert summary["discarded_time_s"] == pytest.approx(
        sum(r["time/step"] for r in gone) + sum(r["time/validate"] for r in gone_evals), rel=1e-9
    )
    assert summary["discarded_time_s"] > 0
    assert summary["discarded_steps"] == len(gone) == (s1 - k1) + (s2 - k2)
    assert summary["discarded_rollouts"] == sum(r["rollout/count"] for r in gone)
    assert summary["discarded_tokens"] == sum(r["loss/tokens"] for r in gone)
    assert json.loads((out / "summary.json").read_text())["num_segments"] == 3


def test_killed_after_the_final_validation_validates_once(trainer_env, tmp_path, overrides, monkeypatch):
    """Killed after the final checkpoint and the final validation's row, before the checkpoint learns that
    validation: the row is set aside and the validation made again, once. Resuming the finished run then adds a
    segment and validates nothing again."""
    import xrpo.trainer.loop as loop

    class Killed(Exception):
        pass

    def die(*_, **__):
        raise Killed

    out = tmp_path / "final"
    ov = [o for o in overrides if not o.startswith("steps=")] + ["steps=2", f"output={out}"]
    with monkeypatch.context() as mp:
        mp.setattr(loop, "update_state", die)  # the process dies right after logging the final row
        with pytest.raises(Killed):
            train(build_config(None, ov), log=quiet)
    before = rows(out / "eval.jsonl")
    assert [r["step"] for r in before] == [0, 2] and not (out / "summary.json").exists()
    summary = train(None, resume=str(out), log=quiet)
    evals = rows(out / "eval.jsonl")
    assert [r["step"] for r in evals] == [0, 2]
    assert untimed(evals[1]) == untimed(before[1])  # the same model validated with the same seed
    assert rows(out / "eval.discarded.jsonl") == [before[1]]
    assert [r["step"] for r in rows(out / "metrics.jsonl")] == [1, 2]
    if HAS_TB:
        assert [s for s, _ in tb_scalars(out / "tensorboard")["eval/pass@1"]] == [0, 2]
        assert max(raw_tb_counts(out / "tensorboard").values()) == 1
    assert summary["num_segments"] == 2
    assert [(s["start_step"], s["end_step"], s["steps"]) for s in summary["segments"]] == [(0, 2, 2), (2, 2, 0)]
    m = rows(out / "metrics.jsonl")
    assert summary["rollouts"] == sum(r["rollout/count"] for r in m) > 0
    assert summary["tokens"] == sum(r["loss/tokens"] for r in m) > 0
    assert summary["discarded_time_s"] == pytest.approx(before[1]["time/validate"], rel=1e-12)

    # the finished run resumed: its summary is kept aside, a third segment counted, no validation made again
    again = train(None, resume=str(out), log=quiet)
    assert again["num_segments"] == 3 and [s["steps"] for s in again["segments"]] == [2, 0, 0]
    assert json.loads((out / "summary.discarded.json").read_text())["num_segments"] == 2
    assert rows(out / "eval.jsonl") == evals and rows(out / "eval.discarded.jsonl") == [before[1]]
    assert again["heldout_after"] == {k: v for k, v in evals[1].items() if k != "step"}
    assert again["rollouts"] == summary["rollouts"]


def test_resume_before_the_first_checkpoint_says_how_to_start_again(trainer_env, tmp_path, overrides):
    out = tmp_path / "early"
    # what a run killed during its first steps leaves: its config and some rows, no checkpoint
    cfg = build_config(None, [o for o in overrides if not o.startswith("steps=")] + ["steps=1", f"output={out}"])
    out.mkdir()
    (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(CheckpointError, match=r"has no complete checkpoint yet .* xrpo train --config .*config\.yaml"):
        train(None, resume=str(out), log=quiet)
    # the command it suggests works
    summary = train(build_config(str(out / "config.yaml")), log=quiet)
    assert summary["steps"] == 1 and summary["num_segments"] == 1


def test_a_new_run_into_a_finished_runs_directory_is_refused(trainer_env, tmp_path, overrides):
    out = tmp_path / "done"
    cfg = [o for o in overrides if not o.startswith("steps=")] + ["steps=2", "save_every=1", f"output={out}"]
    train(build_config(None, cfg), log=quiet)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(CheckpointError, match=r"already holds a run \(checkpoints up to step-0*2\).*--resume"):
        train(build_config(None, cfg), log=quiet)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # nothing was changed


def test_resume_from_an_earlier_checkpoint_sets_the_later_ones_aside(trainer_env, tmp_path, overrides):
    out = tmp_path / "back"
    ov = [o for o in overrides if not o.startswith(("steps=", "save_every="))] + [
        "steps=3",
        "save_every=1",
        f"output={out}",
    ]
    train(build_config(None, ov), log=quiet)
    shutil.rmtree(out / "tensorboard", ignore_errors=True)  # a run whose event files are gone: nothing to rewind
    summary = train(None, resume=str(out / "checkpoints" / "step-00000001"), log=quiet)
    assert [r["step"] for r in rows(out / "metrics.jsonl")] == [1, 2, 3]
    assert [r["step"] for r in rows(out / "metrics.discarded.jsonl")] == [2, 3]
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names == [
        "discarded-step-00000002",
        "discarded-step-00000003",
        "step-00000001",
        "step-00000002",
        "step-00000003",
    ]
    assert summary["num_segments"] == 2 and summary["segments"][1]["discarded_steps"] == 2


def test_train_and_resume_are_refused_while_another_process_holds_the_run(trainer_env, tmp_path):
    out = tmp_path / "run"
    ov = trainer_env["overrides"](out, "grpo", steps=1) + ["save_every=1"]
    train(build_config(None, ov), log=quiet)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    proc = hold_run_lock(out)
    try:
        for attempt in (lambda: train(build_config(None, ov), log=quiet), lambda: train(None, resume=str(out))):
            with pytest.raises(RunLockedError, match=rf"{out} is in use by xrpo train \(pid {proc.pid} on host "):
                attempt()
    finally:
        proc.kill()
        proc.wait()
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != LOCK_NAME}
    assert after == {p: b for p, b in before.items() if p.name != LOCK_NAME}  # nothing was changed
