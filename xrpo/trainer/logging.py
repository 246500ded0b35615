"""Run logging: metrics.jsonl (one flat JSON object per step), TensorBoard when installed, a progress bar with the key
figures, a table of sample completions every N steps, and a summary at the end. Names are explained in
docs/metrics.md.

A resumed run's records are one run. Every JSONL row is flushed when it is written, and every record (TensorBoard's
buffered events included) is flushed and fsynced before a checkpoint is written, so a checkpoint of step k never
outlives the rows of steps <= k. ``--resume`` from step k then brings each record back to step k before training
continues (``rewind_records``): rows of later steps (written by the killed process after its last checkpoint, which
the resumed run writes again) move to ``<name>.discarded.jsonl`` (``tensorboard/discarded-events.tfrecord`` for event
files), which nothing reads; the record itself is rewritten atomically. A validation row belongs to the checkpoint
only if it is in the checkpoint's ``eval_history``: the final validation, made after the last checkpoint, is made
again on resume.

Segments: each `xrpo train` process of a run is a segment. Its wall time, steps, rollouts and tokens are saved in
every checkpoint (``state.json`` ``segments``); a segment that was killed counts up to the checkpoint the next one
resumed from. Its work after that checkpoint is not counted in ``wall_time_s``: the rows the next segment discarded
carry its logged time (``time/step``, ``time/validate``), reported as ``discarded_time_s`` -- a lower bound, since the
time between the last logged row and the kill is not recorded anywhere. A process killed before it wrote a checkpoint
leaves no segment: only its set-aside rows tell of it (the summary's ``discarded_*`` totals come from those files).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

from xrpo.trainer.checkpoint import fsync_dir, set_aside_later_checkpoints, write_atomic

KEY_FIGURES = [
    ("reward", "rollout/reward_mean", "{:.3f}"),
    ("nonunif", "alloc/nonuniform_rounds", "{:.0f}"),
    ("seeded", "icl/seeded_prompts", "{:.0f}"),
    ("flips", "icl/flips", "{:.0f}"),
    ("sharp", "adv/sharpened_count", "{:.0f}"),
    ("s/step", "time/step", "{:.2f}"),
]

# the per-step records of a run; each row has a "step"
RECORDS = ("metrics.jsonl", "rounds.jsonl", "samples.jsonl", "eval.jsonl")
TB_DIR = "tensorboard"
# no "tfevents" in the name: TensorBoard does not load it
TB_DISCARDED = "discarded-events.tfrecord"


def discarded_path(path: Path) -> Path:
    """metrics.jsonl -> metrics.discarded.jsonl: where rows removed by a resume are kept."""
    path = Path(path)
    return path.with_name(f"{path.stem}.discarded{path.suffix}")


def _read_rows(path: Path) -> list[tuple[str, dict | None]]:
    """(raw line, row) pairs; a last line cut short by a kill is (raw, None). Any other bad line is an error."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[tuple[str, dict | None]] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):
                out.append((line, None))
                continue
            raise ValueError(
                f"{path} line {i}: not valid JSON; cannot bring the record back to the checkpoint"
            ) from None
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise ValueError(f"{path} line {i}: expected a JSON object with an integer 'step'")
        out.append((line, row))
    return out


def _append_synced(path: Path, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
        f.flush()
        os.fsync(f.fileno())


def rewind_records(output: Path, step: int, eval_history: list[dict], *, log=print) -> dict:
    """Bring the run's records back to checkpoint ``step`` (whose validations are ``eval_history``); see the module
    docstring. Rows kept are left byte for byte; removed ones are appended (fsynced) to the discarded file before the
    record is replaced, so a crash in between leaves a row twice, never nowhere. Later checkpoints and a stale
    summary.json are set aside too.

    Returns {"rows": {record: rows removed}, "tb_events": events removed, "kept": the metrics rows kept,
    "discarded": the metrics and eval rows removed}.
    """
    output = Path(output)
    in_checkpoint = Counter(int(h["step"]) for h in eval_history)
    removed: dict[str, int] = {}
    kept_metrics: list[dict] = []
    gone_rows: dict[str, list[dict]] = {"metrics.jsonl": [], "eval.jsonl": []}
    eval_kept: list[dict] = []
    eval_all: list[dict] = []
    plan: list[tuple[Path, list[str], list[str]]] = []
    for name in RECORDS:  # every record is read (and a bad one refused) before any is changed
        path = output / name
        if not path.is_file():
            continue
        keep: list[str] = []
        gone: list[str] = []
        seen: Counter = Counter()
        for raw, row in _read_rows(path):
            if row is None:
                gone.append(json.dumps({"unreadable_line": raw}))
                continue
            s = row["step"]
            ok = s <= step
            if name == "eval.jsonl":
                eval_all.append(row)
                ok = ok and seen[s] < in_checkpoint[s]
                seen[s] += ok
                if ok:
                    eval_kept.append(row)
            if ok:
                keep.append(raw)
                if name == "metrics.jsonl":
                    kept_metrics.append(row)
            else:
                gone.append(raw)
                if name in gone_rows:
                    gone_rows[name].append(row)
        plan.append((path, keep, gone))
    for path, keep, gone in plan:
        if gone:
            _append_synced(discarded_path(path), gone)
            write_atomic(path, "".join(line + "\n" for line in keep))
            removed[path.name] = len(gone)
    # TensorBoard: eval/* and time/validate come only from validations; a step's events of those tags are kept as
    # many times as the checkpoint has validations of that step
    eval_tags = {k for r in eval_all for k in r if k != "step"}
    allowed = Counter((r["step"], k) for r in eval_kept for k in r if k != "step")
    tb_removed = _rewind_tensorboard(output / TB_DIR, step, eval_tags, allowed, log=log)
    moved = set_aside_later_checkpoints(output, step)
    stale = output / "summary.json"
    if stale.is_file():
        os.replace(stale, discarded_path(stale))
        fsync_dir(output)
    parts = [f"{n} row{'s' * (n != 1)} of {name}" for name, n in removed.items()]
    if tb_removed:
        parts.append(f"{tb_removed} TensorBoard events")
    if parts:
        later = sorted({r["step"] for r in gone_rows["metrics.jsonl"] if r["step"] > step})
        when = f" (steps {later[0]}-{later[-1]})" if later else ""
        log(
            f"records brought back to step {step}: set aside {', '.join(parts)}{when}, written after the checkpoint; "
            f"kept in *.discarded.jsonl" + (f" and {TB_DIR}/{TB_DISCARDED}" if tb_removed else "")
        )
    for p in moved:
        log(f"checkpoint after step {step} set aside: {p}")
    missing = sorted(set(range(1, step + 1)) - {r["step"] for r in kept_metrics})
    if (output / "metrics.jsonl").is_file() and missing:
        log(
            f"warning: metrics.jsonl has no row for {len(missing)} of steps 1-{step} (first: {missing[0]}); "
            f"the checkpoint's steps cannot be logged again"
        )
    return {"rows": removed, "tb_events": tb_removed, "kept": kept_metrics, "discarded": gone_rows}


def _rewind_tensorboard(tb_dir: Path, step: int, eval_tags: set, allowed: Counter, *, log=print) -> int:
    files = sorted(p for p in tb_dir.iterdir() if "tfevents" in p.name) if tb_dir.is_dir() else []
    if not files:
        return 0
    try:
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.summary.writer.record_writer import RecordWriter
    except ImportError:
        log(
            f"warning: tensorboard is not installed, so the event files in {tb_dir} were not brought back to step "
            f"{step}; TensorBoard may show the steps after it twice (pip install 'xrpo[tensorboard]')"
        )
        return 0
    seen: Counter = Counter()
    removed = 0
    for path in files:
        keep: list[bytes] = []
        gone: list[bytes] = []
        for rec in RawEventFileLoader(str(path)).Load():
            ev = Event.FromString(rec)
            tags = [v.tag for v in ev.summary.value if v.tag in eval_tags]
            ok = ev.step <= step and all(seen[(ev.step, t)] < allowed[(ev.step, t)] for t in tags)
            if ok:
                seen.update((ev.step, t) for t in tags)
                keep.append(rec)
            else:
                gone.append(rec)
        if not gone:
            continue
        with open(tb_dir / TB_DISCARDED, "ab") as f:
            w = RecordWriter(f)
            for rec in gone:
                w.write(rec)
            f.flush()
            os.fsync(f.fileno())
        # the temporary name has no "tfevents": a TensorBoard reading the directory meanwhile ignores it
        tmp = tb_dir / ".rewind.tmp"
        with open(tmp, "wb") as f:
            w = RecordWriter(f)
            for rec in keep:
                w.write(rec)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(tb_dir)
        removed += len(gone)
    return removed


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
    """Writes the run's records. ``resume_state`` (the state.json of the checkpoint a run resumes from) first brings
    the records back to that checkpoint and continues its segments; ``t_start`` is when this process started (its
    segment's wall time counts from there)."""

    def __init__(self, output: Path, cfg, *, resume_state: dict | None = None, t_start: float | None = None, log=print):
        self.output = Path(output)
        self.log = log
        self._t_start = time.perf_counter() if t_start is None else t_start
        start = 0
        self._segments: list[dict] = []
        self._segment: dict = {}
        discarded: dict = {}
        if resume_state is not None:
            start = int(resume_state["step"])
            rewound = rewind_records(self.output, start, resume_state.get("eval_history", []), log=log)
            self._segments = [dict(s) for s in resume_state.get("segments") or [_segment_from_logs(rewound["kept"])]]
            discarded = _discarded_figures(rewound["discarded"])
        self._segment = {
            "start_step": start,
            "end_step": start,
            "wall_time_s": 0.0,
            "steps": 0,
            "rollouts": 0.0,
            "tokens": 0.0,
            **discarded,
        }
        mode = "a" if resume_state is not None else "w"
        self._metrics = open(self.output / "metrics.jsonl", mode)
        self._evals = open(self.output / "eval.jsonl", mode)
        self._samples = open(self.output / "samples.jsonl", mode)
        self._rounds = open(self.output / "rounds.jsonl", mode)
        self._tb = None
        if cfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                if resume_state is not None:
                    _wait_to_sort_last(self.output / TB_DIR, log)
                # purge_step: a TensorBoard already showing the run hides its events of later steps (the files
                # themselves were brought back to the checkpoint above)
                self._tb = SummaryWriter(
                    str(self.output / TB_DIR), purge_step=start + 1 if resume_state is not None else None
                )
            except ImportError:  # tensorboard is an optional extra
                self._tb = None
        self._bar = None
        if cfg.progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=cfg.steps, initial=start, desc=f"{cfg.method.name}", unit="step", dynamic_ncols=True)
        self._last_eval = None

    # ------------------------------------------------------------------ segments
    def _current(self, step: int) -> dict:
        self._segment.update(end_step=step, wall_time_s=time.perf_counter() - self._t_start)
        return dict(self._segment)

    def checkpoint_state(self, step: int) -> dict:
        """Call right before writing the checkpoint of ``step``: syncs every record to disk (the checkpoint must not
        outlive its rows) and returns what the checkpoint's state.json keeps of the records: {"segments": ...}."""
        for f in (self._metrics, self._evals, self._samples, self._rounds):
            f.flush()
            os.fsync(f.fileno())
        if self._tb is not None:
            # SummaryWriter writes from a background thread and, with TensorFlow installed, through a buffer it
            # flushes every two minutes: a kill could lose steps the checkpoint has. (Without TensorFlow each event
            # reaches the file within milliseconds, so no test here fails without this flush.)
            self._tb.flush()
            for path in (self.output / TB_DIR).glob("*tfevents*"):  # an fsync of any descriptor syncs the file
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        return {"segments": self._segments + [self._current(step)]}

    def run_totals(self, step: int) -> dict:
        """summary.json's figures over all segments of the run (docs/metrics.md, Run totals)."""
        segs = self._segments + [self._current(step)]
        return {
            "wall_time_s": sum(s["wall_time_s"] for s in segs),
            **discarded_totals(self.output),
            "rollouts": sum(s["rollouts"] for s in segs),
            "tokens": sum(s["tokens"] for s in segs),
            "num_segments": len(segs),
            "segments": segs,
        }

    def _write(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text)
        else:
            self.log(text)

    def log_step(self, step: int, metrics: dict) -> None:
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        self._segment["steps"] += 1
        self._segment["rollouts"] += row.get("rollout/count", 0.0)
        self._segment["tokens"] += row.get("loss/tokens", 0.0)
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, v, step)
        if self._bar is not None:
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
        if self._tb is not None:
            import numpy as np

            # a streaming wave plans some prompts ("members"), a round all of them
            extra = [r["alloc"][q] for r in rounds if r["round"] > 0 for q in r.get("members", range(len(r["alloc"])))]
            if extra:
                self._tb.add_histogram("alloc/extra_per_prompt", np.asarray(extra), step)

    def log_eval(self, step: int, metrics: dict) -> None:
        row = {"step": step, **metrics}
        self._evals.write(json.dumps(row) + "\n")
        self._evals.flush()
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, v, step)
        self._last_eval = metrics.get("eval/pass@1")
        figures = "  ".join(f"{k.split('/', 1)[1]}={v:.3f}" for k, v in metrics.items() if k.startswith("eval/"))
        self._write(f"[step {step}] held-out: {figures}")

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
        lines = [f"[step {step}] samples:", f"  {'problem':<28} {'ref':>8}  {'reward':>6}  completion"]
        for row in rows:
            comp = row["completion"].replace("\n", "\\n")[:60]
            lines.append(f"  {row['problem'][:28]:<28} {row['reference'][:8]:>8}  {row['reward']:>6.2f}  {comp}")
        self._write("\n".join(lines))

    def _close_records(self) -> None:
        for f in (self._metrics, self._evals, self._samples, self._rounds):
            f.close()
        if self._tb is not None:
            self._tb.close()
        if self._bar is not None:
            self._bar.close()

    def close_segment(self, step: int) -> None:
        """A run stopped (preempted) at ``step``, whose checkpoint is written: close the records and log what this
        segment did (its figures are in the checkpoint's ``segments``; the resumed run's summary counts them)."""
        self._close_records()
        seg = self._current(step)
        self.log(
            f"segment {len(self._segments) + 1} of the run: steps {seg['start_step'] + 1}-{step} ({seg['steps']} "
            f"steps, {seg['rollouts']:.0f} rollouts, {seg['tokens']:.0f} tokens) in {seg['wall_time_s']:.0f}s"
        )

    def close(self, summary: dict) -> None:
        self._close_records()
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
            f"samples.jsonl, summary.json, checkpoints/"
        )


def _wait_to_sort_last(tb_dir: Path, log) -> None:
    """TensorBoard reads a run's event files in name order, and a name starts with its writer's start second: a
    segment resumed within the second its killed predecessor started in could sort before it (then the older
    events would be read last and the restart marker would purge the wrong ones). Wait for the next second."""
    stamps = []
    for p in tb_dir.glob("events.out.tfevents.*"):
        try:
            stamps.append(int(p.name.split(".")[3]))
        except (IndexError, ValueError):
            pass
    wait = max(stamps, default=0) + 1 - time.time()
    if wait > 2:
        log(
            f"warning: an event file in {tb_dir} is dated {wait:.0f}s in the future (clock change?); TensorBoard "
            f"may read this segment's events before it"
        )
    elif wait > 0:
        time.sleep(wait)


def _segment_from_logs(kept_metrics: list[dict]) -> dict:
    """The segments before a checkpoint written by an xrpo that did not record them: one segment, its wall time the
    logged step time (a lower bound: setup, validation and checkpoint time are not in time/step)."""
    kept_metrics = list({r["step"]: r for r in kept_metrics}.values())  # an older resume logged some steps twice
    return {
        "start_step": 0,
        "end_step": max((r["step"] for r in kept_metrics), default=0),
        "wall_time_s": sum(r.get("time/step", 0.0) for r in kept_metrics),
        "steps": len(kept_metrics),
        "rollouts": sum(r.get("rollout/count", 0.0) for r in kept_metrics),
        "tokens": sum(r.get("loss/tokens", 0.0) for r in kept_metrics),
        "estimated_from_logs": True,
    }


def discarded_totals(output: Path) -> dict:
    """The work every resume of the run set aside, from its *.discarded.jsonl files: also that of a process killed
    before it wrote a checkpoint, whose segment no checkpoint records."""
    gone = {}
    for name in ("metrics.jsonl", "eval.jsonl"):
        path = discarded_path(Path(output) / name)
        rows = []
        for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # an append cut short by a crash: the row is still in the record
                continue
            if isinstance(row, dict) and "step" in row:  # not an {"unreadable_line": ...}
                rows.append(row)
        gone[name] = rows
    return {
        "discarded_steps": 0,
        "discarded_time_s": 0.0,
        "discarded_rollouts": 0.0,
        "discarded_tokens": 0.0,
        **_discarded_figures(gone),
    }


def _discarded_figures(gone: dict[str, list[dict]]) -> dict:
    """What set-aside rows had cost: steps run (a step set aside by two resumes counts twice), their logged time,
    rollouts and tokens."""
    metrics, evals = gone["metrics.jsonl"], gone["eval.jsonl"]
    if not metrics and not evals:
        return {}
    return {
        "discarded_steps": len(metrics),
        "discarded_time_s": sum(r.get("time/step", 0.0) for r in metrics)
        + sum(r.get("time/validate", 0.0) for r in evals),
        "discarded_rollouts": sum(r.get("rollout/count", 0.0) for r in metrics),
        "discarded_tokens": sum(r.get("loss/tokens", 0.0) for r in metrics),
    }
