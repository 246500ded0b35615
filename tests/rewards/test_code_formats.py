"""Reference formats (xrpo/rewards/code_formats.py): LiveCodeBench, DeepCoder, APPS / TACO, HumanEval, the column
mapping, and what a malformed reference raises."""

from __future__ import annotations

import base64
import json
import pickle
import zlib

import pytest

from xrpo.rewards.code_formats import parse_tests


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
