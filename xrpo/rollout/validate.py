"""Sampled validation of a policy on held-out problems: pass@k, cons@n, response length, truncation.

Used by the trainer's periodic validation and by `xrpo eval`. Prompts are the plain ones (no ICL) unless the caller
passes its own (`xrpo eval --icl-corpus`, the paper's test-time ICL ablation); the paper's evaluation uses plain
prompts ("during evaluation we do not use the ICL corpus at all").

One record per problem (what `xrpo eval` appends to its per-problem files and resumes from):
    id          the problem's id
    reference   the reference answer graded against
    n, c        samples drawn, samples with score >= 1 (correct)
    answers     the verifier's parsed answer per sample (None: no answer found); cons@n votes on these
    correct     per sample, score >= 1
    scores      per sample, the verifier's score
    reasons     per sample, the verifier's reason for a score below 1 (`VerifyResult.reason`: the math verifier's
                "no_answer", "mismatch", "timeout", ..., the code verifier's "no_code", "wrong_answer", ...; None
                for a correct sample), so that a low score can be traced to its cause
    lengths     per sample, completion tokens (EOS included)
    truncated   samples that hit max_new_tokens
    completions per sample, the text (only with keep_text=True)
    skipped     only in records of problems that could not be sampled (`unscored_record`): why. They hold n
                samples, none correct, no answer, reason "not_sampled", and no lengths (response length figures
                leave them out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from xrpo.algo.passk import majority_vote, mean_pass_at_k
from xrpo.data import Problem
from xrpo.rollout.engine import SamplingParams


def chunk_seed(seed: int | None, chunk: int) -> int | None:
    """The sampling seed of chunk ``chunk``: a well-spread 31-bit function of (seed, chunk); None stays None."""
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, chunk]).generate_state(1)[0] >> 1)


def unscored_record(problem: Problem, n: int, reason: str) -> dict:
    """The record of a problem that was not sampled (e.g. its prompt does not fit the model's context): n samples,
    all wrong and unanswered, so that it counts in pass@k and cons@n as unsolved rather than vanishing from the
    denominator."""
    return {
        "id": problem.id,
        "reference": problem.answer,
        "n": n,
        "c": 0,
        "answers": [None] * n,
        "correct": [False] * n,
        "scores": [0.0] * n,
        "reasons": ["not_sampled"] * n,
        "lengths": [],
        "truncated": 0,
        "skipped": reason,
    }


def score_records(
    records: Sequence[Mapping],
    n: int,
    ks: Sequence[int] = (1,),
    prefix: str = "eval/",
) -> dict[str, float]:
    """pass@k (unbiased, per problem, averaged), cons@n, mean response length, truncation and no-answer rates of
    per-problem records (see the module docstring). ``n`` names the cons@n key; every record may hold its own count.
    """
    if not records:
        raise ValueError("score_records: no problems to score")
    ns = [int(d["n"]) for d in records]
    cs = [int(d["c"]) for d in records]
    m = {f"{prefix}pass@{k}": float(mean_pass_at_k(ns, cs, k)) for k in ks}
    m[f"{prefix}cons@{n}"] = float(np.mean([majority_vote(d["answers"], d["correct"]) for d in records]))
    lengths = [x for d in records for x in d["lengths"]]
    m[f"{prefix}response_length_mean"] = float(np.mean(lengths)) if lengths else 0.0
    drawn = max(sum(d["n"] for d in records if "skipped" not in d), 1)
    m[f"{prefix}truncation_rate"] = float(sum(d["truncated"] for d in records) / drawn)
    m[f"{prefix}no_answer_rate"] = float(sum(a is None for d in records for a in d["answers"]) / max(sum(ns), 1))
    skipped = sum("skipped" in d for d in records)
    if skipped:
        m[f"{prefix}unsampled_problems"] = float(skipped)
    return m


def sample_and_score(
    problems: Sequence[Problem],
    engine,
    verifier,
    renderer,
    *,
    n: int,
    sampling: SamplingParams,
    ks: Sequence[int] = (1,),
    prefix: str = "eval/",
    prompts: Sequence[str] | None = None,
    chunk_size: int | None = None,
    done: Mapping[int, Mapping] | None = None,
    on_chunk: Callable[[list[dict]], None] | None = None,
    keep_text: bool = False,
) -> tuple[dict[str, float], list[dict]]:
    """Draw ``n`` samples per problem, verify them, and aggregate (`score_records`).

    Args:
        problems: the problems.
        engine / verifier / renderer: a `RolloutEngine`, a `Verifier`, a `PromptRenderer`.
        n: samples per problem. sampling: how to sample. ks: the k of pass@k (each in [1, n]).
        prefix: metric name prefix.
        prompts: the rendered prompt of each problem (e.g. test-time ICL prompts); default ``renderer.render(p)``.
        chunk_size: problems per engine call. None: all in one call seeded with ``sampling.seed`` (the trainer's
            validation). Otherwise chunk ``c`` (problems ``c * chunk_size`` onwards) samples with
            ``chunk_seed(sampling.seed, c)``, so a problem's samples depend on its chunk only, not on which other
            chunks run in this call: a resumed evaluation samples the remaining chunks exactly as one run would.
        done: records of problems already scored, by index into ``problems`` (a resumed run); they are not sampled
            again but count in the metrics.
        on_chunk: called with the new records of each chunk as soon as they are verified (per-problem appends).
        keep_text: also keep each sample's text in its record (``completions``).

    Returns:
        (metrics, records): the metrics over all problems and one record per problem, in order.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ValueError(f"every k must be in [1, n={n}], got {bad}")
    if prompts is not None and len(prompts) != len(problems):
        raise ValueError(f"prompts: expected one per problem ({len(problems)}), got {len(prompts)}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size}")
    done = dict(done or {})
    for i, d in done.items():
        if not 0 <= i < len(problems) or d.get("id") != problems[i].id:
            raise ValueError(f"done[{i}]: its record (id {d.get('id')!r}) does not match problem {i}")
    records: list[dict | None] = [dict(done[i]) if i in done else None for i in range(len(problems))]
    size = chunk_size or max(len(problems), 1)
    for c, start in enumerate(range(0, len(problems), size)):
        todo = [i for i in range(start, min(start + size, len(problems))) if records[i] is None]
        if not todo:
            continue
        params = sampling if chunk_size is None else dataclasses.replace(sampling, seed=chunk_seed(sampling.seed, c))
        texts = [prompts[i] if prompts is not None else renderer.render(problems[i]) for i in todo]
        outs = engine.generate(texts, [n] * len(todo), params)
        flat = [(i, r) for i, rs in zip(todo, outs) for r in rs]
        results = verifier.verify_batch([r.text for _, r in flat], [problems[i].answer for i, _ in flat])
        new = {
            i: {
                "id": problems[i].id,
                "reference": problems[i].answer,
                "n": 0,
                "c": 0,
                "answers": [],
                "correct": [],
                "scores": [],
                "reasons": [],
                "lengths": [],
                "truncated": 0,
            }
            for i in todo
        }
        for (i, r), res in zip(flat, results):
            d = new[i]
            ok = res.score >= 1.0
            d["n"] += 1
            d["c"] += int(ok)
            d["answers"].append(res.answer)
            d["correct"].append(ok)
            d["scores"].append(float(res.score))
            d["reasons"].append(res.reason)
            d["lengths"].append(len(r.completion_ids))
            d["truncated"] += int(r.finish_reason == "length")
            if keep_text:
                d.setdefault("completions", []).append(r.text)
        for i in todo:
            records[i] = new[i]
        if on_chunk is not None:
            on_chunk([new[i] for i in todo])
    out = [d for d in records if d is not None]
    return score_records(out, n, ks, prefix), out
