"""Success rates: the mixture language of ``--dist`` (:func:`parse_mixture`) and the rates measured in a training
run's rounds.jsonl (:func:`read_rounds_counts`: the trainer's and the verl driver's rows,
`xrpo.rundir.rounds.round_entry`)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from xrpo.algo.stats import mean_ci
from xrpo.rundir.jsonl import read_lines
from xrpo.rundir.rounds import check_round_entry

__all__ = ["parse_mixture", "parse_steps", "read_rounds_counts", "read_rounds_rates"]


_NUM = r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?"
_COMPONENT = re.compile(rf"^(?:({_NUM})\s*\*\s*)?(?:beta\(\s*({_NUM})\s*,\s*({_NUM})\s*\)|({_NUM}))$")


def parse_mixture(spec: str) -> tuple[list[float], list]:
    """Parse 'W*beta(a,b) + W*x + ...' into (weights, components) for ``xrpo.sim.model.sample_mixture``.

    Raises ValueError naming the option (dist) and the offending component.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"dist must be a mixture such as '0.3*0 + 0.7*beta(1,3)', got {spec!r}")
    parts = [s.strip() for s in spec.split("+")]
    weights, comps = [], []
    for i, part in enumerate(parts):
        m = _COMPONENT.match(part.replace(" ", ""))
        if not m:
            raise ValueError(f"dist: component {i + 1} {part!r} is not 'W*beta(a,b)' or 'W*x' (x a rate in [0, 1])")
        w, a, b, x = m.groups()
        if w is None and len(parts) > 1:
            raise ValueError(
                f"dist: component {i + 1} {part!r} needs a weight 'W*' (the mixture has {len(parts)} components)"
            )
        weights.append(1.0 if w is None else float(w))
        if x is not None:
            if not 0.0 <= float(x) <= 1.0:
                raise ValueError(f"dist: component {i + 1} {part!r}: a fixed success rate must lie in [0, 1]")
            comps.append(float(x))
        else:
            if float(a) <= 0 or float(b) <= 0:
                raise ValueError(f"dist: component {i + 1} {part!r}: Beta parameters must be > 0")
            comps.append((float(a), float(b)))
    if abs(sum(weights) - 1.0) > 1e-9:
        raise ValueError(f"dist: weights must sum to 1, got {' + '.join(f'{w:g}' for w in weights)} = {sum(weights):g}")
    return weights, comps


def parse_steps(spec: str | None) -> tuple[int | None, int | None]:
    if spec is None:
        return None, None
    m = re.fullmatch(r"\s*(\d*)\s*:\s*(\d*)\s*", str(spec))
    if not m:
        raise ValueError(f"rounds_steps must be 'A:B' (inclusive step numbers, either may be empty), got {spec!r}")
    lo, hi = (int(g) if g else None for g in m.groups())
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"rounds_steps: first step {lo} is after last step {hi}")
    return lo, hi


def read_rounds_rates(path, steps: str | None = None) -> tuple[np.ndarray, dict]:
    """Each problem's measured success rate k / n (see :func:`read_rounds_counts`), ordered by problem id."""
    wins, trials, info = read_rounds_counts(path, steps)
    return wins / trials, info


def read_rounds_counts(path, steps: str | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """Each problem's success rate measured in a training run: its correct rollouts over its rollouts, pooled over
    every round (and generation batch) of the selected steps of rounds.jsonl. Rollouts a round drew from a prompt's
    ICL prompt (its index in ``seeded``) are left out: they measure the ICL prompt, not the plain one.

    A step logged twice (a resumed run redoing it) counts once, its last block of rows; a partial line left by a
    killed run is skipped (counted in "unreadable_lines"). Rows need ``step``, ``alloc``,
    ``problems`` and ``successes``; runs written before xrpo recorded the last two hold only counts, seeded prompts
    and flips, from which no per-prompt rate can be recovered: they are refused with that reason.

    Returns:
        (successes (K,), rollouts (K,)) as float64, one entry per problem with at least one rollout, ordered by
        problem id; info dict with "problems", "rollouts", "steps", "rollouts_per_problem_median",
        "unreadable_lines", "seeded_rollouts_excluded", and "measured_per_step": the run's own informative rollouts,
        non-zero-variance groups and rollouts per step (mean, ci), over every group of each step.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "rounds.jsonl"
    if not p.is_file():
        raise FileNotFoundError(f"rounds_file: {p} does not exist (give a run directory or its rounds.jsonl)")
    lo, hi = parse_steps(steps)
    blocks: list[tuple[int, list[dict]]] = []
    # a killed run's partial last line, or the row a resumed run glued to it, is counted in "unreadable_lines"
    lines, skipped = read_lines(p, strict=True)
    for lineno, _, row in lines:
        if isinstance(row, dict) and not {"successes", "problems"} <= row.keys():
            missing = [k for k in ("problems", "successes") if k not in row]
            raise ValueError(
                f"{p} line {lineno} has no {' / '.join(repr(k) for k in missing)} field: this rounds.jsonl "
                "records only each round's counts, seeded prompts and flips (a run written before xrpo "
                "logged per-prompt successes), so per-prompt success rates cannot be recovered from it. "
                "Re-run the training with this version, or give the rates as dist."
            )
        check_round_entry(row, f"{p} line {lineno}", require=("step", "alloc", "problems", "successes"))
        step = row["step"]
        # a new block: another step, or the same step started again (a resumed run redoing it: resume is exact, so
        # it repeats the step's first row; a planned round 0 after a round > 0 also marks a restart)
        if (
            blocks
            and blocks[-1][0] == step
            and row != blocks[-1][1][0]
            and not (row.get("round", 0) == 0 and blocks[-1][1][-1].get("round", 0) > 0)
        ):
            blocks[-1][1].append(row)
        else:
            blocks.append((step, [row]))
    last = {step: rows for step, rows in blocks}  # a redone step: its last block wins
    trials: dict[str, int] = {}
    wins: dict[str, int] = {}
    used = excluded = 0
    per_step: dict[str, list[float]] = {"informative_rollouts": [], "informative_groups": [], "rollouts": []}
    for step, rows in last.items():
        if (lo is not None and step < lo) or (hi is not None and step > hi):
            continue
        used += 1
        group_n: dict[str, int] = {}
        group_k: dict[str, int] = {}
        for row in rows:
            seeded = set(row.get("seeded") or [])
            for j, (pid, a, s) in enumerate(zip(row["problems"], row["alloc"], row["successes"])):
                group_n[str(pid)] = group_n.get(str(pid), 0) + a
                group_k[str(pid)] = group_k.get(str(pid), 0) + s
                if j in seeded:  # drawn from an ICL prompt: a rate of the ICL prompt, not of the plain one
                    excluded += a
                    continue
                trials[str(pid)] = trials.get(str(pid), 0) + a
                wins[str(pid)] = wins.get(str(pid), 0) + s
        # what the run's steps bought, to set against the simulator's prediction: every group of the step (all its
        # rollouts, ICL-seeded ones included; DAPO: every generation batch)
        mixed = [g for g, n_g in group_n.items() if 0 < group_k[g] < n_g]
        per_step["informative_rollouts"].append(float(sum(group_n[g] for g in mixed)))
        per_step["informative_groups"].append(float(len(mixed)))
        per_step["rollouts"].append(float(sum(group_n.values())))
    ids = sorted(k for k, n in trials.items() if n > 0)
    if not ids:
        raise ValueError(
            f"{p}: no rollouts in steps {steps or 'all'} (the file has steps "
            f"{min(last) if last else '-'}..{max(last) if last else '-'})"
        )
    n = np.array([trials[k] for k in ids], dtype=np.float64)
    w = np.array([wins[k] for k in ids], dtype=np.float64)
    info = {
        "file": str(p),
        "steps": used,
        "problems": len(ids),
        "rollouts": int(n.sum()),
        "rollouts_per_problem_median": float(np.median(n)),
        "unreadable_lines": skipped,
        "seeded_rollouts_excluded": excluded,
        "measured_per_step": {k: dict(zip(("mean", "ci"), mean_ci(v))) for k, v in per_step.items()},
    }
    return w, n, info
