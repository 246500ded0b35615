"""Per-step wall time of XRPO against GRPO at the same rollout budget on the default task, measured in one process.

Each method trains from the same cached default model for a block of steps; blocks alternate (xrpo, grpo, xrpo, ...)
so that load on a shared machine hits both alike. Reported: median step time and its split into generate / plan /
retrieve / verify / old log-probs / update, and the xrpo / grpo ratio (paper, §4.2: 1.047).

    python benchmarks/bench_step.py                 # 3 blocks x 10 steps per method
    python benchmarks/bench_step.py --blocks 1 --steps 4   # quick sanity run
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

import numpy as np

from xrpo.trainer.config import build_config
from xrpo.trainer.loop import train

PARTS = ["time/generate", "time/plan", "time/retrieve", "time/verify", "time/old_logprobs", "time/update"]


def run_block(method: str, steps: int, seed: int, out: Path) -> list[dict]:
    cfg = build_config(
        None,
        [
            f"method.name={method}",
            f"steps={steps}",
            f"seed={seed}",
            f"output={out}",
            "eval_every=0",
            "save_every=0",
            "log_samples_every=0",
            "progress=false",
            "tensorboard=false",
            "eval_samples=1",
            "eval_k=[1]",
            "data.n_heldout=8",
        ],
    )
    train(cfg, log=lambda *_: None)
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    rows: dict[str, list[dict]] = {"xrpo": [], "grpo": []}
    with tempfile.TemporaryDirectory() as tmp:
        for b in range(args.blocks):
            for method in ("xrpo", "grpo"):
                got = run_block(method, args.steps, b, Path(tmp) / f"{method}-{b}")
                rows[method].extend(got[1:])  # the first step of a block pays one-off warm-up costs
    med = {
        m: {k: float(np.median([r.get(k, 0.0) for r in rs])) for k in PARTS + ["time/step"]} for m, rs in rows.items()
    }
    print(
        f"machine: {platform.machine()}, {platform.processor() or 'cpu'}; "
        f"{args.blocks} blocks x {args.steps} steps per method, median over {len(rows['xrpo'])} steps"
    )
    print()
    print("| method | step (s) | " + " | ".join(k.split("/")[1] for k in PARTS) + " |")
    print("|---|---|" + "---|" * len(PARTS))
    for m in ("xrpo", "grpo"):
        print(f"| {m} | {med[m]['time/step']:.3f} | " + " | ".join(f"{med[m][k]:.3f}" for k in PARTS) + " |")
    print()
    ratio = med["xrpo"]["time/step"] / med["grpo"]["time/step"]
    print(f"xrpo / grpo median step time: {ratio:.3f} (paper: 1.047)")
    means = {m: float(np.mean([r["rollout/response_length_mean"] for r in rs])) for m, rs in rows.items()}
    print(f"mean completion length: xrpo {means['xrpo']:.2f}, grpo {means['grpo']:.2f} tokens")


if __name__ == "__main__":
    main()
