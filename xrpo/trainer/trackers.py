"""Experiment trackers: where a run's metrics go besides metrics.jsonl. TensorBoard, Weights & Biases and MLflow, each
a registered `Tracker` chosen by name in the config's ``report_to`` (``report_to=[tensorboard,wandb]``); a third-party
tracker is one ``@register_tracker("name")`` class away.

What each gets: every row of metrics.jsonl and eval.jsonl (same names, same step), the config (at the start of the
run), the sample tables (every ``log_samples_every`` steps), the per-prompt extra allocations (a histogram, where the
tracker has them) and, at the end, the report's plots (``xrpo report``'s PNGs).

Start and failure. Every tracker of the run is started before any model or data is loaded (``start_trackers``): a
missing package is refused earlier still (xrpo.trainer.preflight), and a tracker that cannot start (no W&B login in
online mode, an MLflow server that does not answer) fails the run then, naming the tracker. A tracker that fails
later is logged and dropped, and the run goes on: metrics.jsonl holds every row whatever the trackers do.

Resume. A resumed run continues the same tracked run: ``trackers.json`` in the run directory keeps each tracker's run
(W&B's run id, opened again with ``resume="allow"``; MLflow's tracking URI and run id). TensorBoard's event files are
brought back to the checkpoint (xrpo.trainer.records) and continue with a restart marker. W&B and MLflow keep what
they were sent: the steps a killed process logged after its last checkpoint stay there, and the resumed run logs them
again, so each step's *last* value in those trackers is the one in metrics.jsonl. W&B's x axis is the logged ``step``
(``define_metric``), not its own counter, which a resumed offline run restarts.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

from xrpo.rundir.files import write_atomic
from xrpo.trainer.config_loader import flatten
from xrpo.trainer.records import TB_DIR

STATE_FILE = "trackers.json"
# TrainingStopped (SIGTERM / SIGINT) closes a run as "stopped": it goes on with --resume
STATUSES = ("finished", "stopped", "failed")


class TrackerError(ValueError):
    """A tracker that could not start (or continue) its run; the message names the tracker. A ValueError, as the
    other errors of a run's setup (`xrpo train` prints it as one line)."""


class Tracker:
    """One experiment tracker's run. The constructor starts the run (or continues the one ``saved`` describes, the
    dict its ``state()`` returned in an earlier segment) and raises on failure; the other methods log.

    ``module`` is the package it imports (checked before loading; "" for none), ``install`` the pip command that
    installs it."""

    name = ""
    module = ""
    install = "pip install 'xrpo[trackers]'"

    def __init__(self, output: Path, cfg, config: dict, saved: dict, *, resume_step: int | None, log=print):
        raise NotImplementedError

    def state(self) -> dict:
        """What trackers.json keeps to continue this run on resume."""
        return {}

    def log_metrics(self, step: int, metrics: dict) -> None:
        raise NotImplementedError

    def log_histogram(self, step: int, tag: str, values: Sequence[float]) -> None:
        """A distribution (the extra rollouts per prompt); a tracker without histograms ignores it."""

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None:
        raise NotImplementedError

    def log_images(self, step: int, images: dict[str, Path]) -> None:
        """PNG files, by name."""
        raise NotImplementedError

    def sync(self) -> None:
        """Before a checkpoint: push what is buffered to its files."""

    def close(self, status: str) -> None:
        """End this segment's run: ``status`` is one of STATUSES."""
        raise NotImplementedError


TRACKERS: dict[str, type[Tracker]] = {}


def register_tracker(name: str):
    """Class decorator: ``@register_tracker("name")`` makes ``report_to=[name]`` use the class. A name registered
    twice is refused."""

    def deco(cls: type[Tracker]) -> type[Tracker]:
        if name in TRACKERS:
            raise ValueError(f"tracker {name!r} is already registered ({TRACKERS[name].__qualname__})")
        cls.name = name
        TRACKERS[name] = cls
        return cls

    return deco


def get_tracker(name: str) -> type[Tracker]:
    if name not in TRACKERS:
        raise ValueError(f"unknown tracker {name!r}; valid: {', '.join(sorted(TRACKERS))}")
    return TRACKERS[name]


def selected(cfg) -> list[str]:
    """The trackers a run logs to: ``report_to``, and TensorBoard also when ``tensorboard`` is true (the default) and
    the package is installed (a tracker named in ``report_to`` must be installed: preflight refuses it otherwise)."""
    import importlib.util

    names = list(dict.fromkeys(cfg.report_to))
    if cfg.tensorboard and "tensorboard" not in names and importlib.util.find_spec("tensorboard") is not None:
        names.insert(0, "tensorboard")
    return names


def start_trackers(output: Path, cfg, config: dict, *, resume_step: int | None, log=print) -> list[Tracker]:
    """Start (or, on resume, continue) each selected tracker's run and record them in ``output/trackers.json``.
    Raises TrackerError naming the first tracker that fails (those started before it are closed as failed)."""
    output = Path(output)
    path = output / STATE_FILE
    saved = {}
    if resume_step is not None and path.is_file():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise TrackerError(f"{path}: not valid JSON ({e}); it names the tracked runs this run continues") from None
    started: list[Tracker] = []
    for name in selected(cfg):
        try:
            started.append(
                get_tracker(name)(output, cfg, config, saved.get(name, {}), resume_step=resume_step, log=log)
            )
        except Exception as e:
            for t in started:
                t.close("failed")
            raise TrackerError(f"report_to {name}: the tracker could not start its run: {type(e).__name__}: {e}") from e
    states = {**saved, **{t.name: t.state() for t in started if t.state()}}
    if states != saved:
        write_atomic(path, json.dumps(states, indent=1))
    return started


def _markdown_table(columns: list[str], rows: list[list]) -> str:
    def cell(x) -> str:
        return str(x).replace("|", "\\|").replace("\n", "\\n")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(x) for x in r) + " |" for r in rows])


# ================================================================================================ TensorBoard
@register_tracker("tensorboard")
class TensorBoardTracker(Tracker):
    """Event files in ``output/tensorboard`` (torch's SummaryWriter). On resume the files were brought back to the
    checkpoint (xrpo.trainer.records); the new file starts with a restart marker (``purge_step``) so that a TensorBoard
    already showing the run hides its events of later steps."""

    module = "tensorboard"
    install = "pip install 'xrpo[tensorboard]'"

    def __init__(self, output: Path, cfg, config: dict, saved: dict, *, resume_step: int | None, log=print):
        import yaml
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(output) / TB_DIR
        if resume_step is not None:
            _wait_to_sort_last(self.dir, log)
        self.writer = SummaryWriter(str(self.dir), purge_step=resume_step + 1 if resume_step is not None else None)
        if resume_step is None:
            self.writer.add_text("config", "```yaml\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)

    def log_metrics(self, step: int, metrics: dict) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)

    def log_histogram(self, step: int, tag: str, values: Sequence[float]) -> None:
        import numpy as np

        self.writer.add_histogram(tag, np.asarray(values), step)

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None:
        self.writer.add_text(name, _markdown_table(columns, rows), step)

    def log_images(self, step: int, images: dict[str, Path]) -> None:
        from matplotlib.image import imread

        for name, path in images.items():
            # imread gives the PNG as floats in [0, 1], height x width x RGB(A)
            self.writer.add_image(f"report/{name}", imread(str(path))[..., :3], step, dataformats="HWC")

    def sync(self) -> None:
        # SummaryWriter writes from a background thread and, with TensorFlow installed, through a buffer it flushes
        # every two minutes: a kill could lose steps the checkpoint has. (Without TensorFlow each event reaches the
        # file within milliseconds, so no test here fails without this flush.)
        self.writer.flush()
        for path in self.dir.glob("*tfevents*"):  # an fsync of any descriptor syncs the file
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def close(self, status: str) -> None:
        self.writer.close()


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


# ================================================================================================ Weights & Biases
@register_tracker("wandb")
class WandbTracker(Tracker):
    """A W&B run in ``output/wandb`` (online, or offline with ``WANDB_MODE=offline``: ``wandb sync output/wandb``
    uploads it later). Project ``tracker_project``, name ``tracker_run_name``; entity and mode come from W&B's own
    environment variables (WANDB_ENTITY, WANDB_MODE). xrpo's stdout is not captured (``console="off"``)."""

    module = "wandb"

    def __init__(self, output: Path, cfg, config: dict, saved: dict, *, resume_step: int | None, log=print):
        import wandb

        kw = {}
        if saved.get("run_id"):
            kw = {"id": saved["run_id"], "resume": "allow"}
        self.run = wandb.init(
            project=saved.get("project") or cfg.tracker_project,
            name=cfg.tracker_run_name or Path(output).name,
            dir=str(output),
            config=config,
            reinit="create_new",  # never hand back (or finish) another run of this process
            settings=wandb.Settings(console="off"),
            **kw,
        )
        if resume_step is not None and saved.get("run_id") and self.run.id != saved["run_id"]:
            raise TrackerError(f"asked W&B to continue run {saved['run_id']}, got {self.run.id}")
        # the chart's x axis is the training step: W&B's own counter restarts in a resumed offline run
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def state(self) -> dict:
        return {"run_id": self.run.id, "project": self.run.project}

    def log_metrics(self, step: int, metrics: dict) -> None:
        self.run.log({"step": step, **metrics})

    def log_histogram(self, step: int, tag: str, values: Sequence[float]) -> None:
        import wandb

        self.run.log({"step": step, tag: wandb.Histogram(list(values))})

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None:
        import wandb

        self.run.log({"step": step, name: wandb.Table(columns=columns, data=rows)})

    def log_images(self, step: int, images: dict[str, Path]) -> None:
        import wandb

        self.run.log({"step": step, **{f"report/{k}": wandb.Image(str(p)) for k, p in images.items()}})

    def close(self, status: str) -> None:
        self.run.finish(exit_code=1 if status == "failed" else 0)


# ================================================================================================ MLflow
def mlflow_name(key: str) -> str:
    """A metric's name in MLflow, which allows only letters, digits and ``_-. :/``: "@" becomes "_at_"
    (``eval/pass_at_1``), any other character "_"."""
    return re.sub(r"[^\w\-. :/]", "_", key.replace("@", "_at_"))


@register_tracker("mlflow")
class MlflowTracker(Tracker):
    """An MLflow run in experiment ``tracker_project`` at ``mlflow_tracking_uri`` (else MLFLOW_TRACKING_URI, else a
    file store in ``output/mlruns``: no server, no database). MLflow 3 keeps its file store in maintenance mode and
    refuses it unless MLFLOW_ALLOW_FILE_STORE is true; for a file store xrpo sets that variable when it is unset.
    The config goes in as parameters (flattened: ``method.name``) and as ``config.yaml``; sample tables and plots as
    artifacts (``samples/step_00000005.json``, ``report/*.png``). Metric names are `mlflow_name`'s (MLflow refuses
    "@": ``eval/pass_at_1``). MLflow keeps a value per (metric, step, time):
    a resumed step adds a value at that step rather than replacing the old one."""

    module = "mlflow"

    def __init__(self, output: Path, cfg, config: dict, saved: dict, *, resume_step: int | None, log=print):
        import yaml
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = (
            saved.get("tracking_uri")
            or cfg.mlflow_tracking_uri
            or os.environ.get("MLFLOW_TRACKING_URI")
            or (Path(output) / "mlruns").resolve().as_uri()
        )
        if uri.startswith("file:") or ":" not in uri:  # a file store: file:/path or a plain path
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        if saved.get("run_id"):
            self.run_id = saved["run_id"]
            self.client.get_run(self.run_id)  # raises if the run is not there
            self.client.update_run(self.run_id, status="RUNNING")
            self.client.set_tag(self.run_id, "xrpo.resumed_from_step", str(resume_step))
            return
        name = cfg.tracker_project
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            try:
                exp_id = self.client.create_experiment(name)
            except Exception:  # another run created it meanwhile
                exp = self.client.get_experiment_by_name(name)
                if exp is None:
                    raise
                exp_id = exp.experiment_id
        else:
            exp_id = exp.experiment_id
        run = self.client.create_run(
            exp_id, run_name=cfg.tracker_run_name or Path(output).name, tags={"xrpo.output": str(Path(output))}
        )
        self.run_id = run.info.run_id
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        params = [Param(k, str(v)[:MAX_PARAM_VAL_LENGTH]) for k, v in flatten(config).items()]
        for i in range(0, len(params), 100):  # log_batch takes at most 100 parameters
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.client.log_text(self.run_id, yaml.safe_dump(config, sort_keys=False), "config.yaml")

    def state(self) -> dict:
        return {"tracking_uri": self.uri, "run_id": self.run_id}

    def log_metrics(self, step: int, metrics: dict) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        batch = [Metric(mlflow_name(k), float(v), ts, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):  # log_batch takes at most 1000 metrics
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None:
        self.client.log_dict(self.run_id, {"columns": columns, "data": rows}, f"{name}/step_{step:08d}.json")

    def log_images(self, step: int, images: dict[str, Path]) -> None:
        for path in images.values():
            self.client.log_artifact(self.run_id, str(path), "report")

    def close(self, status: str) -> None:
        mlflow_status = {"finished": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}[status]
        self.client.set_terminated(self.run_id, status=mlflow_status)
