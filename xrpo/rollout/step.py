"""The rollouts of one step as they arrive, whatever schedule generates them (the planner's rounds,
`xrpo.rollout.planner`; the streaming planner's waves, `xrpo.rollout.streaming`): records, rewards per prompt, the
round's plan (`xrpo.algo.rounds.plan_round`) with the ICL prompts retrieved for it, timings, and the step's
rollout/* alloc/* icl/* metrics (`rollout_metrics`)."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Sequence

import numpy as np

from xrpo.algo.rounds import PromptHistory, plan_round
from xrpo.data import Problem
from xrpo.rollout.engine import SamplingParams
from xrpo.rollout.prompts import PromptRenderer
from xrpo.rollout.records import PlanConfig, PlanResult, RolloutRecord
from xrpo.rundir.rounds import round_entry

__all__ = ["StepRollouts", "WavePlan", "round_sampling", "rollout_metrics"]


def round_sampling(sampling: SamplingParams, rnd: int) -> SamplingParams:
    """The sampling parameters of planning round (or wave) ``rnd``: round 0 (the base rollouts, GRPO's one batch)
    samples with ``sampling``; a later round with a seed of its own, drawn from (seed, rnd). With one seed for every
    round, an engine that seeds each prompt's request from (seed, prompt index) (vLLM) would draw a prompt's extra
    rollouts as copies of its base rollouts."""
    if rnd == 0 or sampling.seed is None:
        return sampling
    return dataclasses.replace(sampling, seed=random.Random(f"xrpo-round:{sampling.seed}:{rnd}").getrandbits(31))


@dataclasses.dataclass
class WavePlan:
    """A planning round (or a streaming wave) over the prompts ``members``: what `StepRollouts.plan` decided."""

    members: list[int]
    budget: int
    alloc: np.ndarray
    """Extra rollouts of ``members[j]``."""
    prompts: list[str]
    """The prompt each member draws from (its ICL prompt when seeded)."""
    seeded: list[bool]
    truncated: int
    """ICL example solutions cut to fit the prompt budget."""
    dropped: int
    """Retrieved ICL examples left out to fit it."""
    nonuniform: bool


class StepRollouts:
    """The rollouts of one step as they arrive (module docstring)."""

    def __init__(
        self,
        problems: Sequence[Problem],
        verifier,
        renderer: PromptRenderer,
        cfg: PlanConfig,
        corpus=None,
        history: PromptHistory | None = None,
    ):
        self.problems, self.verifier, self.renderer, self.cfg, self.corpus = problems, verifier, renderer, cfg, corpus
        self.history = history
        """Each prompt's earlier visits (None: not kept), for the allocators that read them."""
        self.P = len(problems)
        self.timings = {"time/generate": 0.0, "time/verify": 0.0, "time/plan": 0.0, "time/retrieve": 0.0}
        self.records: list[RolloutRecord] = []
        self.by_prompt: list[list[float]] = [[] for _ in range(self.P)]
        self.plain = [renderer.render(p) for p in problems]
        self.refs = [p.answer for p in problems]
        self.ids = [p.id for p in problems]
        self.plain_ids: list[list[int] | None] = [None] * self.P
        self.unverified: list[RolloutRecord] = []

    def add(self, groups: Sequence[tuple[int, Sequence, int, bool]], verify: bool = True) -> list[RolloutRecord]:
        """Record ``(prompt q, rollouts, round, seeded)`` groups and verify them with every record not verified yet
        (``verify=False`` leaves them for a later call: one verifier batch instead of many small ones); returns
        their new records."""
        new: list[RolloutRecord] = []
        for q, rollouts, rnd, seeded in groups:
            for r in rollouts:
                if not seeded and self.plain_ids[q] is None:
                    self.plain_ids[q] = list(r.prompt_ids)
                new.append(
                    RolloutRecord(
                        problem_index=q,
                        group_id=q,
                        round=rnd,
                        seeded=seeded,
                        gen_prompt_ids=list(r.prompt_ids),
                        train_prompt_ids=list(r.prompt_ids),
                        completion_ids=list(r.completion_ids),
                        logprobs=list(r.logprobs),
                        finish_reason=r.finish_reason,
                        text=r.text,
                    )
                )
        self.records.extend(new)
        self.unverified.extend(new)
        if verify and self.unverified:
            todo, self.unverified = self.unverified, []
            t0 = time.perf_counter()
            results = self.verifier.verify_batch([x.text for x in todo], [self.refs[x.problem_index] for x in todo])
            self.timings["time/verify"] += time.perf_counter() - t0
            for x, res in zip(todo, results):
                x.reward, x.answer, x.verify_reason = float(res.score), res.answer, res.reason
                self.by_prompt[x.problem_index].append(x.reward)
        return new

    def plan(self, members: Sequence[int], budget: int) -> WavePlan:
        """Algorithm 1 lines 7-12 over the prompts ``members``: `plan_round` splits ``budget`` and says which of them
        draw from their ICL prompt (no success so far, ICL on, a corpus with examples); each of those is seeded when
        retrieval finds examples for it."""
        cfg = self.cfg
        members = list(members)
        t0 = time.perf_counter()
        icl_on = bool(cfg.icl and self.corpus is not None and len(self.corpus) > 0)
        h = self.history
        rp = plan_round(
            [np.asarray(self.by_prompt[q]) for q in members],
            budget,
            cfg,
            icl=icl_on,
            full_reward=cfg.full_reward,
            history=None if h is None else PromptHistory(*h).take(members),
        )
        self.timings["time/plan"] += time.perf_counter() - t0
        prompts, seeded, truncated, dropped = [self.plain[q] for q in members], [False] * len(members), 0, 0
        unsolved = [int(j) for j in np.flatnonzero(rp.seed)]
        if unsolved:
            t0 = time.perf_counter()
            found = self.corpus.retrieve_many(
                [self.problems[members[j]].id for j in unsolved],
                [self.problems[members[j]].text for j in unsolved],
                k=cfg.icl_k,
                min_similarity=cfg.icl_min_similarity,
            )
            for j, examples in zip(unsolved, found):
                if examples:
                    icl = self.renderer.render_icl(self.problems[members[j]], examples)
                    dropped += icl.dropped
                    if icl.num_examples > 0:
                        prompts[j], seeded[j] = icl.text, True
                        truncated += icl.truncated
            self.timings["time/retrieve"] += time.perf_counter() - t0
        return WavePlan(members, budget, rp.alloc, prompts, seeded, truncated, dropped, rp.nonuniform)

    def successes(self, new: Sequence[RolloutRecord]) -> list[int]:
        """Correct rollouts per prompt among ``new``: with "problems" this lets rounds.jsonl readers recover
        per-prompt success rates (`xrpo simulate --rounds-file`)."""
        out = [0] * self.P
        for x in new:
            out[x.problem_index] += int(x.reward >= self.cfg.full_reward)
        return out

    def entry(self, rnd: int, alloc: Sequence[int], new: Sequence[RolloutRecord]) -> dict:
        """The ``PlanResult.rounds`` entry of an unplanned batch (round 0, or a one-batch step)."""
        return round_entry(rnd, alloc, self.ids, self.successes(new))

    def wave_entry(self, rnd: int, w: WavePlan, new: Sequence[RolloutRecord]) -> dict:
        """The rounds entry of a planning round or wave ``w``, ``new`` the records it produced."""
        full = [0] * self.P
        for q, a in zip(w.members, w.alloc):
            full[q] = int(a)
        return round_entry(
            rnd,
            full,
            self.ids,
            self.successes(new),
            seeded=[q for q, s in zip(w.members, w.seeded) if s],
            truncated=w.truncated,
            dropped=w.dropped,
            nonuniform=w.nonuniform,
        )

    def result(self, rounds: list[dict]) -> PlanResult:
        """The step's `PlanResult` (records in the order they were added), training prompts set."""
        # every prompt had plain rollouts in round 0 unless its base allocation was 0 (possible only in the
        # single-batch path with fewer rollouts than prompts); tokenise the plain prompt there
        for q in range(self.P):
            if self.plain_ids[q] is None:
                self.plain_ids[q] = list(self.renderer.tokenizer(self.plain[q], add_special_tokens=False)["input_ids"])
        if self.cfg.icl_train_prompt == "original":
            for x in self.records:
                x.train_prompt_ids = list(self.plain_ids[x.problem_index])
        rewards = np.array([x.reward for x in self.records], dtype=np.float64)
        group_ids = np.array([x.group_id for x in self.records], dtype=np.int64)
        result = PlanResult(records=self.records, rewards=rewards, group_ids=group_ids, rounds=rounds)
        result.metrics.update(self.timings)
        result.metrics.update(rollout_metrics(result, self.P, full_reward=self.cfg.full_reward))
        return result


def rollout_metrics(result: PlanResult, num_prompts: int, full_reward: float = 1.0) -> dict[str, float]:
    """rollout/*, alloc/* and icl/* figures of a plan (see docs/metrics.md); a rollout with reward >= ``full_reward``
    counts as correct."""
    recs, rewards = result.records, result.rewards
    lengths = np.array([len(x.completion_ids) for x in recs], dtype=np.float64)
    sizes = np.bincount(result.group_ids, minlength=num_prompts)
    zero_var = 0
    for q in range(num_prompts):
        r = rewards[result.group_ids == q]
        zero_var += int(r.size > 0 and np.all(r == r[0]))
    planned = [r for r in result.rounds if r["round"] > 0]
    # a streaming wave plans some prompts ("members"); a round plans all
    extras = np.array(
        [r["alloc"][q] for r in planned for q in r.get("members", range(len(r["alloc"])))], dtype=np.float64
    )
    seeded = sum(len(r["seeded"]) for r in planned)
    flips = sum(r["flips"] for r in planned)
    return {
        "rollout/count": float(len(recs)),
        "rollout/reward_mean": float(rewards.mean()) if rewards.size else 0.0,
        "rollout/reward_std": float(rewards.std()) if rewards.size else 0.0,
        "rollout/response_length_mean": float(lengths.mean()) if lengths.size else 0.0,
        "rollout/truncation_rate": float(np.mean([x.finish_reason == "length" for x in recs])) if recs else 0.0,
        "rollout/zero_variance_group_frac": zero_var / num_prompts,
        "rollout/solved_prompt_frac": float(
            np.mean([np.any(rewards[result.group_ids == q] >= full_reward) for q in range(num_prompts)])
        ),
        "rollout/group_size_min": float(sizes.min()),
        "rollout/group_size_max": float(sizes.max()),
        "alloc/rounds": float(len(planned)),
        "alloc/nonuniform_rounds": float(sum(bool(r.get("nonuniform")) for r in planned)),
        "alloc/max_extra": float(extras.max()) if extras.size else 0.0,
        "alloc/zero_extra_frac": float(np.mean(extras == 0)) if extras.size else 0.0,
        "icl/seeded_prompts": float(seeded),
        "icl/flips": float(flips),
        "icl/flip_rate": float(flips / seeded) if seeded else 0.0,
        "icl/seeded_rollouts": float(sum(x.seeded for x in recs)),
        "icl/truncated_examples": float(sum(r["truncated"] for r in planned)),
        "icl/dropped_examples": float(sum(r.get("dropped", 0) for r in planned)),
    }
