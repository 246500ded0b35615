"""The `code` verifier against hostile programs, end to end: every attack scores 0 with its reason recorded, and the
machine, the caller and a bystander process are unharmed (xrpo/rewards/code.py over xrpo/rewards/sandbox.py).

tests/rewards/test_sandbox.py checks the sandbox's layers one by one; here each attack goes through
`CodeVerifier.verify_batch`, the path training and evaluation take.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid

import pytest

from xrpo.rewards import CodeVerifier, raise_reference_errors
from xrpo.rewards.code import check_prelude, check_undefined_names
from xrpo.rewards.sandbox import probe

from .test_sandbox import MARK, assert_nothing_left_running, world_readable_file

ADD = json.dumps([{"input": "1 2\n", "output": "3\n"}, {"input": "40 2\n", "output": "42\n"}])
CHECK = json.dumps({"test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(5) == 10\n",
                    "entry_point": "double", "prompt": "def double(x):\n"})


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.fixture(scope="module")
def verifier():
    return CodeVerifier(timeout=1.5, sample_timeout=8.0, memory_mb=256, workers=2, max_output_mb=1,
                        max_processes=8)


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
    for program in (f"import os\nos.remove({str(victim)!r})", f"open({str(victim)!r}, 'w').write('gone')",
                    f"import shutil\nshutil.rmtree({str(tmp_path)!r})", f"open({escape!r}, 'w').write('x')"):
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
    assert r.reason == "runtime_error" and ("Connection" in r.metadata["detail"] or "unreachable" in
                                             r.metadata["detail"]), r


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
    good, bad = v.verify_batch([fence("import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))"),
                                fence("import sys\nsys.stdin.read()\nprint(0)")], [ref, ref])
    assert good.score == 1.0, good
    assert bad.score == 0.0 and bad.reason == "wrong_answer"


def test_syntax_error(verifier):
    r = grade(verifier, "def f(:\n    pass")
    assert r.reason == "syntax_error" and "SyntaxError" in r.metadata["detail"]


@pytest.mark.parametrize("program", [
    "import os\ndef double(x):\n    os.write(3, b'pass')\n    os._exit(0)",
    "class A:\n    def __eq__(self, o):\n        return True\ndef double(x):\n    return A()",
    "import sys\ndef double(x):\n    sys.exit(0)",
    "import builtins\nbuiltins.AssertionError = type('N', (Exception,), {})\ndef double(x):\n    return 0",
])
def test_a_humaneval_verdict_cannot_be_forged(verifier, program):
    r = grade(verifier, program, CHECK)
    assert r.reason == "runtime_error" and r.metadata["detail"], r
    assert verifier.verify_batch([fence("def double(x):\n    return 2 * x")], [CHECK])[0].score == 1.0


# ------------------------------------------------------------------ references checked when a dataset is loaded


class P:
    def __init__(self, id, answer):
        self.id, self.answer = id, answer


def test_reference_errors_name_the_row_and_problem(verifier):
    refs = [ADD, "not json at all", CHECK, json.dumps({"test": "def check(c):\n    assert helper(c(1))\n",
                                                         "entry_point": "f"}),
            json.dumps({"test": "def check(c):\n    assert c(1) ==\n", "entry_point": "f"})]
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
    from xrpo.rewards.code import parse_tests

    spec = parse_tests(CHECK)
    assert spec.prelude == "def double(x):\n    pass\n"  # the bare header gets a body, ready for the checker
    bad = json.dumps({"test": "def check(c):\n    assert c(1) == 2\n", "entry_point": "f", "prompt": "def f(:\n"})
    with pytest.raises(SyntaxError, match="the reference's 'prompt' is not Python code"):
        parse_tests(bad)
    assert verifier.reference_errors([bad]) == [
        (0, "SyntaxError: the reference's 'prompt' is not Python code (nor a function header)")]


# ------------------------------------------------------------------ issue 17: control flow of the check, memory the
# address-space limit does not count, kernel keyrings

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
    for program in ("def double(x):\n    raise StopIteration",
                    "def double(x):\n    raise StopIteration(2 * x)",
                    "def double(x):\n    if x == 1:\n        raise StopIteration\n    return 2 * x",
                    "def double(x):\n    raise StopAsyncIteration"):
        r = grade(verifier, program, ref)
        assert r.reason == "runtime_error" and "Stop" in r.metadata["detail"], (program, r)
