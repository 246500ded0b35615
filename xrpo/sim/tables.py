"""What `xrpo simulate` prints and writes: the Markdown tables of a simulation and of a sweep, and `run_cli` (print,
then with ``--output`` simulate.md / simulate.json / PNGs, or sweep.md / sweep.json / sweep_NAME.png)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from xrpo.rundir.files import write_atomic
from xrpo.rundir.lock import make_output_dir
from xrpo.sim.runner import SimConfig, parse_sweep, simulate, sweep

__all__ = ["METRICS", "markdown_table", "run_cli", "sweep_table"]

# (key, column title, format) of the reported figures, in table order; docs/simulate.md defines each
METRICS = [
    ("informative_rollouts", "informative rollouts / step", "{:.1f}"),
    ("informative_share", "share of generated", "{:.3f}"),
    ("informative_groups", "non-zero-gradient groups / step", "{:.2f}"),
    ("group_value", "gradient value / step (Σ n^γ)", "{:.2f}"),
    ("sq_error", "sq. error of p̂", "{:.4f}"),
    ("rollouts_p01", "rollouts on p ∈ {0,1}", "{:.1f}"),
    ("rollouts_all_equal", "rollouts in all-equal groups", "{:.1f}"),
    ("rollouts_generated", "rollouts generated", "{:.1f}"),
    ("prompts", "prompts consumed", "{:.2f}"),
]


def _fmt(fig: dict, fmt: str) -> str:
    return f"{fmt.format(fig['mean'])} ± {fmt.format(fig['ci'])}"


def markdown_table(result: dict) -> str:
    """The simulator's results as Markdown: the setting, one row per method, and the latency table."""
    c, d = result["config"], result["distribution"]
    if d["source"] == "rounds_file":
        src = (
            f"{'a fit to the ' if d['fit'] == 'beta' else ''}rates of {d['problems']} problems from "
            f"`{d['file']}` ({d['steps']} steps, median {d['rollouts_per_problem_median']:g} rollouts each"
            + (
                f", {d['seeded_rollouts_excluded']} ICL-seeded rollouts left out"
                if d["seeded_rollouts_excluded"]
                else ""
            )
            + (f", {d['unreadable_lines']} partial lines skipped" if d["unreadable_lines"] else "")
            + ")"
            + (f": `{d['fitted_dist']}`" if d["fit"] == "beta" else "")
            + f". Measured: mean rate {d['measured']['mean_rate']:.3f}, no success for "
            f"{d['measured']['zero_share']:.1%}, all successes for {d['measured']['full_share']:.1%} of problems"
        )
        ms = d["measured_per_step"]
        measured_line = (
            f"Measured in the run itself (every rollout, ICL-seeded ones included): "
            f"{_fmt(ms['informative_rollouts'], '{:.1f}')} informative rollouts and "
            f"{_fmt(ms['informative_groups'], '{:.2f}')} non-zero-gradient groups per step of "
            f"{ms['rollouts']['mean']:.1f} rollouts."
        )
    else:
        src = f"`{d['dist']}`"
        measured_line = None
    lines = [
        f"Success rates: {src}; mean p {d['mean']:.3f}, p = 0 for {d['p0_share']:.1%}, p = 1 for "
        f"{d['p1_share']:.1%} of prompts; expected groups with all rewards equal: "
        + ", ".join(f"{v:.1%} at {n} rollouts" for n, v in d["zero_variance_groups"].items())
        + f" (n_base {c['n_base']}; the even split gives {c['rollouts'] // c['prompts']}).",
        f"Step: {c['prompts']} prompts, {c['rollouts']} rollouts, n_base {c['n_base']}, {c['rounds']} planning "
        f"rounds, alpha {c['alpha']:g}, lambda {c['lam']:g}, gradient value γ = group_size_power "
        f"{c['group_size_power']:g}"
        + (f", ICL p_icl = clip({c['icl_mult']:g} p + {c['icl_add']:g}, 0, 1)" if c["icl"] else ", no ICL")
        + f"; DAPO max_gen_batches {c['max_gen_batches']}. Mean ± 95% interval over {c['steps']} steps "
        f"(seed {c['seed']}).",
        "",
    ]
    if measured_line:
        lines[-1:-1] = [measured_line]
    has_u = any("vs_uniform" in r for r in result["methods"].values())
    head = ["method"] + [t for _, t, _ in METRICS[:4]]
    if has_u:
        head += [f"× uniform per rollout generated: {w}" for w in ("informative rollouts", "groups", "gradient value")]
    head += [t for _, t, _ in METRICS[4:]]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in result["methods"].items():
        cells = [name] + [_fmt(r[k], f) for k, _, f in METRICS[:4]]
        if has_u:
            for k in ("informative_share", "groups_per_rollout", "group_value_per_rollout"):
                v = r.get("vs_uniform", {}).get(k)
                cells.append("–" if v is None or not math.isfinite(v["ratio"]) else f"{v['ratio']:.3f} ± {v['ci']:.3f}")
        cells += [_fmt(r[k], f) for k, _, f in METRICS[4:]]
        lines.append("| " + " | ".join(cells) + " |")
    extra = []
    for name, r in result["methods"].items():
        bits = []
        if "nonuniform_round_share" in r:
            bits.append(f"non-uniform allocation in {r['nonuniform_round_share']:.1%} of planning rounds")
        if "flip_rate" in r:
            bits.append(f"ICL seeded {r['seeded_prompts']['mean']:.2f} prompts / step, flip rate {r['flip_rate']:.3f}")
        if r["rollouts_dropped"]["mean"] > 0:
            bits.append(f"{r['rollouts_dropped']['mean']:.1f} generated rollouts / step dropped by the filter")
        if bits:
            extra.append(f"- {name}: " + "; ".join(bits))
    if extra:
        lines += [""] + extra
    if result.get("latency"):
        lat = result["latency"]
        lines += [
            "",
            f'Latency model (paper appendix "Latency Analysis"): N = {c["rollouts"]} rollouts, '
            f"{lat[0]['rounds']} generation rounds, t0 = {c['t0']:g}, dt = {c['dt']:g} per round.",
            "",
            "| concurrency m_p | T1 (one batch) | T2 (rounds) | T2 / T1 | paper closed form | T3 (streaming) "
            "| T3 / T1 |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in lat:
            lines.append(
                f"| {row['concurrency']} | {row['T1']:g} | {row['T2']:g} | {row['ratio']:.3f} | "
                f"{row['paper_ratio']:.3f} | {row['T3']:g} | {row['stream_ratio']:.3f} |"
            )
        lines += [
            "",
            "T3: streaming planning (rollout.planner=streaming) with ideal packing, max(ceil(N / m_p), rounds) t0: "
            "no barrier and no planning time, but each prompt's rounds in sequence (docs/methods.md).",
        ]
    return "\n".join(lines) + "\n"


def sweep_table(sw: dict) -> str:
    """Markdown: one row per swept value; uniform's informative rollouts and non-zero-gradient groups per step, and
    each other method's ratios to uniform per rollout generated ("rollouts / groups", 95% intervals; at equal budget
    the per-step ratios, for every method but DAPO)."""
    methods = list(sw["runs"][0]["methods"])
    others = [m for m in methods if m != "uniform"]
    head = [sw["name"]]
    if "uniform" in methods:
        head += ["uniform: informative rollouts / step", "uniform: groups / step"]
    head += [f"{m} × uniform: rollouts / groups" for m in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v, run in zip(sw["values"], sw["runs"]):
        cells = [f"`{v}`" if sw["name"] == "dist" else f"{v}"]
        if "uniform" in methods:
            u = run["methods"]["uniform"]
            cells += [_fmt(u["informative_rollouts"], "{:.1f}"), _fmt(u["informative_groups"], "{:.2f}")]
        for m in others:
            vs = run["methods"][m].get("vs_uniform", {})
            parts = []
            for k in ("informative_share", "groups_per_rollout"):
                r = vs.get(k)
                parts.append("–" if r is None or not math.isfinite(r["ratio"]) else f"{r['ratio']:.2f} ± {r['ci']:.2f}")
            cells.append(" / ".join(parts))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_cli(
    cfg: SimConfig, *, output: str | None = None, sweep_spec: str | None = None, plots: bool = True, log=print
) -> dict:
    """What `xrpo simulate` does: simulate (or sweep), print the Markdown table, and with ``output`` write the
    Markdown, the JSON and (matplotlib installed and ``plots``) the PNGs there."""
    out = Path(output) if output else None
    if out is not None:
        make_output_dir(out, "--output")
    if sweep_spec:
        name, values = parse_sweep(sweep_spec)
        sw = sweep(cfg, name, values)
        table = sweep_table(sw)
        log(table)
        if out is not None:
            write_atomic(out / "sweep.md", table)
            write_atomic(out / "sweep.json", json.dumps(sw, indent=1, default=str))
            if plots:
                from xrpo.sim.plots import plot_sweep

                log(f"wrote {plot_sweep(sw, out / f'sweep_{name}.png')}")
        return sw
    result = simulate(cfg)
    table = markdown_table(result)
    log(table)
    if out is not None:
        write_atomic(out / "simulate.md", table)
        write_atomic(out / "simulate.json", json.dumps(result, indent=1))
        if plots:
            from xrpo.sim.plots import plot_latency, plot_methods

            log(f"wrote {plot_methods(result, out / 'simulate.png')}")
            log(f"wrote {plot_latency(cfg, out / 'latency.png')}")
        log(f"outputs in {out}: simulate.md, simulate.json" + (", simulate.png, latency.png" if plots else ""))
    return result
