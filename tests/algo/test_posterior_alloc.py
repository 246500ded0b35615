"""Tests of xrpo.algo.posterior_alloc (xrpo-plus, issue #33): the prior fits, the posterior, the posterior-predictive
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
    posterior_allocation,
    posterior_params,
)


def _objective(k, m, x, **kw) -> float:
    """sum_i G_i(x_i) under the posterior posterior_allocation uses (same keyword arguments)."""
    a, b = posterior_params(k, m, **kw)
    g = [
        expected_informative(a[i : i + 1], b[i : i + 1], k[i : i + 1], m[i : i + 1], [x[i]])[0, 0]
        for i in range(len(k))
    ]
    return float(sum(g))


def _brute_force(k, m, budget, caps, **kw) -> float:
    """The reference twin: the best sum_i G_i(x_i) over every allocation within the caps summing to the budget."""
    best = -np.inf
    for x in itertools.product(*(range(int(c) + 1) for c in caps)):
        if sum(x) == budget:
            best = max(best, _objective(k, m, x, **kw))
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


def test_posterior_allocation_matches_brute_force():
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
        x = posterior_allocation(k, m, B, max_per_prompt=caps, **kw)
        assert x.sum() == B and np.all(x <= caps) and np.all(x >= 0)
        # exact below max_units: the DP's total equals the best total over all allocations (sums of a few terms
        # of size <= 10: equal up to ~1e-13)
        assert _objective(k, m, x, **kw) == pytest.approx(_brute_force(k, m, B, caps, **kw), abs=1e-12)


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
