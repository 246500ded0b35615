"""The length headers of the sandbox's two streams are validated where they are read: the harness's
frames in the caller (`xrpo.sandbox.stream.Frames`), and the check protocol between the checker and the
program's process, both ways (`xrpo.sandbox._boot_check.recv`). int() alone took ``-1`` (which reads to the end of the
stream, past the cap), ``+1``, ``1_0`` and `` 1``."""

from __future__ import annotations

import io
import textwrap

import pytest

from tests.conftest import assert_nothing_left_running
from xrpo.sandbox import Limits, run_program
from xrpo.sandbox._boot_check import recv
from xrpo.sandbox.stream import Frames

FORGED_LENGTHS = [b"-1", b"+3", b"3_0", b"\xd9\xa3", b"3 ", b"", b"0x3"]  # \xd9\xa3: ARABIC-INDIC DIGIT THREE


@pytest.mark.parametrize("head", FORGED_LENGTHS)
def test_check_protocol_refuses_a_forged_length(head):
    with pytest.raises(ValueError, match="malformed message header"):
        recv(io.BytesIO(head + b"\n[1]" + b"x" * 100), cap=1000)


def test_check_protocol_reads_a_valid_message_and_caps_it():
    assert recv(io.BytesIO(b"3\n[1]"), cap=1000) == [1]
    assert recv(io.BytesIO(b""), cap=1000) is None
    assert recv(io.BytesIO(b"5\n[1]"), cap=1000) is None  # cut short: the program's process ended
    with pytest.raises(ValueError, match="more than the output limit"):
        recv(io.BytesIO(b"1001\n"), cap=1000)


def frames_after(stream: bytes) -> Frames:
    frames = Frames(2, max_frame=1000, on_test=None)
    frames.feed(stream)
    return frames


def test_caller_refuses_forged_frame_lengths():
    good = b"H 4\nuid,T 5 0 ok 0 - 0.1 0.1 3 - 2\nabc..D 0\n"
    f = frames_after(good)
    assert f.done and not f.broken and f.tests[0].stdout == b"abc" and f.tests[0].stderr == ".."
    for head in FORGED_LENGTHS:
        if head == b"3 ":  # the caller's header is whitespace-separated fields: a trailing space is harmless
            continue
        f = frames_after(b"H " + head + b"\nuid,D 0\n")
        assert f.broken and not f.done, head


@pytest.mark.parametrize(
    "fields",
    [
        b"0 ok 0 - 0.1 0.1 -1 - 2",  # a negative part
        b"0 ok 0 - 0.1 0.1 4 - 2",  # parts longer than the frame
        b"0 ok 0 - 0.1 0.1 1 +1 2",
        b"-1 ok 0 - 0.1 0.1 3 - 2",  # a negative test index
    ],
)
def test_caller_refuses_forged_test_fields(fields):
    f = frames_after(b"T 5 " + fields + b"\nabc..D 0\n")
    assert f.broken and f.tests[0].status == "not_run", f.tests


def test_a_program_that_forges_a_negative_length_is_refused_at_once():
    """The program's process writes its own reply header ``-1``, then data, and keeps its stream open: the checker
    refuses the header instead of reading on to the end of the stream."""
    program = textwrap.dedent("""
        import sys, time
        resp = sys._getframe(1).f_locals["resp"]  # the harness's _serve: the reply stream to the checker
        resp.write(b"-1\\n" + b"[" * 4096)
        resp.flush()
        time.sleep(30)
        def f(x):
            return x
    """)
    res = run_program(
        program,
        "check",
        [None],
        check_code="def check(c):\n    assert c(2) == 2\n",
        entry_point="f",
        limits=Limits(timeout=10, sample_timeout=20, memory_mb=256),
    )
    t = res.tests[0]
    assert t.status == "runtime_error" and "malformed message header" in t.stderr, t
    assert t.wall_s < 5  # refused at once, not after the program's 30 s
    assert_nothing_left_running()
