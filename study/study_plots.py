"""The study's figures: held-out pass@1 curves, training reward, and the allocation histogram (matplotlib, the
`plot` extra)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from study_format import ABLATIONS, method_label


def _atomic_savefig(fig, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    os.replace(tmp, path)


def plot_figures(agg: dict, order: Sequence[str], fig_dir: Path) -> dict[str, Path]:
    """Training curves and the allocation histogram as PNGs; {} without matplotlib (the `plot` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    M = agg["methods"]
    order = [m for m in order if m in M]
    fig_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    groups = [
        ("baselines and XRPO", [m for m in order if m not in ABLATIONS]),
        ("XRPO and its ablations", [m for m in order if m in ("xrpo", *ABLATIONS)]),
    ]
    groups = [(t, ms) for t, ms in groups if ms]
    if groups:
        fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4.2), squeeze=False)
        for ax, (title, ms) in zip(axes[0], groups):
            for m in ms:
                c = M[m]["curve"]
                if not c["steps"]:
                    continue
                x, y = np.asarray(c["steps"]), 100 * np.asarray(c["mean"])
                (line,) = ax.plot(x, y, marker="o", ms=3, label=method_label(m))
                h = np.asarray([np.nan if v is None else v for v in c["ci95"]], dtype=float)
                if np.isfinite(h).any():
                    ax.fill_between(x, y - 100 * h, y + 100 * h, color=line.get_color(), alpha=0.15)
            if agg["target"]["value"] is not None:
                ax.axhline(100 * agg["target"]["value"], color="gray", ls="--", lw=1)
            ax.set_title(title)
            ax.set_xlabel("training step")
            ax.set_ylabel("held-out pass@1 (%)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        out["curves"] = fig_dir / "curves_pass1.png"
        _atomic_savefig(fig, out["curves"])
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(7, 4.2))
        for m in order:
            r = M[m]["reward"]
            if not r["steps"]:
                continue
            y = np.asarray(r["mean"])
            w = min(10, len(y))
            smooth = np.convolve(y, np.ones(w) / w, mode="valid")
            ax.plot(np.asarray(r["steps"])[w - 1 :], smooth, label=method_label(m))
        ax.set_xlabel("training step")
        ax.set_ylabel("training reward (moving average)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, ncol=2)
        out["reward"] = fig_dir / "training_reward.png"
        _atomic_savefig(fig, out["reward"])
        plt.close(fig)

    hrp = [m for m in order if M[m]["extras_hist"]]
    if hrp:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        width = 0.8 / len(hrp)
        for i, m in enumerate(hrp):
            h = np.asarray(M[m]["extras_hist"], dtype=float)
            ax.bar(np.arange(h.size) + i * width - 0.4 + width / 2, h / h.sum(), width, label=method_label(m))
        ax.set_xlabel("extra rollouts one prompt got in one planning round")
        ax.set_ylabel("share of (prompt, round) pairs")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
        out["alloc"] = fig_dir / "allocation.png"
        _atomic_savefig(fig, out["alloc"])
        plt.close(fig)
    return out
