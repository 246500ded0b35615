"""Allocation beyond the paper, in training: Knapsack RL and xrpo-plus against GRPO on the study's runs, paired by
seed, beside what `xrpo simulate` predicted from GRPO's own success rates.

    python study/run_study.py --config study/signal.yaml --methods grpo knapsack xrpo-plus --seeds 0 1 2 3 4 \\
        --eval-every 30 --out runs/study33 --doc /tmp/study33.md
    python study/allocation_study.py --out runs/study33 [--json docs/results/allocation_study.json]

Per run (`study_report.group_signal` on its rounds.jsonl): the informative-rollout share (rollouts in groups whose
rewards differ / rollouts generated) and the share of zero-variance groups, over every step and split into the steps
whose prompts were all on their first visit and those whose prompts had all been drawn before (epoch order is
seeded by the run's seed, so every method of a seed draws the same prompts at the same step; a step mixing the two
counts in the total only). Paired by seed against GRPO: the ratio of shares, its mean and Student-t interval over
seeds (xrpo-plus also against Knapsack RL); held-out pass@1 after training, its paired difference.

Prediction: for each GRPO seed, `xrpo simulate --rounds-file` (the success rates GRPO measured, Beta-mixture fit)
with the run's step (prompts, rollouts) for uniform, knapsack and xrpo-plus at the xrpo-plus runs' n_base and
planning rounds, once with no history (``last_visit`` 0) and once with a last visit of rollouts_per_step /
prompts_per_step rollouts (GRPO's group; Knapsack RL's and xrpo-plus's own groups vary around it); the two are
weighted by the share of (step, prompt) draws that had a last visit in the runs. The simulator's ICL is off, as in
`study_report.simulator_prediction`: its xrpo-plus is the planner alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import study_report as report  # noqa: E402

METHODS = ("knapsack", "xrpo-plus")


def visits(rounds: list[dict]) -> dict[int, tuple[int, int]]:
    """step -> (prompts of the step drawn in an earlier step, prompts of the step), from rounds.jsonl's problem ids."""
    by_step: dict[int, set] = {}
    for r in rounds:
        by_step.setdefault(int(r["step"]), set()).update(r.get("problems") or ())
    seen: set = set()
    out = {}
    for s in sorted(by_step):
        ids = by_step[s]
        out[s] = (len(ids & seen), len(ids))
        seen |= ids
    return out


def run_signal(run: report.Run) -> dict:
    """group_signal over every step, the first-visit steps and the revisit steps (module docstring)."""
    v = visits(run.rounds)
    first = {s for s, (old, n) in v.items() if old == 0}
    again = {s for s, (old, n) in v.items() if n and old == n}
    out = {"all": report.group_signal(run.rounds)}
    for name, steps in (("first", first), ("revisit", again)):
        out[name] = report.group_signal([r for r in run.rounds if int(r["step"]) in steps]) if steps else None
    draws = sum(n for _, n in v.values())
    out["history_share"] = sum(old for old, _ in v.values()) / draws if draws else 0.0
    out["steps"] = {"first": len(first), "revisit": len(again), "all": len(v)}
    return out


def paired(runs: dict[str, list[report.Run]]) -> dict:
    """Per method: shares and pass@1 per seed, and their paired comparison with GRPO (module docstring)."""
    sig = {m: {r.seed: run_signal(r) for r in rs} for m, rs in runs.items()}
    p1 = {m: {r.seed: r.summary.get("pass@1_after") for r in rs} for m, rs in runs.items()}
    out: dict = {}
    for m in runs:
        row: dict = {"seeds": sorted(sig[m])}
        for part in ("all", "first", "revisit"):
            shares = {s: g[part]["nonzero_share"] for s, g in sig[m].items() if g[part]}
            zv = {s: g[part]["zero_variance_groups"] for s, g in sig[m].items() if g[part]}
            row[part] = {"share": report.mean_ci(list(shares.values())).as_dict()}
            row[part]["zero_variance_groups"] = report.mean_ci(list(zv.values())).as_dict()
            if m != "grpo" and "grpo" in sig:
                g = {s: x[part]["nonzero_share"] for s, x in sig["grpo"].items() if x[part]}
                gz = {s: x[part]["zero_variance_groups"] for s, x in sig["grpo"].items() if x[part]}
                common = sorted(set(shares) & set(g))
                row[part]["vs_grpo"] = report.mean_ci([shares[s] / g[s] for s in common]).as_dict()
                row[part]["zero_variance_diff"] = report.paired_difference(zv, gz).as_dict()
            if m == "xrpo-plus" and "knapsack" in sig:
                kn = {s: x[part]["nonzero_share"] for s, x in sig["knapsack"].items() if x[part]}
                row[part]["vs_knapsack"] = report.mean_ci(
                    [shares[s] / kn[s] for s in sorted(set(shares) & set(kn))]
                ).as_dict()
        row["steps"] = next(iter(sig[m].values()))["steps"]
        row["history_share"] = float(np.mean([g["history_share"] for g in sig[m].values()]))
        good = {s: v for s, v in p1[m].items() if v is not None}
        row["pass@1_after"] = report.mean_ci(list(good.values())).as_dict()
        if m != "grpo" and "grpo" in p1:
            gp = {s: v for s, v in p1["grpo"].items() if v is not None}
            row["pass@1_diff"] = report.paired_difference(good, gp).as_dict()
        out[m] = row
    return out


def prediction(runs: dict[str, list[report.Run]], steps: int = 1000) -> dict | None:
    """The simulator's ratios to uniform for knapsack and xrpo-plus from GRPO's rates (module docstring)."""
    from xrpo.sim.runner import SimConfig, simulate

    if not runs.get("grpo"):
        return None
    plus = runs.get("xrpo-plus") or runs["grpo"]
    mc = plus[0].config["method"]
    n_base, rounds = int(mc["n_base"]), int(mc["plan_rounds"])
    names = ["uniform", "knapsack", "xrpo-plus"]
    per: dict[str, list[float]] = {m: [] for m in names}
    parts: dict[str, dict[str, list[float]]] = {m: {"first": [], "revisit": []} for m in names}
    for r in runs["grpo"]:
        ro = r.config["rollout"]
        P, B = int(ro["prompts_per_step"]), int(ro["rollouts_per_step"])
        f = run_signal(r)["history_share"]
        share = {}
        for lv in (0, B // P):
            cfg = SimConfig(
                rounds_file=str(r.path / "rounds.jsonl"),
                methods=names,
                prompts=P,
                rollouts=B,
                steps=steps,
                seed=r.seed,
                n_base=n_base,
                rounds=rounds,
                last_visit=lv,
            )
            res = simulate(cfg, latency=False)
            share[lv] = {m: res["methods"][m]["informative_share"]["mean"] for m in names}
        for m in names:
            mixed = (1 - f) * share[0][m] + f * share[B // P][m]
            per[m].append(mixed / ((1 - f) * share[0]["uniform"] + f * share[B // P]["uniform"]))
            parts[m]["first"].append(share[0][m] / share[0]["uniform"])
            parts[m]["revisit"].append(share[B // P][m] / share[B // P]["uniform"])
    return {
        "knobs": {"n_base": n_base, "rounds": rounds, "steps": steps},
        "methods": {
            m: {
                "all": report.mean_ci(per[m]).as_dict(),
                "first": report.mean_ci(parts[m]["first"]).as_dict(),
                "revisit": report.mean_ci(parts[m]["revisit"]).as_dict(),
            }
            for m in names
        },
    }


def _c(d: dict | None, scale: float = 1.0, digits: int = 3) -> str:
    if not d or d.get("mean") is None or not np.isfinite(d["mean"]):
        return "–"
    half = d.get("ci95")
    if half is None:
        return f"{d['mean'] * scale:.{digits}f}"
    return f"{d['mean'] * scale:.{digits}f} ± {half * scale:.{digits}f}"


def markdown(res: dict) -> str:
    P, pred = res["paired"], res.get("prediction") or {"methods": {}}
    lines = [
        "| method | seeds | informative share | × GRPO (paired) | first epoch × GRPO | revisits × GRPO | "
        "predicted × GRPO (all / first / revisits) | zero-variance groups | Δ vs GRPO | held-out pass@1 | "
        "Δ pass@1 vs GRPO |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, row in P.items():
        pm = pred["methods"].get(m)
        pcell = "/".join(_c(pm[k], digits=3).split(" ±")[0] for k in ("all", "first", "revisit")) if pm else "–"
        lines.append(
            f"| {m} | {len(row['seeds'])} | {_c(row['all']['share'])} | {_c(row['all'].get('vs_grpo'))} | "
            f"{_c(row['first'].get('vs_grpo'))} | {_c(row['revisit'].get('vs_grpo'))} | {pcell} | "
            f"{_c(row['all']['zero_variance_groups'])} | {_c(row['all'].get('zero_variance_diff'))} | "
            f"{_c(row['pass@1_after'], 100, 2)} | {_c(row.get('pass@1_diff'), 100, 2)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the study's run directories OUT/<method>/seed<k>")
    ap.add_argument("--methods", nargs="+", default=["grpo", *METHODS])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--sim-steps", type=int, default=1000, help="simulated steps per GRPO seed")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    runs = report.load_runs(Path(args.out), args.methods, args.seeds)
    if "grpo" not in runs:
        print(f"no finished GRPO runs under {args.out}", file=sys.stderr)
        return 2
    res = {"paired": paired(runs), "prediction": prediction(runs, args.sim_steps)}
    print(markdown(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
