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

import dataclasses
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from xrpo.algo.allocation import allocate_round, plan_phases, split_budget
from xrpo.algo.config import (
    AdvantageConfig,
    AllocationConfig,
    ICLConfig,
    ICLPromptConfig,
    SharpenConfig,
    StreamConfig,
    check_knobs,
)
from xrpo.data import Problem
from xrpo.rollout.advantages import compute_advantages
from xrpo.rollout.corpus import update_corpus
from xrpo.rollout.engine import RolloutEngine, SamplingParams
from xrpo.rollout.prompts import PromptRenderer


@dataclass
class PlanConfig(StreamConfig, SharpenConfig, ICLPromptConfig, ICLConfig, AllocationConfig, AdvantageConfig):
    """What one step of rollouts looks like: the knob sections of `xrpo.algo.config` (the trainer's ``method`` and
    ``rollout`` fields of the same names) and the step's budget. ``allocation="cures"``: the caller chooses each
    prompt's count (``counts=``), generated in one batch without planning rounds."""

    rollouts_per_step: int = 128
    """Total rollouts of the step over all prompts, base rollouts included (paper: 128 for 16 prompts)."""

    def __post_init__(self):
        check_knobs(self)
        if (
            isinstance(self.rollouts_per_step, bool)
            or not isinstance(self.rollouts_per_step, int)
            or self.rollouts_per_step < 1
        ):
            raise ValueError(f"config field rollouts_per_step must be >= 1, got {self.rollouts_per_step!r}")


@dataclass
class RolloutRecord:
    """One rollout with everything the trainer and the logs need."""

    problem_index: int
    group_id: int
    round: int
    seeded: bool
    gen_prompt_ids: list[int]
    train_prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str
    reward: float = 0.0
    answer: str | None = None
    verify_reason: str | None = None
    tree_path: tuple[int, ...] = ()
    """Tree rollouts (`xrpo.rollout.treepo`): ids of the nodes on the path from the root (excluded, id 0) to this
    leaf, its own last node included; ids are unique within the problem's tree. Empty for independent rollouts."""
    segment_ends: tuple[int, ...] = ()
    """Tree rollouts: the completion offset at which each segment of the path ends (the last is its length)."""


@dataclass
class PlanResult:
    records: list[RolloutRecord]
    rewards: np.ndarray
    group_ids: np.ndarray
    advantages: np.ndarray | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    rounds: list[dict] = field(default_factory=list)
    """Per round: allocation per prompt ("alloc"), seeded prompt indices ("seeded"), "flips", ICL example solutions
    cut to fit the prompt budget ("truncated"), retrieved examples left out to fit it ("dropped"), the problem ids of
    the prompts ("problems") and each prompt's correct rollouts in that round ("successes", reward >= full_reward)."""


def _is_nonuniform(alloc: np.ndarray, budget: int) -> bool:
    # an even split of `budget` over P prompts differs by at most 1 (0 when P divides it)
    spread = int(alloc.max() - alloc.min()) if alloc.size else 0
    return spread > (0 if budget % max(alloc.size, 1) == 0 else 1)


def round_sampling(sampling: SamplingParams, rnd: int) -> SamplingParams:
    """The sampling parameters of planning round (or wave) ``rnd``: round 0 (the base rollouts, GRPO's one batch)
    samples with ``sampling``; a later round with a seed of its own, drawn from (seed, rnd). With one seed for every
    round, an engine that seeds each prompt's request from (seed, prompt index) (vLLM) would draw a prompt's extra
    rollouts as copies of its base rollouts."""
    if rnd == 0 or sampling.seed is None:
        return sampling
    return dataclasses.replace(sampling, seed=random.Random(f"xrpo-round:{sampling.seed}:{rnd}").getrandbits(31))


class StepRollouts:
    """The rollouts of one step as they arrive, whatever schedule generates them (`generate_rollouts`' rounds, the
    streaming planner's waves, `xrpo.rollout.streaming`): records, rewards per prompt, ICL prompts, timings."""

    def __init__(self, problems: Sequence[Problem], verifier, renderer: PromptRenderer, cfg: PlanConfig, corpus=None):
        self.problems, self.verifier, self.renderer, self.cfg, self.corpus = problems, verifier, renderer, cfg, corpus
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

    def solved(self, q: int) -> bool:
        return any(r >= self.cfg.full_reward for r in self.by_prompt[q])

    def allocate(self, members: Sequence[int], budget: int) -> np.ndarray:
        """Algorithm 1 line 7 over the prompts ``members``: ``budget`` extra rollouts by Pi_q (hrp) or evenly."""
        cfg = self.cfg
        t0 = time.perf_counter()
        if cfg.allocation == "hrp":
            alloc = allocate_round(
                [np.asarray(self.by_prompt[q]) for q in members],
                budget,
                alpha=cfg.alpha,
                lam=cfg.lam,
                max_per_prompt=cfg.max_extra_per_prompt,
                mode=cfg.alloc_mode,
            )
        else:
            alloc = split_budget(np.zeros(len(members)), budget, max_per_prompt=cfg.max_extra_per_prompt)
        self.timings["time/plan"] += time.perf_counter() - t0
        return alloc

    def prompts_for(self, members: Sequence[int], alloc: Sequence[int]) -> tuple[list[str], list[bool], int, int]:
        """Algorithm 1 lines 8-12 for ``members`` with extra rollouts ``alloc``: the prompt each draws from (its ICL
        prompt if it has no success so far and the corpus has examples for it), whether it is seeded, and the ICL
        examples truncated / dropped to fit the prompt budget."""
        cfg = self.cfg
        prompts, seeded, truncated, dropped = [self.plain[q] for q in members], [False] * len(members), 0, 0
        if cfg.icl and self.corpus is not None and len(self.corpus) > 0:
            # Alg. 1 line 9-10: acc_q = 1{exists a correct rollout}; unsolved prompts get their ICL prompt
            unsolved = [j for j, q in enumerate(members) if alloc[j] > 0 and not self.solved(q)]
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
        return prompts, seeded, truncated, dropped

    def successes(self, new: Sequence[RolloutRecord]) -> list[int]:
        """Correct rollouts per prompt among ``new``: with "problems" this lets rounds.jsonl readers recover
        per-prompt success rates (`xrpo simulate --rounds-file`)."""
        out = [0] * self.P
        for x in new:
            out[x.problem_index] += int(x.reward >= self.cfg.full_reward)
        return out

    def entry(self, rnd: int, alloc: Sequence[int], new: Sequence[RolloutRecord], **extra) -> dict:
        """The ``PlanResult.rounds`` entry of round ``rnd`` (alloc per prompt, its rollouts ``new``)."""
        return {
            "round": rnd,
            "alloc": [int(a) for a in alloc],
            "seeded": [],
            "flips": 0,
            "truncated": 0,
            **extra,
            "problems": self.ids,
            "successes": self.successes(new),
        }

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
) -> PlanResult:
    """Algorithm 1 lines 1-13: base rollouts, then planning rounds with ICL seeding. Rewards, no advantages yet.

    With ``cfg.allocation == "cures"``, ``counts[q]`` rollouts of prompt q (integers >= 0 summing to
    ``cfg.rollouts_per_step``) are generated in one batch instead; ``counts`` is an error with any other allocation.
    With ``cfg.planner == "streaming"`` the rounds are planned as groups complete (`xrpo.rollout.streaming`).
    """
    P = len(problems)
    if P == 0:
        raise ValueError("problems is empty")
    if cfg.allocation == "cures":
        if counts is None:
            raise ValueError("allocation='cures' needs counts (rollouts per prompt, chosen by the caller)")
        fixed = [int(c) for c in counts]
        if len(fixed) != P or any(c != c0 for c, c0 in zip(fixed, counts)) or min(fixed) < 0:
            raise ValueError(f"counts must be {P} integers >= 0 (one per prompt), got {list(counts)!r}")
        if sum(fixed) != cfg.rollouts_per_step:
            raise ValueError(f"counts sum to {sum(fixed)}, not rollouts_per_step={cfg.rollouts_per_step}")
    elif counts is not None:
        raise ValueError(f"counts is only used with allocation='cures', not {cfg.allocation!r}")
    one_batch = cfg.allocation == "cures" or (cfg.allocation == "uniform" and not cfg.icl)
    if cfg.planner == "streaming" and not one_batch:
        from xrpo.rollout.streaming import generate_rollouts_streaming

        return generate_rollouts_streaming(problems, engine, verifier, renderer, cfg, sampling, corpus=corpus)
    step = StepRollouts(problems, verifier, renderer, cfg, corpus)
    rounds: list[dict] = []

    def run(prompts: list[str], counts: list[int], seeded: list[bool], rnd: int) -> list[RolloutRecord]:
        t0 = time.perf_counter()
        outs = engine.generate(prompts, counts, round_sampling(sampling, rnd))
        step.timings["time/generate"] += time.perf_counter() - t0
        return step.add([(q, rollouts, rnd, seeded[q]) for q, rollouts in enumerate(outs)])

    if one_batch:
        # nothing to plan: one batch, the caller's counts (cures; the problem ids make the caller's choice of prompts
        # visible in rounds.jsonl) or the whole budget split evenly (GRPO)
        alloc = fixed if cfg.allocation == "cures" else split_budget(np.zeros(P), cfg.rollouts_per_step).tolist()
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
        alloc = step.allocate(everyone, budget)
        prompts, seeded, truncated, dropped = step.prompts_for(everyone, alloc)
        new = run(prompts, [int(a) for a in alloc], seeded, t)
        rounds.append(wave_entry(step, t, everyone, alloc, seeded, new, truncated, dropped, budget))
    return step.result(rounds)


def wave_entry(step: StepRollouts, rnd: int, members, alloc, seeded, new, truncated: int, dropped: int, budget: int):
    """The rounds entry of a planning round or wave: ``alloc[j]`` extra rollouts of prompt ``members[j]``, ``new``
    the records they produced."""
    full = [0] * step.P
    for q, a in zip(members, alloc):
        full[q] = int(a)
    seeded_idx = [q for q, s in zip(members, seeded) if s]
    successes = step.successes(new)
    return step.entry(
        rnd,
        full,
        new,
        seeded=seeded_idx,
        flips=sum(1 for q in seeded_idx if successes[q] > 0),
        truncated=truncated,
        dropped=dropped,
        nonuniform=_is_nonuniform(np.asarray(alloc), budget),
    )


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
    m = {
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
    return m


def plan_rollouts(
    problems: Sequence[Problem],
    engine: RolloutEngine,
    verifier,
    renderer: PromptRenderer,
    cfg: PlanConfig,
    sampling: SamplingParams,
    *,
    corpus=None,
    step: int = 0,
) -> PlanResult:
    """Algorithm 1 in full: rollouts, advantages (with the engine's log-probs for s(y)), corpus update."""
    result = generate_rollouts(problems, engine, verifier, renderer, cfg, sampling, corpus=corpus)
    compute_advantages(result, cfg)
    if cfg.icl and corpus is not None:
        result.metrics.update(update_corpus(result, problems, corpus, cfg, step))
        result.metrics["icl/corpus_problems"] = float(len(corpus))
    return result
