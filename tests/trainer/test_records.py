"""xrpo.trainer.records on hand-written records: what a resume from checkpoint step k keeps, sets aside, and refuses
(rewind_records), and the segments it counts (Segments)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from xrpo.trainer.records import Segments, discarded_path, rewind_records


def quiet(*_):
    pass


def write(path: Path, rows: list[dict]) -> str:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text)
    return text


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def metrics_row(step: int) -> dict:
    return {"step": step, "rollout/count": 16.0, "loss/tokens": 40.0 + step, "time/step": 0.5}


@pytest.fixture
def run(tmp_path):
    """A run killed at step 5 whose last checkpoint is step 3; it validated at 0, 2 (eval_every) and 3 (a final
    validation after the step-3 checkpoint, e.g. a time limit, then killed before its summary)."""
    out = tmp_path / "run"
    out.mkdir()
    write(out / "metrics.jsonl", [metrics_row(s) for s in range(1, 6)])
    write(out / "rounds.jsonl", [{"step": s, "round": r, "alloc": [1, 2]} for s in range(1, 6) for r in (0, 1)])
    write(out / "samples.jsonl", [{"step": s, "problem": f"p{s}"} for s in range(1, 6)])
    write(out / "eval.jsonl", [{"step": s, "eval/pass@1": s / 10, "time/validate": 0.25} for s in (0, 2, 3)])
    return out


def test_rows_after_the_checkpoint_are_set_aside_verbatim(run):
    texts = {n: (run / n).read_text() for n in ("metrics.jsonl", "rounds.jsonl", "samples.jsonl", "eval.jsonl")}
    history = [{"step": 0, "eval/pass@1": 0.0}, {"step": 2, "eval/pass@1": 0.2}]
    logs: list[str] = []
    got = rewind_records(run, 3, history, log=logs.append)
    assert got["rows"] == {"metrics.jsonl": 2, "rounds.jsonl": 4, "samples.jsonl": 2, "eval.jsonl": 1}
    # kept rows byte for byte: the record is the old file's first lines
    for name, n_kept in (("metrics.jsonl", 3), ("rounds.jsonl", 6), ("samples.jsonl", 3), ("eval.jsonl", 2)):
        lines = texts[name].splitlines(keepends=True)
        assert (run / name).read_text() == "".join(lines[:n_kept]), name
        assert discarded_path(run / name).read_text() == "".join(lines[n_kept:]), name
    assert [r["step"] for r in got["kept"]] == [1, 2, 3]
    assert [r["step"] for r in got["discarded"]["metrics.jsonl"]] == [4, 5]
    # the final validation at the checkpoint's own step was not in the checkpoint: set aside
    assert [r["step"] for r in got["discarded"]["eval.jsonl"]] == [3]
    assert logs == [
        "records brought back to step 3: set aside 2 rows of metrics.jsonl, 4 rows of rounds.jsonl, "
        "2 rows of samples.jsonl, 1 row of eval.jsonl (steps 4-5), written after the checkpoint; kept "
        "in *.discarded.jsonl"
    ]

    # a second resume from the same checkpoint finds nothing more to set aside
    again = rewind_records(run, 3, history, log=quiet)
    assert again["rows"] == {} and len(rows(run / "metrics.discarded.jsonl")) == 2


def test_a_validation_in_the_checkpoint_is_kept_even_at_its_step(run):
    history = [{"step": 0}, {"step": 2}, {"step": 3}]
    got = rewind_records(run, 3, history, log=quiet)
    assert "eval.jsonl" not in got["rows"]
    assert [r["step"] for r in rows(run / "eval.jsonl")] == [0, 2, 3]


def test_a_validation_not_in_the_checkpoint_is_set_aside_even_before_its_step(run):
    # eval.jsonl ends up as the checkpoint's validations: a row repeated by an older xrpo goes aside
    write(run / "eval.jsonl", [{"step": 0, "eval/pass@1": 0.1}, {"step": 0, "eval/pass@1": 0.1}, {"step": 2}])
    rewind_records(run, 3, [{"step": 0}, {"step": 2}], log=quiet)
    assert [r["step"] for r in rows(run / "eval.jsonl")] == [0, 2]
    assert rows(run / "eval.discarded.jsonl") == [{"step": 0, "eval/pass@1": 0.1}]


def test_a_line_cut_short_by_the_kill_is_set_aside(run):
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "rollout/co')
    got = rewind_records(run, 5, [{"step": 0}, {"step": 2}, {"step": 3}], log=quiet)
    assert [r["step"] for r in rows(run / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    assert rows(run / "metrics.discarded.jsonl") == [{"unreadable_line": '{"step": 6, "rollout/co'}]
    assert got["discarded"]["metrics.jsonl"] == []


@pytest.mark.parametrize(
    "bad, match",
    [
        ("not json", r"samples\.jsonl line 2: not valid JSON"),
        ('{"problem": "p"}', r"samples\.jsonl line 2: expected a JSON object with an integer 'step'"),
    ],
)
def test_a_bad_line_is_refused_before_any_record_changes(run, bad, match):
    lines = (run / "samples.jsonl").read_text().splitlines()
    (run / "samples.jsonl").write_text("\n".join([lines[0], bad] + lines[1:]) + "\n")
    before = {p.name: p.read_text() for p in run.iterdir()}
    with pytest.raises(ValueError, match=match):
        rewind_records(run, 3, [{"step": 0}, {"step": 2}], log=quiet)
    assert {p.name: p.read_text() for p in run.iterdir()} == before


def test_missing_rows_of_checkpointed_steps_are_reported(run):
    write(run / "metrics.jsonl", [metrics_row(s) for s in (1, 3, 4)])
    logs: list[str] = []
    rewind_records(run, 3, [{"step": 0}, {"step": 2}], log=logs.append)
    assert any("metrics.jsonl has no row for 1 of steps 1-3 (first: 2)" in x for x in logs)


def test_later_checkpoints_and_a_stale_summary_are_set_aside(run):
    for s in (3, 4, 5):
        d = run / "checkpoints" / f"step-{s:08d}"
        d.mkdir(parents=True)
        (d / "state.json").write_text(json.dumps({"step": s}))
        (d / "COMPLETE").write_text("ok\n")
    (run / "checkpoints" / "discarded-step-00000005").mkdir()  # set aside by an earlier resume
    (run / "summary.json").write_text('{"steps": 5}')
    rewind_records(run, 3, [{"step": 0}, {"step": 2}], log=quiet)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "discarded-step-00000004",
        "discarded-step-00000005",
        "discarded-step-00000005-2",
        "step-00000003",
    ]
    assert not (run / "summary.json").exists()
    assert json.loads((run / "summary.discarded.json").read_text()) == {"steps": 5}


def test_tensorboard_events_after_the_checkpoint_are_set_aside(run):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from torch.utils.tensorboard import SummaryWriter

    tb = run / "tensorboard"
    w = SummaryWriter(str(tb))
    for s in range(1, 6):
        w.add_scalar("rollout/reward_mean", s / 10, s)
    for s in (0, 2, 3):  # the validations of eval.jsonl
        w.add_scalar("eval/pass@1", s / 10, s)
        w.add_scalar("time/validate", 0.25, s)
    w.close()

    got = rewind_records(run, 3, [{"step": 0}, {"step": 2}], log=quiet)
    # steps 4, 5 of the reward; the final validation at step 3 (two tags)
    assert got["tb_events"] == 4
    acc = EventAccumulator(str(tb))
    acc.Reload()
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("rollout/reward_mean")] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert [e.step for e in acc.Scalars("eval/pass@1")] == [0, 2]
    assert [e.step for e in acc.Scalars("time/validate")] == [0, 2]
    discarded = Counter()
    for rec in RawEventFileLoader(str(tb / "discarded-events.tfrecord")).Load():
        discarded.update((Event.FromString(rec).step, v.tag) for v in Event.FromString(rec).summary.value)
    assert discarded == Counter(
        {(4, "rollout/reward_mean"): 1, (5, "rollout/reward_mean"): 1, (3, "eval/pass@1"): 1, (3, "time/validate"): 1}
    )
    assert sorted(p.name for p in tb.iterdir() if "tfevents" in p.name) == [
        next(p.name for p in tb.iterdir() if p.name.startswith("events.out"))
    ]  # rewritten in place, no stray file


def test_segments_of_a_checkpoint_without_them_come_from_the_logs(run):
    """A checkpoint of an xrpo that did not record segments: the kept rows give one estimated segment; the rows set
    aside give what the new segment discarded."""
    segments = Segments(run, resume_state={"step": 3, "eval_history": [{"step": 0}, {"step": 2}]}, log=quiet)
    segs = segments.run_totals(3)["segments"]
    # kept steps 1-3: time 3 x 0.5, rollouts 3 x 16, tokens 41 + 42 + 43
    assert segs[0] == {
        "start_step": 0,
        "end_step": 3,
        "wall_time_s": 1.5,
        "steps": 3,
        "rollouts": 48.0,
        "tokens": 126.0,
        "estimated_from_logs": True,
    }
    # set aside: steps 4, 5 (2 x 0.5 s, 2 x 16 rollouts, 44 + 45 tokens) and the validation at 3 (0.25 s)
    assert {k: v for k, v in segs[1].items() if k.startswith("discarded_")} == {
        "discarded_steps": 2,
        "discarded_time_s": 1.25,
        "discarded_rollouts": 32.0,
        "discarded_tokens": 89.0,
    }
    assert (segs[1]["start_step"], segs[1]["steps"]) == (3, 0)


def test_summary_totals_count_work_set_aside_by_every_resume(run):
    """Killed at step 5 after checkpoint 3, resumed, killed again at 5 before checkpoint 6, resumed again: no
    checkpoint records the second process, but its rows and the first process's are both set aside and counted."""
    write(run / "metrics.discarded.jsonl", [metrics_row(4), metrics_row(5)])  # the first resume's
    seg1 = {"start_step": 0, "end_step": 3, "wall_time_s": 9.0, "steps": 3, "rollouts": 48.0, "tokens": 126.0}
    segments = Segments(
        run, resume_state={"step": 3, "eval_history": [{"step": 0}, {"step": 2}], "segments": [seg1]}, log=quiet
    )
    totals = segments.run_totals(3)
    assert totals["num_segments"] == 2 and totals["segments"][0] == seg1
    assert totals["segments"][1]["discarded_steps"] == 2  # what this resume set aside
    # all set-aside rows: steps 4, 5 twice (4 x 0.5 s, 4 x 16 rollouts, 2 x (44 + 45) tokens) + the validation at 3
    assert {k: v for k, v in totals.items() if k.startswith("discarded_")} == {
        "discarded_steps": 4,
        "discarded_time_s": 2.25,
        "discarded_rollouts": 64.0,
        "discarded_tokens": 178.0,
    }
    assert totals["wall_time_s"] == pytest.approx(9.0 + totals["segments"][1]["wall_time_s"], rel=1e-12)
