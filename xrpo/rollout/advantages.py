"""Algorithm 1 line 14 on a step's rollouts: GRPO advantages by group id (or TreePO's tree advantage), then XRPO's
novelty sharpening, Eq. (6). Turns the rollout records of a plan into the arrays `xrpo.algo` computes on."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xrpo.algo.advantages import get_advantage, length_normalized_loglik, sharpen_advantages
from xrpo.algo.tree import TreeStructure
from xrpo.rollout.records import PlanConfig, PlanResult, RolloutRecord

__all__ = ["compute_advantages", "sequence_scores", "tree_ancestor_ids"]


def sequence_scores(records: Sequence[RolloutRecord], token_logprobs: Sequence[Sequence[float]] | None = None):
    """s(y) of Eq. (4) for every rollout: from ``token_logprobs`` when given (e.g. the trainer's log-probs recomputed
    under the training prompt), else from the engine's sampling log-probs."""
    lps = [x.logprobs for x in records] if token_logprobs is None else token_logprobs
    if len(lps) != len(records):
        raise ValueError(f"token_logprobs has {len(lps)} rows for {len(records)} rollouts")
    T = max((len(v) for v in lps), default=0)
    lp = np.zeros((len(lps), max(T, 1)), dtype=np.float64)
    mask = np.zeros_like(lp)
    for i, v in enumerate(lps):
        if len(v) == 0:
            raise ValueError(f"rollout {i} has an empty completion; s(y) is undefined")
        lp[i, : len(v)] = np.asarray(v, dtype=np.float64)
        mask[i, : len(v)] = 1.0
    return length_normalized_loglik(lp, mask)


def tree_ancestor_ids(records: Sequence[RolloutRecord]) -> np.ndarray:
    """Each rollout's ancestors as batch-unique node ids, root first, -1 padded: the (N, D) input of
    `xrpo.algo.tree.tree_advantages`. The root is the rollout's group; `tree_path` adds the nodes above its own."""
    ids: dict[tuple, int] = {}
    rows = []
    for x in records:
        keys = [(x.group_id, 0)] + [(x.group_id, n) for n in x.tree_path[:-1]]
        rows.append([ids.setdefault(k, len(ids)) for k in keys])
    out = np.full((len(rows), max((len(r) for r in rows), default=1)), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def compute_advantages(
    result: PlanResult,
    cfg: PlanConfig,
    token_logprobs: Sequence[Sequence[float]] | None = None,
    sample_logprobs: Sequence[Sequence[float]] | None = None,
) -> tuple[np.ndarray, dict[str, float]]:
    """Algorithm 1 line 14: GRPO advantages by group id, then (if ``cfg.sharpen``) novelty sharpening, Eq. (6).
    With ``cfg.tree_advantage``: TreePO's tree advantage (+ its batch-wide normalisation when adv_scale="std").
    Returns (advantages (N,) float64, one per record of ``result``; the adv/* metrics); ``result`` is not changed.

    s(y) of Eq. (4) comes from ``token_logprobs`` (the log-probs under each rollout's training prompt; default: the
    engine's). With ``cfg.icl_novelty == "sample"`` an ICL-seeded rollout trained under another prompt is scored with
    ``sample_logprobs`` instead (the log-probs under the prompt it was sampled from; default: the engine's), with
    ``"exclude"`` it is left out of sharpening."""
    tree = None
    if cfg.tree_advantage:
        tree = TreeStructure(
            tree_ancestor_ids(result.records), np.array([len(x.completion_ids) for x in result.records])
        )
    kind = get_advantage("tree" if cfg.tree_advantage else "group")
    adv, metrics = kind(result.rewards, result.group_ids, scale=cfg.adv_scale, tree=tree)
    if cfg.sharpen:
        recs = result.records
        # ICL-seeded rollouts whose training prompt is not the prompt they were sampled from
        moved = np.array([x.seeded and x.train_prompt_ids != x.gen_prompt_ids for x in recs], dtype=bool)
        lps = list(token_logprobs) if token_logprobs is not None else [x.logprobs for x in recs]
        if cfg.icl_novelty == "sample" and moved.any():
            if sample_logprobs is not None and len(sample_logprobs) != len(recs):
                raise ValueError(f"sample_logprobs has {len(sample_logprobs)} rows for {len(recs)} rollouts")
            for i in np.flatnonzero(moved):
                lps[i] = sample_logprobs[i] if sample_logprobs is not None else recs[i].logprobs
        scores = sequence_scores(recs, lps)
        keep = ~moved if cfg.icl_novelty == "exclude" else np.ones(len(recs), dtype=bool)
        sharp, m = sharpen_advantages(
            adv[keep],
            result.rewards[keep],
            scores[keep],
            result.group_ids[keep],
            lam_nov=cfg.lam_nov,
            kappa_clip=cfg.kappa_clip,
            full_reward=cfg.full_reward,
        )
        before = adv
        adv = np.array(adv, dtype=np.float64)
        adv[keep] = sharp
        seeded = np.array([x.seeded for x in recs], dtype=bool)
        metrics.update(m)
        # how ICL-seeded rollouts fare in sharpening (docs/methods.md, "Sharpening and ICL-seeded rollouts")
        metrics["adv/sharpen_eligible_seeded"] = float(np.sum(seeded & (result.rewards >= cfg.full_reward)))
        metrics["adv/sharpened_seeded_count"] = float(np.sum(seeded & (adv > before)))
    return np.asarray(adv, dtype=np.float64), metrics
