"""The `code` verifier (xrpo/rewards/code.py): extraction, reference formats, comparison rules, verdicts."""

from __future__ import annotations

import base64
import json
import pickle
import zlib

import pytest

from xrpo.rewards import CodeVerifier, get_verifier
from xrpo.rewards.code import compare_stdout, compare_values, extract_code, parse_tests


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


# ------------------------------------------------------------------ reference formats


def test_lcb_stdin_list():
    ref = json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
                      {"input": "2 2\n", "output": "4\n", "testtype": "stdin"}])
    spec = parse_tests(ref)
    assert spec.mode == "stdin" and spec.inputs == ["1 2\n", "2 2\n"] and spec.expected == ["3\n", "4\n"]


def test_lcb_functional_with_metadata_and_starter_code():
    tests = json.dumps([{"input": "[1, 2]\n3", "output": "[4, 5]", "testtype": "functional"}])
    row = {"public_test_cases": tests, "metadata": json.dumps({"func_name": "addAll"})}
    spec = parse_tests(json.dumps(row))
    assert (spec.mode, spec.fn_name, spec.inputs, spec.expected) == ("call", "addAll", [[[1, 2], 3]], [[4, 5]])
    row = {"tests": tests, "starter_code": "class Solution:\n    def addAll(self, nums: List[int], k: int):\n"}
    assert parse_tests(json.dumps(row)).fn_name == "addAll"


def test_lcb_private_tests_compressed():
    private = [{"input": "5\n", "output": "25\n", "testtype": "stdin"}]
    packed = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(private)))).decode()
    row = {"public_test_cases": json.dumps([{"input": "2\n", "output": "4\n", "testtype": "stdin"}]),
           "private_test_cases": packed}
    spec = parse_tests(json.dumps(row))
    assert spec.inputs == ["2\n", "5\n"] and spec.expected == ["4\n", "25\n"]


def test_compressed_tests_refuse_anything_but_strings():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    packed = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    with pytest.raises(ValueError, match="private_test_cases"):
        parse_tests(json.dumps({"private_test_cases": packed}))


def test_deepcoder_primeintellect_and_taco():
    prime = [{"input": [[1, 2, 3]], "output": [6], "type": "function_call", "fn_name": "total"}]
    spec = parse_tests(json.dumps({"tests": json.dumps(prime)}))
    assert (spec.mode, spec.fn_name, spec.inputs, spec.expected) == ("call", "total", [[[1, 2, 3]]], [[6]])
    taco = {"inputs": ["1\n", ["2", "3"]], "outputs": ["1\n", "5\n"]}
    spec = parse_tests(json.dumps(taco))
    assert spec.mode == "stdin" and spec.inputs == ["1\n", "2\n3"]
    taco_fn = {"inputs": [[1, 2]], "outputs": [[3]], "fn_name": "add"}
    spec = parse_tests(json.dumps(taco_fn))
    assert (spec.mode, spec.inputs, spec.expected) == ("call", [[1, 2]], [[3]])


def test_humaneval_reference():
    spec = parse_tests(json.dumps({"test": "def check(candidate):\n    assert candidate(1) == 2\n",
                                   "entry_point": "inc", "prompt": "def inc(x):\n"}))
    assert (spec.mode, spec.entry_point, spec.prompt) == ("check", "inc", "def inc(x):\n")


def test_column_mapping():
    row = {"cases": [{"stdin": "1\n", "want": "1\n"}]}
    spec = parse_tests(json.dumps(row), {"tests": "cases", "input": "stdin", "output": "want"})
    assert spec.inputs == ["1\n"] and spec.expected == ["1\n"]
    row = {"meta": {"entry": "f"}, "tests": [{"input": "1", "output": "2", "testtype": "functional"}]}
    assert parse_tests(json.dumps(row), {"fn_name": "meta.entry"}).fn_name == "f"
    with pytest.raises(ValueError, match="unknown key 'inputs'"):
        parse_tests("[]", {"inputs": "x"})


@pytest.mark.parametrize("ref, message", [
    ("not json", "not JSON"),
    ("[]", "no tests"),
    ("42", "expected a JSON list of tests or an object"),
    ('{"foo": 1}', "found no tests"),
    ('[{"input": "1"}]', "lacks 'input' or 'output'"),
    ('[{"input": "1", "output": "1", "testtype": "weird"}]', "type 'weird'"),
    ('[{"input": "1", "output": "1", "testtype": "functional"}]', "need a function name"),
    ('[{"input": "1", "output": "1"}, {"input": "1", "output": "1", "testtype": "functional", "fn_name": "f"}]',
     "mixes"),
    ('{"test": "def check(c): pass"}', "entry_point"),
    ('{"inputs": ["1"], "outputs": []}', "1 inputs but 0 outputs"),
])
def test_malformed_references_raise(ref, message):
    with pytest.raises(ValueError, match=message):
        parse_tests(ref)


def test_malformed_reference_in_a_batch_names_its_index(verifier):
    good = json.dumps([{"input": "", "output": "1"}])
    with pytest.raises(ValueError, match=r"references\[1\]"):
        verifier.verify_batch([fence("print(1)")] * 2, [good, "[]"])


def test_reference_whose_prompt_is_not_python_names_its_index(verifier):
    good = json.dumps([{"input": "", "output": "1"}])
    bad = json.dumps({"test": "def check(candidate):\n    assert candidate(1) == 1\n", "entry_point": "f",
                      "prompt": "Write a function f that returns its argument."})
    with pytest.raises(ValueError, match=r"references\[1\]: SyntaxError: the reference's 'prompt' is not Python"):
        verifier.verify_batch([fence("print(1)")] * 2, [good, bad])


# ------------------------------------------------------------------ comparison


@pytest.mark.parametrize("out, want, ok", [
    ("3\n", "3", True),
    ("1 2\n3", "1\n2 3\n", True),             # tokens ignore line structure
    ("1 2", "1 2 3", False),
    ("0.3333333", "0.333333333", True),        # |diff| = 3.3e-8 <= 1e-6
    ("0.334", "0.333", False),                 # |diff| = 1e-3
    ("1000000.5", "1000000.0", True),          # relative: 0.5 <= 1e-6 * 1e6 (= 1)
    ("1000002.5", "1000000.0", False),         # relative: 2.5 > 1
    ("1.0", "1", True),
    ("12345678901234567890", "12345678901234567891", False),  # integers compare exactly
    ("YES", "yes", False),
    ("nan", "nan", True),                      # equal strings
    ("inf", "1e999", False),
])
def test_compare_tokens(out, want, ok):
    assert compare_stdout(out, want)[0] is ok


def test_compare_lines_is_lcb_exact():
    assert compare_stdout("1 2\n3\n", "1 2\n3", mode="lines")[0]
    assert not compare_stdout("1 2 3", "1 2\n3", mode="lines")[0]
    assert compare_stdout("1.50 2", "1.5 2.0", mode="lines")[0]        # equal decimals
    assert not compare_stdout("0.3333333", "0.333333333", mode="lines")[0]  # no tolerance in LCB


def test_compare_values():
    assert compare_values([1, 2], [1, 2])
    assert compare_values(0.1 + 0.2, 0.3)
    assert not compare_values(0.31, 0.3)
    assert compare_values(6, [6])           # APPS wraps expected values in a list
    assert compare_values([6], [[6]])         # [[6]] unwraps to [6]
    assert not compare_values(6, [6], unwrap=False)
    assert not compare_values({"a": 1}, {"a": 2})
    assert compare_values({"a": [1.0, 2]}, {"a": [1, 2]})
    assert not compare_values("1", 1)


# ------------------------------------------------------------------ verdicts

ADD = json.dumps([{"input": f"{a} {b}\n", "output": f"{a + b}\n", "testtype": "stdin"} for a, b in
                  [(1, 2), (10, 20), (-5, 5), (7, 0)]])


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
    ref = json.dumps({"tests": [{"input": "[2, 7, 11, 15]\n9", "output": "[0, 1]", "testtype": "functional"},
                                {"input": "[3, 3]\n6", "output": "[0, 1]", "testtype": "functional"}],
                      "fn_name": "twoSum"})
    good = fence("class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
                 "        for i, x in enumerate(nums):\n            if target - x in seen:\n"
                 "                return (seen[target - x], i)\n            seen[x] = i\n")
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
    ref = json.dumps({"prompt": "def inc(x):\n", "test": "def check(candidate):\n    assert candidate(1) == 2\n",
                      "entry_point": "inc"})
    body, full, wrong = verifier.verify_batch(
        [fence("    return x + 1"), fence("def inc(x):\n    return x + 1"), fence("def inc(x):\n    return x")],
        [ref] * 3)
    assert (body.score, full.score, wrong.score) == (1.0, 1.0, 0.0)
    assert wrong.reason == "runtime_error" and "AssertionError" in wrong.metadata["detail"]


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
