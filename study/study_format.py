"""What the study's page is written with: the methods' labels, the paper's numbers it quotes, and the formatting of
cells and tables."""

from __future__ import annotations

from collections.abc import Sequence

from study_stats import Stat

ABLATIONS = ("xrpo-no-icl", "xrpo-no-as", "xrpo-no-as-icl", "xrpo-no-hrp")
LABELS = {
    "grpo": "GRPO",
    "dapo": "DAPO",
    "gspo": "GSPO",
    "treepo-sampling": "TreePO sampling (TPO-S)",
    "treepo": "TreePO (tree sampling + tree advantage)",
    "cures": "CurES",
    "xrpo": "XRPO",
    "xrpo-no-icl": "XRPO w/o ICL",
    "xrpo-no-as": "XRPO w/o AS",
    "xrpo-no-as-icl": "XRPO w/o AS+ICL",
    "xrpo-no-hrp": "XRPO w/o HRP",
    "xrpo-gspo": "XRPO + GSPO",
    "dr_grpo": "Dr. GRPO",
    "grpo-deepseekmath": "GRPO (DeepSeekMath)",
    "knapsack": "Knapsack RL",
    "xrpo-plus": "xrpo-plus",
}

# What the paper reports, in percent (XRPO: "Pushing the limits of GRPO with Targeted Exploration and
# Exploitation"). Models and benchmarks differ from this study's; these are for reading the direction and size of
# differences, not for equality.
PAPER_MAIN = {  # Table 1 (Qwen3-1.7B, Avg. over AIME'25, HMMT'25, BRUMO'25): (pass@1, cons@32); CurES: Table 12
    "gspo": (33.23, 41.11),
    "dapo": (30.94, 33.33),
    "treepo-sampling": (26.91, 33.33),
    "cures": (31.98, 32.22),
    "xrpo": (35.13, 45.56),
}
PAPER_QWEN25 = {  # Table 6 (Qwen2.5-7B-Instruct, Avg. over AIME'24, AIME'25, BRUMO'25): (pass@1, pass@4, cons@32)
    "grpo": (10.96, 19.90, 16.67),
    "dapo": (11.70, 21.50, 17.78),
    "treepo-sampling": (11.08, 20.16, 16.67),
    "xrpo": (12.05, 22.41, 20.00),
}
PAPER_ABLATION = {  # Table 5 (Qwen3-1.7B, Avg. over AIME'24, AIME'25, HMMT'25, BRUMO'25): (pass@1, cons@32);
    # w/o HRP from §4.3's text ("drops pass@1 from 37.81 to 35.10 and cons@32 from 47.50 to 45.83")
    "xrpo": (37.81, 47.50),
    "xrpo-no-as": (34.35, 45.00),
    "xrpo-no-icl": (36.87, 43.33),
    "xrpo-no-as-icl": (34.32, 41.67),
    "xrpo-no-hrp": (35.10, 45.83),
    "dapo": (33.28, 35.83),
    "treepo-sampling": (29.77, 37.50),
}
PAPER_PASSK = {  # Table 13 (Qwen3-1.7B, avg. of AIME'25, HMMT'25, BRUMO'25): pass@4, pass@8, pass@16, pass@32
    "gspo": (46.09, 52.01, 57.60, 62.22),
    "dapo": (42.37, 47.50, 52.14, 56.67),
    "treepo-sampling": (40.18, 47.16, 54.69, 63.33),
    "xrpo": (48.65, 55.92, 62.07, 65.56),
}
PAPER_SPEEDUP = (
    "2.4× (GSM8K, 82.5% at step 420 vs ≈1K) and 2.7× (MATH-500, 75% at step 450 vs ≈1.2K); "
    "§4.2 and the appendix on training dynamics"
)
PAPER_NONUNIFORM = (
    0.916  # appendix on non-uniform allocation: "HRP produces non-uniform allocations in 91.6% of training rounds"
)
PAPER_MAX_EXTRA = 7  # same appendix: "per-prompt budgets ranging from 0 to 7 extra rollouts"
PAPER_FLIP = "6.2% (Qwen2.5-7B-Instruct) and 4.2% (Qwen3-1.7B) of hard questions (§4.3, the ICL success-rate figure)"
PAPER_LENGTH = "ICL shortens responses by 6.17% (Qwen2.5) and 34.7% (Qwen3) (Table 3)"


def method_label(m: str) -> str:
    return LABELS.get(m, m)


def metric_label(k: str) -> str:
    return k.split("/", 1)[1]


def fmt_cell(d: dict, scale: float = 100.0, digits: int = 2) -> str:
    return Stat(
        d["mean"] if d["mean"] is not None else float("nan"),
        d["ci95"] if d["ci95"] is not None else float("nan"),
        d["n"],
    ).fmt(scale, digits)


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def bold_best(rows: list[list[str]], means: list[list[float | None]], first_col: int = 1) -> None:
    if not means:
        return
    for j in range(len(means[0])):
        col = [row[j] for row in means]
        valid = [v for v in col if v is not None]
        if len(valid) < 2:
            continue
        best = max(valid)
        for i, v in enumerate(col):
            if v is not None and v == best:
                rows[i][first_col + j] = f"**{rows[i][first_col + j]}**"


def n_note(agg: dict, methods: Sequence[str]) -> str:
    ns = sorted({agg["methods"][m]["n"] for m in methods if m in agg["methods"]})
    return "n = " + "/".join(str(n) for n in ns) + " seeds"


def fmt_step(s: float | None, total: float) -> str:
    if s is None:
        return f"not reached in {total:g}"
    return f"{s:.1f}"


def fmt_signed(d: dict) -> str:
    if d["n"] == 0 or d["mean"] is None:
        return "—"
    s = f"{100 * d['mean']:+.2f}"
    return s if d["ci95"] is None else f"{s} ± {100 * d['ci95']:.2f}"


def fmt_rel(a, b) -> str:
    if a is None or b is None or not b:
        return "—"
    return f"{100 * (a - b) / b:+.1f}%"


def fmt_ratio(a, b, digits: int = 2, unit: str = "") -> str:
    if a is None or b is None or not b:
        return "—"
    return f"{a / b:.{digits}f}{unit}"


def excludes_zero(d: dict) -> bool | None:
    if d["n"] < 2 or d["ci95"] is None:
        return None
    return abs(d["mean"]) > d["ci95"]
