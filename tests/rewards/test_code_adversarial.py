"""The `code` verifier against hostile programs, end to end: every attack scores 0 with its reason recorded, and the
machine, the caller and a bystander process are unharmed (xrpo/rewards/code.py over xrpo/sandbox/programs.py).

tests/sandbox/test_programs.py checks the sandbox's layers one by one; here each attack goes through
`CodeVerifier.verify_batch`, the path training and evaluation take.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import uuid

import pytest

from tests.conftest import MARK, assert_nothing_left_running, world_readable_file
from xrpo.rewards import CodeVerifier, raise_reference_errors
from xrpo.rewards.code_formats import check_prelude, check_undefined_names
from xrpo.sandbox import probe

ADD = json.dumps([{"input": "1 2\n", "output": "3\n"}, {"input": "40 2\n", "output": "42\n"}])
CHECK = json.dumps(
    {
        "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(5) == 10\n",
        "entry_point": "double",
        "prompt": "def double(x):\n",
    }
)


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.fixture(scope="module")
def verifier():
    return CodeVerifier(timeout=1.5, sample_timeout=8.0, memory_mb=256, workers=2, max_output_mb=1, max_processes=8)


@pytest.fixture(scope="module")
def layers():
    return set(probe())


@pytest.fixture
def bystander():
    """A process of the caller's that no program may touch."""
    p = subprocess.Popen(["sleep", "60"])
    yield p
    alive = p.poll() is None
    p.kill()
    p.wait()
    assert alive, "the bystander process was killed"


@pytest.fixture(autouse=True)
def machine_unharmed():
    yield
    assert_nothing_left_running()
    assert subprocess.run(["true"]).returncode == 0  # the machine still forks


def grade(verifier, program: str, ref: str = ADD):
    r = verifier.verify_batch([fence(program)], [ref])[0]
    assert r.score == 0.0, r
    return r


def test_infinite_loop_and_sleep(verifier):
    for program in ("while True:\n    pass", "import time\ntime.sleep(1000)"):
        r = grade(verifier, program)
        assert r.reason == "timeout" and r.metadata["tests"][0] == "T", r


def test_fork_bomb(verifier):
    r = grade(verifier, "import os\nwhile True:\n    os.fork()")
    assert r.reason in ("runtime_error", "timeout"), r  # fork fails at max_processes, or the bomb runs out the clock


def test_memory_bomb(verifier):
    r = grade(verifier, "a = []\nwhile True:\n    a.append(' ' * 10**7)")
    assert r.reason == "memory", r


def test_printing_a_gigabyte(verifier):
    r = grade(verifier, "import sys\nb = 'x' * 65536\nfor _ in range(16384):\n    sys.stdout.write(b)")
    assert r.reason == "output_limit", r


def test_reading_the_expected_outputs_from_a_file_outside(verifier, layers, tmp_path):
    """A program that prints the answers it finds on disk would score 1.0 if it could read them."""
    if "rootfs" not in layers:
        pytest.skip("no program root file system here: world-readable files stay readable (documented)")
    answers = world_readable_file(tmp_path / "answers.txt", "3\n")
    one = json.dumps([{"input": "1 2\n", "output": "3\n"}])
    r = grade(verifier, f"print(open({str(answers)!r}).read())", one)
    assert r.reason == "runtime_error" and "FileNotFoundError" in r.metadata["detail"], r


def test_deleting_and_writing_files_outside(verifier, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    escape = f"/tmp/xrpo-escape-{uuid.uuid4().hex}"
    for program in (
        f"import os\nos.remove({str(victim)!r})",
        f"open({str(victim)!r}, 'w').write('gone')",
        f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
        f"open({escape!r}, 'w').write('x')",
    ):
        r = grade(verifier, program)
        assert r.reason == "runtime_error" and "Error" in r.metadata["detail"], (program, r)
    assert victim.read_text() == "keep" and not os.path.exists(escape)


def test_opening_a_socket(verifier, layers):
    if "netns" not in layers:
        pytest.skip("no network namespace on this machine")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        port = server.getsockname()[1]
        r = grade(verifier, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
    finally:
        server.close()
    # refused by seccomp (no sockets at all), or with a network namespace but no seccomp filter: nothing to reach
    assert r.reason == "runtime_error" and any(
        why in r.metadata["detail"] for why in ("Operation not permitted", "Connection", "unreachable")
    ), r


def test_killing_the_caller_and_a_bystander(verifier, layers, bystander):
    if not ({"uid", "pidns"} & layers):
        pytest.skip("as the caller's own user without a PID namespace the program can signal the caller (documented)")
    for target in (os.getpid(), os.getppid(), bystander.pid, -1):
        r = grade(verifier, f"import os, signal\nos.kill({target}, signal.SIGKILL)\nprint(3)\nprint(42)")
        # refused (another uid / PID namespace) -> the exception fails the test; kill(-1) inside the sandbox only
        # reaches the sandbox's own processes, the program itself included
        assert r.reason == "runtime_error", (target, r)
    assert bystander.poll() is None


def test_background_processes_are_killed(verifier):
    r = grade(verifier, f"import subprocess\nsubprocess.Popen(['sleep', '{MARK}'], start_new_session=True)\nprint(0)")
    assert r.reason == "wrong_answer", r
    # machine_unharmed checks that the sleep is gone


def test_very_large_input(verifier):
    big = " ".join(["7"] * 3_000_000)  # 6 MB on stdin
    ref = json.dumps([{"input": big, "output": f"{7 * 3_000_000}\n"}])
    v = CodeVerifier(timeout=20.0, sample_timeout=40.0, memory_mb=1024, workers=1)
    good, bad = v.verify_batch(
        [
            fence("import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))"),
            fence("import sys\nsys.stdin.read()\nprint(0)"),
        ],
        [ref, ref],
    )
    assert good.score == 1.0, good
    assert bad.score == 0.0 and bad.reason == "wrong_answer"


def test_syntax_error(verifier):
    r = grade(verifier, "def f(:\n    pass")
    assert r.reason == "syntax_error" and "SyntaxError" in r.metadata["detail"]


@pytest.mark.parametrize(
    "program",
    [
        "import os\ndef double(x):\n    os.write(3, b'pass')\n    os._exit(0)",
        "class A:\n    def __eq__(self, o):\n        return True\ndef double(x):\n    return A()",
        "import sys\ndef double(x):\n    sys.exit(0)",
        "import builtins\nbuiltins.AssertionError = type('N', (Exception,), {})\ndef double(x):\n    return 0",
    ],
)
def test_a_humaneval_verdict_cannot_be_forged(verifier, program):
    r = grade(verifier, program, CHECK)
    assert r.reason == "runtime_error" and r.metadata["detail"], r
    assert verifier.verify_batch([fence("def double(x):\n    return 2 * x")], [CHECK])[0].score == 1.0


# ------------------------------------------------------------------ references checked when a dataset is loaded


class P:
    def __init__(self, id, answer):
        self.id, self.answer = id, answer


def test_reference_errors_name_the_row_and_problem(verifier):
    refs = [
        ADD,
        "not json at all",
        CHECK,
        json.dumps({"test": "def check(c):\n    assert helper(c(1))\n", "entry_point": "f"}),
        json.dumps({"test": "def check(c):\n    assert c(1) ==\n", "entry_point": "f"}),
    ]
    errors = verifier.reference_errors(refs)
    assert [i for i, _ in errors] == [1, 3, 4]
    assert "helper" in errors[1][1] and "prompt" in errors[1][1]
    assert errors[2][1].startswith("SyntaxError")
    with pytest.raises(ValueError) as e:
        raise_reference_errors(verifier, [P(f"p{i}", r) for i, r in enumerate(refs)], "data.train (x.jsonl)")
    msg = str(e.value)
    assert msg.startswith("data.train (x.jsonl): 3 of 5 reference answers cannot be graded by the 'code' verifier")
    assert "problem 'p1' (row 1)" in msg and "problem 'p3' (row 3)" in msg and "problem 'p4' (row 4)" in msg


def test_check_undefined_names():
    # HumanEval/32's shape: the check calls the prompt's helper
    check = "import math\ndef check(candidate):\n    assert math.fabs(poly([1], candidate([1]))) < 1e-6\n"
    assert check_undefined_names(check) == ["poly"]
    prompt = "def poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n"  # ends in a bare header, as HumanEval's
    assert check_undefined_names(check, check_prelude(prompt)) == []
    # names bound at the check's top level, builtins and parameters are defined
    assert check_undefined_names("K = 3\ndef check(c):\n    assert len(c(K)) == abs(-1)\n") == []
    with pytest.raises(SyntaxError):
        check_undefined_names("def check(c):\n    assert (\n")


def test_prompt_prelude_is_derived_once_when_the_reference_is_parsed(verifier):
    from xrpo.rewards.code_formats import parse_tests

    spec = parse_tests(CHECK)
    assert spec.prelude == "def double(x):\n    pass\n"  # the bare header gets a body, ready for the checker
    bad = json.dumps({"test": "def check(c):\n    assert c(1) == 2\n", "entry_point": "f", "prompt": "def f(:\n"})
    with pytest.raises(SyntaxError, match="the reference's 'prompt' is not Python code"):
        parse_tests(bad)
    assert verifier.reference_errors([bad]) == [
        (0, "SyntaxError: the reference's 'prompt' is not Python code (nor a function header)")
    ]


# ------------------------------------------------------------------ control flow of the check, memory the address-
# space limit does not count, kernel keyrings

STOP_ITERATION_CHECKS = {
    # a StopIteration raised by the candidate inside map() reads as "no more items" to the consumer
    "all(map)": "def check(candidate):\n    assert all(map(lambda x: candidate(x) == 2 * x, [1, 2, 3]))\n",
    "sum(map)": "def check(candidate):\n    assert sum(map(lambda x: candidate(x) - 2 * x, [1, 2, 3])) == 0\n",
    "next(default)": "def check(candidate):\n"
    "    assert next(filter(lambda x: candidate(x) != 2 * x, [1, 2, 3]), None) is None\n",
    "iter(callable, sentinel)": "def check(candidate):\n    for got in iter(lambda: candidate(1), None):\n"
    "        assert got == 2\n        break\n",
    "zip": "def check(candidate):\n    for x, y in zip([1, 2, 3], map(candidate, [1, 2, 3])):\n"
    "        assert y == 2 * x\n",
    "list comprehension": "def check(candidate):\n    assert not [y for y in map(candidate, [1, 2, 3]) if y % 2]\n",
}


@pytest.mark.parametrize("name", sorted(STOP_ITERATION_CHECKS))
def test_a_candidates_exception_cannot_steer_the_check(verifier, name):
    ref = json.dumps({"test": STOP_ITERATION_CHECKS[name], "entry_point": "double"})
    right = verifier.verify_batch([fence("def double(x):\n    return 2 * x")], [ref])[0]
    assert right.score == 1.0, right
    for program in (
        "def double(x):\n    raise StopIteration",
        "def double(x):\n    raise StopIteration(2 * x)",
        "def double(x):\n    if x == 1:\n        raise StopIteration\n    return 2 * x",
        "def double(x):\n    raise StopAsyncIteration",
        # the exception's class name, as the program's process reads it, spoofed by a metaclass
        "class M(type):\n    __name__ = property(lambda cls: 'ValueError')\n"
        "class E(StopIteration, metaclass=M):\n    pass\ndef double(x):\n    raise E",
        "class M(type):\n    __name__ = property(lambda cls: 'StopIteration')\n"
        "class E(Exception, metaclass=M):\n    pass\ndef double(x):\n    raise E",
    ):
        r = grade(verifier, program, ref)
        # the program's own traceback names the spoofed class by its module path (solution.E)
        detail = r.metadata["detail"]
        assert r.reason == "runtime_error" and ("Stop" in detail or "solution.E" in detail), (program, r)


# Each program tries to hold three times its memory limit in memory the address-space limit does not count, and
# prints "held" when it does: the reference expects exactly that, so an attack that works scores 1.0.
MEMORY_MB = 128
MEMORY_HOGS = {
    "memfd": """
        import os
        fds = []
        for _ in range(TARGET // 32):
            fd = os.memfd_create("hog")
            for _ in range(32):
                os.write(fd, b"x" * 2**20)
            fds.append(fd)
    """,
    "memfd via ftruncate and a mapping undone": """
        import mmap, os
        fds = []
        for _ in range(TARGET // 32):
            fd = os.memfd_create("hog")
            os.ftruncate(fd, 32 * 2**20)
            m = mmap.mmap(fd, 32 * 2**20)
            for i in range(0, 32 * 2**20, 4096):
                m[i] = 1
            m.close()
            fds.append(fd)
    """,
    "System V shared memory": """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = ctypes.c_void_p
        for _ in range(TARGET // 32):
            sid = libc.shmget(0, 32 * 2**20, 0o1600)
            if sid < 0:
                raise OSError(ctypes.get_errno(), "shmget")
            addr = libc.shmat(sid, None, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), "shmat")
            ctypes.memset(addr, 1, 32 * 2**20)
            libc.shmdt(ctypes.c_void_p(addr))
    """,
    "System V message queues": """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        msg = ctypes.create_string_buffer(8 + 8000)
        ctypes.c_long.from_buffer(msg).value = 1
        held = 0
        while held < TARGET * 2**20:
            q = libc.msgget(0, 0o1600)
            if q < 0:
                raise OSError(ctypes.get_errno(), "msgget")
            while libc.msgsnd(q, msg, 8000, 0o4000) == 0:
                held += 8000
    """,
    "socket buffers": """
        import socket
        pairs, held = [], 0
        while held < TARGET * 2**20:
            a, b = socket.socketpair()
            a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)  # the kernel caps it at net.core.wmem_max
            a.setblocking(False)
            try:
                while True:
                    held += a.send(b"x" * 65536)
            except BlockingIOError:
                pass
            pairs.append((a, b))
    """,
    "POSIX shared memory": """
        from multiprocessing import shared_memory
        s = shared_memory.SharedMemory(create=True, size=TARGET * 2**20)
        s.buf[::4096] = b"x" * len(s.buf[::4096])
    """,
}


@pytest.mark.parametrize("name", sorted(MEMORY_HOGS))
def test_memory_outside_the_address_space_is_limited(name):
    v = CodeVerifier(timeout=10.0, sample_timeout=20.0, memory_mb=MEMORY_MB, workers=1, max_processes=8)
    program = f"TARGET = {3 * MEMORY_MB}\n" + textwrap.dedent(MEMORY_HOGS[name]) + "print('held')\n"
    r = v.verify_batch([fence(program)], [json.dumps([{"input": "", "output": "held"}])])[0]
    assert r.score == 0.0 and r.reason in ("runtime_error", "memory"), (name, r)


def test_system_v_segments_do_not_outlive_their_test(verifier):
    """Test 0 creates a segment under a fixed key; test 1 finds it by that key (the attack passes if it can)."""
    program = """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if input() == "0":
            sid = libc.shmget(0x58525031, 4096, 0o1600)
            print("created" if sid >= 0 else "failed")
        else:
            print("found" if libc.shmget(0x58525031, 0, 0) >= 0 else "gone")
    """
    ref = json.dumps([{"input": "0", "output": "created"}, {"input": "1", "output": "found"}])
    r = grade(verifier, textwrap.dedent(program), ref)
    assert r.metadata["tests"][1] != ".", r


_KEYS = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ADD_KEY, REQUEST_KEY, KEYCTL = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219),
                                "riscv64": (217, 218, 219)}[os.uname().machine]
SESSION, USER = -3, -4  # KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING
def add_key(desc, payload, ring):
    return libc.syscall(ADD_KEY, b"user", desc, payload, ctypes.c_size_t(len(payload)), ctypes.c_long(ring))
def read_key(desc, ring):
    kid = libc.syscall(KEYCTL, 10, ctypes.c_long(ring), b"user", desc, 0)  # KEYCTL_SEARCH
    if kid < 0:
        return None
    buf = ctypes.create_string_buffer(4096)
    n = libc.syscall(KEYCTL, 11, ctypes.c_long(kid), buf, 4096)  # KEYCTL_READ
    return buf.raw[:n].decode(errors="replace") if n >= 0 else "unreadable"
"""


@pytest.mark.skipif(
    os.uname().machine not in ("x86_64", "aarch64", "riscv64") or not os.path.exists("/proc/keys"),
    reason="kernel keyrings on a machine whose syscall numbers this test knows",
)
def test_kernel_keyrings_are_out_of_reach(tmp_path):
    """A caller with a session keyring (services and PAM logins have one) holding a secret; one program tries to
    read it, to plant a key there and in its uid's user keyring; the next program looks for the planted key."""
    token = uuid.uuid4().hex
    caller = tmp_path / "caller.py"
    caller.write_text(
        _KEYS
        + textwrap.dedent(f"""
        import json, textwrap
        from xrpo.sandbox import Limits, run_program
        assert libc.syscall(KEYCTL, 1, b"xrpo-test-session") >= 0, "KEYCTL_JOIN_SESSION_KEYRING"
        assert add_key(b"xrpo-secret", b"{token}", SESSION) >= 0
        L = Limits(timeout=5, sample_timeout=20, memory_mb=256)
        keys = {_KEYS!r}
        first = keys + textwrap.dedent('''
            import json
            print(json.dumps({{"read": [read_key(b"xrpo-secret", r) for r in (SESSION, USER, -5, -2, -1)],
                              "request": libc.syscall(REQUEST_KEY, b"user", b"xrpo-secret", None, 0),
                              "planted": [add_key(b"xrpo-planted-{token}", b"x", r) for r in (SESSION, USER)],
                              "uid": os.getuid()}}))
        ''')
        second = keys + textwrap.dedent('''
            import json
            print(json.dumps({{"found": [read_key(b"xrpo-planted-{token}", r) for r in (SESSION, USER, -5)],
                              "uid": os.getuid()}}))
        ''')
        a = run_program(first, "stdin", [""], limits=L)
        b = run_program(second, "stdin", [""], limits=L)
        print(json.dumps({{"a": a.tests[0].stdout.decode(), "a_err": a.tests[0].stderr,
                          "b": b.tests[0].stdout.decode(), "b_err": b.tests[0].stderr,
                          "caller_sees_planted": read_key(b"xrpo-planted-{token}", SESSION),
                          "caller_secret": read_key(b"xrpo-secret", SESSION)}}))
    """)
    )
    proc = subprocess.run([sys.executable, str(caller)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["caller_secret"] == token  # the caller really had the secret in its session keyring
    a, b = json.loads(out["a"] or "null"), json.loads(out["b"] or "null")
    assert a is not None and b is not None, out
    assert token not in out["a"] and a["read"] == [None] * 5 and a["request"] < 0, a
    assert out["caller_sees_planted"] is None
    assert b["found"] == [None] * 3, (a, b)  # nothing a program stored survives to the next one on its uid
