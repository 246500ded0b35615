"""Tests of xrpo.algo.knapsack (Knapsack RL's value and solvers, and the rule read from its description): the value,
the estimate of p with its fallbacks, the exact DP against brute force, the concave fast path against the DP.
Hand-computed cases with the arithmetic in comments."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from xrpo.algo.knapsack import (
    concave_allocation,
    info_gain,
    knapsack_allocation,
    knapsack_dp,
    knapsack_values,
    last_visit_rate,
)


def _brute_force(values: np.ndarray, budget: int, lo, hi) -> float:
    """The reference twin: the best total over every allocation within the bounds summing to the budget."""
    Q = values.shape[0]
    lo = np.broadcast_to(lo, (Q,))
    hi = np.broadcast_to(hi, (Q,))
    best = -np.inf
    for n in itertools.product(*(range(int(a), int(b) + 1) for a, b in zip(lo, hi))):
        if sum(n) == budget:
            best = max(best, sum(values[i, k] for i, k in enumerate(n)))
    return best


def _total(values, counts) -> float:
    return float(sum(values[i, int(k)] for i, k in enumerate(counts)))


# ---------------------------------------------------------------------------------------------------------------
# the value
# ---------------------------------------------------------------------------------------------------------------


def test_info_gain_hand():
    # p (1 - p)^2: 0 at 0 and 1; 1/3 * (2/3)^2 = 4/27 (the maximum); 1/2 * 1/4 = 1/8; 2/3 * 1/9 = 2/27
    assert_allclose(info_gain([0.0, 1 / 3, 0.5, 2 / 3, 1.0]), [0.0, 4 / 27, 0.125, 2 / 27, 0.0], rtol=0, atol=1e-16)
    with pytest.raises(ValueError, match="p must lie in \\[0, 1\\]"):
        info_gain([1.5])


def test_knapsack_values_hand():
    v = knapsack_values([0.5, 1 / 3], 3)
    # p = 1/2, InfoGain 1/8: P(non-zero) = 0, 0, 1 - 2/4 = 1/2, 1 - 2/8 = 3/4 -> 0, 0, 1/16, 3/32
    assert_allclose(v[0], [0.0, 0.0, 1 / 16, 3 / 32], rtol=0, atol=1e-16)
    # p = 1/3, InfoGain 4/27: P = 0, 0, 1 - 1/9 - 4/9 = 4/9, 1 - 1/27 - 8/27 = 2/3 -> 16/243, 8/81
    assert_allclose(v[1], [0.0, 0.0, 16 / 243, 8 / 81], rtol=0, atol=1e-16)


def test_last_visit_rate_hand_and_fallbacks():
    # 3 of 8 -> 3/8; 0 of 8 -> Jeffreys (0 + 1/2) / 9 = 1/18; 8 of 8 -> 8.5 / 9 = 17/18;
    # never seen -> the seen prompts' pooled rate (3 + 0 + 8) / 24 = 11/24
    p = last_visit_rate([3, 0, 8, 0], [8, 8, 8, 0])
    assert_allclose(p, [3 / 8, 1 / 18, 17 / 18, 11 / 24], rtol=0, atol=1e-16)
    assert_allclose(last_visit_rate([3, 0], [8, 0], prior_rate=0.3), [3 / 8, 0.3], rtol=0, atol=1e-16)
    # nothing seen: 1/2; every seen prompt at 0: the pooled rate 0 would make unseen prompts worthless -> 1/2
    assert_allclose(last_visit_rate([0, 0], [0, 0]), [0.5, 0.5])
    assert_allclose(last_visit_rate([0, 0], [4, 0]), [0.1, 0.5], rtol=0, atol=1e-16)  # 0.5 / 5
    with pytest.raises(ValueError, match="successes must not exceed trials.*index 1"):
        last_visit_rate([0, 5], [4, 4])
    with pytest.raises(ValueError, match="prior_rate must lie in \\(0, 1\\)"):
        last_visit_rate([0], [0], prior_rate=0.0)
    with pytest.raises(ValueError, match="whole numbers"):
        last_visit_rate([0.5], [1])


# ---------------------------------------------------------------------------------------------------------------
# the DP and the concave fast path
# ---------------------------------------------------------------------------------------------------------------


def test_knapsack_dp_hand():
    # row 0: 0, 0, 5, 6, 6.5 (concave from n = 2); row 1: 0, 0, 4, 7, 8 (not concave: increments 0, 4, 3, 1)
    v = np.array([[0, 0, 5, 6, 6.5], [0, 0, 4, 7, 8]], dtype=float)
    # B = 4: (0,4) 8, (1,3) 7, (2,2) 9, (3,1) 6, (4,0) 6.5 -> (2, 2)
    assert_array_equal(knapsack_dp(v, 4), [2, 2])
    # B = 5: (1,4) 8, (2,3) 12, (3,2) 10, (4,1) 6.5 -> (2, 3)
    assert_array_equal(knapsack_dp(v, 5), [2, 3])
    # B = 5 with n_max = 2 for row 1: (3,2) 10 is the only choice with row 1 <= 2 besides (4,1) 6.5
    assert_array_equal(knapsack_dp(v, 5, 0, [4, 2]), [3, 2])
    # bounds that leave one allocation: n_min = n_max
    assert_array_equal(knapsack_dp(v, 3, [1, 2], [1, 2]), [1, 2])


def test_knapsack_dp_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(300):
        Q, W = int(rng.integers(1, 5)), int(rng.integers(0, 7))
        v = rng.normal(size=(Q, W + 1))
        if rng.random() < 0.3:
            v = np.round(v)  # ties
        lo = rng.integers(0, 3, Q).clip(max=W)
        hi = np.maximum(lo, rng.integers(0, W + 1, Q))
        B = int(rng.integers(lo.sum(), hi.sum() + 1))
        n = knapsack_dp(v, B, lo, hi)
        assert n.sum() == B and np.all(n >= lo) and np.all(n <= hi)
        # the DP's total is the best total over every allocation (same sums, same order: equal to the last bit
        # up to the order of Q additions, ~Q ulps of the totals' size)
        assert _total(v, n) == pytest.approx(_brute_force(v, B, lo, hi), abs=1e-12)


def test_concave_allocation_matches_the_dp_on_concave_rows():
    rng = np.random.default_rng(1)
    for _ in range(300):
        Q, W = int(rng.integers(1, 6)), int(rng.integers(1, 12))
        # concave rows: cumulative sums of non-increasing increments (integers half the time: many ties)
        inc = -np.sort(-rng.normal(size=(Q, W)), axis=1)
        if rng.random() < 0.5:
            inc = -np.sort(-rng.integers(-2, 3, size=(Q, W)).astype(float), axis=1)
        v = np.concatenate([np.zeros((Q, 1)), np.cumsum(inc, axis=1)], axis=1)
        lo = rng.integers(0, 3, Q).clip(max=W)
        hi = np.maximum(lo, rng.integers(0, W + 1, Q))
        B = int(rng.integers(lo.sum(), hi.sum() + 1))
        g = concave_allocation(v, B, lo, hi)
        d = knapsack_dp(v, B, lo, hi)
        assert g.sum() == B and np.all(g >= lo) and np.all(g <= hi)
        assert _total(v, g) == pytest.approx(_total(v, d), abs=1e-12)


def test_concave_allocation_refuses_a_non_concave_row():
    v = np.array([[0.0, 0.0, 1.0, 1.5]])  # increments 0, 1, 0.5: rising first
    with pytest.raises(ValueError, match="concave"):
        concave_allocation(v, 2)


def test_bounds_are_checked():
    v = np.zeros((2, 4))
    with pytest.raises(ValueError, match="budget=7 cannot be placed.*sum\\(n_max\\) = 6"):
        knapsack_dp(v, 7)
    with pytest.raises(ValueError, match="budget=1 cannot be placed.*sum\\(n_min\\) = 2"):
        knapsack_dp(v, 1, 1)
    with pytest.raises(ValueError, match="n_min\\[0\\] = 3 exceeds n_max\\[0\\] = 2"):
        knapsack_dp(v, 4, [3, 0], [2, 3])
    with pytest.raises(ValueError, match="exceeds the values table"):
        knapsack_dp(v, 4, 0, [4, 0])
    with pytest.raises(ValueError, match="values must be finite"):
        knapsack_dp(np.array([[0.0, np.inf]]), 1)


# ---------------------------------------------------------------------------------------------------------------
# the whole rule
# ---------------------------------------------------------------------------------------------------------------


def test_knapsack_allocation_hand():
    # last visits 4 of 8 (p = 1/2) and 3 of 9 (p = 1/3). Increments of the value from n to n + 1 (n >= 1):
    #   w p q (p^(n-1) + q^(n-1)):  p = 1/2: 1/8 * 1/4 * 2 * (1/2)^(n-1) -> n = 2: 1/32 = 0.03125, n = 3: 0.015625
    #                               p = 1/3: 4/27 * 2/9 * ((1/3)^(n-1) + (2/3)^(n-1)) -> n = 2: 8/243 = 0.032922,
    #                                        n = 3: 8/243 * 5/9 = 0.018290, n = 4: 8/243 * 1/3 = 0.010974
    # from (2, 2), budget 6: the two largest, 0.032922 (p = 1/3) and 0.03125 (p = 1/2) -> (3, 3)
    assert_array_equal(knapsack_allocation([4, 3], [8, 9], 6), [3, 3])
    # budget 7: next 0.018290 (p = 1/3, 3 -> 4) -> (3, 4); budget 8: next 0.015625 (p = 1/2, 3 -> 4) -> (4, 4)
    assert_array_equal(knapsack_allocation([4, 3], [8, 9], 7), [3, 4])
    assert_array_equal(knapsack_allocation([4, 3], [8, 9], 8), [4, 4])
    # the budget at n_min * Q: every prompt at n_min
    assert_array_equal(knapsack_allocation([4, 3], [8, 9], 4), [2, 2])


def test_leftover_fallback_gives_never_solved_prompts_what_the_others_cannot_take():
    # 4 of 8 (valued, p = 1/2) and 0 of 8 (never solved: value 0, n_min = 2). Budget 12: the valued prompt takes
    # all it can, 12 - 2 = 10 -> (10, 2); capped at n_max = 6 it takes 6 and the 4 left go to the never-solved one
    assert_array_equal(knapsack_allocation([4, 0], [8, 8], 12), [10, 2])
    assert_array_equal(knapsack_allocation([4, 0], [8, 8], 12, n_max=6), [6, 6])
    # + an always-solved prompt (8 of 8), budget 18, n_max 6: valued 6; the 18 - 6 - 2 - 2 = 8 left go to the
    # never-solved prompt first (+4, to its cap) and then to the always-solved one (+4)
    assert_array_equal(knapsack_allocation([4, 0, 8], [8, 8, 8], 18, n_max=6), [6, 6, 6])
    # nothing valued: the budget spread evenly over the never-solved prompts
    assert_array_equal(knapsack_allocation([0, 0], [8, 8], 10), [5, 5])
    with pytest.raises(ValueError, match="fallback must be 'leftover' or 'jeffreys'"):
        knapsack_allocation([0], [8], 2, fallback="prior")


def test_jeffreys_fallback_values_never_solved_prompts():
    # fallback="jeffreys": 0 of 8 is valued at p = 1/18, InfoGain w = (1/18)(17/18)^2. Increments from n to n + 1,
    # w p q (p^(n-1) + q^(n-1)):
    #   p = 1/2:  2^-(n+3)               -> n = 2..6: 1/32, 1/64, 1/128, 1/256, 1/512 = 0.00195312
    #   p = 1/18: w (17/324) (...)       -> n = 2..6: 0.0026001, 0.0023272, 0.0021908, 0.0020687, 0.0019537
    # budget 12 = 2 + 2 + 8: the 8 largest are p = 1/2's first four and p = 1/18's first four -> (6, 6);
    # budget 13: the 9th is p = 1/18's 0.0019537 > p = 1/2's 0.0019531 -> (6, 7)
    assert_array_equal(knapsack_allocation([4, 0], [8, 8], 12, fallback="jeffreys"), [6, 6])
    assert_array_equal(knapsack_allocation([4, 0], [8, 8], 13, fallback="jeffreys"), [6, 7])


def test_n_min_zero_uses_the_dp_and_matches_brute_force():
    rng = np.random.default_rng(2)
    for _ in range(50):
        Q = int(rng.integers(1, 4))
        trials = rng.integers(0, 9, Q)
        succ = rng.binomial(trials, rng.random(Q))
        B = int(rng.integers(0, 9))
        n = knapsack_allocation(succ, trials, B, n_min=0, fallback="jeffreys")
        v = knapsack_values(last_visit_rate(succ, trials), B)
        assert n.sum() == B
        assert _total(v, n) == pytest.approx(_brute_force(v, B, 0, B), abs=1e-15)


def test_knapsack_allocation_refuses_an_impossible_budget():
    with pytest.raises(ValueError, match="budget=3 must lie in \\[n_min \\* prompts, n_max \\* prompts\\] = \\[4, "):
        knapsack_allocation([1, 1], [2, 2], 3)
    with pytest.raises(ValueError, match="= \\[4, 8\\]"):
        knapsack_allocation([1, 1], [2, 2], 9, n_max=4)


# ---------------------------------------------------------------------------------------------------------------
# what a generated-mutant survey found unchecked: the messages' indices, the edges of the estimate, the
# bounds' defaults, the concavity check's round-off allowance, the fallback's one-rollout remainder
# ---------------------------------------------------------------------------------------------------------------


def test_bad_counts_are_named_at_their_own_index():
    # a 0 before the bad entry is fine: the message names the -1 (index 1) and the 2.5 (index 1), not the 0
    with pytest.raises(ValueError, match=r"successes must hold whole numbers >= 0; found -1.0 at index \(1,\)"):
        last_visit_rate([0, -1], [1, 1])
    with pytest.raises(ValueError, match=r"trials must hold whole numbers >= 0; found 2.5 at index \(1,\)"):
        last_visit_rate([0, 0], [0, 2.5])
    # the first prompt whose successes exceed its trials: 1 of 1 is fine, 5 of 4 is not
    with pytest.raises(ValueError, match=r"found 5 > 4 at index 1"):
        last_visit_rate([1, 5], [1, 4])
    v = np.zeros((2, 4))
    with pytest.raises(ValueError, match=r"n_max\[1\] = 4 exceeds the values table, which stops at n = 3"):
        knapsack_dp(v, 4, 0, [3, 4])
    with pytest.raises(ValueError, match=r"n_min\[1\] = 3 exceeds n_max\[1\] = 2"):
        knapsack_dp(v, 4, [1, 3], [1, 2])


@pytest.mark.parametrize("budget", [True, 2.0, -1, "2"])
def test_budget_must_be_an_integer(budget):
    with pytest.raises(ValueError, match=r"budget must be an integer >= 0, got"):
        knapsack_dp(np.zeros((1, 3)), budget)
    with pytest.raises(ValueError, match=r"budget must be an integer >= 0, got"):
        knapsack_allocation([1], [2], budget, n_min=0)


def test_shapes_are_checked_with_their_messages():
    for p in ([[0.5]], []):
        with pytest.raises(ValueError, match=r"p must be a non-empty 1-D array \(one rate per prompt\)"):
            knapsack_values(p, 3)
    for k in ([[1]], []):
        with pytest.raises(ValueError, match=r"successes must be a non-empty 1-D array \(one count per prompt\)"):
            last_visit_rate(k, k)
    for v in (np.zeros(3), np.zeros((0, 3))):
        with pytest.raises(ValueError, match=r"values must have shape \(prompts, counts \+ 1\)"):
            knapsack_dp(v, 0)


def test_last_visit_rate_edges():
    # one rollout is a visit: 0 of 1 and 1 of 1 get Jeffreys' (k + 1/2) / 2; the unseen prompt the pooled 1/3
    assert_allclose(last_visit_rate([0, 1, 0], [1, 2, 0]), [0.25, 0.5, 1 / 3], rtol=0, atol=1e-16)
    assert_allclose(last_visit_rate([1, 0], [1, 0]), [0.75, 0.5], rtol=0, atol=1e-16)  # pooled 1/1 = 1 -> 1/2
    # every seen prompt always solved: a pooled rate of 1 would make unseen prompts worthless too -> 1/2
    assert_allclose(last_visit_rate([4, 0], [4, 0]), [0.9, 0.5], rtol=0, atol=1e-16)
    for bad in (1.0, float("nan"), -0.5):
        with pytest.raises(ValueError, match=r"prior_rate must lie in \(0, 1\)"):
            last_visit_rate([0], [0], prior_rate=bad)


def test_knapsack_dp_default_bounds():
    # n_min defaults to 0: with budget 2 over two prompts, (2, 0) is best (5 against (1, 1)'s 0 and (0, 2)'s 4)
    v = np.array([[0, 0, 5, 6, 6.5], [0, 0, 4, 7, 8]], dtype=float)
    assert_array_equal(knapsack_dp(v, 2), [2, 0])


def test_concavity_allows_the_round_off_of_large_values():
    # each row: 0, then 1e6 + 0.1 (n - 1): increments 1e6, 0.1, 0.1, ... (concave); in float64 the 0.1 steps at
    # 1e6 differ by up to one spacing (1.2e-10), which the check allows (1e-12 of the largest |value| = 1e-6)
    row = [0.0] + [1e6 + 0.1 * n for n in range(12)]
    v = np.array([row, row])
    assert np.diff(v[:, 1:], n=2, axis=1).max() > 1e-12  # the round-off is there
    got, dp = concave_allocation(v, 10), knapsack_dp(v, 10)
    assert got.sum() == 10
    # equal totals up to the round-off of two values near 1e6 (a few spacings of 2.3e-10)
    assert _total(v, got) == pytest.approx(_total(v, dp), abs=1e-9)


def test_knapsack_allocation_is_keyword_only_after_the_budget():
    with pytest.raises(TypeError):
        knapsack_allocation([1], [2], 2, 2)


def test_only_prompts_seen_and_never_or_always_solved_fall_back():
    # an unseen prompt (0 of 0) is valued at the pooled rate 1/2, like the 4 of 8 beside it: an even split
    assert_array_equal(knapsack_allocation([4, 0], [8, 0], 8), [4, 4])
    # 0 of 1 and 1 of 1 are never / always solved: n_min for them, the rest to the valued prompt
    assert_array_equal(knapsack_allocation([4, 0], [8, 1], 8), [6, 2])
    assert_array_equal(knapsack_allocation([4, 1], [8, 1], 8), [6, 2])


def test_leftover_of_one_rollout():
    # the valued prompt is capped at 6: the one rollout left goes to the never-solved prompt ...
    assert_array_equal(knapsack_allocation([4, 0], [8, 8], 9, n_max=6), [6, 3])
    # ... or, with no never-solved prompt, to the always-solved one
    assert_array_equal(knapsack_allocation([4, 8], [8, 8], 9, n_max=6), [6, 3])
