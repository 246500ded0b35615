"""The allocation simulator's steps for the rules beyond the paper (issue #33): Knapsack RL and xrpo-plus.

Same model as `xrpo.sim.model` (every rollout of prompt q a Bernoulli(p_q) reward; an ICL-seeded one
Bernoulli(p_icl)); each function returns that module's ``StepOutcome``, so ``step_metrics`` reports it like any
other method. What these rules see that the paper's do not is modelled as follows (our choices):

    last visit   a prompt's previous visit (an earlier epoch) is ``last_visit`` rollouts at the SAME p, successes
                 ~ Binomial(last_visit, p) (:func:`last_visit_draw`). No drift: the study's model did not learn
                 (held-out pass@1 flat over 120 steps, docs/results.md), so its prompts' rates did not move between
                 visits; with a learning model the estimate would be staler than this.
    neighbours   the success rate of a prompt's nearest solved neighbour in the ICL index: a neighbour whose own
                 rate is clip(p + N(0, 0.2^2), 0, 1), measured over 8 rollouts, (k + 1/2) / (8 + 1)
                 (:func:`neighbor_rates`): informative about p, not equal to it.

    knapsack     one batch: counts from ``knapsack_allocation`` on the last visit (no base round)
    xrpo-plus    Algorithm 1's phases (``plan_phases``: n_base each, then the planning rounds), each round split by
                 ``posterior_allocation`` on the step's rewards so far (+ the last visit, prior, neighbours as the
                 variant says); ICL seeding as in ``phased_step``: with ``icl`` a prompt with no success so far
                 draws its round's rollouts at p_icl.
"""

from __future__ import annotations

import numpy as np

from xrpo.algo.allocation import plan_phases
from xrpo.algo.knapsack import knapsack_allocation
from xrpo.algo.posterior_alloc import fit_beta_prior, posterior_allocation
from xrpo.algo.rounds import is_nonuniform, seed_candidates
from xrpo.sim.model import StepOutcome, fixed_outcome

__all__ = ["NEIGHBOR_NOISE", "knapsack_step", "last_visit_draw", "neighbor_rates", "posterior_step"]

NEIGHBOR_NOISE = 0.2
"""Standard deviation of a neighbour's success rate around the prompt's own (:func:`neighbor_rates`)."""
NEIGHBOR_ROLLOUTS = 8
"""Rollouts a neighbour's success rate is measured over."""


def _rates(p) -> np.ndarray:
    pp = np.asarray(p, dtype=np.float64)
    if pp.ndim != 1 or pp.shape[0] == 0 or not np.all(np.isfinite(pp)) or np.any((pp < 0) | (pp > 1)):
        raise ValueError(f"p must be a non-empty 1-D array of probabilities in [0, 1], got {p!r}")
    return pp


def last_visit_draw(p, last_visit: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(successes, trials) of each prompt's previous visit: Binomial(last_visit, p) of ``last_visit`` rollouts at the
    same p (0: never seen, no draw)."""
    pp = _rates(p)
    if isinstance(last_visit, bool) or not isinstance(last_visit, (int, np.integer)) or last_visit < 0:
        raise ValueError(f"last_visit must be an integer >= 0, got {last_visit!r}")
    n = np.full(pp.shape[0], int(last_visit), dtype=np.int64)
    return (rng.binomial(n, pp) if last_visit else np.zeros_like(n)), n


def neighbor_rates(p, rng: np.random.Generator) -> np.ndarray:
    """A neighbour's measured success rate per prompt: its rate p' = clip(p + N(0, NEIGHBOR_NOISE^2), 0, 1), k ~
    Binomial(NEIGHBOR_ROLLOUTS, p'), reported as (k + 1/2) / (NEIGHBOR_ROLLOUTS + 1)."""
    pp = _rates(p)
    pn = np.clip(pp + rng.normal(0.0, NEIGHBOR_NOISE, pp.shape[0]), 0.0, 1.0)
    k = rng.binomial(NEIGHBOR_ROLLOUTS, pn)
    return (k + 0.5) / (NEIGHBOR_ROLLOUTS + 1.0)


def knapsack_step(
    p,
    budget: int,
    rng: np.random.Generator,
    *,
    last_visit: int = 8,
    n_min: int = 2,
    n_max: int | None = None,
    fallback: str = "leftover",
) -> StepOutcome:
    """Knapsack RL's step: the last visit drawn (:func:`last_visit_draw`), counts from ``knapsack_allocation``,
    rewards of the one batch ~ Binomial(counts, p)."""
    hk, hn = last_visit_draw(p, last_visit, rng)
    counts = knapsack_allocation(hk, hn, budget, n_min=n_min, n_max=n_max, fallback=fallback)
    return fixed_outcome(p, counts, rng)


def posterior_step(
    p,
    budget: int,
    rng: np.random.Generator,
    *,
    n_base: int = 4,
    rounds: int = 2,
    last_visit: int = 0,
    prior="flat",
    neighbors: bool = False,
    max_per_prompt=None,
    icl: bool = False,
    p_icl=None,
) -> StepOutcome:
    """xrpo-plus's step: ``n_base`` rollouts per prompt, then each planning round of ``plan_phases`` split by
    ``posterior_allocation`` on the step's successes so far.

    Args:
        p: (Q,) true success rates.
        budget: rollouts of the step, >= n_base * Q.
        rng: numpy Generator: the last visit, the neighbours, then each round's rewards, in that order.
        n_base, rounds: as the planner's.
        last_visit: rollouts of each prompt's previous visit given to the posterior as history (0: none).
        prior: "flat" (Beta(1, 1)), "batch" or "batch-variance" (fitted once per step, to the base round and the
            last visit: equal groups, before any allocation chose what to sample), as ``posterior_params``.
        neighbors: give the posterior a per-prompt prior mean from :func:`neighbor_rates`.
        max_per_prompt: cap on one prompt's extra rollouts in one round (None: none).
        icl, p_icl: ICL seeding: a prompt with no success so far draws its round's rollouts at p_icl (Q,).

    Returns:
        ``StepOutcome`` (one group per prompt: every round's rollouts; successes include seeded ones).
    """
    pp = _rates(p)
    Q = pp.shape[0]
    pi = _rates(p_icl) if p_icl is not None else pp
    if pi.shape != pp.shape:
        raise ValueError(f"p_icl must have shape {pp.shape}, got {pi.shape}")
    phases = plan_phases(Q, budget, n_base, rounds)
    hk, hn = last_visit_draw(pp, last_visit, rng)
    hist = {"history_successes": hk, "history_trials": hn} if last_visit else {}
    prior_mean = neighbor_rates(pp, rng) if neighbors else None
    m = np.full(Q, phases.base_per_prompt, dtype=np.int64)
    k = rng.binomial(m, pp).astype(np.int64)
    if isinstance(prior, str) and prior.startswith("batch"):
        # fitted once, on the base round (+ history): equal groups, before any allocation chose what to sample
        prior = fit_beta_prior(k + hk, m + hn, moment="variance" if prior == "batch-variance" else "flat")
    seeded_n = np.zeros(Q, dtype=np.int64)
    flips = np.zeros(Q, dtype=np.int64)
    nonuniform = []
    for b in phases.round_budgets:
        if b == 0:
            continue
        alloc = posterior_allocation(k, m, b, prior=prior, prior_mean=prior_mean, max_per_prompt=max_per_prompt, **hist)
        nonuniform.append(is_nonuniform(alloc, b))  # the planner's rules (xrpo.algo.rounds), not copies
        seeded = seed_candidates(alloc, k > 0) if icl else np.zeros(Q, dtype=bool)
        s = rng.binomial(alloc, np.where(seeded, pi, pp)).astype(np.int64)
        k += s
        m += alloc
        seeded_n += seeded
        flips += seeded & (s > 0)
    return StepOutcome(pp, m, k, np.ones(Q, dtype=bool), seeded_n, flips, tuple(nonuniform))
