"""Saving and restoring a run's training state: a checkpoint is written atomically (temporary directory, then
rename), the last N kept, and resumed exactly (optimiser, scheduler, random generators). Its layout, listing and
state.json are `xrpo.rundir.checkpoints`'.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from xrpo.rundir.checkpoints import MARKER, checkpoint_dir, list_checkpoints
from xrpo.rundir.files import fsync_dir


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def load_training_state(ckpt: Path, optimizer, scheduler) -> None:
    """Restore what `save_checkpoint` saved besides the model: optimizer, scheduler and the random generators."""
    # map_location="cpu": a checkpoint written on a GPU resumes on a CPU-only machine too; the optimiser's
    # load_state_dict moves each state tensor to its parameter's device (and dtype)
    optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=False, map_location="cpu"))
    scheduler.load_state_dict(torch.load(ckpt / "scheduler.pt", weights_only=False, map_location="cpu"))
    set_rng_state(torch.load(ckpt / "rng.pt", weights_only=False, map_location="cpu"))


def save_checkpoint(
    output: Path, step: int, *, model, tokenizer, optimizer, scheduler, state: dict, corpus=None, keep_last: int = 2
) -> Path:
    final = checkpoint_dir(output, step)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp / "model", safe_serialization=True)
    tokenizer.save_pretrained(tmp / "model")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=1, default=float))
    if corpus is not None:
        corpus.save(tmp / "corpus")
    (tmp / MARKER).write_text("ok\n")
    # fsync the marker's directory entries before the rename makes the checkpoint visible
    fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(output)[:-keep_last]:
        # the marker first: a kill (a second SIGTERM) during the removal leaves a directory nothing lists
        (old / MARKER).unlink(missing_ok=True)
        shutil.rmtree(old, ignore_errors=True)
    return final
