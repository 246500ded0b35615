"""The record types of a step's rollouts, which the planner, the streaming planner, the tree sampler, the batch
sources, the advantages, the corpus update, the trainer and the verl driver all share: `PlanConfig` (what one step
of rollouts looks like), `RolloutRecord` (one rollout) and `PlanResult` (a step's rollouts; its ``rounds`` are
rows of `xrpo.rundir.rounds.round_entry`, written to rounds.jsonl). Types only: this module imports nothing of its
importers."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from xrpo.algo.config import (
    AdvantageConfig,
    AllocationConfig,
    ICLConfig,
    ICLPromptConfig,
    SharpenConfig,
    StreamConfig,
    check_knobs,
)
from xrpo.algo.signal import check_count

__all__ = ["PlanConfig", "PlanResult", "RolloutRecord"]


@dataclass
class PlanConfig(StreamConfig, SharpenConfig, ICLPromptConfig, ICLConfig, AllocationConfig, AdvantageConfig):
    """What one step of rollouts looks like: the knob sections of `xrpo.algo.config` (the trainer's ``method`` and
    ``rollout`` fields of the same names) and the step's budget. ``allocation="cures"``: the caller chooses each
    prompt's count (``counts=``), generated in one batch without planning rounds."""

    rollouts_per_step: int = 128
    """Total rollouts of the step over all prompts, base rollouts included (paper: 128 for 16 prompts)."""

    def __post_init__(self):
        check_knobs(self)
        check_count(self.rollouts_per_step, "config field rollouts_per_step", 1)


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
