"""PNG plots of `xrpo simulate`: matplotlib (the `plot` extra), imported lazily with the Agg backend
(``xrpo.eval.plots``' helpers). Every function writes one file and returns its path."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from xrpo.algo.allocation import plan_phases
from xrpo.eval.plots import pyplot, save_figure
from xrpo.sim.latency import latency_ratio, phase_latency


def plot_methods(result: dict, path: Path) -> Path:
    """Per method: where a step's rollouts went (informative / in all-equal groups / informative but dropped by DAPO's
    quota), non-zero-gradient groups per step, the gradient value xrpo-plus's planner maximises (sum over them of
    n^gamma) and the squared error of each prompt's mean-reward estimate; 95% intervals as error bars."""
    plt = pyplot()
    methods = list(result["methods"])
    R = result["methods"]
    x = np.arange(len(methods))
    mean = lambda k: np.array([R[m][k]["mean"] for m in methods])  # noqa: E731
    ci = lambda k: np.array([R[m][k]["ci"] for m in methods])  # noqa: E731
    inf, eq, gen = mean("informative_rollouts"), mean("rollouts_all_equal"), mean("rollouts_generated")
    other = np.maximum(gen - inf - eq, 0.0)
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.4))
    ax = axes[0]
    ax.bar(x, inf, yerr=ci("informative_rollouts"), capsize=3, label="in groups with non-zero variance")
    ax.bar(x, eq, bottom=inf, color="0.75", label="in all-equal groups")
    if other.any():
        ax.bar(x, other, bottom=inf + eq, color="0.45", label="informative, dropped (DAPO quota)")
    ax.set_ylabel("rollouts per step")
    ax.set_title("where the rollouts went")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.bar(x, mean("informative_groups"), yerr=ci("informative_groups"), capsize=3, color="C2")
    ax.set_ylabel("groups per step")
    ax.set_title("groups with a non-zero gradient")
    ax = axes[2]
    ax.bar(x, mean("group_value"), yerr=ci("group_value"), capsize=3, color="C4")
    ax.set_ylabel("sum of n^γ over those groups, per step")
    ax.set_title(f"gradient value (xrpo-plus's objective, γ = {result['config']['group_size_power']:g})")
    ax = axes[3]
    ax.bar(x, mean("sq_error"), yerr=ci("sq_error"), capsize=3, color="C3")
    ax.set_ylabel("mean over prompts of (k/n - p)^2")
    ax.set_title("squared error of each prompt's p̂")
    for ax in axes:
        ax.set_xticks(x, methods, rotation=35, ha="right")
        ax.grid(alpha=0.3, axis="y")
    c = result["config"]
    fig.suptitle(
        f"{c['prompts']} prompts, {c['rollouts']} rollouts, n_base {c['n_base']}, {c['rounds']} rounds, "
        f"lambda {c['lam']:g}, {c['steps']} steps",
        fontsize=10,
    )
    return save_figure(fig, path)


def plot_latency(cfg, path: Path) -> Path:
    """T2 / T1 against engine concurrency m_p: the paper's closed form for the step's N and for N / 4 and 4 N
    (lines), and the ceiling model of the config's own rounds (markers)."""
    plt = pyplot()
    phases = plan_phases(cfg.prompts, cfg.rollouts, cfg.n_base, cfg.rounds)
    sizes = [phases.base_per_prompt * cfg.prompts, *phases.round_budgets]
    n = len([s for s in sizes if s > 0])
    N = cfg.rollouts
    ms = np.unique(np.round(np.logspace(0, np.log10(max(16 * N, max(cfg.concurrency))), 200)).astype(int))
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for NN, style in ((max(N // 4, 1), ":"), (N, "-"), (4 * N, "--")):
        ax.plot(ms, latency_ratio(NN, ms, n, cfg.dt / cfg.t0), style, label=f"closed form, N = {NN}")
    exact = [phase_latency(sizes, m, cfg.t0, cfg.dt) / phase_latency([N], m, cfg.t0, 0.0) for m in ms]
    ax.plot(ms, exact, ".", ms=3, color="k", label=f"ceilings, this step's rounds {sizes}")
    ax.axhline(1, color="0.6", lw=0.8)
    ax.axhline(n, color="0.6", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("engine concurrency m_p")
    ax.set_ylabel("T2 / T1")
    ax.set_title(f"latency of {n} generation rounds vs one batch (dt = {cfg.dt:g} t0)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plot_sweep(sw: dict, path: Path) -> Path:
    """Each method against uniform (ratio of means, 95% interval) over the swept values: informative rollouts and
    non-zero-gradient groups, both per rollout generated (at equal budget: per step)."""
    plt = pyplot()
    values = [str(v) for v in sw["values"]]
    x = np.arange(len(values))
    methods = [m for m in sw["runs"][0]["methods"] if m != "uniform"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    panels = (
        (axes[0], "informative_share", "informative rollouts per rollout generated, × uniform"),
        (axes[1], "groups_per_rollout", "non-zero-gradient groups per rollout generated, × uniform"),
    )
    for ax, key, title in panels:
        for j, m in enumerate(methods):
            ys = np.array(
                [run["methods"][m].get("vs_uniform", {}).get(key, {}).get("ratio", np.nan) for run in sw["runs"]],
                dtype=float,
            )
            es = np.array(
                [run["methods"][m].get("vs_uniform", {}).get(key, {}).get("ci", np.nan) for run in sw["runs"]],
                dtype=float,
            )
            ax.errorbar(x + (j - len(methods) / 2) * 0.04, ys, yerr=es, marker="o", ms=4, capsize=2, label=m)
        ax.axhline(1, color="0.5", lw=0.8)
        ax.set_xticks(
            x,
            values,
            rotation=30 if sw["name"] == "dist" else 0,
            ha="right" if sw["name"] == "dist" else "center",
            fontsize=7 if sw["name"] == "dist" else 9,
        )
        ax.set_xlabel(sw["name"])
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save_figure(fig, path)
