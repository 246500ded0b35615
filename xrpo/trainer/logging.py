"""Run logging: metrics.jsonl (one flat JSON object per step), eval.jsonl, samples.jsonl and rounds.jsonl, the
experiment trackers of ``report_to`` (TensorBoard by default when installed; xrpo.trainer.trackers), a progress bar
with the key figures, a table of sample completions every N steps, and a summary at the end. Names are explained in
docs/metrics.md. What a resume does to the records, and the segments of a resumed run, are xrpo.trainer.records'.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from xrpo.rundir.files import write_atomic
from xrpo.trainer.records import Segments
from xrpo.trainer.trackers import start_trackers

KEY_FIGURES = [
    ("reward", "rollout/reward_mean", "{:.3f}"),
    ("nonunif", "alloc/nonuniform_rounds", "{:.0f}"),
    ("seeded", "icl/seeded_prompts", "{:.0f}"),
    ("flips", "icl/flips", "{:.0f}"),
    ("sharp", "adv/sharpened_count", "{:.0f}"),
    ("s/step", "time/step", "{:.2f}"),
]
SAMPLE_COLUMNS = ["step", "problem", "reference", "completion", "reward", "reason", "seeded"]
_BAR_WITHOUT_RATE = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"  # tqdm's default less rate and ETA


class MechanismTotals:
    """XRPO's mechanisms summed over a run (summary.json's "xrpo" block), kept in checkpoints so that a resumed run
    counts every step once."""

    KEYS = (
        "alloc/rounds",
        "alloc/nonuniform_rounds",
        "alloc/max_extra",
        "icl/seeded_prompts",
        "icl/flips",
        "adv/sharpened_count",
    )  # summed over steps, except the largest extra allocation: its maximum

    def __init__(self, saved: dict | None = None):
        self.totals = {k: 0.0 for k in self.KEYS}
        self.totals.update(saved or {})

    def add(self, metrics: dict) -> None:
        for k in self.KEYS:
            v = metrics.get(k, 0.0)
            self.totals[k] = max(self.totals[k], v) if k == "alloc/max_extra" else self.totals[k] + v

    def state(self) -> dict:
        return dict(self.totals)

    def summary(self) -> dict:
        t = self.totals
        return {
            "planned_rounds": int(t["alloc/rounds"]),
            "nonuniform_round_share": t["alloc/nonuniform_rounds"] / max(t["alloc/rounds"], 1.0),
            "max_extra": t["alloc/max_extra"],
            "seeded_prompts": t["icl/seeded_prompts"],
            "flips": t["icl/flips"],
            "sharpened": t["adv/sharpened_count"],
        }


class RunLogger:
    """Writes the run's records and sends them to the trackers. ``resume_state`` (the state.json of the checkpoint a
    run resumes from) first brings the records back to that checkpoint and continues its segments
    (xrpo.trainer.records.Segments); ``t_start`` is when this process started (its segment's wall time counts from
    there). The trackers' runs are started (or continued) here: construct the logger before loading anything, so that
    a tracker that cannot start fails the run at once. ``plots``, called at the end with the run directory, returns
    the report's PNGs by name, logged to the trackers (the CLI passes `xrpo report`'s).

    As a context manager, it closes the records and the trackers' runs (as failed) when the run ends by an error."""

    def __init__(
        self,
        output: Path,
        cfg,
        *,
        resume_state: dict | None = None,
        t_start: float | None = None,
        log=print,
        plots: Callable[[Path], dict[str, Path]] | None = None,
    ):
        from xrpo.trainer.config_loader import to_dict

        self.output = Path(output)
        self.log = log
        self._cfg = cfg
        self._plots = plots
        self.segments = Segments(self.output, resume_state=resume_state, t_start=t_start, log=log)
        mode = "a" if resume_state is not None else "w"
        self._metrics = open(self.output / "metrics.jsonl", mode)
        self._evals = open(self.output / "eval.jsonl", mode)
        self._samples = open(self.output / "samples.jsonl", mode)
        self._rounds = open(self.output / "rounds.jsonl", mode)
        self._bar = None
        self._last_eval = None
        self._closed = False
        try:
            resume_step = self.segments.start_step if resume_state is not None else None
            self.trackers = start_trackers(self.output, cfg, to_dict(cfg), resume_step=resume_step, log=log)
        except BaseException:
            self.trackers = []
            self._close_records()
            raise

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._closed:
            self._close_records("failed" if exc_type is not None else "finished")

    # ------------------------------------------------------------------ segments
    def checkpoint_state(self, step: int) -> dict:
        """Call right before writing the checkpoint of ``step``: syncs every record to disk (the checkpoint must not
        outlive its rows) and returns what the checkpoint's state.json keeps of the records: {"segments": ...}."""
        for f in (self._metrics, self._evals, self._samples, self._rounds):
            f.flush()
            os.fsync(f.fileno())
        self._to_trackers("sync", step)
        return {"segments": self.segments.all(step)}

    def run_totals(self, step: int) -> dict:
        """summary.json's figures over all segments of the run (docs/metrics.md, Run totals)."""
        return self.segments.run_totals(step)

    # ------------------------------------------------------------------ records
    def _to_trackers(self, what: str, step: int, *args) -> None:
        """Call ``what`` on every tracker; one that fails is dropped (with a warning) and the run goes on."""
        for t in list(self.trackers):
            try:
                getattr(t, what)(*args) if what == "sync" else getattr(t, what)(step, *args)
            except Exception as e:
                self.trackers.remove(t)
                self.log(
                    f"warning: tracker {t.name} failed ({what}, step {step}): {type(e).__name__}: {e}; nothing more "
                    f"goes to it in this run (metrics.jsonl has every row)"
                )
                try:
                    t.close("failed")
                except Exception:
                    pass

    def _write(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text)
        else:
            self.log(text)

    def note(self, text: str) -> None:
        """Print a message between the progress bar's updates."""
        self._write(text)

    def log_step(self, step: int, metrics: dict) -> None:
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        self.segments.add_step(row)
        self._to_trackers("log_metrics", step, {k: v for k, v in row.items() if k != "step"})
        if self._bar is None and self._cfg.progress:  # made at the first step: loading messages come before it
            from tqdm.auto import tqdm

            cfg = self._cfg
            self._bar = tqdm(
                total=cfg.steps,
                initial=step - 1,
                desc=f"{cfg.method.name}",
                unit="step",
                dynamic_ncols=True,
                bar_format=_BAR_WITHOUT_RATE,
            )
            self._bar.start_t -= metrics.get("time/step", 0.0)  # the bar's clock starts with the step just done
        if self._bar is not None:
            if step - self._bar.initial >= 2:
                # a rate and an ETA from one step would be that step's, warm-up included: shown from the second on
                self._bar.bar_format = None
            post = {name: fmt.format(metrics[k]) for name, k, fmt in KEY_FIGURES if k in metrics}
            if self._last_eval is not None:
                post["heldout"] = f"{self._last_eval:.3f}"
            self._bar.n = step
            self._bar.set_postfix(post, refresh=True)

    def log_rounds(self, step: int, rounds: list[dict]) -> None:
        """Per planning round: the allocation per prompt, seeded prompts, flips (for histograms and reports)."""
        for r in rounds:
            self._rounds.write(json.dumps({"step": step, **r}) + "\n")
        self._rounds.flush()
        # a streaming wave plans some prompts ("members"), a round all of them
        extra = [r["alloc"][q] for r in rounds if r["round"] > 0 for q in r.get("members", range(len(r["alloc"])))]
        if extra:
            self._to_trackers("log_histogram", step, "alloc/extra_per_prompt", extra)

    def log_eval(self, step: int, metrics: dict) -> None:
        row = {"step": step, **metrics}
        self._evals.write(json.dumps(row) + "\n")
        self._evals.flush()
        self._to_trackers("log_metrics", step, dict(metrics))
        self._last_eval = metrics.get("eval/pass@1")
        figures = "  ".join(f"{k.split('/', 1)[1]}={v:.3f}" for k, v in metrics.items() if k.startswith("eval/"))
        self._write(f"[step {step}] held-out: {figures}")

    def samples_due(self, step: int) -> bool:
        """Whether step ``step``'s samples are logged: every ``log_samples_every`` steps, and the first step's always
        (a short run's samples.jsonl is never empty, and the first samples show at once whether the model answers
        in the form the verifier reads)."""
        every = self._cfg.log_samples_every
        return bool(every) and (step == 1 or step % every == 0)

    def validation_progress(self, step: int) -> Callable[[int, int], None]:
        """What shows a validation's progress, called with (samples drawn, samples to draw): a progress bar while
        ``progress`` is on, else a line at most every 60 s (a validation of a larger model takes minutes)."""
        import time

        what = "validation before training" if step == 0 else f"validation at step {step}"
        if self._cfg.progress:
            from tqdm.auto import tqdm

            bar = None

            def show(done: int, total: int) -> None:
                nonlocal bar
                if bar is None:
                    bar = tqdm(total=total, desc=what, unit="sample", dynamic_ncols=True)
                bar.update(done - bar.n)
                if done >= total:
                    bar.close()

            return show
        t0 = last = time.perf_counter()

        def line(done: int, total: int) -> None:
            nonlocal last
            now = time.perf_counter()
            if now - last >= 60 and done < total:
                last = now
                self._write(f"{what}: {done}/{total} samples in {now - t0:.0f}s")

        return line

    def log_eval_completions(self, step: int, records: list[dict]) -> None:
        """A validation's per-problem records with their completions (``save_eval_completions``), one file per
        validation: a resumed run that validates step ``step`` again rewrites the same file."""
        path = self.output / "eval_completions" / f"step-{step:08d}.jsonl"
        path.parent.mkdir(exist_ok=True)
        write_atomic(path, "".join(json.dumps({"step": step, **r}) + "\n" for r in records))

    def log_samples(self, step: int, problems, records, n: int = 6) -> None:
        seen, rows = set(), []
        for x in records:
            if x.problem_index in seen:
                continue
            seen.add(x.problem_index)
            p = problems[x.problem_index]
            rows.append(
                {
                    "step": step,
                    "problem": p.id,
                    "reference": p.answer,
                    "completion": x.text,
                    "reward": x.reward,
                    "reason": x.verify_reason,
                    "seeded": x.seeded,
                }
            )
            if len(rows) == n:
                break
        for row in rows:
            self._samples.write(json.dumps(row) + "\n")
        self._samples.flush()
        self._to_trackers("log_table", step, "samples", SAMPLE_COLUMNS, [[r[c] for c in SAMPLE_COLUMNS] for r in rows])
        # the reference column as wide as the longest reference up to 24 characters (a code problem's tests are
        # longer: cut, marked with "…")
        width = min(max([3] + [len(_one_line(r["reference"])) for r in rows]), 24)
        lines = [f"[step {step}] samples:", f"  {'problem':<28} {'ref':>{width}}  {'reward':>6}  completion"]
        for row in rows:
            ref = _cut(_one_line(row["reference"]), width)
            comp = _cut(_one_line(row["completion"]), 60)
            lines.append(f"  {_cut(row['problem'], 28):<28} {ref:>{width}}  {row['reward']:>6.2f}  {comp}")
        self._write("\n".join(lines))

    def _close_records(self, status: str = "finished") -> None:
        self._closed = True
        for f in (self._metrics, self._evals, self._samples, self._rounds):
            f.close()
        for t in self.trackers:
            try:
                t.close(status)
            except Exception as e:
                self.log(f"warning: tracker {t.name} failed to close its run: {type(e).__name__}: {e}")
        self.trackers = []
        if self._bar is not None:
            self._bar.close()

    def close_segment(self, step: int) -> None:
        """A run stopped (preempted) at ``step``, whose checkpoint is written: close the records (the trackers' runs
        as stopped: the resumed run continues them) and log what this segment did (its figures are in the
        checkpoint's ``segments``; the resumed run's summary counts them)."""
        self._close_records("stopped")
        seg = self.segments.current(step)
        self.log(
            f"segment {self.segments.number} of the run: steps {seg['start_step'] + 1}-{step} ({seg['steps']} "
            f"steps, {seg['rollouts']:.0f} rollouts, {seg['tokens']:.0f} tokens) in {seg['wall_time_s']:.0f}s"
        )

    def close(self, summary: dict) -> None:
        if self.trackers and self._plots is not None:
            try:
                images = self._plots(self.output)
            except Exception as e:  # the run is done: its plots are not worth failing it
                self.log(f"warning: the report's plots were not made, so no tracker has them: {type(e).__name__}: {e}")
            else:
                self._to_trackers("log_images", summary["steps"], images)
        names = [t.name for t in self.trackers]
        self._close_records("finished")
        b, a = summary.get("pass@1_before"), summary.get("pass@1_after")
        self.log("")
        segs = summary.get("num_segments", 1)
        self.log(
            f"done: {summary['method']}, {summary['steps']} steps in {summary['wall_time_s']:.0f}s"
            + (f" over {segs} segments (resumed {segs - 1} times)" if segs > 1 else "")
        )
        if b is not None and a is not None:
            self.log(
                f"held-out pass@1 ({summary['heldout_problems']} problems x "
                f"{summary['heldout_samples_per_problem']} samples): before {b:.3f} -> after {a:.3f}"
            )
        x = summary.get("xrpo", {})
        if x.get("planned_rounds"):
            self.log(
                f"XRPO: non-uniform allocation in {x['nonuniform_round_share']:.1%} of {x['planned_rounds']} "
                f"planning rounds (largest extra {x['max_extra']:.0f}); ICL seeded {x['seeded_prompts']:.0f} "
                f"prompts, {x['flips']:.0f} flipped; {x['sharpened']:.0f} advantages sharpened"
            )
        self.log(
            f"outputs in {summary['output']}: config.yaml, metrics.jsonl, eval.jsonl, rounds.jsonl, "
            f"samples.jsonl, summary.json, checkpoints/" + (f"; trackers: {', '.join(names)}" if names else "")
        )


def _one_line(text: str) -> str:
    return text.replace("\n", "\\n")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
