"""One writer per run directory: a live holder (another process, or another open of the lock in this one) makes a
second `xrpo train` or `--resume` fail at once naming its pid and host (`xrpo eval`: tests/eval/test_evaluate.py);
the lock of a process killed with SIGKILL is released by the kernel and taken over, and the newcomer says the old
one was stale."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from xrpo.trainer.config_loader import build_config
from xrpo.trainer.loop import train
from xrpo.trainer.runlock import LOCK_NAME, RunLock, RunLockedError

HOLD = (
    "import sys, time; from xrpo.trainer.runlock import RunLock\n"
    "with RunLock(sys.argv[1], 'xrpo train') as lock:\n"
    "    lock.claim(); print('held', flush=True); time.sleep(120)\n"
)


def quiet(*_):
    pass


def hold_in_another_process(path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_live_holder_is_named_and_a_killed_ones_lock_is_taken_over(tmp_path):
    d = tmp_path / "run"
    proc = hold_in_another_process(d)
    try:
        with pytest.raises(
            RunLockedError, match=rf"in use by xrpo train \(pid {proc.pid} on host {socket.gethostname()}"
        ):
            RunLock(d, "xrpo eval").__enter__()
    finally:
        proc.send_signal(signal.SIGKILL)  # no clean-up: the lock file still names it
        proc.wait()
    assert f'"pid": {proc.pid}' in (d / LOCK_NAME).read_text()
    logs: list[str] = []
    with RunLock(d, "xrpo train", log=logs.append) as lock:
        lock.claim()
        assert f'"pid": {os.getpid()}' in (d / LOCK_NAME).read_text()
    assert len(logs) == 1 and f"taking over the lock of xrpo train (pid {proc.pid}" in logs[0] and "stale" in logs[0]
    # a holder that ended normally leaves no holder behind: the next one has nothing to report
    with RunLock(d, "xrpo train", log=logs.append):
        pass
    assert len(logs) == 1


def test_train_and_resume_are_refused_while_another_process_holds_the_run(trainer_env, tmp_path):
    out = tmp_path / "run"
    ov = trainer_env["overrides"](out, "grpo", steps=1) + ["save_every=1"]
    train(build_config(None, ov), log=quiet)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    proc = hold_in_another_process(out)
    try:
        for attempt in (lambda: train(build_config(None, ov), log=quiet), lambda: train(None, resume=str(out))):
            with pytest.raises(RunLockedError, match=rf"{out} is in use by xrpo train \(pid {proc.pid} on host "):
                attempt()
    finally:
        proc.kill()
        proc.wait()
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != LOCK_NAME}
    assert after == {p: b for p, b in before.items() if p.name != LOCK_NAME}  # nothing was changed


def test_an_output_that_is_a_file_is_refused_naming_it(tmp_path):
    (tmp_path / "notes.txt").write_text("not a directory")
    for out in (tmp_path / "notes.txt", tmp_path / "notes.txt" / "run"):
        with pytest.raises(ValueError, match=rf"output {out}: {tmp_path / 'notes.txt'} is an existing file; expected"):
            with RunLock(out, "xrpo train", log=quiet):
                pass
