"""CurES in training, and what a step's visit of its problems is: prompt selection and per-prompt rollout counts from
the Beta posterior of every training problem's accuracy, the posterior update after verification, and the warm-up
("precomputing prompt difficulty") before training. The math is in `xrpo.algo.cures`, the per-problem counts across
steps in `xrpo.algo.visits.CuresState`; docs/methods.md (CurES) says where each rule comes from and what differs from
the authors' code.

`observe_visit` is what the last-visit history that the knapsack and xrpo-plus allocators read counts of a step (its
plain rollouts; ICL-seeded ones measure the ICL prompt, not the problem): the trainer's planner source and the verl
driver both call it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from xrpo.algo.cures import posterior_mean
from xrpo.algo.visits import CuresState
from xrpo.data import Problem
from xrpo.rollout.engine import RolloutEngine, SamplingParams
from xrpo.rollout.planner import generate_rollouts
from xrpo.rollout.prompts import PromptRenderer
from xrpo.rollout.records import PlanConfig, PlanResult


def observe_visit(state: CuresState, idx, plan: PlanResult, full_reward: float) -> None:
    """A step's visit of the problems ``idx`` (``plan.group_ids`` index into it) becomes their last visit: the
    successes (reward >= ``full_reward``) and rollouts of the step, ICL-seeded rollouts left out (they measure the
    ICL prompt, not the problem); a problem whose rollouts were all seeded keeps its earlier visit."""
    # 0/1 rewards against the state's threshold 0.5: a success is reward >= full_reward, whatever the threshold
    solved = (np.asarray(plan.rewards) >= full_reward).astype(np.float64)
    plain = np.array([not x.seeded for x in plan.records], dtype=bool)
    state.observe(idx, solved, plan.group_ids, mask=plain)


def warmup(
    state: CuresState,
    problems: Sequence[Problem],
    engine: RolloutEngine,
    verifier,
    renderer: PromptRenderer,
    n: int,
    sampling_for: Callable[[int], SamplingParams],
    prompts_per_call: int,
) -> dict:
    """CurES's precompute stage: ``n`` rollouts of every training problem with the initial model, verified and added
    to the posterior (CurES code, epic/stage_0_init_difficulty_sample_size.py ``init_difficulty``: "Initialize the
    difficulty distribution with `num_rollout_min` rollouts per prompt for all prompts in the dataset").

    Generated through the planner's caller-counted path (allocation="cures"), ``prompts_per_call`` problems per engine
    call; ``sampling_for(call)`` gives each call its sampling parameters (seed). Returns cures/* warm-up metrics.
    """
    if n < 1:
        raise ValueError(f"warm-up rollouts per problem must be >= 1, got {n}")
    t0 = time.perf_counter()
    spent = 0
    for call, start in enumerate(range(0, len(problems), prompts_per_call)):
        chunk = list(range(start, min(start + prompts_per_call, len(problems))))
        cfg = PlanConfig(rollouts_per_step=n * len(chunk), allocation="cures", icl=False, sharpen=False)
        res = generate_rollouts(
            [problems[i] for i in chunk], engine, verifier, renderer, cfg, sampling_for(call), counts=[n] * len(chunk)
        )
        state.observe(chunk, res.rewards, res.group_ids)
        spent += len(res.records)
    state.warmup_rollouts += spent
    alpha, beta = state.posterior()
    return {
        "cures/warmup_rollouts": float(spent),
        "cures/warmup_time_s": time.perf_counter() - t0,
        "cures/warmup_p_mean": float(posterior_mean(alpha, beta).mean()),
        "cures/warmup_solved_frac": float(np.mean(state.successes > 0)),
    }
