"""The `math` verifier (xrpo/rewards/math.py): equivalence, extraction through the verifier, time limits."""

import logging
import threading
import time

import pytest

from xrpo.rewards import MathVerifier, VerifyResult, get_verifier
from xrpo.rewards.math import _DropTimeoutDisabledWarning, _quiet_math_verify, grade_answer

# (answer written by the model, reference, equivalent?) -- the model's answer goes inside \boxed{}.
EQUIVALENCE = [
    # fractions, \frac vs /, \dfrac / \tfrac, decimals
    (r"\frac{1}{2}", "1/2", True),
    ("0.5", r"\frac12", True),
    (r"\dfrac{3}{4}", "0.75", True),
    (r"\tfrac{7}{2}", "3.5", True),
    (r"\frac{2}{4}", r"\frac{1}{2}", True),
    ("1.5", r"\frac{3}{2}", True),
    ("3.0", "3", True),
    ("0.333333", r"\frac13", True),  # math-verify rounds floats to 6 decimals
    ("0.33", r"\frac13", False),
    (r"\frac{1}{2}", r"\frac{1}{3}", False),
    ("0.5", "5", False),
    ("2", "2.1", False),
    # negative numbers
    ("-3", "-3", True),
    ("-0.25", r"-\frac{1}{4}", True),
    (r"-\frac{1}{3}", r"\frac{-1}{3}", True),
    ("-3", "3", False),
    (r"-\frac12", r"\frac12", False),
    # integers with commas, leading zeros, currency
    ("1,000", "1000", True),
    ("1{,}000", "1000", True),
    ("1,234,567", "1234567", True),
    ("007", "7", True),
    (r"\$18", "18", True),
    ("1000", "1,001", False),
    ("12", "21", False),
    # sets (order does not matter) and tuples / intervals (it does)
    (r"\{1,2\}", r"\{2,1\}", True),
    (r"\{2, 3\}", r"\{3,2\}", True),
    (r"\{1,2\}", r"\{1,2,3\}", False),
    (r"(1,2]", "(1, 2]", True),
    (r"[0, \infty)", r"[0,\infty)", True),
    (r"\left( 1, 2 \right)", "(1,2)", True),
    (r"x \in [1,2]", "[1,2]", True),
    ("(1,2]", "[1,2]", False),
    ("(0,1)", "(0,2)", False),
    ("(2,3)", "(3,2)", False),
    # roots, pi, powers
    (r"2\sqrt{2}", r"\sqrt{8}", True),
    (r"\sqrt{12}", r"2\sqrt{3}", True),
    (r"\frac{\sqrt{3}}{2}", r"\sqrt{3}/2", True),
    (r"\sqrt{2}/2", r"\frac{1}{\sqrt{2}}", True),
    (r"\frac{\sqrt{6}}{3}", r"\sqrt{\frac{2}{3}}", True),
    (r"2\pi", r"\pi \cdot 2", True),
    (r"\pi/2", r"\frac{\pi}{2}", True),
    ("2^{10}", "1024", True),
    (r"\binom{5}{2}", "10", True),
    (r"2\sqrt{2}", r"\sqrt{2}", False),
    (r"\pi", "3.14159", False),
    (r"\sqrt{3}", "3", False),
    # degrees and percentages, as math-verify reads them
    (r"30^\circ", "30", True),
    (r"30^{\circ}", "30", True),
    (r"30^\circ", "60", False),
    (r"50\%", "50", True),
    (r"50\%", "0.5", True),
    (r"25\%", r"\frac14", True),
    (r"50\%", "5", False),
    # math-verify equates 9% with 9 for integers only: xrpo applies the same rule to every number
    (r"12.5\%", "12.5", True),
    ("12.5", r"12.5\%", True),
    (r"7.5\%", "0.075", True),
    (r"12.5\%", "1.25", False),
    # algebra
    ("3x+2", "2+3x", True),
    ("x = 5", "5", True),
    ("x+1", "x-1", False),
    # text answers, units in \text
    (r"\text{Monday}", "Monday", True),
    (r"\mathrm{Tuesday}", "Tuesday", True),
    (r"\text{(B)}", "(B)", True),
    (r"5 \text{ cm}", "5", True),
    (r"\text{Tuesday}", r"\text{Monday}", False),
    (r"\text{no}", "yes", False),
]


def test_enough_pairs_of_each_kind():
    assert sum(ok for *_, ok in EQUIVALENCE) >= 30
    assert sum(not ok for *_, ok in EQUIVALENCE) >= 20


@pytest.mark.parametrize("answer, reference, equivalent", EQUIVALENCE)
def test_equivalence(math_verifier, answer, reference, equivalent):
    r = math_verifier(f"Some reasoning.\nSo the result is $\\boxed{{{answer}}}$.", reference)
    assert r.score == (1.0 if equivalent else 0.0)
    assert r.reason == (None if equivalent else "mismatch")
    assert r.answer is not None and r.metadata["source"] == "boxed"


# A spread of the pairs above (every kind, both verdicts) for the consistency tests below.
SUBSET = EQUIVALENCE[::4]


def _completions():
    return [f"Work.\n\\boxed{{{a}}}" for a, _, _ in SUBSET], [ref for _, ref, _ in SUBSET]


def test_batch_equals_single_calls(math_verifier):
    completions, references = _completions()
    completions += ["no answer here", r"\boxed{1} \boxed{2", "#### 12", r"\boxed{" + "1" * 20_000 + "}"]
    references += ["1", "2", "12", "3"]
    # repeated pairs (graded once per batch) and the same answer against different references
    completions += completions[:3] + [r"\boxed{0.5}"] * 3
    references += references[:3] + ["1/2", "0.5", "2"]
    batch = math_verifier.verify_batch(completions, references)
    single = [math_verifier(c, r) for c, r in zip(completions, references)]
    assert batch == single
    n = len(SUBSET)
    assert [r.score for r in batch[:n]] == [float(ok) for *_, ok in SUBSET]
    assert [r.reason for r in batch[n : n + 4]] == ["no_answer", "no_answer", None, "answer_too_long"]
    assert batch[n + 4 : n + 7] == batch[:3]
    assert [r.score for r in batch[-3:]] == [1.0, 1.0, 0.0]


def test_in_process_mode_agrees_with_the_pool(math_verifier):
    completions, references = _completions()
    pooled = math_verifier.verify_batch(completions, references)
    inline = MathVerifier(in_process=True).verify_batch(completions, references)
    assert inline == pooled


@pytest.mark.parametrize("in_process", [False, True])
def test_works_from_a_non_main_thread(in_process):
    # math-verify's own time limits use SIGALRM, which raises outside the main thread
    v = MathVerifier(timeout=3.0, workers=2, in_process=in_process)
    out = {}

    def call():
        out["single"] = v(r"\boxed{\dfrac{1}{2}}", "0.5")
        out["batch"] = v.verify_batch([r"\boxed{\{2,1\}}", r"\boxed{3}"], [r"\{1,2\}", "4"])

    t = threading.Thread(target=call)
    t.start()
    t.join(60)
    assert out["single"].score == 1.0
    assert [r.score for r in out["batch"]] == [1.0, 0.0]


def test_result_fields(math_verifier):
    r = math_verifier(r"thus $\boxed{ \dfrac{1}{2} }$.", "0.5")
    assert r == VerifyResult(
        1.0, r"\frac{1}{2}", None, {"source": "boxed", "method": "math_verify", "canonical": "1/2"}
    )
    # the fast path: equal after normalisation, no sympy
    r = math_verifier(r"\boxed{\text{(C)}}", "(C)")
    assert r == VerifyResult(1.0, "(C)", None, {"source": "boxed", "method": "exact"})
    r = math_verifier("I give up.", "3")
    assert r == VerifyResult(0.0, None, "no_answer", {"extraction": "no_marker"})
    r = math_verifier(r"\boxed{4}", "3")
    assert (r.score, r.answer, r.reason, r.metadata["canonical"]) == (0.0, "4", "mismatch", "4")


def test_equivalent_answers_are_different_votes_but_one_canonical_form():
    v = MathVerifier(in_process=True, canonical=True)
    out = v.verify_batch([r"\boxed{0.5}", r"\boxed{\frac{1}{2}}", r"\boxed{50\%}", r"\boxed{1/2}"], ["1/2"] * 4)
    assert [r.score for r in out] == [1.0] * 4
    assert [r.answer for r in out] == ["0.5", r"\frac{1}{2}", "50%", "1/2"]
    assert {r.metadata["canonical"] for r in out} == {"1/2"}


def test_fallback_extraction_through_the_verifier(math_verifier):
    completions = [
        "48/2 = 24 clips in May.\n#### 72",
        "So the answer is $\\frac{3}{4}$.",
        "**Answer:** 1,000",
        "The answer is 7, obviously",
    ]
    out = math_verifier.verify_batch(completions, ["72", "0.75", "1000", "7"])
    assert [(r.score, r.metadata["source"]) for r in out] == [
        (1.0, "####"),
        (1.0, "answer_is"),
        (1.0, "answer_is"),
        (1.0, "answer_is"),  # the answer is the expression "7": the prose after it is not part of it
    ]


def test_last_number_grades_completions_without_a_marker():
    completions = ["So Tom has 12 apples.", "30 - 12 = 18, so 18 / 2 = 9 play.", "The answer is 7. Check: 7 + 5 = 12."]
    default = MathVerifier(in_process=True).verify_batch(completions, ["12", "18", "12"])
    assert [(r.score, r.reason) for r in default] == [(0.0, "no_answer"), (0.0, "no_answer"), (0.0, "mismatch")]
    out = MathVerifier(in_process=True, last_number=True).verify_batch(completions, ["12", "18", "12"])
    assert [(r.score, r.answer, r.metadata["source"]) for r in out] == [
        (1.0, "12", "last_number"),
        (0.0, "9", "last_number"),  # the right number only in the working
        (0.0, "7", "answer_is"),  # a marker still wins
    ]


def test_reference_can_be_a_full_solution(math_verifier):
    assert math_verifier(r"\boxed{72}", "She sold 48 + 24 = 72.\n#### 72").score == 1.0
    assert math_verifier(r"\boxed{\frac12}", r"Hence the probability is $\boxed{0.5}$.").score == 1.0


def test_references_no_answer_can_match_are_refused_before_training(math_verifier, tmp_path):
    refs = ["42", r"\{1, 2\}", "[1, 2]", "{1, 2}", '{"input": "1", "output": "2"}', '[{"input": "1"}]', " ", 7]
    # a LaTeX set, a JSON list of numbers and a non-JSON brace are answers; test cases, a blank and a non-string not
    assert math_verifier.reference_errors(refs) == [
        (4, "holds test cases (JSON objects), not a math answer: grade it with the 'code' verifier"),
        (5, "holds test cases (JSON objects), not a math answer: grade it with the 'code' verifier"),
        (6, "empty reference answer"),
        (7, "expected a string, got int"),
    ]
    # as xrpo train reads a data file: the object answer (a code problem's tests) is named with its problem
    from xrpo.data.loaders import load_problems
    from xrpo.rewards import raise_reference_errors

    data = tmp_path / "mixed.jsonl"
    data.write_text('{"id": "a", "problem": "1+1?", "answer": 2}\n{"id": "b", "problem": "p", "answer": {"x": 1}}\n')
    with pytest.raises(
        ValueError,
        match=r"1 of 2 reference answers cannot be graded by the 'math' verifier:\n"
        r"  problem 'b' \(row 1\): holds test cases",
    ):
        raise_reference_errors(math_verifier, load_problems(str(data)), str(data))


def test_only_the_last_box_counts(math_verifier):
    # reward-hacking guard: boxing every candidate does not collect the reward
    spray = r"Maybe \boxed{1}, or \boxed{2}, or \boxed{3}. Final: \boxed{4}"
    out = math_verifier.verify_batch([spray] * 4, ["1", "2", "3", "4"])
    assert [r.score for r in out] == [0.0, 0.0, 0.0, 1.0]
    assert {r.answer for r in out} == {"4"}
    # a set-valued box is one answer, compared as a set
    assert math_verifier(r"\boxed{1, 2, 3, 4}", "2").score == 0.0


@pytest.mark.parametrize(
    "completion, reason",
    [
        ("The value is 42 I think", "no_answer"),
        (r"\boxed{\frac{1}{2}", "no_answer"),  # unbalanced
        (r"\boxed{3} and then \boxed{", "no_answer"),
        ("", "no_answer"),
        (r"\boxed{" + "1" * 20_000 + "}", "answer_too_long"),
    ],
)
def test_malformed_completions(math_verifier, completion, reason):
    r = math_verifier(completion, "3")
    assert (r.score, r.answer, r.reason) == (0.0, None, reason)


def test_adversarial_completions_come_back(math_verifier):
    megabyte = "x" * 1_000_000
    cases = [
        # answers that make sympy compute for minutes or exhaust memory: killed at the limit
        (r"\boxed{9^{9^{9^9}}}", "5", "timeout"),
        (r"\boxed{(10^{10})!}", "5", "timeout"),
        (r"\boxed{2^{2^{40}}}", "5", "timeout"),
        # deeply nested braces / parentheses within the answer-size cap: the parser never finishes
        (r"\boxed{" + "{" * 2000 + "1" + "}" * 2000 + "}", "1", "timeout"),
        (r"\boxed{" + "(" * 2000 + "1" + ")" * 2000 + "}", "1", "timeout"),
        # big but quick to compute: graded normally
        (r"\boxed{2^{1000}}", "5", "mismatch"),
        (r"\boxed{2^{100}}", "1267650600228229401496703205376", None),
        # 1 MB completions: the answer is looked for in the last `max_chars` characters only
        (megabyte + r"\boxed{3}", "3", None),
        (r"\boxed{3}" + megabyte, "3", "no_answer"),
        (megabyte + r"\boxed{" + "{" * 6000 + "}", "3", "no_answer"),
        # the same huge answer as the reference: settled by the exact fast path, sympy never runs
        (r"\boxed{9^{9^{9^9}}}", "9^{9^{9^9}}", None),
    ]
    v = MathVerifier(timeout=1.5, workers=2, max_chars=1_000_000)
    start = time.monotonic()
    out = v.verify_batch([c for c, _, _ in cases], [r for _, r, _ in cases])
    assert time.monotonic() - start < 30  # hang guard only; the bound is ~ 1.5 s * ceil(8 / 2)
    assert [(r.score, r.reason) for r in out] == [(0.0 if why else 1.0, why) for _, _, why in cases]
    # identical overrunning answers are graded once: one kill, the same verdict for all
    out = v.verify_batch([r"\boxed{9^{9^{9^9}}}"] * 4, ["5"] * 4)
    assert [r.reason for r in out] == ["timeout"] * 4
    # the killed workers were replaced: the pool grades normally right after
    assert [r.score for r in v.verify_batch([r"\boxed{\frac{6}{4}}"] * 3, ["1.5"] * 3)] == [1.0] * 3


def test_get_verifier_math_shares_the_pool(math_verifier):
    a = get_verifier("math", timeout=3.0, workers=2)
    assert a._pool() is math_verifier._pool()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"timeout": 0}, "timeout: expected a positive number"),
        ({"timeout": "5"}, "timeout: expected a positive number"),
        ({"workers": 0}, "workers: expected None or an integer >= 1"),
        ({"max_chars": 0}, "max_chars: expected an integer >= 1"),
        ({"max_answer_chars": 1.5}, "max_answer_chars: expected an integer >= 1"),
        ({"max_memory_mb": -1}, "max_memory_mb: expected None or an integer >= 1"),
        ({"last_number": "yes"}, "last_number: expected true or false"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MathVerifier(**kwargs)


def test_bad_batches(math_verifier):
    with pytest.raises(ValueError, match=r"references\[1\]: empty reference answer"):
        math_verifier.verify_batch([r"\boxed{1}", r"\boxed{1}"], ["1", "  "])
    with pytest.raises(ValueError, match=r"references\[0\]: expected str, got int"):
        math_verifier.verify_batch([r"\boxed{1}"], [1])
    with pytest.raises(ValueError, match="same length"):
        math_verifier.verify_batch([r"\boxed{1}"], [])
    assert math_verifier.verify_batch([], []) == []


def test_defaults(monkeypatch):
    # the documented defaults: 5 s per item, pooled, 1e6 searched characters, 10_000-character answers, canonical
    # only when math-verify runs, 4096 MB per worker, workers = usable cores capped at 8
    v = MathVerifier()
    assert (v.timeout, v.in_process, v.max_chars, v.max_answer_chars, v.canonical, v.max_memory_mb) == (
        5.0,
        False,
        1_000_000,
        10_000,
        False,
        4096,
    )
    monkeypatch.setattr("xrpo.rewards.math.default_workers", lambda: 3)
    assert MathVerifier().workers == 3
    monkeypatch.setattr("xrpo.rewards.math.default_workers", lambda: 64)
    assert MathVerifier().workers == 8
    assert MathVerifier(workers=5).workers == 5


def test_canonical_form_of_a_product_is_not_a_percentage():
    # only number * (1/100) is a percentage; 2x stays a product, printed as sympy prints it
    assert grade_answer("2x", "2x") == (True, "2*x")
    assert grade_answer(r"50\%", "1/2") == (True, "1/2")


def test_canonical_form_is_dropped_beyond_200_characters():
    # a 200-digit integer keeps its canonical form; 201 digits is too long to carry in the metadata
    assert grade_answer("1" * 200, "1" * 200) == (True, "1" * 200)
    assert grade_answer("1" * 201, "1" * 201) == (True, None)


def test_the_timeout_disabled_warning_is_silenced(caplog):
    # xrpo turns math-verify's signal timeouts off on purpose: its warning about that is dropped, nothing else is
    _quiet_math_verify()
    _quiet_math_verify()  # idempotent: one filter per logger
    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        assert sum(isinstance(f, _DropTimeoutDisabledWarning) for f in logger.filters) == 1
        with caplog.at_level(logging.WARNING, logger=name):
            caplog.clear()
            logger.warning("Timeout is disabled as timeout_seconds is None")
            logger.warning("something else")
        assert [r.getMessage() for r in caplog.records] == ["something else"]


def test_a_grader_error_is_reported_with_its_message(monkeypatch):
    def boom(answer, reference):
        raise RuntimeError("x" * 1000)

    monkeypatch.setattr("xrpo.rewards.math.grade_answer", boom)
    r = MathVerifier(in_process=True)(r"\boxed{2}", "3")
    # the message is cut at 500 characters
    assert r == VerifyResult(
        0.0, "2", "error", {"source": "boxed", "method": "math_verify", "error": ("RuntimeError: " + "x" * 1000)[:500]}
    )


def test_repr():
    assert repr(MathVerifier(in_process=True)) == "MathVerifier(in_process)"
    assert repr(MathVerifier(workers=2, timeout=3.0)) == "MathVerifier(workers=2, timeout=3)"
