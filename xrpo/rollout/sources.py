"""Batch sources: the one way the training loop gets a step's rollouts.

A source answers ``next_batch(step) -> Batch`` (the step's problems and their verified rollouts, without advantages)
and keeps whatever state it carries across steps behind ``state_dict`` / ``load_state_dict`` (saved in every
checkpoint). Sources are registered by name, like the policy losses (`xrpo.algo.losses`):

    planner   XRPO's planner (Algorithm 1 lines 1-13: base rollouts, planning rounds, ICL seeding), prompts in epoch
              order; with allocation=uniform and no ICL it is GRPO's single batch; with an allocator that reads
              history (knapsack, xrpo-plus) it keeps every problem's last visit (checkpointed)
    tree      TreePO's tree sampler (`xrpo.rollout.treepo`), prompts in epoch order
    cures     CurES: prompts and their rollout counts drawn from the Beta posterior of every problem's accuracy, which
              the step's verified rewards update; a warm-up before step 1 initialises it (`xrpo.rollout.cures`)

and `DynamicSampling` wraps an epoch-order source with DAPO's refill (drop the groups whose rewards are all equal,
draw new prompts until the batch is full or ``max_gen_batches`` generation batches are spent). `build_source` picks
them from the method's knobs (`source_name`).

Advantages (Algorithm 1 line 14) are computed after the trainer has recomputed the old log-probs, through
`batch_advantages`, the one function the loop calls for them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from xrpo.algo.config import CuresConfig, TreePOConfig, section_values
from xrpo.algo.rounds import get_allocator, history_window, refill_keep, refill_more
from xrpo.algo.visits import CuresState, last_visit_state, visit_history
from xrpo.data import Problem
from xrpo.rollout import cures as cures_lib
from xrpo.rollout.advantages import compute_advantages
from xrpo.rollout.engine import RolloutEngine, SamplingParams
from xrpo.rollout.planner import generate_rollouts
from xrpo.rollout.prompts import PromptRenderer
from xrpo.rollout.records import PlanConfig, PlanResult
from xrpo.rollout.step import rollout_metrics
from xrpo.rollout.treepo import TreeConfig, generate_tree_rollouts, merge_tree_metrics

__all__ = [
    "SOURCES",
    "Batch",
    "BatchSource",
    "CuresSource",
    "DynamicSampling",
    "EpochSampler",
    "PlannerSource",
    "SourceContext",
    "TreeSource",
    "batch_advantages",
    "build_source",
    "get_source",
    "merge_plans",
    "register_source",
    "source_name",
]


@dataclass
class Batch:
    """One step's rollouts: ``plan.records[i].problem_index`` indexes ``problems``."""

    problems: list[Problem]
    plan: PlanResult


@dataclass
class SourceContext:
    """What every source samples with; the trainer builds it once."""

    problems: list[Problem]
    """The training problems."""
    engine: RolloutEngine
    verifier: Any
    renderer: PromptRenderer
    plan: PlanConfig
    """The planner's config (its ``rollouts_per_step`` is the step's budget)."""
    prompts_per_step: int
    temperature: float
    top_p: float
    max_new_tokens: int
    stop: tuple[str, ...]
    seed: int
    corpus: Any = None
    """The ICL corpus (None without ICL)."""

    def sampling(self, seed: int) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
            stop=self.stop,
            seed=seed,
        )

    def step_sampling(self, step: int, batch: int) -> SamplingParams:
        """Generation batch ``batch`` of step ``step``: its own seed, the same on resume."""
        return self.sampling(self.seed * 1_000_003 + step * 101 + batch)


class BatchSource(Protocol):
    def next_batch(self, step: int) -> Batch: ...

    def warmup(self, log: Callable[[str], None]) -> None:
        """Work before step 1 of a fresh run (not on resume)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def summary(self) -> dict:
        """Entries for summary.json."""


SOURCES: dict[str, Callable[[SourceContext, Any], BatchSource]] = {}
"""name -> factory(ctx, knobs); ``knobs`` holds the method sections of `xrpo.algo.config` (the trainer's
``cfg.method``)."""


def register_source(name: str):
    def deco(factory):
        if name in SOURCES:
            raise ValueError(f"batch source {name!r} is already registered")
        SOURCES[name] = factory
        return factory

    return deco


def get_source(name: str) -> Callable[[SourceContext, Any], BatchSource]:
    try:
        return SOURCES[name]
    except KeyError:
        raise ValueError(f"unknown batch source {name!r}; valid sources: {', '.join(SOURCES)}") from None


def source_name(knobs: Any) -> str:
    """The source a method's knobs ask for: an allocator that selects the step's prompts (CurES) is the source of its
    name, TreePO grows trees, else the planner."""
    if get_allocator(knobs.allocation).selects_prompts:
        return knobs.allocation
    return "tree" if knobs.sampler == "tree" else "planner"


def build_source(ctx: SourceContext, knobs: Any) -> BatchSource:
    """The method's source, wrapped in DAPO's refill with ``knobs.dynamic_sampling``."""
    source = get_source(source_name(knobs))(ctx, knobs)
    if knobs.dynamic_sampling:
        source = DynamicSampling(source, knobs.max_gen_batches, ctx.prompts_per_step, ctx.plan.full_reward)
    return source


def batch_advantages(
    batch: Batch,
    cfg: PlanConfig,
    token_logprobs: Sequence[Sequence[float]],
    sample_logprobs: Sequence[Sequence[float]] | None = None,
) -> tuple[np.ndarray, dict[str, float]]:
    """Algorithm 1 line 14 on ``batch``: (advantages, one per rollout of ``batch.plan``; the adv/* metrics)."""
    adv, metrics = compute_advantages(batch.plan, cfg, token_logprobs=token_logprobs, sample_logprobs=sample_logprobs)
    return adv, {k: v for k, v in metrics.items() if k.startswith("adv/")}


# -- prompts in epoch order -----------------------------------------------------------------------------------------
class EpochSampler:
    """Data order: a fresh permutation per epoch from (seed, epoch); its state is two integers, so resume is exact."""

    def __init__(self, n: int, seed: int, epoch: int = 0, pos: int = 0):
        self.n, self.seed, self.epoch, self.pos = n, seed, epoch, pos

    def _perm(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.n)

    def next(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            perm = self._perm()
            take = min(k - len(out), self.n - self.pos)
            out.extend(int(i) for i in perm[self.pos : self.pos + take])
            self.pos += take
            if self.pos == self.n:
                self.epoch, self.pos = self.epoch + 1, 0
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}


class _EpochSource:
    """A source drawing ``prompts_per_step`` problems per generation batch in epoch order."""

    def __init__(self, ctx: SourceContext):
        self.ctx = ctx
        self.order = EpochSampler(len(ctx.problems), ctx.seed)

    def generate(self, problems: list[Problem], sampling: SamplingParams) -> PlanResult:
        raise NotImplementedError

    def sample(self, step: int, batch: int) -> Batch:
        """Generation batch ``batch`` of step ``step``: the next prompts, their verified rollouts."""
        problems = [self.ctx.problems[i] for i in self.order.next(self.ctx.prompts_per_step)]
        return Batch(problems, self.generate(problems, self.ctx.step_sampling(step, batch)))

    def next_batch(self, step: int) -> Batch:
        return self.sample(step, 0)

    def warmup(self, log: Callable[[str], None]) -> None:
        pass

    def state_dict(self) -> dict:
        return {"sampler": self.order.state()}

    def load_state_dict(self, state: dict) -> None:
        self.order = EpochSampler(len(self.ctx.problems), self.ctx.seed, **state["sampler"])

    def summary(self) -> dict:
        return {}


@register_source("planner")
class PlannerSource(_EpochSource):
    """XRPO's planner (Algorithm 1 lines 1-13) on prompts in epoch order. With an allocator that reads history
    (``uses_history``: knapsack, xrpo-plus) it keeps each training problem's last visit, a `CuresState` with
    keep="last": the successes (reward >= full_reward) and rollouts of the problem's latest step, ICL-seeded rollouts
    left out (they measure the ICL prompt, not the problem), and, for an allocator that reads them
    (`history_window`: Knapsack RL's authors' rule), its latest outcomes across visits; handed to the planner as
    `PromptHistory` and saved in every checkpoint ("history"), so a resumed run plans what the uninterrupted run
    planned. The rule is
    `xrpo.algo.visits`' (`visit_history`) and `xrpo.rollout.cures.observe_visit`, which the verl driver keeps too."""

    def __init__(self, ctx: SourceContext, knobs: Any = None):
        super().__init__(ctx)
        self.history = None
        if get_allocator(ctx.plan.allocation).uses_history:
            self.history = last_visit_state(len(ctx.problems), history_window(ctx.plan))

    def generate(self, problems: list[Problem], sampling: SamplingParams, history=None) -> PlanResult:
        c = self.ctx
        return generate_rollouts(
            problems, c.engine, c.verifier, c.renderer, c.plan, sampling, corpus=c.corpus, history=history
        )

    def sample(self, step: int, batch: int) -> Batch:
        h = self.history
        if h is None:
            return super().sample(step, batch)
        c = self.ctx
        idx = self.order.next(c.prompts_per_step)
        problems = [c.problems[i] for i in idx]
        history, metrics = visit_history(h, idx)
        plan = self.generate(problems, c.step_sampling(step, batch), history)
        plan.metrics.update(metrics)
        cures_lib.observe_visit(h, idx, plan, c.plan.full_reward)
        return Batch(problems, plan)

    def state_dict(self) -> dict:
        out = super().state_dict()
        if self.history is not None:
            out["history"] = self.history.state_dict()
        return out

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.history is not None:
            if "history" not in state:
                raise ValueError(
                    f"the checkpoint has no per-prompt history (state.json: 'history'), which allocation="
                    f"{self.ctx.plan.allocation!r} reads"
                )
            self.history.load_state_dict(state["history"])


@register_source("tree")
class TreeSource(_EpochSource):
    """TreePO's tree sampler on prompts in epoch order; a tree's width is the prompt's even share of the budget."""

    def __init__(self, ctx: SourceContext, knobs: Any):
        super().__init__(ctx)
        self.tree = TreeConfig(rollouts_per_step=ctx.plan.rollouts_per_step, **section_values(knobs, TreePOConfig))

    def generate(self, problems: list[Problem], sampling: SamplingParams) -> PlanResult:
        c = self.ctx
        return generate_tree_rollouts(problems, c.engine, c.verifier, c.renderer, self.tree, sampling)


# -- DAPO's dynamic sampling ----------------------------------------------------------------------------------------
class DynamicSampling:
    """DAPO's refill around an epoch-order source: keep the groups whose rewards differ, draw new prompts until
    ``prompts_per_step`` groups are kept or ``max_gen_batches`` generation batches are spent."""

    def __init__(self, inner: _EpochSource, max_gen_batches: int, prompts_per_step: int, full_reward: float):
        if not isinstance(inner, _EpochSource):
            raise ValueError(
                f"dynamic sampling refills from prompts in epoch order; {type(inner).__name__} chooses its own prompts"
            )
        self.inner, self.max_gen_batches, self.prompts_per_step = inner, max_gen_batches, prompts_per_step
        self.full_reward = full_reward

    def next_batch(self, step: int) -> Batch:
        parts, kept, gen_batches = [], 0, 0
        while refill_more(kept, self.prompts_per_step, gen_batches, self.max_gen_batches):
            b = self.inner.sample(step, gen_batches)
            keep = refill_keep(b.plan.rewards, b.plan.group_ids, kept, self.prompts_per_step)
            parts.append((b.problems, b.plan, keep))
            kept += len(keep)
            gen_batches += 1
        problems, plan = merge_plans(parts, full_reward=self.full_reward)
        plan.metrics["rollout/gen_batches"] = float(gen_batches)
        plan.metrics["rollout/kept_groups"] = float(kept)
        return Batch(problems, plan)

    def warmup(self, log: Callable[[str], None]) -> None:
        self.inner.warmup(log)

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)

    def summary(self) -> dict:
        return self.inner.summary()


def merge_plans(parts: list[tuple[list, PlanResult, np.ndarray]], full_reward: float = 1.0) -> tuple[list, PlanResult]:
    """Concatenate the kept groups of several generation batches (DAPO), renumbering problems and group ids."""
    problems, records, rounds = [], [], []
    metrics: dict[str, float] = {}
    for probs, res, keep in parts:
        remap = {}
        for g in keep:
            remap[int(g)] = len(problems)
            problems.append(probs[int(g)])
        for x in res.records:
            if x.group_id in remap:
                y = copy.copy(x)
                y.problem_index = y.group_id = remap[x.group_id]
                records.append(y)
        rounds.extend(res.rounds)
        for k, v in res.metrics.items():
            if k.startswith("time/"):
                metrics[k] = metrics.get(k, 0.0) + v
    merged = PlanResult(
        records=records,
        rewards=np.array([x.reward for x in records], dtype=np.float64),
        group_ids=np.array([x.group_id for x in records], dtype=np.int64),
        rounds=rounds,
        metrics=metrics,
    )
    # rollout / alloc / icl figures describe the kept groups, not the last generation batch before filtering
    if problems:
        merged.metrics.update(rollout_metrics(merged, len(problems), full_reward=full_reward))
    merged.metrics.update(merge_tree_metrics([res.metrics for _, res, _ in parts]))  # TreePO: every batch's trees
    return problems, merged


# -- CurES ----------------------------------------------------------------------------------------------------------
@register_source("cures")
class CuresSource:
    """CurES: each step's prompts and rollout counts drawn from the posterior (generator seeded by the step, so a
    resumed run draws the same), generated in one batch by the planner (allocation="cures"), then the verified
    rewards added to the posterior. Its state (posterior, warm-up figures) is checkpointed."""

    def __init__(self, ctx: SourceContext, knobs: Any):
        self.ctx = ctx
        k = section_values(knobs, CuresConfig)
        self.warmup_rollouts = k["cures_warmup_rollouts"]
        self.state = CuresState.new(
            len(ctx.problems),
            prior_alpha=k["cures_prior_alpha"],
            prior_beta=k["cures_prior_beta"],
            temp_scale=k["cures_temp_scale"],
            min_count=k["cures_min_count"],
            success_threshold=k["cures_success_threshold"],
        )
        self.warmup_metrics: dict[str, float] = {}
        if ctx.prompts_per_step > len(ctx.problems):
            raise ValueError(
                f"rollout.prompts_per_step={ctx.prompts_per_step}: CurES draws that many distinct "
                f"problems per step, but the training set has {len(ctx.problems)}"
            )

    def warmup(self, log: Callable[[str], None]) -> None:
        """CurES's precompute stage: the posterior starts from rollouts of every problem under the initial model."""
        if self.warmup_rollouts <= 0:
            return
        c = self.ctx
        per_call = max(1, c.plan.rollouts_per_step // self.warmup_rollouts)
        wm = cures_lib.warmup(
            self.state,
            c.problems,
            c.engine,
            c.verifier,
            c.renderer,
            self.warmup_rollouts,
            lambda call: c.sampling(c.seed * 1_000_003 + 999_983 + call),
            per_call,
        )
        self.warmup_metrics = wm
        log(
            f"CurES warm-up: {wm['cures/warmup_rollouts']:.0f} rollouts of {len(c.problems)} problems in "
            f"{wm['cures/warmup_time_s']:.1f}s (mean posterior accuracy {wm['cures/warmup_p_mean']:.3f})"
        )

    def next_batch(self, step: int) -> Batch:
        c = self.ctx
        idx, counts, cm = self.state.select(
            c.prompts_per_step, c.plan.rollouts_per_step, np.random.default_rng([c.seed, step, 31])
        )
        problems = [c.problems[i] for i in idx]
        plan = generate_rollouts(
            problems,
            c.engine,
            c.verifier,
            c.renderer,
            c.plan,
            c.step_sampling(step, 0),
            corpus=c.corpus,
            counts=[int(n) for n in counts],
        )
        plan.metrics.update(cm)
        plan.metrics.update(self.state.observe(idx, plan.rewards, plan.group_ids))
        return Batch(problems, plan)

    def state_dict(self) -> dict:
        out = {"cures": self.state.state_dict()}
        if self.warmup_metrics:
            out["cures_warmup"] = dict(self.warmup_metrics)
        return out

    def load_state_dict(self, state: dict) -> None:
        if "cures" not in state:
            raise ValueError("the checkpoint has no CurES state (state.json: 'cures')")
        self.state.load_state_dict(state["cures"])
        self.warmup_metrics = dict(state.get("cures_warmup", {}))

    def summary(self) -> dict:
        s = self.state
        return {
            "cures": {
                "warmup_rollouts": s.warmup_rollouts,
                "warmup_time_s": self.warmup_metrics.get("cures/warmup_time_s", 0.0),
                "seen_frac": float(np.mean(s.trials > 0)),
                "rollouts_observed": int(s.trials.sum()),
            }
        }
