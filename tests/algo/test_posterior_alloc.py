"""Tests of xrpo.algo.posterior_alloc (xrpo-plus): the prior fits, the posterior, the posterior-predictive
value of more rollouts, and the round's allocation against brute force. Hand-computed cases with the arithmetic in
comments."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from xrpo.algo.posterior_alloc import (
    expected_informative,
    fit_beta_prior,
    group_mixed_prob,
    group_value,
    posterior_allocation,
    posterior_params,
)


def _objective(k, m, x, power: float = 1.0, **kw) -> float:
    """sum_i V_i(x_i) (G_i(x_i) at power 1) under the posterior posterior_allocation uses (same keyword arguments)."""
    a, b = posterior_params(k, m, **kw)
    g = [
        group_value(a[i : i + 1], b[i : i + 1], k[i : i + 1], m[i : i + 1], [x[i]], power)[0, 0] for i in range(len(k))
    ]
    return float(sum(g))


def _brute_force(k, m, budget, caps, power: float = 1.0, **kw) -> float:
    """The reference twin: the best sum_i V_i(x_i) over every allocation within the caps summing to the budget."""
    best = -np.inf
    for x in itertools.product(*(range(int(c) + 1) for c in caps)):
        if sum(x) == budget:
            best = max(best, _objective(k, m, x, power, **kw))
    return best


# ---------------------------------------------------------------------------------------------------------------
# the prior and the posterior
# ---------------------------------------------------------------------------------------------------------------


def test_fit_beta_prior_variance_hand():
    # rates 0, 1/2, 1, 1/2 of n = 2: mu = 1/2, S^2 = (1/4 + 0 + 1/4 + 0) / 3 = 1/6, c = mean(1/n) = 1/2
    # rho = (S^2 / (mu (1 - mu)) - c) / (1 - c) = (2/3 - 1/2) / (1/2) = 1/3 -> s = 1/rho - 1 = 2 -> Beta(1, 1)
    a, b = fit_beta_prior([0, 1, 2, 1], [2, 2, 2, 2], moment="variance")
    assert (a, b) == pytest.approx((1.0, 1.0), abs=1e-12)


def test_fit_beta_prior_flat_share_hand():
    # k = 0, 2, 0, 2, 1, 1 of n = 2: mu = 1/2; flat groups (0 or 2 of 2): 4 of 6 = 2/3
    # under Beta(s/2, s/2): E[p^2] + E[(1-p)^2] = 2 (s/2)(s/2 + 1) / (s (s + 1)) = (s + 2) / (2 (s + 1))
    # (s + 2) / (2 s + 2) = 2/3  ->  3 s + 6 = 4 s + 4  ->  s = 2 -> Beta(1, 1) (bisection: to ~1e-8 relative)
    a, b = fit_beta_prior([0, 2, 0, 2, 1, 1], [2] * 6)
    assert (a, b) == pytest.approx((1.0, 1.0), rel=1e-7)
    # no flat group beyond binomial noise (share 0 <= mu^2 + (1 - mu)^2 = 1/2 at s -> inf): the strongest prior
    a, b = fit_beta_prior([1, 1, 1, 1], [2] * 4)
    assert (a + b, a / (a + b)) == pytest.approx((1000.0, 0.5))
    # every group flat (share 1 > the weakest prior's): the weakest prior, at the mean rate 1/2
    a, b = fit_beta_prior([0, 2, 0, 2], [2] * 4)
    assert (a + b, a / (a + b)) == pytest.approx((0.05, 0.5))


def test_fit_beta_prior_edges():
    assert fit_beta_prior([0, 0], [0, 0]) == (1.0, 1.0)  # nothing seen
    # one prompt seen: strength 2 at its rate (3 + 0.5 * 0) / 4... the mean rate 3/4
    a, b = fit_beta_prior([3, 0], [4, 0])
    assert (a, b) == pytest.approx((1.5, 0.5))
    # no success in the batch: mu = e = 1 / (2 (8 + 1)) = 1/18, not 0
    a, b = fit_beta_prior([0, 0], [4, 4])
    assert a / (a + b) == pytest.approx(1 / 18)
    with pytest.raises(ValueError, match="moment must be 'flat' or 'variance'"):
        fit_beta_prior([1], [2], moment="ml")
    with pytest.raises(ValueError, match="min_strength <= max_strength"):
        fit_beta_prior([1], [2], min_strength=2, max_strength=1)


def test_posterior_params_hand():
    # Beta(1, 1) prior, 1 of 4 this step, 3 of 8 before at weight 1/2:
    # alpha = 1 + 1 + 0.5 * 3 = 3.5,  beta = 1 + 3 + 0.5 * 5 = 6.5
    a, b = posterior_params([1], [4], history_successes=[3], history_trials=[8], history_weight=0.5)
    assert_allclose((a, b), ([3.5], [6.5]), rtol=0, atol=1e-15)
    # a neighbour's rate 1/4 as prior mean, strength 2 (Beta(1, 1)'s): Beta(0.5, 1.5), then 1 of 4: (1.5, 4.5);
    # the NaN prompt keeps Beta(1, 1): 2 of 4 -> (3, 3)
    a, b = posterior_params([1, 2], [4, 4], prior_mean=[0.25, np.nan])
    assert_allclose((a, b), ([1.5, 3.0], [4.5, 3.0]), rtol=0, atol=1e-15)
    # a given prior pair
    a, b = posterior_params([0], [2], prior=(0.5, 2.0))
    assert_allclose((a, b), ([0.5], [4.0]))


def test_posterior_params_rejects_bad_input():
    with pytest.raises(ValueError, match="step successes must not exceed trials; found 5 > 4 at index 0"):
        posterior_params([5], [4])
    with pytest.raises(ValueError, match="history_successes and history_trials together"):
        posterior_params([1], [4], history_successes=[1])
    with pytest.raises(ValueError, match="history arrays must have shape \\(2,\\)"):
        posterior_params([1, 1], [4, 4], history_successes=[1], history_trials=[2])
    with pytest.raises(ValueError, match="history_weight must lie in \\[0, 1\\]"):
        posterior_params([1], [4], history_weight=2.0)
    with pytest.raises(ValueError, match="prior must be 'batch', 'batch-variance', 'flat' or a pair"):
        posterior_params([1], [4], prior="jeffreys")
    with pytest.raises(ValueError, match="finite and > 0"):
        posterior_params([1], [4], prior=(0.0, 1.0))
    with pytest.raises(ValueError, match="prior_mean must hold rates in \\[0, 1\\] or NaN"):
        posterior_params([1], [4], prior_mean=[1.5])


# ---------------------------------------------------------------------------------------------------------------
# the value of more rollouts
# ---------------------------------------------------------------------------------------------------------------


def test_group_mixed_prob_hand():
    # posteriors Beta(1, 3) (0 of 2 under Beta(1, 1)), Beta(3, 1) (2 of 2), Beta(2, 2) (1 of 2), Beta(1, 1) (0 of 0)
    a, b = np.array([1.0, 3.0, 2.0, 1.0]), np.array([3.0, 1.0, 2.0, 1.0])
    k, m = np.array([0, 2, 1, 0]), np.array([2, 2, 2, 0])
    P = group_mixed_prob(a, b, k, m, [0, 1, 2, 3])
    # 0 of 2: 1 - E[(1-p)^x] under Beta(1, 3), E[(1-p)^x] = prod_{j<x} (3 + j) / (4 + j) = 3 / (3 + x)
    #   x = 0..3: 1 - 1, 1 - 3/4, 1 - 3/5, 1 - 3/6
    assert_allclose(P[0], [0.0, 0.25, 0.4, 0.5], rtol=0, atol=1e-14)
    # 2 of 2 under Beta(3, 1): the mirror image, 1 - E[p^x] = 1 - 3 / (3 + x)
    assert_allclose(P[1], [0.0, 0.25, 0.4, 0.5], rtol=0, atol=1e-14)
    # already mixed: 1 whatever x
    assert_allclose(P[2], [1.0, 1.0, 1.0, 1.0])
    # no rollout yet, p uniform: 0 for x <= 1; x = 2: 1 - 2 * 1/3 = 1/3 (E[p^2] = 1/3); x = 3: 1 - 2 * 1/4 = 1/2
    assert_allclose(P[3], [0.0, 0.0, 1 / 3, 0.5], rtol=0, atol=1e-14)
    # G = (m + x) P: 0 of 2 and x = 3 -> 5 * 1/2 = 2.5; mixed 1 of 2, x = 3 -> 5
    G = expected_informative(a, b, k, m, [3])
    assert_allclose(G[:, 0], [2.5, 2.5, 5.0, 1.5], rtol=0, atol=1e-13)


def test_group_mixed_prob_matches_monte_carlo():
    # the posterior predictive against sampling p from the posterior, then x Bernoulli(p) rewards (4 sigma of the
    # Monte-Carlo error: sqrt(P (1 - P) / draws) <= 0.5 / sqrt(200000) ~ 0.0011)
    rng = np.random.default_rng(0)
    a, b, k, m, x = 0.7, 3.2, 0, 4, 6
    p = rng.beta(a, b, 200_000)
    succ = rng.binomial(x, p)
    mc = np.mean(succ > 0)  # 0 of 4 so far: mixed iff one of the x succeeds
    P = group_mixed_prob([a], [b], [k], [m], [x])[0, 0]
    assert abs(P - mc) < 4 * 0.5 / np.sqrt(200_000)


# ---------------------------------------------------------------------------------------------------------------
# the allocation
# ---------------------------------------------------------------------------------------------------------------


def test_posterior_allocation_hand():
    # prompt 0: 1 of 2 (mixed: +1 per rollout); prompt 1: 0 of 2 under Beta(1, 1) -> Beta(1, 3), budget 3.
    # G_1(x) = (2 + x)(1 - 3 / (3 + x)) = (2 + x) x / (3 + x): x = 1: 3/4, 2: 8/5, 3: 15/6 = 2.5
    # totals (3 - x) + G_1(x): x = 0: 3, 1: 2.75, 2: 2.6, 3: 2.5 -> all to the mixed prompt
    assert_array_equal(posterior_allocation([1, 0], [2, 2], 3), [3, 0])
    # with an earlier visit of prompt 1 at 4 of 8: Beta(1 + 4, 1 + 2 + 4) = Beta(5, 7),
    # E[(1-p)^x] = prod_{j<x} (7 + j) / (12 + j): x = 1: 7/12, 2: 7/12 * 8/13 = 0.35897, 3: * 9/14 = 0.23077
    # G_1: 3 * 5/12 = 1.25, 4 * 0.64103 = 2.5641, 5 * 0.76923 = 3.8462
    # totals: x = 0: 3, 1: 3.25, 2: 3.5641, 3: 3.8462 -> all to the flat prompt with a solvable history
    x = posterior_allocation([1, 0], [2, 2], 3, history_successes=[0, 4], history_trials=[0, 8])
    assert_array_equal(x, [0, 3])
    # the same with a cap of 2 per prompt: x = 2 (3.5641 + 1) beats x = 1 (1.25 + 2)
    x = posterior_allocation([1, 0], [2, 2], 3, history_successes=[0, 4], history_trials=[0, 8], max_per_prompt=2)
    assert_array_equal(x, [1, 2])


def test_mixed_prompts_share_the_pool_evenly():
    # every prompt mixed: each rollout is worth exactly 1 wherever it goes; the split is even (split_budget's rule:
    # the earlier prompts take the remainder), and within caps
    assert_array_equal(posterior_allocation([1, 2, 1], [4, 4, 4], 7), [3, 2, 2])
    assert_array_equal(posterior_allocation([1, 2, 1], [4, 4, 4], 7, max_per_prompt=[1, 4, 4]), [1, 3, 3])
    assert_array_equal(posterior_allocation([1, 2, 1], [4, 4, 4], 0), [0, 0, 0])


@pytest.mark.parametrize("power", [1.0, 0.75, 0.5, 0.25, 0.0])
def test_posterior_allocation_matches_brute_force(power):
    # power 1: the pooled fast path; below: the DP over every prompt (step 4)
    rng = np.random.default_rng(3)
    for trial in range(120):
        Q = int(rng.integers(1, 4))
        m = rng.integers(0, 6, Q)
        k = rng.binomial(m, rng.choice([0.0, 0.3, 1.0], Q))
        caps = rng.integers(0, 6, Q)
        B = int(rng.integers(0, caps.sum() + 1))
        kw = {}
        if trial % 3 == 1:
            kw = {"history_successes": rng.binomial(8, 0.5, Q), "history_trials": np.full(Q, 8)}
        if trial % 3 == 2:
            kw = {"prior": (float(rng.uniform(0.2, 3)), float(rng.uniform(0.2, 3)))}
        x = posterior_allocation(k, m, B, max_per_prompt=caps, size_power=power, **kw)
        assert x.sum() == B and np.all(x <= caps) and np.all(x >= 0)
        # exact below max_units: the DP's total equals the best total over all allocations (sums of a few terms
        # of size <= 10: equal up to ~1e-13)
        got = _objective(k, m, x, power, **kw)
        assert got == pytest.approx(_brute_force(k, m, B, caps, power, **kw), abs=1e-12)


def test_large_budgets_are_planned_in_units():
    rng = np.random.default_rng(4)
    p = rng.random(64)
    p[:8], p[8:16] = 0.0, 1.0
    m = np.full(64, 128)
    k = rng.binomial(m, p)
    x = posterior_allocation(k, m, 4096)
    assert x.sum() == 4096
    flat = (k == 0) | (k == m)
    # units of ceil(4096 / 128) = 32 rollouts for the flat prompts
    assert np.all(x[flat] % 32 == 0)
    # a smaller problem planned in units of 4 and exactly: the exact plan is worth at least as much (units only
    # restrict the flat prompts' choices), and both spend the budget
    k8, m8 = np.array([0, 0, 4, 1, 2, 0, 3, 4]), np.full(8, 4)
    hist = {"history_successes": np.array([3, 0, 6, 2, 4, 5, 1, 8]), "history_trials": np.full(8, 8)}
    coarse = posterior_allocation(k8, m8, 64, max_units=16, **hist)
    exact = posterior_allocation(k8, m8, 64, max_units=64, **hist)
    flat8 = (k8 == 0) | (k8 == 4)
    assert coarse.sum() == exact.sum() == 64 and np.all(coarse[flat8] % 4 == 0)
    assert _objective(k8, m8, coarse, **hist) <= _objective(k8, m8, exact, **hist) + 1e-12
    # a budget that is not a multiple of the unit, with no mixed prompt to take the remainder: filled one by one
    y = posterior_allocation(np.zeros(3, dtype=int), np.full(3, 4), 301, max_units=100)
    assert y.sum() == 301


def test_posterior_allocation_rejects_bad_input():
    with pytest.raises(ValueError, match="budget=9 cannot be placed: max_per_prompt allows at most 8"):
        posterior_allocation([1, 0], [2, 2], 9, max_per_prompt=4)
    with pytest.raises(ValueError, match="budget must be an integer >= 0"):
        posterior_allocation([1, 0], [2, 2], -1)
    with pytest.raises(ValueError, match="max_units must be an integer >= 1"):
        posterior_allocation([1, 0], [2, 2], 3, max_units=0)
    with pytest.raises(ValueError, match="step trials must hold whole numbers"):
        posterior_allocation([1, 0], [2, 2.5], 3)


# ---------------------------------------------------------------------------------------------------------------
# the documented edges, one behaviour each
# ---------------------------------------------------------------------------------------------------------------


def test_counts_are_checked_for_shape_and_name_the_first_bad_index():
    with pytest.raises(
        ValueError,
        match=r"prior successes and trials must be non-empty 1-D arrays of one shape, got \(1, 2\) and \(1, 2\)",
    ):
        fit_beta_prior([[1, 1]], [[2, 2]])
    with pytest.raises(
        ValueError, match=r"step successes and trials must be non-empty 1-D arrays of one shape, got \(0,\) and \(0,\)"
    ):
        posterior_params([], [])
    with pytest.raises(
        ValueError, match=r"step successes and trials must be non-empty 1-D arrays of one shape, got \(2,\) and \(1,\)"
    ):
        posterior_params([1, 2], [4])
    # prompt 0 is at k = m (allowed); prompt 1 is the first with k > m
    with pytest.raises(ValueError, match="step successes must not exceed trials; found 5 > 4 at index 1"):
        posterior_params([1, 5], [1, 4])
    with pytest.raises(ValueError, match="prior successes must hold numbers >= 0; found -1 at index 1"):
        fit_beta_prior([0, -1], [2, 2])


def test_signatures_are_keyword_only_after_the_counts():
    with pytest.raises(TypeError):
        fit_beta_prior([1, 1], [2, 2], "variance")
    with pytest.raises(TypeError):
        posterior_params([1], [4], [1], [4])
    with pytest.raises(TypeError):
        posterior_allocation([1, 0], [2, 2], 3, None)


def test_fit_beta_prior_takes_fractional_counts():
    # discounted histories: 0.5 and 1.5 of 2; mu = (1/4 + 3/4) / 2 = 1/2; neither group is flat (share 0 <= the
    # strongest prior's mean_i mu^2 + (1 - mu)^2 = 1/2): s = max_strength = 1000 -> Beta(500, 500)
    assert fit_beta_prior([0.5, 1.5], [2, 2]) == pytest.approx((500.0, 500.0))


def test_fit_beta_prior_strength_bounds():
    with pytest.raises(ValueError, match=r"need 0 < min_strength <= max_strength, got 0, 5"):
        fit_beta_prior([0, 2, 1, 1], [2] * 4, min_strength=0, max_strength=5)
    # min_strength = max_strength is allowed and pins s: Beta(3 * 1/2, 3 * 1/2)
    assert fit_beta_prior([0, 2, 1, 1], [2] * 4, min_strength=3, max_strength=3) == pytest.approx((1.5, 1.5))


def test_fit_beta_prior_who_counts():
    # a prompt with n = 1 is seen (only n = 0 is ignored): strength 2 at its rate, clamped to 1 - e with
    # e = 1 / (2 (1 + 1)) = 1/4 -> mu = 3/4 -> Beta(1.5, 0.5)
    assert fit_beta_prior([1, 0], [1, 0]) == pytest.approx((1.5, 0.5))
    # the flat moment counts only prompts with n >= 2: one here (the two n = 1 groups are flat whatever p is), so
    # s = 2 at mu = (0 + 1 + 1/2) / 3 = 1/2 -> Beta(1, 1)
    assert fit_beta_prior([0, 1, 2], [1, 1, 4]) == pytest.approx((1.0, 1.0))
    # exactly two prompts with n >= 2 are enough: both flat (share 1, above every prior's): the weakest prior
    assert fit_beta_prior([0, 2], [2, 2]) == pytest.approx((0.025, 0.025))
    # every prompt solved: mu is kept at 1 - e, e = 1 / (2 (8 + 1)) = 1/18, every group flat: s = min_strength
    a, b = fit_beta_prior([4, 4], [4, 4])
    assert (a + b, a / (a + b)) == pytest.approx((0.05, 17 / 18))


def test_fit_beta_prior_flat_bisection_reaches_its_precision():
    # k = 0, 2, 0, 2, 1, 1, 1 of n = 2: mu = 3.5 / 7 = 1/2, flat share z = 4/7; (s + 2) / (2 (s + 1)) = 4/7
    # -> 7 s + 14 = 8 s + 8 -> s = 6 -> Beta(3, 3). 30 halvings of [log 0.05, log 1000] leave the midpoint within
    # half the last bracket, log(1000 / 0.05) / 2^31 = 4.6e-9, of log s (f is evaluated to ~1e-16: negligible)
    a, b = fit_beta_prior([0, 2, 0, 2, 1, 1, 1], [2] * 7)
    assert a == b
    assert abs(np.log(a + b) - np.log(6.0)) <= np.log(1000 / 0.05) / 2**31


def test_fit_beta_prior_variance_moment_cases():
    # rates 0, 1, 1/2, 1/2 of n = 4: mu = 1/2, S^2 = (1/4 + 1/4 + 0 + 0) / 3 = 1/6, c = 1/4
    # rho = (S^2 / (mu (1 - mu)) - c) / (1 - c) = (2/3 - 1/4) / (3/4) = 5/9 -> s = 9/5 - 1 = 4/5 -> Beta(0.4, 0.4)
    # (float64 on a handful of terms: a few ulps)
    assert fit_beta_prior([0, 4, 2, 2], [4] * 4, moment="variance") == pytest.approx((0.4, 0.4), rel=1e-14)
    # the same with max_strength = 1: rho = 5/9 > 1 / (1 + 1) = 1/2, so s = 4/5 stays (within [0.05, 1])
    a, b = fit_beta_prior([0, 4, 2, 2], [4] * 4, moment="variance", max_strength=1.0)
    assert (a, b) == pytest.approx((0.4, 0.4), rel=1e-14)
    # two prompts are enough: rates 1/2, 1 of 4: mu = 3/4, S^2 = 1/8, mu (1 - mu) = 3/16, c = 1/4
    # rho = (2/3 - 1/4) / (3/4) = 5/9 -> s = 4/5 -> Beta(0.6, 0.2)
    assert fit_beta_prior([2, 4], [4, 4], moment="variance") == pytest.approx((0.6, 0.2), rel=1e-14)
    # rates 0, 1, 1/2, 1/2, 1/2 of n = 2: mu = 1/2, S^2 = (1/4 + 1/4) / 4 = 1/8, S^2 / (1/4) = 1/2 = c: rho = 0,
    # no spread beyond binomial noise -> the strongest prior, Beta(500, 500)
    assert fit_beta_prior([0, 2, 1, 1, 1], [2] * 5, moment="variance") == pytest.approx((500.0, 500.0))
    # one prompt: s = 2 at its rate 3/4 -> Beta(1.5, 0.5)
    assert fit_beta_prior([3], [4], moment="variance") == pytest.approx((1.5, 0.5))
    # every n_i = 1 (c = 1): s = 2 at mu = 2/3 -> Beta(4/3, 2/3)
    assert fit_beta_prior([0, 1, 1], [1, 1, 1], moment="variance") == pytest.approx((4 / 3, 2 / 3))


def test_posterior_params_edges():
    # history_weight 0 is allowed and ignores the history: Beta(1 + 1, 1 + 3)
    a, b = posterior_params([1], [4], history_successes=[3], history_trials=[8], history_weight=0.0)
    assert_array_equal((a, b), ([2.0], [4.0]))
    with pytest.raises(ValueError, match="prior \\(alpha0, beta0\\) must be finite and > 0"):
        posterior_params([1], [4], prior=(1.0, 0.0))
    # prior means 0 and 1 are rates (allowed), clipped to 0.01 and 0.99 at strength 2: Beta(0.02, 1.98) and its
    # mirror image, no rollout yet
    a, b = posterior_params([0, 0], [0, 0], prior_mean=[0.0, 1.0])
    assert_allclose((a, b), ([0.02, 1.98], [1.98, 0.02]), rtol=1e-15)


def test_group_mixed_prob_rejects_bad_input():
    with pytest.raises(ValueError, match=r"alpha and beta must be > 0 with shape \(1,\)"):
        group_mixed_prob([1.0, 1.0], [1.0], [0], [2], [1])
    with pytest.raises(ValueError, match=r"alpha and beta must be > 0 with shape \(1,\)"):
        group_mixed_prob([1.0], [1.0, 1.0], [0], [2], [1])
    with pytest.raises(ValueError, match=r"alpha and beta must be > 0 with shape \(1,\)"):
        group_mixed_prob([0.0], [1.0], [0], [2], [1])
    with pytest.raises(ValueError, match=r"alpha and beta must be > 0 with shape \(1,\)"):
        group_mixed_prob([1.0], [0.0], [0], [2], [1])
    with pytest.raises(ValueError, match=r"extra must be \(X,\) or \(1, X\) numbers of rollouts >= 0, got shape \(\)"):
        group_mixed_prob([1.0], [1.0], [0], [2], 3)
    with pytest.raises(
        ValueError, match=r"extra must be \(X,\) or \(1, X\) numbers of rollouts >= 0, got shape \(2, 2\)"
    ):
        group_mixed_prob([1.0], [1.0], [0], [2], [[1, 2], [3, 4]])
    with pytest.raises(
        ValueError, match=r"extra must be \(X,\) or \(1, X\) numbers of rollouts >= 0, got shape \(2,\)"
    ):
        group_mixed_prob([1.0], [1.0], [0], [2], [1, -1])
    with pytest.raises(ValueError, match="extra must hold whole numbers"):
        group_mixed_prob([1.0], [1.0], [0], [2], [1.5])


def test_group_mixed_prob_one_of_one_and_fresh_prompts():
    # exp of gammaln differences of numbers <= 13: a few 1e-15 absolute, hence atol=1e-14 on probabilities
    # 1 of 1 under Beta(1, 1) -> Beta(2, 1): all-success, so 1 - E[p^x] = 1 - 2 / (2 + x): x = 1: 1/3, x = 2: 1/2
    assert_allclose(group_mixed_prob([2.0], [1.0], [1], [1], [0, 1, 2])[0], [0.0, 1 / 3, 0.5], rtol=0, atol=1e-14)
    # only fresh prompts (m = 0): 1 - E[p^x] - E[(1 - p)^x], 0 for x <= 1 (exactly: a group of one is never mixed)
    # Beta(3, 1): E[p^x] = 3 / (3 + x), E[(1-p)^x] = prod_{j<x} (1 + j) / (4 + j)
    #   x = 2: 1 - 3/5 - 2/20 = 3/10;  x = 3: 1 - 1/2 - 6/120 = 9/20
    # Beta(3, 7): E[p^2] = 12/110, E[(1-p)^2] = 56/110 -> 42/110 = 21/55; E[p^3] = 60/1320 = 5/110,
    #   E[(1-p)^3] = 504/1320 = 42/110 -> 63/110
    P = group_mixed_prob([3.0, 3.0], [1.0, 7.0], [0, 0], [0, 0], [0, 1, 2, 3])
    assert np.all(P[:, :2] == 0.0)
    assert_allclose(P[:, 2:], [[3 / 10, 9 / 20], [21 / 55, 63 / 110]], rtol=0, atol=1e-14)


def test_posterior_allocation_rejects_bad_arguments():
    for bad in (True, 3.0, 2.5):
        with pytest.raises(ValueError, match=f"budget must be an integer >= 0, got {bad!r}"):
            posterior_allocation([1, 0], [2, 2], bad)
    for bad in (True, 2.0):
        with pytest.raises(ValueError, match=f"max_units must be an integer >= 1, got {bad!r}"):
            posterior_allocation([1, 0], [2, 2], 3, max_units=bad)
    for bad in ([1, 2, 3], -1, 1.5):
        with pytest.raises(ValueError, match=r"max_per_prompt must be None, an integer >= 0 or \(2,\) integers >= 0"):
            posterior_allocation([1, 0], [2, 2], 3, max_per_prompt=bad)


def test_default_max_units_is_128():
    # prompt 0 mixed (1 of 2: +1 per rollout); prompt 1 at 0 of 4 with 8 of 8 before: Beta(1 + 8, 1 + 4) = Beta(9, 5)
    # G_1(x) = (4 + x)(1 - prod_{j<x} (5 + j) / (14 + j)): G_1(1) = 5 * 9/14 = 45/14, G_1(2) = 6 (1 - 1/7) = 36/7,
    # G_1(3) = 7 (1 - 1/16) = 105/16; net over the pool G_1(x) - x = 2.21, 3.14, 3.56: increasing, so prompt 1 takes
    # its cap of 3 when planned exactly (B = 128 <= 128)
    kw = {"history_successes": [0, 8], "history_trials": [0, 8]}
    assert_array_equal(posterior_allocation([1, 0], [2, 4], 128, max_per_prompt=[128, 3], **kw), [125, 3])
    # B = 129 > 128: units of ceil(129 / 128) = 2, a cap of 3 holds one unit; the one rollout left goes to the pool
    assert_array_equal(posterior_allocation([1, 0], [2, 4], 129, max_per_prompt=[129, 3], **kw), [127, 2])


def test_units_leave_the_capped_pool_its_cap():
    # B = 103, max_units = 25: units of ceil(103 / 25) = 5. Prompt 0 mixed (1 of 2) with cap 7; prompt 1 at 0 of 4
    # under Beta(1, 1) -> Beta(1, 5): G_1(x) = (4 + x)(1 - 5 / (5 + x)) = x (4 + x) / (5 + x) < x, so every rollout is
    # worth more to the pool: the pool takes one unit (5) and 2 of the 3 left over (its cap), prompt 1 the rest
    assert_array_equal(posterior_allocation([1, 0], [2, 4], 103, max_per_prompt=[7, 100], max_units=25), [7, 96])


def test_units_remainder_goes_one_at_a_time_to_the_largest_marginal_gain():
    # max_units = 1: units of B = 4 rollouts, and every cap (2, 2, 3, 2) is below 4, so no unit fits and all 4
    # rollouts are placed one at a time, each to the open prompt of largest G_i(x + 1) - G_i(x).
    # Posteriors (Beta(1, 1) + step + history of 8): P0 fresh Beta(5, 5); P1 0 of 1, Beta(9, 2); P2 8 of 8,
    # Beta(15, 3); P3 4 of 4, Beta(9, 5).
    #   P0: G(1) = 0 (a group of one is never mixed)
    #   P1: G(x) = (1 + x)(1 - prod_{j<x} (2 + j) / (11 + j)): G(1) = 2 * 9/11 = 18/11 = 1.636, G(2) = 3 * 21/22
    #       = 63/22 -> marginals 1.636, 27/22 = 1.227
    #   P2: G(1) = 9 (1 - 15/18) = 1.5
    #   P3: G(x) = (4 + x)(1 - prod_{j<x} (9 + j) / (14 + j)): G(1) = 5 * 5/14 = 25/14 = 1.786, G(2) = 6 * 4/7
    #       = 24/7 -> marginals 1.786, 23/14 = 1.643
    # step 1: P3 (1.786); step 2: P3 (1.643 > 1.636), now at its cap 2; step 3: P1 (1.636); step 4: P2 (1.5 > 1.227)
    k, m = np.array([0, 0, 8, 4]), np.array([0, 1, 8, 4])
    kw = {"history_successes": np.array([4, 8, 6, 4]), "history_trials": np.full(4, 8)}
    caps = [2, 2, 3, 2]
    x = posterior_allocation(k, m, 4, max_per_prompt=caps, max_units=1, **kw)
    assert_array_equal(x, [0, 1, 1, 2])
    # here the greedy order happens to reach the exact optimum (the brute-force twin; sums of 4 terms <= 10)
    assert _objective(k, m, x, **kw) == pytest.approx(_brute_force(k, m, 4, caps, **kw), abs=1e-12)


def test_expected_informative_checks_its_arguments_as_group_mixed_prob_does():
    # a scalar trials count is bad input named as such (it used to fail with an IndexError on m[:, None])
    for fn in (group_mixed_prob, expected_informative):
        with pytest.raises(ValueError, match=r"step successes and trials must be non-empty 1-D arrays of one shape"):
            fn([1.0], [1.0], 0, 2, [1])
        with pytest.raises(ValueError, match=r"extra must be \(X,\) or \(1, X\) numbers of rollouts >= 0"):
            fn([1.0], [1.0], [0], [2], [[1, 2], [3, 4]])


# ---------------------------------------------------------------------------------------------------------------
# step 4: a group's value grows as n^gamma
# ---------------------------------------------------------------------------------------------------------------


def test_group_value_hand():
    # 0 of 2 under Beta(1, 1) -> Beta(1, 3): P(mixed after x more) = 1 - E[(1-p)^x] = 1 - 3 / (3 + x);
    # x = 6: 2/3, V = 8^gamma * 2/3; a mixed prompt (1 of 2): P = 1, V = (2 + x)^gamma
    a, b = np.array([1.0, 2.0]), np.array([3.0, 2.0])
    v = group_value(a, b, [0, 1], [2, 2], [0, 6], 0.5)
    assert_allclose(v, [[0.0, np.sqrt(8) * 2 / 3], [np.sqrt(2), np.sqrt(8)]], rtol=1e-12)
    assert_allclose(group_value(a, b, [0, 1], [2, 2], [6], 0.0), [[2 / 3], [1.0]], rtol=1e-12)
    # power 1 is expected_informative
    assert_allclose(
        group_value(a, b, [0, 1], [2, 2], [0, 3, 6], 1.0), expected_informative(a, b, [0, 1], [2, 2], [0, 3, 6])
    )


def test_size_power_spreads_the_round_to_flat_prompts():
    # prompt 0 mixed (1 of 2), prompt 1 flat (0 of 2: Beta(1, 3), P(mixed | x) = x / (3 + x)), budget 2
    # gamma = 1: net gain of the flat prompt (2 + x) x / (3 + x) - x < 0 -> both to the mixed prompt
    assert_array_equal(posterior_allocation([1, 0], [2, 2], 2), [2, 0])
    # gamma = 1/2: (2, 0): sqrt(4) = 2; (1, 1): sqrt(3) + sqrt(3) / 4 = 2.165; (0, 2): sqrt(2) + 2 * 2/5 = 2.214
    assert_array_equal(posterior_allocation([1, 0], [2, 2], 2, size_power=0.5), [0, 2])
    # gamma = 0: the mixed prompt is worth 1 whatever its size; the flat one 2/5 at x = 2
    assert_array_equal(posterior_allocation([1, 0], [2, 2], 2, size_power=0.0), [0, 2])
    # gamma = 1/2 with both mixed: concave values, the round is split evenly
    assert_array_equal(posterior_allocation([1, 1], [2, 2], 4, size_power=0.5), [2, 2])


def test_size_power_above_max_units_plans_in_units():
    rng = np.random.default_rng(6)
    m = np.full(8, 4)
    k = rng.binomial(m, 0.4)
    coarse = posterior_allocation(k, m, 64, max_units=16, size_power=0.5)
    exact = posterior_allocation(k, m, 64, max_units=64, size_power=0.5)
    assert coarse.sum() == exact.sum() == 64 and np.all(coarse % 4 == 0)
    assert _objective(k, m, coarse, 0.5) <= _objective(k, m, exact, 0.5) + 1e-12
    # a remainder below one unit goes one rollout at a time, within the caps (caps that are not multiples of the
    # unit leave remainders too)
    y = posterior_allocation(k, m, 65, max_units=16, size_power=0.5, max_per_prompt=10)
    assert y.sum() == 65 and np.all(y <= 10)
    for _ in range(200):
        Q = int(rng.integers(1, 5))
        mm = rng.integers(1, 5, Q)
        kk = rng.binomial(mm, rng.random(Q))
        caps = rng.integers(0, 9, Q)
        B = int(rng.integers(0, caps.sum() + 1))
        z = posterior_allocation(kk, mm, B, max_units=2, size_power=0.5, max_per_prompt=caps)
        assert z.sum() == B and np.all(z <= caps) and np.all(z >= 0)


def test_size_power_is_checked():
    for bad in (-0.1, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="size_power"):
            posterior_allocation([1, 0], [2, 2], 2, size_power=bad)
