"""What a correct program may do, in the sandbox (xrpo/sandbox/_boot_program.py, _boot_harness.py, _boot_isolation.py):
each test is a property "a correct program that does X is judged correct", checked on several programs that do X.

The sandbox changes what a program may do to the machine, never whether a correct program is judged correct: a
program that ``python3 solution.py < input`` runs correctly must print the same here.
tests/rewards/test_code_differential.py runs a corpus of such programs both ways, through the verifier, in every
isolation mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import assert_nothing_left_running
from xrpo.rewards import CodeVerifier
from xrpo.sandbox import Limits, probe, programs, run_program

LIMITS = Limits(timeout=10.0, sample_timeout=30.0, memory_mb=512)


@pytest.fixture(autouse=True)
def nothing_left_running():
    yield
    assert_nothing_left_running()


def outputs(programs_: dict[str, str], stdin: str = "", limits: Limits = LIMITS, **kw) -> dict[str, bytes]:
    """Each program's stdout, asserting that it ran to a clean exit."""
    out = {}
    for name, code in programs_.items():
        res = run_program(textwrap.dedent(code), "stdin", [stdin], limits=limits, **kw)
        t = res.tests[0]
        assert res.status == "ok" and t.status == "ok", (name, res.status, res.error, t.status, t.stderr)
        out[name] = t.stdout
    return out


def test_a_program_that_ends_with_exit_or_quit_is_judged_correct():
    # `site` adds them; the sandbox runs the interpreter without it (-S), so the harness adds them the same way
    got = outputs(
        {
            "exit": "print(1)\nexit()",
            "quit": "print(1)\nquit(0)",
            "exit-in-a-function": "def main():\n    print(1)\n    exit(0)\nmain()\nprint(2)",
            "help-and-copyright-exist": "print(1 if callable(help) and 'Python' in str(copyright) else 0)",
        }
    )
    assert set(got.values()) == {b"1\n"}


def test_a_program_whose_threads_finish_after_its_main_body_is_judged_correct():
    """The competition idiom for deep recursion: the work runs in a thread with a large stack, and the main body ends
    at once; the interpreter joins non-daemon threads before it exits."""
    got = outputs(
        {
            "deep-recursion": """
                import sys, threading
                sys.setrecursionlimit(10**6)
                threading.stack_size(2**26)
                def main():
                    def depth(n):
                        return 0 if n == 0 else 1 + depth(n - 1)
                    print(depth(int(input())))
                threading.Thread(target=main).start()
            """,
            "exit-while-a-thread-runs": """
                import sys, threading, time
                def late():
                    time.sleep(0.2)
                    print(50000)
                threading.Thread(target=late).start()
                sys.exit(0)
            """,
            "thread-pool-at-exit": """
                from concurrent.futures import ThreadPoolExecutor
                ex = ThreadPoolExecutor(2)
                ex.submit(lambda: print(50000))
            """,
        },
        stdin="50000\n",
    )
    assert set(got.values()) == {b"50000\n"}


def test_a_program_whose_output_is_written_at_exit_is_judged_correct():
    """atexit handlers run, and file objects the program left open on fd 1 are flushed (the interpreter finalizes
    them at exit), after sys.stdout, as CPython orders them."""
    got = outputs(
        {
            "atexit": "import atexit\natexit.register(print, 'b')\nprint('a')",
            "fd1-file-object": "import sys\nprint('a')\nout = open(1, 'w', closefd=False)\nout.write('b\\n')",
            "os-fdopen": "import os\nprint('a')\nw = os.fdopen(1, 'w')\nw.write('b\\n')",
            "print-flush-false": "import sys\nprint('a', flush=False)\nsys.stdout.write('b\\n')",
            "buffer-write": "import sys\nsys.stdout.buffer.write(b'a\\nb\\n')",
            "os-write": "import os\nos.write(1, b'a\\n')\nos.write(1, b'b\\n')",
        }
    )
    assert set(got.values()) == {b"a\nb\n"}


STREAMS = """
import sys
for s in (sys.stdin, sys.stdout, sys.stderr):
    raw = s.buffer.raw
    print(type(s).__name__, s.name, s.mode, s.encoding, s.errors, s.line_buffering, s.write_through, s.fileno(),
          type(s.buffer).__name__, type(raw).__name__, raw.name, raw.mode, s.readable(), s.writable(), repr(s.newlines))
print(sys.stdin is sys.__stdin__, sys.stdout is sys.__stdout__, sys.stderr is sys.__stderr__)
print(repr(sys.stdin.readline()), repr(sys.stdin.read()))
"""


def test_a_program_sees_the_standard_streams_a_plain_interpreter_gives_it(tmp_path):
    """sys.stdin, sys.stdout and sys.stderr are CPython's own, as ``python3 solution.py < input`` makes them: every
    attribute the Codeforces fast-I/O templates read (mode, name, buffer, fileno()) and the newline handling."""
    stdin = "3 4\r\nlast"
    (tmp_path / "in.txt").write_text(stdin, newline="")
    (tmp_path / "solution.py").write_text(STREAMS)
    with open(tmp_path / "in.txt", "rb") as f:
        plain = subprocess.run(
            [sys.executable, "solution.py"],
            stdin=f,
            capture_output=True,
            cwd=tmp_path,
            env=programs._env(str(tmp_path)),
        )
    assert plain.returncode == 0, plain.stderr
    assert outputs({"streams": STREAMS}, stdin=stdin)["streams"] == plain.stdout


# the Codeforces fast-I/O template (PyRival's), as solutions paste it above their code
FAST_IO_TEMPLATE = """
import os, sys
from io import BytesIO, IOBase
BUFSIZE = 8192
class FastIO(IOBase):
    newlines = 0
    def __init__(self, file):
        self._fd = file.fileno()
        self.buffer = BytesIO()
        self.writable = "x" in file.mode or "r" not in file.mode
        self.write = self.buffer.write if self.writable else None
    def read(self):
        while True:
            b = os.read(self._fd, max(os.fstat(self._fd).st_size, BUFSIZE))
            if not b:
                break
            ptr = self.buffer.tell()
            self.buffer.seek(0, 2), self.buffer.write(b), self.buffer.seek(ptr)
        self.newlines = 0
        return self.buffer.read()
    def readline(self):
        while self.newlines == 0:
            b = os.read(self._fd, max(os.fstat(self._fd).st_size, BUFSIZE))
            self.newlines = b.count(b"\\n") + (not b)
            ptr = self.buffer.tell()
            self.buffer.seek(0, 2), self.buffer.write(b), self.buffer.seek(ptr)
        self.newlines -= 1
        return self.buffer.readline()
    def flush(self):
        if self.writable:
            os.write(self._fd, self.buffer.getvalue())
            self.buffer.truncate(0), self.buffer.seek(0)
class IOWrapper(IOBase):
    def __init__(self, file):
        self.buffer = FastIO(file)
        self.flush = self.buffer.flush
        self.writable = self.buffer.writable
        self.write = lambda s: self.buffer.write(s.encode("ascii"))
        self.read = lambda: self.buffer.read().decode("ascii")
        self.readline = lambda: self.buffer.readline().decode("ascii")
sys.stdin, sys.stdout = IOWrapper(sys.stdin), IOWrapper(sys.stdout)
input = lambda: sys.stdin.readline().rstrip("\\r\\n")
"""


def test_a_program_with_the_codeforces_fast_io_template_is_judged_correct():
    program = FAST_IO_TEMPLATE + "n = int(input())\nprint(sum(map(int, input().split())) * n)\n"
    assert outputs({"fast-io": program}, stdin="2\n1 2 3\n")["fast-io"] == b"12\n"


def test_a_program_that_opens_dev_stdin_or_dev_fd_is_judged_correct():
    got = outputs(
        {
            "dev-stdin": "print(open('/dev/stdin').read().split()[1])",
            "dev-fd-0": "import os\nprint(open('/dev/fd/0', 'rb').read().split()[1].decode())",
            "dev-stdout": "print('x', file=sys.stderr) if False else None\nopen('/dev/stdout', 'w').write('7\\n')",
            "dev-stderr-and-stdout": "import sys\nopen('/dev/stderr', 'w').write('log\\n')\nprint(7)",
        },
        stdin="3 7\n",
    )
    assert set(got.values()) == {b"7\n"}


def test_a_program_that_imports_an_allowed_package_is_judged_correct():
    pytest.importorskip("numpy")
    got = outputs({"numpy": "import numpy as np\nprint(int(np.arange(int(input())).sum()))"}, stdin="5\n")
    assert got["numpy"] == b"10\n"
    # only the allowed ones: the rest of their site-packages stays out of the program's imports
    res = run_program("import pytest", "stdin", [""], limits=LIMITS)
    assert res.tests[0].status == "runtime_error" and "ModuleNotFoundError" in res.tests[0].stderr


def test_a_program_with_large_inputs_gets_its_whole_memory_limit():
    """The harness reads one test's input at a time: 30 tests of 8 MiB at memory_mb=256 (240 MiB of input) all run,
    and each program process still has its own 256 MiB (it holds two copies of its 8 MiB input here)."""
    inputs = [f"{i:07d}\n" * 2**20 for i in range(30)]
    res = run_program(
        "import sys\ndata = sys.stdin.buffer.read()\ntext = data.decode()\nprint(len(text), text[:7])",
        "stdin",
        inputs,
        limits=Limits(timeout=10, sample_timeout=120, memory_mb=256),
    )
    assert res.status == "ok", res.error
    assert [t.stdout for t in res.tests] == [f"{8 * 2**20} {i:07d}\n".encode() for i in range(30)]


def test_an_error_of_the_harness_itself_reaches_the_caller_with_its_reason(monkeypatch):
    """A harness that fails (here: an inputs file cut short) reports why on the result stream: the caller sees a
    sandbox_error with the harness's reason, after the tests it did run."""
    write_inputs = programs._write_inputs

    def cut_short(path, mode, inputs):
        spans, largest = write_inputs(path, mode, inputs)
        os.truncate(path, spans[-1][0] + 1)
        return spans, largest

    monkeypatch.setattr(programs, "_write_inputs", cut_short)
    res = run_program("print(input())", "stdin", ["a\n", "bb\n"], limits=LIMITS)
    assert res.status == "sandbox_error"
    assert "the harness failed: OSError" in res.error and "ended before test 1" in res.error, res.error
    assert [t.status for t in res.tests] == ["ok", "not_run"] and res.tests[0].stdout == b"a\n"
    verdict = CodeVerifier(workers=1, timeout=10, sample_timeout=30, memory_mb=512).verify_batch(
        ["```python\nprint(input())\n```"], [json.dumps([{"input": "a\n", "output": "a\n"}] * 2)]
    )[0]
    assert verdict.reason == "sandbox_error" and "the harness failed" in verdict.metadata["detail"], verdict


NEIGHBOUR = """
import os
for _ in range(12):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.setsid()
        while True:
            pass
while True:
    pass
"""
HONEST = """
n = int(input())
s = 0
for i in range(n):
    s += i * i % 7
print(s)
"""


def _fair_share_here(layers) -> bool:
    """cgroup v2 cpu.max, or the kernel's autogroup (a CPU share per session) under seccomp."""
    if "cpu_max" in layers:
        return True
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip() == "1" and "seccomp" in layers and "cpu_time" in layers
    except OSError:
        return False


def test_a_correct_program_is_not_starved_by_a_neighbour_in_the_same_batch():
    """A neighbour in the same verify_batch runs 13 busy processes, each in a session of its own. The honest
    program (about half a CPU second here) passes beside it as it does alone: the neighbour's processes weigh as one
    (its test's session, or its cgroup), and its test ends at its CPU limit, all its processes counted."""
    layers = set(probe())
    if not _fair_share_here(layers):
        pytest.skip(
            "neither cgroup v2 cpu.max nor autogroup with seccomp here: a neighbour's share is bounded only by "
            "its CPU limit (docs/code.md)"
        )
    n = 4_000_000
    ref = json.dumps([{"input": f"{n}\n", "output": f"{sum(i * i % 7 for i in range(n))}\n"}] * 2)
    v = CodeVerifier(timeout=1.5, sample_timeout=20.0, memory_mb=256, workers=2, max_processes=16)
    alone = v.verify_batch([f"```python\n{HONEST}\n```"], [ref])[0]
    assert alone.score == 1.0, alone
    neighbour, honest = v.verify_batch(
        [f"```python\n{NEIGHBOUR}\n```", f"```python\n{HONEST}\n# beside\n```"], [ref] * 2
    )
    assert honest.score == 1.0, honest
    assert neighbour.reason == "timeout", neighbour
    assert {"cpu_time", "cpu_max"} & set(honest.metadata["isolation"])
