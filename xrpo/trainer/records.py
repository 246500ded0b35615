"""A run's records across its segments: what ``--resume`` does to them, and what each segment did.

A resumed run's records are one run. Every JSONL row is flushed when it is written, and every record (TensorBoard's
buffered events included) is flushed and fsynced before a checkpoint is written, so a checkpoint of step k never
outlives the rows of steps <= k. ``--resume`` from step k then brings each record back to step k before training
continues (``rewind_records``): rows of later steps (written by the killed process after its last checkpoint, which
the resumed run writes again) move to ``<name>.discarded.jsonl`` (``tensorboard/discarded-events.tfrecord`` for event
files), which nothing reads; the record itself is rewritten atomically. A validation row belongs to the checkpoint
only if it is in the checkpoint's ``eval_history``: the final validation, made after the last checkpoint, is made
again on resume. (W&B and MLflow runs cannot be rewound: they keep what the killed process logged, and the resumed
run logs those steps again, so each step's last value there is the one in metrics.jsonl; xrpo.trainer.trackers.)

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

from xrpo.rundir.checkpoints import set_aside_later_checkpoints
from xrpo.rundir.files import fsync_dir, write_atomic
from xrpo.rundir.jsonl import read_jsonl, read_lines

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
    """(raw line, row) pairs; a last line cut short by a kill is (raw, None). Any other bad line is an error. Lines
    are kept byte for byte, so no row is recovered from a glued line (`xrpo.rundir.jsonl.read_lines`)."""
    lines, _ = read_lines(
        path, strict=True, glued=False, keep_unreadable=True, why="; cannot bring the record back to the checkpoint"
    )
    for ln in lines:
        if ln.row is not None and not (isinstance(ln.row, dict) and isinstance(ln.row.get("step"), int)):
            raise ValueError(f"{path} line {ln.number}: expected a JSON object with an integer 'step'")
    return [(ln.text, ln.row) for ln in lines]


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


class Segments:
    """This process's segment of the run and the segments before it. With ``resume_state`` (the state.json of the
    checkpoint the run resumes from) it first brings the records in ``output`` back to that checkpoint
    (``rewind_records``); ``t_start`` is when this process started (its segment's wall time counts from there)."""

    def __init__(self, output: Path, *, resume_state: dict | None = None, t_start: float | None = None, log=print):
        self.output = Path(output)
        self._t_start = time.perf_counter() if t_start is None else t_start
        self.start_step = 0
        self._before: list[dict] = []
        discarded: dict = {}
        if resume_state is not None:
            self.start_step = int(resume_state["step"])
            rewound = rewind_records(self.output, self.start_step, resume_state.get("eval_history", []), log=log)
            self._before = [dict(s) for s in resume_state.get("segments") or [_segment_from_logs(rewound["kept"])]]
            discarded = _discarded_figures(rewound["discarded"])
        self._segment = {
            "start_step": self.start_step,
            "end_step": self.start_step,
            "wall_time_s": 0.0,
            "steps": 0,
            "rollouts": 0.0,
            "tokens": 0.0,
            **discarded,
        }

    @property
    def number(self) -> int:
        """This segment's number in the run, from 1."""
        return len(self._before) + 1

    def add_step(self, row: dict) -> None:
        """Count a logged metrics row in this segment."""
        self._segment["steps"] += 1
        self._segment["rollouts"] += row.get("rollout/count", 0.0)
        self._segment["tokens"] += row.get("loss/tokens", 0.0)

    def current(self, step: int) -> dict:
        """This segment up to ``step``, now."""
        self._segment.update(end_step=step, wall_time_s=time.perf_counter() - self._t_start)
        return dict(self._segment)

    def all(self, step: int) -> list[dict]:
        """Every segment of the run, this one up to ``step``: what a checkpoint's state.json keeps."""
        return self._before + [self.current(step)]

    def run_totals(self, step: int) -> dict:
        """summary.json's figures over all segments of the run (docs/metrics.md, Run totals)."""
        segs = self.all(step)
        return {
            "wall_time_s": sum(s["wall_time_s"] for s in segs),
            **discarded_totals(self.output),
            "rollouts": sum(s["rollouts"] for s in segs),
            "tokens": sum(s["tokens"] for s in segs),
            "num_segments": len(segs),
            "segments": segs,
        }


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
        # an append cut short by a crash is skipped: the row is still in the record
        lines, _ = read_jsonl(path, glued=False)
        rows = [row for row in lines if isinstance(row, dict) and "step" in row]  # not an {"unreadable_line": ...}
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
