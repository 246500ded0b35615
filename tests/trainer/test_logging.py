"""RunLogger with trackers from the public registry: what each is sent, a tracker that fails mid-run dropped while
the run goes on, and the trackers' runs closed however the run ends."""

from __future__ import annotations

import json
import re

import pytest

from xrpo.trainer.config_loader import build_config
from xrpo.trainer.loop import train
from xrpo.trainer.trackers import TRACKERS, Tracker, register_tracker

CALLS: dict[str, list] = {}


class Recording(Tracker):
    """Keeps every call in CALLS[name]; fails where told to (``fail_at``: (method, step))."""

    fail_at: tuple[str, int] | None = None

    def __init__(self, output, cfg, config, saved, *, resume_step, log=print):
        CALLS[self.name] = [("start", resume_step, config["steps"])]

    def log_metrics(self, step, metrics):
        self._call("log_metrics", step, dict(metrics))

    def log_histogram(self, step, tag, values):
        self._call("log_histogram", step, tag)

    def log_table(self, step, name, columns, rows):
        self._call("log_table", step, name, len(rows))

    def log_images(self, step, images):
        self._call("log_images", step, sorted(images))

    def close(self, status):
        CALLS[self.name].append(("close", status))

    def _call(self, what, step, *args):
        CALLS[self.name].append((what, step, *args))
        if self.fail_at == (what, step):
            raise OSError("disk full")


@pytest.fixture
def trackers():
    ok = register_tracker("test-ok")(type("Ok", (Recording,), {}))
    bad = register_tracker("test-failing")(type("Failing", (Recording,), {"fail_at": ("log_metrics", 2)}))
    CALLS.clear()
    yield ok, bad
    del TRACKERS["test-ok"], TRACKERS["test-failing"]


def rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_tracker_failing_mid_run_is_dropped_and_the_run_goes_on(trainer_env, tmp_path, trackers):
    out = tmp_path / "run"
    ov = trainer_env["overrides"](out, "xrpo", steps=3) + ["report_to=[test-ok,test-failing]", "log_samples_every=1"]
    logs: list[str] = []
    summary = train(build_config(None, ov), log=logs.append, plots=lambda run: {"reward": run / "reward.png"})
    assert summary["steps"] == 3
    warned = [line for line in logs if line.startswith("warning: tracker test-failing failed")]
    assert warned == [
        "warning: tracker test-failing failed (log_metrics, step 2): OSError: disk full; nothing more goes to it in "
        "this run (metrics.jsonl has every row)"
    ]
    metrics = rows(out / "metrics.jsonl")
    assert [r["step"] for r in metrics] == [1, 2, 3]
    ok = CALLS["test-ok"]
    assert ok[0] == ("start", None, 3) and ok[-1] == ("close", "finished")
    # every metrics row, as logged (without its step), and the validations before and after
    sent = [(c[1], c[2]) for c in ok if c[0] == "log_metrics"]
    evals = rows(out / "eval.jsonl")
    assert [s for s, _ in sent] == [0, 1, 2, 3, 3]
    assert [m for s, m in sent if s > 0][:3] == [{k: v for k, v in r.items() if k != "step"} for r in metrics]
    assert [sent[0][1], sent[-1][1]] == [{k: v for k, v in r.items() if k != "step"} for r in evals]
    assert [c for c in ok if c[0] == "log_table"] == [("log_table", s, "samples", 4) for s in (1, 2, 3)]
    assert ("log_images", 3, ["reward"]) in ok
    # the failing one got steps 0-2, then its run was closed as failed and it was sent nothing more
    bad = CALLS["test-failing"]
    assert [c[:2] for c in bad if c[0] == "log_metrics"] == [("log_metrics", 0), ("log_metrics", 1), ("log_metrics", 2)]
    assert bad[-1] == ("close", "failed") and sum(c[0] == "close" for c in bad) == 1


def test_a_run_ending_in_an_error_closes_the_trackers_runs_as_failed(trainer_env, tmp_path, trackers):
    ov = trainer_env["overrides"](tmp_path / "run", "xrpo", steps=3) + ["report_to=[test-ok]"]

    def boom(report):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        train(build_config(None, ov), log=lambda *_: None, on_step=boom)
    assert CALLS["test-ok"][-1] == ("close", "failed")


# ------------------------------------------------------------------------------------------ console and samples
def _logger(tmp_path, **fields):
    from xrpo.trainer.config import TrainConfig
    from xrpo.trainer.logging import RunLogger

    cfg = TrainConfig(output=str(tmp_path), tensorboard=False, steps=10, **fields)
    return RunLogger(tmp_path, cfg, log=lambda *_: None)


def test_the_samples_table_shows_references_up_to_24_characters(tmp_path):
    from xrpo.data import Problem
    from xrpo.rollout.records import RolloutRecord

    lines: list[str] = []
    refs = ["1/2", "1234567890123", "x" * 40]
    problems = [Problem(id=f"p{i}", prompt="?", answer=a) for i, a in enumerate(refs)]
    records = [RolloutRecord(i, i, 0, False, [1], [1], [2], [0.0], "eos", "no", 0.0) for i in range(3)]
    with _logger(tmp_path, progress=False) as logger:
        logger.log = lines.append
        logger.log_samples(1, problems, records)
    table = lines[0].splitlines()
    assert " 1234567890123  " in table[3]  # whole: it fits 24 characters
    assert ("x" * 23 + "…") in table[4] and "x" * 24 not in table[4]
    # one column, as wide as its widest cell: after "  ", the problem column (28) and a space
    assert [x[31:55] for x in table[2:]] == ["1/2".rjust(24), "1234567890123".rjust(24), "x" * 23 + "…"]


def test_the_progress_bar_shows_a_rate_and_eta_only_from_the_second_step(tmp_path, capsys):
    with _logger(tmp_path, progress=True) as logger:
        logger.log_step(1, {"time/step": 4.0})
        first = capsys.readouterr().err
        logger.log_step(2, {"time/step": 4.0})
        second = capsys.readouterr().err
    # tqdm writes "elapsed<remaining, rate" once it shows them ("4.00s/step"; the figures' "s/step=" is ours)
    rate = re.compile(r"\d(s/step|step/s)")
    assert "1/10" in first and "<" not in first and not rate.search(first)
    # the bar's clock started with step 1 (4 s ago), so the rate counts both steps: about 2 s per step, not 2 steps
    # in the moment since the bar appeared
    assert "2/10" in second and "<" in second and rate.search(second)
    assert float(re.findall(r"([\d.]+)s/step", second)[-1]) >= 2.0  # 2 steps in at least the 4 s since step 1 began


def test_validation_completions_are_saved_per_validation(trainer_env, tmp_path):
    out = tmp_path / "run"
    ov = trainer_env["overrides"](out, "grpo", steps=1) + ["save_eval_completions=true"]
    train(build_config(None, ov), log=lambda *_: None)
    evals = rows(out / "eval.jsonl")
    for e in evals:  # before training and after step 1: 4 held-out problems x eval_samples=2
        saved = rows(out / "eval_completions" / f"step-{e['step']:08d}.jsonl")
        assert [r["id"] for r in saved] == ["h0", "h1", "h2", "h3"]
        assert all(len(r["completions"]) == len(r["scores"]) == 2 for r in saved)
        # the figures come from the saved samples: pass@1 is the mean score (the parity verifier's are 0 or 1)
        assert sum(sum(r["scores"]) for r in saved) / 8 == e["eval/pass@1"]
    assert [e["step"] for e in evals] == [0, 1]


def test_a_validation_shows_its_progress(tmp_path, capsys):
    with _logger(tmp_path, progress=True) as logger:
        show = logger.validation_progress(0)
        show(400, 1600)
        show(1600, 1600)
    err = capsys.readouterr().err
    # the bar stays in the log when it ends: what was validated, and in how long
    assert err.rstrip().splitlines()[-1].split("\r")[-1].startswith("validation before training: 100%")
    assert "1600/1600" in err
