"""The results of `xrpo eval`: the figures per dataset and on average (results.json), the table (results.md) and
the plots (pass_at_k.png, lengths.png)."""

from __future__ import annotations

from pathlib import Path

from xrpo.eval.config import EvalConfig
from xrpo.rundir.files import write_atomic

__all__ = ["make_results", "write_results"]


def make_results(cfg: EvalConfig, settings: dict, datasets, records_by_ds, n: int, ks: list[int]) -> dict:
    """What results.json holds: per dataset (``datasets``: (name, spec, problems, info)) its figures over its records
    (``records_by_ds``), their average over datasets, the settings and every record."""
    import numpy as np

    from xrpo.rollout.validate import score_records

    per_ds = {}
    for name, spec, _, info in datasets:
        recs = records_by_ds[name]
        m = score_records(recs, n, ks, prefix="")
        if n == 1:
            m.pop(f"cons@{n}", None)  # one sample: the vote is the sample
        per_ds[name] = {
            "source": spec.source,
            "loaded_as": info,
            "num_problems": len(recs),
            "num_samples": int(sum(r["n"] for r in recs)),
            "metrics": m,
        }
    keys = list(next(iter(per_ds.values()))["metrics"])
    average = {k: float(np.mean([d["metrics"][k] for d in per_ds.values()])) for k in keys}
    skipped = sum(d["metrics"].get("unsampled_problems", 0.0) for d in per_ds.values())
    if skipped:
        for d in per_ds.values():
            d["metrics"].setdefault("unsampled_problems", 0.0)
        average["unsampled_problems"] = float(skipped)  # a count: the total, not a mean
    return {
        "model": cfg.model,
        "settings": settings,
        "ks": ks,
        "n": n,
        "datasets": per_ds,
        "average": average,
        "per_problem": {name: records_by_ds[name] for name, *_ in datasets},
    }


def write_results(out: Path, results: dict, log) -> None:
    """results.json, results.md and the plots in ``out``; the table is also logged."""
    import json

    from xrpo.eval.report import results_markdown

    write_atomic(out / "results.json", json.dumps(results, indent=1, ensure_ascii=False))
    write_atomic(out / "results.md", results_markdown(results))
    try:
        from xrpo.eval import plots

        plots.plot_pass_at_k(results, out / "pass_at_k.png")
        plots.plot_lengths(results, out / "lengths.png")
    except ImportError as e:
        log(f"no plots: {e}")
    log(results_markdown(results, title=False))
    log(f"outputs in {out}: results.json, results.md, pass_at_k.png, lengths.png, per_problem/")
