"""Test-time ICL (off by default; the paper's appendix ablation "ICL@test"): with --icl-corpus every prompt is the ICL
prompt built from the --icl-k most similar solved problems of that corpus (a JSONL of problem_id / problem /
solution, or a corpus directory a training run saved), retrieved by the same embedder as in training. Retrieval never
returns a corpus problem with the query's id or text."""

from __future__ import annotations

from pathlib import Path

from xrpo.data import Problem

__all__ = ["icl_prompts", "load_corpus"]


def load_corpus(path: str | Path, embedder: str):
    """The `ICLCorpus` at ``path``: a saved corpus directory, or a JSONL of solved problems."""
    from xrpo.icl import ICLCorpus, get_embedder

    emb = get_embedder(embedder)
    src = Path(path)
    return ICLCorpus.load(src, emb) if src.is_dir() else ICLCorpus.from_jsonl(src, emb)


def icl_prompts(problems: list[Problem], renderer, corpus, k: int) -> tuple[list[str], dict[str, dict]]:
    """Test-time ICL prompts, and per problem id the corpus problems it was shown (recorded for leakage audits)."""
    examples = corpus.retrieve_many([p.id for p in problems], [p.text for p in problems], k=k)
    prompts, extra = [], {}
    for p, ex in zip(problems, examples):
        icl = renderer.render_icl(p, ex)
        prompts.append(icl.text)
        extra[p.id] = {"icl_examples": [e.problem_id for e in ex[: icl.num_examples]]}
    return prompts, extra
