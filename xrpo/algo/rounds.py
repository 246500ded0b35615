"""Algorithm 1's round, written once: the decisions of a step's rollout schedule as pure functions, called alike by
the trainer's planner (`xrpo.rollout.planner`, `xrpo.rollout.streaming`), the simulator (`xrpo.sim.model`) and the
verl driver (`xrpo.integrations.verl.trainer`).

XRPO paper, §3.2 and Algorithm 1::

    phases          n_base rollouts per prompt, then N_plan rounds of the rest        `plan_phases` (lines 2-5)
    allocation      a round's budget from the rewards so far: a registered allocator  `plan_round` (line 7)
                    ("hrp": Pi_q = Delta_q + phi_q, Eqs. 1-3; "uniform": an even split; `register_allocator`)
    ICL routing     a prompt given rollouts with no success so far draws them from     `plan_round` (lines 9-10)
                    its ICL prompt (the decision only: retrieval and rendering are the caller's)
    one batch       an allocator that reads no rewards needs no rounds unless ICL      `plans_rounds`
                    seeding does; GRPO's single batch is the budget split evenly       `one_batch_counts`
    CurES           prompts and counts drawn from the Beta posterior of each prompt   `cures_select`
    DAPO refill     keep the groups whose rewards differ, draw again until full       `refill_keep`, `refill_more`

An allocator is ``fn(rewards, budget, knobs, history) -> counts``:

    rewards   P float arrays: each prompt's rewards so far in this step (base rollouts and earlier rounds)
    budget    rollouts to hand out in this call, integer >= 0
    knobs     the method's knobs: any object with `xrpo.algo.config.AllocationConfig`'s fields (``alpha``, ``lam``,
              ``alloc_mode``, ``max_extra_per_prompt``, ...); an allocator with knobs of its own reads them by name
    history   `PromptHistory` or None: each prompt's earlier visits (successes, trials) from steps before this one,
              for an allocator that carries a prior across steps; None when the caller keeps no history
    returns   int64 (P,) extra rollouts per prompt, summing to ``budget``

registered with ``@register_allocator(name, adaptive=..., selects_prompts=..., uses_history=..., reward_window=...)``:
``adaptive`` says it reads the rewards so far (worth planning rounds for), ``selects_prompts`` that the caller also
chooses the step's prompts with it and hands the planner its counts (CurES), ``uses_history`` that it reads
``history`` (the trainer then keeps each training problem's last visit and checkpoints it; a non-adaptive one also
sizes the one batch of a step, `batch_counts`), ``reward_window`` how many of each prompt's latest rewards across
visits it reads besides (`history_window`; the history then keeps them). An unknown name raises listing the valid
ones; a duplicate raises.

Beyond the paper (docs/methods.md "Allocation beyond the paper"):

    knapsack    Knapsack RL (Li et al. 2026): the step's whole budget in one batch, from each prompt's earlier visits:
                the authors' rule (`xrpo.algo.knapsack_rl.authors_allocation`, reading each prompt's latest
                ``knapsack_window`` rewards) or, with ``knapsack_fallback=leftover`` / ``jeffreys``, the rule read
                from the paper's description (`xrpo.algo.knapsack.knapsack_allocation`, the last visit);
                adaptive=False, uses_history=True
    xrpo-plus   a planning round split where a Beta posterior (Beta(1, 1) + the last visit + the step's rewards)
                expects the most rollouts with a non-zero advantage (`xrpo.algo.posterior_alloc`); adaptive=True,
                uses_history=True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

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
from xrpo.algo.knapsack import knapsack_allocation
from xrpo.algo.knapsack_rl import authors_allocation, recent_rate
from xrpo.algo.posterior_alloc import posterior_allocation
from xrpo.algo.sampling import dynamic_sampling_keep_groups

__all__ = [
    "ALLOCATORS",
    "Allocator",
    "KNAPSACK_FALLBACKS",
    "CuresChoice",
    "PromptHistory",
    "RoundPlan",
    "allocator_names",
    "batch_counts",
    "cap_error",
    "cures_select",
    "get_allocator",
    "history_window",
    "is_nonuniform",
    "one_batch_counts",
    "plan_round",
    "plans_rounds",
    "refill_keep",
    "refill_more",
    "register_allocator",
    "seed_candidates",
    "successes_so_far",
]


class PromptHistory(NamedTuple):
    """Each prompt's earlier visits, from steps before this one (e.g. CurES's posterior counts; the last visit that
    knapsack and xrpo-plus read); with a reward window, also each prompt's latest rewards across visits (Knapsack
    RL's estimate, `xrpo.algo.knapsack_rl.recent_rate`)."""

    successes: np.ndarray
    """(P,) int: rollouts of the prompt that succeeded so far (the last visit's, for a last-visit history)."""
    trials: np.ndarray
    """(P,) int: rollouts of the prompt so far (the last visit's, for a last-visit history)."""
    recent_successes: np.ndarray | None = None
    """(P,) int: successes among the prompt's latest rewards across visits (None: no window kept)."""
    recent_trials: np.ndarray | None = None
    """(P,) int: how many latest rewards the window holds, min(observed, window)."""
    observed: np.ndarray | None = None
    """(P,) int: the prompt's rewards over every visit."""

    def take(self, idx) -> PromptHistory:
        """The history of the prompts ``idx`` (positions in this one), every field alike."""
        return PromptHistory(*(None if a is None else np.asarray(a)[idx] for a in self))


AllocatorFn = Callable[[Sequence[np.ndarray], int, Any, "PromptHistory | None"], np.ndarray]


@dataclass(frozen=True)
class Allocator:
    """A registered allocation rule (module docstring)."""

    name: str
    fn: AllocatorFn
    adaptive: bool = True
    """Reads the rewards so far: its rounds can change what is generated."""
    selects_prompts: bool = False
    """The caller chooses the step's prompts and their counts with it; the planner generates them in one batch."""
    uses_history: bool = False
    """Reads ``history`` (each prompt's last visit): the caller keeps it across steps."""
    reward_window: Callable[[Any], int] | None = None
    """knobs -> how many of each prompt's latest rewards across visits it reads (`PromptHistory.recent_*`; 0 or
    None: none), which the caller's history then keeps too (`history_window`)."""


ALLOCATORS: dict[str, Allocator] = {}
"""name -> `Allocator`; ``method.allocation`` (``algorithm.xrpo.allocation`` for verl) picks one."""


def register_allocator(
    name: str,
    *,
    adaptive: bool = True,
    selects_prompts: bool = False,
    uses_history: bool = False,
    reward_window: Callable[[Any], int] | None = None,
):
    """Register ``fn(rewards, budget, knobs, history) -> counts`` under ``name`` (module docstring)."""

    def deco(fn: AllocatorFn) -> AllocatorFn:
        if name in ALLOCATORS:
            raise ValueError(f"allocator {name!r} is already registered")
        ALLOCATORS[name] = Allocator(name, fn, adaptive, selects_prompts, uses_history, reward_window)
        return fn

    return deco


def get_allocator(name: str) -> Allocator:
    try:
        return ALLOCATORS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown allocation {name!r}; valid allocations: {', '.join(ALLOCATORS)}") from None


def allocator_names() -> tuple[str, ...]:
    return tuple(ALLOCATORS)


def history_window(knobs: Any) -> int:
    """How many of each prompt's latest rewards across visits the knobs' allocator reads (0: none; Knapsack RL's
    estimate: ``knapsack_window``): what the trainer's and the verl driver's history keep besides the last visit."""
    a = get_allocator(knobs.allocation)
    return int(a.reward_window(knobs)) if a.reward_window is not None else 0


@register_allocator("hrp")
def hrp_allocator(rewards: Sequence[np.ndarray], budget: int, knobs: Any, history=None) -> np.ndarray:
    """XRPO's hierarchical rollout planning: ``allocate_round`` (Eqs. 1-3) with the knobs' alpha, lam, mode, cap."""
    return allocate_round(
        list(rewards),
        budget,
        alpha=knobs.alpha,
        lam=knobs.lam,
        max_per_prompt=knobs.max_extra_per_prompt,
        mode=knobs.alloc_mode,
    )


@register_allocator("uniform", adaptive=False)
def uniform_allocator(rewards: Sequence[np.ndarray], budget: int, knobs: Any, history=None) -> np.ndarray:
    """An even split (the w/o-HRP ablation; with no ICL, GRPO's one batch): ``split_budget`` of equal priorities."""
    return split_budget(np.zeros(len(rewards)), budget, max_per_prompt=knobs.max_extra_per_prompt)


@register_allocator("cures", adaptive=False, selects_prompts=True)
def cures_allocator(rewards: Sequence[np.ndarray], budget: int, knobs: Any, history=None) -> np.ndarray:
    """CurES's counts for prompts already chosen: n_i proportional to sigma_i of each one's posterior (``history``
    holds their counts; the knobs' ``cures_prior_*`` and ``cures_min_count``, CurES's defaults without them)."""
    if history is None:
        raise ValueError("the cures allocator needs history (each prompt's earlier successes and trials)")
    alpha, beta = beta_posterior(
        history.successes,
        history.trials,
        getattr(knobs, "cures_prior_alpha", 1.0),
        getattr(knobs, "cures_prior_beta", 1.0),
    )
    return _cures_counts(posterior_mean(alpha, beta), budget, getattr(knobs, "cures_min_count", 2))[0]


def successes_so_far(rewards: Sequence[np.ndarray], knobs: Any) -> tuple[np.ndarray, np.ndarray]:
    """(k, m): each prompt's rewards >= the knobs' ``full_reward`` (1.0 without it) and rewards so far, the counts
    an allocator that reads only them sees (xrpo-plus and its variants)."""
    full = getattr(knobs, "full_reward", 1.0)
    k = np.array([int(np.count_nonzero(np.asarray(r) >= full)) for r in rewards], dtype=np.int64)
    return k, np.array([np.asarray(r).shape[0] for r in rewards], dtype=np.int64)


KNAPSACK_FALLBACKS = ("authors", "leftover", "jeffreys")
"""``knapsack_fallback``'s values: the authors' rule (`xrpo.algo.knapsack_rl`) and the rule read from the paper's
description before their code was followed (`xrpo.algo.knapsack.knapsack_allocation`'s fallbacks)."""


def _knapsack_window(knobs: Any) -> int:
    return knobs.knapsack_window if knobs.knapsack_fallback == "authors" else 0


@register_allocator("knapsack", adaptive=False, uses_history=True, reward_window=_knapsack_window)
def knapsack_allocator(rewards: Sequence[np.ndarray], budget: int, knobs: Any, history=None) -> np.ndarray:
    """Knapsack RL's counts from each prompt's earlier visits (``history``; None: no prompt seen, an even split).
    It reads no rewards of the step: the planner calls it once, with the step's whole budget (`batch_counts`).

    ``knapsack_fallback="authors"``: their code's rule (`authors_allocation` on `recent_rate`, with the knobs'
    ``knapsack_window``, ``knapsack_min_rewards``, ``knapsack_max_n``, ``knapsack_zero_at_floor``; n_min = 2, their
    recipe's); "leftover" / "jeffreys": ``knapsack_allocation`` on the last visit, n_min = 2 (at most the budget's
    even share), n_max = the knobs' ``max_extra_per_prompt`` (None: the budget)."""
    P = len(rewards)
    if knobs.knapsack_fallback == "authors":
        if history is None:
            rate, valid = np.zeros(P), np.zeros(P, dtype=bool)
        elif history.observed is None:
            raise ValueError(
                "knapsack_fallback='authors' reads each prompt's latest rewards across visits: the history must "
                "hold recent_successes, recent_trials and observed (a history kept with history_window(knobs))"
            )
        else:
            rate, valid = recent_rate(
                history.successes,
                history.trials,
                history.recent_successes,
                history.recent_trials,
                history.observed,
                window=knobs.knapsack_window,
                min_rewards=knobs.knapsack_min_rewards,
            )
        return authors_allocation(
            rate, valid, budget, n_min=2, n_max=knobs.knapsack_max_n, zero_at_floor=knobs.knapsack_zero_at_floor
        )
    hk, hn = (history.successes, history.trials) if history is not None else (np.zeros(P), np.zeros(P))
    return knapsack_allocation(
        hk,
        hn,
        budget,
        n_min=min(2, budget // max(P, 1)),
        n_max=knobs.max_extra_per_prompt,
        fallback=knobs.knapsack_fallback,
    )


@register_allocator("xrpo-plus", uses_history=True)
def xrpo_plus_allocator(rewards: Sequence[np.ndarray], budget: int, knobs: Any, history=None) -> np.ndarray:
    """xrpo-plus: ``posterior_allocation`` of the round's budget on the step's successes so far (reward >=
    ``full_reward``) and the prompts' last visits (``history``; None: the step alone), prior Beta(1, 1), cap the
    knobs' ``max_extra_per_prompt``, a mixed group of n worth n^``group_size_power`` (1 without the knob)."""
    k, m = successes_so_far(rewards, knobs)
    hist = {} if history is None else {"history_successes": history.successes, "history_trials": history.trials}
    return posterior_allocation(
        k,
        m,
        budget,
        prior="flat",
        max_per_prompt=knobs.max_extra_per_prompt,
        size_power=getattr(knobs, "group_size_power", 1.0),
        **hist,
    )


def plans_rounds(allocation: str, icl: bool) -> bool:
    """Whether a step runs planning rounds, the one place this is decided: an allocator that reads rewards needs
    them, and so does ICL seeding (it routes a round's rollouts of unsolved prompts); otherwise rounds could not
    change what is generated, and the step is one batch (GRPO's; CurES's caller-chosen counts)."""
    a = get_allocator(allocation)
    return a.adaptive or (icl and not a.selects_prompts)


def one_batch_counts(num_prompts: int, budget: int) -> np.ndarray:
    """GRPO's counts: the budget split evenly in one batch (when the prompts do not divide it, the earlier prompts
    get one more)."""
    return split_budget(np.zeros(num_prompts), budget)


def batch_counts(knobs: Any, num_prompts: int, budget: int, history: PromptHistory | None = None) -> np.ndarray:
    """The counts of a step generated in one batch (no rounds, caller-chosen counts aside): an allocator that reads
    history but no rewards (Knapsack RL) places the whole budget from the prompts' earlier visits; otherwise GRPO's
    even split (`one_batch_counts`)."""
    a = get_allocator(knobs.allocation)
    if a.uses_history and not a.adaptive:
        empty = [np.zeros(0, dtype=np.float64)] * num_prompts
        return np.asarray(a.fn(empty, budget, knobs, history), dtype=np.int64)
    return one_batch_counts(num_prompts, budget)


def cap_error(knobs: Any, num_prompts: int, budget: int, *, icl: bool) -> str | None:
    """Why the knobs' ``max_extra_per_prompt`` cannot hold a step of ``budget`` rollouts over ``num_prompts`` prompts,
    or None: a capped allocation call of B rollouts needs cap x prompts >= B (`split_budget` refuses less), and the
    largest call is the largest planning round's when the step plans rounds (`plans_rounds`, `plan_phases`;
    streaming's waves are parts of them), else the step's whole budget for an allocator that places it in one batch
    from history (Knapsack RL, `batch_counts`). GRPO's even split and CurES's counts take no cap. For a config
    check, before a step fails inside."""
    cap = knobs.max_extra_per_prompt
    a = get_allocator(knobs.allocation)
    if cap is None or a.selects_prompts:
        return None
    if plans_rounds(knobs.allocation, icl):
        rb = plan_phases(num_prompts, budget, knobs.n_base, knobs.plan_rounds).round_budgets or (0,)
        need, what = max(rb), f"the largest planning round's budget (rounds {', '.join(map(str, rb))})"
    elif a.uses_history:
        need, what = budget, "the step's budget, placed in one batch"
    else:
        return None
    if cap * num_prompts >= need:
        return None
    return (
        f"caps {num_prompts} prompts at {cap} rollouts each ({cap * num_prompts} in all), fewer than {need}, {what} "
        f"with allocation={knobs.allocation}: give at least {-(-need // num_prompts)} or null"
    )


def is_nonuniform(alloc, budget: int) -> bool:
    """Whether a round's allocation differs from an even split of ``budget`` over its prompts
    (``alloc/nonuniform_rounds``)."""
    a = np.asarray(alloc)
    # an even split of `budget` over P prompts differs by at most 1 (0 when P divides it)
    spread = int(a.max() - a.min()) if a.size else 0
    return spread > (0 if budget % max(a.size, 1) == 0 else 1)


def seed_candidates(alloc, solved) -> np.ndarray:
    """Algorithm 1 lines 9-10: acc_q = 1{a correct rollout so far}; a prompt given rollouts this round with acc_q = 0
    draws them from its ICL prompt. (P,) bool; whether examples are found for it is the caller's retrieval."""
    return (np.asarray(alloc) > 0) & ~np.asarray(solved, dtype=bool)


class RoundPlan(NamedTuple):
    """One planning round's decisions."""

    alloc: np.ndarray
    """(P,) int64: extra rollouts per prompt."""
    seed: np.ndarray
    """(P,) bool: prompts whose rollouts this round should come from their ICL prompt (`seed_candidates`)."""
    nonuniform: bool
    """The allocation differs from an even split (`is_nonuniform`)."""


def plan_round(
    rewards: Sequence[np.ndarray],
    budget: int,
    knobs: Any,
    *,
    icl: bool,
    full_reward: float,
    history: PromptHistory | None = None,
    allocator: AllocatorFn | None = None,
) -> RoundPlan:
    """Algorithm 1 lines 7-10 for one round over the prompts whose rewards so far are ``rewards``: the registered
    allocator ``knobs.allocation`` (or ``allocator``, an unregistered variant of it, such as the simulator's
    ablations) splits ``budget``; with ``icl`` (ICL seeding on and examples to draw from) the prompts given rollouts
    with no reward >= ``full_reward`` so far are marked for seeding."""
    fn = allocator if allocator is not None else get_allocator(knobs.allocation).fn
    alloc = np.asarray(fn(rewards, budget, knobs, history), dtype=np.int64)
    if icl:
        solved = np.array([bool(np.any(np.asarray(r) >= full_reward)) for r in rewards], dtype=bool)
        seed = seed_candidates(alloc, solved)
    else:
        seed = np.zeros(alloc.shape[0], dtype=bool)
    return RoundPlan(alloc, seed, is_nonuniform(alloc, budget))


# ---------------------------------------------------------------------------------------------------------------
# CurES's selection
# ---------------------------------------------------------------------------------------------------------------


class CuresChoice(NamedTuple):
    """CurES's draw of a step: the prompts, their counts, and what they were drawn from (for cures/* metrics)."""

    idx: np.ndarray
    """(k,) chosen prompt indices, in draw order."""
    counts: np.ndarray
    """(k,) int64 rollouts of each, summing to the budget."""
    p: np.ndarray
    """(N,) posterior mean accuracy of every candidate."""
    probs: np.ndarray
    """(N,) the sampling distribution the prompts were drawn from."""
    sigma: np.ndarray
    """(k,) gradient std of each chosen prompt."""


def _cures_counts(p: np.ndarray, budget: int, min_count: int) -> tuple[np.ndarray, np.ndarray]:
    # G = 1 for every rollout: sigma_i = sqrt(p_i (1 - p_i)) (docs/methods.md, CurES, "gradient norms")
    sigma = gradient_std(p)
    return rollout_counts(sigma, budget, min_count), sigma


def cures_select(
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
) -> CuresChoice:
    """CurES's choice of prompts and counts from its Beta posterior: beta_posterior -> posterior_mean ->
    sampling_probs (temperature c * alpha_i) -> ``k`` distinct prompts (``rng``) -> counts proportional to their
    sigma_i, at least ``min_count``, summing to ``budget``.

    Args:
        successes, trials: (N,) earlier successes / rollouts of each candidate prompt (the posterior's counts).
        k: prompts to draw, <= N.
        budget: rollouts of the step, >= min_count * k.
    """
    alpha, beta = beta_posterior(successes, trials, prior_alpha, prior_beta)
    p = posterior_mean(alpha, beta)
    probs = sampling_probs(p, prompt_temperature(alpha, temp_scale))
    idx = sample_prompts(probs, k, rng)
    counts, sigma = _cures_counts(p[idx], budget, min_count)
    return CuresChoice(idx, counts, p, probs, sigma)


# ---------------------------------------------------------------------------------------------------------------
# DAPO's refill
# ---------------------------------------------------------------------------------------------------------------


def refill_keep(rewards, group_ids, kept: int, want: int) -> np.ndarray:
    """DAPO's dynamic sampling on one generation batch: the ids of the groups whose rewards are not all equal
    (``dynamic_sampling_keep_groups``), lowest first, at most ``want - kept`` of them (the batch is full then)."""
    return dynamic_sampling_keep_groups(rewards, group_ids)[: want - kept]


def refill_more(kept: int, want: int, batches: int, max_batches: int) -> bool:
    """DAPO: draw another generation batch while fewer than ``want`` groups are kept and fewer than ``max_batches``
    batches were generated."""
    return kept < want and batches < max_batches
