"""Algorithm 1 line 15: the step's correct rollouts join the ICL corpus."""

from __future__ import annotations

from collections.abc import Sequence

from xrpo.data import Problem
from xrpo.rollout.records import PlanConfig, PlanResult

__all__ = ["update_corpus"]


def update_corpus(
    result: PlanResult, problems: Sequence[Problem], corpus, cfg: PlanConfig, step: int
) -> dict[str, float]:
    """Algorithm 1 line 15: add the step's correct rollouts to the ICL corpus.

    A correct rollout whose text is empty or blank (a verifier may reward it, e.g. after a run diverged into
    immediate EOS) cannot serve as an ICL example; it is skipped and counted, never an error mid-training.
    Returns ``{"icl/corpus_added": solutions offered to the corpus, "icl/skipped_empty_solutions": skipped}``.
    """
    correct = [x for x in result.records if x.reward >= cfg.full_reward]
    good = [x for x in correct if x.text.strip()]
    out = {"icl/corpus_added": float(len(good)), "icl/skipped_empty_solutions": float(len(correct) - len(good))}
    if corpus is None or not good:
        out["icl/corpus_added"] = 0.0
        return out
    corpus.add_many(
        [problems[x.problem_index].id for x in good],
        [problems[x.problem_index].text for x in good],
        [x.text for x in good],
        [step] * len(good),
    )
    return out
