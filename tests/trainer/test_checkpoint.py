"""xrpo.trainer.checkpoint: atomic checkpoints and files, which checkpoint a resume picks, what a new run refuses."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from xrpo.trainer.checkpoint import (
    MARKER,
    CheckpointError,
    checkpoint_dir,
    find_resume_checkpoint,
    list_checkpoints,
    load_state,
    refuse_existing_run,
    rng_state,
    save_checkpoint,
    set_aside_later_checkpoints,
    set_rng_state,
    update_state,
    write_atomic,
)


class _Broken:
    """A corpus whose save dies half-way, as a killed process would."""

    def save(self, path):
        path.mkdir()
        (path / "part").write_text("half")
        raise KeyboardInterrupt


@pytest.fixture()
def parts(tiny_model, tiny_tokenizer):
    opt = torch.optim.AdamW(tiny_model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return {"model": tiny_model, "tokenizer": tiny_tokenizer, "optimizer": opt, "scheduler": sched}


def fake_checkpoint(out, step, complete=True):
    d = checkpoint_dir(out, step)
    d.mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"step": step}))
    if complete:
        (d / MARKER).write_text("ok\n")
    return d


def test_save_keeps_the_last_ones_and_a_killed_save_leaves_the_previous_checkpoint(parts, tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, state={"x": step}, keep_last=2, **parts)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]
    assert load_state(checkpoint_dir(tmp_path, 3)) == {"step": 3, "x": 3}
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 4, state={"x": 4}, corpus=_Broken(), keep_last=2, **parts)
    # the half-written step 4 exists only as a .tmp directory, which nothing lists or resumes from
    assert (tmp_path / "checkpoints" / "step-00000004.tmp").is_dir()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]
    assert find_resume_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 3)
    # the next save of that step replaces the leftover
    final = save_checkpoint(tmp_path, 4, state={"x": 4}, keep_last=2, **parts)
    assert not (tmp_path / "checkpoints" / "step-00000004.tmp").exists() and (final / MARKER).is_file()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]


def test_a_kill_while_old_checkpoints_are_removed_leaves_none_listed_half_removed(parts, tmp_path, monkeypatch):
    import xrpo.trainer.checkpoint as ckpt

    for step in (1, 2):
        save_checkpoint(tmp_path, step, state={}, keep_last=2, **parts)
    real = ckpt.shutil.rmtree

    def killed_midway(path, ignore_errors=False):
        real(path / "model")  # the weights are gone, then the process is killed
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt.shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 3, state={}, keep_last=2, **parts)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]


def test_list_checkpoints_only_complete_ones_in_step_order(tmp_path):
    assert list_checkpoints(tmp_path) == []
    for s in (10, 9, 100):
        fake_checkpoint(tmp_path, s)
    fake_checkpoint(tmp_path, 200, complete=False)  # killed before its marker
    (tmp_path / "checkpoints" / "discarded-step-00000300").mkdir()
    assert [int(p.name.split("-")[1]) for p in list_checkpoints(tmp_path)] == [9, 10, 100]


def test_resume_picks_the_latest_complete_checkpoint_or_says_why_not(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        find_resume_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="is not a checkpoint"):
        find_resume_checkpoint(tmp_path)
    (tmp_path / "config.yaml").write_text("steps: 3\n")
    with pytest.raises(CheckpointError, match="no complete checkpoint yet.*xrpo train --config"):
        find_resume_checkpoint(tmp_path)
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 5)
    fake_checkpoint(tmp_path, 7, complete=False)
    assert find_resume_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 5)
    assert find_resume_checkpoint(checkpoint_dir(tmp_path, 2)) == checkpoint_dir(tmp_path, 2)  # a checkpoint itself


def test_a_damaged_state_json_is_refused_naming_the_file(tmp_path):
    d = fake_checkpoint(tmp_path, 2)
    for text, match in [
        ('{"step": 2, "samp', r"checkpoint .*step-00000002: state\.json unreadable"),
        ("[1, 2]", r"step-00000002/state\.json: expected a JSON object, got list"),
        ('{"step": "2"}', r"step-00000002/state\.json: field 'step' must be an integer >= 0, got '2'"),
        (b'{"step": 2, "x": "\xe9"}', r"state\.json unreadable: 'utf-8' codec"),
    ]:
        (d / "state.json").write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(CheckpointError, match=match):
            load_state(d)


def test_later_checkpoints_are_set_aside_not_deleted(tmp_path):
    for s in (1, 2, 3):
        fake_checkpoint(tmp_path, s)
    moved = set_aside_later_checkpoints(tmp_path, 1)
    assert [p.name for p in moved] == ["discarded-step-00000002", "discarded-step-00000003"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000001"]
    fake_checkpoint(tmp_path, 2)  # the resumed run writes step 2 again, and is resumed from 1 once more
    assert [p.name for p in set_aside_later_checkpoints(tmp_path, 1)] == ["discarded-step-00000002-2"]
    assert json.loads((moved[0] / "state.json").read_text()) == {"step": 2}


def test_a_new_run_refuses_a_directory_with_checkpoints(tmp_path):
    refuse_existing_run(tmp_path / "fresh")  # nothing there
    fake_checkpoint(tmp_path, 3, complete=False)
    refuse_existing_run(tmp_path)  # stopped before its first complete checkpoint: may start again
    fake_checkpoint(tmp_path, 4)
    with pytest.raises(CheckpointError, match=r"step-00000004.*xrpo train --resume"):
        refuse_existing_run(tmp_path)


def test_write_atomic_and_update_state(tmp_path):
    p = tmp_path / "f.json"
    write_atomic(p, "old")
    write_atomic(p, b"new")
    assert p.read_bytes() == b"new" and sorted(x.name for x in tmp_path.iterdir()) == ["f.json"]
    d = fake_checkpoint(tmp_path, 1)
    update_state(d, eval_history=[1, 2])
    assert load_state(d) == {"step": 1, "eval_history": [1, 2]}


def test_rng_state_round_trip():
    state = rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a
