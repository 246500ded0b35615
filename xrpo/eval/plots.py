"""PNG plots for `xrpo eval` and `xrpo report`: matplotlib (the `plot` extra), imported lazily with the Agg backend so
that nothing here needs a display. Every function writes one file and returns its path."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from xrpo.algo.passk import mean_pass_at_k


def pyplot():
    """matplotlib.pyplot with the Agg backend (the `plot` extra); a clear error without it."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plots need matplotlib: pip install 'xrpo[plot]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` (PNG, atomically: a killed run leaves no half file) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.tight_layout()
    fig.savefig(tmp, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    tmp.replace(path)
    return path


def plot_pass_at_k(results: Mapping, path: Path) -> Path:
    """pass@k against k (1..n, log scale) per dataset and on average, from the per-problem counts; the k the user
    asked for are marked."""
    plt = pyplot()
    n = int(results["n"])
    ks_all = list(range(1, n + 1))
    marked = set(results["ks"])
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    curves = []
    for name, recs in results["per_problem"].items():
        ns, cs = [r["n"] for r in recs], [r["c"] for r in recs]
        ys = [100 * mean_pass_at_k(ns, cs, k) for k in ks_all]
        curves.append(ys)
        (line,) = ax.plot(ks_all, ys, label=name)
        ax.plot(
            [k for k in ks_all if k in marked],
            [y for k, y in zip(ks_all, ys) if k in marked],
            "o",
            color=line.get_color(),
            ms=4,
        )
    if len(curves) > 1:
        ax.plot(ks_all, np.mean(curves, axis=0), "k--", label="Avg.")
    if n > 1:
        ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k (%)")
    ax.set_title(f"pass@k, n = {n} samples per problem")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_lengths(results: Mapping, path: Path) -> Path:
    """Histogram of response lengths (tokens) per dataset; the max_new_tokens limit is drawn as a line."""
    plt = pyplot()
    limit = results["settings"]["max_new_tokens"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    bins = np.linspace(0, limit + 1, min(60, limit + 2))
    for name, recs in results["per_problem"].items():
        lengths = [x for r in recs for x in r["lengths"]]
        if lengths:
            ax.hist(lengths, bins=bins, histtype="step", linewidth=1.5, label=f"{name} (mean {np.mean(lengths):.1f})")
    ax.axvline(limit, color="k", linestyle=":", label=f"max_new_tokens = {limit}")
    ax.set_xlabel("response length (tokens)")
    ax.set_ylabel("samples")
    ax.set_title("Response lengths")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_lines(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: Path,
    *,
    title: str,
    ylabel: str,
    xlabel: str = "step",
    smooth: int = 0,
    bounds: tuple[float, float] | None = None,
) -> Path:
    """One line per series ``{label: (x, y)}``; ``smooth`` > 1 adds a moving average of that window. ``bounds``:
    the quantity's own range (an accuracy's (0, 1)), which the axis does not go beyond (a run whose accuracy is 0
    throughout gets an axis from 0, not from -0.05). A "step" axis has whole steps only."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for label, (x, y) in series.items():
        (line,) = ax.plot(
            x,
            y,
            label=label,
            alpha=0.45 if smooth > 1 and len(y) > smooth else 1.0,
            marker="o" if len(x) <= 12 else None,
            ms=3,
        )
        if smooth > 1 and len(y) > smooth:
            w = np.ones(smooth) / smooth
            ax.plot(
                list(x)[smooth - 1 :],
                np.convolve(y, w, mode="valid"),
                color=line.get_color(),
                label=f"{label} ({smooth}-step mean)",
            )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if xlabel == "step":
        _whole_steps(ax)
    if bounds is not None:
        low, high = ax.get_ylim()
        ax.set_ylim(max(low, bounds[0]), min(high, bounds[1]))
    return save_figure(fig, path)


def _whole_steps(ax) -> None:
    """Ticks at whole steps only (a short run's axis would otherwise read 1.0, 1.5, 2.0)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_histograms(groups: Mapping[str, Sequence[float]], path: Path, *, title: str, xlabel: str) -> Path:
    """One panel per group, integer bins (allocation counts)."""
    plt = pyplot()
    k = max(len(groups), 1)
    fig, axes = plt.subplots(1, k, figsize=(3.2 * k + 0.6, 3.4), squeeze=False)
    for ax, (label, values) in zip(axes[0], groups.items()):
        values = np.asarray(values, dtype=float)
        hi = int(values.max()) if values.size else 1
        ax.hist(values, bins=np.arange(-0.5, hi + 1.5, 1.0), rwidth=0.85)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("(prompt, step) pairs")
    fig.suptitle(title)
    return save_figure(fig, path)


def plot_stacked(
    x: Sequence[float], parts: Mapping[str, Sequence[float]], path: Path, *, title: str, ylabel: str
) -> Path:
    """Stacked bars: one bar per x, one segment per part."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.6, 3.8))
    bottom = np.zeros(len(x))
    for label, ys in parts.items():
        ys = np.asarray(ys, dtype=float)
        ax.bar(x, ys, bottom=bottom, label=label, width=0.9)
        bottom += ys
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _whole_steps(ax)
    # beside the bars, not over them: a stack fills the axes wherever its legend would go inside
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return save_figure(fig, path)
