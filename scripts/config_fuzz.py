"""Config fuzz: every field of `xrpo train`'s config at edge values; a value the config accepts must train.

    python scripts/config_fuzz.py [PREFIX ...]     # e.g. optim. method.clip  (default: every field)

For each int / float / bool / optional field (0, 1, 2, 3, 7, 100000, -1; 0, 1e-9, 0.5, 1, 2, 1e6, -0.5, inf, nan;
the other boolean; null) it builds the config over a small base (2 steps of 4 prompts x 32 rollouts, no periodic
validation, checkpoints or logs) and, when the config accepts it, trains in this process. One line per case:

    REFUSED       the config refused it (the message must name the field)
    ACCEPT-OK     accepted, and the 2 steps ran
    ACCEPT-CRASH  accepted, then failed inside the run: a check the config is missing (or a value too large to run
                  in 120 s, reported as TimeoutError)

Output directories go to a temporary folder, removed at the end. Paths, trackers and the model are left out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import shutil
import signal
import sys
import tempfile
import time
import traceback
import typing

from xrpo.trainer.config import SECTIONS, TrainConfig
from xrpo.trainer.config_loader import build_config
from xrpo.trainer.loop import train

BASE = [
    "steps=2",
    "eval_every=0",
    "save_every=0",
    "log_samples_every=0",
    "progress=false",
    "tensorboard=false",
    "rollout.prompts_per_step=4",
    "rollout.rollouts_per_step=32",
    "eval_samples=2",
    "eval_k=[1,2]",
]
SKIP = {"output", "report_to", "mlflow_tracking_uri", "tracker_project", "tracker_run_name", "path", "gguf_file"}
SKIP |= {"steps", "seed", "threads", "task", "cache_dir"}
LIMIT_S = 120


def edge_values(tp, default) -> list:
    args = typing.get_args(tp)
    inner = [a for a in args if a is not type(None)]
    optional = type(None) in args
    t = inner[0] if optional and len(inner) == 1 else tp
    out: list = []
    if t is bool:
        out = [not default]
    elif t is int:
        out = [0, 1, 2, 3, 7, 100000, -1]
    elif t is float:
        out = [0.0, 1e-9, 0.5, 1.0, 2.0, 1e6, -0.5, float("inf"), float("nan")]
    if optional and default is not None:
        out.append(None)
    return [v for v in out if v != default]


def cases(prefixes: list[str]) -> list[tuple[str, str]]:
    out = []
    for sec, cls in [("", TrainConfig), *SECTIONS.items()]:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in SECTIONS or f.name in SKIP:
                continue
            key = f"{sec}.{f.name}" if sec else f.name
            if f.default is not dataclasses.MISSING:
                default = f.default
            else:
                default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
            for v in edge_values(hints[f.name], default):
                text = "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
                out.append((key, text))
    return [c for c in out if not prefixes or any(c[0].startswith(p) for p in prefixes)]


def _timeout(*_):
    raise TimeoutError(f"over {LIMIT_S} s")


def main(prefixes: list[str]) -> None:
    todo = cases(prefixes)
    print(f"{len(todo)} cases", flush=True)
    root = tempfile.mkdtemp(prefix="xrpo-config-fuzz-")
    counts: dict[str, int] = {}
    signal.signal(signal.SIGALRM, _timeout)
    try:
        for key, v in todo:
            try:
                cfg = build_config(None, [*BASE, f"{key}={v}"])
            except (ValueError, TypeError) as e:
                print(f"REFUSED       {key}={v}: {str(e).splitlines()[0][:160]}", flush=True)
                counts["REFUSED"] = counts.get("REFUSED", 0) + 1
                continue
            cfg.output = tempfile.mkdtemp(dir=root)
            t0 = time.time()
            signal.alarm(LIMIT_S)
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    train(cfg)
                line, kind = f"ACCEPT-OK     {key}={v}", "ACCEPT-OK"
            except BaseException as e:  # noqa: BLE001 - every failure is reported, KeyboardInterrupt aside
                if isinstance(e, KeyboardInterrupt):
                    raise
                tb = traceback.extract_tb(e.__traceback__)
                where = f"{tb[-1].filename.rsplit('/xrpo/', 1)[-1]}:{tb[-1].lineno}" if tb else "?"
                first = str(e).splitlines()[0][:200] if str(e) else ""
                line, kind = f"ACCEPT-CRASH  {key}={v}: {type(e).__name__}: {first} @ {where}", "ACCEPT-CRASH"
            finally:
                signal.alarm(0)
            print(f"{line} ({time.time() - t0:.0f} s)", flush=True)
            counts[kind] = counts.get(kind, 0) + 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(", ".join(f"{k} {n}" for k, n in sorted(counts.items())))


if __name__ == "__main__":
    main(sys.argv[1:])
