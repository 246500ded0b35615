"""The methods `xrpo simulate` compares: a registry of name -> ``fn(context, p, rng) -> StepOutcome``, each a thin
call of the library's rule (the round planner `xrpo.algo.rounds` stepped by `xrpo.sim.model.phased_step`, CurES's
`cures_select`, DAPO's refill in `xrpo.sim.model.dapo_step`, the oracles of `xrpo.algo.signal`, and beyond the paper
`xrpo.sim.alloc_sim`'s knapsack and posterior steps) on one step's prompts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from xrpo.algo.rounds import cures_select, one_batch_counts
from xrpo.algo.signal import oracle_allocation
from xrpo.sim.alloc_sim import knapsack_step, posterior_step
from xrpo.sim.model import (
    StepOutcome,
    bernoulli_draw,
    dapo_step,
    fixed_outcome,
    icl_success_prob,
    outcome_from_phased,
    phased_step,
)

__all__ = ["SIM_METHODS", "SimMethod", "StepContext", "register_sim_method"]


@dataclass
class StepContext:
    """What a method sees of the run: its options and the prompt source (for DAPO's refill and CurES's pool)."""

    cfg: Any  # xrpo.sim.runner.SimConfig (not imported: the runner imports this module)
    source: Callable[[np.random.Generator, int], np.ndarray]


SimMethod = Callable[[StepContext, np.ndarray, np.random.Generator], StepOutcome]
SIM_METHODS: dict[str, SimMethod] = {}
"""Name -> fn(context, p of the step's prompts, generator) -> StepOutcome."""


def register_sim_method(name: str) -> Callable[[SimMethod], SimMethod]:
    def deco(fn: SimMethod) -> SimMethod:
        if name in SIM_METHODS:
            raise ValueError(f"simulator method {name!r} is already registered")
        SIM_METHODS[name] = fn
        return fn

    return deco


@register_sim_method("uniform")
def _uniform(ctx: StepContext, p: np.ndarray, rng: np.random.Generator) -> StepOutcome:
    return fixed_outcome(p, one_batch_counts(ctx.cfg.prompts, ctx.cfg.rollouts), rng)


def _phased(ctx: StepContext, p: np.ndarray, rng: np.random.Generator, allocation: str, mode: str) -> StepOutcome:
    c = ctx.cfg
    p_icl = icl_success_prob(p, c.icl_mult, c.icl_add) if c.icl else p
    res = phased_step(
        c.prompts,
        c.rollouts,
        bernoulli_draw(p, p_icl, rng),
        n_base=c.n_base,
        rounds=c.rounds,
        allocation=allocation,
        mode=mode,
        alpha=c.alpha,
        lam=c.lam,
        max_per_prompt=c.max_extra,
        icl=c.icl,
    )
    return outcome_from_phased(p, res)


@register_sim_method("hrp")
def _hrp(ctx, p, rng):
    return _phased(ctx, p, rng, "hrp", "proportional")


@register_sim_method("hrp-greedy")
def _hrp_greedy(ctx, p, rng):
    return _phased(ctx, p, rng, "hrp", "greedy")


@register_sim_method("no-hrp")
def _no_hrp(ctx, p, rng):
    return _phased(ctx, p, rng, "uniform", "proportional")


@register_sim_method("cures")
def _cures(ctx, p, rng):
    c = ctx.cfg
    pool = (
        p
        if c.cures_pool is None or c.cures_pool == c.prompts
        else np.concatenate([p, ctx.source(rng, c.cures_pool - c.prompts)])
    )
    trials = np.full(pool.shape[0], c.cures_history, dtype=np.int64)
    succ = rng.binomial(trials, pool)
    pick = cures_select(
        succ, trials, c.prompts, c.rollouts, rng, temp_scale=c.cures_temp_scale, min_count=c.cures_min_count
    )
    return fixed_outcome(pool[pick.idx], pick.counts, rng)


@register_sim_method("dapo")
def _dapo(ctx, p, rng):
    c = ctx.cfg
    return dapo_step(p, lambda k: ctx.source(rng, k), c.prompts, c.rollouts, c.max_gen_batches, rng)


@register_sim_method("oracle")
def _oracle(ctx, p, rng):
    c = ctx.cfg
    n_min = c.n_base if c.oracle_min is None else c.oracle_min
    return fixed_outcome(p, oracle_allocation(p, c.rollouts, n_min, "rollouts"), rng)


@register_sim_method("oracle-groups")
def _oracle_groups(ctx, p, rng):
    c = ctx.cfg
    n_min = c.n_base if c.oracle_min is None else c.oracle_min
    return fixed_outcome(p, oracle_allocation(p, c.rollouts, n_min, "groups"), rng)


# beyond the paper (issue #33): thin wrappers over xrpo.sim.alloc_sim, which holds the steps


@register_sim_method("knapsack")
def _knapsack(ctx, p, rng):
    return knapsack_step(p, ctx.cfg.rollouts, rng, last_visit=ctx.cfg.last_visit)


@register_sim_method("knapsack-jeffreys")
def _knapsack_jeffreys(ctx, p, rng):
    return knapsack_step(p, ctx.cfg.rollouts, rng, last_visit=ctx.cfg.last_visit, fallback="jeffreys")


def _xrpo_plus(ctx, p, rng, history: bool = True, prior: str = "flat", neighbors: bool = False):
    c = ctx.cfg
    return posterior_step(
        p,
        c.rollouts,
        rng,
        n_base=c.n_base,
        rounds=c.rounds,
        last_visit=c.last_visit if history else 0,
        prior=prior,
        neighbors=neighbors,
        max_per_prompt=c.max_extra,
        icl=c.icl,
        p_icl=icl_success_prob(p, c.icl_mult, c.icl_add) if c.icl else None,
    )


for _name, _kw in {
    "xrpo-plus": {},
    "xrpo-plus-no-history": {"history": False},
    "xrpo-plus-batch-prior": {"prior": "batch"},
    "xrpo-plus-variance-prior": {"prior": "batch-variance"},
    "xrpo-plus-batch-prior-no-history": {"prior": "batch", "history": False},
    "xrpo-plus-neighbors": {"neighbors": True},
}.items():
    register_sim_method(_name)(lambda ctx, p, rng, _kw=_kw: _xrpo_plus(ctx, p, rng, **_kw))
