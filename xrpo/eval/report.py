"""Human-readable outputs: the Markdown table of `xrpo eval` (the layout of the paper's tables) and
`xrpo report RUN_DIR`, one page (report.md, and report.html with the plots embedded) built from a training run's logs:

    training reward        rollout/reward_mean and rollout/solved_prompt_frac per step     (metrics.jsonl)
    held-out accuracy      eval/pass@k and eval/cons@n at each validation                  (eval.jsonl)
    allocation             extra rollouts per prompt, one histogram per planning round     (rounds.jsonl)
    ICL seeding            seeded prompts and flips per step, cumulative flips             (metrics.jsonl)
    advantage sharpening   sharpened advantages per step                                   (metrics.jsonl)
    step time              time/generate, verify, plan, retrieve, old_logprobs, update per step, and the rest

A section whose metrics the run did not log (GRPO has no allocation rounds or ICL) says so instead of a plot. The
facts at the top count the whole run: wall time, rollouts and tokens over every segment of a resumed run (from
summary.json, or the latest checkpoint while the run is unfinished); the *.discarded.jsonl files a resume set aside
are not read.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from xrpo.algo.config import is_int
from xrpo.rundir.rounds import check_round_entry

__all__ = ["make_report", "results_markdown"]


# ================================================================================================ eval table
def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def results_markdown(results: Mapping, *, title: bool = True) -> str:
    """results.json -> a Markdown table: datasets as columns (plus Avg.), pass@k / cons@n rows, then length,
    truncation and no-answer rows (the layout of the paper's Tables 1-2)."""
    s = results["settings"]
    names = list(results["datasets"])
    n = results["n"]
    rows = [(f"pass@{k}", f"pass@{k}", _pct) for k in results["ks"]]
    if f"cons@{n}" in results["average"]:
        rows.append((f"cons@{n}", f"cons@{n}", _pct))
    rows += [
        ("mean response length (tokens)", "response_length_mean", lambda x: f"{x:.1f}"),
        ("truncated (%)", "truncation_rate", _pct),
        ("no answer found (%)", "no_answer_rate", _pct),
    ]
    lines = []
    if title:
        lines += [f"# xrpo eval: {results['model']}", ""]
    if s["greedy"]:
        how = f"greedy decoding, max {s['max_new_tokens']} new tokens"
    else:
        how = (
            f"n = {n} samples per problem, temperature {s['temperature']:g}, top-p {s['top_p']:g}, "
            f"max {s['max_new_tokens']} new tokens, seed {s['seed']}"
        )
    icl = f"; test-time ICL from {s['icl_corpus']} (k = {s['icl_k']})" if s.get("icl_corpus") else ""
    lines += [
        f"{how}; verifier `{s['verifier']}`{icl}. pass@k (unbiased estimator) and cons@{n} (majority vote "
        f"over parsed answers) in %.",
        "",
    ]
    lines.append("| Metric | " + " | ".join(names) + " | Avg. |")
    lines.append("|---|" + "---:|" * (len(names) + 1))
    for label, key, fmt in rows:
        vals = [fmt(results["datasets"][d]["metrics"][key]) for d in names]
        lines.append(f"| {label} | " + " | ".join(vals) + f" | {fmt(results['average'][key])} |")
    if "unsampled_problems" in results["average"]:
        lines.append(
            "| prompt over the context: unsolved (Avg.: total) | "
            + " | ".join(f"{results['datasets'][d]['metrics']['unsampled_problems']:.0f}" for d in names)
            + f" | {results['average']['unsampled_problems']:.0f} |"
        )
    counts = [results["datasets"][d]["num_problems"] for d in names]
    lines.append("| problems (Avg.: total) | " + " | ".join(str(c) for c in counts) + f" | {sum(counts)} |")
    return "\n".join(lines) + "\n"


# ================================================================================================ run report
class _Page:
    """A page as blocks, rendered to Markdown and to self-contained HTML."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, object]] = []

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", (level, text)))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(("table", (header, rows)))

    def img(self, path: Path, alt: str) -> None:
        self.blocks.append(("img", (path, alt)))

    def markdown(self, base: Path) -> str:
        out = []
        for kind, v in self.blocks:
            if kind == "h":
                out.append("#" * v[0] + " " + v[1])
            elif kind == "p":
                out.append(v)
            elif kind == "table":
                header, rows = v
                out.append(
                    "\n".join(
                        ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                        + ["| " + " | ".join(r) + " |" for r in rows]
                    )
                )
            else:
                out.append(f"![{v[1]}]({os.path.relpath(v[0], base)})")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        out = [
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
            "body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}"
            "td:first-child,th:first-child{text-align:left}img{max-width:100%}</style></head><body>"
        ]
        for kind, v in self.blocks:
            if kind == "h":
                out.append(f"<h{v[0]}>{html.escape(v[1])}</h{v[0]}>")
            elif kind == "p":
                out.append(f"<p>{html.escape(v).replace('`', '')}</p>")
            elif kind == "table":
                header, rows = v
                out.append(
                    "<table><tr>"
                    + "".join(f"<th>{html.escape(h)}</th>" for h in header)
                    + "</tr>"
                    + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
                    + "</table>"
                )
            else:
                data = base64.b64encode(Path(v[0]).read_bytes()).decode()
                out.append(f"<img alt='{html.escape(v[1])}' src='data:image/png;base64,{data}'>")
        return "\n".join(out) + "\n</body></html>\n"


# ------------------------------------------------------------------------------------------ reading a run's files
# What the page reads from each file is checked as it is read: a damaged or hand-edited file fails naming the file,
# the line and the field, not deep inside a plot.
TIME_PARTS = ("time/generate", "time/verify", "time/plan", "time/retrieve", "time/old_logprobs", "time/update")
METRIC_KEYS = (
    "rollout/reward_mean",
    "rollout/solved_prompt_frac",
    "rollout/count",
    "loss/tokens",
    "icl/seeded_prompts",
    "icl/flips",
    "adv/sharpened_count",
    "time/step",
    *TIME_PARTS,
)
_EVAL_KEY = re.compile(r"eval/(pass|cons)@(\d+)")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_numbers(mapping: dict, keys, where: str, *, null: bool = True) -> None:
    for key in keys:
        if key in mapping and not (_is_number(mapping[key]) or (null and mapping[key] is None)):
            raise ValueError(f"{where}: field {key!r} must be a number, got {mapping[key]!r}")


def _read_records(path: Path, check=None) -> list[dict]:
    """The rows of one of the run's JSONL records (`read_lines`' rules: a last line cut short by a kill is skipped):
    JSON objects with an integer ``step``, each also passed to ``check(row, where)``."""
    from xrpo.rundir.jsonl import read_lines

    rows = []
    for ln in read_lines(path, strict=True)[0]:
        row, where = ln.row, f"{path} line {ln.number}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        if not is_int(row.get("step")):
            raise ValueError(f"{where}: field 'step' must be an integer, got {row.get('step')!r}")
        if check is not None:
            check(row, where)
        rows.append(row)
    return rows


def _check_metrics(row: dict, where: str) -> None:
    _check_numbers(row, METRIC_KEYS, where)


def _check_eval(row: dict, where: str) -> None:
    _check_numbers(row, [k for k in row if _EVAL_KEY.fullmatch(k)], where)


def _check_round(row: dict, where: str) -> None:
    planned = is_int(row.get("round")) and row["round"] > 0  # a planning round: the allocation section plots "alloc"
    check_round_entry(row, where, require=("alloc",) if planned else ())


def _check_segments(segments, where: str) -> list[dict]:
    if not isinstance(segments, list):
        raise ValueError(f"{where}: field 'segments' must be a list of objects, got {segments!r}")
    for i, seg in enumerate(segments):
        if not isinstance(seg, dict):
            raise ValueError(f"{where}: segments[{i}] must be an object, got {seg!r}")
        for key in ("start_step", "end_step"):
            if not is_int(seg.get(key)):
                raise ValueError(f"{where}: segments[{i}].{key} must be an integer, got {seg.get(key)!r}")
        if not _is_number(seg.get("wall_time_s")):
            raise ValueError(f"{where}: segments[{i}].wall_time_s must be a number, got {seg.get('wall_time_s')!r}")
        _check_numbers(seg, ("discarded_time_s", "discarded_steps"), f"{where}: segments[{i}]", null=False)
    return segments


def _read_summary(path: Path) -> dict:
    """summary.json ({} when absent): a JSON object whose figures the page shows are numbers."""
    if not path.exists():
        return {}
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not JSON, not UTF-8
        raise ValueError(f"{path}: unreadable ({e}); expected the JSON object xrpo train writes") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(summary).__name__}")
    keys = ("rollouts", "tokens", "wall_time_s", "pass@1_before", "pass@1_after", "discarded_time_s", "discarded_steps")
    _check_numbers(summary, keys, str(path))
    if summary.get("segments") is not None:
        _check_segments(summary["segments"], str(path))
    return summary


def _read_config(path: Path) -> dict:
    """The run's config.yaml ({} when absent), as far as the page reads it: a mapping of sections."""
    if not path.exists():
        return {}
    from xrpo.rundir.yamlfile import read_yaml

    config = read_yaml(path) or {}
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a mapping of config sections, got {type(config).__name__}")
    for section in ("method", "model", "data"):
        if config.get(section) is not None and not isinstance(config[section], dict):
            raise ValueError(f"{path}: section {section!r} must be a mapping, got {config[section]!r}")
    return config


def _last_per_step(rows: list[dict]) -> list[dict]:
    """One metrics row per step, the last written, in step order (the runs of an xrpo before issue #21 logged the
    steps redone after a resume twice)."""
    by_step = {r["step"]: r for r in rows}
    return [by_step[s] for s in sorted(by_step)]


def _checkpoint_segments(run: Path) -> list[dict]:
    """The segments as of the latest checkpoint, for a run without summary.json (running, or killed)."""
    from xrpo.rundir.checkpoints import CheckpointError, list_checkpoints, load_state

    found = list_checkpoints(run)
    if not found:
        return []
    try:
        segments = load_state(found[-1]).get("segments", [])
    except CheckpointError:
        return []
    return _check_segments(segments, str(found[-1] / "state.json"))


def _segment_facts(segments: list[dict], summary: dict) -> list[list[str]]:
    """Wall time over every segment (one per `xrpo train` process) and how many the run had; the work resumes set
    aside (summary.json's totals; while unfinished, what the checkpoint's segments recorded)."""
    wall = sum(s["wall_time_s"] for s in segments)
    lost = summary.get("discarded_time_s", sum(s.get("discarded_time_s", 0.0) for s in segments))
    redone = summary.get("discarded_steps", sum(s.get("discarded_steps", 0) for s in segments))
    finished = bool(summary)
    upto = "" if finished else f" up to the checkpoint of step {segments[-1]['end_step']}"
    facts = [["wall time", f"{wall:.0f} s{upto}" + (f" over {len(segments)} segments" if len(segments) > 1 else "")]]
    if len(segments) > 1:
        text = f"{len(segments)}: steps " + ", ".join(f"{s['start_step']}->{s['end_step']}" for s in segments)
        if lost:
            text += (
                f"; {redone} steps and {lost:.1f} s of logged work after a checkpoint were set aside on resume "
                f"(*.discarded.jsonl) and are not in the wall time"
            )
        facts.append(["segments", text])
    return facts


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if key in r and r[key] is not None]
    return [p[0] for p in pts], [float(p[1]) for p in pts]


def make_report(
    run_dir: str | os.PathLike, output: str | os.PathLike | None = None, *, html_page: bool = True, log=print
) -> Path:
    """Write RUN_DIR/report/report.md (+ report.html with the PNGs embedded, and the PNGs); returns report.md's path.

    Raises FileNotFoundError when RUN_DIR holds no metrics.jsonl, ImportError (naming the `plot` extra) without
    matplotlib.
    """
    import numpy as np

    from xrpo.eval import plots
    from xrpo.rundir.lock import make_output_dir

    run = Path(run_dir)
    if not (run / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{run}: no metrics.jsonl; expected an xrpo training run directory")
    out = Path(output) if output else run / "report"
    make_output_dir(out, "--output")
    logged = _read_records(run / "metrics.jsonl", _check_metrics)
    metrics = _last_per_step(logged)
    evals = _read_records(run / "eval.jsonl", _check_eval)
    rounds = _read_records(run / "rounds.jsonl", _check_round)
    summary = _read_summary(run / "summary.json")
    config = _read_config(run / "config.yaml")
    method = (config.get("method") or {}).get("name") or summary.get("method") or "?"
    if not metrics:
        raise ValueError(f"{run / 'metrics.jsonl'}: no training steps logged yet")
    segments = summary.get("segments") or _checkpoint_segments(run)

    page = _Page()
    page.h(1, f"Training report: {run.name}")
    steps = [r["step"] for r in metrics]
    repeated = len(logged) - len(metrics)
    facts = [
        ["method", method],
        [
            "steps logged",
            f"{len(metrics)} (last {steps[-1]})"
            + (
                f"; {repeated} rows repeated a step (a run resumed by an xrpo that did not set them aside): the last "
                f"row of each step is used"
                if repeated
                else ""
            ),
        ],
        ["model", str((config.get("model") or {}).get("path", "?"))],
        ["training data", str((config.get("data") or {}).get("train", "?"))],
    ]
    rollouts = summary.get("rollouts", sum(float(r.get("rollout/count", 0.0)) for r in metrics))
    tokens = summary.get("tokens", sum(float(r.get("loss/tokens", 0.0)) for r in metrics))
    facts.append(["rollouts trained on", f"{rollouts:.0f} ({tokens:.0f} completion tokens)"])
    if segments:
        facts += _segment_facts(segments, summary)
    elif summary.get("wall_time_s") is not None:  # a summary.json written before segments were recorded
        facts.append(["wall time", f"{summary['wall_time_s']:.0f} s (of its last segment, if it was resumed)"])
    if summary:
        if summary.get("pass@1_before") is not None and summary.get("pass@1_after") is not None:
            facts.append(
                [
                    "held-out pass@1",
                    f"{summary['pass@1_before']:.3f} -> {summary['pass@1_after']:.3f} "
                    f"({summary.get('heldout_problems')} problems x "
                    f"{summary.get('heldout_samples_per_problem')} samples)",
                ]
            )
    else:
        facts.append(["status", "no summary.json: the run has not finished (or was killed)"])
    page.table(["", ""], facts)

    # -------- training reward
    page.h(2, "Training reward")
    series = {
        k.split("/")[1]: _series(metrics, k)
        for k in ("rollout/reward_mean", "rollout/solved_prompt_frac")
        if any(k in r for r in metrics)
    }
    if series:
        smooth = 10 if len(metrics) >= 30 else 0
        page.img(
            plots.plot_lines(
                series, out / "reward.png", title="Training rollouts", ylabel="mean over the step", smooth=smooth
            ),
            "training reward",
        )
        x, y = series.get("reward_mean", ([], []))
        if y:
            k = max(1, len(y) // 10)
            page.p(
                f"Mean reward of the first {k} steps {np.mean(y[:k]):.3f}, of the last {k} steps {np.mean(y[-k:]):.3f}."
            )
    else:
        page.p("No rollout/reward_mean logged.")

    # -------- held-out
    page.h(2, "Held-out accuracy")
    keys = sorted(
        {k for r in evals for k in r if _EVAL_KEY.fullmatch(k)},
        key=lambda k: ("cons@" in k, int(k.split("@")[1])),
    )  # pass@k by k, then cons@n
    if keys:
        page.img(
            plots.plot_lines(
                {k.split("/")[1]: _series(evals, k) for k in keys},
                out / "heldout.png",
                title="Held-out validation",
                ylabel="accuracy",
            ),
            "held-out accuracy",
        )
        page.table(
            ["step"] + [k.split("/")[1] for k in keys],
            [[str(r["step"])] + [f"{r[k]:.3f}" if k in r else "" for k in keys] for r in evals],
        )
    else:
        page.p("No validation logged (eval.jsonl is empty).")

    # -------- allocation
    page.h(2, "Rollout allocation (hierarchical rollout planning)")
    # one row per (step, round), the last written (as metrics: older resumed runs logged redone steps twice)
    planned = list({(r["step"], r["round"]): r for r in rounds if r.get("round", 0) > 0}.values())
    if planned:
        by_round: dict[str, list[float]] = {}
        for r in planned:
            by_round.setdefault(f"round {r['round']}", []).extend(r["alloc"])
        page.img(
            plots.plot_histograms(
                dict(sorted(by_round.items())),
                out / "allocation.png",
                title="Extra rollouts per prompt in each planning round",
                xlabel="extra rollouts",
            ),
            "allocation histograms",
        )
        nonuni = sum(bool(r.get("nonuniform")) for r in planned)
        allv = [a for v in by_round.values() for a in v]
        page.p(
            f"{len(planned)} planning rounds over {len({r['step'] for r in planned})} steps; non-uniform "
            f"allocation in {nonuni} ({nonuni / len(planned):.1%}); largest extra for one prompt in one round: "
            f"{max(allv):.0f}; prompts given no extra rollout: {np.mean(np.asarray(allv) == 0):.1%}."
        )
    else:
        page.p("No planning rounds logged (a method without hierarchical rollout planning, e.g. GRPO).")

    # -------- ICL
    page.h(2, "ICL seeding")
    if any("icl/seeded_prompts" in r for r in metrics):
        xs, seeded = _series(metrics, "icl/seeded_prompts")
        _, flips = _series(metrics, "icl/flips")
        page.img(
            plots.plot_lines(
                {
                    "seeded prompts (summed over rounds)": (xs, seeded),
                    "flips": (xs, flips),
                    "cumulative flips": (xs, list(np.cumsum(flips))),
                },
                out / "icl.png",
                title="ICL seeding per step",
                ylabel="prompts",
            ),
            "ICL seeding",
        )
        page.p(
            f"{sum(seeded):.0f} prompts were ICL-seeded, {sum(flips):.0f} of them flipped to at least one correct "
            f"rollout ({sum(flips) / max(sum(seeded), 1):.1%})."
        )
    else:
        page.p("No ICL seeding logged (ICL off).")

    # -------- sharpening
    page.h(2, "Novelty-guided advantage sharpening")
    if any("adv/sharpened_count" in r for r in metrics):
        xs, sharp = _series(metrics, "adv/sharpened_count")
        page.img(
            plots.plot_lines(
                {"sharpened advantages": (xs, sharp)},
                out / "sharpened.png",
                title="Advantages sharpened per step (Eq. 6)",
                ylabel="rollouts",
            ),
            "sharpening",
        )
        page.p(f"{sum(sharp):.0f} advantages sharpened in all, {np.mean(sharp):.2f} per step.")
    else:
        page.p("No sharpening logged (sharpening off).")

    # -------- time
    page.h(2, "Step time")
    parts = {
        k.split("/")[1]: [float(r.get(k, 0.0)) for r in metrics] for k in TIME_PARTS if any(k in r for r in metrics)
    }
    if any("time/step" in r for r in metrics) and parts:
        total = np.array([float(r.get("time/step", 0.0)) for r in metrics])
        parts["other"] = list(np.maximum(total - np.sum([np.asarray(v) for v in parts.values()], axis=0), 0.0))
        page.img(
            plots.plot_stacked(steps, parts, out / "step_time.png", title="Time per step", ylabel="seconds"),
            "step time breakdown",
        )
        page.table(
            ["part", "mean s/step", "share"],
            [[k, f"{np.mean(v):.3f}", f"{np.sum(v) / max(total.sum(), 1e-12):.1%}"] for k, v in parts.items()]
            + [["step", f"{total.mean():.3f}", "100%"]],
        )
    else:
        page.p("No time/* metrics logged.")

    md = out / "report.md"
    md.write_text(page.markdown(out), encoding="utf-8")
    if html_page:
        (out / "report.html").write_text(page.html(f"xrpo report {run.name}"), encoding="utf-8")
    log(f"report: {md}" + (f" and {out / 'report.html'}" if html_page else ""))
    return md
