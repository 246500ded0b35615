"""The one reader of a run's JSONL records (metrics.jsonl, rounds.jsonl, eval.jsonl, ...): the trainer's resume
(`xrpo.trainer.records`), `xrpo report`, `xrpo simulate --rounds-file` and the study all read through it.

A process killed mid-write leaves a partial last line, and a run that goes on appends its next row right after it, so
that row is glued to the fragment: every row the trainer writes starts with '{"step"', so the last such start of an
unreadable line is tried too (``glued``). ``strict`` callers refuse any other unreadable line, naming the file and the
line; the others count it and go on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["Line", "read_jsonl", "read_lines"]


class Line(NamedTuple):
    """One non-blank line of a JSONL file."""

    number: int
    """1-based line number in the file."""
    text: str
    """The row's text: the whole line, or for a row recovered after a glued fragment, from its '{"step"' on."""
    row: Any | None
    """The decoded value; None for an unreadable line (only with ``keep_unreadable``)."""


def read_lines(
    path: Path, *, strict: bool = False, glued: bool = True, keep_unreadable: bool = False, why: str = ""
) -> tuple[list[Line], int]:
    """The lines of a JSONL file and the number that could not be read as they stand (``([], 0)`` for a missing
    file; blank lines are skipped and not counted).

    strict: an unreadable line other than the file's last non-blank one raises ValueError ``"<path> line <n>: not
        valid JSON (<why json failed>)<why>"``; the last one (cut short by a kill) is counted. Not strict: every
        unreadable line is counted and skipped.
    glued: recover the row glued to an unreadable line's fragment (counted as unreadable too); False for a caller
        that rewrites lines byte for byte.
    keep_unreadable: return an unreadable line too, as ``Line(n, text, None)``.
    """
    path = Path(path)
    if not path.exists():
        return [], 0
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:  # whole-file decoding: e.start is the offset of the first bad byte
        raw = path.read_bytes()
        number = raw.count(b"\n", 0, e.start) + 1
        raise ValueError(
            f"{path} line {number}: not valid UTF-8 (byte 0x{raw[e.start]:02x}); expected UTF-8 JSON lines{why}"
        ) from None
    # the line a kill can have cut short: the last one with text (blank lines may follow it)
    last = max((i for i, line in enumerate(lines, 1) if line.strip()), default=0)
    out: list[Line] = []
    bad = 0
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(Line(i, line, json.loads(line)))
            continue
        except ValueError as e:  # JSONDecodeError, or an integer beyond Python's digit limit for int()
            error = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
        bad += 1
        cut = line.rfind('{"step"') if glued else -1
        if cut > 0:
            try:
                out.append(Line(i, line[cut:], json.loads(line[cut:])))
                continue
            except ValueError:
                pass
        if strict and i != last:
            raise ValueError(f"{path} line {i}: not valid JSON ({error}){why}")
        if keep_unreadable:
            out.append(Line(i, line, None))
    return out, bad


def read_jsonl(path: Path, *, strict: bool = False, glued: bool = True) -> tuple[list[dict], int]:
    """Rows of a JSONL log and the number of lines that could not be read (`read_lines`' rules)."""
    lines, bad = read_lines(path, strict=strict, glued=glued)
    return [ln.row for ln in lines], bad
