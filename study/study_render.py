"""The generated part of docs/results.md (`render_markdown`): one function per section, in the layout of the
paper's tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from study_aggregate import SIM_METHODS, target_within_noise
from study_findings import findings
from study_format import (
    ABLATIONS,
    PAPER_ABLATION,
    PAPER_FLIP,
    PAPER_LENGTH,
    PAPER_MAIN,
    PAPER_MAX_EXTRA,
    PAPER_NONUNIFORM,
    PAPER_QWEN25,
    PAPER_SPEEDUP,
    bold_best,
    fmt_cell,
    fmt_ratio,
    fmt_rel,
    fmt_signed,
    fmt_step,
    md_table,
    method_label,
    metric_label,
    n_note,
)


@dataclass(frozen=True)
class _Page:
    """What every section of the page reads: the aggregate, the run's meta, the figure paths, and the method lists
    derived from them once."""

    agg: dict
    meta: dict
    figures: dict
    M: dict
    keys: list
    order: list
    missing: list
    main: list
    abl_rows: list


def render_markdown(agg: dict, meta: dict, figures: dict[str, str]) -> str:
    """The generated part of docs/results.md: tables in the layout of the paper's, figures, neutral findings; one
    function per section (`SECTIONS`, in page order)."""
    M = agg["methods"]
    order = [m for m in meta["methods"] if m in M]
    page = _Page(
        agg=agg,
        meta=meta,
        figures=figures,
        M=M,
        keys=agg["metrics"],
        order=order,
        missing=[m for m in meta["methods"] if m not in M],
        main=[m for m in order if m not in ABLATIONS],
        abl_rows=[m for m in ("xrpo", *ABLATIONS, "dapo", "treepo-sampling", "treepo") if m in M],
    )
    L: list[str] = []
    for section in SECTIONS:
        L += section(page)
    return "\n".join(L)


def _setup(p: _Page) -> list[str]:
    """The section "Setup of this run"."""
    agg, meta, M, order, missing = p.agg, p.meta, p.M, p.order, p.missing
    L: list[str] = []
    L.append("## Setup of this run")
    L.append("")
    for line in meta.get("setup_lines", []):
        L.append(f"- {line}")
    ran = ", ".join(f"`{m}` ({M[m]['n']} seeds)" for m in order) or "none"
    L.append(f"- Methods run: {ran}.")
    if missing:
        L.append(f"- Methods of the list with no finished run: {', '.join(f'`{m}`' for m in missing)}.")
    if agg["budget_differences"]:
        diffs = "; ".join(f"`{k}`: {', '.join(v)}" for k, v in agg["budget_differences"].items())
        L.append(f"- **Warning: the runs do not share one budget**: {diffs}.")
    resumed = {m: M[m]["resumed_runs"] for m in order if M[m]["resumed_runs"]}
    if resumed:
        L.append(
            "- Runs resumed from a checkpoint (their wall time sums the segments): "
            + ", ".join(f"{m} {n}" for m, n in resumed.items())
            + "."
        )
    bad = {m: M[m]["unreadable_lines"] for m in order if M[m]["unreadable_lines"]}
    if bad:
        L.append(
            "- Unreadable log lines (a process killed mid-write), recovered where possible: "
            + ", ".join(f"{m} {n}" for m, n in bad.items())
            + "."
        )
    L.append("")
    L.append(
        "All accuracies are percentages on the held-out split, mean ± half-width of the 95% Student-t interval "
        "over seeds (no interval with one seed). The paper's numbers come from other models and benchmarks: "
        "compare directions and sizes of differences, not values."
    )
    L.append("")
    return L


def _table1(p: _Page) -> list[str]:
    """The section "Table 1"."""
    agg, M, keys, order, main = p.agg, p.M, p.keys, p.order, p.main
    L: list[str] = []
    L.append("## Table 1: XRPO against the baselines (paper: Table 1; CurES: Table 12; pass@k: Table 13)")
    L.append("")
    header = ["Method"] + [metric_label(k) for k in keys]
    rows, means = [], []
    for m in main:
        rows.append([method_label(m)] + [fmt_cell(M[m]["final"][k]) for k in keys])
        means.append([M[m]["final"][k]["mean"] for k in keys])
    bold_best(rows, means)
    first = M[order[0]] if order else None
    if first is not None:
        rows.append(["*before training*"] + [fmt_cell(first["before"][k]) for k in keys])
    L += md_table(header, rows)
    L.append("")
    L.append(
        f"{n_note(agg, main)}; best mean per column in bold. pass@k: unbiased estimator over the samples per "
        f"problem; cons@n: majority vote over all n samples."
    )
    L.append("")
    prow = [[method_label(m), *(f"{v:.2f}" for v in PAPER_MAIN[m])] for m in main if m in PAPER_MAIN]
    if prow:
        L.append("The paper, Qwen3-1.7B (Table 1, Avg. of AIME'25 / HMMT'25 / BRUMO'25; CurES from Table 12):")
        L.append("")
        L += md_table(["Method", "pass@1", "cons@32"], prow)
        L.append("")
    if "paired" in agg:
        L.append(
            "XRPO minus each method, paired by seed (percentage points; an interval that excludes 0 is a "
            "difference larger than the seed-to-seed noise at 95%):"
        )
        L.append("")
        pk = [k for k in keys if k in ("eval/pass@1",) or k.startswith("eval/cons@")]
        rows = []
        for m in order:
            if m == "xrpo" or m not in agg["paired"]:
                continue
            paper = ""
            if m in PAPER_MAIN:
                a, b = PAPER_MAIN["xrpo"], PAPER_MAIN[m]
                paper = f"{a[0] - b[0]:+.2f} / {a[1] - b[1]:+.2f} (Tab. 1)"
            elif m in PAPER_QWEN25:
                a, b = PAPER_QWEN25["xrpo"], PAPER_QWEN25[m]
                paper = f"{a[0] - b[0]:+.2f} / {a[2] - b[2]:+.2f} (Tab. 6, Qwen2.5-7B)"
            elif m in PAPER_ABLATION:
                a, b = PAPER_ABLATION["xrpo"], PAPER_ABLATION[m]
                paper = f"{a[0] - b[0]:+.2f} / {a[1] - b[1]:+.2f} (Tab. 5)"
            rows.append([f"XRPO − {method_label(m)}"] + [fmt_signed(agg["paired"][m][k]) for k in pk] + [paper or "—"])
        L += md_table(["Difference"] + [metric_label(k) for k in pk] + ["paper pass@1 / cons@32"], rows)
        L.append("")
    return L


def _table2(p: _Page) -> list[str]:
    """The section "Table 2 (GRPO vs XRPO)"."""
    agg, M, keys = p.agg, p.M, p.keys
    L: list[str] = []
    if "grpo" in M and "xrpo" in M:
        L.append("## Table 2: XRPO against GRPO (paper: Table 2; relative gain as in Table 6)")
        L.append("")
        g, x = M["grpo"]["final"], M["xrpo"]["final"]
        rows = [
            ["GRPO"] + [fmt_cell(g[k]) for k in keys],
            ["XRPO"] + [fmt_cell(x[k]) for k in keys],
            ["XRPO − GRPO (paired)"] + [fmt_signed(agg["paired"]["grpo"][k]) for k in keys],
            ["relative gain"] + [fmt_rel(x[k]["mean"], g[k]["mean"]) for k in keys],
        ]
        L += md_table(["Method"] + [metric_label(k) for k in keys], rows)
        L.append("")
        L.append(
            "The paper: Llama-3.2-3B (Table 2, Avg.) GRPO 4.17 / 8.65, XRPO 4.48 / 10.19 (pass@1 / pass@4); "
            "Qwen2.5-7B-Instruct (Table 6) relative gain +10.7% pass@1, +12.6% pass@4, +23.6% cons@32."
        )
        L.append("")
        L.append(
            "Table 4 of the paper (hyperparameter sensitivity) has no counterpart: the study runs each method "
            "with its preset's values only."
        )
        L.append("")
    return L


def _table5(p: _Page) -> list[str]:
    """The section "Table 5 (ablations)"."""
    M, keys, abl_rows = p.M, p.keys, p.abl_rows
    L: list[str] = []
    if any(m in M for m in ABLATIONS):
        L.append("## Table 5: XRPO ablations against the sampling baselines (paper: Table 5 and §4.3)")
        L.append("")
        ak = [k for k in keys if k == "eval/pass@1" or k.startswith("eval/cons@")]
        rows, means = [], []
        for m in abl_rows:
            p = PAPER_ABLATION.get(m)
            rows.append(
                [method_label(m)]
                + [fmt_cell(M[m]["final"][k]) for k in ak]
                + ([f"{p[0]:.2f}", f"{p[1]:.2f}"] if p else ["—", "—"])
            )
            means.append([M[m]["final"][k]["mean"] for k in ak] + [None, None])
        bold_best(rows, means)
        L += md_table(["Method"] + [metric_label(k) for k in ak] + ["paper pass@1", "paper cons@32"], rows)
        L.append("")
        here = [m for m in sorted(abl_rows, key=lambda m: -M[m]["final"]["eval/pass@1"]["mean"])]
        paper = [m for m in sorted((m for m in abl_rows if m in PAPER_ABLATION), key=lambda m: -PAPER_ABLATION[m][0])]
        L.append(f"Order by mean pass@1 here: {' > '.join(method_label(m) for m in here)}.  ")
        L.append(f"Order in the paper (Table 5 and §4.3): {' > '.join(method_label(m) for m in paper)}.")
        L.append("")
    return L


def _steps_to_target(p: _Page) -> list[str]:
    """The section "steps to target"."""
    agg, figures, M, order = p.agg, p.figures, p.M, p.order
    L: list[str] = []
    t = agg["target"]
    L.append('## Steps to target accuracy (paper: §4.2, appendix "Training Dynamics")')
    L.append("")
    if t["value"] is None:
        L.append(f"No target: {t['rule']}.")
    else:
        L.append(
            f"Target: held-out pass@1 = {100 * t['value']:.2f}% ({t['rule']}). Step: where the seed-mean "
            f"validation curve first reaches it, interpolated linearly between validations. Speed-up: GRPO's "
            f"step / the method's step (paper: {PAPER_SPEEDUP})."
        )
        before = [M[m]["before"]["eval/pass@1"]["mean"] for m in order if "eval/pass@1" in M[m]["before"]]
        if before and t["value"] <= max(b for b in before if b is not None):
            L.append("")
            L.append(
                "**The target is not above the accuracy before training**: every method reaches it at step 0 "
                "and the speed-ups say nothing."
            )
        elif target_within_noise(t):
            g = t["grpo_gain"]
            L.append("")
            L.append(
                f"**GRPO's own gain is within seed noise** ({100 * g['mean']:+.2f} ± {100 * g['ci95']:.2f} points, "
                f"final − before, paired over {g['n']} seeds; the interval includes 0): the target cannot be told "
                "apart from the accuracy before training, so the steps below and the speed-ups measure noise, not "
                "speed."
            )
        L.append("")
        rows = []
        for m in order:
            d = M[m]
            if "steps_to_target" not in d:
                continue
            total = d["curve"]["steps"][-1] if d["curve"]["steps"] else 0
            per_seed = ", ".join("—" if s is None else f"{s:.0f}" for s in d["steps_to_target_by_seed"])
            sp = d["speedup"]
            sp_txt = (
                "—"
                if sp is None
                else "∞ (at step 0)"
                if sp["bound"] == "inf"
                else f"< {sp['value']:.2f}×"
                if sp["bound"] == "<"
                else f"{sp['value']:.2f}×"
            )
            rows.append([method_label(m), fmt_step(d["steps_to_target"], total), per_seed, sp_txt])
        L += md_table(["Method", "steps (seed-mean curve)", "steps per seed", "speed-up vs GRPO"], rows)
        L.append("")
    if "curves" in figures:
        L.append(f"![held-out pass@1 during training]({figures['curves']})")
        L.append("")
        L.append(
            "Held-out pass@1 at every validation, mean over seeds with the 95% interval as a band; the dashed "
            "line is the target."
        )
        L.append("")
    if "reward" in figures:
        L.append(f"![training reward]({figures['reward']})")
        L.append("")
        L.append(
            "Mean reward of each step's training rollouts (10-step moving average of the seed mean). Not "
            "comparable across all methods: XRPO's includes its ICL-seeded rollouts, DAPO's only the groups "
            "dynamic sampling kept."
        )
        L.append("")
    return L


def _learning_signal(p: _Page) -> list[str]:
    """The section "learning signal"."""
    agg, M, order = p.agg, p.M, p.order
    L: list[str] = []
    sig = [m for m in order if M[m]["nonzero_share"]["n"]]
    if sig:
        L.append("## Learning signal: rollouts with a non-zero advantage (the share target)")
        L.append("")
        L.append(
            "From each run's rounds.jsonl: a step's group is a prompt's rollouts over every round of the step; a "
            "group whose rewards all agree gives every rollout of it a zero advantage (sharpening's bonus is capped by "
            "kappa times the advantage, so it cannot change that). Share = rollouts in groups with reward variance / "
            "rollouts generated (DAPO: over every generation batch, kept or not)."
        )
        L.append("")
        g = M.get("grpo", {}).get("nonzero_share", {})
        rows = [
            [
                method_label(m),
                fmt_cell(M[m]["nonzero_share"], 100, 1),
                fmt_ratio(M[m]["nonzero_share"]["mean"], g.get("mean"), digits=3, unit="x") if m != "grpo" else "—",
                fmt_cell(M[m]["nonzero_per_step"], 1, 1),
                fmt_cell(M[m]["zero_variance_groups"], 100, 1),
            ]
            for m in sig
        ]
        L += md_table(
            [
                "Method",
                "rollouts with a non-zero advantage (% of generated)",
                "relative to GRPO",
                "per step",
                "groups with zero reward variance (%)",
            ],
            rows,
        )
        L.append("")
        L += _simulated_section(agg, order)
    return L


def _allocation(p: _Page) -> list[str]:
    """The section "allocation"."""
    figures, M, order = p.figures, p.M, p.order
    L: list[str] = []
    hrp = [m for m in order if M[m]["hrp"]]
    if hrp:
        L.append('## Rollout allocation (paper: appendix "Non-Uniform Rollout Allocation Statistics")')
        L.append("")
        d0 = M[hrp[0]]
        even = (
            f"{d0['round_budget']:.0f} extra rollouts over {d0['prompts_per_round']} prompts per round, "
            f"{d0['round_budget'] / d0['prompts_per_round']:.1f} each if split evenly"
            if d0["round_budget"] and d0["prompts_per_round"]
            else ""
        )
        L.append(
            f"A planning round is non-uniform when its allocation differs from an even split of its budget "
            f"({even}). Paper: non-uniform in {100 * PAPER_NONUNIFORM:.1f}% of rounds, 0 to {PAPER_MAX_EXTRA} "
            f"extra rollouts per prompt."
        )
        L.append("")
        rows = [
            [
                method_label(m),
                fmt_cell(M[m]["planned_rounds"], 1, 0),
                fmt_cell(M[m]["nonuniform_share"], 100, 1),
                fmt_cell(M[m]["zero_extra_share"], 100, 1),
                fmt_cell(M[m]["max_extra"], 1, 1),
                f"{len(M[m]['extras_hist']) - 1}" if M[m]["extras_hist"] else "—",
            ]
            for m in hrp
        ]
        L += md_table(
            [
                "Method",
                "planned rounds per run",
                "non-uniform rounds (%)",
                "(prompt, round) pairs with 0 extra (%)",
                "max extra per run",
                "max extra, all runs",
            ],
            rows,
        )
        L.append("")
        if "alloc" in figures:
            L.append(f"![extra rollouts per prompt and round]({figures['alloc']})")
            L.append("")
    return L


def _icl(p: _Page) -> list[str]:
    """The section "ICL"."""
    M, order = p.M, p.order
    L: list[str] = []
    icl = [m for m in order if M[m]["icl"]]
    if icl:
        L.append("## ICL seeding (paper: §4.3, ICL success-rate figure)")
        L.append("")
        L.append(
            "A *hard prompt* here is a (step, prompt) pair that had no correct rollout before a planning round "
            "and got an ICL prompt in that round (its corpus had neighbours and the round gave it extra "
            "rollouts): its *seeded prompt-steps*, counted once per step even when seeded in both rounds. A "
            "*flip* is such a pair whose ICL rollouts include a correct one (at most one per pair: a flipped "
            "prompt is solved and not seeded again). Flip rate = flips / seeded prompt-steps. Hard prompts "
            "that got no extra rollouts or found no neighbours are not in the denominator (the trainer does "
            f"not log them). Paper: ICL flips {PAPER_FLIP}."
        )
        L.append("")
        rows = [
            [
                method_label(m),
                fmt_cell(M[m]["prompt_steps"], 1, 0),
                fmt_cell(M[m]["seeded_prompt_steps"], 1, 0),
                fmt_cell(M[m]["seeded_share"], 100, 1),
                fmt_cell(M[m]["flips"], 1, 1),
                fmt_cell(M[m]["flip_rate"], 100, 2),
                fmt_cell(M[m]["sharpened"], 1, 0),
            ]
            for m in icl
        ]
        L += md_table(
            [
                "Method",
                "trained prompt-steps per run",
                "seeded prompt-steps per run",
                "seeded share (%)",
                "flips per run",
                "flip rate (%)",
                "sharpened advantages per run",
            ],
            rows,
        )
        L.append("")
    return L


def _lengths(p: _Page) -> list[str]:
    """The section "lengths (Table 3)"."""
    M, order = p.M, p.order
    L: list[str] = []
    L.append("## Response length (paper: Table 3)")
    L.append("")
    rows = [
        [
            method_label(m),
            fmt_cell(M[m]["train_length"], 1, 2),
            fmt_cell(M[m]["eval_length"], 1, 2),
            fmt_cell(M[m]["eval_truncation"], 100, 2),
        ]
        for m in order
    ]
    L += md_table(
        ["Method", "training rollouts (tokens, mean over steps)", "held-out, final (tokens)", "held-out truncated (%)"],
        rows,
    )
    L.append("")
    if "xrpo" in M and "xrpo-no-icl" in M:
        a, b = M["xrpo"]["train_length"]["mean"], M["xrpo-no-icl"]["train_length"]["mean"]
        L.append(f"Training response length, XRPO vs XRPO w/o ICL: {fmt_rel(a, b)} (paper: {PAPER_LENGTH}).")
        L.append("")
    return L


def _cost(p: _Page) -> list[str]:
    """The section "cost"."""
    M, order = p.M, p.order
    L: list[str] = []
    L.append("## Cost per run")
    L.append("")
    g = M.get("grpo")
    rows = []
    for m in order:
        d = M[m]
        ratio = fmt_ratio(d["wall_s"]["mean"], g["wall_s"]["mean"]) if g else "—"
        sratio = fmt_ratio(d["train_s_per_step"]["mean"], g["train_s_per_step"]["mean"]) if g else "—"
        rows.append(
            [
                method_label(m),
                fmt_cell(d["wall_s"], 1, 0),
                ratio,
                fmt_cell(d["train_s_per_step"], 1, 3),
                sratio,
                fmt_cell(d["generated_rollouts"], 1, 0),
                fmt_cell(d["trained_rollouts"], 1, 0),
                fmt_cell(d["generated_tokens"], 1, 0),
                fmt_cell(d["trained_tokens"], 1, 0),
                fmt_cell(d["gen_batches"], 1, 2),
            ]
        )
    L += md_table(
        [
            "Method",
            "wall (s)",
            "wall / GRPO",
            "train step (s)",
            "step / GRPO",
            "generated rollouts",
            "trained rollouts",
            "generated tokens",
            "trained tokens",
            "generation batches per step",
        ],
        rows,
    )
    L.append("")
    L.append(
        "Wall: the whole `xrpo train` process (model load, validations, checkpoints included; the sum of its "
        "segments when resumed). Train step: mean of `time/step` (rollouts, update; no validation). Generated "
        "tokens are completion tokens; DAPO's are not logged for the groups it drops (—). Timings depend on "
        "what else ran on the machine: see the load in the setup above."
    )
    L.append("")
    return L


def _findings_list(p: _Page) -> list[str]:
    """The section "findings (neutral)"."""
    agg, order = p.agg, p.order
    L: list[str] = []
    L.append("## Findings (generated from the numbers above)")
    L.append("")
    for f in findings(agg, order):
        L.append(f"- {f}")
    L.append("")
    return L


SECTIONS = (
    _setup,
    _table1,
    _table2,
    _table5,
    _steps_to_target,
    _learning_signal,
    _allocation,
    _icl,
    _lengths,
    _cost,
    _findings_list,
)
"""The page's sections in order."""


def _simulated_section(agg: dict, order: Sequence[str]) -> list[str]:
    """The simulator's prediction from GRPO's measured success rates beside the measured shares."""
    sim = agg.get("simulated")
    if not sim:
        return []
    M, P, k = agg["methods"], sim["methods"], sim["knobs"]
    g = M.get("grpo", {}).get("nonzero_share", {})
    fits = sorted({f for f in sim["fits"] if f})
    L = [
        "What `xrpo simulate` predicts from GRPO's own success rates (each GRPO seed's rounds.jsonl, per-problem "
        "counts pooled over the run and fitted as a Beta mixture, as `xrpo simulate --rounds-file`; fits: "
        + "; ".join(f"`{f}`" for f in fits)
        + f"), with the HRP runs' knobs (n_base {k['n_base']}, {k['rounds']} rounds, alpha {k['alpha']:g}, lambda "
        f"{k['lam']:g}), {k['steps']} simulated steps per seed, mean over GRPO's seeds. The simulator's HRP has no "
        "ICL effect: an ICL-seeded rollout succeeding as often as a plain one. No learning happens in the simulator.",
        "",
    ]
    rows = []
    for name, measured in (
        ("uniform", ["grpo"]),
        (sim["hrp_method"], [m for m in order if M[m]["hrp"]]),
        ("cures", [m for m in order if m == "cures"]),
        ("oracle", []),
    ):
        pred = P[name]
        pred_cells = [fmt_cell(pred["share"], 100, 1), fmt_cell(pred["vs_uniform"], 1, 3) if name != "uniform" else "—"]
        label = SIM_METHODS[name]
        if not measured:
            rows.append([label, *pred_cells, "—", "—", "—"])
        for m in measured:
            if not M[m]["nonzero_share"]["n"]:
                continue
            rel = fmt_ratio(M[m]["nonzero_share"]["mean"], g.get("mean"), digits=3, unit="x") if m != "grpo" else "—"
            rows.append([label, *pred_cells, method_label(m), fmt_cell(M[m]["nonzero_share"], 100, 1), rel])
    L += md_table(
        [
            "allocation (simulated)",
            "predicted share (% of generated)",
            "predicted × GRPO",
            "measured by",
            "measured share (% of generated)",
            "measured × GRPO",
        ],
        rows,
    )
    L.append("")
    return L
