"""The record types of a step's rollouts, which the planner, the streaming planner, the tree sampler, the batch
sources, the advantages, the corpus update, the trainer and the verl driver all share: `PlanConfig` (what one step
of rollouts looks like), `RolloutRecord` (one rollout), `PlanResult` (a step's rollouts) and `round_entry` (one row
of ``PlanResult.rounds``, written to rounds.jsonl) with `check_round_entry`, its check for the readers of
rounds.jsonl (``xrpo simulate --rounds-file``, ``xrpo report``). Types only: this module imports nothing of its
importers."""

from __future__ import annotations

from collections.abc import Sequence
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
    is_int,
)
from xrpo.algo.signal import check_count

__all__ = ["PlanConfig", "PlanResult", "RolloutRecord", "check_round_entry", "round_entry"]


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


def round_entry(
    rnd: int,
    alloc: Sequence[int],
    problems: Sequence,
    successes: Sequence[int],
    *,
    seeded: Sequence[int] = (),
    truncated: int = 0,
    dropped: int | None = None,
    nonuniform: bool | None = None,
) -> dict:
    """One ``PlanResult.rounds`` row, as the trainer and the verl driver log it (docs/metrics.md, rounds.jsonl):
    round ``rnd`` gave prompt q ``alloc[q]`` rollouts, ``successes[q]`` of them correct; ``seeded`` the prompt
    indices drawn from their ICL prompt, "flips" those of them with a correct rollout. A planning round (``rnd`` >
    0) also has "dropped" and "nonuniform"."""
    seeded = [int(q) for q in seeded]
    out = {
        "round": rnd,
        "alloc": [int(a) for a in alloc],
        "seeded": seeded,
        "flips": sum(1 for q in seeded if successes[q] > 0),
        "truncated": int(truncated),
    }
    if dropped is not None:
        out["dropped"] = int(dropped)
    if nonuniform is not None:
        out["nonuniform"] = bool(nonuniform)
    out["problems"] = list(problems)
    out["successes"] = [int(s) for s in successes]
    return out


def check_round_entry(row: object, where: str, require: Sequence[str] = ()) -> dict:
    """A rounds.jsonl row read back: a JSON object holding the fields of ``require``, and each field it has of the
    type `round_entry` (and the logger's "step") writes: integer "step" and "round"; "alloc" rollout counts >= 0, one
    per prompt, with "problems" (ids: strings, integers from older runs) and "successes" (correct rollouts, 0 to
    the prompt's count) of its length; "seeded" indices of its prompts. Returns the row; ValueError naming ``where``
    and the field otherwise."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    need = list(require) + (["alloc"] if {"problems", "successes", "seeded"} & row.keys() else [])
    missing = [k for k in dict.fromkeys(need) if k not in row]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")
    for key in ("step", "round"):
        if key in row and not is_int(row[key]):
            raise ValueError(f"{where}: field '{key}' must be an integer, got {row[key]!r}")
    if "alloc" not in row:
        return row
    alloc = row["alloc"]
    lists = {k: row[k] for k in ("alloc", "problems", "successes") if k in row}
    if not all(isinstance(v, list) for v in lists.values()) or len({len(v) for v in lists.values()}) > 1:
        got = ", ".join(f"{k} {len(v) if isinstance(v, list) else repr(v)}" for k, v in lists.items())
        raise ValueError(
            f"{where}: {' / '.join(map(repr, lists))} must be lists of one length (one entry per prompt); got {got}"
        )
    successes = row.get("successes")
    for j, a in enumerate(alloc):
        s = None if successes is None else successes[j]
        if not (is_int(a) and a >= 0 and (s is None or (is_int(s) and 0 <= s <= a))):
            counts, rule = (
                (f"alloc={a!r}", "an integer >= 0")
                if s is None
                else (f"successes={s!r} of alloc={a!r}", "integers with 0 <= successes <= alloc")
            )
            raise ValueError(f"{where}: prompt {j} has {counts}; expected {rule}")
    for j, pid in enumerate(row.get("problems", ())):
        if not (isinstance(pid, str) or is_int(pid)):
            raise ValueError(f"{where}: 'problems'[{j}] must be a problem id (a string), got {pid!r}")
    seeded = row.get("seeded")
    if seeded is not None and not (isinstance(seeded, list) and all(is_int(j) and 0 <= j < len(alloc) for j in seeded)):
        raise ValueError(f"{where}: 'seeded' must be a list of prompt indices in [0, {len(alloc)}), got {seeded!r}")
    return row
