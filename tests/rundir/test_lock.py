"""One writer per run directory: a live holder (another process, or another open of the lock in this one) makes a
second one fail at once naming its pid and host (`xrpo train` and `--resume`: tests/trainer/test_resume.py; `xrpo
eval`: tests/eval/test_evaluate.py); the lock of a process killed with SIGKILL is released by the kernel and taken
over, and the newcomer says the old one was stale."""

from __future__ import annotations

import os
import signal
import socket

import pytest

from tests.conftest import hold_run_lock
from xrpo.rundir.lock import LOCK_NAME, RunLock, RunLockedError


def quiet(*_):
    pass


def test_a_live_holder_is_named_and_a_killed_ones_lock_is_taken_over(tmp_path):
    d = tmp_path / "run"
    proc = hold_run_lock(d)
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


def test_an_output_that_is_a_file_is_refused_naming_it(tmp_path):
    (tmp_path / "notes.txt").write_text("not a directory")
    for out in (tmp_path / "notes.txt", tmp_path / "notes.txt" / "run"):
        with pytest.raises(ValueError, match=rf"output {out}: {tmp_path / 'notes.txt'} is an existing file; expected"):
            with RunLock(out, "xrpo train", log=quiet):
                pass
