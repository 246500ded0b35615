"""A run that cannot learn says so: the tiny random model never writes an answer the math verifier reads, so every
rollout scores 0, every group is flat and every advantage is 0 (`xrpo.trainer.zero_signal`)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from xrpo.cli import main
from xrpo.rollout.records import RolloutRecord
from xrpo.trainer.config import TrainConfig
from xrpo.trainer.config_loader import build_config
from xrpo.trainer.loop import NoLearningSignal, train
from xrpo.trainer.zero_signal import ZeroSignalWatch, without_signal


def never_answers(env, out, *extra):
    """The math verifier on the random model: no completion holds an answer."""
    return env["overrides"](out, "grpo", steps=3) + ["data.verifier=math", *extra]


def test_the_first_step_without_signal_says_so_once_and_a_zero_gradient_update_is_skipped(trainer_env, tmp_path):
    lines: list[str] = []
    out = tmp_path / "flat"
    ov = never_answers(trainer_env, out, "method.kl_coef=0", "stop_without_signal=0", "log_samples_every=25")
    reports = []
    summary = train(build_config(None, ov), log=lines.append, on_step=reports.append)
    assert all(r.plan.rewards.max() == 0 for r in reports)  # the model never answers
    said = [i for i, x in enumerate(lines) if "no learning signal" in x]
    assert len(said) == 1, lines
    text = lines[said[0]]
    assert text.startswith("warning: step 1: no learning signal")
    # what usually causes it, each with the setting to look at, and the verifier's reasons counted over the rollouts
    for cause in ("data.verifier=math", "reasons: no_answer", "data.prompt_template=", "rollout.max_new_tokens=6"):
        assert cause in text, (cause, text)
    assert "the update was skipped" in text
    # the first step's samples are logged (log_samples_every=25 would log none in 3 steps), before the warning
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and {s["step"] for s in samples} == {1}
    assert any(x.startswith("[step 1] samples:") for x in lines[: said[0]])
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss/skipped_zero_advantage"] for r in rows] == [1.0, 1.0, 1.0]
    # AdamW with zero gradients from a zero state and no weight decay: the weights are the initial ones
    before = load_file(str(trainer_env["model"] / "model.safetensors"))
    after = load_file(f"{summary['final_checkpoint']}/model/model.safetensors")
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_run_without_signal_stops_after_stop_without_signal_steps_in_a_row(trainer_env, tmp_path, capsys):
    out = tmp_path / "stop"
    rc = main(["train", *never_answers(trainer_env, out, "stop_without_signal=2")])
    assert rc == 1
    err = capsys.readouterr().err
    assert "stopped after 2 steps in a row without a learning signal (steps 1-2; stop_without_signal=2)" in err
    assert "What usually causes it" in err and "Traceback" not in err
    # the preset's KL term (grpo: kl_coef=0.04) has a gradient: those updates ran
    assert "the update ran for its KL term alone" in err
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def _rec(group: int, reward: float, reason: str | None = None) -> RolloutRecord:
    return RolloutRecord(group, group, 0, False, [1], [1], [2], [0.0], "eos", "", reward, verify_reason=reason)


def test_the_count_is_of_steps_in_a_row_and_continues_from_a_checkpoint():
    cfg = TrainConfig(stop_without_signal=3)
    said: list[str] = []
    flat = {"rollout/zero_variance_group_frac": 1.0}
    mixed = {"rollout/zero_variance_group_frac": 0.5}
    watch = ZeroSignalWatch(cfg, count=1, log=said.append)  # a resumed run: its checkpoint's step had no signal
    watch.observe(5, flat, [_rec(0, 0.0, "no_answer"), _rec(0, 0.0, "no_answer")])
    watch.observe(6, mixed, [_rec(0, 0.0), _rec(0, 1.0)])  # a step with signal starts the count again
    assert watch.count == 0 and len(said) == 1
    watch.observe(7, flat, [_rec(0, 1.0), _rec(1, 1.0)])
    watch.observe(8, flat, [])  # DAPO kept no group: no rollouts at all
    with pytest.raises(NoLearningSignal, match=r"3 steps in a row .*steps 7-9.*stop_without_signal=3"):
        watch.observe(9, flat, [_rec(0, 1.0), _rec(1, 1.0)])
    assert len(said) == 1  # said once
    # every rollout correct: the other cause
    assert "too easy" in ZeroSignalWatch(cfg)._account(1, flat, [_rec(0, 1.0), _rec(1, 1.0)])
    # answers read but all wrong: said before the format causes
    wrong = [_rec(0, 0.0, "mismatch"), _rec(1, 0.0, "mismatch")]
    for x in wrong:
        x.answer = "7"
    assert "read an answer in 2 of 2 completions and none matched" in ZeroSignalWatch(cfg)._account(1, flat, wrong)
    assert "read an answer" not in ZeroSignalWatch(cfg)._account(1, flat, [_rec(0, 0.0, "no_answer")] * 2)
    assert "DAPO's dynamic sampling kept no prompt" in ZeroSignalWatch(cfg)._account(1, flat, [])
    assert without_signal({}) and without_signal(flat) and not without_signal(mixed)
