"""CurES end to end on the tiny model: a 2-step run spends exactly the budget each step and trains; a run stopped
after a checkpoint resumes with the same posterior and draws the same prompts as the uninterrupted run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from xrpo.rundir.checkpoints import list_checkpoints
from xrpo.trainer.config_loader import build_config
from xrpo.trainer.loop import train


def quiet(*_):
    pass


def jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_cures_two_steps(trainer_env, tmp_path):
    out = tmp_path / "c"
    summary = train(build_config(None, trainer_env["overrides"](out, "cures", steps=2)), log=quiet)
    rows = jsonl(out / "metrics.jsonl")
    rounds = jsonl(out / "rounds.jsonl")
    assert len(rows) == 2 and len(rounds) == 2
    for row, rnd in zip(rows, rounds):
        assert torch.isfinite(torch.tensor(row["loss/policy"]))
        # the step's budget, rollout.rollouts_per_step = 16 over 4 prompts, spent exactly; every group >= 2
        assert row["rollout/count"] == 16 and sum(rnd["alloc"]) == 16 and min(rnd["alloc"]) >= 2
        assert len(set(rnd["problems"])) == 4
        assert row["cures/trials"] == 16 and row["cures/count_min"] >= 2
        for key in ("cures/p_mean", "cures/entropy", "cures/sigma_mean", "cures/count_max", "cures/seen_frac"):
            assert key in row, key
    before = load_file(str(trainer_env["model"] / "model.safetensors"))
    after = load_file(str(Path(summary["final_checkpoint"]) / "model" / "model.safetensors"))
    assert not [k for k in before if torch.equal(before[k], after[k])]
    # warm-up: 4 rollouts of each of the 24 training problems, then 2 x 16 in training, all in the posterior
    st = json.loads((Path(summary["final_checkpoint"]) / "state.json").read_text())["cures"]
    assert st["warmup_rollouts"] == 96 and sum(st["trials"]) == 96 + 32
    assert min(st["trials"]) >= 4
    assert summary["cures"]["warmup_rollouts"] == 96 and summary["cures"]["rollouts_observed"] == 128


def test_cures_without_warmup_starts_from_the_prior(trainer_env, tmp_path):
    out = tmp_path / "c"
    ov = trainer_env["overrides"](out, "cures", steps=1) + ["method.cures_warmup_rollouts=0"]
    summary = train(build_config(None, ov), log=quiet)
    row = jsonl(out / "metrics.jsonl")[0]
    # every problem unseen: p = 1/2 everywhere, the distribution uniform, the 16 rollouts split 4 x 4
    assert row["cures/p_mean_all"] == 0.5 and row["cures/seen_frac"] == 0.0
    assert row["cures/count_min"] == row["cures/count_max"] == 4
    assert summary["cures"]["warmup_rollouts"] == 0 and summary["cures"]["rollouts_observed"] == 16


def test_cures_resume_after_stop_draws_what_the_uninterrupted_run_draws(trainer_env, tmp_path):
    ov = [o for o in trainer_env["overrides"](None, "cures", steps=4) if not o.startswith("output=")]
    ov += ["save_every=2", "keep_last=10", "threads=1", "method.cures_temp_scale=0.1"]
    straight = tmp_path / "straight"
    ref = train(build_config(None, [f"output={straight}", *ov]), log=quiet)
    # the stopped run: the straight run as it was right after its step-2 checkpoint (later files removed)
    stopped = tmp_path / "stopped"
    shutil.copytree(straight, stopped)
    shutil.rmtree(stopped / "checkpoints" / "step-00000004")
    for name in ("metrics.jsonl", "rounds.jsonl"):
        keep = [r for r in jsonl(stopped / name) if r["step"] <= 2]
        (stopped / name).write_text("".join(json.dumps(r) + "\n" for r in keep))
    assert list_checkpoints(stopped)[-1].name == "step-00000002"
    resumed = train(None, resume=str(stopped), log=quiet)
    assert resumed["steps"] == 4

    # the posterior at every checkpoint and the prompts + counts of every step are those of the uninterrupted run
    for step in (2, 4):
        a = json.loads((stopped / "checkpoints" / f"step-{step:08d}" / "state.json").read_text())["cures"]
        b = json.loads((straight / "checkpoints" / f"step-{step:08d}" / "state.json").read_text())["cures"]
        assert a == b, step
    ra, rb = jsonl(stopped / "rounds.jsonl"), jsonl(straight / "rounds.jsonl")
    assert [(r["step"], r["problems"], r["alloc"]) for r in ra] == [(r["step"], r["problems"], r["alloc"]) for r in rb]
    ma, mb = jsonl(stopped / "metrics.jsonl"), jsonl(straight / "metrics.jsonl")
    keys = [k for k in mb[0] if k.startswith("cures/") or k in ("rollout/reward_mean", "loss/policy")]
    assert [{k: r[k] for k in keys} for r in ma] == [{k: r[k] for k in keys} for r in mb]
    wa = load_file(str(Path(resumed["final_checkpoint"]) / "model" / "model.safetensors"))
    wb = load_file(str(Path(ref["final_checkpoint"]) / "model" / "model.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0, msg=k)
    # steps 3 and 4 drew different prompts from each other: the posterior, not a fixed list, chose them
    assert ra[2]["problems"] != ra[3]["problems"]


def test_cures_bad_config(trainer_env, tmp_path):
    base = trainer_env["overrides"](tmp_path / "o", "cures")
    with pytest.raises(ValueError, match="method.icl must be false with allocation=cures"):
        build_config(None, base + ["method.icl=true"])
    with pytest.raises(ValueError, match="method.cures_min_count must be >= 2"):
        build_config(None, base + ["method.cures_min_count=1"])
    with pytest.raises(ValueError, match="rollout.rollouts_per_step must be >= method.cures_min_count"):
        build_config(None, base + ["method.cures_min_count=5"])
    with pytest.raises(ValueError, match="method.cures_temp_scale"):
        build_config(None, base + ["method.cures_temp_scale=0"])
    with pytest.raises(ValueError, match="prompts_per_step=30: CurES draws that many distinct problems"):
        train(build_config(None, base + ["rollout.prompts_per_step=30", "rollout.rollouts_per_step=120"]), log=quiet)


def test_resume_without_the_sources_state_names_the_checkpoint(trainer_env, tmp_path):
    # the batch source's state (CurES's posterior) is part of every checkpoint; a state.json without it is refused
    # before any step runs, naming the checkpoint, instead of resuming from the prior
    from xrpo.rundir.checkpoints import CheckpointError

    out = tmp_path / "c"
    train(
        build_config(None, trainer_env["overrides"](out, "cures", steps=1) + ["method.cures_warmup_rollouts=0"]),
        log=quiet,
    )
    path = list_checkpoints(out)[-1] / "state.json"
    state = json.loads(path.read_text())
    del state["cures"]
    path.write_text(json.dumps(state))
    with pytest.raises(
        CheckpointError,
        match=r"step-00000001 does not hold this method's batch source state: .*"
        r"no CurES state",
    ):
        train(None, resume=str(out), log=quiet)
