"""Tests for xrpo.algo.passk: pass@k against hand tables and the combinatorial formula, majority vote rules."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import numpy as np
import pytest

from xrpo.algo.passk import majority_vote, mean_majority_vote, mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        # 1 - (1 - 2/4)(1 - 2/5) = 1 - (2/4)(3/5) = 0.7
        (5, 2, 2, 0.7),
        # pass@1 = c / n
        (5, 2, 1, 0.4),
        (32, 7, 1, 7 / 32),
        # no correct sample -> 0; all correct -> 1
        (5, 0, 3, 0.0),
        (5, 5, 1, 1.0),
        # k = n: 1 if any sample is correct
        (4, 1, 4, 1.0),
        (4, 0, 4, 0.0),
        # n - c < k: every subset of size k holds a correct sample
        (5, 3, 3, 1.0),
        # 1 - (1 - 3/9)(1 - 3/10) = 1 - (6/9)(7/10) = 1 - 42/90
        (10, 2, 3, 1 - 42 / 90),
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_hand_table(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-14, abs=1e-15)


def test_pass_at_k_matches_combinatorial_formula():
    for n in range(1, 25):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - Fraction(comb(n - c, k), comb(n, k))
                assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-14), (n, c, k)


@pytest.mark.parametrize(("n", "c", "k"), [(1000, 10, 100), (256, 1, 128), (500, 250, 7), (64, 3, 63)])
def test_pass_at_k_large_n_stable(n, c, k):
    # the product form stays accurate where C(n, k) has hundreds of digits
    exact = 1 - Fraction(comb(n - c, k), comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


def test_pass_at_k_returns_a_python_float():
    # a plain float (results.json, logs), not numpy's float64, on both branches (product form and n - c < k)
    assert type(pass_at_k(5, 2, 2)) is float and type(pass_at_k(5, 4, 2)) is float
    assert type(pass_at_k(np.int64(5), np.int64(2), np.int64(2))) is float


def test_pass_at_k_accepts_numpy_integers():
    assert pass_at_k(np.int64(5), np.int32(2), np.int64(2)) == pytest.approx(0.7)


@pytest.mark.parametrize(
    ("args", "arg"),
    [
        ((5, 2, 6), "k"),
        ((5, 2, 0), "k"),
        ((5, 6, 1), "c"),
        ((5, -1, 1), "c"),
        ((0, 0, 1), "n"),
        ((-3, 0, 1), "n"),
        ((5.0, 2, 1), "n"),
        ((5, 2, 1.5), "k"),
        ((5, True, 1), "c"),
    ],
)
def test_pass_at_k_validation(args, arg):
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        pass_at_k(*args)


def test_majority_vote_plurality():
    # "12" appears 3 times, "7" twice
    assert majority_vote(["12", "7", "12", "7", "12"], [True, False, True, False, True]) is True
    assert majority_vote(["7", "12", "7"], [False, True, False]) is False


def test_majority_vote_ties_go_to_first_occurrence():
    # "b" and "a" both appear twice; "b" occurs first
    assert majority_vote(["b", "a", "a", "b"], [False, True, True, False]) is False
    assert majority_vote(["a", "b", "b", "a"], [True, False, False, True]) is True


def test_majority_vote_none_never_wins():
    # three unparseable answers outnumber the single parsed one, which still wins
    assert majority_vote([None, None, "3", None], [False, False, True, False]) is True
    assert majority_vote([None, None, None], [False, False, False]) is False
    assert majority_vote([], []) is False


def test_majority_vote_uses_first_occurrence_verdict():
    # precisely: correct[i] at the first occurrence of the winning answer
    assert majority_vote(["x", "x", "y"], [False, True, True]) is False
    assert majority_vote(["y", "x", "x"], [False, True, False]) is True


def test_majority_vote_accepts_numpy_bools():
    assert majority_vote(["1", "1"], list(np.array([True, True]))) is True


def test_majority_vote_validation():
    with pytest.raises(ValueError, match="correct"):
        majority_vote(["1", "2"], [True])
    with pytest.raises(ValueError, match=r"correct\[1\]"):
        majority_vote(["1", "2"], [True, 1])
    with pytest.raises(ValueError, match=r"answers\[0\]"):
        majority_vote([["1"]], [True])


def test_mean_pass_at_k():
    # (0.7 + 0 + 1) / 3
    assert mean_pass_at_k([5, 4, 3], [2, 0, 3], 2) == pytest.approx(1.7 / 3, rel=1e-14)
    with pytest.raises(ValueError, match="problem 1: k"):
        mean_pass_at_k([5, 1], [2, 0], 2)
    with pytest.raises(ValueError, match="cs"):
        mean_pass_at_k([5, 4], [2], 2)
    with pytest.raises(ValueError, match="ns"):
        mean_pass_at_k([], [], 1)


def test_mean_majority_vote():
    answers = [["1", "1", "2"], [None, None], ["a", "b"]]
    correct = [[True, True, False], [False, False], [False, True]]
    # problem 0: "1" wins, correct; problem 1: nothing parsed; problem 2: tie -> "a", wrong -> 1/3
    assert mean_majority_vote(answers, correct) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="problem 0: correct"):
        mean_majority_vote([["1"]], [[True, False]])
    with pytest.raises(ValueError, match="correct_per_problem"):
        mean_majority_vote([["1"]], [])
    with pytest.raises(ValueError, match="answers_per_problem"):
        mean_majority_vote([], [])
