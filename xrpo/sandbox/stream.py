"""What comes back from a sandbox (`xrpo.sandbox.programs`): the result types (`TestOutcome`, `SandboxResult`) and the
caller's parser of the boot's stream (`Frames`; the stream's format is in `xrpo.sandbox._boot`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["TEST_STATUSES", "Frames", "SandboxResult", "TestOutcome", "count"]

TEST_STATUSES = ("ok", "runtime_error", "timeout", "memory", "output_limit", "not_run")


@dataclass
class TestOutcome:
    """What one test run did.

    Attributes:
        status: "ok" (exited 0), "runtime_error" (non-zero exit, uncaught exception, killed by a signal), "timeout"
            (wall or CPU limit), "memory" (MemoryError or allocation failure), "output_limit", "not_run" (the
            program-level limit passed first, or an earlier test failed with `stop_on_failure`).
        exit_code / signal: how the process ended (None when not applicable).
        stdout: bytes the program printed (at most `max_output_bytes`).
        value: call mode: the JSON text of the returned value; check mode: b"pass" when check() returned; else None.
        stderr: the last 2,000 characters of stderr.
        wall_s / cpu_s: wall-clock and CPU seconds of the test's process.
    """

    status: str
    exit_code: int | None = None
    signal: int | None = None
    stdout: bytes = b""
    value: bytes | None = None
    stderr: str = ""
    wall_s: float = 0.0
    cpu_s: float = 0.0


@dataclass
class SandboxResult:
    """The outcome of one program.

    Attributes:
        status: "ok" (the harness ran the tests it could), "compile_error" (`error` has the message),
            "sandbox_error" (the sandbox itself failed or was killed by the program: `error` says how), "timeout"
            (the caller killed the run at its hard limit).
        tests: one `TestOutcome` per input, in order (missing ones are "not_run").
        error: compile error or sandbox failure text; "" otherwise.
        isolation: the layers in force (module docstring).
        wall_s: wall-clock seconds of the whole run, start-up included.
    """

    status: str
    tests: list[TestOutcome] = field(default_factory=list)
    error: str = ""
    isolation: tuple[str, ...] = ()
    wall_s: float = 0.0


def count(text: str) -> int:
    """A length or index of the harness's stream: ASCII digits only (int() also takes "-1", "+1", "1_0", " 1")."""
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise ValueError(f"not a count: {text[:20]!r}")
    return int(text)


class Frames:
    """The harness's stream (format in `xrpo.sandbox._boot`), parsed as it arrives: a test's outcome goes to
    `on_test` as soon as its frame is complete, and the buffer never holds more than one frame (at most
    `max_frame` bytes), however many tests the program has."""

    def __init__(self, n_tests: int, max_frame: int, on_test: Callable[[int, TestOutcome], TestOutcome] | None):
        self.tests = [TestOutcome(status="not_run") for _ in range(n_tests)]
        self.max_frame, self.on_test = max_frame, on_test
        self.layers: tuple[str, ...] | None = None
        self.closing: str | None = None  # "" when the harness finished, "C:msg" / "E:msg", None when it broke off
        self.done = self.broken = False
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> bool:
        """Take the next bytes of the stream; False once it is finished or broken (stop reading)."""
        buf = self._buf
        buf += chunk
        while not (self.done or self.broken):
            nl = buf.find(b"\n", 0, 512)
            if nl < 0:
                self.broken = len(buf) >= 512
                break
            head = bytes(buf[:nl]).decode("ascii", "replace").split()
            try:
                size = count(head[1])
            except (IndexError, ValueError):
                self.broken = True
                break
            if size > self.max_frame:
                self.broken = True
                break
            if len(buf) - nl - 1 < size:
                break  # the rest of this frame is still on its way
            with memoryview(buf) as view:
                test = self._frame(head[0], head[2:], view[nl + 1 : nl + 1 + size])
            del buf[: nl + 1 + size]  # before `on_test`: the frame and the outcome copied out of it are never both held
            if test is not None:
                i, outcome = test
                self.tests[i] = self.on_test(i, outcome) if self.on_test is not None else outcome
        return not (self.done or self.broken)

    def _frame(self, kind: str, fields: list[str], payload: memoryview) -> tuple[int, TestOutcome] | None:
        """Take one frame; a test's frame is returned as (index, outcome)."""
        if kind == "H":
            self.layers = tuple(x for x in bytes(payload).decode("ascii", "replace").split(",") if x)
        elif kind == "T":
            try:
                i, status, exit_code, sig, wall_s, cpu_s, n_out, n_val, n_err = fields
                i, n_out, n_err = count(i), count(n_out), count(n_err)
                n_val = None if n_val == "-" else count(n_val)
                if n_out + (n_val or 0) + n_err > len(payload):
                    raise ValueError("the parts of a test's frame are longer than the frame")
                test = TestOutcome(
                    status=status,
                    exit_code=None if exit_code == "-" else int(exit_code),
                    signal=None if sig == "-" else int(sig),
                    stdout=bytes(payload[:n_out]),
                    value=None if n_val is None else bytes(payload[n_out : n_out + n_val]),
                    stderr=bytes(payload[len(payload) - n_err :]).decode("utf-8", "replace") if n_err else "",
                    wall_s=float(wall_s),
                    cpu_s=float(cpu_s),
                )
            except (ValueError, TypeError):
                self.broken = True
                return None
            if 0 <= i < len(self.tests) and status in TEST_STATUSES:
                return i, test
        elif kind in ("C", "E"):
            self.closing = kind + ":" + bytes(payload).decode("utf-8", "replace")
        elif kind == "D":
            self.closing = self.closing if self.closing is not None else ""
            self.done = True
        return None
