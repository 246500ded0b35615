"""The allocation simulator's core: what a step's rollout budget buys under each allocation rule, with no model.

Issue #19, item 1 (`xrpo simulate`, docs/simulate.md). Every prompt q of a step has a true success probability p_q
and every rollout of it a Bernoulli(p_q) reward of 0 or 1 (an ICL-seeded rollout: Bernoulli(p_icl(p_q)),
:func:`icl_success_prob`). The rules are the library's own functions, called as the trainer calls them:

    uniform (GRPO)     split_budget(0, B) in one batch                              (planner, GRPO path)
    hrp / hrp-greedy   plan_phases, then allocate_round per planning round          (planner, Algorithm 1)
    no-hrp             plan_phases, then an even split_budget per round (+ ICL)     (planner, w/o-HRP ablation)
    cures              beta_posterior .. rollout_counts                             (CuresState.select)
    dapo               GRPO batches, dynamic_sampling_keep_groups, refilled up to max_gen_batches (training loop)
    oracle             the best fixed allocation given the true p: :func:`best_fixed_allocation`

A step's result is a :class:`StepOutcome` (one row per generated group) and :func:`step_metrics` turns it into the
figures the simulator reports. Everything here is numpy with explicit ``numpy.random.Generator`` arguments: the same
generator state gives the same step.

Also here: the paper's latency model of phased generation (appendix "Latency Analysis"): :func:`round_latency`,
:func:`latency_ratio`, :func:`phase_latency`. The intervals the simulator reports are `xrpo.algo.stats`'.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from xrpo.algo.allocation import allocate_round, plan_phases, split_budget
from xrpo.algo.cures import (
    beta_posterior,
    gradient_std,
    posterior_mean,
    prompt_temperature,
    rollout_counts,
    sample_prompts,
    sampling_probs,
)
from xrpo.algo.sampling import dynamic_sampling_keep_groups

__all__ = [
    "PhasedResult",
    "StepOutcome",
    "bernoulli_draw",
    "best_fixed_allocation",
    "cures_allocation",
    "dapo_step",
    "expected_informative_rollouts",
    "icl_success_prob",
    "latency_ratio",
    "mixture_moment",
    "mixture_zero_variance_share",
    "nonzero_variance_prob",
    "oracle_allocation",
    "outcome_from_phased",
    "fit_success_rate_mixture",
    "fixed_outcome",
    "phase_latency",
    "step_latency",
    "stream_latency",
    "phased_step",
    "round_latency",
    "sample_mixture",
    "step_metrics",
    "uniform_counts",
]

# A reward source: draw(prompt_indices (k,), counts (k,), seeded (k,) bool, round) -> k float arrays of rewards.
Draw = Callable[[np.ndarray, np.ndarray, np.ndarray, int], list]


def _int(value, name: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _rates(p, name: str = "p") -> np.ndarray:
    try:
        a = np.asarray(p, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be numeric success probabilities, got {type(p).__name__}") from None
    bad = ~np.isfinite(a) | (a < 0) | (a > 1)
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        raise ValueError(f"{name} must hold probabilities in [0, 1]; found {a[i]} at index {i}")
    return a


# ---------------------------------------------------------------------------------------------------------------
# success rates and rewards
# ---------------------------------------------------------------------------------------------------------------


def sample_mixture(weights: Sequence[float], components: Sequence, k: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``k`` success probabilities from a mixture of Beta distributions and point masses.

    Args:
        weights: mixture weights, one per component, >= 0, summing to 1 (within 1e-9).
        components: per component either a pair (a, b) with a, b > 0 (Beta(a, b)) or a number in [0, 1] (every
            prompt of that component has exactly that rate: p = 0 is a prompt the model never solves).
        k: how many, >= 0.
        rng: numpy Generator.

    Returns:
        float64 array of shape (k,) in [0, 1]. One ``rng.choice`` for the components, then one ``rng.beta`` per
        Beta component, in component order.
    """
    k = _int(k, "k", 0)
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.shape[0] == 0 or w.shape[0] != len(components):
        raise ValueError(f"weights must be one number per component ({len(components)} components), got {weights!r}")
    if np.any(~np.isfinite(w)) or np.any(w < 0) or abs(w.sum() - 1.0) > 1e-9:
        raise ValueError(f"mixture weights must be >= 0 and sum to 1, got {list(w)} (sum {w.sum():g})")
    which = rng.choice(w.shape[0], size=k, p=w / w.sum())
    out = np.empty(k, dtype=np.float64)
    for c, comp in enumerate(components):
        sel = which == c
        if isinstance(comp, (tuple, list)):
            a, b = (float(x) for x in comp)
            if not (a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)):
                raise ValueError(f"component {c}: Beta parameters must be finite and > 0, got ({a}, {b})")
            out[sel] = rng.beta(a, b, size=int(sel.sum()))
        else:
            x = float(comp)
            if not 0.0 <= x <= 1.0:
                raise ValueError(f"component {c}: a fixed success rate must lie in [0, 1], got {comp!r}")
            out[sel] = x
    return out


def fit_success_rate_mixture(successes, trials) -> tuple[float, float, float, float, float]:
    """Maximum-likelihood fit of a success-rate distribution to per-prompt counts: w0 delta_0 + w1 delta_1 +
    wb Beta(a, b), each prompt's count k_i of n_i being Binomial(n_i, p_i) with p_i drawn from the mixture:

        L = sum_i log( w0 1{k_i = 0} + w1 1{k_i = n_i} + wb C(n_i, k_i) B(k_i + a, n_i - k_i + b) / B(a, b) )

    (the Beta part is the Beta-binomial). It recovers a distribution of p from counts of a few rollouts each, where
    the raw rates k_i / n_i put every 0-of-n prompt at exactly p = 0. With few rollouts per prompt a prompt near 0 and
    one at 0 are hard to tell apart: the split between w0 and a Beta part near 0 is then loosely determined, while the
    distribution of counts at the observed n is fitted well. L-BFGS-B from three starting points; the best is kept.

    Args:
        successes, trials: (K,) whole numbers, 0 <= k_i <= n_i, n_i >= 1.

    Returns:
        (w0, w1, wb, a, b): weights summing to 1, Beta parameters > 0.
    """
    from scipy import optimize, special

    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    if k.shape != n.shape or k.ndim != 1 or k.shape[0] == 0:
        raise ValueError(f"successes and trials must be non-empty 1-D arrays of equal length, got {k.shape}, {n.shape}")
    if np.any(n < 1) or np.any(k < 0) or np.any(k > n) or not np.all(k == np.round(k)) or not np.all(n == np.round(n)):
        raise ValueError("need whole numbers with 0 <= successes <= trials and trials >= 1")
    zero, full = (k == 0).astype(np.float64), (k == n).astype(np.float64)
    log_binom = special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)

    def nll(theta: np.ndarray) -> float:
        z = theta[:3] - theta[:3].max()
        w = np.exp(z) / np.exp(z).sum()
        a, b = np.exp(theta[3]), np.exp(theta[4])
        # Beta-binomial pmf: C(n, k) B(k + a, n - k + b) / B(a, b)
        bb = np.exp(log_binom + special.betaln(k + a, n - k + b) - special.betaln(a, b))
        like = w[0] * zero + w[1] * full + w[2] * bb
        return float(-np.mean(np.log(np.maximum(like, 1e-300))))

    best = None
    for a0, b0 in ((0.5, 0.5), (1.0, 3.0), (3.0, 1.0)):
        r = optimize.minimize(
            nll,
            np.array([0.0, 0.0, 0.0, math.log(a0), math.log(b0)]),
            method="L-BFGS-B",
            bounds=[(-30, 30)] * 3 + [(math.log(1e-3), math.log(1e3))] * 2,
        )
        if best is None or r.fun < best.fun:
            best = r
    z = best.x[:3] - best.x[:3].max()
    w = np.exp(z) / np.exp(z).sum()
    return float(w[0]), float(w[1]), float(w[2]), float(np.exp(best.x[3])), float(np.exp(best.x[4]))


def icl_success_prob(p, mult: float = 1.0, add: float = 0.0) -> np.ndarray:
    """Success probability of an ICL-seeded rollout of a prompt whose plain rollouts succeed with probability p.

    The simulator's model of ICL seeding (XRPO paper §3.2): p_icl = clip(mult * p + add, 0, 1). ``mult`` scales how
    often a seeded rollout succeeds relative to a plain one (issue #19's audit of the default task measured ICL
    flipping a 0/4 prompt in 5.8-6.4% of cases against 11.9% for four more plain rollouts: mult about 0.5 there);
    ``add`` lets a never-solved prompt (p = 0) be solved from its examples, the case ICL seeding is for.

    Args:
        p: plain success probabilities in [0, 1], any shape.
        mult: >= 0.
        add: in [-1, 1].

    Returns:
        float64 array of p's shape.
    """
    pp = _rates(p)
    if not (math.isfinite(mult) and mult >= 0):
        raise ValueError(f"icl mult must be a finite number >= 0, got {mult!r}")
    if not (math.isfinite(add) and -1.0 <= add <= 1.0):
        raise ValueError(f"icl add must lie in [-1, 1], got {add!r}")
    # p_icl = clip(mult * p + add, 0, 1)
    return np.clip(mult * pp + add, 0.0, 1.0)


def bernoulli_draw(p, p_icl, rng: np.random.Generator) -> Draw:
    """The simulator's reward source: rollout j of prompt q gets reward 1 with probability p[q] (p_icl[q] when the
    prompt is ICL-seeded in that round), else 0. Uniforms are drawn in one call per round, prompt by prompt."""
    pp, pi = _rates(p), _rates(p_icl, "p_icl")

    def draw(idx: np.ndarray, counts: np.ndarray, seeded: np.ndarray, rnd: int) -> list:
        u = rng.random(int(np.sum(counts)))
        prob = np.repeat(np.where(seeded, pi[idx], pp[idx]), counts)
        r = (u < prob).astype(np.float64)
        ends = np.cumsum(counts).tolist()
        return [r[a:b] for a, b in zip([0] + ends[:-1], ends)]

    return draw


# ---------------------------------------------------------------------------------------------------------------
# expected signal of a group, and the best fixed allocation
# ---------------------------------------------------------------------------------------------------------------


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
    pp = _rates(p)
    nn = np.asarray(n, dtype=np.float64)
    if np.any(nn < 0) or not np.all(nn == np.round(nn)):
        raise ValueError(f"n must hold whole numbers >= 0, got {n!r}")
    # P(0 < successes < n) = 1 - p^n - (1 - p)^n   (n = 0 gives 1 - 1 - 1 < 0: clipped to 0 below)
    q = 1.0 - np.power(pp, nn) - np.power(1.0 - pp, nn)
    return np.where(nn >= 2, np.maximum(q, 0.0), 0.0)


def mixture_moment(weights: Sequence[float], components: Sequence, n: int) -> float:
    """E[p^n] for p drawn from a mixture of Beta distributions and point masses (:func:`sample_mixture`'s arguments).

    Exact: a point mass x contributes x^n, Beta(a, b) contributes prod_{i<n} (a + i) / (a + b + i).
    """
    n = _int(n, "n", 0)
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.shape[0] != len(components) or np.any(w < 0) or abs(w.sum() - 1.0) > 1e-9:
        raise ValueError(f"weights must be >= 0, one per component ({len(components)}), summing to 1; got {weights!r}")
    total = 0.0
    for c, (wc, comp) in enumerate(zip(w, components)):
        if isinstance(comp, (tuple, list)):
            a, b = (float(x) for x in comp)
            if not (a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)):
                raise ValueError(f"component {c}: Beta parameters must be finite and > 0, got ({a}, {b})")
            m = 1.0
            for i in range(n):
                m *= (a + i) / (a + b + i)
        else:
            x = float(comp)
            if not 0.0 <= x <= 1.0:
                raise ValueError(f"component {c}: a fixed success rate must lie in [0, 1], got {comp!r}")
            m = x**n
        total += float(wc) * m
    return total


def mixture_zero_variance_share(weights: Sequence[float], components: Sequence, n: int) -> float:
    """Expected share of groups of n rollouts whose rewards are all equal, E[p^n + (1 - p)^n], for p drawn from the
    mixture (1 - p of Beta(a, b) is Beta(b, a)); 1 for n <= 1, as :func:`nonzero_variance_prob` gives 0 there."""
    n = _int(n, "n", 0)
    if n <= 1:
        return 1.0
    flipped = [(c[1], c[0]) if isinstance(c, (tuple, list)) else 1.0 - float(c) for c in components]
    return mixture_moment(weights, components, n) + mixture_moment(weights, flipped, n)


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
    B = _int(budget, "budget", 0)
    m = _int(n_min, "n_min", 0)
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


# ---------------------------------------------------------------------------------------------------------------
# one step of each rule
# ---------------------------------------------------------------------------------------------------------------


def uniform_counts(num_prompts: int, budget: int) -> np.ndarray:
    """GRPO's counts: the budget split evenly in one batch (the planner's single-batch path, ``split_budget(0, B)``;
    when the prompts do not divide the budget the earlier prompts get one more)."""
    return split_budget(np.zeros(_int(num_prompts, "num_prompts", 1)), _int(budget, "budget", 0))


class PhasedResult(NamedTuple):
    """One phased step (Algorithm 1 lines 2-13) as the planner runs it."""

    rewards: list
    """Q float arrays: every reward of each prompt, in generation order."""
    allocs: list
    """One int64 (Q,) array per generation round that ran: the base round, then each planning round with budget > 0."""
    seeded: list
    """One bool (Q,) array per round: prompts whose rollouts of that round came from an ICL prompt."""
    successes: list
    """One int64 (Q,) array per round: rollouts with reward >= full_reward per prompt in that round."""
    nonuniform: list
    """One bool per planning round: its allocation differs from an even split (the planner's rule)."""


def phased_step(
    num_prompts: int,
    budget: int,
    draw: Draw,
    *,
    n_base: int = 4,
    rounds: int = 2,
    allocation: str = "hrp",
    mode: str = "proportional",
    alpha: float = 0.05,
    lam: float = 0.1,
    max_per_prompt=None,
    icl: bool = False,
    full_reward: float = 1.0,
) -> PhasedResult:
    """One step of the XRPO planner's phases with rewards from ``draw``: ``n_base`` rollouts per prompt, then for each
    planning round of ``plan_phases`` the allocation from ``allocate_round`` (``allocation="hrp"``, ``mode``
    "proportional" or "greedy") or an even ``split_budget`` (``"uniform"``, the w/o-HRP ablation). With ``icl`` a
    prompt that gets rollouts in a round and has no reward >= ``full_reward`` so far draws them seeded (Algorithm 1
    lines 9-10), as the planner does when its corpus has examples for it (the simulator assumes it always has).

    Args:
        num_prompts: Q >= 1.
        budget: rollouts of the step, >= n_base * Q.
        draw: reward source (:func:`bernoulli_draw`, or a replay of recorded rewards).
        n_base, rounds, alpha, lam, max_per_prompt, mode: as in the planner's ``PlanConfig``.

    Returns:
        :class:`PhasedResult`.
    """
    if allocation not in ("hrp", "uniform"):
        raise ValueError(f"allocation must be 'hrp' or 'uniform', got {allocation!r}")
    P = _int(num_prompts, "num_prompts", 1)
    phases = plan_phases(P, budget, n_base, rounds)
    idx = np.arange(P)
    by_prompt: list[list[np.ndarray]] = [[] for _ in range(P)]
    solved = np.zeros(P, dtype=bool)
    allocs, seeded_all, succ_all, nonuni = [], [], [], []

    def run(alloc: np.ndarray, seeded: np.ndarray, rnd: int) -> None:
        new = draw(idx, alloc, seeded, rnd)
        succ = np.zeros(P, dtype=np.int64)
        for q in range(P):
            r = np.asarray(new[q], dtype=np.float64)
            if r.shape != (int(alloc[q]),):
                raise ValueError(f"draw returned {r.shape[0]} rewards for prompt {q}, expected {int(alloc[q])}")
            by_prompt[q].append(r)
            succ[q] = int(np.count_nonzero(r >= full_reward))
        np.logical_or(solved, succ > 0, out=solved)
        allocs.append(alloc)
        seeded_all.append(seeded)
        succ_all.append(succ)

    run(np.full(P, phases.base_per_prompt, dtype=np.int64), np.zeros(P, dtype=bool), 0)
    for t, b in enumerate(phases.round_budgets, start=1):
        if b == 0:
            continue
        rewards = [np.concatenate(r) for r in by_prompt]
        if allocation == "hrp":
            alloc = allocate_round(rewards, b, alpha=alpha, lam=lam, max_per_prompt=max_per_prompt, mode=mode)
        else:
            alloc = split_budget(np.zeros(P), b, max_per_prompt=max_per_prompt)
        # the planner's "nonuniform" flag: an even split of b over P prompts differs by at most 1 (0 if P divides b)
        nonuni.append(bool(int(alloc.max() - alloc.min()) > (0 if b % P == 0 else 1)))
        seeded = (alloc > 0) & ~solved if icl else np.zeros(P, dtype=bool)
        run(alloc.astype(np.int64), seeded, t)
    return PhasedResult([np.concatenate(r) for r in by_prompt], allocs, seeded_all, succ_all, nonuni)


def cures_allocation(
    successes,
    trials,
    k: int,
    budget: int,
    rng: np.random.Generator,
    *,
    prior_alpha: float = 1.0,
    prior_beta: float = 1.0,
    temp_scale: float = 100.0,
    min_count: int = 2,
):
    """CurES's choice of prompts and counts from its Beta posterior (the composition ``CuresState.select`` runs).

    Args:
        successes, trials: (N,) earlier successes / rollouts of each candidate prompt (the posterior's counts).
        k: prompts to draw, <= N.
        budget: rollouts of the step, >= min_count * k.
        rng: numpy Generator (``sample_prompts``).

    Returns:
        (indices (k,) in draw order, counts (k,) int64 summing to ``budget``).
    """
    alpha, beta = beta_posterior(successes, trials, prior_alpha, prior_beta)
    p = posterior_mean(alpha, beta)
    idx = sample_prompts(sampling_probs(p, prompt_temperature(alpha, temp_scale)), k, rng)
    # G = 1 for every rollout: sigma_i = sqrt(p_i (1 - p_i)), as in the trainer (docs/methods.md, CurES)
    counts = rollout_counts(gradient_std(p[idx]), budget, min_count)
    return idx, counts


class StepOutcome(NamedTuple):
    """Every group a method generated in one step (one row per group; DAPO: over all its generation batches)."""

    p: np.ndarray
    """(G,) true success probability of the group's prompt (plain rollouts)."""
    counts: np.ndarray
    """(G,) rollouts generated for the group."""
    successes: np.ndarray
    """(G,) of them with reward 1 (ICL-seeded ones included)."""
    trained: np.ndarray
    """(G,) bool: the group enters the policy update (False: generated, then dropped by DAPO's filter)."""
    seeded: np.ndarray
    """(G,) int: planning rounds in which the group's rollouts were ICL-seeded."""
    flips: np.ndarray
    """(G,) int: of those rounds, the ones with a successful seeded rollout (the planner's ``icl/flips``)."""
    nonuniform: tuple = ()
    """One bool per planning round: allocation differs from an even split."""


def outcome_from_phased(p, res: PhasedResult) -> StepOutcome:
    """:class:`StepOutcome` of a :func:`phased_step`."""
    counts = np.array([r.shape[0] for r in res.rewards], dtype=np.int64)
    succ = np.sum(res.successes, axis=0).astype(np.int64)
    seeded = np.sum(res.seeded, axis=0).astype(np.int64)
    flips = np.sum([s & (c > 0) for s, c in zip(res.seeded, res.successes)], axis=0).astype(np.int64)
    return StepOutcome(
        np.asarray(p, dtype=np.float64),
        counts,
        succ,
        np.ones(counts.shape[0], dtype=bool),
        seeded,
        flips,
        tuple(res.nonuniform),
    )


def fixed_outcome(p, counts, rng: np.random.Generator) -> StepOutcome:
    """:class:`StepOutcome` of fixed per-prompt counts generated in one batch (GRPO, CurES, the oracle): successes
    ~ Binomial(counts, p), one ``rng.binomial`` call (a batch's rewards only matter through each group's count)."""
    pp = _rates(p)
    c = np.asarray(counts, dtype=np.int64)
    if c.shape != pp.shape or np.any(c < 0):
        raise ValueError(f"counts must be one integer >= 0 per prompt ({pp.shape[0]}), got {counts!r}")
    succ = rng.binomial(c, pp).astype(np.int64)
    z = np.zeros(pp.shape[0], dtype=np.int64)
    return StepOutcome(pp, c, succ, np.ones(pp.shape[0], dtype=bool), z, z.copy())


def dapo_step(
    first_p,
    new_prompts: Callable[[int], np.ndarray],
    num_prompts: int,
    budget: int,
    max_gen_batches: int,
    rng: np.random.Generator,
) -> StepOutcome:
    """DAPO's dynamic sampling as the training loop runs it: generate GRPO batches (``num_prompts`` prompts, the
    budget split evenly), keep the groups whose rewards are not all equal (``dynamic_sampling_keep_groups``), and
    draw further batches of fresh prompts until ``num_prompts`` groups are kept or ``max_gen_batches`` batches were
    generated; the last batch's kept groups beyond ``num_prompts`` are dropped (lowest group ids kept first).

    Args:
        first_p: (Q,) success probabilities of the step's first batch.
        new_prompts: k -> (k,) probabilities of k fresh prompts (a refill batch).
        num_prompts: Q, the groups the update wants.
        budget: rollouts per generation batch.
        max_gen_batches: >= 1.
        rng: numpy Generator for the rewards.

    Returns:
        :class:`StepOutcome` over every generated group; ``trained`` marks the kept ones.
    """
    Q = _int(num_prompts, "num_prompts", 1)
    G = _int(max_gen_batches, "max_gen_batches", 1)
    counts = uniform_counts(Q, budget)
    ids = np.repeat(np.arange(Q), counts)
    within = np.arange(ids.shape[0]) - np.repeat(np.cumsum(counts) - counts, counts)  # position inside its group
    ps, ss, ts = [], [], []
    kept, batches = 0, 0
    p = _rates(first_p)
    while kept < Q and batches < G:
        if batches > 0:
            p = _rates(new_prompts(Q))
        if p.shape != (Q,):
            raise ValueError(f"a DAPO batch needs {Q} success probabilities, got shape {p.shape}")
        succ = rng.binomial(counts, p).astype(np.int64)
        # the filter sees each group's rewards as a multiset: its successes first, then its failures
        rewards = (within < np.repeat(succ, counts)).astype(np.float64)
        keep = dynamic_sampling_keep_groups(rewards, ids)[: Q - kept]
        trained = np.zeros(Q, dtype=bool)
        trained[keep] = True
        ps.append(p)
        ss.append(succ)
        ts.append(trained)
        kept += int(keep.shape[0])
        batches += 1
    z = np.zeros(Q * batches, dtype=np.int64)
    return StepOutcome(
        np.concatenate(ps), np.tile(counts, batches), np.concatenate(ss), np.concatenate(ts), z, z.copy()
    )


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
    pp = _rates(p)
    if pp.ndim != 1 or pp.shape[0] == 0:
        raise ValueError(f"p must be a non-empty 1-D array, got shape {pp.shape}")
    B = _int(budget, "budget", 0)
    n = np.arange(B + 1)[None, :]
    if objective == "rollouts":
        gain = expected_informative_rollouts(pp[:, None], n)
    elif objective == "groups":
        gain = nonzero_variance_prob(pp[:, None], n)
    else:
        raise ValueError(f"objective must be 'rollouts' or 'groups', got {objective!r}")
    return best_fixed_allocation(gain, B, n_min)


# ---------------------------------------------------------------------------------------------------------------
# what a step bought
# ---------------------------------------------------------------------------------------------------------------


def step_metrics(o: StepOutcome, degenerate_eps: float = 0.0) -> dict[str, float]:
    """The simulator's figures of one step (docs/simulate.md defines each).

    A group is *informative* when its rewards are not all equal (0 < successes < counts): with 0/1 rewards that is
    exactly when GRPO's group advantage, hence its gradient, is non-zero. Rollouts of groups DAPO dropped count as
    generated, never as informative.

    Args:
        o: the step's groups.
        degenerate_eps: a prompt with p <= eps or p >= 1 - eps counts as always / never solved (0: exactly 0 or 1).
    """
    c, s, p, t = o.counts, o.successes, o.p, o.trained
    mixed = (s > 0) & (s < c)
    has = c > 0
    est = np.divide(s, c, out=np.zeros(c.shape, dtype=np.float64), where=has)
    generated = int(c.sum())
    m = {
        "rollouts_generated": float(generated),
        "rollouts_trained": float(c[t].sum()),
        "prompts": float(c.shape[0]),
        "informative_rollouts": float(c[t & mixed].sum()),
        "informative_groups": float(np.count_nonzero(t & mixed)),
        "informative_share": float(c[t & mixed].sum()) / generated if generated else 0.0,
        "groups_per_rollout": float(np.count_nonzero(t & mixed)) / generated if generated else 0.0,
        # (k_q / n_q - p_q)^2, averaged over the step's groups with n_q > 0
        "sq_error": float(np.mean((est[has] - p[has]) ** 2)) if has.any() else 0.0,
        "rollouts_p01": float(c[(p <= degenerate_eps) | (p >= 1.0 - degenerate_eps)].sum()),
        "rollouts_all_equal": float(c[has & ~mixed].sum()),
        "rollouts_dropped": float(c[~t].sum()),
        "seeded_prompts": float(o.seeded.sum()),
        "flips": float(o.flips.sum()),
        "planned_rounds": float(len(o.nonuniform)),
        "nonuniform_rounds": float(sum(o.nonuniform)),
    }
    return m


# ---------------------------------------------------------------------------------------------------------------
# latency of phased generation (XRPO paper, appendix "Latency Analysis")
# ---------------------------------------------------------------------------------------------------------------


def round_latency(total: int, concurrency: int, rounds: int, t0: float = 1.0, dt: float = 0.0) -> tuple[float, float]:
    """Step time of one batch (T1) and of ``rounds`` equal generation rounds (T2), paper appendix "Latency Analysis".

    An engine runs ``concurrency`` (m_p) rollouts at once, each taking t0; planning costs dt per round.

        T1 = ceil(N / m_p) t0
        T2 = n (ceil((N / n) / m_p) t0 + dt)

    Args:
        total: N, rollouts of the step, >= 1; ``rounds`` must divide it (the paper's assumption).
        concurrency: m_p >= 1.
        rounds: n >= 1 generation rounds.
        t0: time per rollout, > 0.
        dt: planning time per round, >= 0.

    Returns:
        (T1, T2).
    """
    N, m, n = _int(total, "total", 1), _int(concurrency, "concurrency", 1), _int(rounds, "rounds", 1)
    if N % n:
        raise ValueError(f"rounds={n} must divide total={N} (the paper's model has equal rounds); use phase_latency")
    _check_times(t0, dt)
    # T1 = ceil(N / m_p) t0
    t1 = math.ceil(N / m) * t0
    # T2 = n (ceil((N / n) / m_p) t0 + dt)
    t2 = n * (math.ceil((N // n) / m) * t0 + dt)
    return float(t1), float(t2)


def latency_ratio(total, concurrency, rounds, dt_over_t0: float = 0.0):
    """The paper's closed form of T2 / T1 (appendix "Latency Analysis"), ceilings replaced by their upper bound
    ceil(x / m_p) <= (x + m_p - 1) / m_p as the paper does:

        T2 / T1 = (N + n m_p - n + n m_p dt / t0) / (N + m_p - 1)
                = n - (n - 1) / (1 + (m_p - 1) / N)                        (dt = 0)

    which tends to 1 when m_p / N -> 0 and to n when m_p / N -> inf. Vectorised over the arguments (broadcast).

    Args:
        total: N > 0; concurrency: m_p >= 1; rounds: n >= 1; dt_over_t0: planning time per round in units of t0.
    """
    N = np.asarray(total, dtype=np.float64)
    m = np.asarray(concurrency, dtype=np.float64)
    n = np.asarray(rounds, dtype=np.float64)
    if np.any(N <= 0) or np.any(m < 1) or np.any(n < 1):
        raise ValueError("latency_ratio needs total > 0, concurrency >= 1 and rounds >= 1")
    if not (math.isfinite(dt_over_t0) and dt_over_t0 >= 0):
        raise ValueError(f"dt_over_t0 must be a finite number >= 0, got {dt_over_t0!r}")
    # T2 / T1 = ((N + n m_p - n) / m_p + n dt / t0) / ((N + m_p - 1) / m_p)
    r = (N + n * m - n + n * m * dt_over_t0) / (N + m - 1.0)
    return r[()] if r.ndim == 0 else r


def phase_latency(phase_sizes: Sequence[int], concurrency: int, t0: float = 1.0, dt: float = 0.0) -> float:
    """Step time of generation rounds of the given sizes, each ceil(size / m_p) t0 + dt (the paper's per-round cost,
    for rounds of unequal size such as XRPO's base round and planning rounds; a round of size 0 is not run)."""
    m = _int(concurrency, "concurrency", 1)
    _check_times(t0, dt)
    sizes = np.asarray(phase_sizes, dtype=np.float64)
    if sizes.ndim != 1 or np.any(sizes < 0) or not np.all(sizes == np.round(sizes)):
        raise ValueError(f"phase_sizes must be whole numbers >= 0, got {phase_sizes!r}")
    # sum over rounds of ceil(size / m_p) t0 + dt
    return float(sum(math.ceil(int(b) / m) * t0 + dt for b in sizes if b > 0))


def stream_latency(phase_sizes: Sequence[int], concurrency: int, t0: float = 1.0) -> float:
    """Step time of streaming planning (issue #20) in the paper's latency model: the ideal schedule's lower bound.

    Without a barrier between rounds, a free slot of the engine takes any prompt's next rollout, so the slots stay
    full (ceil(N / m_p) t0 in all) and planning happens while other rollouts decode (no dt); but each prompt's
    rounds still follow one another, each taking t0, so the step takes at least n t0 for n non-empty rounds:

        T3 = max(ceil(N / m_p), n) t0

    T3 = T1 when N / m_p >= n (a large batch on a small engine: the barrier's whole cost is saved) and T3 = T2 - n dt
    when m_p >= N (everything decodes at once: only the planning time is saved), the regime of a small model on a
    CPU. Rollouts of unequal length are `step_latency`'s case."""
    m = _int(concurrency, "concurrency", 1)
    _check_times(t0, 0.0)
    sizes = np.asarray(phase_sizes, dtype=np.float64)
    if sizes.ndim != 1 or np.any(sizes < 0) or not np.all(sizes == np.round(sizes)):
        raise ValueError(f"phase_sizes must be whole numbers >= 0, got {phase_sizes!r}")
    # T3 = max(ceil(N / m_p), n) t0
    return float(max(math.ceil(int(sizes.sum()) / m), int(np.count_nonzero(sizes))) * t0)


def _check_times(t0: float, dt: float) -> None:
    if not (math.isfinite(t0) and t0 > 0):
        raise ValueError(f"t0 must be a finite number > 0, got {t0!r}")
    if not (math.isfinite(dt) and dt >= 0):
        raise ValueError(f"dt must be a finite number >= 0, got {dt!r}")


def step_latency(group_lengths, step_cost: float = 1.0, token_cost: float = 0.0) -> dict[str, float]:
    """Generation time of one step under an engine-step model, for one batch (GRPO), rounds (Algorithm 1) and
    streaming planning (issue #20), from the lengths of the step's rollouts.

    An engine decodes every admitted sequence one token per engine step, and a step costs ``step_cost`` plus
    ``token_cost`` per sequence in it (concurrency unbounded: the regime of a small model, where the paper's m_p
    does not bind). A group completes at its longest rollout. Then, with L[t][q] the lengths of prompt q's rollouts
    in round t (round 0: base) and M[t][q] = max L[t][q] (0 for an empty group):

        one batch   steps = max over every rollout of L
        rounds      steps = sum_t max_q M[t][q]            (each round waits for its slowest group)
        streaming   steps = max_q sum_t M[t][q]            (each prompt waits for its own groups only; the ideal
                                                            streaming schedule: no quorum, planning takes no time)
        time = step_cost * steps + token_cost * sum of every L      (the token work is the same for all three)

    Streaming's steps lie between the two bounds max(one batch, max_q sum_t M) and rounds'; the chain of 1 + rounds
    dependent groups per prompt stays. Vectorised over nothing: the inputs are one step's lengths.

    Args:
        group_lengths: ``group_lengths[t][q]``: sequence of the lengths (engine steps, >= 0 whole numbers) of prompt
            q's rollouts in round t; every round lists the same prompts.
        step_cost: cost of one engine step, >= 0.
        token_cost: cost of one sequence in one engine step, >= 0.

    Returns:
        {"steps_batch", "steps_rounds", "steps_streaming", "time_batch", "time_rounds", "time_streaming"}.
    """
    if not (math.isfinite(step_cost) and step_cost >= 0 and math.isfinite(token_cost) and token_cost >= 0):
        raise ValueError(f"step_cost and token_cost must be finite numbers >= 0, got {step_cost!r}, {token_cost!r}")
    rounds = [[np.asarray(g, dtype=np.float64).reshape(-1) for g in r] for r in group_lengths]
    if not rounds or any(len(r) != len(rounds[0]) for r in rounds) or not rounds[0]:
        raise ValueError("group_lengths must list the same prompts (at least one) in every round")
    for r in rounds:
        for g in r:
            if np.any(g < 0) or not np.all(g == np.round(g)):
                raise ValueError(f"lengths must be whole numbers >= 0, got {g.tolist()!r}")
    # M[t][q] = max L[t][q], 0 for an empty group
    M = np.array([[g.max() if g.size else 0.0 for g in r] for r in rounds])
    tokens = float(sum(g.sum() for r in rounds for g in r))
    steps = {
        "batch": float(M.max()),  # max over every rollout
        "rounds": float(M.max(axis=1).sum()),  # sum_t max_q M[t][q]
        "streaming": float(M.sum(axis=0).max()),  # max_q sum_t M[t][q]
    }
    out = {f"steps_{k}": v for k, v in steps.items()}
    out.update({f"time_{k}": step_cost * v + token_cost * tokens for k, v in steps.items()})
    return out
