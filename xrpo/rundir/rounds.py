"""The rounds.jsonl row: `round_entry` is its one writer (the trainer's planner and the verl driver log a step's
rounds with it; ``PlanResult.rounds`` holds these rows) and `check_round_entry` its check for the readers of
rounds.jsonl (``xrpo simulate --rounds-file``, ``xrpo report``, the study)."""

from __future__ import annotations

from collections.abc import Sequence

from xrpo.algo.config import is_int

__all__ = ["check_round_entry", "round_entry"]


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
