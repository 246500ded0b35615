"""Tests of xrpo.algo.allocation: XRPO Section 3.2, Eqs. (1)-(3), phased allocation, Algorithm 1 lines 2-13.

t quantiles used in the hand computations (two-sided 95%, t_{0.975, df}):
    df=1: 12.706204736   df=2: 4.302652730   df=3: 3.182446305   df=4: 2.776445105
    df=7:  2.364624252   df=8: 2.306004135
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal
from scipy import stats

from xrpo.algo.allocation import (
    PhasePlan,
    allocate_round,
    allocation_priority,
    exploration_bonus,
    plan_phases,
    split_budget,
    t_ci_half_width,
    uncertainty_reduction,
)

# ---------------------------------------------------------------------------------------------------------------
# slow reference twins (one scalar at a time, straight from the paper's formulas)
# ---------------------------------------------------------------------------------------------------------------


def ref_t_ci_half_width(std, n, alpha):
    std, n = np.broadcast_arrays(np.asarray(std, float), np.asarray(n, float))
    out = np.empty(std.shape)
    for i in np.ndindex(std.shape):
        out[i] = stats.t.ppf(1 - alpha / 2, n[i] - 1) * std[i] / math.sqrt(n[i])
    return out


def ref_uncertainty_reduction(std, n, alpha):
    std, n = np.broadcast_arrays(np.asarray(std, float), np.asarray(n, float))
    out = np.empty(std.shape)
    for i in np.ndindex(std.shape):
        # h(n) - h(n+1) with s held fixed
        h_n = stats.t.ppf(1 - alpha / 2, n[i] - 1) * std[i] / math.sqrt(n[i])
        h_n1 = stats.t.ppf(1 - alpha / 2, n[i]) * std[i] / math.sqrt(n[i] + 1)
        out[i] = h_n - h_n1
    return out


def ref_exploration_bonus(n, T, lam):
    n = np.asarray(n, float)
    out = np.empty(n.shape)
    for i in np.ndindex(n.shape):
        out[i] = lam * math.sqrt(math.log(1 + T) / n[i])
    return out


def ref_priority_one(s, n, T, alpha, lam):
    g = lambda m: stats.t.ppf(1 - alpha / 2, m - 1) / math.sqrt(m)  # noqa: E731
    return s * (g(n) - g(n + 1)) + lam * math.sqrt(math.log1p(T) / n)


def ref_allocation_priority(rewards_by_prompt, T, alpha=0.05, lam=0.1):
    out = []
    for r in rewards_by_prompt:
        r = np.asarray(r, float)
        out.append(ref_priority_one(float(np.std(r, ddof=1)), len(r), T, alpha, lam))
    return np.array(out)


def ref_split_budget(priority, budget, max_per_prompt=None):
    """Exact (Fraction) largest remainder with cap saturation, one prompt at a time."""
    p = [Fraction(float(x)) for x in priority]
    Q = len(p)
    caps = (
        [budget] * Q
        if max_per_prompt is None
        else ([int(max_per_prompt)] * Q if np.ndim(max_per_prompt) == 0 else [int(c) for c in max_per_prompt])
    )
    alloc = [0] * Q
    open_ = [q for q in range(Q) if caps[q] > 0]
    remaining = budget
    if budget == 0:
        return np.array(alloc)
    while True:
        total = sum(p[q] for q in open_)
        w = {q: (p[q] if total > 0 else Fraction(1)) for q in open_}
        tw = total if total > 0 else Fraction(len(open_))
        quota = {q: remaining * w[q] / tw for q in open_}
        sat = [q for q in open_ if quota[q] > caps[q]]
        if not sat:
            break
        for q in sat:
            alloc[q] = caps[q]
            remaining -= caps[q]
            open_.remove(q)
        if remaining == 0:
            return np.array(alloc)
    floors = {q: math.floor(quota[q]) for q in open_}
    left = remaining - sum(floors.values())
    # exact arithmetic: equal quotas mean equal priorities, so plain prompt order breaks every tie
    order = sorted(open_, key=lambda q: (-(quota[q] - floors[q]), q))
    for q in open_:
        alloc[q] = floors[q]
    for q in order:
        if left == 0:
            break
        if alloc[q] < caps[q]:
            alloc[q] += 1
            left -= 1
    return np.array(alloc)


def ref_greedy(rewards_by_prompt, budget, alpha=0.05, lam=0.1, max_per_prompt=None):
    """Recompute every Pi_q from scratch before each single rollout; argmax, ties -> fewer rollouts, lower index."""
    s = [float(np.std(np.asarray(r, float), ddof=1)) for r in rewards_by_prompt]
    n = [len(r) for r in rewards_by_prompt]
    Q = len(s)
    cap = budget if max_per_prompt is None else max_per_prompt
    alloc = [0] * Q
    for _ in range(budget):
        best = None
        for q in range(Q):
            if alloc[q] >= cap:
                continue
            m = n[q] + alloc[q]
            key = (-ref_priority_one(s[q], m, budget, alpha, lam), m, q)
            if best is None or key < best:
                best = key
        alloc[best[2]] += 1
    return np.array(alloc)


# ---------------------------------------------------------------------------------------------------------------
# Eq. (1), Eq. (2), phi: hand-computed
# ---------------------------------------------------------------------------------------------------------------

S_1001 = math.sqrt(1 / 3)  # rewards [1,0,0,1]: mean 0.5, squared deviations 4 * 0.25 = 1, var = 1/3, s = 0.5773502692


def test_t_ci_half_width_hand():
    # h(4) = t_{0.975,3} * s / sqrt(4) = 3.182446305 * 0.5773502692 / 2 = 0.9186931155
    assert_allclose(t_ci_half_width(S_1001, 4, 0.05), 0.9186931155, rtol=1e-9)
    # vectorised over prompts: s = [1, 2], n = [2, 5]
    # h = [12.706204736 * 1 / 1.414213562, 2.776445105 * 2 / 2.236067977] = [8.984643532, 2.483327996]
    assert_allclose(t_ci_half_width([1.0, 2.0], [2, 5], 0.05), [8.984643532, 2.483327996], rtol=1e-9)


def test_uncertainty_reduction_hand():
    # Delta(4) = s * (t_{.975,3}/sqrt(4) - t_{.975,4}/sqrt(5))
    #          = 0.5773502692 * (1.5912231526 - 1.2416639982) = 0.5773502692 * 0.3495591544 = 0.2018180719
    assert_allclose(uncertainty_reduction(S_1001, 4, 0.05), 0.2018180719, rtol=1e-9)
    # it is h(4) - h(5) with s fixed
    assert_allclose(
        uncertainty_reduction(S_1001, 4, 0.05),
        t_ci_half_width(S_1001, 4, 0.05) - t_ci_half_width(S_1001, 5, 0.05),
        rtol=1e-12,
    )


def test_uncertainty_reduction_zero_std_and_monotone():
    # all rewards equal: s = 0 -> Delta = 0 exactly, whatever n
    assert_array_equal(uncertainty_reduction(0.0, [2, 3, 100], 0.05), [0.0, 0.0, 0.0])
    # Delta is positive and shrinks as n grows (the t-interval shrinks ever slower)
    d = uncertainty_reduction(1.0, np.arange(2, 200), 0.05)
    assert np.all(d > 0) and np.all(np.diff(d) < 0)


def test_exploration_bonus_hand():
    # phi = 0.1 * sqrt(log(33) / 4) = 0.1 * sqrt(3.4965075615 / 4) = 0.1 * 0.9349475335 = 0.09349475335
    assert_allclose(exploration_bonus(4, 32, 0.1), 0.09349475335, rtol=1e-10)
    # T = 0 (nothing to allocate) or lam = 0: no bonus
    assert exploration_bonus(4, 0, 0.1) == 0.0
    assert exploration_bonus(4, 32, 0.0) == 0.0
    # n = 1 is allowed here (phi needs no quantile): sqrt(log(4)) = 1.1774100225
    assert_allclose(exploration_bonus(1, 3, 1.0), 1.1774100225, rtol=1e-10)


def test_t_quantile_is_scipy_t_ppf_bit_for_bit():
    from xrpo.algo.allocation import _t_quantile

    df = np.concatenate([np.arange(1, 2000), [5e3, 1e5, 1e7]]).astype(float)
    for alpha in (0.01, 0.05, 0.1, 0.3, 0.9):
        assert_array_equal(_t_quantile(1 - alpha / 2, df), stats.t.ppf(1 - alpha / 2, df))


def test_scalar_inputs_give_scalars_and_arrays_give_arrays():
    assert np.ndim(t_ci_half_width(1.0, 3, 0.1)) == 0
    assert t_ci_half_width(np.ones((2, 3)), 3, 0.1).shape == (2, 3)
    assert uncertainty_reduction(np.ones(4), np.array([2, 3, 4, 5]), 0.1).shape == (4,)
    assert exploration_bonus(np.array([[1, 2]]), 5, 0.1).shape == (1, 2)
    # the scalars are numpy float64 scalars (a float subclass), not 0-d arrays
    for v in (t_ci_half_width(1.0, 3, 0.1), uncertainty_reduction(1.0, 3, 0.1), exploration_bonus(3, 5, 0.1)):
        assert type(v) is np.float64


# ---------------------------------------------------------------------------------------------------------------
# Eq. (3): priority
# ---------------------------------------------------------------------------------------------------------------

HAND_PROMPTS = [
    [0.0, 0.0, 0.0, 0.0],  # s = 0: Pi = phi only = 0.0934947533
    [1.0, 0.0, 0.0, 1.0],  # s = 0.5773502692: Pi = 0.2018180719 + 0.0934947533 = 0.2953128253
    [1.0, 1.0, 1.0, 0.0],  # mean .75, squared dev 3*.0625 + .5625 = .75, var .25, s = .5:
    #                        Pi = .5 * 0.3495591544 + 0.0934947533 = 0.2682743305
]


def test_allocation_priority_hand():
    pi = allocation_priority(HAND_PROMPTS, 32)
    assert_allclose(pi, [0.0934947533, 0.2953128253, 0.2682743305], rtol=1e-9)


def test_allocation_priority_all_equal_rewards_is_bonus_only():
    # zero-success prompt and all-correct prompt alike: s = 0, only phi drives them (ICL seeding relies on this)
    pi = allocation_priority([[0, 0, 0], [1, 1, 1], [0.3, 0.3, 0.3]], 10, lam=0.2)
    assert_array_equal(pi, np.full(3, exploration_bonus(3, 10, 0.2)))
    # with lam = 0 they get exactly 0
    assert_array_equal(allocation_priority([[0.1] * 3, [1] * 5], 10, lam=0.0), [0.0, 0.0])


def test_allocation_priority_accepts_lists_tensors_and_uneven_lengths():
    prompts = [torch.tensor([1.0, 0.0, 0.0, 1.0]), [0, 1], np.array([1, 1, 0, 0, 1, 0, 1])]
    assert_allclose(allocation_priority(prompts, 16), ref_allocation_priority(prompts, 16), rtol=1e-12)


def test_allocation_priority_float32_and_int_arrays_are_computed_in_float64():
    # numpy arrays of another dtype than float64 are converted (exactly) to float64 before any arithmetic: the same
    # priorities, bit for bit, as the float64 arrays of the same values
    f32 = [np.array(r, dtype=np.float32) for r in ([0.1, 0.7, 0.3, 0.9], [0.2, 0.6, 0.6])]
    assert_array_equal(allocation_priority(f32, 32), allocation_priority([r.astype(np.float64) for r in f32], 32))
    ints = [np.array(r, dtype=np.int64) for r in HAND_PROMPTS]
    assert_array_equal(allocation_priority(ints, 32), allocation_priority(HAND_PROMPTS, 32))


def test_allocation_priority_one_rollout_raises_with_prompt_index():
    with pytest.raises(ValueError, match=r"rewards_by_prompt\[1\].*n_q >= 2"):
        allocation_priority([[0, 1], [1]], 8)
    with pytest.raises(ValueError, match=r"rewards_by_prompt\[0\]"):
        allocation_priority([[]], 8)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rewards_by_prompt=[[0, 1], [1, 0, np.nan]], T=4), r"rewards_by_prompt\[1\] must be finite.*position 2"),
        (dict(rewards_by_prompt=[[0, 1], [0, np.inf]], T=4), r"rewards_by_prompt\[1\] must be finite"),
        (dict(rewards_by_prompt=[[[0, 1]]], T=4), r"rewards_by_prompt\[0\] must be 1-D"),
        (dict(rewards_by_prompt=[], T=4), "at least one prompt"),
        (dict(rewards_by_prompt=[[0, 1]], T=-1), "T must be"),
        (dict(rewards_by_prompt=[[0, 1]], T=4, alpha=0.0), "alpha"),
        (dict(rewards_by_prompt=[[0, 1]], T=4, alpha=1.0), "alpha"),
        (dict(rewards_by_prompt=[[0, 1]], T=4, lam=-0.1), "lam"),
        (dict(rewards_by_prompt=[[0, 1]], T=4, lam=float("nan")), "lam"),
        (dict(rewards_by_prompt=[["a", "b"]], T=4), r"rewards_by_prompt\[0\]"),
    ],
)
def test_allocation_priority_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        allocation_priority(**kwargs)


@pytest.mark.parametrize(
    "fn, args, match",
    [
        (t_ci_half_width, (1.0, 1, 0.05), r"n must be >= 2.*index"),
        (t_ci_half_width, (1.0, 2.5, 0.05), "whole numbers"),
        (t_ci_half_width, (-1.0, 3, 0.05), "std must be >= 0"),
        (t_ci_half_width, (np.nan, 3, 0.05), "std must be finite"),
        (t_ci_half_width, (1.0, 3, 1.5), "alpha"),
        (uncertainty_reduction, (1.0, [3, 1], 0.05), r"n must be >= 2.*\(1,\)"),
        # n = 2 is allowed: the culprit is the 1 at index 1
        (uncertainty_reduction, (1.0, [2, 1], 0.05), r"found 1 at index \(1,\)"),
        (uncertainty_reduction, (1.0, 3, -0.1), "alpha"),
        (exploration_bonus, (0, 3, 0.1), "n must be >= 1"),
        (exploration_bonus, (2, -3, 0.1), "T must be"),
        (exploration_bonus, (2, 3, -0.1), "lam must be"),
        (exploration_bonus, (2, np.inf, 0.1), "T must be"),
    ],
)
def test_equation_functions_bad_input(fn, args, match):
    with pytest.raises(ValueError, match=match):
        fn(*args)


# ---------------------------------------------------------------------------------------------------------------
# split_budget: hand-computed, edge cases, properties
# ---------------------------------------------------------------------------------------------------------------


def test_split_budget_hand():
    # quotas 7 * [1, 2, 3] / 6 = [1.1667, 2.3333, 3.5]; floors [1, 2, 3] sum 6; 1 left -> largest remainder (.5)
    assert_array_equal(split_budget([1.0, 2.0, 3.0], 7), [1, 2, 4])
    # equal remainders: quotas 5/3 = 1.667 each; floors 1,1,1; the 2 left go to the first two prompts
    assert_array_equal(split_budget([1.0, 1.0, 1.0], 5), [2, 2, 1])
    # every priority 0 -> uniform, ties by prompt order
    assert_array_equal(split_budget([0.0, 0.0, 0.0], 5), [2, 2, 1])
    # a zero priority gets nothing while others are positive
    assert_array_equal(split_budget([0.0, 1.0, 3.0], 8), [0, 2, 6])
    # budget 0
    assert_array_equal(split_budget([0.2, 0.5], 0), [0, 0])
    # budget 1: quotas [.25, .75], floors [0, 0], the one rollout -> largest remainder (.75)
    assert_array_equal(split_budget([1.0, 3.0], 1), [0, 1])
    # max_per_prompt is keyword-only (a third positional argument is refused); priority and budget may be named
    with pytest.raises(TypeError):
        split_budget([1.0, 3.0], 2, 1)
    assert_array_equal(split_budget(priority=[1.0, 3.0], budget=2), [1, 1])
    assert split_budget([0.2, 0.5], 3).dtype == np.int64


def test_split_budget_cap_redistributes():
    # quotas 12 * [1, 1, 10] / 12 = [1, 1, 10]; prompt 2 capped at 5, 7 left over [1, 1] -> 3.5 each
    # -> floors [3, 3], 1 left -> prompt 0 (tie, earlier prompt)
    assert_array_equal(split_budget([1.0, 1.0, 10.0], 12, max_per_prompt=5), [4, 3, 5])
    # prompt 1 takes its cap 3 of 5; the 2 left fall on the zero-priority prompt (uniform among those still open)
    assert_array_equal(split_budget([0.0, 1.0], 5, max_per_prompt=3), [2, 3])
    # per-prompt caps; cap 0 excludes a prompt
    assert_array_equal(split_budget([5.0, 1.0, 1.0], 4, max_per_prompt=[0, 10, 10]), [0, 2, 2])
    # cap exactly tight: sum(caps) == budget
    assert_array_equal(split_budget([9.0, 1.0, 0.0], 6, max_per_prompt=2), [2, 2, 2])
    # a quota just above the cap: 3 * [1, 1, 4] / 6 = [.5, .5, 2], cap 1 -> prompt 2 takes 1; the 2 left are
    # re-split over [1, 1]: [1, 1]
    assert_array_equal(split_budget([1.0, 1.0, 4.0], 3, max_per_prompt=1), [1, 1, 1])
    # 10 * [1, 2, 3.3] / 6.3 = [1.587, 3.175, 5.238], cap 5 -> prompt 2 takes 5; 5 * [1, 2] / 3 = [1.667, 3.333]
    # -> floors [1, 3], 1 left -> prompt 0 (.667)
    assert_array_equal(split_budget([1.0, 2.0, 3.3], 10, max_per_prompt=5), [2, 3, 5])
    # 9 * [4, 4, 1] / 9 = [4, 4, 1] with cap 3: prompts 0, 1 take 3 each, prompt 2 takes the 3 left
    assert_array_equal(split_budget([4.0, 4.0, 1.0], 9, max_per_prompt=3), [3, 3, 3])
    # 5 * [2, 2, 1, 1] / 6 = [1.667, 1.667, .833, .833], cap 2 not reached: floors [1, 1, 0, 0], 3 left ->
    # remainders .833 (prompts 2, 3), then .667 (prompt 0 before prompt 1)
    assert_array_equal(split_budget([2.0, 2.0, 1.0, 1.0], 5, max_per_prompt=2), [2, 1, 1, 1])
    # a quota equal to its cap is not above it (no re-split): 5 * [0, 2, 3, 5] / 10 = [0, 1, 1.5, 2.5], prompt 1's
    # quota equals its cap 1; floors [0, 1, 1, 2] = 4, 1 left, remainders .5 tie -> earlier prompt 2
    assert_array_equal(split_budget([0.0, 2.0, 3.0, 5.0], 5, max_per_prompt=[3, 1, 3, 3]), [0, 1, 2, 2])


def test_split_budget_tie_rules():
    # equal remainders, different quotas: 2 * [1, 3] / 4 = [.5, 1.5] -> floors [0, 1], 1 left -> earlier prompt
    assert_array_equal(split_budget([1.0, 3.0], 2), [1, 1])
    # two priorities one ulp apart whose quotas collapse to the same float 2.5963587...: plain prompt order would
    # give [3, 2, 13] (the lower priority gets more); the collapsed pair is ordered by priority instead
    p = [0.19510739845680503, 0.19510739845680505, 0.962423093124381]
    assert p[0] < p[1]
    assert_array_equal(split_budget(p, 18), [2, 3, 13])


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (([1.0, 2.0], 7), dict(max_per_prompt=3), r"budget=7 cannot be placed.*at most 6"),
        (([1.0, 2.0], -1), {}, "budget must be an integer >= 0"),
        (([1.0, 2.0], 2.5), {}, "budget must be an integer"),
        (([1.0, -2.0], 3), {}, r"priority must be >= 0.*prompt 1"),
        (([0.0, -2.0], 3), {}, r"found -2.0 for prompt 1"),  # 0 is allowed: the culprit is prompt 1
        (([1.0, np.nan], 3), {}, "priority must be finite"),
        (([], 3), {}, "non-empty 1-D"),
        (([[1.0, 2.0]], 3), {}, "non-empty 1-D"),
        (([1.0, 2.0], 3), dict(max_per_prompt=-1), "max_per_prompt must be an integer >= 0"),
        (([1.0, 2.0], 3), dict(max_per_prompt=[1, 2, 3]), r"shape \(2,\)"),
        (([1.0, 2.0], 3), dict(max_per_prompt=[1.5, 2]), "whole numbers"),
    ],
)
def test_split_budget_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        split_budget(*args, **kwargs)


def test_split_budget_float_guard_takes_back_an_overcounted_rollout():
    # Budgets near 2**53 make a float quota round up onto an integer the exact quota lies below, so the floors sum
    # to budget + 1; the guard takes one back from the smallest remainder (lower priority, later prompt first),
    # never from a prompt whose floor is 0.
    # 8262283202968194 * [0, 13, 23, 10] / 46 = [0, 13, 23, 10] * 179614852238439 exactly; prompt 2's float quota
    # is 4131141601484098 (one above), so the guard must take it back from prompt 2 (remainder 0, the zero-priority
    # prompt 0 has floor 0)
    p, budget = np.array([0.0, 13.0, 23.0, 10.0]), 8262283202968194
    w = p / p.max()
    assert int(np.floor((w / w.sum()) * budget).sum()) == budget + 1  # the guard's branch is reached
    assert_array_equal(split_budget(p, budget), np.array([0, 13, 23, 10]) * 179614852238439)
    # 7942621060930140 * [3, 1, 1] / 5 = [3, 1, 1] * 1588524212186028 exactly; prompt 0's float quota is one above;
    # every remainder is 0, so the one taken back comes from the lower-priority pair, its later prompt: equal
    # priorities keep the earlier prompt's share >= the later one's
    p, budget = np.array([3.0, 1.0, 1.0]), 7942621060930140
    w = p / p.max()
    assert int(np.floor((w / w.sum()) * budget).sum()) == budget + 1
    a = split_budget(p, budget)
    assert a.sum() == budget and a[1] >= a[2]
    assert np.all(np.abs(a - np.array([3, 1, 1]) * 1588524212186028) <= 1)  # within one of the exact share


@pytest.mark.parametrize("seed", range(40))
def test_split_budget_matches_exact_reference(seed):
    rng = np.random.default_rng(seed)
    Q = int(rng.integers(1, 40))
    p = rng.random(Q) * rng.choice([1e-3, 1.0, 1e3])
    p[rng.random(Q) < 0.2] = 0.0  # some zero priorities
    if Q > 3:
        p[1] = p[2]  # an exact tie
    budget = int(rng.integers(0, 300))
    cap = None
    if seed % 3 == 1:  # scalar cap, from the tightest feasible one up
        cap = -(-budget // Q) + int(rng.integers(0, 4))
    elif seed % 3 == 2:  # per-prompt caps, kept feasible
        cap = rng.integers(0, -(-2 * budget // Q) + 2, Q)
        cap[0] += max(0, budget - int(cap.sum()))
    assert_array_equal(split_budget(p, budget, max_per_prompt=cap), ref_split_budget(p, budget, cap))


priorities = st.lists(st.floats(min_value=0.0, max_value=1e6, allow_nan=False), min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(p=priorities, budget=st.integers(0, 400), cap=st.one_of(st.none(), st.integers(0, 60)))
def test_split_budget_properties(p, budget, cap):
    p = np.array(p)
    if cap is not None and cap * len(p) < budget:
        with pytest.raises(ValueError, match="cannot be placed"):
            split_budget(p, budget, max_per_prompt=cap)
        return
    a = split_budget(p, budget, max_per_prompt=cap)
    assert a.sum() == budget  # exact sum
    assert np.all(a >= 0)  # non-negative
    if cap is not None:
        assert np.all(a <= cap)  # respects the cap
    # monotone: a higher priority never gets fewer rollouts than a lower one
    hi, lo = np.nonzero(p[:, None] > p[None, :])
    assert np.all(a[hi] >= a[lo])
    if cap is None and p.sum() > 0:
        # quota rule of largest remainder: every prompt is within one rollout of its exact share
        exact = np.array([float(Fraction(x) * budget / sum(map(Fraction, p))) for x in p])
        assert np.all(np.abs(a - exact) < 1 + 1e-9)


@settings(max_examples=200, deadline=None)
@given(
    q=st.integers(1, 40),
    value=st.sampled_from([0.0, 1e-300, 0.37, 5.0, 1e300]),
    budget=st.integers(0, 500),
    capped=st.booleans(),
)
def test_split_budget_uniform_when_equal(q, value, budget, capped):
    cap = -(-budget // q) if capped else None  # ceil(budget / q): the tightest feasible cap
    a = split_budget(np.full(q, value), budget, max_per_prompt=cap)
    assert a.sum() == budget
    assert a.max() - a.min() <= 1
    assert np.all(np.diff(a) <= 0)  # the extra ones go to the earliest prompts


# ---------------------------------------------------------------------------------------------------------------
# allocate_round
# ---------------------------------------------------------------------------------------------------------------


def test_allocate_round_proportional_hand():
    # Pi = [0.0934947533, 0.2953128253, 0.2682743305] (T = 32), sum 0.6570819091
    # quotas 32 * Pi / sum = [4.5532, 14.3818, 13.0650] -> floors [4, 14, 13] = 31; 1 left -> prompt 0 (.5532)
    assert_array_equal(allocate_round(HAND_PROMPTS, 32), [5, 14, 13])
    # cap 12 extra rollouts: prompts 1 and 2 saturate (14.38, 13.07 > 12), prompt 0 takes the other 8
    assert_array_equal(allocate_round(HAND_PROMPTS, 32, max_per_prompt=12), [8, 12, 12])


def test_allocate_round_greedy_hand():
    # prompt A = [1, 1] (s = 0, n = 2), prompt B = [0,1]*4 (s = 0.5345224838, n = 8), lam = 1, T = 3:
    #   phi(n) = sqrt(log(4) / n):  n=2: 0.8325546112, n=3: 0.6797779934, n=4: 0.5887050113, n=8: 0.4162773056
    #   Delta_B(8) = 0.5345224838 * (2.364624252/sqrt(8) - 2.306004135/3)
    #              = 0.5345224838 * (0.8360209216 - 0.7686680451) = 0.0360016269 -> Pi_B = 0.4522789325
    # greedy: Pi_A(2)=.833 > Pi_B -> A; Pi_A(3)=.680 > Pi_B -> A; Pi_A(4)=.589 > Pi_B -> A  => [3, 0]
    prompts = [[1.0, 1.0], [0.0, 1.0] * 4]
    assert_allclose(allocation_priority(prompts, 3, lam=1.0), [0.8325546112, 0.4522789325], rtol=1e-9)
    assert_array_equal(allocate_round(prompts, 3, lam=1.0, mode="greedy"), [3, 0])
    # proportional: quotas 3 * [.8326, .4523] / 1.2848 = [1.9440, 1.0560] -> floors [1, 1], 1 left -> A => [2, 1]
    assert_array_equal(allocate_round(prompts, 3, lam=1.0), [2, 1])
    # greedy with a cap of 2 extra: A takes 2, then B
    assert_array_equal(allocate_round(prompts, 3, lam=1.0, mode="greedy", max_per_prompt=2), [2, 1])
    # per-prompt caps: cap 0 keeps A out altogether (B takes all 3); cap 1 lets A take its one rollout first
    # (Pi_A(2) = .833 > Pi_B), then B takes the other 2
    assert_array_equal(allocate_round(prompts, 3, lam=1.0, mode="greedy", max_per_prompt=[0, 3]), [0, 3])
    assert_array_equal(allocate_round(prompts, 3, lam=1.0, mode="greedy", max_per_prompt=[1, 3]), [1, 2])
    # the prompt with the most rollouts takes the whole budget (its count reaches n_max + budget): a single prompt;
    # and with lam = 0, A has Pi_A = 0 exactly (s = 0) while Pi_B > 0, so B (n = 8) takes all 3
    assert_array_equal(allocate_round([[0.0, 1.0, 1.0]], 3, mode="greedy"), [3])
    assert_array_equal(allocate_round(prompts[::-1], 3, lam=0.0, mode="greedy"), [3, 0])
    # budget 1 (T = 1): phi(n) = sqrt(log(2) / n): Pi_A = sqrt(.6931471806 / 2) = 0.5887050113,
    # Pi_B = 0.0360016269 + sqrt(.6931471806 / 8) = 0.0360016269 + 0.2943525056 = 0.3303541325 -> A, in both modes
    assert_allclose(allocation_priority(prompts, 1, lam=1.0), [0.5887050113, 0.3303541325], rtol=1e-9)
    assert_array_equal(allocate_round(prompts, 1, lam=1.0, mode="greedy"), [1, 0])
    assert_array_equal(allocate_round(prompts, 1, lam=1.0), [1, 0])


def test_allocate_round_greedy_all_zero_priority_is_round_robin():
    # s = 0 everywhere and lam = 0: every Pi is 0; ties go to the prompt with fewer rollouts, then the earlier one
    assert_array_equal(allocate_round([[1, 1], [0, 0], [1, 1]], 7, lam=0.0, mode="greedy"), [3, 2, 2])
    assert_array_equal(allocate_round([[1, 1], [0, 0], [1, 1]], 7, lam=0.0), [3, 2, 2])


def test_allocate_round_zero_success_prompts_still_get_rollouts():
    # a prompt with no success (s = 0) is kept alive by phi for ICL seeding (Algorithm 1, line 10)
    a = allocate_round([[0, 0, 0, 0], [0, 1, 0, 1], [1, 1, 0, 1]], 64, lam=0.1)
    assert a.sum() == 64 and a[0] > 0


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("mode", ["proportional", "greedy"])
def test_allocate_round_matches_reference(seed, mode):
    rng = np.random.default_rng(seed)
    Q = int(rng.integers(1, 12))
    prompts = []
    for _ in range(Q):
        n = int(rng.integers(2, 9))
        kind = rng.integers(3)
        r = rng.random(n) if kind == 0 else (rng.random(n) < 0.5).astype(float) + 0.01 * rng.random(n) * (kind == 1)
        prompts.append(r)
    budget = int(rng.integers(0, 40))
    alpha = float(rng.choice([0.05, 0.1, 0.2]))
    lam = float(rng.choice([0.0, 0.1, 1.0]))
    cap = None if seed % 2 else int(rng.integers(-(-budget // Q), budget + 1))
    got = allocate_round(prompts, budget, alpha=alpha, lam=lam, max_per_prompt=cap, mode=mode)
    if mode == "greedy":
        want = ref_greedy(prompts, budget, alpha, lam, cap)
    else:
        want = ref_split_budget(ref_allocation_priority(prompts, budget, alpha, lam), budget, cap)
    assert_array_equal(got, want)


def test_allocate_round_bad_input():
    with pytest.raises(ValueError, match=r"mode must be one of \['proportional', 'greedy'\]"):
        allocate_round(HAND_PROMPTS, 4, mode="ucb")
    with pytest.raises(ValueError, match="budget must be an integer >= 0"):
        allocate_round(HAND_PROMPTS, -4)
    with pytest.raises(ValueError, match=r"rewards_by_prompt\[2\].*n_q >= 2"):
        allocate_round([[0, 1], [1, 1], [0]], 4)
    with pytest.raises(ValueError, match="cannot be placed"):
        allocate_round(HAND_PROMPTS, 10, max_per_prompt=3, mode="greedy")
    with pytest.raises(ValueError, match="alpha"):
        allocate_round(HAND_PROMPTS, 10, alpha=2.0)
    with pytest.raises(TypeError):  # alpha, lam, max_per_prompt and mode are keyword-only
        allocate_round(HAND_PROMPTS, 4, 0.05)


# ---------------------------------------------------------------------------------------------------------------
# plan_phases (Section 3.2 "phased rollout allocation", Algorithm 1 lines 2-5)
# ---------------------------------------------------------------------------------------------------------------


def test_plan_phases_paper_example():
    # 16 prompts, 128 rollouts, n_base 4: 16 * 4 = 64 base, then (128 - 64) / 2 = 32 + 32
    plan = plan_phases(16, 128, 4, 2)
    assert plan == PhasePlan(base_per_prompt=4, round_budgets=(32, 32))
    base, rounds = plan  # unpacks as a tuple
    assert base * 16 + sum(rounds) == 128


def test_plan_phases_uneven_and_degenerate():
    # remainder 65 over 2 rounds: the earlier round takes the extra one
    assert plan_phases(16, 129, 4, 2) == (4, (33, 32))
    assert plan_phases(3, 10, 2, 3) == (2, (2, 1, 1))
    assert plan_phases(4, 8, 2, 3) == (2, (0, 0, 0))
    assert plan_phases(4, 8, 2, 0) == (2, ())
    # the paper's largest setting: 64 prompts x 256 rollouts, n_base 128
    assert plan_phases(64, 64 * 256, 128, 2) == (128, (4096, 4096))
    # numpy integers in, Python ints out (the plan is logged as JSON)
    plan = plan_phases(np.int64(16), np.int64(129), np.int64(4), np.int64(2))
    assert plan == (4, (33, 32))
    assert type(plan.base_per_prompt) is int and all(type(b) is int for b in plan.round_budgets)
    assert json.loads(json.dumps(plan)) == [4, [33, 32]]


@pytest.mark.parametrize(
    "args, match",
    [
        ((16, 128, 1, 2), r"n_base must be >= 2"),
        ((16, 63, 4, 2), r"total_budget=63 is smaller than the base phase.*4 \* 16 = 64"),
        ((0, 128, 4, 2), "num_prompts must be >= 1"),
        ((16, 128, 4, -1), "rounds must be an integer >= 0"),
        ((16, 130, 4, 0), "rounds=0 leaves 66"),
        ((16, -5, 4, 2), "total_budget must be an integer >= 0"),
        ((16.5, 128, 4, 2), "num_prompts must be an integer"),
    ],
)
def test_plan_phases_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        plan_phases(*args)


# ---------------------------------------------------------------------------------------------------------------
# vectorised equation functions vs their twins
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_equation_functions_match_reference(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(x) for x in rng.integers(1, 6, size=int(rng.integers(1, 3))))
    std = rng.random(shape) * 3
    std[rng.random(shape) < 0.2] = 0.0
    n = rng.integers(2, 300, size=shape)
    alpha = float(rng.uniform(0.01, 0.5))
    T = int(rng.integers(0, 5000))
    lam = float(rng.uniform(0, 2))
    assert_allclose(t_ci_half_width(std, n, alpha), ref_t_ci_half_width(std, n, alpha), rtol=1e-13)
    assert_allclose(
        uncertainty_reduction(std, n, alpha), ref_uncertainty_reduction(std, n, alpha), rtol=1e-12, atol=1e-15
    )
    assert_allclose(exploration_bonus(n, T, lam), ref_exploration_bonus(n, T, lam), rtol=1e-13)


@pytest.mark.parametrize("seed", range(8))
def test_allocation_priority_matches_reference(seed):
    rng = np.random.default_rng(seed)
    prompts = [
        rng.random(int(rng.integers(2, 50))) * rng.choice([1, 100]) + rng.choice([0, 1e3])
        for _ in range(int(rng.integers(1, 30)))
    ]
    prompts.append(np.full(5, 0.7))  # constant prompt: s must be exactly 0
    T = int(rng.integers(0, 1000))
    got = allocation_priority(prompts, T, alpha=0.1, lam=0.3)
    assert_allclose(got, ref_allocation_priority(prompts, T, 0.1, 0.3), rtol=1e-9)
    assert got[-1] == exploration_bonus(5, T, 0.3)
