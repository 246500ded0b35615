"""Streaming rollout planning: XRPO's planning rounds without the barrier between them (beyond the paper).

Algorithm 1 plans round t once every prompt's rollouts of round t - 1 are back, so each round waits for its slowest
group. Here every prompt moves through the same rounds on its own, on an engine that admits requests while others
decode (`xrpo.rollout.engine.StreamingEngine`: vLLM's engine loop)::

    submit        n_base rollouts of every prompt, all at once                                (Alg. 1 lines 2-4)
    on each wait  the groups that completed since the last wait are verified; each of their prompts becomes ready
                  for its next round t (a prompt given no extra rollouts in a wave is ready again at the next wait)
    a wave        once ceil(stream_quorum * P) prompts are ready for round t, or all the prompts not yet planned
                  for round t are ready, or nothing is decoding any more:
                  budget = the even shares of round t's budget of exactly those prompts; split over them by
                  Pi_q = Delta_q + phi_q (T = the wave's budget; allocate_round, as a round does)          (lines 5-7)
                  a member with no success so far draws from its ICL prompt, the others from q             (lines 8-12)
                  submitted at once; the engine keeps decoding everything else meanwhile

The rules, and how they keep Algorithm 1's intent (docs/methods.md, "Streaming rollout planning"):
    - Budget: round t's budget R_t (`plan_phases`, as for rounds) is split evenly over the P prompts once
      (`split_budget`, the earlier prompt taking the +1); every prompt passes through every round exactly once, in
      one wave, and a wave spends its members' shares, so the step spends ``rollouts_per_step`` exactly, n_base per
      prompt first. ``max_extra_per_prompt`` caps a prompt's extra rollouts in its wave as it caps them per round.
    - Priority: computed when the wave is planned, from all rewards the prompt has so far (its base group and its
      earlier waves), compared with the other members of the wave only: prompts that complete together compete for
      their pooled shares. The quorum bounds how small that competition gets; stream_quorum=1 makes every wave a
      round over all prompts (Algorithm 1's allocation, with the barrier).
    - Stragglers: a wave never waits for a prompt whose group is still decoding. The round's last prompts (fewer
      than the quorum) are planned together once all of them are ready, with their own shares, or earlier if
      nothing else is decoding. A prompt never loses its share for being late; it only competes with fewer.
    - ICL: as in rounds, a prompt with no correct rollout so far draws its wave's rollouts from its ICL prompt; that
      is known as soon as its base group completes, so seeded requests go in then.
    - Records: ``round`` is the wave number (0: base), waves numbered in the order they are planned; ``PlanResult
      .rounds`` has one entry per wave with the usual keys, plus "members" (the prompts it planned), "stage" (the
      round of Algorithm 1 it plays for them), "wait" (how many waits had returned when it was planned) and
      "in_flight" (requests still decoding then).
    - Determinism: decisions depend on which groups a wait returns, which the engine decides by engine steps, never
      by wall-clock time; a request's seed depends on (step seed, round, prompt index) only (`round_sampling`, the
      engine's per-index seed), never on completion order. So a seed gives the same result.

Equivalence with rounds (tested): on an engine where everything submitted completes at the next wait (`BatchStream`,
e.g. the hf engine), every wave holds all P prompts, so waves are rounds: the same allocations, ICL prompts, requests
and seeds, hence the same records, for any stream_quorum.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from xrpo.algo.allocation import plan_phases, split_budget
from xrpo.data import Problem
from xrpo.rollout.engine import RolloutEngine, SamplingParams, as_stream
from xrpo.rollout.prompts import PromptRenderer
from xrpo.rollout.records import PlanConfig, PlanResult
from xrpo.rollout.step import StepRollouts, WavePlan, round_sampling

__all__ = ["generate_rollouts_streaming", "quorum_size"]


def quorum_size(stream_quorum: float, num_prompts: int) -> int:
    """Prompts ready for a round that make a wave: ceil(stream_quorum * num_prompts), at least 1."""
    return max(1, math.ceil(stream_quorum * num_prompts - 1e-9))


def generate_rollouts_streaming(
    problems: Sequence[Problem],
    engine: RolloutEngine,
    verifier,
    renderer: PromptRenderer,
    cfg: PlanConfig,
    sampling: SamplingParams,
    *,
    corpus=None,
    history=None,
) -> PlanResult:
    """Algorithm 1 lines 1-13 planned in waves as groups complete (module docstring). Rewards, no advantages yet.
    ``history``: each prompt's earlier visits, for an allocator that reads them (`generate_rollouts`)."""
    step = StepRollouts(problems, verifier, renderer, cfg, corpus, history=history)
    P = step.P
    t0 = time.perf_counter()
    budgets = plan_phases(P, cfg.rollouts_per_step, cfg.n_base, cfg.plan_rounds).round_budgets
    shares = [split_budget(np.zeros(P), b) for b in budgets]  # shares[t - 1][q]: prompt q's share of round t
    step.timings["time/plan"] += time.perf_counter() - t0
    last = len(budgets)
    quorum = quorum_size(cfg.stream_quorum, P)
    stream = as_stream(engine)

    stage = [0] * P  # the last round of Algorithm 1 each prompt has been planned for (0: base)
    ready: list[list[int]] = [[] for _ in range(last + 1)]  # ready[t]: prompts waiting to be planned for round t
    held: list[int] = []  # planned with no extra rollouts: ready for their next round at the next wait
    in_flight: dict[tuple[int, int], tuple[int, bool]] = {}  # (prompt, round) -> (wave, seeded)
    waves: list[tuple[WavePlan, dict]] = []  # per wave: its plan, and when it was planned
    waits = 0
    planned_for = [0] * (last + 1)  # planned_for[t]: prompts planned for round t so far

    def submit(key: tuple[int, int], prompt: str, n: int, wave: int, seeded: bool) -> None:
        t0 = time.perf_counter()
        stream.submit(key, prompt, n, round_sampling(sampling, key[1]), index=key[0])
        step.timings["time/generate"] += time.perf_counter() - t0
        in_flight[key] = (wave, seeded)

    def plan(t: int, members: list[int]) -> None:
        members = sorted(members)
        budget = int(sum(shares[t - 1][q] for q in members))
        for q in members:
            stage[q] = t
        if budget == 0:  # nothing of round t is theirs (R_t < P); as rounds skip an empty round
            for q in members:
                if t < last:
                    ready[t + 1].append(q)
            return
        w = step.plan(members, budget)
        wave = len(waves) + 1
        waves.append((w, dict(members=members, stage=t, wait=waits, in_flight=len(in_flight))))
        for j, q in enumerate(members):
            if w.alloc[j] > 0:
                submit((q, t), w.prompts[j], int(w.alloc[j]), wave, w.seeded[j])
            else:
                held.append(q)

    for q in range(P):
        submit((q, 0), step.plain[q], cfg.n_base, 0, False)
    while in_flight or held or any(ready):
        t0 = time.perf_counter()
        done = stream.wait()
        waits += 1
        step.timings["time/generate"] += time.perf_counter() - t0
        groups = []
        for key, rollouts in done:
            wave, seeded = in_flight.pop(key)
            groups.append((key[0], rollouts, wave, seeded))
        # the last round's rewards plan nothing: verified in one batch with the last groups (each verifier call
        # has a fixed cost, and a step has a dozen waits)
        step.add(groups, verify=not in_flight or any(key[1] < last for key, _ in done))
        for q in [key[0] for key, _ in done] + held:
            if stage[q] < last:
                ready[stage[q] + 1].append(q)
        held = []
        planned = True
        while planned:  # a wave with no budget moves its prompts on at once, which may make another wave
            planned = False
            for t in range(1, last + 1):
                # the quorum, or the round's last prompts all ready, or nothing left to wait for
                if ready[t] and (len(ready[t]) >= min(quorum, P - planned_for[t]) or not in_flight):
                    planned_for[t] += len(ready[t])
                    members, ready[t] = ready[t], []
                    plan(t, members)
                    planned = True

    # records in (wave, prompt) order, as rounds lays them out, whatever order the groups completed in
    step.records.sort(key=lambda x: (x.round, x.problem_index))
    by_wave: list[list] = [[] for _ in range(len(waves) + 1)]
    for x in step.records:
        by_wave[x.round].append(x)
    rounds = [step.entry(0, [cfg.n_base] * P, by_wave[0])]
    for i, (w, when) in enumerate(waves, start=1):
        rounds.append({**step.wave_entry(i, w, by_wave[i]), **when})
    return step.result(rounds)
