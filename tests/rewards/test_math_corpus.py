"""The math verifier against a hand-labelled corpus of how models phrase answers (tests/rewards/math_corpus.jsonl):
boxed, "The answer is", "Answer:", `####`, Minerva's "Final Answer: The final answer is X. I hope it is correct.",
trailing sentences, units, percent, money, LaTeX fractions, negative numbers, thousands separators, several numbers
in the text, and wrong answers that must score 0 (negations, hedges, ranges, the right number only in the working);
some written here after real models' phrasing, some sampled from SmolLM2-135M-Instruct.

Each row: `completion`, `reference`, `expected` (the hand label under the default verifier), `kind`, `source`, and,
for completions without a marker, `expected_last_number` (the hand label when `last_number=True` grades their last
number). math-verify's own verdict on each row and the cases where it differs from the hand label are counted in
docs/rewards.md (`python scripts/math_corpus_agreement.py --list`).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import fresh_python
from xrpo.rewards import MathVerifier

CORPUS = Path(__file__).with_name("math_corpus.jsonl")
FIELDS = {"completion", "reference", "expected", "kind", "source", "why", "expected_last_number"}


def load() -> list[dict]:
    return [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_corpus_covers_every_form_with_both_verdicts():
    cases = load()
    assert len(cases) >= 200
    for i, c in enumerate(cases):
        assert set(c) <= FIELDS and {"completion", "reference", "expected", "kind", "source"} <= set(c), i
        assert c["expected"] in (0, 1) and c.get("expected_last_number", 0) in (0, 1), i
    kinds = Counter(c["kind"] for c in cases)
    for kind in ("boxed", "answer_is", "answer_colon", "####", "minerva", "money", "percent", "negative"):
        assert kinds[kind] >= 10, kind
    for kind in ("thousands", "latex", "several_numbers", "wrong", "no_marker", "confirmation", "text"):
        assert kinds[kind] >= 4, kind
    labels = Counter(c["expected"] for c in cases)
    assert labels[1] >= 100 and labels[0] >= 60
    assert len({(c["completion"], c["reference"]) for c in cases}) == len(cases)  # no case twice


@pytest.fixture(scope="module")
def grader():
    # the pooled verifier as training uses it, with a limit no grading here comes near on a loaded 2-core machine:
    # these tests are about verdicts (the time limit has its own tests in test_math.py)
    return MathVerifier(timeout=60.0, workers=2)


def disagreements(verifier: MathVerifier, cases: list[dict], label: str) -> list[tuple]:
    out = verifier.verify_batch([c["completion"] for c in cases], [c["reference"] for c in cases])
    return [
        (c["completion"], c["reference"], c.get(label, c["expected"]), r.score, r.answer)
        for c, r in zip(cases, out)
        if r.score != c.get(label, c["expected"])
    ]


def test_every_case_gets_its_hand_label(grader):
    assert disagreements(grader, load(), "expected") == []


def test_with_last_number_every_case_gets_its_hand_label():
    # completions without a marker are graded on their last number; every other case keeps its verdict
    verifier = MathVerifier(timeout=60.0, workers=2, last_number=True)
    assert disagreements(verifier, load(), "expected_last_number") == []


def test_no_wrong_answer_scores_1(grader):
    # the worse of the two errors, named apart: a wrong answer rewarded (negations, hedges, number words, mixed units,
    # the first of two formulas, the right number only in the working)
    cases = [c for c in load() if c["expected"] == 0]
    out = grader.verify_batch([c["completion"] for c in cases], [c["reference"] for c in cases])
    assert [(c["completion"], c["reference"], r.answer) for c, r in zip(cases, out) if r.score != 0.0] == []


def test_a_warm_worker_imports_nothing_while_it_grades():
    """The pool's workers are forked from a process that ran `_warm_up`: grading the corpus and large powers after it
    imports no module, so no item's time limit pays for an import (sympy's simplify imports sympy.physics on first
    use: 0.3-0.7 s, which judged answers "timeout" under a short limit on a loaded machine). In a fresh interpreter:
    this one has imported whatever other tests did."""
    code = (
        "import json, sys\n"
        "from xrpo.rewards.math import MathVerifier, _warm_up\n"
        "_warm_up()\n"
        "before = set(sys.modules)\n"
        f"rows = [json.loads(line) for line in open({str(CORPUS)!r}, encoding='utf-8') if line.strip()]\n"
        "pairs = [(r['completion'], r['reference']) for r in rows]\n"
        "pairs += [(r'\\boxed{2^{1000}}', '5'), (r'\\boxed{2^{100}}', '1267650600228229401496703205376')]\n"
        "MathVerifier(in_process=True).verify_batch([c for c, _ in pairs], [r for _, r in pairs])\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    imported = fresh_python(code)
    assert imported == "[]", f"imported while grading: {imported}"
