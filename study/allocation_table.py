"""Allocation beyond the paper: uniform, HRP, greedy HRP, Knapsack RL (the authors' rule, and the rule read from its
paper's description as knapsack-leftover / knapsack-jeffreys), xrpo-plus (and its ablations) and the best allocation
in hindsight, side by side at equal budget in the allocation simulator.

Two sets of success rates:
    grid       the distributions of `study/share_feasibility.py`'s grid that meet issue #19's regime criteria (68 with
               the default grid), 16 prompts x 128 rollouts, the `xrpo` preset's planning knobs;
    measured   the Beta-mixture fits of GRPO's per-problem success counts that the study report recorded
               (`simulated.fits` of docs/results/results.json: the study, 16 x 128, and
               docs/results_smollm2/results.json: the SmolLM2 slice, 4 x 32), each as `xrpo simulate --dist`, which
               is what `--rounds-file` draws from: the run directories themselves are not kept. One simulation
               per fit, seeded by its position; the mean over fits with a 95% Student-t interval, as the study
               report does.

Every rate is informative rollouts per rollout generated over uniform's (GRPO's), paired on the same steps; knapsack
and xrpo-plus see each prompt's previous visit as `last_visit` (8) rollouts at the same rate (docs/methods.md).

    python study/allocation_table.py --output docs/results/allocation_table      # every part
    python study/allocation_table.py --output DIR --parts grid       # one part (run parts side by side), then
    python study/allocation_table.py --output DIR --parts            # re-render allocation_table.md from DIR/*.json

Writes DIR/<part>.json per part run and DIR/allocation_table.md from the parts present.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import share_feasibility as sf  # noqa: E402

from xrpo.algo.stats import mean_ci  # noqa: E402
from xrpo.sim.runner import SimConfig, simulate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MAIN = ["uniform", "hrp", "hrp-greedy", "knapsack", "xrpo-plus", "oracle"]
ABLATIONS = [
    "knapsack-leftover",
    "knapsack-jeffreys",
    "xrpo-plus-no-history",
    "xrpo-plus-batch-prior",
    "xrpo-plus-variance-prior",
    "xrpo-plus-batch-prior-no-history",
    "xrpo-plus-neighbors",
]
METHODS = MAIN[:-1] + ABLATIONS + MAIN[-1:]
LABEL = {
    "hrp": "HRP (paper, proportional)",
    "hrp-greedy": "HRP greedy",
    "knapsack": "Knapsack RL (authors' code)",
    "knapsack-leftover": "knapsack-leftover (from the description)",
    "xrpo-plus": "**xrpo-plus**",
    "oracle": "best in hindsight",
}
WITHIN = 0.9  # "within 10% of the hindsight bound": ratio >= 0.9 x the oracle's
MEASURED = {"study": "docs/results/results.json", "smollm2": "docs/results_smollm2/results.json"}


def ratios(res: dict) -> dict:
    """Per method: (ratio, ci) of informative rollouts and of non-zero-gradient groups per rollout, over uniform."""
    out = {}
    for m, row in res["methods"].items():
        v = row["vs_uniform"]
        out[m] = {
            "rollouts": [v["informative_share"]["ratio"], v["informative_share"]["ci"]],
            "groups": [v["groups_per_rollout"]["ratio"], v["groups_per_rollout"]["ci"]],
            "share": row["informative_share"]["mean"],
        }
    return out


def run_grid(args) -> dict:
    group = args.rollouts // args.prompts
    grid = [
        sf.mixture_spec(w0, w1, a, b)
        for w0, w1, a, b in itertools.product(args.grid_w0, args.grid_w1, args.grid_ab, args.grid_ab)
        if w0 + w1 < 1
    ]
    rows = []
    for i, spec in enumerate(grid):
        c = sf.criteria(spec, group, args.n_base)
        if not (0.25 <= c["mean"] <= 0.5 and c["zero_var_group"] <= 0.5):
            continue
        res = simulate(SimConfig(dist=spec, methods=args.grid_methods, steps=args.steps, seed=args.seed), latency=False)
        rows.append({"dist": spec, **c, "methods": ratios(res)})
        r = rows[-1]["methods"]
        print(
            f"[{i + 1}/{len(grid)}] {spec}: xrpo-plus {r['xrpo-plus']['rollouts'][0]:.3f}, "
            f"oracle {r['oracle']['rollouts'][0]:.3f}",
            file=sys.stderr,
            flush=True,
        )
    return {"grid_size": len(grid), "steps": args.steps, "methods": args.grid_methods, "rows": rows}


def run_measured(args) -> dict:
    out = {}
    for name, path in MEASURED.items():
        sim = json.loads((ROOT / path).read_text())["simulated"]
        knobs = {k: sim["knobs"][k] for k in ("n_base", "rounds", "alpha", "lam", "max_extra")}
        step = (16, 128) if name == "study" else (4, 32)
        per = []
        for j, spec in enumerate(sim["fits"]):
            cfg = SimConfig(
                dist=spec,
                methods=METHODS,
                prompts=step[0],
                rollouts=step[1],
                steps=args.measured_steps,
                seed=j,
                **knobs,
            )
            per.append(ratios(simulate(cfg, latency=False)))
            print(f"{name} fit {j}: {spec}", file=sys.stderr, flush=True)
        out[name] = {
            "source": path,
            "fits": sim["fits"],
            "prompts": step[0],
            "rollouts": step[1],
            "steps": args.measured_steps,
            "methods": {
                m: {
                    k: list(mean_ci([p[m][k][0] if k != "share" else p[m][k] for p in per]))
                    for k in ("rollouts", "groups", "share")
                }
                for m in METHODS
            },
        }
    return {"sets": out}


def fmt(r) -> str:
    return f"{r[0]:.3f} ± {r[1]:.3f}"


def report(parts: dict) -> str:
    cmds = "; ".join(f"`{d['command']}` ({d['seconds'] / 60:.1f} min)" for d in parts.values())
    lines = [
        "# Allocation beyond the paper (simulated): Knapsack RL and xrpo-plus against HRP and the hindsight bound",
        "",
        f"{cmds}. Ratios: informative rollouts (rollouts in groups whose "
        "rewards are not all equal) per rollout generated, over uniform's (GRPO's), paired on the same simulated "
        "steps, 95% intervals. knapsack and xrpo-plus see each prompt's previous visit: 8 rollouts at the same "
        "rate.",
        "",
    ]
    g = parts.get("grid")
    if g:
        rows = g["rows"]
        lines += [
            f"**The {len(rows)} criteria distributions** (of a {g['grid_size']}-point grid: mean rate in [0.25, 0.5], "
            f"at most half of GRPO's groups of 8 flat; 16 prompts x 128 rollouts, n_base 4, 2 rounds, alpha 0.05, "
            f"lambda 0.1; {g['steps']} steps each). Within 10% of the hindsight bound: the method's ratio at least "
            f"{WITHIN} x the oracle's on that distribution.",
            "",
            "| method | median ratio (informative rollouts) | min | max | distributions reaching 1.20 | within 10% of "
            "hindsight | median ratio (non-zero-gradient groups) |",
            "|---|---|---|---|---|---|---|",
        ]
        for m in [m for m in METHODS if m in g["methods"]][1:]:
            v = np.array([r["methods"][m]["rollouts"][0] for r in rows])
            o = np.array([r["methods"]["oracle"]["rollouts"][0] for r in rows])
            gr = np.array([r["methods"][m]["groups"][0] for r in rows])
            lines.append(
                f"| {LABEL.get(m, m)} | {np.median(v):.3f} | {v.min():.3f} | {v.max():.3f} | "
                f"{int((v >= sf.TARGET).sum())} | {int((v >= WITHIN * o).sum())} | {np.median(gr):.3f} |"
            )
        shown = [m for m in MAIN[1:] if m in g["methods"]]
        lines += [
            "",
            "Per distribution (informative rollouts over uniform's; the ten where the oracle gains most, and the five "
            "where xrpo-plus falls furthest below it):",
            "",
            "| distribution | GRPO share | " + " | ".join(LABEL.get(m, m) for m in shown) + " |",
            "|---|---|" + "---|" * len(shown),
        ]
        by_oracle = sorted(rows, key=lambda r: -r["methods"]["oracle"]["rollouts"][0])[:10]
        worst = sorted(
            rows, key=lambda r: r["methods"]["xrpo-plus"]["rollouts"][0] / r["methods"]["oracle"]["rollouts"][0]
        )[:5]
        for r in by_oracle + [w for w in worst if w not in by_oracle]:
            lines.append(
                f"| `{r['dist']}` | {100 * r['methods']['uniform']['share']:.1f}% | "
                + " | ".join(fmt(r["methods"][m]["rollouts"]) for m in shown)
                + " |"
            )
    meas = parts.get("measured")
    if meas:
        lines += [""]
        for name, d in meas["sets"].items():
            lines += [
                f"**Measured rates: {name}** ({len(d['fits'])} fits of GRPO's per-problem counts from `{d['source']}`, "
                f"{d['prompts']} prompts x {d['rollouts']} rollouts, {d['steps']} steps per fit; mean over fits ± "
                "95% interval).",
                "",
                "| method | informative share | × GRPO: informative rollouts | × GRPO: non-zero-gradient groups |",
                "|---|---|---|---|",
            ]
            for m in METHODS:
                v = d["methods"][m]
                lines.append(
                    f"| {LABEL.get(m, m)} | {100 * v['share'][0]:.1f} ± {100 * v['share'][1]:.1f}% | "
                    f"{fmt(v['rollouts'])} | {fmt(v['groups'])} |"
                )
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", nargs="*", default=["grid", "measured"], choices=["grid", "measured"])
    ap.add_argument("--grid-w0", type=float, nargs="+", default=[0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    ap.add_argument("--grid-w1", type=float, nargs="+", default=[0, 0.1, 0.2])
    ap.add_argument("--grid-ab", type=float, nargs="+", default=[0.3, 0.7, 1.5, 3, 6])
    ap.add_argument(
        "--grid-methods",
        nargs="+",
        default=METHODS,
        choices=METHODS,
        help="methods simulated on the grid (uniform first, oracle included: the ratios need both)",
    )
    ap.add_argument("--steps", type=int, default=100, help="simulated steps per grid distribution")
    ap.add_argument("--measured-steps", type=int, default=300, help="simulated steps per measured fit")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", required=True, help="directory for <part>.json and allocation_table.md")
    args = ap.parse_args(argv)
    if args.grid_methods[0] != "uniform" or "oracle" not in args.grid_methods or "xrpo-plus" not in args.grid_methods:
        ap.error("--grid-methods must start with uniform and include xrpo-plus and oracle")
    base = SimConfig()
    args.prompts, args.rollouts, args.n_base = base.prompts, base.rollouts, base.n_base
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    for part in args.parts:
        t0 = time.perf_counter()
        data = run_grid(args) if part == "grid" else run_measured(args)
        data["seconds"] = time.perf_counter() - t0
        data["command"] = "python study/allocation_table.py " + " ".join(argv)
        (out / f"{part}.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    parts = {
        p: json.loads((out / f"{p}.json").read_text()) for p in ("grid", "measured") if (out / f"{p}.json").is_file()
    }
    text = report(parts)
    (out / "allocation_table.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
