"""The simulator's model of a step: success rates drawn from a distribution, Bernoulli rewards, and what each
method's step generates, through the library's own rules (docs/simulate.md).

Every prompt q of a step has a true success probability p_q and every rollout of it a Bernoulli(p_q) reward of 0 or
1 (an ICL-seeded rollout: Bernoulli(p_icl(p_q)), :func:`icl_success_prob`). The rules are the round planner's
(`xrpo.algo.rounds`), the very functions the trainer and the verl driver call:

    uniform (GRPO)     one_batch_counts                                            (:func:`fixed_outcome`)
    hrp / hrp-greedy   plan_phases, then plan_round per planning round             (:func:`phased_step`)
    no-hrp             the same with the "uniform" allocator (+ ICL)               (:func:`phased_step`)
    cures              cures_select                                                (`xrpo.sim.runner`)
    dapo               GRPO batches refilled by refill_keep / refill_more          (:func:`dapo_step`)
    oracle             the best fixed allocation given the true p                  (`xrpo.algo.signal`)

A step's result is a :class:`StepOutcome` (one row per generated group) and :func:`step_metrics` turns it into the
figures the simulator reports. Everything is numpy with explicit ``numpy.random.Generator`` arguments: the same
generator state gives the same step. What the simulator owns is here: the success-rate distributions, the reward
draws, the outcome of a step and its figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from xrpo.algo.allocation import plan_phases
from xrpo.algo.config import AllocationConfig
from xrpo.algo.posterior_alloc import check_size_power
from xrpo.algo.rounds import (
    AllocatorFn,
    PromptHistory,
    get_allocator,
    one_batch_counts,
    plan_round,
    refill_keep,
    refill_more,
)
from xrpo.algo.signal import as_rates, check_count
from xrpo.algo.visits import last_visit_state, visit_history

__all__ = [
    "Draw",
    "PhasedResult",
    "StepOutcome",
    "bernoulli_draw",
    "dapo_step",
    "fit_success_rate_mixture",
    "fixed_outcome",
    "icl_success_prob",
    "last_visit_draw",
    "mixture_moment",
    "mixture_zero_variance_share",
    "neighbor_rates",
    "outcome_from_phased",
    "phased_step",
    "sample_mixture",
    "step_metrics",
]

# A reward source: draw(prompt_indices (k,), counts (k,), seeded (k,) bool, round) -> k float arrays of rewards.
Draw = Callable[[np.ndarray, np.ndarray, np.ndarray, int], list]


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
    k = check_count(k, "k", 0)
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.shape[0] == 0 or w.shape[0] != len(components):
        raise ValueError(f"weights must be one number per component ({len(components)} components), got {weights!r}")
    if np.any(~np.isfinite(w)) or np.any(w < 0) or abs(w.sum() - 1.0) > 1e-9:
        raise ValueError(f"mixture weights must be >= 0 and sum to 1, got {list(w)} (sum {w.sum():g})")
    which = rng.choice(w.shape[0], size=k, p=w / w.sum())
    out = np.empty(k, dtype=np.float64)
    for c, comp in enumerate(components):
        sel = which == c
        comp = _component(c, comp)
        out[sel] = rng.beta(*comp, size=int(sel.sum())) if isinstance(comp, tuple) else comp
    return out


def _component(c: int, comp) -> tuple[float, float] | float:
    """Mixture component ``c`` checked: a Beta's (a, b), both finite and > 0, or a fixed rate in [0, 1]."""
    if isinstance(comp, (tuple, list)):
        a, b = (float(x) for x in comp)
        if not (a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)):
            raise ValueError(f"component {c}: Beta parameters must be finite and > 0, got ({a}, {b})")
        return a, b
    if not 0.0 <= float(comp) <= 1.0:
        raise ValueError(f"component {c}: a fixed success rate must lie in [0, 1], got {comp!r}")
    return float(comp)


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
    often a seeded rollout succeeds relative to a plain one (a measurement on the default task found ICL
    flipping a 0/4 prompt in 5.8-6.4% of cases against 11.9% for four more plain rollouts: mult about 0.5 there);
    ``add`` lets a never-solved prompt (p = 0) be solved from its examples, the case ICL seeding is for.

    Args:
        p: plain success probabilities in [0, 1], any shape.
        mult: >= 0.
        add: in [-1, 1].

    Returns:
        float64 array of p's shape.
    """
    pp = as_rates(p)
    if not (math.isfinite(mult) and mult >= 0):
        raise ValueError(f"icl mult must be a finite number >= 0, got {mult!r}")
    if not (math.isfinite(add) and -1.0 <= add <= 1.0):
        raise ValueError(f"icl add must lie in [-1, 1], got {add!r}")
    # p_icl = clip(mult * p + add, 0, 1)
    return np.clip(mult * pp + add, 0.0, 1.0)


def bernoulli_draw(p, p_icl, rng: np.random.Generator, *, binomial: bool = False) -> Draw:
    """The simulator's reward source: rollout j of prompt q gets reward 1 with probability p[q] (p_icl[q] when the
    prompt is ICL-seeded in that round), else 0. Uniforms are drawn in one call per round, prompt by prompt; with
    ``binomial``, each group's successes in one ``rng.binomial`` call per round instead (its rewards then listed
    successes first), the draws of the rules that read only counts (xrpo-plus)."""
    pp, pi = as_rates(p), as_rates(p_icl, "p_icl")

    def draw(idx: np.ndarray, counts: np.ndarray, seeded: np.ndarray, rnd: int) -> list:
        ends = np.cumsum(counts).tolist()
        if binomial:
            s = rng.binomial(counts, np.where(seeded, pi[idx], pp[idx]))
            return [(np.arange(c) < k).astype(np.float64) for c, k in zip(counts.tolist(), s.tolist())]
        u = rng.random(int(np.sum(counts)))
        prob = np.repeat(np.where(seeded, pi[idx], pp[idx]), counts)
        r = (u < prob).astype(np.float64)
        return [r[a:b] for a, b in zip([0] + ends[:-1], ends)]

    return draw


def last_visit_draw(p, last_visit: int, rng: np.random.Generator, window: int = 0) -> PromptHistory:
    """Each prompt's previous visit (an earlier epoch) for the rules that read one (knapsack, xrpo-plus):
    ``last_visit`` rollouts at the SAME p, successes ~ Binomial(last_visit, p) (0: never seen, no draw). No drift:
    the study's model did not learn (held-out pass@1 flat over 120 steps, docs/results.md), so its prompts' rates
    did not move between visits; with a learning model the estimate would be staler than this.

    With a ``window`` (`xrpo.algo.rounds.history_window`: Knapsack RL's authors' rule reads each prompt's latest
    rewards), the visit's rollouts are drawn one by one, Bernoulli(p), and observed into the trainer's history
    (`xrpo.algo.visits.last_visit_state`, ``observe``, `visit_history`), which the history then returns."""
    pp = as_rates(p)
    n = np.full(pp.shape[0], check_count(last_visit, "last_visit", 0), dtype=np.int64)
    if not window:
        return PromptHistory(rng.binomial(n, pp) if last_visit else np.zeros_like(n), n)
    P = pp.shape[0]
    state = last_visit_state(P, window)
    if last_visit:
        ok = (rng.random((P, last_visit)) < pp[:, None]).astype(np.float64)
        state.observe(np.arange(P), ok.ravel(), np.repeat(np.arange(P), last_visit))
    return visit_history(state, np.arange(P))[0]


def neighbor_rates(p, rng: np.random.Generator, noise: float = 0.2, rollouts: int = 8) -> np.ndarray:
    """The success rate of each prompt's nearest solved neighbour in the ICL index, as xrpo-plus-neighbors sees it:
    a neighbour whose own rate is p' = clip(p + N(0, noise^2), 0, 1), k ~ Binomial(rollouts, p'), reported as
    (k + 1/2) / (rollouts + 1): informative about p, not equal to it."""
    pp = as_rates(p)
    pn = np.clip(pp + rng.normal(0.0, noise, pp.shape[0]), 0.0, 1.0)
    return (rng.binomial(rollouts, pn) + 0.5) / (rollouts + 1.0)


def mixture_moment(weights: Sequence[float], components: Sequence, n: int) -> float:
    """E[p^n] for p drawn from a mixture of Beta distributions and point masses (:func:`sample_mixture`'s arguments).

    Exact: a point mass x contributes x^n, Beta(a, b) contributes prod_{i<n} (a + i) / (a + b + i).
    """
    n = check_count(n, "n", 0)
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.shape[0] != len(components) or np.any(w < 0) or abs(w.sum() - 1.0) > 1e-9:
        raise ValueError(f"weights must be >= 0, one per component ({len(components)}), summing to 1; got {weights!r}")
    total = 0.0
    for c, (wc, comp) in enumerate(zip(w, components)):
        comp = _component(c, comp)
        if isinstance(comp, tuple):
            a, b = comp
            m = 1.0
            for i in range(n):
                m *= (a + i) / (a + b + i)
        else:
            m = comp**n
        total += float(wc) * m
    return total


def mixture_zero_variance_share(weights: Sequence[float], components: Sequence, n: int) -> float:
    """Expected share of groups of n rollouts whose rewards are all equal, E[p^n + (1 - p)^n], for p drawn from the
    mixture (1 - p of Beta(a, b) is Beta(b, a)); 1 for n <= 1, as :func:`nonzero_variance_prob` gives 0 there."""
    n = check_count(n, "n", 0)
    if n <= 1:
        return 1.0
    flipped = [(c[1], c[0]) if isinstance(c, (tuple, list)) else 1.0 - float(c) for c in components]
    return mixture_moment(weights, components, n) + mixture_moment(weights, flipped, n)


# ---------------------------------------------------------------------------------------------------------------
# one step of each rule
# ---------------------------------------------------------------------------------------------------------------


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
    history: PromptHistory | None = None,
    allocator: AllocatorFn | None = None,
    group_size_power: float = 1.0,
) -> PhasedResult:
    """One step of Algorithm 1's rounds with rewards from ``draw``: ``n_base`` rollouts per prompt, then for each
    planning round of ``plan_phases`` the trainer's own `plan_round` with the allocator ``allocation`` ("hrp" with
    ``mode`` "proportional" or "greedy"; "uniform", the w/o-HRP ablation; "xrpo-plus"; any registered allocator
    that reads the step's rewards). With ``icl`` the prompts `plan_round` marks for seeding (rollouts this round, no
    reward >= ``full_reward`` so far) draw seeded rewards, as the planner's do when its corpus has examples for them
    (the simulator assumes it always has).

    Args:
        num_prompts: Q >= 1.
        budget: rollouts of the step, >= n_base * Q.
        draw: reward source (:func:`bernoulli_draw`, or a replay of recorded rewards).
        n_base, rounds, alpha, lam, max_per_prompt, mode, group_size_power: the planner's n_base, plan_rounds,
            alpha, lam, max_extra_per_prompt, alloc_mode, group_size_power (`xrpo.algo.config.AllocationConfig`).
        history: each prompt's earlier visits, for an allocator that reads them (:func:`last_visit_draw`).
        allocator: an unregistered variant of ``allocation``'s function (`plan_round`'s ``allocator``).

    Returns:
        :class:`PhasedResult`.
    """
    if get_allocator(allocation).selects_prompts:
        raise ValueError(f"allocation {allocation!r} chooses the step's prompts: it has no rounds to simulate")
    knobs = AllocationConfig(
        allocation=allocation,
        n_base=n_base,
        plan_rounds=rounds,
        alpha=alpha,
        lam=lam,
        alloc_mode=mode,
        max_extra_per_prompt=max_per_prompt,
        group_size_power=group_size_power,
    )
    P = check_count(num_prompts, "num_prompts", 1)
    phases = plan_phases(P, budget, n_base, rounds)
    idx = np.arange(P)
    by_prompt: list[list[np.ndarray]] = [[] for _ in range(P)]
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
        allocs.append(alloc)
        seeded_all.append(seeded)
        succ_all.append(succ)

    run(np.full(P, phases.base_per_prompt, dtype=np.int64), np.zeros(P, dtype=bool), 0)
    for t, b in enumerate(phases.round_budgets, start=1):
        if b == 0:
            continue
        rewards = [np.concatenate(r) for r in by_prompt]
        plan = plan_round(rewards, b, knobs, icl=icl, full_reward=full_reward, history=history, allocator=allocator)
        nonuni.append(plan.nonuniform)
        run(plan.alloc, plan.seed, t)
    return PhasedResult([np.concatenate(r) for r in by_prompt], allocs, seeded_all, succ_all, nonuni)


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
    pp = as_rates(p)
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
    generated; the last batch's kept groups beyond ``num_prompts`` are dropped (lowest group ids kept first): the
    trainer's `refill_keep` and `refill_more`.

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
    Q = check_count(num_prompts, "num_prompts", 1)
    G = check_count(max_gen_batches, "max_gen_batches", 1)
    counts = one_batch_counts(Q, check_count(budget, "budget", 0))
    ids = np.repeat(np.arange(Q), counts)
    within = np.arange(ids.shape[0]) - np.repeat(np.cumsum(counts) - counts, counts)  # position inside its group
    ps, ss, ts = [], [], []
    kept, batches = 0, 0
    p = as_rates(first_p)
    while refill_more(kept, Q, batches, G):
        if batches > 0:
            p = as_rates(new_prompts(Q))
        if p.shape != (Q,):
            raise ValueError(f"a DAPO batch needs {Q} success probabilities, got shape {p.shape}")
        succ = rng.binomial(counts, p).astype(np.int64)
        # the filter sees each group's rewards as a multiset: its successes first, then its failures
        rewards = (within < np.repeat(succ, counts)).astype(np.float64)
        keep = refill_keep(rewards, ids, kept, Q)
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


# ---------------------------------------------------------------------------------------------------------------
# what a step bought
# ---------------------------------------------------------------------------------------------------------------


def step_metrics(o: StepOutcome, degenerate_eps: float = 0.0, size_power: float = 1.0) -> dict[str, float]:
    """The simulator's figures of one step (docs/simulate.md defines each).

    A group is *informative* when its rewards are not all equal (0 < successes < counts): with 0/1 rewards that is
    exactly when GRPO's group advantage, hence its gradient, is non-zero. Rollouts of groups DAPO dropped count as
    generated, never as informative. ``group_value`` is what xrpo-plus's planner maximises in expectation
    (`xrpo.algo.posterior_alloc`, step 4): sum over the informative groups of n^gamma, n the group's rollouts.

    Args:
        o: the step's groups.
        degenerate_eps: a prompt with p <= eps or p >= 1 - eps counts as always / never solved (0: exactly 0 or 1).
        size_power: gamma of ``group_value``, in [0, 1] (1: the informative rollouts; 0: the informative groups).
    """
    c, s, p, t = o.counts, o.successes, o.p, o.trained
    mixed = (s > 0) & (s < c)
    has = c > 0
    est = np.divide(s, c, out=np.zeros(c.shape, dtype=np.float64), where=has)
    generated = int(c.sum())
    # the planner's objective: sum over the informative groups of n^gamma
    value = float(np.sum(c[t & mixed].astype(np.float64) ** check_size_power(size_power)))
    m = {
        "rollouts_generated": float(generated),
        "rollouts_trained": float(c[t].sum()),
        "prompts": float(c.shape[0]),
        "informative_rollouts": float(c[t & mixed].sum()),
        "informative_groups": float(np.count_nonzero(t & mixed)),
        "group_value": value,
        "informative_share": float(c[t & mixed].sum()) / generated if generated else 0.0,
        "groups_per_rollout": float(np.count_nonzero(t & mixed)) / generated if generated else 0.0,
        "group_value_per_rollout": value / generated if generated else 0.0,
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
