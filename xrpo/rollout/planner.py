"""The XRPO rollout planner: Algorithm 1 of the paper (Bamba et al., "XRPO", §3, Algorithm 1).

One call plans, generates and verifies every rollout of a training step::

    base rollouts         n_base rollouts for every prompt                                  (Alg. 1 lines 2-4)
    for t in 1..N_plan:   rewards so far -> allocate_round (Pi_q = Delta_q + phi_q)         (lines 5-7)
                          a prompt with no success so far draws its rollouts from its ICL
                          prompt (K most similar solved problems), the others from q       (lines 8-12)
    advantages            GRPO by group id, then novelty sharpening of correct rollouts    (line 14,
                          xrpo.rollout.advantages, after the trainer's old log-probs)
    corpus update         every correct rollout joins the ICL corpus (line 15, xrpo.rollout.corpus)

Switches give the paper's ablations: ``allocation="uniform"`` (w/o HRP: the same budget split evenly in the same
rounds), ``icl=False`` (w/o ICL), ``sharpen=False`` (w/o AS). With uniform allocation and no ICL there is nothing to
plan, so all rollouts are generated in one engine call (GRPO's single batch); the rounds only exist when they can
change what is generated. ``allocation="cures"`` takes the per-prompt counts from the caller (``counts=``: CurES
chooses them from its posterior) and generates them in that one engine call too.

Which prompt an ICL-seeded rollout is trained under (``icl_train_prompt``):
    ``"original"`` (default): the completion is paired with the plain prompt q. What it teaches then holds without
    examples at test time, which is how the model is evaluated (the paper evaluates without ICL, and its train/test
    ablation, appendix "ICL Train-Time vs. Test-Time", finds test-time ICL redundant). The sampling log-probs were
    computed under the ICL prompt, so such rollouts are off-policy for q; the trainer recomputes the old log-probs under
    q before the update, so the PPO ratio starts at 1 and the clip bounds the step.
    ``"icl"``: the completion is trained under the ICL prompt it was sampled from (on-policy, but the lesson is tied to
    the examples).

Deviations from the paper, all documented here:
    - n_q counts every rollout of the prompt so far, ICL-seeded ones included (the paper does not say otherwise).
    - the corpus is updated once per step (Alg. 1 line 15), so a problem first solved in round 1 cannot serve as an
      example in round 2 of the same step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from xrpo.algo.allocation import plan_phases
from xrpo.algo.rounds import PromptHistory, batch_counts, get_allocator, plans_rounds
from xrpo.data import Problem
from xrpo.rollout.engine import RolloutEngine, SamplingParams
from xrpo.rollout.prompts import PromptRenderer
from xrpo.rollout.records import PlanConfig, PlanResult, RolloutRecord
from xrpo.rollout.step import StepRollouts, round_sampling
from xrpo.rollout.streaming import generate_rollouts_streaming

__all__ = ["generate_rollouts"]


def generate_rollouts(
    problems: Sequence[Problem],
    engine: RolloutEngine,
    verifier,
    renderer: PromptRenderer,
    cfg: PlanConfig,
    sampling: SamplingParams,
    *,
    corpus=None,
    counts: Sequence[int] | None = None,
    history: PromptHistory | None = None,
) -> PlanResult:
    """Algorithm 1 lines 1-13: base rollouts, then planning rounds with ICL seeding. Rewards, no advantages yet.

    The one place a step's schedule is chosen: one batch when rounds could not change what is generated
    (`xrpo.algo.rounds.plans_rounds`), else rounds, or with ``cfg.planner == "streaming"`` waves planned as groups
    complete (`xrpo.rollout.streaming`). With an allocator that selects prompts (``cfg.allocation == "cures"``),
    ``counts[q]`` rollouts of prompt q (integers >= 0 summing to ``cfg.rollouts_per_step``) are generated in one
    batch; ``counts`` is an error with any other allocation. ``history`` (each prompt's earlier visits, arrays of
    length ``len(problems)``) goes to an allocator that reads it (knapsack, xrpo-plus); the caller keeps it.
    """
    P = len(problems)
    if P == 0:
        raise ValueError("problems is empty")
    caller_counts = get_allocator(cfg.allocation).selects_prompts
    if caller_counts:
        if counts is None:
            raise ValueError(f"allocation={cfg.allocation!r} needs counts (rollouts per prompt, chosen by the caller)")
        fixed = [int(c) for c in counts]
        if len(fixed) != P or any(c != c0 for c, c0 in zip(fixed, counts)) or min(fixed) < 0:
            raise ValueError(f"counts must be {P} integers >= 0 (one per prompt), got {list(counts)!r}")
        if sum(fixed) != cfg.rollouts_per_step:
            raise ValueError(f"counts sum to {sum(fixed)}, not rollouts_per_step={cfg.rollouts_per_step}")
    elif counts is not None:
        raise ValueError(f"counts is only used with allocation='cures', not {cfg.allocation!r}")
    one_batch = not plans_rounds(cfg.allocation, cfg.icl)
    if history is not None and any(a is not None and len(a) != P for a in history):
        got = ", ".join(str(len(a)) for a in history if a is not None)
        raise ValueError(f"history must hold {P} prompts' successes and trials (and reward windows), got {got}")
    if cfg.planner == "streaming" and not one_batch:
        return generate_rollouts_streaming(
            problems, engine, verifier, renderer, cfg, sampling, corpus=corpus, history=history
        )
    step = StepRollouts(problems, verifier, renderer, cfg, corpus, history=history)
    rounds: list[dict] = []

    def run(prompts: list[str], counts: list[int], seeded: list[bool], rnd: int) -> list[RolloutRecord]:
        t0 = time.perf_counter()
        outs = engine.generate(prompts, counts, round_sampling(sampling, rnd))
        step.timings["time/generate"] += time.perf_counter() - t0
        return step.add([(q, rollouts, rnd, seeded[q]) for q, rollouts in enumerate(outs)])

    if one_batch:
        # nothing to plan: one batch, the caller's counts (cures; the problem ids make the caller's choice of prompts
        # visible in rounds.jsonl), the budget placed from the prompts' history (knapsack) or split evenly (GRPO)
        t0 = time.perf_counter()
        alloc = fixed if caller_counts else batch_counts(cfg, P, cfg.rollouts_per_step, history).tolist()
        step.timings["time/plan"] += time.perf_counter() - t0
        new = run(step.plain, [int(a) for a in alloc], [False] * P, 0)
        rounds.append(step.entry(0, alloc, new))
        return step.result(rounds)

    t0 = time.perf_counter()
    phases = plan_phases(P, cfg.rollouts_per_step, cfg.n_base, cfg.plan_rounds)
    step.timings["time/plan"] += time.perf_counter() - t0
    new = run(step.plain, [cfg.n_base] * P, [False] * P, 0)
    rounds.append(step.entry(0, [cfg.n_base] * P, new))
    everyone = list(range(P))
    for t, budget in enumerate(phases.round_budgets, start=1):
        if budget == 0:
            continue
        w = step.plan(everyone, budget)
        new = run(w.prompts, [int(a) for a in w.alloc], w.seeded, t)
        rounds.append(step.wave_entry(t, w, new))
    return step.result(rounds)
