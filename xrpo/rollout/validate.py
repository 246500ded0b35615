"""Sampled validation of a policy on held-out problems: pass@k, cons@n, response length, truncation.

Used by the trainer's periodic validation and by `xrpo eval`. Prompts are the plain ones (no ICL), as in the paper's
evaluation ("during evaluation we do not use the ICL corpus at all").
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from xrpo.data import Problem
from xrpo.eval.metrics import majority_vote, mean_pass_at_k
from xrpo.rollout.engine import SamplingParams


def sample_and_score(
    problems: Sequence[Problem], engine, verifier, renderer, *, n: int, sampling: SamplingParams,
    ks: Sequence[int] = (1,), prefix: str = "eval/",
) -> tuple[dict[str, float], list[dict]]:
    """Draw ``n`` samples per problem, verify them, and aggregate.

    Returns (metrics, per_problem) where per_problem holds ``{id, n, c, answers, lengths, truncated}``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ValueError(f"every k must be in [1, n={n}], got {bad}")
    outs = engine.generate([renderer.render(p) for p in problems], [n] * len(problems), sampling)
    flat = [(i, r) for i, rs in enumerate(outs) for r in rs]
    results = verifier.verify_batch([r.text for _, r in flat], [problems[i].answer for i, _ in flat])
    per = [{"id": p.id, "n": 0, "c": 0, "answers": [], "correct": [], "lengths": [], "truncated": 0}
           for p in problems]
    for (i, r), res in zip(flat, results):
        d = per[i]
        ok = res.score >= 1.0
        d["n"] += 1
        d["c"] += int(ok)
        d["answers"].append(res.answer)
        d["correct"].append(ok)
        d["lengths"].append(len(r.completion_ids))
        d["truncated"] += int(r.finish_reason == "length")
    ns = [d["n"] for d in per]
    cs = [d["c"] for d in per]
    m = {f"{prefix}pass@{k}": float(mean_pass_at_k(ns, cs, k)) for k in ks}
    m[f"{prefix}cons@{n}"] = float(np.mean([majority_vote(d["answers"], d["correct"]) for d in per]))
    lengths = [x for d in per for x in d["lengths"]]
    m[f"{prefix}response_length_mean"] = float(np.mean(lengths)) if lengths else 0.0
    m[f"{prefix}truncation_rate"] = float(sum(d["truncated"] for d in per) / max(sum(ns), 1))
    return m, per
