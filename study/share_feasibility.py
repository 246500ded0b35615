"""Can the share target be met on a regime that meets the study's criteria? Answered by the allocation simulator.

The target: XRPO's share of rollouts with a non-zero advantage at least 1.20x GRPO's at equal budget. The regime
criteria that bear on it: held-out pass@1 (the mean success rate) between 0.25 and 0.5, and at most half of the
groups with zero reward variance at the start of training. This script walks a grid of success-rate distributions
(w0 * 0 + w1 * 1 + (1 - w0 - w1) * Beta(a, b): never-solved, always-solved and graded prompts), keeps those that meet
both criteria exactly (:func:`xrpo.sim.model.mixture_moment`, :func:`mixture_zero_variance_share`; the zero-
variance share at GRPO's group size, rollouts / prompts, and reported at n_base too), and runs `xrpo simulate` on
each, with the `xrpo` preset's planning knobs (n_base 4, 2 rounds, alpha 0.05, lambda 0.1, as the paper): HRP
proportional (XRPO's planner), HRP greedy, CurES and the best allocation in hindsight against uniform (GRPO), then
XRPO's planner with ICL seeding of a given strength: an ICL-seeded rollout of a prompt with success rate p succeeds
with probability min(p + add, 1) (`--icl-add`; the regime's tiny model measured add ~ 0).

    python study/share_feasibility.py --output docs/results/share_feasibility     # ~2 min on 2 cores
    python study/share_feasibility.py --steps 100 --grid-w0 0 0.4 --grid-ab 1 3   # a quick look

Writes share_feasibility.md (the tables docs/results.md quotes) and .json (every distribution's figures).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

from xrpo.sim.model import mixture_moment, mixture_zero_variance_share
from xrpo.sim.runner import SimConfig, parse_mixture, simulate

TARGET = 1.20
BASE_METHODS = ["uniform", "hrp", "hrp-greedy", "cures", "oracle"]


def mixture_spec(w0: float, w1: float, a: float, b: float) -> str:
    parts = [f"{w0:g}*0"] if w0 > 0 else []
    parts += [f"{w1:g}*1"] if w1 > 0 else []
    wb = round(1.0 - w0 - w1, 10)
    parts.append(f"{wb:g}*beta({a:g},{b:g})" if parts else f"beta({a:g},{b:g})")
    return " + ".join(parts)


def criteria(spec: str, group: int, n_base: int) -> dict:
    w, comps = parse_mixture(spec)
    return {
        "mean": mixture_moment(w, comps, 1),
        "zero_var_group": mixture_zero_variance_share(w, comps, group),
        "zero_var_base": mixture_zero_variance_share(w, comps, n_base),
    }


def ratio(res: dict, method: str) -> tuple[float, float]:
    r = res["methods"][method]["vs_uniform"]["informative_share"]
    return r["ratio"], r["ci"]


def evaluate(spec: str, args) -> dict:
    cfg = SimConfig(dist=spec, methods=BASE_METHODS, steps=args.steps, seed=args.seed)
    res = simulate(cfg, latency=False)
    row = {
        "dist": spec,
        "uniform_share": res["methods"]["uniform"]["informative_share"]["mean"],
        **{m: ratio(res, m) for m in BASE_METHODS[1:]},
        "icl": {},
    }
    for add in args.icl_add:
        cfg = SimConfig(dist=spec, methods=["uniform", "hrp"], steps=args.steps, seed=args.seed, icl=True, icl_add=add)
        res = simulate(cfg, latency=False)
        row["icl"][f"{add:g}"] = {"hrp": ratio(res, "hrp"), "flip_rate": res["methods"]["hrp"].get("flip_rate", 0.0)}
    return row


def fmt(r: tuple[float, float]) -> str:
    return f"{r[0]:.3f} ± {r[1]:.3f}"


def report(rows: list[dict], args, grid_size: int, measured: dict | None, seconds: float) -> str:
    group = args.rollouts // args.prompts
    lines = [
        "# Can the share target (XRPO ≥ 1.20× GRPO's informative rollouts) be met on a regime that meets the study's "
        "criteria?",
        "",
        f"`python study/share_feasibility.py {' '.join(sys.argv[1:])}` ({seconds / 60:.1f} min). Grid: w0 in "
        f"{args.grid_w0}, w1 in {args.grid_w1}, a and b in {args.grid_ab}: {grid_size} distributions "
        "`w0*0 + w1*1 + (1-w0-w1)*beta(a,b)`, of which "
        f"**{len(rows)}** meet both criteria (mean success rate in [0.25, 0.5]; zero-variance groups at GRPO's group "
        f"size {group} at most 50%). {args.prompts} prompts x {args.rollouts} rollouts per step, the `xrpo` preset's "
        f"planning knobs (n_base {args.n_base}, {args.rounds} rounds, alpha {args.alpha:g}, lambda {args.lam:g}), "
        f"{args.steps} simulated steps per distribution; "
        "ratios are informative rollouts per rollout generated over uniform's (GRPO), paired on the same steps, "
        "with 95% intervals.",
        "",
    ]
    if not rows:
        return "\n".join(lines + ["No distribution of the grid meets the criteria."]) + "\n"
    lines += ["| method | best ratio over the grid | at | distributions reaching 1.20 |", "|---|---|---|---|"]
    for m in BASE_METHODS[1:]:
        best = max(rows, key=lambda r: r[m][0])
        lines.append(f"| {m} | {fmt(best[m])} | `{best['dist']}` | {sum(r[m][0] >= TARGET for r in rows)} |")
    for add in args.icl_add:
        key = f"{add:g}"
        best = max(rows, key=lambda r: r["icl"][key]["hrp"][0])
        n_ok = sum(r["icl"][key]["hrp"][0] >= TARGET for r in rows)
        lines.append(
            f"| hrp + ICL, add {key} (flip rate there {100 * best['icl'][key]['flip_rate']:.1f}%) | "
            f"{fmt(best['icl'][key]['hrp'])} | `{best['dist']}` | {n_ok} |"
        )
    lines += [
        "",
        "The ten distributions where XRPO's planner (hrp, no ICL) gains most:",
        "",
        "| distribution | mean p | zero-var at "
        f"{group} | zero-var at {args.n_base} | GRPO share | hrp | hrp-greedy | cures | oracle | "
        + " | ".join(f"hrp + ICL add {a:g}" for a in args.icl_add)
        + " |",
        "|---|---|---|---|---|---|---|---|---|" + "---|" * len(args.icl_add),
    ]
    for r in sorted(rows, key=lambda r: -r["hrp"][0])[:10]:
        lines.append(
            f"| `{r['dist']}` | {r['mean']:.3f} | {100 * r['zero_var_group']:.1f}% | {100 * r['zero_var_base']:.1f}% | "
            f"{100 * r['uniform_share']:.1f}% | {fmt(r['hrp'])} | {fmt(r['hrp-greedy'])} | {fmt(r['cures'])} | "
            f"{fmt(r['oracle'])} | " + " | ".join(fmt(r["icl"][f"{a:g}"]["hrp"]) for a in args.icl_add) + " |"
        )
    if measured is not None:
        lines += [
            "",
            f"For reference, the study's regime as fitted from GRPO's rounds (`{measured['dist']}`): mean "
            f"{measured['mean']:.3f}, zero-variance groups {100 * measured['zero_var_group']:.1f}% at {group} and "
            f"{100 * measured['zero_var_base']:.1f}% at {args.n_base}; hrp {fmt(measured['hrp'])}, hrp-greedy "
            f"{fmt(measured['hrp-greedy'])}, cures {fmt(measured['cures'])}, oracle {fmt(measured['oracle'])}; "
            + ", ".join(f"hrp + ICL add {a} {fmt(v['hrp'])}" for a, v in measured["icl"].items())
            + ".",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid-w0", type=float, nargs="+", default=[0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    ap.add_argument("--grid-w1", type=float, nargs="+", default=[0, 0.1, 0.2])
    ap.add_argument("--grid-ab", type=float, nargs="+", default=[0.3, 0.7, 1.5, 3, 6])
    ap.add_argument("--icl-add", type=float, nargs="+", default=[0.02, 0.05, 0.1, 0.2])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--measured", default="0.22*0 + 0.03*1 + 0.75*beta(1.25,1.15)", help="a reference distribution")
    ap.add_argument("--output", help="directory for share_feasibility.md and .json")
    args = ap.parse_args(argv)
    # the simulator's defaults are the xrpo preset's step: 16 prompts x 128 rollouts, n_base 4, 2 rounds, ...
    base = SimConfig()
    args.prompts, args.rollouts, args.n_base = base.prompts, base.rollouts, base.n_base
    args.rounds, args.alpha, args.lam = base.rounds, base.alpha, base.lam
    group = args.rollouts // args.prompts
    t0 = time.perf_counter()
    grid = [
        mixture_spec(w0, w1, a, b)
        for w0, w1, a, b in itertools.product(args.grid_w0, args.grid_w1, args.grid_ab, args.grid_ab)
        if w0 + w1 < 1
    ]
    rows = []
    for i, spec in enumerate(grid):
        c = criteria(spec, group, args.n_base)
        if not (0.25 <= c["mean"] <= 0.5 and c["zero_var_group"] <= 0.5):
            continue
        rows.append({**c, **evaluate(spec, args)})
        print(f"[{i + 1}/{len(grid)}] {spec}: hrp {fmt(rows[-1]['hrp'])}", file=sys.stderr, flush=True)
    measured = None
    if args.measured:
        measured = {**criteria(args.measured, group, args.n_base), **evaluate(args.measured, args)}
    text = report(rows, args, len(grid), measured, time.perf_counter() - t0)
    print(text)
    if args.output:
        out = Path(args.output)
        out.mkdir(parents=True, exist_ok=True)
        (out / "share_feasibility.md").write_text(text, encoding="utf-8")
        payload = {"args": {k: v for k, v in vars(args).items() if k != "output"}, "rows": rows, "measured": measured}
        (out / "share_feasibility.json").write_text(json.dumps(payload, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
