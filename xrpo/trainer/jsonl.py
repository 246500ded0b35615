"""Reading a run's JSONL records (metrics.jsonl, rounds.jsonl, ...) after the fact, as a report or a study does:
every readable row, and a count of the lines that were not."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["read_jsonl"]


def read_jsonl(path: Path) -> tuple[list[dict], int]:
    """Rows of a JSONL log and the number of lines that could not be read (``([], 0)`` for a missing file).

    A process killed mid-write leaves a partial last line, and a resumed run appends after it, so the next row is
    glued to the fragment: every row the trainer writes starts with '{"step"', so the last such start is tried too."""
    rows, bad = [], 0
    path = Path(path)
    if not path.exists():
        return rows, bad
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
            continue
        except json.JSONDecodeError:
            pass
        bad += 1
        cut = line.rfind('{"step"')
        if cut > 0:
            try:
                rows.append(json.loads(line[cut:]))
            except json.JSONDecodeError:
                pass
    return rows, bad
