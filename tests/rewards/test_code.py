"""The `code` verifier (xrpo/rewards/code.py): extraction, reference formats, comparison rules, verdicts."""

from __future__ import annotations

import base64
import json
import pickle
import subprocess
import sys
import textwrap
import tracemalloc
import zlib
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xrpo.rewards import CodeVerifier, get_verifier
from xrpo.rewards.code import compare_returned, compare_stdout, compare_values, extract_code, parse_tests


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
    ref = json.dumps(
        [
            {"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
            {"input": "2 2\n", "output": "4\n", "testtype": "stdin"},
        ]
    )
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
    row = {
        "public_test_cases": json.dumps([{"input": "2\n", "output": "4\n", "testtype": "stdin"}]),
        "private_test_cases": packed,
    }
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
    spec = parse_tests(
        json.dumps(
            {
                "test": "def check(candidate):\n    assert candidate(1) == 2\n",
                "entry_point": "inc",
                "prompt": "def inc(x):\n",
            }
        )
    )
    assert (spec.mode, spec.entry_point, spec.prompt) == ("check", "inc", "def inc(x):\n")


def test_column_mapping():
    row = {"cases": [{"stdin": "1\n", "want": "1\n"}]}
    spec = parse_tests(json.dumps(row), {"tests": "cases", "input": "stdin", "output": "want"})
    assert spec.inputs == ["1\n"] and spec.expected == ["1\n"]
    row = {"meta": {"entry": "f"}, "tests": [{"input": "1", "output": "2", "testtype": "functional"}]}
    assert parse_tests(json.dumps(row), {"fn_name": "meta.entry"}).fn_name == "f"
    with pytest.raises(ValueError, match="unknown key 'inputs'"):
        parse_tests("[]", {"inputs": "x"})


@pytest.mark.parametrize(
    "ref, message",
    [
        ("not json", "not JSON"),
        ("[]", "no tests"),
        ("42", "expected a JSON list of tests or an object"),
        ('{"foo": 1}', "found no tests"),
        ('[{"input": "1"}]', "lacks 'input' or 'output'"),
        ('[{"input": "1", "output": "1", "testtype": "weird"}]', "type 'weird'"),
        ('[{"input": "1", "output": "1", "testtype": "functional"}]', "need a function name"),
        (
            '[{"input": "1", "output": "1"}, {"input": "1", "output": "1", "testtype": "functional", "fn_name": "f"}]',
            "mixes",
        ),
        ('{"test": "def check(c): pass"}', "entry_point"),
        ('{"inputs": ["1"], "outputs": []}', "1 inputs but 0 outputs"),
    ],
)
def test_malformed_references_raise(ref, message):
    with pytest.raises(ValueError, match=message):
        parse_tests(ref)


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


# ------------------------------------------------------------------ comparison


@pytest.mark.parametrize(
    "out, want, ok",
    [
        ("3\n", "3", True),
        ("1 2\n3", "1\n2 3\n", True),  # tokens ignore line structure
        ("1 2", "1 2 3", False),
        ("0.3333333", "0.333333333", True),  # |diff| = 3.3e-8 <= 1e-6
        ("0.334", "0.333", False),  # |diff| = 1e-3
        ("1000000.5", "1000000.0", True),  # relative: 0.5 <= 1e-6 * 1e6 (= 1)
        ("1000002.5", "1000000.0", False),  # relative: 2.5 > 1
        ("3", "3.0", True),  # an integer printed where a real is expected: within tolerance
        ("1.0", "1", True),  # an expected integer: the same integer with a zero fraction
        ("-0.000", "0", True),
        ("+5 007 -0", "5 7 0", True),  # sign and leading zeros do not change an integer
        ("12345678901234567890", "12345678901234567891", False),  # integers compare exactly
        # an expected integer is never matched within a tolerance (issue 17: answers near 1e9 off by hundreds passed)
        ("1000000500.0", "1000000000", False),
        ("999999999.9999999", "1000000000", False),
        ("1000000000.0000001", "1000000000", False),
        ("1e9", "1000000000", False),  # nor written with an exponent
        ("0x10 1_0", "16 10", False),  # nor in any other base or with underscores
        ("\u0661\u0662", "12", False),  # nor in other scripts' digits
        ("YES", "yes", False),
        ("nan", "nan", True),  # equal strings
        ("NaN", "0.5", False),  # special values are words, never numbers
        ("inf", "1e999", False),
        ("1e999", "1e999", True),
        ("1e999", "1e998", False),  # an expected real that overflows matches only itself
        ("1" * 5000, "1" * 5000, True),  # longer than int()'s digit limit: still exact
        ("1" * 5000, "1" * 4999 + "2", False),
        ("0" * 5000 + "3", "3", True),
        ("1" * 5000, "3", False),
        ("1" * 400, "1.5", False),  # overflows a float
    ],
)
def test_compare_tokens(out, want, ok):
    assert compare_stdout(out, want)[0] is ok


def test_compare_lines_is_lcb_exact():
    assert compare_stdout("1 2\n3\n", "1 2\n3", mode="lines")[0]
    assert not compare_stdout("1 2 3", "1 2\n3", mode="lines")[0]
    assert compare_stdout("1.50 2", "1.5 2.0", mode="lines")[0]  # equal decimals
    assert compare_stdout("1E+2", "100", mode="lines")[0]
    assert not compare_stdout("0.3333333", "0.333333333", mode="lines")[0]  # no tolerance in LCB
    # special decimal values (issue 17: a signalling NaN raised out of the comparison) are words: equal only as text
    for out, want in (
        ("sNaN", "1"),
        ("sNaN", "sNaN1"),
        ("NaN", "NaN1"),
        ("1 sNaN", "1 2"),
        ("Infinity", "inf"),
        ("1e9999999999999999999", "1"),
        ("-sNaN", "sNaN"),
    ):
        assert compare_stdout(out, want, mode="lines") == (False, f"line 0: got {out!r}, expected {want!r}")
    for same in ("NaN", "sNaN", "Infinity", "1 NaN"):
        assert compare_stdout(same, same, mode="lines")[0]
    assert not compare_stdout("NaN", "nan", mode="lines")[0]


def test_compare_stdout_takes_bytes_and_ascii_whitespace():
    assert compare_stdout(b"1 2\r\n", "1 2")[0]
    assert compare_stdout(b"\xff\xfe 2", b"\xff\xfe 2")[0]  # bytes that are not UTF-8 compare as bytes
    assert not compare_stdout(b"\xff", "\ufffd")[0]  # not through a decoding that replaces them
    assert not compare_stdout("1\u00a02", "1 2")[0]  # only ASCII whitespace separates tokens
    assert compare_stdout(b"3\n", b"3")[0] and compare_stdout("3", b"3\n", mode="lines")[0]


def test_compare_values():
    assert compare_values([1, 2], [1, 2])
    assert compare_values(0.1 + 0.2, 0.3)
    assert not compare_values(0.31, 0.3)
    assert compare_values(6, [6])  # APPS wraps expected values in a list
    assert compare_values([6], [[6]])  # [[6]] unwraps to [6]
    assert not compare_values(6, [6], unwrap=False)
    assert not compare_values({"a": 1}, {"a": 2})
    assert compare_values({"a": [1.0, 2]}, {"a": [1, 2]})  # 1.0 is exactly the expected 1
    assert not compare_values("1", 1)
    assert compare_values(3, 3.0000001)  # an int where a float is expected: within tolerance
    # an expected int is matched exactly, never within a tolerance (issue 17)
    assert not compare_values(1000000500.0, 1000000000)
    assert not compare_values(999999999.9999999, 1000000000)
    assert compare_values(1e9, 1000000000)
    assert not compare_values(2**53 + 1.0, 2**53 + 1)  # the float is 2**53: not the expected integer
    # bools are not numbers
    assert not compare_values(True, 1) and not compare_values(1, True) and not compare_values(0.0, False)
    assert compare_values(True, True) and not compare_values(True, False)
    # huge integers against floats: no OverflowError, just unequal
    assert not compare_values(10**400, 1.5) and not compare_values(1.5, 10**400)
    assert not compare_values(10**400, float("inf")) and not compare_values([10**400], [1e308])
    # special values: NaN equals NaN, infinities equal themselves, nothing else is within tolerance of them
    nan, inf = float("nan"), float("inf")
    assert compare_values(nan, nan) and not compare_values(nan, 1.0) and not compare_values(1.0, nan)
    assert compare_values(inf, inf) and not compare_values(-inf, inf) and not compare_values(1e308, inf)
    assert not compare_values(inf, 1e308) and not compare_values(nan, 0)


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


# ------------------------------------------------------------------ issue 17: what a program prints or returns
# never raises out of the verifier, never passes by a tolerance it should not get, never costs the grader more
# than linear work or more than one test's output of memory.

_numberish = st.from_regex(rb"\A[+-]?[0-9]{0,12}(\.[0-9]{0,12})?([eE][+-]?[0-9]{0,4})?\Z")
_words = st.sampled_from(
    [
        b"nan",
        b"NaN",
        b"sNaN",
        b"-sNaN",
        b"inf",
        b"-Infinity",
        b"1e999",
        b"0x1f",
        b"1_0",
        b".",
        b"-",
        b"+",
        b"e5",
        b"\xff",
        "\u0661".encode(),
        b"1" * 5000,
        b"9" * 400 + b".5",
    ]
)
_token = st.one_of(_numberish, _words, st.binary(max_size=8))
_output = st.lists(st.tuples(_token, st.sampled_from([b" ", b"\n", b"\t", b"\r\n", b"  ", b"\x0b"])), max_size=8).map(
    lambda parts: b"".join(t + s for t, s in parts)
)


@settings(max_examples=300, deadline=None)
@given(
    out=st.one_of(_output, st.binary(max_size=64)),
    want=st.one_of(_output, st.binary(max_size=64)),
    mode=st.sampled_from(["tokens", "lines"]),
)
def test_compare_stdout_gives_a_verdict_for_any_bytes(out, want, mode):
    ok, why = compare_stdout(out, want, mode=mode)
    assert isinstance(ok, bool) and isinstance(why, str)
    assert ok is (why == "")
    assert compare_stdout(out, out, mode=mode) == (True, "")


_digits = st.from_regex(r"\A[+-]?[0-9]{1,6000}\Z")


@settings(max_examples=200, deadline=None)
@given(a=_digits, b=_digits)
def test_integers_compare_exactly(a, b):
    same = Decimal(a) == Decimal(b)  # the reference twin: exact at any length (int() stops at 4300 digits)
    assert compare_stdout(a, b)[0] is same
    assert compare_stdout(b, a)[0] is same
    assert compare_stdout(f"{a} {b}", f"{b} {a}")[0] is same


@settings(max_examples=200, deadline=None)
@given(
    y=st.integers(-(10**30), 10**30), got=st.from_regex(r"\A[+-]?[0-9]{1,25}(\.[0-9]{0,25})?([eE][+-]?[0-9]{1,3})?\Z")
)
def test_an_expected_integer_takes_only_that_integer(y, got):
    """Written as an integer or with a fraction of zeros, never within a tolerance, never with an exponent."""
    exact = "e" not in got.lower() and Decimal(got) == y
    assert compare_stdout(got, str(y))[0] is exact


_plain = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(-(10**400), 10**400),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=4),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(got=_plain, want=_plain)
def test_compare_values_gives_a_verdict_for_any_values(got, want):
    assert isinstance(compare_values(got, want), bool)


@settings(max_examples=300, deadline=None)
@given(
    x=st.one_of(st.integers(), st.integers(-(10**400), 10**400)),
    y=st.one_of(st.integers(), st.integers(-(10**400), 10**400)),
    f=st.floats(allow_nan=True, allow_infinity=True),
)
def test_compare_values_integers_exactly(x, y, f):
    assert compare_values(x, y) is (x == y)
    assert compare_values(f, y) is (f == y)  # a float where an int is expected: only the exact value (Python's ==)


@settings(max_examples=300, deadline=None)
@given(
    raw=st.one_of(
        st.binary(max_size=64),
        _plain.map(lambda v: json.dumps(v).encode()),
        st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n),
        st.integers(1, 200_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    ),
    want=_plain,
)
def test_a_returned_value_gives_a_verdict_for_any_bytes(raw, want):
    ok, why = compare_returned(raw, want)
    assert isinstance(ok, bool) and ok is (why == "") and len(why) < 400


def test_a_returned_value_is_not_parsed_into_many_times_its_size():
    """JSON of empty lists becomes objects 18 times its size: 15 MB of it was 300 MB in the grader's thread."""
    value = b"[" + b"[]," * 5_000_000 + b"[]]"
    tracemalloc.start()
    try:
        ok, why = compare_returned(value, [[1], [2]])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not ok and why == "the returned value's JSON has 15000004 bytes, more than any match could (144)"
    assert peak < 2**20
    # every writing of a matching value is within the bound: floats' repr, a float for an int, escapes
    for got, want in (
        (2.220446049250313e-16, 0.0),
        (0.9999999999999999, 1.0),
        (5.0, 5),
        ("\U0001f600" * 3, "\U0001f600" * 3),
        ([1.0000000000000002] * 50, [1] * 50),
        (float("nan"), float("nan")),
        (10**30 * 1.0, 10**30),
    ):
        assert compare_returned(json.dumps(got).encode(), want)[0] is compare_values(got, want), (got, want)


def test_compare_returned():
    assert compare_returned(b"[0, 1]", [0, 1]) == (True, "")
    assert compare_returned(b"1000000500.0", 1000000000) == (False, "returned 1000000500.0, expected 1000000000")
    deep = b"[" * 100_000 + b"]" * 100_000
    assert compare_returned(deep, [0] * 30000) == (False, "the returned value could not be read (nested too deeply)")
    assert compare_returned(b"1" * 5000, 1)[0] is False
    assert compare_returned(b"\xff", "x") == (False, "the returned value could not be read (not JSON)")


# Adversarial outputs of 16 MiB (the default output cap, `max_output_mb=16`) and completions of 2 MiB: the grader's
# work on each must be linear. Run in a fresh interpreter under a hang guard, not a speed target: the linear grader
# takes well under a second per case, the quadratic regular expressions of issue 17 took hours on these (and held
# the GIL: no thread could have stopped them).
_LINEAR_PRELUDE = """
import json
from xrpo.rewards.code import CodeVerifier, compare_returned, compare_stdout, extract_code
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
