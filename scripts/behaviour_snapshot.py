"""Record what training produces, to prove a refactor leaves behaviour unchanged.

    python scripts/behaviour_snapshot.py record DIR          # the default job, and a short run of every preset
    python scripts/behaviour_snapshot.py compare DIR_A DIR_B # exit 1, naming each difference, unless identical

Every run has a fixed seed; the records compared are `summary.json`, `metrics.jsonl`, `eval.jsonl` and
`rounds.jsonl`, less what measures time or names a path. Runs are deterministic on one machine with one torch thread
count: record both sides on the same machine and installation.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

RECORDS = ("summary.json", "metrics.jsonl", "eval.jsonl", "rounds.jsonl")
SHORT = ["steps=4", "eval_every=2", "threads=1", "seed=3"]  # each preset: 4 steps, validated at 0, 2 and 4


def runs() -> dict[str, list[str]]:
    from xrpo.algo.presets import list_presets

    out = {"default": []}  # the README's job as users run it
    for name in list_presets():
        out[name] = [f"method.name={name}", *SHORT]
    return out


def untimed(x):
    """`x` without the keys that hold timings or paths (they differ from run to run)."""
    if isinstance(x, dict):
        return {
            k: untimed(v)
            for k, v in x.items()
            if not (
                k.startswith("time/")
                or k.endswith("_time_s")
                or "wall_time" in k
                or k in ("output", "final_checkpoint")
            )
        }
    if isinstance(x, list):
        return [untimed(v) for v in x]
    return x


def load(run_dir: Path, name: str):
    path = run_dir / name
    if not path.exists():
        return None
    if name.endswith(".jsonl"):
        return [untimed(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    return untimed(json.loads(path.read_text()))


def record(root: Path, only: list[str] | None) -> None:
    for name, overrides in runs().items():
        if only and name not in only:
            continue
        out = root / name
        cmd = [sys.executable, "-m", "xrpo.cli", "train", f"output={out}", *overrides]
        print("+", " ".join(cmd[2:]), flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def diff(a, b, where: str, found: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                found.append(f"{where}.{k}: only in {'B' if k not in a else 'A'}")
            else:
                diff(a[k], b[k], f"{where}.{k}", found)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            found.append(f"{where}: {len(a)} vs {len(b)} items")
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{where}[{i}]", found)
    elif a != b and not (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
        found.append(f"{where}: {a!r} vs {b!r}")


def compare(a: Path, b: Path) -> int:
    found: list[str] = []
    names = sorted({p.name for p in a.iterdir() if p.is_dir()} | {p.name for p in b.iterdir() if p.is_dir()})
    for run in names:
        for rec in RECORDS:
            diff(load(a / run, rec), load(b / run, rec), f"{run}/{rec}", found)
    for line in found[:200]:
        print(line)
    print(f"{len(names)} runs, {len(found)} differences")
    return 1 if found else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("dir", type=Path)
    r.add_argument("--only", nargs="*", help="run names (default, or preset names)")
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = p.parse_args()
    if args.cmd == "record":
        record(args.dir, args.only)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    raise SystemExit(main())
