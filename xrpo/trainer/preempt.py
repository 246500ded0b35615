"""Preemption: what `xrpo train` does on SIGTERM (what Slurm and Kubernetes send before they kill) and SIGINT (Ctrl-C).

The first signal is only noted: the step under way (generation, update, validation or a checkpoint write) runs to
its end, the loop writes a checkpoint of that step unless it just wrote one, and stops with `TrainingStopped`, whose
message names ``xrpo train --resume DIR``. Stopping at a step's end is what makes the resumed run equal an
uninterrupted one: a checkpoint written anywhere else would hold half an update or a data order one step ahead.
A second signal ends the process at once (the default action of that signal): checkpoints are written into a
temporary directory and renamed when complete (`xrpo.trainer.checkpoint`), so the last one stays whole, and the
records' rows after it are set aside on resume.

A step longer than the scheduler's grace period is killed before it ends; ask the scheduler for the signal early
enough (Slurm: ``#SBATCH --signal=TERM@300``; Kubernetes: ``terminationGracePeriodSeconds``).
"""

from __future__ import annotations

import os
import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingStopped(Exception):
    """Raised by `train` after a stop signal once the step's checkpoint is written."""

    def __init__(self, message: str, *, signum: int, step: int, checkpoint: str):
        super().__init__(message)
        self.signum = signum
        self.step = step
        self.checkpoint = checkpoint

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # what a shell reports for a process ended by that signal


class StopSignals:
    """``with StopSignals() as stop:`` notes the first SIGTERM / SIGINT in ``stop.signum``; a second one ends the
    process at once. Outside the main thread (where Python cannot install handlers) it notes nothing."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        # os.write, not print: the handler may run in the middle of a print to the same stream
        name = signal.Signals(signum).name
        if self.signum is None:
            self.signum = signum
            _say(
                f"xrpo train: {name} received: finishing the current step, then writing a checkpoint and stopping "
                f"(a second signal stops at once, keeping the last complete checkpoint)"
            )
            return
        _say(f"xrpo train: second signal ({name}): stopping at once; the last complete checkpoint is kept")
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""


def _say(text: str) -> None:
    os.write(2, (text + "\n").encode())
