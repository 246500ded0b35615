"""The expected learning signal of a group of rollouts, and the best allocation fixed before any reward is seen.

A group of n rollouts of a prompt with success probability p has non-zero reward variance (GRPO's group advantage,
hence its gradient, is non-zero) with probability 1 - p^n - (1 - p)^n: Knapsack RL (Li et al. 2025, arXiv
2509.25849) calls it the probability of a non-zero gradient. `best_fixed_allocation` maximises any separable gain of
the counts exactly (a knapsack by dynamic programming); `oracle_allocation` is it for the true p (the simulator's
oracles, `xrpo.sim`). Everything is numpy on the host.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "as_rates",
    "best_fixed_allocation",
    "check_count",
    "expected_informative_rollouts",
    "finite_array",
    "nonzero_variance_prob",
    "oracle_allocation",
]


def check_count(value, name: str, minimum: int) -> int:
    """``value`` as an int, checked to be a whole number >= ``minimum`` (a ValueError names ``name``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def finite_array(x, name: str) -> np.ndarray:
    """``x`` (array-like or a torch tensor) as a float64 array, checked to be finite (a ValueError names ``name`` and
    the first bad index)."""
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be numeric, got {type(x).__name__}") from None
    if not np.all(np.isfinite(a)):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise ValueError(f"{name} must be finite; found {a[bad]} at index {bad}")
    return a


def as_rates(p, name: str = "p") -> np.ndarray:
    """``p`` as a float64 array of success probabilities, checked to lie in [0, 1] (a ValueError names ``name``)."""
    try:
        a = np.asarray(p, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be numeric success probabilities, got {type(p).__name__}") from None
    bad = ~np.isfinite(a) | (a < 0) | (a > 1)
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        raise ValueError(f"{name} must hold probabilities in [0, 1]; found {a[i]} at index {i}")
    return a


def nonzero_variance_prob(p, n):
    """Probability that a group of n Bernoulli(p) rewards is not all equal (GRPO's group advantage is non-zero).

    Knapsack RL (Li et al. 2025, arXiv 2509.25849) calls it the probability of a non-zero gradient. 0 for n <= 1
    and for p in {0, 1}. ``p`` and ``n`` broadcast.

    Args:
        p: success probabilities in [0, 1].
        n: rollout counts, whole numbers >= 0.

    Returns:
        float64 array (broadcast shape).
    """
    pp = as_rates(p)
    nn = np.asarray(n, dtype=np.float64)
    if np.any(nn < 0) or not np.all(nn == np.round(nn)):
        raise ValueError(f"n must hold whole numbers >= 0, got {n!r}")
    # P(0 < successes < n) = 1 - p^n - (1 - p)^n   (n = 0 gives 1 - 1 - 1 < 0: clipped to 0 below)
    q = 1.0 - np.power(pp, nn) - np.power(1.0 - pp, nn)
    return np.where(nn >= 2, np.maximum(q, 0.0), 0.0)


def expected_informative_rollouts(p, n):
    """Expected rollouts of a group of n that land in a group with non-zero reward variance: n (1 - p^n - (1-p)^n)."""
    return np.asarray(n, dtype=np.float64) * nonzero_variance_prob(p, n)


def best_fixed_allocation(gain, budget: int, n_min: int = 0) -> np.ndarray:
    """The allocation that maximises a separable objective sum_q gain[q, n_q], exactly (dynamic programming).

    Maximises over integer n_q >= n_min with sum_q n_q = budget. With ``gain[q, n] = E[objective of prompt q given n
    rollouts]`` computed from the true p, this is the best allocation in hindsight among the allocations fixed
    before any reward is seen. Ties go to the fewest rollouts for the later prompts (argmax takes the first).
    Cost O(Q budget^2).

    Args:
        gain: (Q, budget + 1) float array, finite: gain[q, n] for n = 0..budget.
        budget: total rollouts, integer >= n_min * Q.
        n_min: least rollouts per prompt, integer >= 0.

    Returns:
        int64 array of shape (Q,) summing to ``budget``.
    """
    B = check_count(budget, "budget", 0)
    m = check_count(n_min, "n_min", 0)
    g = np.asarray(gain, dtype=np.float64)
    if g.ndim != 2 or g.shape[0] == 0 or g.shape[1] != B + 1:
        raise ValueError(f"gain must have shape (prompts, budget + 1) = (Q, {B + 1}), got {g.shape}")
    if not np.all(np.isfinite(g)):
        raise ValueError("gain must be finite")
    Q = g.shape[0]
    if m * Q > B:
        raise ValueError(f"budget={B} is less than n_min * prompts = {m} * {Q} = {m * Q}")
    b = np.arange(B + 1)
    ks = np.arange(m, B - m * (Q - 1) + 1)  # what one prompt can get when every other one has at least m
    rest = b[:, None] - ks[None, :]  # (B+1, K): rollouts left for the earlier prompts
    mask = np.where(rest >= 0, 0.0, -np.inf)
    rest_c = np.clip(rest, 0, B)
    # dp[b]: best total of the prompts so far with b rollouts spent among them
    dp = np.where(b == 0, 0.0, -np.inf)
    choice = np.zeros((Q, B + 1), dtype=np.int64)
    for q in range(Q):
        # cand[b, k] = dp[b - k] + gain[q, k]
        cand = dp[rest_c] + (g[q, ks][None, :] + mask)
        j = np.argmax(cand, axis=1)
        choice[q] = ks[j]
        dp = cand[b, j]
    counts = np.zeros(Q, dtype=np.int64)
    left = B
    for q in range(Q - 1, -1, -1):
        counts[q] = choice[q, left]
        left -= counts[q]
    if left != 0 or not np.isfinite(dp[B]):  # unreachable when m * Q <= B
        raise RuntimeError(f"best_fixed_allocation: no feasible allocation (left {left})")
    return counts


def oracle_allocation(p, budget: int, n_min: int = 0, objective: str = "rollouts") -> np.ndarray:
    """The best allocation in hindsight: the counts, fixed before any reward is drawn, that maximise the expected
    objective given the true success probabilities (exactly, :func:`best_fixed_allocation`).

    Objectives: ``"rollouts"``, sum_q n_q (1 - p_q^n_q - (1 - p_q)^n_q), the expected rollouts in groups with
    non-zero reward variance; ``"groups"``, sum_q (1 - p_q^n_q - (1 - p_q)^n_q), the expected groups with a non-zero
    gradient (Knapsack RL's success term without its InfoGain weight).

    It bounds every allocation fixed in advance, in expectation. A rule that looks at rewards within the step (HRP)
    can do better on a given draw, and could in principle beat it in expectation.

    Args:
        p: (Q,) true success probabilities.
        budget: rollouts of the step, >= n_min * Q.
        n_min: least rollouts per prompt (the simulator uses n_base, HRP's own floor).
        objective: "rollouts" or "groups".

    Returns:
        int64 array (Q,) summing to ``budget``.
    """
    pp = as_rates(p)
    if pp.ndim != 1 or pp.shape[0] == 0:
        raise ValueError(f"p must be a non-empty 1-D array, got shape {pp.shape}")
    B = check_count(budget, "budget", 0)
    n = np.arange(B + 1)[None, :]
    if objective == "rollouts":
        gain = expected_informative_rollouts(pp[:, None], n)
    elif objective == "groups":
        gain = nonzero_variance_prob(pp[:, None], n)
    else:
        raise ValueError(f"objective must be 'rollouts' or 'groups', got {objective!r}")
    return best_fixed_allocation(gain, B, n_min)
