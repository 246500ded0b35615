"""The page's findings: neutral sentences generated from the aggregated numbers."""

from __future__ import annotations

from collections.abc import Sequence

from study_aggregate import target_within_noise
from study_format import (
    ABLATIONS,
    PAPER_ABLATION,
    excludes_zero,
    fmt_cell,
    fmt_ratio,
    fmt_signed,
    method_label,
    metric_label,
)


def findings(agg: dict, order: Sequence[str]) -> list[str]:
    """Neutral statements read off the aggregated numbers (no interpretation)."""
    M, out = agg["methods"], []
    p1 = "eval/pass@1"
    if p1 not in agg["metrics"] or not order:
        return ["No pass@1 figures."]
    cons = [k for k in agg["metrics"] if k.startswith("eval/cons@")]
    best = max(order, key=lambda m: M[m]["final"][p1]["mean"])
    out.append(f"Highest mean held-out pass@1: {method_label(best)} ({fmt_cell(M[best]['final'][p1])}).")
    if cons:
        bc = max(order, key=lambda m: M[m]["final"][cons[0]]["mean"])
        out.append(
            f"Highest mean held-out {metric_label(cons[0])}: {method_label(bc)} ({fmt_cell(M[bc]['final'][cons[0]])})."
        )
    for m, diffs in agg.get("paired", {}).items():
        parts = []
        for k in [p1] + cons[:1]:
            d = diffs[k]
            if d["n"] == 0:
                continue
            ex = excludes_zero(d)
            verdict = (
                "one seed, no interval"
                if ex is None
                else "the interval excludes 0"
                if ex
                else "the interval includes 0"
            )
            parts.append(f"{metric_label(k)} {fmt_signed(d)} ({verdict})")
        if parts:
            out.append(f"XRPO − {method_label(m)}: " + "; ".join(parts) + f", over {diffs[p1]['n']} paired seeds.")
    ab = [m for m in ("xrpo", *ABLATIONS) if m in M]
    if len(ab) > 1:
        here = sorted(ab, key=lambda m: -M[m]["final"][p1]["mean"])
        paper = sorted(ab, key=lambda m: -PAPER_ABLATION[m][0])
        same = "the same as" if here == paper else "different from"
        out.append(
            f"Ablation order by mean pass@1: {' > '.join(method_label(m) for m in here)}; {same} the paper's "
            f"({' > '.join(method_label(m) for m in paper)})."
        )
    if "xrpo" in M and M["xrpo"].get("speedup"):
        sp = M["xrpo"]["speedup"]
        s = M["xrpo"]["steps_to_target"]
        g = M["grpo"]["steps_to_target"]
        if sp["bound"] == "=":
            out.append(
                f"XRPO reached the target pass@1 at step {s:.1f}, GRPO at {g:.1f}: {sp['value']:.2f}× "
                f"(paper: 2.4–2.7×)."
            )
        elif sp["bound"] == "<":
            out.append(f"XRPO did not reach the target pass@1 within the run; GRPO reached it at step {g:.1f}.")
        else:
            out.append("XRPO was at or above the target pass@1 before training.")
        if sp["bound"] != "inf" and target_within_noise(agg["target"]):
            out[-1] += " GRPO's own gain is within seed noise, so this is not a difference in speed."
    if "xrpo" in M and M["xrpo"]["hrp"]:
        out.append(
            f"XRPO's allocation was non-uniform in {fmt_cell(M['xrpo']['nonuniform_share'], 100, 1)}% of "
            f"planning rounds (paper: 91.6%); largest extra allocation to one prompt in one round: "
            f"{len(M['xrpo']['extras_hist']) - 1 if M['xrpo']['extras_hist'] else 0} (paper: 7)."
        )
    if "xrpo" in M and M["xrpo"]["icl"]:
        out.append(
            f"XRPO's ICL flip rate: {fmt_cell(M['xrpo']['flip_rate'], 100, 2)}% of seeded prompt-steps "
            f"(paper: 4.2–6.2% of hard questions)."
        )
    if "grpo" in M and "xrpo" in M:
        x, g = M["xrpo"], M["grpo"]
        wall = fmt_ratio(x["wall_s"]["mean"], g["wall_s"]["mean"])
        step = fmt_ratio(x["train_s_per_step"]["mean"], g["train_s_per_step"]["mean"])
        out.append(
            f"XRPO's wall time per run was {wall}× GRPO's, its mean training step {step}× (paper: 1.047× per step)."
        )
    return out


# ================================================================================================ figures
