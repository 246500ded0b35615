"""Experiment trackers for real, offline: a short training run with report_to=[tensorboard, wandb, mlflow], stopped
by an error after a step its last checkpoint does not have and resumed, then every tracker read back (TensorBoard's
event files, W&B's offline run files, MLflow's file store) and compared with metrics.jsonl / eval.jsonl: every key at
every step, the config, the sample tables, the report's plots, one tracked run continued across the resume. Also the
registry, and a tracker that cannot start failing the run before anything is loaded."""

from __future__ import annotations

import importlib.util
import json
import math
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from xrpo.trainer.config_loader import build_config
from xrpo.trainer.loop import train
from xrpo.trainer.trackers import TRACKERS, Tracker, TrackerError, get_tracker, mlflow_name, register_tracker

HAS_ALL = all(importlib.util.find_spec(m) for m in ("tensorboard", "wandb", "mlflow", "matplotlib"))
needs_all = pytest.mark.skipif(not HAS_ALL, reason="needs the trackers extra: pip install 'xrpo[trackers,tensorboard]'")


def quiet(*_):
    pass


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """W&B offline and silent, its settings and caches in tmp_path (no login, no network, nothing in $HOME); MLflow
    from the config only."""
    for k, v in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
    }.items():
        monkeypatch.setenv(k, v)
    for k in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(k, raising=False)


# ================================================================================================ readers
def wandb_records(path: Path):
    """The records of a W&B run file (run-<id>.wandb). wandb 0.31 ships no reader of its own (the Python DataStore of
    earlier versions is gone with the move to wandb-core): the file is a 7-byte header (":W&B", magic 0xBEE1,
    version 0) then LevelDB's log format, 32 KiB blocks of chunks (crc32 u32, length u16, type u8: full 1, first 2,
    middle 3, last 4), each record a wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0), f"{path}: not a W&B run file"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if n == 0 and kind == 0:
            break
        buf += data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            yield rec
            buf = b""


def wandb_run(out: Path) -> dict:
    """Every offline segment of the run in out/wandb, in order: their run ids, config, and history rows."""
    files = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))  # the name starts with the start time
    got = {"ids": [], "config": {}, "history": [], "files": files}
    for f in files:
        for rec in wandb_records(f):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                got["ids"].append(rec.run.run_id)
                got["config"].update({u.key: json.loads(u.value_json) for u in rec.run.config.update})
            elif kind == "history":
                got["history"].append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
                )
    return got


def tb_run(tb_dir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def expected(out: Path) -> dict[tuple[str, int], float]:
    """(key, step) -> value of every metrics.jsonl and eval.jsonl row (a resumed run keeps each step once)."""
    want = {}
    for name in ("metrics.jsonl", "eval.jsonl"):
        for r in rows(out / name):
            for k, v in r.items():
                if k != "step":
                    assert (k, r["step"]) not in want, (name, k, r["step"])
                    want[(k, r["step"])] = float(v)
    return want


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


# ================================================================================================ the real run
STEPS, SAVE_EVERY = 4, 2


class Stop(Exception):
    pass


@needs_all
@pytest.mark.slow
def test_every_tracker_holds_every_metric_and_continues_its_run_on_resume(trainer_env, tmp_path, offline):
    from mlflow.tracking import MlflowClient

    from xrpo.cli import _report_plots

    out = tmp_path / "run"
    ov = trainer_env["overrides"](out, "xrpo", steps=STEPS)
    ov = [o for o in ov if not o.startswith(("tensorboard=", "save_every=", "eval_every=", "log_samples_every="))]
    ov += [
        "report_to=[tensorboard,wandb,mlflow]",
        "tensorboard=true",
        f"save_every={SAVE_EVERY}",
        "eval_every=2",
        "log_samples_every=1",
        "tracker_project=xrpo-test",
    ]

    def stop_at_3(report):  # after step 3 is logged, before its checkpoint: the tracked runs hold a step to redo
        if report.step == 3:
            raise Stop

    logs0: list[str] = []
    with pytest.raises(Stop):
        train(build_config(None, ov), log=logs0.append, on_step=stop_at_3, plots=_report_plots)
    assert not [line for line in logs0 if "warning" in line], logs0
    first = json.loads((out / "trackers.json").read_text())
    mlflow_history_before = [
        m.step
        for m in MlflowClient(first["mlflow"]["tracking_uri"]).get_metric_history(
            first["mlflow"]["run_id"], "rollout/reward_mean"
        )
    ]
    assert mlflow_history_before == [1, 2, 3]
    logs: list[str] = []
    summary = train(None, resume=str(out), log=logs.append, plots=_report_plots)
    assert summary["steps"] == STEPS and summary["num_segments"] == 2
    assert json.loads((out / "trackers.json").read_text()) == first  # the same tracked runs
    assert any("trackers: tensorboard, wandb, mlflow" in line for line in logs)

    want = expected(out)
    keys = {k for k, _ in want}
    assert {s for k, s in want if k == "rollout/reward_mean"} == set(range(1, STEPS + 1))
    assert {s for k, s in want if k == "eval/pass@1"} == {0, 2, STEPS}
    samples = rows(out / "samples.jsonl")
    assert sorted({r["step"] for r in samples}) == list(range(1, STEPS + 1))
    plots = sorted(p.stem for p in (out / "report").glob("*.png"))
    assert plots, "the report made no plots"

    # -------- W&B: one run id in both segments; each (key, step)'s last value is metrics.jsonl's
    wb = wandb_run(out)
    assert len(wb["files"]) == 2 and wb["ids"] == [first["wandb"]["run_id"]] * 2
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert {k: v for k, v in wb["config"].items() if k != "_wandb"} == config
    last: dict[tuple[str, int], float] = {}
    logged_twice = set()
    for h in wb["history"]:
        media = tuple(k[: -len("_type")] for k in h if k.endswith("/_type"))  # a table's, an image's fields
        for k, v in h.items():
            if isinstance(v, (int, float)) and not k.startswith(("_", *media)) and k != "step":
                logged_twice |= {(k, h["step"])} & set(last)
                last[(k, h["step"])] = float(v)
    assert set(last) == set(want)
    bad = [(k, s, last[(k, s)], v) for (k, s), v in want.items() if not same(last[(k, s)], v)]
    assert not bad, bad[:5]
    assert ("rollout/reward_mean", 3) in logged_twice  # stopped after step 3, resumed from 2: step 3 sent again
    tables = [h for h in wb["history"] if h.get("samples/_type") == "table-file"]
    # the stop came before step 3's table (on_step runs before log_samples): each step's table once
    assert [h["step"] for h in tables] == [1, 2, 3, 4]
    files_dir = wb["files"][-1].parent / "files"
    for h in tables[-2:]:  # the resumed run's: its tables are samples.jsonl's rows
        table = json.loads((files_dir / h["samples/path"]).read_text())
        mine = [r for r in samples if r["step"] == h["step"]]
        assert table["columns"][:3] == ["step", "problem", "reference"]
        assert [dict(zip(table["columns"], row)) for row in table["data"]] == mine
    images = {k.split("/")[1] for h in wb["history"] for k in h if k.startswith("report/") and k.endswith("/_type")}
    assert images == set(plots)

    # -------- MLflow: one run, continued; each metric's last value per step is metrics.jsonl's
    client = MlflowClient(first["mlflow"]["tracking_uri"])
    run = client.get_run(first["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["xrpo.resumed_from_step"] == str(SAVE_EVERY)
    assert len(client.search_runs([run.info.experiment_id])) == 1
    assert client.get_experiment(run.info.experiment_id).name == "xrpo-test"
    assert set(run.data.metrics) == {mlflow_name(k) for k in keys}
    assert "eval/pass_at_1" in run.data.metrics  # MLflow refuses "@"
    for key in keys:
        hist = client.get_metric_history(run.info.run_id, mlflow_name(key))
        by_step: dict[int, float] = {}
        for m in sorted(hist, key=lambda m: m.timestamp):  # stable: a step's values in the order they were sent
            by_step[m.step] = m.value
        assert by_step.keys() == {s for k, s in want if k == key}, key
        for s, v in by_step.items():
            assert same(v, want[(key, s)]), (key, s, v, want[(key, s)])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "rollout/reward_mean")] == [1, 2, 3, 3, 4]
    assert run.data.params["method.name"] == "xrpo" and run.data.params["steps"] == str(STEPS)
    art = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "mlflow-artifacts")))
    assert yaml.safe_load((art / "config.yaml").read_text()) == yaml.safe_load((out / "config.yaml").read_text())
    for s in range(1, STEPS + 1):
        table = json.loads((art / "samples" / f"step_{s:08d}.json").read_text())
        assert [dict(zip(table["columns"], row)) for row in table["data"]] == [r for r in samples if r["step"] == s]
    assert sorted(p.stem for p in (art / "report").glob("*.png")) == plots

    # -------- TensorBoard: brought back to step 2 on resume, so every step once; float32 values
    acc = tb_run(out / "tensorboard")
    assert set(acc.Tags()["scalars"]) == keys
    for key in keys:
        events = acc.Scalars(key)
        assert [e.step for e in events] == sorted(s for k, s in want if k == key), key
        for e in events:
            assert same(e.value, float(np.float32(want[(key, e.step)]))), (key, e.step)
    assert {t.split("/", 1)[1] for t in acc.Tags()["images"]} == set(plots)
    text_tags = set(acc.Tags()["tensors"])
    assert {"config/text_summary", "samples/text_summary"} <= text_tags
    assert [e.step for e in acc.Tensors("samples/text_summary")] == list(range(1, STEPS + 1))


# ================================================================================================ failing at start
@needs_all
def test_a_tracker_that_cannot_start_fails_the_run_before_loading(trainer_env, tmp_path, offline, monkeypatch):
    import xrpo.trainer.loop as loop
    import xrpo.trainer.setup as setup

    def fail(*_, **__):
        raise AssertionError("data or a model was loaded before the trackers started")

    for module, name in ((setup, "load_data"), (setup, "load_model"), (loop, "build_engine")):
        monkeypatch.setattr(module, name, fail)
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    ov = trainer_env["overrides"](tmp_path / "run", "xrpo", steps=1) + [
        "report_to=[wandb,mlflow]",
        f"mlflow_tracking_uri=file:{not_a_dir}",
    ]
    with pytest.raises(TrackerError, match=r"report_to mlflow: the tracker could not start its run: .*a-file"):
        train(build_config(None, ov), log=quiet)
    # the W&B run started before it was closed as failed: its file ends with the exit record
    files = sorted((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    # wandb-core, a process of its own, writes the file: finish() returns once the service has the exit record, and
    # the file may get it a moment later on a loaded machine (read at once, CI once found none), so read until it
    # is there
    deadline = time.monotonic() + 60
    while True:
        exits = [r.exit.exit_code for r in wandb_records(files[0]) if r.WhichOneof("record_type") == "exit"]
        if exits or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert exits == [1]


def test_the_cli_prints_a_tracker_that_cannot_start_as_one_line(trainer_env, tmp_path, offline, capsys):
    pytest.importorskip("mlflow")
    pytest.importorskip("matplotlib")
    from xrpo.cli import main

    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    ov = trainer_env["overrides"](tmp_path / "run", "xrpo", steps=1)
    assert main(["train", *ov, "report_to=[mlflow]", f"mlflow_tracking_uri=file:{not_a_dir}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("xrpo train: error: report_to mlflow: the tracker could not start its run: NotADirectory")


# ================================================================================================ registry
def test_an_unknown_tracker_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown tracker 'nope'; valid: mlflow, tensorboard, wandb"):
        get_tracker("nope")


def test_a_name_registered_twice_is_refused():
    with pytest.raises(ValueError, match=r"tracker 'wandb' is already registered \(WandbTracker\)"):

        @register_tracker("wandb")
        class Other(Tracker):
            pass

    assert TRACKERS["wandb"].__name__ == "WandbTracker"


# ================================================================================================ TensorBoard resume
def test_a_resumed_tensorboard_writes_after_the_old_event_files_and_marks_the_restart(tmp_path):
    """TensorBoard reads a run's event files in name order (a name starts with its writer's start second) and, at a
    restart marker (SessionLog START, SummaryWriter's purge_step), hides what it read of later steps."""
    pytest.importorskip("tensorboard")
    import socket
    import time

    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    from xrpo.trainer.config import TrainConfig
    from xrpo.trainer.logging import RunLogger

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "x": 1.0}) + "\n" for s in range(1, 6)))
    tb = run / "tensorboard"
    tb.mkdir()
    # the killed segment's file, started this very second by a process whose pid sorts last
    old = tb / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.99999999.0"
    old.write_bytes(b"")
    cfg = TrainConfig(tensorboard=True, progress=False)
    logger = RunLogger(run, cfg, resume_state={"step": 3, "eval_history": [{"step": 0}, {"step": 2}]}, log=quiet)
    logger.log_step(4, {"rollout/count": 16.0})
    logger.close({"method": "x", "steps": 4, "wall_time_s": 1.0, "output": str(run)})
    files = sorted(p for p in tb.iterdir() if "tfevents" in p.name)
    assert files[0] == old and len(files) == 2
    events = [Event.FromString(r) for r in RawEventFileLoader(str(files[1])).Load()]
    starts = [e.step for e in events if e.HasField("session_log") and e.session_log.status == SessionLog.START]
    assert starts == [4]
