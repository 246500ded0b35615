"""Learning speed: how fast each method's held-out accuracy reaches GRPO's, from the study's run directories.

The question a user switching from GRPO asks (XRPO §4.2: 2.4-2.7x fewer steps than GRPO to a target accuracy),
answered from held-out validation, not from a proxy. Every figure is per seed, then paired by seed against GRPO
(runs of one seed share the training prompts of each step, the initial model, the held-out problems and the
validation's sampling seed), with 95% Student-t intervals (`xrpo.algo.stats.mean_ci`) for differences and the delta
method (`xrpo.algo.stats.ratio_ci`) for ratios of means.

Definitions (fixed before any run; docs/results.md repeats them):

    target          GRPO's final held-out pass@1, mean over its seeds (the seed-mean curve's target)
    steps to reach  seed-mean curve: the first validation step at which the method's seed-mean pass@1 is >= the
                    target (None: never within the run). Per seed: the first validation step at which the seed's
                    curve is >= its paired GRPO seed's final pass@1; a seed that never reaches it is *censored* and
                    enters at the run's last step (its true step is later, so a censored seed makes the method's
                    steps, its ratio and the ratio's interval too small: the tables count censored seeds)
    steps ratio     mean over seeds of the method's steps / the same mean of GRPO's (ratio of paired means, delta-
                    method interval); < 1 is faster. Rollouts and wall time to reach are the rollouts generated and
                    the training time (`time/step`: rollouts and update, no validation) summed up to that step
    AUC             the area under the held-out pass@1 curve over the run (trapezoids over the validation steps),
                    divided by the run's steps: the mean held-out pass@1 during training
    noise           the standard error of one validation's pass@1 from its samples, for a fixed model and held-out
                    draw: sqrt(mean_i p_i (1 - p_i) / (N S)) over N problems x S samples, with mean_i p_i (1 - p_i)
                    estimated without bias by pass@2 - pass@1; and the problem-draw part, the spread of the
                    per-problem rates: sqrt((mean_i p_i^2 - pass@1^2) / N), mean_i p_i^2 = 2 pass@1 - pass@2
                    (shared by the methods of one seed, so it cancels from paired figures)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from study_aggregate import group_signal
from study_runs import Run
from study_stats import mean_ci, num

from xrpo.algo.stats import ratio_ci

P1 = "eval/pass@1"
P2 = "eval/pass@2"


# ================================================================================================ one run
def curve(run: Run, key: str = P1) -> dict[int, float]:
    """Validation step -> ``key`` (held-out), from the run's summary (every validation, the final one included)."""
    return {int(h["step"]): float(h[key]) for h in run.summary["eval_history"] if key in h}


def first_reach(points: dict[int, float], target: float, tol: float = 1e-9) -> int | None:
    """The first validation step whose value is >= ``target`` (a value equal up to float rounding reaches it: they
    are ratios of counts); None when none is."""
    for s in sorted(points):
        if points[s] >= target - tol:
            return s
    return None


def auc(points: dict[int, float]) -> float:
    """Trapezoid area under the curve over its steps, divided by the span: the curve's mean over the run."""
    s = sorted(points)
    if len(s) < 2:
        raise ValueError(f"auc: needs >= 2 validations, got steps {s}")
    x, y = np.asarray(s, dtype=float), np.asarray([points[k] for k in s])
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2.0 / (x[-1] - x[0]))


def cumulative(run: Run) -> dict[str, dict[int, float]]:
    """Per training step, the rollouts generated and the training time (`time/step`) summed from step 1 (DAPO's
    generated rollouts are its generation batches times the step's budget)."""
    budget = run.config["rollout"]["rollouts_per_step"]
    gen, secs = {}, {}
    g = t = 0.0
    for r in run.metrics:
        g += r["rollout/gen_batches"] * budget if "rollout/gen_batches" in r else r.get("rollout/count", 0.0)
        t += r.get("time/step", 0.0)
        gen[int(r["step"])], secs[int(r["step"])] = g, t
    return {"rollouts": gen, "train_s": secs}


def validation_noise(h: dict, problems: int, samples: int) -> dict[str, float] | None:
    """The sampling and problem-draw standard errors of one validation's pass@1 (module docstring), from its pass@1
    and pass@2; None without pass@2 or with a single sample per problem."""
    if P2 not in h or samples < 2 or problems < 1:
        return None
    p1, p2 = float(h[P1]), float(h[P2])
    within = max(p2 - p1, 0.0)  # mean_i p_i (1 - p_i), unbiased
    spread = max(2.0 * p1 - p2 - p1 * p1, 0.0)  # mean_i p_i^2 - (mean_i p_i)^2
    return {"sampling_se": math.sqrt(within / (problems * samples)), "problem_se": math.sqrt(spread / problems)}


def run_learning(run: Run) -> dict[str, Any]:
    """One run's curves, cumulative costs, final figures and learning signal."""
    sig = group_signal(run.rounds) or {}
    return {
        "seed": run.seed,
        "curve": curve(run),
        "final": {k: float(v) for k, v in run.summary["heldout_after"].items() if k.startswith("eval/")},
        "cum": cumulative(run),
        "steps": int(run.summary["steps"]),
        "wall_s": sum(s.get("wall_s", 0.0) for s in run.segments) if run.segments else run.summary.get("wall_time_s"),
        "signal": sig,
        "noise": [
            n
            for h in run.summary["eval_history"]
            if (
                n := validation_noise(
                    h, int(run.summary["heldout_problems"]), int(run.summary["heldout_samples_per_problem"])
                )
            )
        ],
    }


# ================================================================================================ statistics
def ratio_stat(x: Sequence[float], y: Sequence[float]) -> dict:
    """mean(x) / mean(y) over paired values with its delta-method 95% half-width (`xrpo.algo.stats.ratio_ci`); one
    pair: the ratio without an interval; mean(y) = 0: None."""
    a, b = [float(v) for v in x], [float(v) for v in y]
    if not a or len(a) != len(b) or np.mean(b) == 0:
        return {"ratio": None, "ci95": None, "n": len(a)}
    if len(a) == 1:
        return {"ratio": a[0] / b[0], "ci95": None, "n": 1}
    r, h = ratio_ci(a, b)
    return {"ratio": r, "ci95": num(h), "n": len(a)}


def stat(values: Sequence[float]) -> dict:
    return mean_ci([v for v in values if v is not None and math.isfinite(v)]).as_dict()


def paired(a: dict[int, float], b: dict[int, float]) -> dict:
    """mean_ci of a[seed] - b[seed] over the seeds both have."""
    return stat([a[s] - b[s] for s in sorted(set(a) & set(b))])


def reach_at(cum: dict[int, float], step: int) -> float:
    """A cumulative figure at ``step`` (0 at step 0)."""
    return 0.0 if step == 0 else float(cum[step])


# ================================================================================================ aggregation
def aggregate_learning(runs: dict[str, list[Run]], baseline: str = "grpo") -> dict[str, Any]:
    """Every number of the learning-speed tables, JSON-ready (module docstring for the definitions). Needs the
    baseline's runs; a method is paired with it on the seeds both have."""
    if baseline not in runs:
        raise ValueError(f"no finished {baseline} run: the learning-speed figures are relative to it")
    figs = {m: {f["seed"]: f for f in map(run_learning, rs)} for m, rs in runs.items()}
    base = figs[baseline]
    cons = sorted({k for fs in figs.values() for f in fs.values() for k in f["final"] if k.startswith("eval/cons@")})
    target = float(np.mean([f["final"][P1] for f in base.values()]))
    out: dict[str, Any] = {
        "baseline": baseline,
        "target": target,
        "cons_key": cons[0] if cons else None,
        "methods": {},
    }
    noise = [n for fs in figs.values() for f in fs.values() for n in f["noise"]]
    if noise:
        out["noise"] = {
            k: {"median": float(np.median([n[k] for n in noise])), "max": float(np.max([n[k] for n in noise]))}
            for k in ("sampling_se", "problem_se")
        }
    for m, fs in figs.items():
        seeds = sorted(fs)
        common = sorted(set.intersection(*(set(f["curve"]) for f in fs.values())))
        mean_curve = {s: stat([fs[k]["curve"][s] for k in seeds]) for s in common}
        pair = [k for k in seeds if k in base]
        last = {k: max(fs[k]["curve"]) for k in seeds}
        reach, censored = {}, []
        for k in pair:
            r = first_reach(fs[k]["curve"], base[k]["final"][P1])
            reach[k] = last[k] if r is None else r
            if r is None:
                censored.append(k)
        base_reach = {k: first_reach(base[k]["curve"], base[k]["final"][P1]) for k in pair}
        d: dict[str, Any] = {
            "seeds": seeds,
            "n": len(seeds),
            "curve": {
                "steps": common,
                "mean": [mean_curve[s]["mean"] for s in common],
                "ci95": [mean_curve[s]["ci95"] for s in common],
            },
            "diff_curve": {
                "steps": common,
                **_unzip(
                    [
                        paired({k: fs[k]["curve"][s] for k in seeds}, {k: base[k]["curve"][s] for k in pair})
                        for s in common
                    ]
                ),
            },
            "reach_mean_curve": first_reach({s: mean_curve[s]["mean"] for s in common}, target),
            "reach_by_seed": {k: reach[k] for k in pair},
            "censored": censored,
            "steps_ratio": ratio_stat([reach[k] for k in pair], [base_reach[k] for k in pair]),
            "rollouts_ratio": ratio_stat(
                [reach_at(fs[k]["cum"]["rollouts"], reach[k]) for k in pair],
                [reach_at(base[k]["cum"]["rollouts"], base_reach[k]) for k in pair],
            ),
            "wall_ratio": ratio_stat(
                [reach_at(fs[k]["cum"]["train_s"], reach[k]) for k in pair],
                [reach_at(base[k]["cum"]["train_s"], base_reach[k]) for k in pair],
            ),
            "earlier_seeds": sum(reach[k] < base_reach[k] for k in pair),
            "later_seeds": sum(reach[k] > base_reach[k] for k in pair),
            "final": stat([fs[k]["final"][P1] for k in seeds]),
            "final_diff": paired({k: fs[k]["final"][P1] for k in seeds}, {k: base[k]["final"][P1] for k in pair}),
            "auc": stat([auc(fs[k]["curve"]) for k in seeds]),
            "auc_diff": paired({k: auc(fs[k]["curve"]) for k in seeds}, {k: auc(base[k]["curve"]) for k in pair}),
            "wall_s": stat([fs[k]["wall_s"] for k in seeds]),
            "wall_run_ratio": ratio_stat([fs[k]["wall_s"] for k in pair], [base[k]["wall_s"] for k in pair]),
            "rollouts": stat([fs[k]["cum"]["rollouts"][max(fs[k]["cum"]["rollouts"])] for k in seeds]),
            "train_s_per_step": stat(
                [fs[k]["cum"]["train_s"][max(fs[k]["cum"]["train_s"])] / fs[k]["steps"] for k in seeds]
            ),
        }
        if out["cons_key"]:
            ck = out["cons_key"]
            d["cons"] = stat([fs[k]["final"].get(ck) for k in seeds])
            d["cons_diff"] = paired({k: fs[k]["final"][ck] for k in seeds}, {k: base[k]["final"][ck] for k in pair})
        for name in (
            "nonzero_share",
            "zero_variance_groups",
            "mixed_groups_per_step",
            "mixed_group_size",
            "update_prompts",
        ):
            vals = {k: fs[k]["signal"][name] for k in seeds if name in fs[k]["signal"]}
            d[name] = stat(list(vals.values()))
            bv = {k: base[k]["signal"][name] for k in pair if name in base[k]["signal"] and k in vals}
            d[name + "_ratio"] = ratio_stat([vals[k] for k in bv], list(bv.values())) if bv else None
        out["methods"][m] = d
    return out


def _unzip(stats: list[dict]) -> dict[str, list]:
    return {"mean": [s["mean"] for s in stats], "ci95": [s["ci95"] for s in stats]}


# ================================================================================================ the page
def _pct(d: dict | None, digits: int = 2, signed: bool = False) -> str:
    """A Stat dict in percentage points: mean ± half-width (no interval with one seed)."""
    if not d or d["n"] == 0 or d["mean"] is None:
        return "—"
    m = f"{100 * d['mean']:{'+' if signed else ''}.{digits}f}"
    return m if d["ci95"] is None else f"{m} ± {100 * d['ci95']:.{digits}f}"


def _ratio(d: dict | None, digits: int = 2) -> str:
    if not d or d["ratio"] is None:
        return "—"
    r = f"{d['ratio']:.{digits}f}×"
    return r if d["ci95"] is None else f"{r} ± {d['ci95']:.{digits}f}"


def _plain(d: dict | None, digits: int = 1) -> str:
    if not d or d["n"] == 0 or d["mean"] is None:
        return "—"
    m = f"{d['mean']:.{digits}f}"
    return m if d["ci95"] is None else f"{m} ± {d['ci95']:.{digits}f}"


def excludes(d: dict | None, value: float) -> bool | None:
    """Whether a ratio's 95% interval excludes ``value`` (None without an interval)."""
    if not d or d["ratio"] is None or d["ci95"] is None:
        return None
    return abs(d["ratio"] - value) > d["ci95"]


def render_learning(agg: dict, order: Sequence[str], setup: list[str], figures: dict[str, str], label) -> str:
    """The generated part of a regime's learning-speed section: setup, the four tables, the figures, findings."""
    M = {m: agg["methods"][m] for m in order if m in agg["methods"]}
    base = agg["baseline"]
    last = max(max(d["curve"]["steps"]) for d in M.values() if d["curve"]["steps"])
    L: list[str] = [f"- {x}" for x in setup]
    if "noise" in agg:
        n = agg["noise"]
        L.append(
            f"- Noise of one validation's pass@1 (all validations of all runs): sampling standard error median "
            f"{100 * n['sampling_se']['median']:.2f} points (largest {100 * n['sampling_se']['max']:.2f}); the "
            f"held-out draw's (shared by the methods of a seed) median {100 * n['problem_se']['median']:.2f} points."
        )
    L.append("")
    L.append(
        f"Target: {base.upper()}'s final held-out pass@1, mean over its seeds: **{100 * agg['target']:.2f}%**. "
        f"Steps to reach it: on the seed-mean curve, the first validation step at or above it; per seed, the first "
        f"validation step at which the seed's curve reaches its paired {base.upper()} seed's final pass@1 (a seed "
        f"that never does is censored and counted at step {last}, which makes that method's steps, ratio and "
        f"interval too small). Ratio: the method's mean steps over {base.upper()}'s, paired by seed (delta-method 95% "
        f"interval; < 1 is faster). Rollouts and training time to reach: summed up to that step (training time "
        f"excludes validation; measured on a shared machine, so only its paired ratio is given)."
    )
    L.append("")
    rows = []
    for m, d in M.items():
        per = ", ".join(
            f"{d['reach_by_seed'][k]}{'+' if k in d['censored'] else ''}" for k in sorted(d["reach_by_seed"])
        )
        rows.append(
            [
                label(m),
                str(d["n"]),
                "not reached" if d["reach_mean_curve"] is None else str(d["reach_mean_curve"]),
                per,
                f"{len(d['censored'])}",
                f"{d['earlier_seeds']} / {d['later_seeds']}",
                _ratio(d["steps_ratio"]),
                _ratio(d["rollouts_ratio"]),
                _ratio(d["wall_ratio"]),
            ]
        )
    L += _table(
        [
            "method",
            "seeds",
            "steps to target (seed-mean curve)",
            "steps per seed (+: censored)",
            "censored seeds",
            f"seeds earlier / later than {base.upper()}",
            f"steps × {base.upper()}",
            f"rollouts × {base.upper()}",
            f"training time × {base.upper()}",
        ],
        rows,
    )
    L.append("")
    ck = agg.get("cons_key")
    rows = []
    for m, d in M.items():
        rows.append(
            [
                label(m),
                _pct(d["final"]),
                "—" if m == base else _pct(d["final_diff"], signed=True),
                _pct(d["auc"]),
                "—" if m == base else _pct(d["auc_diff"], signed=True),
            ]
            + ([_pct(d.get("cons")), "—" if m == base else _pct(d.get("cons_diff"), signed=True)] if ck else [])
        )
    L += _table(
        [
            "method",
            "final pass@1 (%)",
            f"Δ vs {base.upper()} (points)",
            "AUC: mean pass@1 over the run (%)",
            "Δ AUC (points)",
        ]
        + ([f"final {ck.split('/')[1]} (%)", "Δ (points)"] if ck else []),
        rows,
    )
    L.append("")
    rows = []
    for m, d in M.items():
        rows.append(
            [
                label(m),
                _pct(d["nonzero_share"], 1),
                "—" if m == base else _ratio(d["nonzero_share_ratio"]),
                _plain(d["mixed_groups_per_step"], 2),
                "—" if m == base else _ratio(d["mixed_groups_per_step_ratio"]),
                _plain(d["mixed_group_size"], 1),
                _plain(d["update_prompts"], 2),
                _pct(d["zero_variance_groups"], 1),
            ]
        )
    L.append(
        "The learning signal beside it (from rounds.jsonl; a group is a prompt's rollouts over every round of a "
        "step): the informative share is the rollouts in groups whose rewards are not all equal (a non-zero "
        "advantage) over the rollouts generated; prompts with a gradient are those groups, per step; the prompts "
        "the update sees are their effective number, (Σ w)² / Σ w² with w a prompt's summed |advantage| (its weight "
        "in the token-mean loss, rollouts being of about equal length): 2 √(n (n − 1) μ (1 − μ)) for a group of n "
        "at success rate μ."
    )
    L.append("")
    L += _table(
        [
            "method",
            "informative share (%)",
            f"× {base.upper()}",
            "prompts with a gradient per step",
            f"× {base.upper()}",
            "rollouts per such prompt",
            "prompts the update sees",
            "zero-variance groups (%)",
        ],
        rows,
    )
    L.append("")
    rows = [
        [
            label(m),
            _plain(d["wall_s"], 0),
            "—" if m == base else _ratio(d["wall_run_ratio"]),
            _plain(d["train_s_per_step"], 2),
            _plain(d["rollouts"], 0),
        ]
        for m, d in M.items()
    ]
    L.append(
        "Cost per run (the whole `xrpo train` process, validations included; the machine was shared, see the load "
        "above):"
    )
    L.append("")
    L += _table(["method", "wall (s)", f"× {base.upper()} (paired)", "training step (s)", "rollouts generated"], rows)
    L.append("")
    for key, alt in (("curves", "held-out pass@1 during training"), ("steps", "steps to reach the target")):
        if key in figures:
            L.append(f"![{alt}]({figures[key]})")
            L.append("")
    if figures:
        L.append(
            "Left: held-out pass@1, seed mean with its 95% band, the dashed line the target. Right: each method minus "
            f"{base.upper()}, paired by seed, with its 95% band. Steps figure: each seed's steps to its {base.upper()} "
            "seed's final (open marks: censored), and the ratio with its interval."
        )
        L.append("")
    L += [f"- {x}" for x in findings(agg, order, label)]
    return "\n".join(L)


def findings(agg: dict, order: Sequence[str], label) -> list[str]:
    """Sentences generated from the numbers: for each method against the baseline, speed and final accuracy."""
    base = agg["baseline"]
    out = []
    for m in order:
        if m == base or m not in agg["methods"]:
            continue
        d = agg["methods"][m]
        sr, fd = d["steps_ratio"], d["final_diff"]
        if sr["ratio"] is None:
            continue
        ex = excludes(sr, 1.0)
        speed = f"reaches {base.upper()}'s final pass@1 in {_ratio(sr)} its steps" + (
            "" if ex is None else (" (the interval excludes 1)" if ex else " (the interval includes 1)")
        )
        if d["censored"]:
            speed += f", {len(d['censored'])} of {sr['n']} seeds censored"
        acc = f"final pass@1 {_pct(fd, signed=True)} points" + (
            "" if fd["ci95"] is None else (" (beyond noise)" if abs(fd["mean"]) > fd["ci95"] else " (within noise)")
        )
        out.append(f"{label(m)} {speed}; {acc}; AUC {_pct(d['auc_diff'], signed=True)} points.")
    return out


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


# ================================================================================================ figures
def plot_learning(agg: dict, order: Sequence[str], fig_dir, label) -> dict[str, Any]:
    """Two PNGs: the held-out curves with bands and their paired differences to the baseline; steps to reach per
    seed with the ratio. {} without matplotlib (the `plot` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    from pathlib import Path

    from study_plots import _atomic_savefig

    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    base = agg["baseline"]
    M = {m: agg["methods"][m] for m in order if m in agg["methods"]}
    colors = {m: f"C{i}" for i, m in enumerate(M)}
    out = {}
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for m, d in M.items():
        c = d["curve"]
        x, y = np.asarray(c["steps"], float), 100 * np.asarray(c["mean"], float)
        h = 100 * np.asarray([np.nan if v is None else v for v in c["ci95"]], float)
        a1.plot(x, y, marker="o", ms=3, color=colors[m], label=f"{label(m)} ({d['n']} seeds)")
        a1.fill_between(x, y - h, y + h, color=colors[m], alpha=0.12)
        if m != base:
            dc = d["diff_curve"]
            yd = 100 * np.asarray([np.nan if v is None else v for v in dc["mean"]], float)
            hd = 100 * np.asarray([np.nan if v is None else v for v in dc["ci95"]], float)
            a2.plot(x, yd, marker="o", ms=3, color=colors[m], label=label(m))
            a2.fill_between(x, yd - hd, yd + hd, color=colors[m], alpha=0.12)
    a1.axhline(100 * agg["target"], color="gray", ls="--", lw=1)
    a2.axhline(0, color=colors.get(base, "k"), lw=1)
    a1.set(xlabel="training step", ylabel="held-out pass@1 (%)", title="held-out pass@1 (seed mean, 95% band)")
    a2.set(xlabel="training step", ylabel="points", title=f"minus {label(base)}, paired by seed (95% band)")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    out["curves"] = fig_dir / "learning_curves.png"
    _atomic_savefig(fig, out["curves"])
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.55 * len(M)))
    for i, (m, d) in enumerate(M.items()):
        seeds = sorted(d["reach_by_seed"])
        xs = np.asarray([d["reach_by_seed"][k] for k in seeds], float)
        cen = np.asarray([k in d["censored"] for k in seeds])
        jitter = np.linspace(-0.15, 0.15, len(seeds)) if len(seeds) > 1 else np.zeros(1)
        ax.scatter(xs[~cen], i + jitter[~cen], color=colors[m], s=18)
        ax.scatter(xs[cen], i + jitter[cen], facecolors="none", edgecolors=colors[m], s=18)
        r = d["steps_ratio"]
        txt = _ratio(r) if m != base else "1.00×"
        ax.text(1.01, i, txt, transform=ax.get_yaxis_transform(), va="center", fontsize=8)
    ax.set_yticks(range(len(M)), [label(m) for m in M])
    ax.invert_yaxis()
    ax.set_xlabel(f"validation step at which a seed first reaches its {label(base)} seed's final pass@1")
    ax.grid(alpha=0.3, axis="x")
    out["steps"] = fig_dir / "learning_steps.png"
    _atomic_savefig(fig, out["steps"])
    plt.close(fig)
    return out
