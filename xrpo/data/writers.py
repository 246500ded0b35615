"""Save `Problem`s as JSONL or as verl's RL parquet layout, files that `xrpo.data.loaders.load_problems` reads back
to equal problems (docs/data.md)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from xrpo.data.problem import Problem

__all__ = ["save_problems_jsonl", "save_problems_verl_parquet"]


def _check_problems(problems: Iterable[Problem], fn: str) -> list[Problem]:
    problems = list(problems)
    if not problems:
        raise ValueError(f"{fn}: no problems to save")
    seen: set[str] = set()
    for i, p in enumerate(problems):
        if not isinstance(p, Problem):
            raise ValueError(f"{fn}: problems[{i}] is a {type(p).__name__}, expected a Problem")
        if p.id in seen:
            raise ValueError(f"{fn}: duplicate id {p.id!r} at problems[{i}]")
        seen.add(p.id)
    return problems


def _metadata_json(p: Problem, fn: str) -> str:
    try:
        return json.dumps(p.metadata, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{fn}: metadata of problem {p.id!r} is not JSON-serialisable ({e})") from None


def save_problems_jsonl(problems: Iterable[Problem], path: str | os.PathLike) -> Path:
    """Write one JSON object per problem: ``{"id", "prompt", "answer", "data_source", "metadata"}``.

    `load_problems` reads the file back to equal problems (metadata through JSON: tuples come back as lists).
    Creates the parent directory; returns the path.
    """
    problems = _check_problems(problems, "save_problems_jsonl")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for p in problems:
        _metadata_json(p, "save_problems_jsonl")
        record = {
            "id": p.id,
            "prompt": p.prompt,
            "answer": p.answer,
            "data_source": p.data_source,
            "metadata": p.metadata,
        }
        lines.append(json.dumps(record, ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def save_problems_verl_parquet(problems: Iterable[Problem], path: str | os.PathLike) -> Path:
    """Write verl's RL parquet layout, one row per problem:

        data_source   the problem's data_source (verl picks the reward function with it)
        prompt        chat messages; a text prompt becomes ``[{"role": "user", "content": text}]``
        reward_model  ``{"style": "rule", "ground_truth": answer}``
        extra_info    ``{"index": id, "metadata": <metadata as a JSON string>}``

    The metadata is a JSON string because parquet needs one struct type for a column and metadata differs between
    problems. `load_problems` reads the file back to equal problems, except that a text prompt comes back as the
    one-message chat above (``Problem.text`` is unchanged) and message keys other than role and content are
    dropped. Creates the parent directory; returns the path.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    problems = _check_problems(problems, "save_problems_verl_parquet")
    rows = []
    for p in problems:
        messages = p.prompt if isinstance(p.prompt, list) else [{"role": "user", "content": p.prompt}]
        rows.append(
            {
                "data_source": p.data_source,
                # only role/content: one struct type for the column, and all verl reads
                "prompt": [{"role": m["role"], "content": m["content"]} for m in messages],
                "reward_model": {"style": "rule", "ground_truth": p.answer},
                "extra_info": {"index": p.id, "metadata": _metadata_json(p, "save_problems_verl_parquet")},
            }
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
