"""Named dataset layouts (MATH-500, AIME 2024/2025, MathArena's HMMT / BRUMO, GSM8K, DAPO-Math-17k) read from small
files written here in each format users have them in, and test-case answers for code datasets."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xrpo.data import LAYOUTS, DataError, NamedLayout, Problem, load_problems, load_problems_with_layout
from xrpo.data.loaders import register_layout

MATH500 = [
    {
        "problem": "Convert $(0,3)$ to polar coordinates.",
        "solution": "... $\\boxed{(3,\\frac{\\pi}{2})}$",
        "answer": "\\left( 3, \\frac{\\pi}{2} \\right)",
        "subject": "Precalculus",
        "level": 2,
        "unique_id": "test/precalculus/807.json",
    },
    {
        "problem": "Compute $1+1$.",
        "solution": "$\\boxed{2}$",
        "answer": "2",
        "subject": "Algebra",
        "level": 1,
        "unique_id": "test/algebra/1.json",
    },
]
AIME24 = [
    {"ID": "2024-I-1", "Problem": "Every morning Aya ...", "Solution": "...", "Answer": 204},
    {"ID": "2024-I-2", "Problem": "There exist real numbers ...", "Solution": "...", "Answer": 25},
]
AIME24_LOWER = [{"id": 60, "problem": "Every morning Aya ...", "solution": "...", "answer": "204", "url": "u"}]
AIME25_QA = [
    {"question": "Find the sum of all integer bases ...", "answer": "70"},
    {"question": "On triangle ABC ...", "answer": "588"},
]
MATHARENA = [
    {
        "problem_idx": 1,
        "problem": "Compute the sum of the positive divisors ...",
        "answer": "103",
        "problem_type": ["Number Theory"],
    },
    {"problem_idx": 2, "problem": "Mark writes ...", "answer": "\\frac{1}{2}", "problem_type": ["Algebra"]},
]
GSM8K = [
    {
        "question": "Natalia sold clips to 48 of her friends ...",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 72",
    },
    {"question": "A big number ...", "answer": "It is 1000 + 234 = 1,234.\n#### 1,234"},
]
DAPO_WRAPPER = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{q}\n\nRemember to "
    'put your answer on its own line after "Answer:".'
)
DAPO = [
    {
        "data_source": "math_dapo",
        "prompt": [{"content": DAPO_WRAPPER.format(q=f"In triangle ABC, find x{i}."), "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": str(34 + i), "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": f"9a9b6eb4-a1cb-49d1-8c1e-62eaf2f7407{i}"},
    }
    for i in range(2)
]


def write(tmp_path, name, records, fmt):
    if fmt == "jsonl":
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(records), path)
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_math500(tmp_path, fmt):
    probs, info = load_problems_with_layout(write(tmp_path, "test", MATH500, fmt))
    assert info == {"format": fmt, "layout": "math500", "prompt": "problem", "answer": "answer", "id": "unique_id"}
    assert probs[0].id == "test/precalculus/807.json"
    assert probs[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"  # the answer column, not the worked solution
    assert probs[0].metadata == {"solution": MATH500[0]["solution"], "subject": "Precalculus", "level": 2}


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_aime2024_capitalised_and_lower_case(tmp_path, fmt):
    probs, info = load_problems_with_layout(write(tmp_path, "aime24", AIME24, fmt))
    assert info["layout"] == "aime2024" and (info["prompt"], info["answer"], info["id"]) == ("Problem", "Answer", "ID")
    assert [(p.id, p.answer) for p in probs] == [("2024-I-1", "204"), ("2024-I-2", "25")]
    assert probs[0].prompt == "Every morning Aya ..." and probs[0].metadata == {"Solution": "..."}
    probs, info = load_problems_with_layout(write(tmp_path, "aime24_lower", AIME24_LOWER, fmt))
    assert info["layout"] == "generic" and (info["prompt"], info["answer"], info["id"]) == ("problem", "answer", "id")
    assert (probs[0].id, probs[0].answer) == ("60", "204")


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_aime2025_question_answer(tmp_path, fmt):
    probs, info = load_problems_with_layout(write(tmp_path, "aime2025", AIME25_QA, fmt))
    assert info == {
        "format": fmt,
        "layout": "generic",
        "prompt": "question",
        "answer": "answer",
        "id": "<record position>",
    }
    assert [(p.id, p.answer) for p in probs] == [("aime2025-0", "70"), ("aime2025-1", "588")]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_matharena_hmmt_brumo(tmp_path, fmt):
    probs, info = load_problems_with_layout(write(tmp_path, "hmmt_feb_2025", MATHARENA, fmt))
    assert info["layout"] == "matharena" and info["id"] == "problem_idx"
    assert [(p.id, p.answer) for p in probs] == [("1", "103"), ("2", "\\frac{1}{2}")]
    assert probs[0].metadata == {"problem_type": ["Number Theory"]}


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_gsm8k_takes_the_text_after_the_marks(tmp_path, fmt):
    probs, info = load_problems_with_layout(write(tmp_path, "gsm8k", GSM8K, fmt))
    assert info["layout"] == "gsm8k"
    # "#### 72" -> "72"; thousands separators of a number are removed: "1,234" -> "1234"
    assert [p.answer for p in probs] == ["72", "1234"]
    assert probs[0].prompt == GSM8K[0]["question"]


def test_gsm8k_row_without_marks_names_row_and_field(tmp_path):
    rows = [GSM8K[0], {"question": "q", "answer": "no final line"}]
    with pytest.raises(DataError, match=r"g\.jsonl line 2: field 'answer' has no '####"):
        load_problems(write(tmp_path, "g", rows, "jsonl"))
    with pytest.raises(DataError, match=r"g2\.parquet row 1 \(0-based\): field 'answer' has nothing after"):
        load_problems(write(tmp_path, "g2", [GSM8K[0], {"question": "q", "answer": "x ####  "}], "parquet"))


def test_gsm8k_with_explicit_other_answer_column_keeps_it(tmp_path):
    rows = [{**r, "final": "7"} for r in GSM8K]
    probs = load_problems(write(tmp_path, "g", rows, "jsonl"), answer_key="final")
    assert [p.answer for p in probs] == ["7", "7"]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_dapo_math_keeps_its_instruction_wrapper(tmp_path, fmt):
    probs, info = load_problems_with_layout(write(tmp_path, "dapo-math-17k", DAPO, fmt))
    assert info["layout"] == "verl" and info["answer"] == "reward_model.ground_truth"
    p = probs[1]
    assert (p.id, p.answer, p.data_source) == ("9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74071", "35", "math_dapo")
    assert p.prompt == DAPO[1]["prompt"] and p.text.startswith("Solve the following math problem step by step.")
    assert p.text.endswith('after "Answer:".')


def test_layout_by_name_and_unknown_layout(tmp_path):
    # a MATH-500 file read as generic: the id is the record position, not unique_id
    probs, info = load_problems_with_layout(write(tmp_path, "m", MATH500, "jsonl"), layout="generic")
    assert info["layout"] == "generic" and probs[0].id == "m-0"
    with pytest.raises(ValueError, match=r"layout: unknown layout 'nope'; valid layouts: \['verl', 'math500'"):
        load_problems(write(tmp_path, "m", MATH500, "jsonl"), layout="nope")
    # a named layout whose fields are missing: the record error names them
    with pytest.raises(DataError, match=r"line 1: missing field 'Problem' \(the prompt\)"):
        load_problems(write(tmp_path, "m", MATH500, "jsonl"), layout="aime2024")


def test_case_insensitive_generic_keys(tmp_path):
    (p,) = load_problems(write(tmp_path, "c", [{"Question": "q", "Answer": 3}], "jsonl"))
    assert (p.prompt, p.answer) == ("q", "3")


def test_register_layout(tmp_path):
    lay = NamedLayout("mybench-test", ("Frage", "Antwort"), "Frage", "Antwort", "Nr")
    register_layout(lay)
    try:
        probs, info = load_problems_with_layout(
            write(tmp_path, "b", [{"Nr": 5, "Frage": "f", "Antwort": "a"}], "jsonl")
        )
        assert info["layout"] == "mybench-test" and probs[0] == Problem(id="5", prompt="f", answer="a")
        with pytest.raises(ValueError, match="already registered"):
            register_layout(lay)
    finally:
        LAYOUTS.pop("mybench-test")


# ------------------------------------------------------------------------------------------------ code datasets
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_test_case_answers_become_json(tmp_path, fmt):
    tests = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}]
    rows = [
        {"id": "c0", "question": "Add two numbers.", "tests": tests},
        {"id": "c1", "question": "Echo.", "tests": [{"input": "x", "output": "x"}]},
    ]
    probs = load_problems(write(tmp_path, "code", rows, fmt), answer_key="tests")
    assert json.loads(probs[0].answer) == tests and json.loads(probs[1].answer) == rows[1]["tests"]
    spec = {"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]}
    (p,) = load_problems(write(tmp_path, "code2", [{"question": "q", "answer": spec}], "jsonl"))
    assert json.loads(p.answer) == spec


def test_list_of_scalar_answers_keeps_its_hint(tmp_path):
    with pytest.raises(DataError, match=r"is a list of 2 answers.*answer_key='answer.0'"):
        load_problems(write(tmp_path, "l", [{"question": "q", "answer": ["1", "2"]}], "jsonl"))


def _lcb_private(tests: list[dict]) -> str:
    """LiveCodeBench's compressed form of private test cases: base64(zlib(pickle(json)))."""
    import base64
    import pickle
    import zlib

    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


# two rows of livecodebench/code_generation_lite as published (every column; a functional and a stdin problem)
LCB = [
    {
        "question_title": "Total",
        "question_content": "Return the sum of nums.",
        "platform": "leetcode",
        "question_id": "2847",
        "contest_id": "weekly-contest-1",
        "contest_date": "2023-08-01T00:00:00",
        "starter_code": "class Solution:\n    def total(self, nums: List[int]) -> int:\n        ",
        "difficulty": "easy",
        "public_test_cases": json.dumps([{"input": "[1, 2]", "output": "3", "testtype": "functional"}]),
        "private_test_cases": _lcb_private([{"input": "[5, 6]", "output": "11", "testtype": "functional"}]),
        "metadata": json.dumps({"func_name": "total"}),
    },
    {
        "question_title": "Add",
        "question_content": "Read a and b; print a + b.",
        "platform": "atcoder",
        "question_id": "abc001_a",
        "contest_id": "abc001",
        "contest_date": "2023-08-02T00:00:00",
        "starter_code": "",
        "difficulty": "easy",
        "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
        "private_test_cases": _lcb_private([{"input": "4 4\n", "output": "8\n", "testtype": "stdin"}]),
        "metadata": "{}",
    },
]
# two rows of codeparrot/apps as published (input_output and solutions are JSON strings)
APPS = [
    {
        "problem_id": 12,
        "question": "Read n; print 2n.",
        "solutions": json.dumps(["print(int(input()) * 2)"]),
        "input_output": json.dumps({"inputs": ["3\n", "5\n"], "outputs": ["6\n", "10\n"]}),
        "difficulty": "interview",
        "url": "https://codeforces.com/problemset/problem/1/A",
        "starter_code": "",
    },
    {
        "problem_id": 13,
        "question": "Return x + 1.",
        "solutions": "[]",
        "input_output": json.dumps({"fn_name": "inc", "inputs": [[1], [2]], "outputs": [[2], [3]]}),
        "difficulty": "introductory",
        "url": "https://leetcode.com/problems/x",
        "starter_code": "def inc(x):\n    ",
    },
]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_code_datasets_load_as_published_and_their_tests_grade(tmp_path, fmt):
    from xrpo.rewards import get_verifier

    lcb, info = load_problems_with_layout(write(tmp_path, "lcb", LCB, fmt))
    assert info == {
        "format": fmt,
        "layout": "livecodebench",
        "prompt": "question_content",
        "answer": "public_test_cases",
        "id": "question_id",
    }
    assert [p.id for p in lcb] == ["2847", "abc001_a"]
    # a functional problem's prompt shows the starter code its tests call; a stdin problem's is the question
    assert lcb[0].prompt.startswith("Return the sum of nums.") and "def total(self, nums" in lcb[0].prompt
    assert lcb[1].prompt == "Read a and b; print a + b."
    ref = json.loads(lcb[0].answer)
    assert set(ref) == {"public_test_cases", "private_test_cases", "metadata", "starter_code"}
    assert lcb[0].metadata == {k: LCB[0][k] for k in ("question_title", "platform", "contest_id", "contest_date")} | {
        "difficulty": "easy"
    }
    apps, info = load_problems_with_layout(write(tmp_path, "apps", APPS, fmt))
    assert (info["layout"], info["answer"], info["id"]) == ("apps", "input_output", "problem_id")
    assert [p.id for p in apps] == ["12", "13"] and "def inc(x):" in apps[1].prompt
    assert json.loads(json.loads(apps[1].answer)["input_output"])["fn_name"] == "inc"
    # the code verifier reads every reference as loaded: public and (decoded) private tests, the function name
    verifier = get_verifier("code")
    refs = [p.answer for p in lcb + apps]
    assert verifier.reference_errors(refs) == []
    right = [
        "```python\nclass Solution:\n    def total(self, nums):\n        return sum(nums)\n```",
        "```python\na, b = map(int, input().split())\nprint(a + b)\n```",
        "```python\nprint(int(input()) * 2)\n```",
        "```python\ndef inc(x):\n    return x + 1\n```",
    ]
    results = verifier.verify_batch(right, refs)
    assert [r.score for r in results] == [1.0] * 4
    assert [r.metadata["total"] for r in results] == [2, 2, 2, 2]  # the private tests count
    wrong = ["```python\nclass Solution:\n    def total(self, nums):\n        return 3\n```"]  # passes public only
    assert verifier.verify_batch(wrong, refs[:1])[0].score == 0.0
