"""Reading the study's finished run directories (``OUT/<method>/seed<k>/``: summary.json, config.yaml,
metrics.jsonl, rounds.jsonl, study_run.json); the JSONL logs through xrpo's reader (`xrpo.rundir.jsonl`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from xrpo.rundir.jsonl import read_jsonl


class StudyDataError(ValueError):
    """A run directory holds something the report cannot read (the message names the file)."""


def last_per_step(rows: list[dict]) -> list[dict]:
    """One row per step, the last written (a resumed run logs again the steps after its checkpoint), by step."""
    by_step = {}
    for r in rows:
        by_step[int(r["step"])] = r
    return [by_step[s] for s in sorted(by_step)]


@dataclass
class Run:
    method: str
    seed: int
    path: Path
    summary: dict
    config: dict
    metrics: list[dict]
    rounds: list[dict]
    segments: list[dict]
    unreadable_lines: int = 0


def load_run(path: Path) -> Run | None:
    """A finished run (one with a readable summary.json), or None."""
    path = Path(path)
    try:
        summary = json.loads((path / "summary.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    cfg_file = path / "config.yaml"
    if not cfg_file.exists():
        raise StudyDataError(f"{path}: summary.json without config.yaml")
    config = yaml.safe_load(cfg_file.read_text())
    metrics, bad_m = read_jsonl(path / "metrics.jsonl")
    rounds, bad_r = read_jsonl(path / "rounds.jsonl")
    segments = []
    if (path / "study_run.json").exists():
        segments = json.loads((path / "study_run.json").read_text()).get("segments", [])
    for key in ("heldout_after", "heldout_before", "eval_history"):
        if key not in summary:
            raise StudyDataError(f"{path / 'summary.json'}: no {key!r} (expected the trainer's summary)")
    return Run(
        method=config["method"]["name"],
        seed=int(config["seed"]),
        path=path,
        summary=summary,
        config=config,
        metrics=last_per_step(metrics),
        rounds=rounds,
        segments=segments,
        unreadable_lines=bad_m + bad_r,
    )


def load_runs(out: Path, methods: Sequence[str], seeds: Sequence[int]) -> dict[str, list[Run]]:
    """Finished runs of ``OUT/<method>/seed<k>``, by method (in ``methods`` order; missing ones left out)."""
    runs: dict[str, list[Run]] = {}
    for m in methods:
        got = [r for s in seeds if (r := load_run(Path(out) / m / f"seed{s}")) is not None]
        for r in got:
            if r.method != m:
                raise StudyDataError(f"{r.path}: config.yaml says method {r.method!r}, the directory says {m!r}")
        if got:
            runs[m] = got
    return runs
