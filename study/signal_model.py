"""Build the model of the study's regime (study/signal.yaml), once, into runs/signal-model.

    python study/signal_model.py             # about 7 minutes on one core of the 2-core dev VM; skipped when built
    python study/signal_model.py --check     # print what it would build and whether it exists

The built-in tiny Qwen2 (the default model's architecture, tokenizer recipe and warm-start) warm-started on the
regime's own problems: chain_sum with 3 one-digit terms and products (signed 2-factor, unsigned 3-factor), with the
questions of the held-out splits of seeds 0-4 removed, so every study run validates on questions the warm-start
never saw. Why this task and this length: docs/results.md, "The regime".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "study" / "signal.yaml"
WARMUP_STEPS = 1100
HELDOUT_SEEDS = (0, 1, 2, 3, 4)
POOL = 5200


def task():
    from xrpo.models.default import WarmupTask

    data = yaml.safe_load(CONFIG.read_text())["data"]
    return WarmupTask(
        families=tuple(data["families"]),
        levels={k: tuple(v) for k, v in data["levels"].items()},
        problems=POOL,
        heldout=data["n_heldout"],
        heldout_seeds=HELDOUT_SEEDS,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "runs" / "signal-model"))
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    t = task()
    print(f"{out}: {'built' if (out / 'COMPLETE').exists() else 'missing'}; {WARMUP_STEPS} steps on {t.as_dict()}")
    if args.check or (out / "COMPLETE").exists():
        return 0
    import torch

    from xrpo.models.default import build_model_dir

    torch.set_num_threads(1)
    build_model_dir(out, warmup_steps=WARMUP_STEPS, task=t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
