"""The study's numbers: each run's figures (`run_figures`), the learning signal of its rounds (`group_signal`), the
simulator's prediction from GRPO's measured rates (`simulator_prediction`) and everything the page shows, aggregated
over seeds (`aggregate`)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from study_runs import Run
from study_stats import Stat, mean_ci, mean_curve, num, paired_difference, steps_to_target


def eval_keys(runs: Sequence[Run]) -> list[str]:
    """The pass@k / cons@n keys every run's final evaluation has, pass@k by k, then cons@n."""
    common = set.intersection(*(set(r.summary["heldout_after"]) for r in runs)) if runs else set()
    pk = sorted((k for k in common if k.startswith("eval/pass@")), key=lambda k: int(k.split("@")[1]))
    cons = sorted(k for k in common if k.startswith("eval/cons@"))
    return pk + cons


def run_figures(run: Run) -> dict[str, Any]:
    cfg = run.config
    budget = cfg["rollout"]["rollouts_per_step"]
    rows = run.metrics
    # DAPO's dynamic sampling generates whole batches of `budget` rollouts and trains on the kept groups only
    generated = sum(
        r.get("rollout/gen_batches", 1.0) * budget if "rollout/gen_batches" in r else r.get("rollout/count", 0.0)
        for r in rows
    )
    trained = sum(r.get("rollout/count", 0.0) for r in rows)
    tokens = sum(r.get("loss/tokens", 0.0) for r in rows)
    prompt_steps = sum(r.get("rollout/kept_groups", cfg["rollout"]["prompts_per_step"]) for r in rows)
    # planned rounds, one row per (step, round): a resumed run rewrites the rows of the steps it redoes (identically:
    # resume is exact), so the last one is kept
    planned: dict[tuple[int, int], dict] = {}
    for r in run.rounds:
        if r.get("round", 0) > 0:
            planned[(int(r["step"]), int(r["round"]))] = r
    extras = [int(a) for r in planned.values() for a in r["alloc"]]
    seeded = {(step, int(q)) for (step, _), r in planned.items() for q in r.get("seeded", [])}
    x = run.summary.get("xrpo", {})
    wall = sum(s.get("wall_s", 0.0) for s in run.segments) if run.segments else run.summary.get("wall_time_s")
    hist = {float(h["step"]): h for h in run.summary["eval_history"]}
    return {
        "final": {k: v for k, v in run.summary["heldout_after"].items() if k.startswith("eval/")},
        "before": {k: v for k, v in run.summary["heldout_before"].items() if k.startswith("eval/")},
        "history": {s: {k: v for k, v in h.items() if k.startswith("eval/")} for s, h in hist.items()},
        "steps": int(run.summary.get("steps", len(rows))),
        "reward": {int(r["step"]): r["rollout/reward_mean"] for r in rows if "rollout/reward_mean" in r},
        "wall_s": wall,
        "resumed": sum(1 for s in run.segments if s.get("mode") == "resume"),
        "train_s": sum(r.get("time/step", 0.0) for r in rows),
        "generated_rollouts": generated,
        "trained_rollouts": trained,
        "trained_tokens": tokens,
        "generated_tokens": None if any("rollout/gen_batches" in r for r in rows) else tokens,
        "gen_batches": (
            float(np.mean([r["rollout/gen_batches"] for r in rows]))
            if any("rollout/gen_batches" in r for r in rows)
            else None
        ),
        "train_length": float(
            np.mean([r["rollout/response_length_mean"] for r in rows if "rollout/response_length_mean" in r])
        )
        if rows
        else float("nan"),
        "planned_rounds": int(x.get("planned_rounds", 0)),
        "nonuniform_share": float(x.get("nonuniform_round_share", 0.0)),
        "max_extra": float(x.get("max_extra", 0.0)),
        "extras": extras,
        "round_budget": sum(sum(r["alloc"]) for r in planned.values()) / len(planned) if planned else None,
        "prompts_per_round": (len(next(iter(planned.values()))["alloc"]) if planned else None),
        "seeded_prompt_steps": len(seeded),
        "seeded_prompt_rounds": float(x.get("seeded_prompts", 0.0)),
        "flips": float(x.get("flips", 0.0)),
        "sharpened": float(x.get("sharpened", 0.0)),
        "prompt_steps": prompt_steps,
        "icl": bool(cfg["method"].get("icl")),
        "hrp": cfg["method"].get("allocation") == "hrp",
        "signal": group_signal(run.rounds),
    }


def group_signal(rounds: Sequence[dict]) -> dict[str, float] | None:
    """Where a run's rollouts had a learning signal, from its rounds.jsonl: each step's groups (a prompt's rollouts
    over every round of the step: n = sum of its allocations, c = sum of its successes). A group whose rewards all
    agree (c = 0 or c = n) has zero GRPO advantage for every rollout, and sharpening (a bonus capped by kappa * A)
    cannot change that, so a rollout has a non-zero advantage exactly when its group has 0 < c < n.

    Returns, over the run: ``nonzero_share`` (rollouts in groups with reward variance / rollouts generated),
    ``zero_variance_groups`` (share of groups), ``nonzero_per_step`` (rollouts with a non-zero advantage per step),
    ``mixed_groups_per_step`` (groups with reward variance per step: the prompts whose gradient is not zero),
    ``mixed_group_size`` (their mean number of rollouts) and ``update_prompts`` (what the update sees: per step, the
    effective number of prompts (sum w)^2 / sum w^2 over the prompts' weights in the loss, w = the sum of the
    |advantage| of its rollouts, 2 sqrt(n (n - 1) mu (1 - mu)) for a group of n with success rate mu under GRPO's
    sample-std advantage; 0 for a step with no mixed group; mean over steps), or None when the run logged no rounds
    (a resumed step's rows are rewritten identically; the last is kept)."""
    rows: dict[tuple, dict] = {}
    for r in rounds:
        if "successes" not in r or "alloc" not in r:
            continue  # a round logged without its outcomes (older runs): nothing to count
        rows[(int(r["step"]), int(r.get("round", 0)), tuple(r.get("problems") or ()), r.get("batch"))] = r
    groups: dict[tuple[int, str], list[int]] = {}
    for (step, _, problems, batch), r in rows.items():
        ids = list(problems) or [str(i) for i in range(len(r["alloc"]))]
        for pid, n, c in zip(ids, r["alloc"], r["successes"]):
            g = groups.setdefault((step, f"{batch}/{pid}"), [0, 0])
            g[0] += int(n)
            g[1] += int(c)
    if not groups:
        return None
    n = np.array([g[0] for g in groups.values()], dtype=float)
    c = np.array([g[1] for g in groups.values()], dtype=float)
    live = n > 0
    n, c = n[live], c[live]
    mixed = (c > 0) & (c < n)
    step_of = np.array([k[0] for k, g in groups.items() if g[0] > 0])
    steps = len({k[0] for k in groups})
    # a prompt's weight in the update: sum_j |A_j| = 2 sqrt(n (n - 1) mu (1 - mu)) (sample-std advantages)
    mu = np.divide(c, n, out=np.zeros_like(c), where=n > 0)
    w = np.where(mixed, 2.0 * np.sqrt(n * (n - 1.0) * mu * (1.0 - mu)), 0.0)
    ess = []
    for st in sorted(set(step_of.tolist())):
        ws = w[step_of == st]
        ess.append(float(ws.sum() ** 2 / (ws * ws).sum()) if ws.sum() > 0 else 0.0)
    return {
        "nonzero_share": float(n[mixed].sum() / n.sum()),
        "zero_variance_groups": float(1.0 - mixed.mean()),
        "nonzero_per_step": float(n[mixed].sum() / steps),
        "mixed_groups_per_step": float(mixed.sum() / steps),
        "mixed_group_size": float(n[mixed].mean()) if mixed.any() else 0.0,
        "update_prompts": float(np.mean(ess)),
    }


# ================================================================================================ simulator
SIM_METHODS = {
    "uniform": "GRPO",
    "hrp": "HRP proportional",
    "hrp-greedy": "HRP greedy",
    "cures": "CurES",
    "oracle": "best allocation in hindsight",
}


def simulator_prediction(runs: dict[str, list[Run]], steps: int = 1000) -> dict | None:
    """What `xrpo simulate` predicts from the success rates GRPO measured, beside what training showed. For each GRPO
    seed, its rounds.jsonl's per-problem counts (pooled over the run, Beta-mixture fit, as
    ``xrpo simulate --rounds-file``) are simulated with that run's step (prompts, rollouts) and the planning knobs of
    the study's HRP runs (n_base, rounds, alpha, lambda, mode, cap: the first run whose method allocates by HRP),
    seeded by the run's seed. The simulator's ICL is off: its "hrp" is the planner alone, which is what XRPO's
    share would be if ICL-seeded rollouts succeeded exactly as often as plain ones.

    Returns None without GRPO runs that logged per-prompt successes, or without an HRP run; else {"knobs", "fits"
    (one fitted mixture per seed), "methods": {name: {"share": Stat dict of the predicted share of informative
    rollouts over seeds, "vs_uniform": Stat dict of the predicted ratio to uniform}}, "hrp_method": the simulator
    method standing for the HRP runs ("hrp" or "hrp-greedy")}.
    """
    from xrpo.sim.runner import SimConfig, simulate

    hrp_runs = [r for rs in runs.values() for r in rs if r.config.get("method", {}).get("allocation") == "hrp"]
    if not runs.get("grpo") or not hrp_runs:
        return None
    mc = hrp_runs[0].config["method"]
    hrp_name = "hrp-greedy" if mc.get("alloc_mode") == "greedy" else "hrp"
    names = ["uniform", hrp_name, "cures", "oracle"]
    knobs = {
        "n_base": int(mc["n_base"]),
        "rounds": int(mc["plan_rounds"]),
        "alpha": float(mc["alpha"]),
        "lam": float(mc["lam"]),
        "max_extra": mc.get("max_extra_per_prompt"),
    }
    per: dict[str, dict[str, list[float]]] = {m: {"share": [], "ratio": []} for m in names}
    fits = []
    for r in runs["grpo"]:
        ro = r.config.get("rollout", {})
        cfg = SimConfig(
            rounds_file=str(r.path / "rounds.jsonl"),
            methods=names,
            prompts=int(ro["prompts_per_step"]),
            rollouts=int(ro["rollouts_per_step"]),
            steps=steps,
            seed=r.seed,
            **knobs,
        )
        try:
            res = simulate(cfg, latency=False)
        except (ValueError, FileNotFoundError):
            return None  # a run without per-prompt successes: nothing to fit
        fits.append(res["distribution"].get("fitted_dist"))
        for m in names:
            row = res["methods"][m]
            per[m]["share"].append(row["informative_share"]["mean"])
            per[m]["ratio"].append(row["vs_uniform"]["informative_share"]["ratio"])
    return {
        "knobs": {**knobs, "steps": steps},
        "fits": fits,
        "hrp_method": hrp_name,
        "methods": {
            m: {"share": mean_ci(v["share"]).as_dict(), "vs_uniform": mean_ci(v["ratio"]).as_dict()}
            for m, v in per.items()
        },
    }


# ================================================================================================ aggregation
def _stat_of(figs: list[dict], get) -> Stat:
    vals = [get(f) for f in figs]
    return mean_ci([v for v in vals if v is not None and math.isfinite(v)])


def budget_differences(runs: dict[str, list[Run]]) -> dict[str, list]:
    """Config fields (other than the method's knobs, the seed and the output directory) that differ between runs:
    the study gives every method the same budget, so this should be empty."""
    flat: dict[str, set] = {}
    for rs in runs.values():
        for r in rs:
            for sec, val in r.config.items():
                items = val.items() if isinstance(val, dict) else [("", val)]
                for k, v in items:
                    key = f"{sec}.{k}" if k else sec
                    if key.startswith("method.") or key in ("seed", "output"):
                        continue
                    flat.setdefault(key, set()).add(json.dumps(v, sort_keys=True))
    return {k: sorted(v) for k, v in flat.items() if len(v) > 1}


def target_within_noise(target: dict) -> bool:
    """True when the target is GRPO's final pass@1 and GRPO's own gain over its start (final - before, paired by
    seed) has a 95% interval reaching 0: the target is then not told apart from the starting accuracy, and steps to
    it measure seed noise, not speed. Unknown (one seed, or a --target given) is False."""
    g = target.get("grpo_gain")
    if not g or g["mean"] is None or g["ci95"] is None:
        return False
    return g["mean"] - g["ci95"] <= 0


def aggregate(runs: dict[str, list[Run]], *, target: float | None = None, seeds: Sequence[int] = ()) -> dict:
    """Every number the report shows, JSON-ready. ``target`` None: GRPO's final mean pass@1 (see module doc)."""
    all_runs = [r for rs in runs.values() for r in rs]
    keys = eval_keys(all_runs)
    out: dict[str, Any] = {"metrics": keys, "methods": {}, "seeds": list(seeds)}
    figs = {m: [run_figures(r) for r in rs] for m, rs in runs.items()}
    p1 = "eval/pass@1"
    # target rule, fixed in advance
    if target is not None:
        out["target"] = {"value": float(target), "rule": "given with --target"}
    elif "grpo" in figs and p1 in keys:
        out["target"] = {
            "value": float(np.mean([f["final"][p1] for f in figs["grpo"]])),
            "rule": "GRPO's final held-out pass@1, mean over its seeds",
            # GRPO's own gain (final - before, per seed): a target within noise of the start times noise
            "grpo_gain": mean_ci(
                [f["final"][p1] - f["before"][p1] for f in figs["grpo"] if p1 in f["before"]]
            ).as_dict(),
        }
    else:
        out["target"] = {"value": None, "rule": "none: GRPO was not run and --target was not given"}
    tval = out["target"]["value"]

    for m, fs in figs.items():
        seeds_m = [r.seed for r in runs[m]]
        d: dict[str, Any] = {"n": len(fs), "seeds": seeds_m}
        d["final"] = {k: mean_ci([f["final"][k] for f in fs]).as_dict() for k in keys}
        d["final_by_seed"] = {k: dict(zip(seeds_m, [f["final"][k] for f in fs])) for k in keys}
        d["before"] = {k: mean_ci([f["before"][k] for f in fs if k in f["before"]]).as_dict() for k in keys}
        steps, curve = mean_curve([{s: h[p1] for s, h in f["history"].items() if p1 in h} for f in fs])
        d["curve"] = {"steps": steps, "mean": [c.mean for c in curve], "ci95": [num(c.half) for c in curve]}
        rsteps = sorted(set.intersection(*(set(f["reward"]) for f in fs))) if fs else []
        d["reward"] = {"steps": rsteps, "mean": [float(np.mean([f["reward"][s] for f in fs])) for s in rsteps]}
        if tval is not None and steps:
            d["steps_to_target"] = steps_to_target(steps, [c.mean for c in curve], tval)
            d["steps_to_target_by_seed"] = [
                steps_to_target(sorted(f["history"]), [f["history"][s][p1] for s in sorted(f["history"])], tval)
                for f in fs
            ]
        for name in (
            "wall_s",
            "train_s",
            "generated_rollouts",
            "trained_rollouts",
            "trained_tokens",
            "generated_tokens",
            "gen_batches",
            "train_length",
            "planned_rounds",
            "nonuniform_share",
            "max_extra",
            "seeded_prompt_steps",
            "seeded_prompt_rounds",
            "flips",
            "sharpened",
            "prompt_steps",
        ):
            d[name] = _stat_of(fs, lambda f, n=name: f[n]).as_dict()
        d["train_s_per_step"] = _stat_of(fs, lambda f: f["train_s"] / max(f["steps"], 1)).as_dict()
        d["flip_rate"] = _stat_of(
            fs, lambda f: f["flips"] / f["seeded_prompt_steps"] if f["seeded_prompt_steps"] else None
        ).as_dict()
        d["seeded_share"] = _stat_of(
            fs, lambda f: f["seeded_prompt_steps"] / f["prompt_steps"] if f["prompt_steps"] else None
        ).as_dict()
        for name in ("nonzero_share", "zero_variance_groups", "nonzero_per_step"):
            d[name] = _stat_of(fs, lambda f, n=name: f["signal"][n] if f["signal"] else None).as_dict()
        d["eval_length"] = _stat_of(fs, lambda f: f["final"].get("eval/response_length_mean")).as_dict()
        d["eval_truncation"] = _stat_of(fs, lambda f: f["final"].get("eval/truncation_rate")).as_dict()
        d["zero_extra_share"] = _stat_of(
            fs, lambda f: float(np.mean(np.asarray(f["extras"]) == 0)) if f["extras"] else None
        ).as_dict()
        d["extras_hist"] = (
            np.bincount(np.asarray([e for f in fs for e in f["extras"]], dtype=np.int64)).tolist()
            if any(f["extras"] for f in fs)
            else []
        )
        d["round_budget"] = fs[0]["round_budget"]
        d["prompts_per_round"] = fs[0]["prompts_per_round"]
        d["icl"] = any(f["icl"] for f in fs)
        d["hrp"] = any(f["hrp"] for f in fs)
        d["resumed_runs"] = sum(1 for f in fs if f["resumed"])
        d["unreadable_lines"] = sum(r.unreadable_lines for r in runs[m])
        out["methods"][m] = d

    # XRPO against every other method, paired by seed
    if "xrpo" in out["methods"]:
        x = out["methods"]["xrpo"]["final_by_seed"]
        out["paired"] = {
            m: {k: paired_difference(x[k], d["final_by_seed"][k]).as_dict() for k in keys}
            for m, d in out["methods"].items()
            if m != "xrpo"
        }
    # a method not reaching the target vs GRPO's step: speed-up ratios
    g = out["methods"].get("grpo", {}).get("steps_to_target")
    for d in out["methods"].values():
        s = d.get("steps_to_target")
        if g is None or "steps_to_target" not in d:
            d["speedup"] = None
        elif s is None:
            d["speedup"] = {"bound": "<", "value": g / max(d["curve"]["steps"][-1], 1e-12)}
        elif s == 0:
            d["speedup"] = {"bound": "inf", "value": None}
        else:
            d["speedup"] = {"bound": "=", "value": g / s}
    out["budget_differences"] = budget_differences(runs)
    return out


# ================================================================================================ markdown
