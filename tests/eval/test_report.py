"""`xrpo report RUN_DIR` on a real tiny training run: every section, its plots, the HTML page with them embedded."""

from __future__ import annotations

import base64
import json
import re
import shutil

import pytest

from xrpo.eval.report import make_report

PNG = b"\x89PNG\r\n\x1a\n"


def test_report_of_a_tiny_xrpo_run(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    md_path = make_report(run, log=lambda *_: None)
    assert md_path == run / "report" / "report.md"
    md = md_path.read_text()
    for section in [
        "# Training report: run",
        "## Training reward",
        "## Held-out accuracy",
        "## Rollout allocation",
        "## ICL seeding",
        "## Novelty-guided advantage sharpening",
        "## Step time",
    ]:
        assert section in md, section
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert images == ["reward.png", "heldout.png", "allocation.png", "icl.png", "sharpened.png", "step_time.png"]
    for name in images:
        assert (run / "report" / name).read_bytes()[:8] == PNG
    # the held-out table holds eval.jsonl's rows: steps 0, 2 (eval_every) and 3 (the final validation)
    evals = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals] == [0, 2, 3]
    for r in evals:
        assert f"| {r['step']} | {r['eval/pass@1']:.3f} | {r['eval/pass@2']:.3f} | {r['eval/cons@2']:.3f} |" in md
    # the totals quoted are the logged ones
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    seeded = sum(r["icl/seeded_prompts"] for r in metrics)
    assert f"{seeded:.0f} prompts were ICL-seeded" in md
    planned = [json.loads(x) for x in (run / "rounds.jsonl").read_text().splitlines()]
    assert f"{sum(r['round'] > 0 for r in planned)} planning rounds over 3 steps" in md
    html = (run / "report" / "report.html").read_text()
    blobs = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html)
    assert len(blobs) == 6 and all(base64.b64decode(b)[:8] == PNG for b in blobs)


def test_report_of_a_run_without_xrpo_mechanisms(tiny_run, tmp_path):
    """A GRPO-style log (no planning rounds, no ICL or sharpening metrics): the sections say so, nothing breaks."""
    run = tmp_path / "grpo"
    shutil.copytree(tiny_run, run)
    keep = ("rollout/", "time/", "loss/", "optim/")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k == "step" or k.startswith(keep)}) + "\n" for r in rows)
    )
    (run / "rounds.jsonl").write_text("")
    (run / "summary.json").unlink()
    md = make_report(run, html_page=False, log=lambda *_: None).read_text()
    assert "No planning rounds logged" in md and "No ICL seeding logged" in md and "No sharpening logged" in md
    assert "no summary.json" in md and not (run / "report" / "report.html").exists()


def test_report_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        make_report(tmp_path)


METRICS_ROW = {"step": 1, "rollout/reward_mean": 0.5, "time/step": 1.0, "time/generate": 0.5}


@pytest.mark.parametrize(
    "name, text, match",
    [
        ("metrics.jsonl", "[1]\n", r"metrics\.jsonl line 1: expected a JSON object, got list"),
        ("metrics.jsonl", '{"rollout/reward_mean": 0.5}\n', r"metrics\.jsonl line 1: field 'step' must be an integer"),
        ("metrics.jsonl", '{"step": "1"}\n', r"metrics\.jsonl line 1: field 'step' must be an integer, got '1'"),
        ("metrics.jsonl", '{"step": 1, "time/step": [1]}\n', r"line 1: field 'time/step' must be a number, got \[1\]"),
        (
            "metrics.jsonl",
            b'{"step": 1}\n{"step": 2, "x": "\xe9"}\n{"step": 3}\n',
            r"metrics\.jsonl line 2: not valid UTF-8",
        ),
        ("eval.jsonl", "5\n", r"eval\.jsonl line 1: expected a JSON object, got int"),
        (
            "eval.jsonl",
            '{"step": 1, "eval/pass@1": "x"}\n',
            r"eval\.jsonl line 1: field 'eval/pass@1' must be a number",
        ),
        ("rounds.jsonl", '{"step": 1, "round": 1}\n', r"rounds\.jsonl line 1: missing field\(s\) \['alloc'\]"),
        (
            "rounds.jsonl",
            '{"step": 1, "round": 1, "alloc": [2, 1.5]}\n',
            r"rounds\.jsonl line 1: prompt 1 has alloc=1\.5; expected an integer >= 0",
        ),
        ("rounds.jsonl", '{"step": 1, "round": "1", "alloc": [1]}\n', r"line 1: field 'round' must be an integer"),
        ("summary.json", '{"method": "xrpo", "pass@1_bef', r"summary\.json: unreadable \(Unterminated string"),
        ("summary.json", "[1, 2]", r"summary\.json: expected a JSON object, got list"),
        ("summary.json", '{"rollouts": "many"}', r"summary\.json: field 'rollouts' must be a number, got 'many'"),
        ("summary.json", '{"segments": [{"start_step": 0}]}', r"summary\.json: segments\[0\]\.end_step must be an int"),
        ("config.yaml", "model: [\n", r"config\.yaml: not valid YAML"),
        ("config.yaml", "- 1\n", r"config\.yaml: expected a mapping of config sections, got list"),
        ("config.yaml", "method: xrpo\n", r"config\.yaml: section 'method' must be a mapping, got 'xrpo'"),
    ],
)
def test_a_damaged_run_file_is_named_with_its_line_and_field(tmp_path, name, text, match):
    (tmp_path / "metrics.jsonl").write_text(json.dumps(METRICS_ROW) + "\n")
    (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError, match=match):
        make_report(tmp_path, html_page=False, log=lambda *_: None)


def test_report_output_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps(METRICS_ROW) + "\n")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"--output .*notes\.txt: .*notes\.txt is an existing file; expected a dir"):
        make_report(tmp_path, tmp_path / "notes.txt", html_page=False, log=lambda *_: None)


def test_report_counts_every_segment_of_a_resumed_run(tiny_run, tmp_path):
    from xrpo.trainer.loop import train

    run = tmp_path / "resumed"
    shutil.copytree(tiny_run, run)
    first = json.loads((run / "summary.json").read_text())
    summary = train(None, resume=str(run), log=lambda *_: None)  # a second segment (nothing left to train)
    assert summary["num_segments"] == 2 and summary["rollouts"] == first["rollouts"]
    md = make_report(run, html_page=False, log=lambda *_: None).read_text()
    wall = summary["segments"][0]["wall_time_s"] + summary["segments"][1]["wall_time_s"]
    assert f"| wall time | {wall:.0f} s over 2 segments |" in md
    assert "| segments | 2: steps 0->3, 3->3 |" in md
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rollouts, tokens = sum(r["rollout/count"] for r in metrics), sum(r["loss/tokens"] for r in metrics)
    assert summary["rollouts"] == rollouts and summary["tokens"] == tokens
    assert f"| rollouts trained on | {rollouts:.0f} ({tokens:.0f} completion tokens) |" in md

    # the run: 24 steps, killed at step 18 after the step-16 checkpoint, resumed; set-aside work is named
    s = json.loads((run / "summary.json").read_text())
    s["segments"] = [
        {"start_step": 0, "end_step": 16, "wall_time_s": 30.4, "steps": 16, "rollouts": 0, "tokens": 0},
        {
            "start_step": 16,
            "end_step": 24,
            "wall_time_s": 16.2,
            "steps": 8,
            "rollouts": 0,
            "tokens": 0,
            "discarded_steps": 2,
            "discarded_time_s": 3.46,
        },
    ]
    s.update(discarded_steps=2, discarded_time_s=3.46)
    (run / "summary.json").write_text(json.dumps(s))
    md = make_report(run, html_page=False, log=lambda *_: None).read_text()
    # 30.4 + 16.2 = 46.6 s
    assert "| wall time | 47 s over 2 segments |" in md
    assert (
        "| segments | 2: steps 0->16, 16->24; 2 steps and 3.5 s of logged work after a checkpoint were set aside "
        "on resume (*.discarded.jsonl) and are not in the wall time |"
    ) in md


def test_report_of_an_unfinished_run_and_of_an_older_resumed_log(tiny_run, tmp_path):
    run = tmp_path / "old"
    shutil.copytree(tiny_run, run)
    (run / "summary.json").unlink()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # older xrpo versions logged the steps redone after a resume twice; the last row of a step is the one kept
    redone = [dict(r, **{"icl/seeded_prompts": r["icl/seeded_prompts"] + 100}) for r in rows[1:]]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + redone))
    md = make_report(run, html_page=False, log=lambda *_: None).read_text()
    assert "| steps logged | 3 (last 3); 2 rows repeated a step" in md
    seeded = rows[0]["icl/seeded_prompts"] + sum(r["icl/seeded_prompts"] for r in redone)
    assert f"{seeded:.0f} prompts were ICL-seeded" in md
    # no summary.json: the wall time so far comes from the latest checkpoint
    from xrpo.rundir.checkpoints import list_checkpoints, load_state

    segs = load_state(list_checkpoints(run)[-1])["segments"]
    assert f"| wall time | {segs[0]['wall_time_s']:.0f} s up to the checkpoint of step 3 |" in md


# ------------------------------------------------------------------------------------------------ the plots' axes
@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions save (still drawn and readable after saving)."""
    from xrpo.eval import plots

    kept = []
    real = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: kept.append(fig) or real(fig, path))
    return kept


def test_step_axes_have_whole_steps_and_an_accuracy_axis_stays_in_its_range(figures, tmp_path):
    from xrpo.eval import plots

    plots.plot_lines(
        {"pass@1": ([0, 1, 2], [0.0, 0.0, 0.0])}, tmp_path / "a.png", title="t", ylabel="accuracy", bounds=(0.0, 1.0)
    )
    plots.plot_lines({"reward": ([1, 2], [0.2, 0.4])}, tmp_path / "b.png", title="t", ylabel="reward")
    plots.plot_stacked(
        [1, 2], {"generate": [1.0, 2.0], "update": [0.5, 0.5]}, tmp_path / "c.png", title="t", ylabel="s"
    )
    (acc,), (reward,), (stack,) = (f.axes for f in figures)
    assert acc.get_ylim()[0] == 0.0  # not -0.05 around a run whose accuracy is 0 throughout
    for ax in (acc, reward, stack):
        lo, hi = ax.get_xlim()
        assert all(t == int(t) for t in ax.get_xticks() if lo <= t <= hi), ax.get_xticks()


def test_the_step_time_legend_is_beside_the_bars(figures, tmp_path):
    from xrpo.eval import plots

    parts = {k: [1.0, 3.0, 2.0] for k in ("generate", "verify", "plan", "retrieve", "old_logprobs", "update", "other")}
    plots.plot_stacked([1, 2, 3], parts, tmp_path / "t.png", title="Time per step", ylabel="seconds")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    (fig,) = figures
    ax = fig.axes[0]
    renderer = FigureCanvasAgg(fig).get_renderer()  # the saved figure's layout (pyplot closed it)
    legend, axes = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend.x0 >= axes.x1  # nothing of it over the plotting area
    assert legend.x1 <= fig.bbox.x1  # and inside the saved image


def test_the_reward_sentence_of_a_short_run(tiny_run, tmp_path):
    import shutil as sh

    run = tmp_path / "run"
    sh.copytree(tiny_run, run)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    text = make_report(run, html_page=False, log=lambda *_: None).read_text()
    assert (
        "first 1 steps" not in text
        and f"Mean reward of the run's one step {rows[0]['rollout/reward_mean']:.3f}" in text
    )
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = make_report(run, output=tmp_path / "r5", html_page=False, log=lambda *_: None).read_text()
    assert "Mean reward of the first step " in text and "of the last step " in text
