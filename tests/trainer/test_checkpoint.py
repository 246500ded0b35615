"""xrpo.trainer.checkpoint: a checkpoint is written atomically, the last ones kept, a killed save or removal leaves the
previous checkpoints listed; the random generators round-trip. Listing and state.json:
tests/rundir/test_checkpoints.py."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from xrpo.rundir.checkpoints import MARKER, checkpoint_dir, find_resume_checkpoint, list_checkpoints, load_state
from xrpo.trainer.checkpoint import rng_state, save_checkpoint, set_rng_state


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


def test_rng_state_round_trip():
    state = rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a
