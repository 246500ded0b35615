"""The `code` verifier (xrpo/rewards/code.py): extraction, verdicts, and what a program prints or returns, end to
end (reference formats: test_code_formats.py; comparison rules: test_code_compare.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tracemalloc

import pytest

from xrpo.rewards import CodeVerifier, get_verifier
from xrpo.rewards.code import extract_code


def fence(code: str, tag: str = "python") -> str:
    return f"Here is my solution.\n```{tag}\n{code}\n```\nDone."


@pytest.fixture(scope="module")
def verifier():
    return CodeVerifier(timeout=2.0, sample_timeout=10.0, memory_mb=256, workers=2, max_output_mb=1, max_processes=8)


# ------------------------------------------------------------------ extraction


def test_extract_last_python_block():
    text = "```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```\nsample output:\n```\n2\n```"
    assert extract_code(text) == ("print(2)\n", "python")
    assert extract_code("```py\nx = 1\n```") == ("x = 1\n", "python")
    assert extract_code("```\nx = 1\n```") == ("x = 1\n", "untagged")


def test_extract_failures():
    assert extract_code("no code here") == (None, "no_fence")
    assert extract_code("```python\nprint(1)\n") == (None, "unclosed")  # truncated completion
    assert extract_code("```cpp\nint main(){}\n```") == (None, "language:cpp")
    assert extract_code("```python\n   \n```") == (None, "empty")


def test_a_truncated_last_block_falls_back_to_the_last_closed_one():
    assert extract_code("```python\nprint(1)\n```\n```python\nprint(2") == ("print(1)\n", "python")


# ------------------------------------------------------------------ malformed references in a batch


def test_malformed_reference_in_a_batch_names_its_index(verifier):
    good = json.dumps([{"input": "", "output": "1"}])
    with pytest.raises(ValueError, match=r"references\[1\]"):
        verifier.verify_batch([fence("print(1)")] * 2, [good, "[]"])


def test_reference_whose_prompt_is_not_python_names_its_index(verifier):
    good = json.dumps([{"input": "", "output": "1"}])
    bad = json.dumps(
        {
            "test": "def check(candidate):\n    assert candidate(1) == 1\n",
            "entry_point": "f",
            "prompt": "Write a function f that returns its argument.",
        }
    )
    with pytest.raises(ValueError, match=r"references\[1\]: SyntaxError: the reference's 'prompt' is not Python"):
        verifier.verify_batch([fence("print(1)")] * 2, [good, bad])


# ------------------------------------------------------------------ verdicts

ADD = json.dumps(
    [
        {"input": f"{a} {b}\n", "output": f"{a + b}\n", "testtype": "stdin"}
        for a, b in [(1, 2), (10, 20), (-5, 5), (7, 0)]
    ]
)


def test_correct_wrong_and_partial(verifier):
    comps = [
        fence("a, b = map(int, input().split())\nprint(a + b)"),
        fence("a, b = map(int, input().split())\nprint(a - b)"),
        fence("a, b = map(int, input().split())\nprint(a + b if a != 10 else 0)"),
    ]
    right, wrong, partial = verifier.verify_batch(comps, [ADD] * 3)
    assert (right.score, right.reason, right.metadata["tests"], right.metadata["fraction"]) == (1.0, None, "....", 1)
    assert wrong.score == 0.0 and wrong.reason == "wrong_answer" and wrong.metadata["failed_test"] == 0
    assert wrong.metadata["passed"] == 1  # 7 - 0 == 7 + 0
    assert (partial.score, partial.reason, partial.metadata["tests"]) == (0.0, "wrong_answer", ".W..")
    assert partial.metadata["failed_test"] == 1 and "got '0', expected '30'" in partial.metadata["detail"]
    assert partial.metadata["fraction"] == 0.75
    assert right.answer.startswith("code:") and right.answer != wrong.answer


def test_reasons(verifier):
    cases = {
        "no code at all": "no_code",
        fence("print(1", "python"): "syntax_error",
        fence("raise SystemExit('boom')"): "runtime_error",
        fence("while True:\n    pass"): "timeout",
        fence("x = bytearray(2 * 1024**3)"): "memory",
        fence("while True:\n    print('x' * 1000)"): "output_limit",
    }
    one = json.dumps([{"input": "1 2\n", "output": "3\n"}])
    results = verifier.verify_batch(list(cases), [one] * len(cases))
    assert [r.reason for r in results] == list(cases.values())
    assert all(r.score == 0.0 for r in results)
    assert results[0].answer is None and results[0].metadata["detail"] == "no_fence"
    assert "SyntaxError" in results[1].metadata["detail"]
    assert "boom" in results[2].metadata["detail"]


def test_functional_lcb_style(verifier):
    ref = json.dumps(
        {
            "tests": [
                {"input": "[2, 7, 11, 15]\n9", "output": "[0, 1]", "testtype": "functional"},
                {"input": "[3, 3]\n6", "output": "[0, 1]", "testtype": "functional"},
            ],
            "fn_name": "twoSum",
        }
    )
    good = fence(
        "class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
        "        for i, x in enumerate(nums):\n            if target - x in seen:\n"
        "                return (seen[target - x], i)\n            seen[x] = i\n"
    )
    bad = fence("class Solution:\n    def twoSum(self, nums, target):\n        return [0, 0]\n")
    missing = fence("def other(x):\n    return x\n")
    g, b, m = verifier.verify_batch([good, bad, missing], [ref] * 3)
    assert g.score == 1.0, g
    assert b.reason == "wrong_answer" and "expected [0, 1]" in b.metadata["detail"]
    assert m.reason == "runtime_error" and "no function 'twoSum'" in m.metadata["detail"]


def test_float_output_tolerance(verifier):
    ref = json.dumps([{"input": "", "output": "0.333333333\n"}])
    ok, bad = verifier.verify_batch([fence("print(1/3)"), fence("print(0.33)")], [ref, ref])
    assert ok.score == 1.0 and bad.reason == "wrong_answer"
    strict = CodeVerifier(compare="lines", workers=1, timeout=2, sample_timeout=10, memory_mb=256)
    assert strict.verify_batch([fence("print(1/3)")], [ref])[0].reason == "wrong_answer"


def test_humaneval_prompt_is_prepended_when_the_completion_is_a_body(verifier):
    ref = json.dumps(
        {
            "prompt": "def inc(x):\n",
            "test": "def check(candidate):\n    assert candidate(1) == 2\n",
            "entry_point": "inc",
        }
    )
    body, full, wrong = verifier.verify_batch(
        [fence("    return x + 1"), fence("def inc(x):\n    return x + 1"), fence("def inc(x):\n    return x")],
        [ref] * 3,
    )
    assert (body.score, full.score, wrong.score) == (1.0, 1.0, 0.0)
    assert wrong.reason == "runtime_error" and "AssertionError" in wrong.metadata["detail"]


def test_humaneval_prompt_comes_first_when_the_completion_restates_the_function(verifier):
    """HumanEval's harness runs prompt + completion whatever the completion is: a restated function still gets the
    prompt's imports and helpers (HumanEval/10, /32, /38 call one), the restatement replacing the prompt's."""
    prompt = (
        'import math\n\n\ndef helper(x):\n    return math.floor(x) * 2\n\n\ndef f(x):\n    """Twice the floor."""\n'
    )
    ref = json.dumps(
        {"prompt": prompt, "test": "def check(candidate):\n    assert candidate(2.5) == 4\n", "entry_point": "f"}
    )
    restated, wrong = verifier.verify_batch(
        [fence("def f(x):\n    return helper(x)"), fence("def f(x):\n    return helper(x) + 1")], [ref] * 2
    )
    assert (restated.score, wrong.score) == (1.0, 0.0), restated


def test_identical_programs_are_run_once(verifier):
    comp = fence("import time\nprint(sum(map(int, input().split())))")
    results = verifier.verify_batch([comp] * 6, [ADD] * 6)
    assert all(r.score == 1.0 for r in results)
    assert len({id(r) for r in results}) == 1


def test_sample_timeout_reason():
    v = CodeVerifier(timeout=1.0, sample_timeout=1.5, workers=1, memory_mb=256)
    ref = json.dumps([{"input": str(i), "output": "x"} for i in range(4)])
    r = v.verify_batch([fence("while True:\n    pass")], [ref])[0]
    assert r.reason == "timeout" and r.metadata["tests"].endswith("-")


def test_registry_and_arguments():
    v = get_verifier("code", timeout=3, workers=1)
    assert isinstance(v, CodeVerifier) and v.limits.timeout == 3 and v.workers == 1
    with pytest.raises(ValueError, match="compare"):
        CodeVerifier(compare="exact")
    with pytest.raises(ValueError, match="fields"):
        CodeVerifier(fields={"nope": "x"})
    with pytest.raises(ValueError, match="isolation"):
        CodeVerifier(isolation="off")
    with pytest.raises(ValueError, match="timeout"):
        CodeVerifier(timeout=-1)
    for bad in ("numpy", ["numpy.linalg"], [3]):
        with pytest.raises(ValueError, match="packages"):
            CodeVerifier(packages=bad)
    assert CodeVerifier(packages=[]).packages == () and CodeVerifier().packages == ("numpy",)


# ------------------------------------------------------------------ what a program prints or returns
# never raises out of the verifier, never passes by a tolerance it should not get, never costs the grader more
# than linear work or more than one test's output of memory.


# Adversarial outputs of 16 MiB (the default output cap, `max_output_mb=16`) and completions of 2 MiB: the grader's
# work on each must be linear. Run in a fresh interpreter under a hang guard, not a speed target: the linear grader
# takes well under a second per case, a grader built on backtracking regular expressions took hours on these (and held
# the GIL: no thread could have stopped them).
_LINEAR_PRELUDE = """
import json
from xrpo.rewards.code import CodeVerifier, extract_code
from xrpo.rewards.code_compare import compare_returned, compare_stdout
N = 16 * 2**20 - 8  # bytes a test may print
C = 2 * 2**20  # characters of a completion
"""
LINEAR = {
    "number tokens": """
        ones = "1" * N
        for tok in (ones + "x", "1." + ones + "x", "1e" + ones + "x", "+" + ones + "e", "." * N, ones):
            for want in ("3", "1.5"):
                for mode in ("tokens", "lines"):
                    compare_stdout(tok, want, mode=mode)
        compare_stdout(ones, ones[:-1] + "2")
        compare_stdout("1." + ones, "1." + ones[:-1] + "2", mode="lines")
        compare_stdout("1 " * (N // 2), "1 2", mode="lines")
        compare_stdout("1\\n" * (N // 2), "1\\n2\\n", mode="lines")
        compare_returned(b"[" * N, [1])
    """,
    "code fences": """
        for text in ("```" + "a" * C, "```python" + " " * C, "```" + " \\t" * (C // 2), "```" + "a" * C + "\\n",
                     "```python\\n" + "`" * C, " " * C + "```", "```\\n" * (C // 4), "\\n```a" * (C // 5)):
            extract_code(text)
    """,
    "entry point after blank lines": """
        ref = json.dumps({"test": "def check(candidate):\\n    assert candidate(2) == 4\\n",
                          "entry_point": "double", "prompt": "def double(x):\\n"})
        v = CodeVerifier(timeout=20, sample_timeout=40, workers=1)
        # a body (the prompt is prepended) after a long run of blank lines: the search for `def double(` fails
        for blank in ("\\n" * C, " \\n" * (C // 2)):
            body = blank + "    return 2 * x\\n"
            r = v.verify_batch(["```python\\n" + body + "```"], [ref])[0]
            assert r.score == 1.0, r
    """,
    "a program printing up to the output cap": """
        v = CodeVerifier(timeout=20, sample_timeout=60, workers=1)
        ref = json.dumps([{"input": "", "output": "3\\n"}, {"input": "", "output": "1.5\\n"}])
        for tok in ("'1' * N + 'x'", "'1.' + '1' * N + 'x'", "'1e' + '1' * N + 'x'"):
            r = v.verify_batch([f"```python\\nimport sys\\nN = {N}\\nsys.stdout.write({tok})\\n```"], [ref])[0]
            assert r.reason == "wrong_answer" and r.metadata["tests"] == "WW", r
    """,
}


@pytest.mark.parametrize("case", sorted(LINEAR))
def test_the_graders_work_is_linear_up_to_the_output_cap(case):
    code = _LINEAR_PRELUDE + textwrap.dedent(LINEAR[case])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize(
    "program, ref",
    [
        # an integer token past int()'s digit limit (4300): ValueError
        ("print('1' * 5000)", json.dumps([{"input": "", "output": "3"}])),
        ("print('1' * 5000)", json.dumps([{"input": "", "output": "1" * 10}])),
        # overflow to infinity on both sides
        ("print('1e99999')", json.dumps([{"input": "", "output": "1.5"}])),
        # a huge integer returned where a float is expected: OverflowError in the subtraction
        (
            "def f(x):\n    return 10**400",
            json.dumps({"tests": [{"input": "1", "output": "1.5", "testtype": "functional"}], "fn_name": "f"}),
        ),
        # deeply nested JSON written straight to the value channel: RecursionError in json.loads
        (
            "import os\ndef f(x):\n    os.write(3, b'[' * 200000 + b']' * 200000)\n    os._exit(0)",
            json.dumps({"tests": [{"input": "1", "output": "[1]", "testtype": "functional"}], "fn_name": "f"}),
        ),
        (
            "import os\ndef f(x):\n    os.write(3, b'1' * 5000)\n    os._exit(0)",
            json.dumps({"tests": [{"input": "1", "output": "1", "testtype": "functional"}], "fn_name": "f"}),
        ),
        (
            "import os\ndef f(x):\n    os.write(3, b'NaN')\n    os._exit(0)",
            json.dumps({"tests": [{"input": "1", "output": "1", "testtype": "functional"}], "fn_name": "f"}),
        ),
        (
            "import os\ndef f(x):\n    os.write(3, b'\\xff\\xfe')\n    os._exit(0)",
            json.dumps({"tests": [{"input": "1", "output": "1", "testtype": "functional"}], "fn_name": "f"}),
        ),
    ],
)
def test_nothing_a_program_prints_or_returns_raises_out_of_the_verifier(verifier, program, ref):
    r = verifier.verify_batch([fence(program)], [ref])[0]
    assert (r.score, r.reason) == (0.0, "wrong_answer"), r


def test_special_decimal_values_in_lcb_line_comparison():
    lines = CodeVerifier(compare="lines", workers=1, timeout=2, sample_timeout=10, memory_mb=256)
    ref = json.dumps([{"input": "", "output": "1\n"}, {"input": "", "output": "NaN\n"}])
    r = lines.verify_batch([fence("print('sNaN')")], [ref])[0]
    assert (r.score, r.reason, r.metadata["tests"]) == (0.0, "wrong_answer", "WW"), r


def test_forged_passes_by_a_tolerance_on_integers(verifier):
    """An answer near 1e9 off by hundreds passed as within 1e-6 relative of the expected integer."""
    stdin = json.dumps([{"input": "", "output": "1000000000\n"}])
    call = json.dumps({"tests": [{"input": "1", "output": "1000000000", "testtype": "functional"}], "fn_name": "f"})
    programs = [
        (fence("print('1000000500.0')"), stdin),
        (fence("print(1e9 - 0.0001)"), stdin),
        (fence("def f(x):\n    return 1000000500.0"), call),
        (fence("def f(x):\n    return 999999999.9999"), call),
    ]
    for r in verifier.verify_batch([p for p, _ in programs], [ref for _, ref in programs]):
        assert (r.score, r.reason) == (0.0, "wrong_answer"), r
    # the exact value is still right, as an integer or (exactly) as a float
    right = [
        (fence("print(10**9)"), stdin),
        (fence("print('1000000000.000')"), stdin),
        (fence("def f(x):\n    return 10**9"), call),
        (fence("def f(x):\n    return 1e9"), call),
    ]
    assert [r.score for r in verifier.verify_batch([p for p, _ in right], [ref for _, ref in right])] == [1.0] * 4


def test_memory_error_in_the_stderr_of_a_correct_program_is_not_a_memory_failure(verifier):
    noise = (
        "import sys\nprint('MemoryError', file=sys.stderr)\nprint('OSError: Cannot allocate memory', file=sys.stderr)\n"
    )
    call = json.dumps({"tests": [{"input": "3", "output": "6", "testtype": "functional"}], "fn_name": "f"})
    check = json.dumps({"test": "def check(candidate):\n    assert candidate(3) == 6\n", "entry_point": "f"})
    f = "def f(x):\n    print('MemoryError', file=sys.stderr)\n    return 2 * x\n"
    results = verifier.verify_batch(
        [fence(noise + "a, b = map(int, input().split())\nprint(a + b)"), fence(noise + f), fence(noise + f)],
        [ADD, call, check],
    )
    assert [(r.score, r.reason) for r in results] == [(1.0, None)] * 3, results
    # a real MemoryError is still one
    assert verifier.verify_batch([fence("x = bytearray(2 * 1024**3)")], [ADD])[0].reason == "memory"


def test_the_grader_keeps_one_tests_output_at_a_time():
    """Every test of a program printing up to the cap: the caller held every test's stdout (several copies of it)
    until the program ended; now each is compared as it arrives and dropped."""
    cap, n = 2**20, 40
    v = CodeVerifier(timeout=10, sample_timeout=60, memory_mb=256, workers=1, max_output_mb=1)
    ref = json.dumps([{"input": "", "output": "1 " * 10 + "3\n"}] * n)
    program = fence(f"import sys\nsys.stdout.write('1 ' * ({cap} // 2 - 8))")
    v.verify_batch([fence("print(3)")], [ref])  # what the first run of a process allocates once (the boot's code)
    tracemalloc.start()
    try:
        r = v.verify_batch([program], [ref])[0]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.reason == "wrong_answer" and r.metadata["tests"] == "W" * n, r
    assert peak < 4 * cap, f"the grader held {peak / 2**20:.1f} MiB for {n} tests of at most 1 MiB each"
