"""The methods `xrpo simulate` compares: a registry of name -> ``fn(context, p, rng) -> StepOutcome``, each a thin
call of the library's rule (the round planner `xrpo.algo.rounds` stepped by `xrpo.sim.model.phased_step`, CurES's
`cures_select`, DAPO's refill in `xrpo.sim.model.dapo_step`, the oracles of `xrpo.algo.signal`, and beyond the paper
the allocators "knapsack" (`batch_counts`; the authors' rule, and the variants "knapsack-leftover" and
"knapsack-jeffreys") and "xrpo-plus" (its rounds by `phased_step`)) on one step's prompts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from xrpo.algo.config import AllocationConfig
from xrpo.algo.posterior_alloc import fit_beta_prior, posterior_allocation
from xrpo.algo.rounds import (
    AllocatorFn,
    batch_counts,
    cures_select,
    history_window,
    one_batch_counts,
    successes_so_far,
)
from xrpo.algo.signal import oracle_allocation
from xrpo.sim.model import (
    StepOutcome,
    bernoulli_draw,
    dapo_step,
    fixed_outcome,
    icl_success_prob,
    last_visit_draw,
    neighbor_rates,
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


def _phased(ctx: StepContext, p, rng, allocation: str, mode: str, binomial: bool = False, **kw) -> StepOutcome:
    c = ctx.cfg
    p_icl = icl_success_prob(p, c.icl_mult, c.icl_add) if c.icl else p
    res = phased_step(
        c.prompts,
        c.rollouts,
        bernoulli_draw(p, p_icl, rng, binomial=binomial),
        n_base=c.n_base,
        rounds=c.rounds,
        allocation=allocation,
        mode=mode,
        alpha=c.alpha,
        lam=c.lam,
        max_per_prompt=c.max_extra,
        icl=c.icl,
        group_size_power=c.group_size_power,
        **kw,
    )
    return outcome_from_phased(p, res)


for _name, _rule in {
    "hrp": ("hrp", "proportional"),
    "hrp-greedy": ("hrp", "greedy"),
    "no-hrp": ("uniform", "proportional"),
}.items():
    register_sim_method(_name)(lambda ctx, p, rng, _rule=_rule: _phased(ctx, p, rng, *_rule))


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


def _oracle(ctx, p, rng, target: str):
    c = ctx.cfg
    n_min = c.n_base if c.oracle_min is None else c.oracle_min
    return fixed_outcome(p, oracle_allocation(p, c.rollouts, n_min, target), rng)


register_sim_method("oracle")(lambda ctx, p, rng: _oracle(ctx, p, rng, "rollouts"))
register_sim_method("oracle-groups")(lambda ctx, p, rng: _oracle(ctx, p, rng, "groups"))


# beyond the paper (docs/methods.md): the registered allocators "knapsack" and "xrpo-plus", given each prompt's
# last visit (`last_visit_draw`), and xrpo-plus's ablations as unregistered variants of its allocator


def _knapsack(ctx, p, rng, fallback: str = "authors"):
    """Knapsack RL with ``knapsack_fallback=fallback`` and the other knapsack_* knobs at their defaults (the
    authors' recipe); ``max_extra`` caps the variants read from the paper's description only (the authors' rule
    caps with knapsack_max_n)."""
    c = ctx.cfg
    cap = None if fallback == "authors" else c.max_extra
    knobs = AllocationConfig("knapsack", max_extra_per_prompt=cap, knapsack_fallback=fallback)
    history = last_visit_draw(p, c.last_visit, rng, history_window(knobs))
    return fixed_outcome(p, batch_counts(knobs, c.prompts, c.rollouts, history), rng)


def _posterior_variant(n_base: int, prior: str, prior_mean) -> AllocatorFn:
    """xrpo-plus's allocator with another prior: "batch" / "batch-variance" (`fit_beta_prior` on each prompt's base
    round, its first ``n_base`` rewards, + the last visit: equal groups, before any allocation chose what to sample)
    and ``prior_mean`` (a neighbour's rate, `neighbor_rates`)."""

    def fn(rewards, budget, knobs, history):
        k, m = successes_so_far(rewards, knobs)
        hk, hn = (history.successes, history.trials) if history is not None else (np.zeros_like(k), np.zeros_like(m))
        pr = prior
        if prior.startswith("batch"):
            kb = successes_so_far([r[:n_base] for r in rewards], knobs)[0]
            pr = fit_beta_prior(kb + hk, n_base + hn, moment="variance" if prior == "batch-variance" else "flat")
        hist = {} if history is None else {"history_successes": hk, "history_trials": hn}
        return posterior_allocation(
            k,
            m,
            budget,
            prior=pr,
            prior_mean=prior_mean,
            max_per_prompt=knobs.max_extra_per_prompt,
            size_power=knobs.group_size_power,
            **hist,
        )

    return fn


def _xrpo_plus(ctx, p, rng, history: bool = True, prior: str = "flat", neighbors: bool = False):
    c = ctx.cfg
    last = last_visit_draw(p, c.last_visit, rng) if history and c.last_visit else None
    variant = None
    if prior != "flat" or neighbors:
        variant = _posterior_variant(c.n_base, prior, neighbor_rates(p, rng) if neighbors else None)
    return _phased(ctx, p, rng, "xrpo-plus", "proportional", history=last, allocator=variant, binomial=True)


register_sim_method("knapsack")(_knapsack)
register_sim_method("knapsack-leftover")(lambda ctx, p, rng: _knapsack(ctx, p, rng, "leftover"))
register_sim_method("knapsack-jeffreys")(lambda ctx, p, rng: _knapsack(ctx, p, rng, "jeffreys"))
for _name, _kw in {
    "xrpo-plus": {},
    "xrpo-plus-no-history": {"history": False},
    "xrpo-plus-batch-prior": {"prior": "batch"},
    "xrpo-plus-variance-prior": {"prior": "batch-variance"},
    "xrpo-plus-batch-prior-no-history": {"prior": "batch", "history": False},
    "xrpo-plus-neighbors": {"neighbors": True},
}.items():
    register_sim_method(_name)(lambda ctx, p, rng, _kw=_kw: _xrpo_plus(ctx, p, rng, **_kw))
