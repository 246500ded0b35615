"""Tests of xrpo.algo.cures (CurES, arXiv 2510.01037; rules from the authors' code): Beta posterior, temperature,
sampling distribution, sampling without replacement, gradient std, rollout counts. Hand-computed cases with the
arithmetic in comments, edge cases, and reference twins."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal

from xrpo.algo.cures import (
    beta_posterior,
    gradient_std,
    normalized_entropy,
    posterior_mean,
    prompt_temperature,
    rollout_counts,
    sample_prompts,
    sampling_probs,
)

# ---------------------------------------------------------------------------------------------------------------
# posterior
# ---------------------------------------------------------------------------------------------------------------


def test_beta_posterior_hand():
    # prior Beta(1, 1); s = [0, 3, 2] successes of n = [0, 4, 2] rollouts
    # alpha = 1 + s = [1, 4, 3]; beta = 1 + n - s = [1, 2, 1]
    a, b = beta_posterior([0, 3, 2], [0, 4, 2])
    assert_array_equal(a, [1.0, 4.0, 3.0])
    assert_array_equal(b, [1.0, 2.0, 1.0])
    # p = alpha / (alpha + beta) = [1/2, 4/6, 3/4]; the unseen prompt keeps the prior mean 1/2
    assert_allclose(posterior_mean(a, b), [0.5, 4 / 6, 0.75], rtol=0, atol=1e-15)
    # prior Beta(2, 0.5): alpha = [2, 5, 4], beta = [0.5, 1.5, 0.5]; p = [2/2.5, 5/6.5, 4/4.5]
    a, b = beta_posterior([0, 3, 2], [0, 4, 2], prior_alpha=2.0, prior_beta=0.5)
    assert_array_equal(a, [2.0, 5.0, 4.0])
    assert_array_equal(b, [0.5, 1.5, 0.5])
    assert_allclose(posterior_mean(a, b), [0.8, 5 / 6.5, 4 / 4.5], rtol=0, atol=1e-15)


def test_posterior_mean_never_reaches_0_or_1():
    # all 10 rollouts wrong: p = 1 / 12; all right: p = 11 / 12 (the prior keeps p inside (0, 1))
    p = posterior_mean(*beta_posterior([0, 10], [10, 10]))
    assert_allclose(p, [1 / 12, 11 / 12], rtol=0, atol=1e-15)


def test_beta_posterior_rejects_bad_counts():
    with pytest.raises(ValueError, match="successes must not exceed trials.*index \\(1,\\)"):
        beta_posterior([0, 5], [1, 4])
    with pytest.raises(ValueError, match="whole numbers"):
        beta_posterior([0.5], [1])
    with pytest.raises(ValueError, match="trials must hold whole numbers >= 0"):
        beta_posterior([0], [-1])
    with pytest.raises(ValueError, match="same shape"):
        beta_posterior([0, 1], [1])
    with pytest.raises(ValueError, match="prior_alpha"):
        beta_posterior([0], [1], prior_alpha=0.0)
    with pytest.raises(ValueError, match="finite"):
        beta_posterior([np.nan], [1])
    with pytest.raises(ValueError, match="> 0"):
        posterior_mean([0.0], [1.0])


def test_beta_posterior_error_names_the_first_bad_index():
    # an earlier entry exactly at the boundary (0 rollouts; successes == trials) is valid: the message names the
    # later one
    with pytest.raises(ValueError, match=r"trials must hold whole numbers >= 0; found -1.0 at index \(1,\)"):
        beta_posterior([0, 0], [0, -1])
    with pytest.raises(ValueError, match=r"successes must hold whole numbers >= 0; found 0.5 at index \(1,\)"):
        beta_posterior([0, 0.5], [0, 1])
    with pytest.raises(ValueError, match=r"successes must not exceed trials; found 5 > 4 at index \(1,\)"):
        beta_posterior([1, 5], [1, 4])
    with pytest.raises(ValueError, match="prior_beta must be a finite number > 0, got -1"):
        beta_posterior([0], [1], prior_beta=-1)


def test_posterior_mean_rejects_a_zero_beta():
    # beta = 0 is not a Beta distribution (its mean would be exactly 1), whatever alpha is
    with pytest.raises(ValueError, match=r"alpha and beta must be > 0 \(a Beta distribution's parameters\)"):
        posterior_mean([1.0], [0.0])
    with pytest.raises(ValueError, match=r"alpha and beta must be > 0"):
        posterior_mean([1.0, 2.0], [1.0, -1.0])


# ---------------------------------------------------------------------------------------------------------------
# temperature and sampling distribution
# ---------------------------------------------------------------------------------------------------------------


def test_prompt_temperature_hand():
    # T_i = c * alpha_i with the CurES constant c = 1 / 1e-2 = 100: alpha = [1, 4, 3] -> [100, 400, 300]
    assert_array_equal(prompt_temperature([1.0, 4.0, 3.0]), [100.0, 400.0, 300.0])
    assert_array_equal(prompt_temperature([1.0, 4.0], scale=0.5), [0.5, 2.0])
    with pytest.raises(ValueError, match="scale"):
        prompt_temperature([1.0], scale=0)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        prompt_temperature([0.0])


def test_sampling_probs_hand():
    # p = [0.5, 0.1, 1.0], T = 1: logits sqrt(p(1-p)) = [0.5, 0.3, 0.0]
    # exp = [1.6487212707, 1.3498588076, 1.0], sum 3.9985800783 -> P = [0.4123266856, 0.3375845378, 0.2500887766]
    assert_allclose(
        sampling_probs([0.5, 0.1, 1.0], 1.0), [0.41232668557957836, 0.33758453779871644, 0.2500887766217052], rtol=1e-14
    )
    # per-prompt temperatures: p = [0.5, 0.5], T = [1, 2]: logits [0.5, 0.25] -> P_0 = 1 / (1 + e^-0.25) = 0.56218
    assert_allclose(sampling_probs([0.5, 0.5], [1.0, 2.0])[0], 0.5621765008857981, rtol=1e-14)
    # the CurES constants: p = [0.5, 0] unseen-like vs never solved, T = 100 * alpha = [100, 100]:
    # logits [0.005, 0] -> P_0 = 1 / (1 + e^-0.005) = 0.50125: within 0.5% of uniform
    assert_allclose(sampling_probs([0.5, 0.0], prompt_temperature([1.0, 1.0]))[0], 0.5012499973958399, rtol=1e-14)


def test_sampling_probs_edges():
    # all equal (e.g. every prompt unseen): exactly uniform
    assert_array_equal(sampling_probs(np.full(5, 0.5), 100.0), np.full(5, 0.2))
    # p in {0, 1}: score 0, the same as each other
    pr = sampling_probs([0.0, 1.0, 0.5], 1.0)
    assert pr[0] == pr[1] < pr[2]
    # a tiny temperature must not overflow: the mode takes (almost) everything
    pr = sampling_probs([0.5, 0.1], 1e-6)
    assert np.isfinite(pr).all() and pr[0] == 1.0 and abs(pr.sum() - 1) < 1e-15
    # symmetric in p <-> 1 - p
    assert_allclose(sampling_probs([0.2, 0.8, 0.5], 0.3)[:2], [sampling_probs([0.2, 0.8, 0.5], 0.3)[1]] * 2, rtol=1e-15)
    with pytest.raises(ValueError, match="p must lie in \\[0, 1\\]"):
        sampling_probs([1.5], 1.0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sampling_probs([0.5, 0.5], [1.0, 0.0])
    with pytest.raises(ValueError, match="non-empty"):
        sampling_probs([], 1.0)


def test_sampling_probs_error_names_the_first_bad_index():
    # p = 0 and p = 1 are the ends of the valid range [0, 1]: the message names the entry outside it
    with pytest.raises(ValueError, match=r"p must lie in \[0, 1\]; found 1.5 at index \(2,\)"):
        sampling_probs([0.0, 1.0, 1.5], 1.0)
    with pytest.raises(ValueError, match=r"p must lie in \[0, 1\]; found -0.5 at index \(1,\)"):
        sampling_probs([1.0, -0.5], 1.0)
    # T = 1 is a valid temperature: the zero one after it is named
    with pytest.raises(ValueError, match=r"temperature must be > 0; found 0.0 at index \(1,\)"):
        sampling_probs([0.5, 0.5], [1.0, 0.0])


def test_normalized_entropy_rejects_empty_and_2d():
    with pytest.raises(ValueError, match=r"probs must be a non-empty 1-D array, got shape \(0,\)"):
        normalized_entropy([])
    with pytest.raises(ValueError, match=r"probs must be a non-empty 1-D array, got shape \(1, 2\)"):
        normalized_entropy([[0.5, 0.5]])


def test_normalized_entropy_hand():
    assert normalized_entropy(np.full(4, 0.25)) == pytest.approx(1.0, abs=1e-15)
    assert normalized_entropy([1.0, 0.0]) == 0.0
    # H([1/2, 1/4, 1/4]) = 1.5 ln 2; / ln 3 = 0.9463946304
    assert normalized_entropy([0.5, 0.25, 0.25]) == pytest.approx(0.946394630357186, rel=1e-14)
    assert normalized_entropy([1.0]) == 1.0


# ---------------------------------------------------------------------------------------------------------------
# sampling without replacement: Gumbel top-k against the one-at-a-time loop and the exact enumeration
# ---------------------------------------------------------------------------------------------------------------


def _sample_prompts_reference(probs, k, rng):
    """Successive sampling, one prompt at a time, renormalising over the prompts not yet drawn (np.random.choice with
    replace=False, as the CurES code calls it)."""
    left = list(range(len(probs)))
    out = []
    for _ in range(k):
        w = np.array([probs[i] for i in left])
        j = rng.choice(len(left), p=w / w.sum())
        out.append(left.pop(j))
    return out


def _exact_ordered(probs, k):
    # P(i_1, ..., i_k) = prod_j p_{i_j} / (1 - sum of the earlier draws)
    out = {}
    for seq in itertools.permutations(range(len(probs)), k):
        pr, used = 1.0, 0.0
        for i in seq:
            pr *= probs[i] / (1.0 - used)
            used += probs[i]
        out[seq] = pr
    return out


def test_sample_prompts_matches_exact_enumeration_and_reference():
    probs = np.array([0.5, 0.3, 0.2])
    exact = _exact_ordered(probs, 2)
    # hand: P(0,1) = .5 * .3/.5 = .3; P(1,0) = .3 * .5/.7 = .2142857; P(2,1) = .2 * .3/.8 = .075
    assert exact[(0, 1)] == pytest.approx(0.3) and exact[(1, 0)] == pytest.approx(0.3 * 0.5 / 0.7)
    assert exact[(2, 1)] == pytest.approx(0.075) and sum(exact.values()) == pytest.approx(1.0)
    n = 40_000
    rng = np.random.default_rng(0)
    fast = [tuple(sample_prompts(probs, 2, rng).tolist()) for _ in range(n)]
    rng = np.random.default_rng(1)
    slow = [tuple(_sample_prompts_reference(probs, 2, rng)) for _ in range(n)]
    for draws in (fast, slow):
        freq = {s: 0 for s in exact}
        for s in draws:
            freq[s] += 1
        for s, pr in exact.items():
            # standard error sqrt(p (1 - p) / n) <= 0.0023; 5 standard errors
            assert abs(freq[s] / n - pr) < 5 * math.sqrt(pr * (1 - pr) / n), (s, freq[s] / n, pr)


def test_sample_prompts_edges():
    rng = np.random.default_rng(3)
    probs = sampling_probs(np.linspace(0.05, 0.95, 7), 0.2)
    # k = N: a permutation; the same generator state gives the same draw
    out = sample_prompts(probs, 7, rng)
    assert sorted(out.tolist()) == list(range(7))
    assert_array_equal(
        sample_prompts(probs, 4, np.random.default_rng(11)), sample_prompts(probs, 4, np.random.default_rng(11))
    )
    assert sample_prompts(probs, 0, rng).shape == (0,)
    # zero-probability prompts are never drawn
    for _ in range(50):
        assert 1 not in sample_prompts([0.5, 0.0, 0.5], 2, rng).tolist()
    with pytest.raises(ValueError, match="only 2 of 3 have probability > 0"):
        sample_prompts([0.5, 0.0, 0.5], 3, rng)
    with pytest.raises(ValueError, match="sum to 1"):
        sample_prompts([0.5, 0.6], 1, rng)
    with pytest.raises(ValueError, match="k must be an integer"):
        sample_prompts([1.0], -1, rng)


def test_sample_prompts_k_one_and_integer_types():
    rng = np.random.default_rng(5)
    # k = 1 draws one prompt: with a point mass it can only be that one
    assert_array_equal(sample_prompts([0.0, 1.0, 0.0], 1, rng), np.array([1], dtype=np.int64))
    assert sample_prompts([0.0, 1.0, 0.0], np.int64(1), rng).tolist() == [1]
    assert sample_prompts([0.25, 0.75], 1, rng).shape == (1,)
    # k must be an integer: a bool or a float (even a whole one) is refused
    with pytest.raises(ValueError, match="k must be an integer >= 0, got True"):
        sample_prompts([0.5, 0.5], True, rng)
    with pytest.raises(ValueError, match="k must be an integer >= 0, got 1.0"):
        sample_prompts([0.5, 0.5], 1.0, rng)


def test_sample_prompts_rejects_bad_probs():
    rng = np.random.default_rng(6)
    with pytest.raises(ValueError, match=r"probs must be a non-empty 1-D array, got shape \(0,\)"):
        sample_prompts([], 0, rng)
    with pytest.raises(ValueError, match=r"probs must be a non-empty 1-D array, got shape \(1, 2\)"):
        sample_prompts([[0.5, 0.5]], 1, rng)
    with pytest.raises(ValueError, match="probs must be >= 0; found -0.5"):
        sample_prompts([-0.5, 1.5], 1, rng)
    # "summing to 1 (within 1e-9)": 0.5 + (0.5 + 1.5e-9) is off by 1.5e-9 (the float64 sum is exact to ~2e-16)
    with pytest.raises(ValueError, match="probs must sum to 1"):
        sample_prompts([0.5, 0.5 + 1.5e-9], 1, rng)
    # off by 0.5e-9: accepted, and both (positive) prompts are drawn
    assert sorted(sample_prompts([0.5, 0.5 + 0.5e-9], 2, rng).tolist()) == [0, 1]


# ---------------------------------------------------------------------------------------------------------------
# gradient std
# ---------------------------------------------------------------------------------------------------------------


def test_gradient_std_hand():
    # p = 0.25 (a = .25, b = .75), E_c[G] = 2, E_c[G^2] = 5, E_w[G] = 1, E_w[G^2] = 1:
    #   a b^2 E_c[G^2]          = .25 * .5625 * 5   = 0.703125
    #   a^2 b E_w[G^2]          = .0625 * .75 * 1   = 0.046875
    #   a^2 b^2 (E_c - E_w)^2   = .0625 * .5625 * 1 = 0.03515625
    #   sigma^2 = 0.703125 + 0.046875 - 0.03515625 = 0.71484375 -> sigma = 0.8454843287
    assert gradient_std([0.25], 2.0, 5.0, 1.0, 1.0)[0] == pytest.approx(0.8454843286542927, rel=1e-14)
    # equal norms G = 3: sigma = 3 sqrt(p (1 - p)); p = 0.2 -> 3 * 0.4 = 1.2
    assert gradient_std([0.2], 3.0, 9.0, 3.0, 9.0)[0] == pytest.approx(1.2, rel=1e-14)
    # defaults G = 1: sqrt(p (1 - p)) = [0.5, 0.3, 0, 0]
    assert_allclose(gradient_std([0.5, 0.1, 0.0, 1.0]), [0.5, 0.3, 0.0, 0.0], rtol=1e-15, atol=0)


def test_gradient_std_is_the_variance_of_advantage_weighted_norms():
    # reference twin: the formula against np.var of (r - p) * G over explicit rollouts (p = fraction correct)
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 20))
        k = int(rng.integers(0, n + 1))
        r = np.array([1.0] * k + [0.0] * (n - k))
        g = rng.gamma(2.0, 1.5, n)
        p = k / n
        gc, gw = g[:k], g[k:]
        moments = [
            gc.mean() if k else 0.0,
            (gc**2).mean() if k else 0.0,
            gw.mean() if k < n else 0.0,
            (gw**2).mean() if k < n else 0.0,
        ]
        sigma = gradient_std([p], *moments)[0]
        assert sigma == pytest.approx(math.sqrt(np.var((r - p) * g)), rel=1e-9, abs=1e-12)


def test_gradient_std_rejects_inconsistent_moments():
    with pytest.raises(ValueError, match="sq_norm_correct must be >= mean_norm_correct"):
        gradient_std([0.5], 2.0, 3.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="p must lie"):
        gradient_std([-0.1])
    with pytest.raises(ValueError, match=r"p must lie in \[0, 1\]; found 1.5"):
        gradient_std([0.5, 1.5])


def test_gradient_std_error_names_the_first_inconsistent_index():
    # entries 0 (E[G] = E[G^2] = 0) and 1 (E[G^2] = 9 = E[G]^2, equal norms) sit exactly on Jensen's bound and are
    # valid; entry 2 (E[G^2] = 3 < 2^2) is the one named
    with pytest.raises(
        ValueError, match=r"sq_norm_correct must be >= mean_norm_correct\^2 .*found 3.0 < 2.0\^2 at index \(2,\)"
    ):
        gradient_std([0.5, 0.5, 0.5], [0.0, 3.0, 2.0], [0.0, 9.0, 3.0])
    with pytest.raises(
        ValueError, match=r"sq_norm_wrong must be >= mean_norm_wrong\^2 .*found 0.5 < 1.0\^2 at index \(1,\)"
    ):
        gradient_std([0.5, 0.5], 1.0, 1.0, [3.0, 1.0], [9.0, 0.5])
    with pytest.raises(ValueError, match=r"mean_norm_wrong must be >= 0"):
        gradient_std([0.5], 1.0, 1.0, -1.0, 1.0)
    # on the bound in every entry: equal norms G = [0, 3], sigma = G sqrt(p (1 - p)) = [0, 3 * 0.5]
    assert_allclose(gradient_std([0.5, 0.5], [0.0, 3.0], [0.0, 9.0], [0.0, 3.0], [0.0, 9.0]), [0.0, 1.5], rtol=1e-15)


# ---------------------------------------------------------------------------------------------------------------
# rollout counts
# ---------------------------------------------------------------------------------------------------------------


def test_rollout_counts_hand():
    # sigma = [.5, .3, 0, .2], budget 20, min 2:
    #   quotas 20 * sigma / 1.0 = [10, 6, 0, 4]: prompt 2 is below 2 -> fixed at 2, 18 left
    #   quotas 18 * [.5, .3, .2] / 1.0 = [9, 5.4, 3.6]: floors [9, 5, 3] = 17, the leftover 1 -> largest remainder
    #   (.6, prompt 3) -> [9, 5, 2, 4]
    assert_array_equal(rollout_counts([0.5, 0.3, 0.0, 0.2], 20), [9, 5, 2, 4])
    # min 1: prompt 2 (quota 0) is fixed at 1, 19 left: quotas 19 * [.5, .3, .2] = [9.5, 5.7, 3.8], floors 17, the
    # 2 leftovers to the largest remainders .8 (prompt 3) and .7 (prompt 1) -> [9, 6, 1, 4]
    assert_array_equal(rollout_counts([0.5, 0.3, 0.0, 0.2], 20, min_count=1), [9, 6, 1, 4])
    # where no prompt is below the floor the counts are the proportional split: 20 * [.5, .3, .2] = [10, 6, 4]
    assert_array_equal(rollout_counts([0.5, 0.3, 0.2], 20), [10, 6, 4])


def test_rollout_counts_edges():
    # all equal, budget not divisible: 10 over 3 -> quotas 3.33 each, the extra one to the earliest prompt
    assert_array_equal(rollout_counts([1.0, 1.0, 1.0], 10), [4, 3, 3])
    # every sigma 0 (every prompt always or never solved): even split
    assert_array_equal(rollout_counts([0.0, 0.0, 0.0, 0.0], 18), [5, 5, 4, 4])
    # the budget exactly covers the floor
    assert_array_equal(rollout_counts([0.9, 0.1], 4), [2, 2])
    # one prompt takes everything above the floors of the others
    assert_array_equal(rollout_counts([1.0, 0.0, 0.0], 12), [8, 2, 2])
    # the cascade: after fixing prompt 2, prompt 1's quota drops below the floor too
    # quotas 10 * [.8, .15, .05] = [8, 1.5, .5] -> prompts 1, 2 below 2 -> 2 each, prompt 0 gets 6
    assert_array_equal(rollout_counts([0.8, 0.15, 0.05], 10), [6, 2, 2])
    with pytest.raises(ValueError, match="less than min_count"):
        rollout_counts([1.0, 1.0], 3)
    with pytest.raises(ValueError, match="sigma must be >= 0"):
        rollout_counts([-1.0, 1.0], 8)
    with pytest.raises(ValueError, match="min_count"):
        rollout_counts([1.0], 8, min_count=0)


def test_rollout_counts_fixes_a_low_quota_before_splitting():
    # sigma = [.11, .03, .06] (total .2 < 1), budget 12, min 2:
    #   quotas 12 * [.11, .03, .06] / .2 = [6.6, 1.8, 3.6]: prompt 1 is below 2 -> fixed at 2, 10 left
    #   quotas 10 * [.11, .06] / .17 = [6.4706, 3.5294]: floors 6 + 3 = 9, the leftover 1 -> remainder .53 (prompt 2)
    #   -> [6, 2, 4]  (splitting [6.6, 1.8, 3.6] directly would round prompt 1 up to 2 and give [7, 2, 3])
    assert_array_equal(rollout_counts([0.11, 0.03, 0.06], 12), [6, 2, 4])


def test_rollout_counts_open_prompt_at_the_floor_stays_in_the_split():
    # sigma = [6, 2, 1], budget 11, min 1: quotas 11 * [6, 2, 1] / 9 = [7.333, 2.444, 1.222], none below 1
    #   floors 7 + 2 + 1 = 10, the leftover 1 -> largest remainder .444 (prompt 1) -> [7, 3, 1]
    #   (prompt 2 gets floor(1.222) = 1 = min_count from the split; it is not re-fixed and re-split)
    assert_array_equal(rollout_counts([6.0, 2.0, 1.0], 11, min_count=1), [7, 3, 1])


def test_rollout_counts_single_prompt_takes_the_budget():
    # P = 1: quota R * sigma / sigma = R, whatever sigma (or 0: the even split of R over one prompt)
    assert_array_equal(rollout_counts([2.0], 8, min_count=3), [8])
    assert_array_equal(rollout_counts([0.5], 5), [5])
    assert_array_equal(rollout_counts([0.0], 7), [7])


def test_rollout_counts_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"sigma must be a non-empty 1-D array .*got shape \(0,\)"):
        rollout_counts([], 0)
    with pytest.raises(ValueError, match=r"sigma must be a non-empty 1-D array .*got shape \(1, 2\)"):
        rollout_counts([[1.0, 1.0]], 4)
    # budget 0 is below the floor of one prompt: min_count * P = 2 * 1 = 2
    with pytest.raises(ValueError, match=r"budget=0 is less than min_count \* prompts = 2 \* 1 = 2"):
        rollout_counts([1.0], 0)
    with pytest.raises(ValueError, match="budget must be an integer >= 0, got -1"):
        rollout_counts([1.0], -1)
    # integers only: bools and floats (even whole ones) are refused
    with pytest.raises(ValueError, match="budget must be an integer >= 0, got True"):
        rollout_counts([1.0], True)
    with pytest.raises(ValueError, match="budget must be an integer >= 0, got 8.0"):
        rollout_counts([1.0], 8.0)
    with pytest.raises(ValueError, match="min_count must be an integer >= 1, got True"):
        rollout_counts([1.0, 1.0], 4, min_count=True)
    with pytest.raises(ValueError, match="min_count must be an integer >= 1, got 2.0"):
        rollout_counts([1.0, 1.0], 4, min_count=2.0)
    # numpy integers are integers: 10 over quotas 10 * [1, 2] / 3 = [3.33, 6.67] -> floors 9, leftover to .67
    assert_array_equal(rollout_counts([1.0, 2.0], np.int64(10), min_count=np.int64(2)), [3, 7])


@settings(max_examples=300, deadline=None)
@given(
    sigma=st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1.0)), min_size=1, max_size=24),
    extra=st.integers(0, 200),
    min_count=st.integers(1, 4),
)
def test_rollout_counts_properties(sigma, extra, min_count):
    s = np.array(sigma)
    budget = min_count * len(sigma) + extra
    c = rollout_counts(s, budget, min_count)
    assert c.sum() == budget and c.min() >= min_count
    # monotone: a larger sigma never gets fewer rollouts
    assert not ((s[:, None] > s[None, :]) & (c[:, None] < c[None, :])).any()
    # proportional above the floor: one lambda (rollouts per unit of sigma) puts every prompt above the floor within
    # one rollout of lambda * sigma_i, and every prompt at the floor below min_count + 1
    lo, hi = 0.0, math.inf
    for si, ci in zip(s, c):
        if ci > min_count:
            assert si > 0 or s.sum() == 0
            if si > 0:
                lo, hi = max(lo, (ci - 1) / si), min(hi, (ci + 1) / si)
        elif si > 0:
            hi = min(hi, (min_count + 1) / si)
    assert lo < hi * (1 + 1e-9), (lo, hi)


def test_per_prompt_arguments_of_the_wrong_shape_and_overflowing_temperatures_are_named():
    with pytest.raises(
        ValueError, match=r"temperature must be a scalar or one value per prompt, shape \(2,\); got shape \(3,\)"
    ):
        sampling_probs([0.5, 0.5], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"sq_norm_wrong must be a scalar or one value per prompt, shape \(2,\); got"):
        gradient_std([0.5, 0.5], sq_norm_wrong=[1.0, 1.0, 1.0])
    # sqrt(1/4) / 1e-320 overflows float64 (it gave NaN probabilities before): refused, naming the temperature
    for t in (1e-320, [1.0, 5e-324]):
        with pytest.raises(ValueError, match=r"temperature [0-9.e-]+ at index \(\d,\) is too small: .* overflows"):
            sampling_probs([0.25, 0.5], t)
    # a tiny but representable temperature is a point mass on the largest sqrt(p (1 - p)), without NaN
    assert_array_equal(sampling_probs([0.5, 0.25, 1.0], 1e-300), [1.0, 0.0, 0.0])
