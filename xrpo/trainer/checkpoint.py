"""Checkpoints: written atomically (temporary directory, then rename), the last N kept, resumed exactly.

A checkpoint directory ``checkpoints/step-00000050/`` holds:
    model/            save_pretrained (safetensors) + tokenizer
    optimizer.pt      AdamW state
    scheduler.pt      learning-rate scheduler state
    rng.pt            python / numpy / torch RNG states
    state.json        step, data-order state, method state, the last metrics
    corpus/           the ICL corpus (when ICL is on)
    COMPLETE          written last; a directory without it is not a checkpoint
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

MARKER = "COMPLETE"


class CheckpointError(ValueError):
    pass


def checkpoint_dir(output: Path, step: int) -> Path:
    return Path(output) / "checkpoints" / f"step-{step:08d}"


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(output: Path, step: int, *, model, tokenizer, optimizer, scheduler, state: dict, corpus=None,
                    keep_last: int = 2) -> Path:
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
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(output)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(output: Path) -> list[Path]:
    root = Path(output) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-") and not p.name.endswith(".tmp")
             and (p / MARKER).exists()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def find_resume_checkpoint(path: str | Path) -> Path:
    """``path`` is a run directory (its latest complete checkpoint is used) or a checkpoint directory."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"resume path {p} does not exist")
    if (p / MARKER).exists() and (p / "state.json").exists():
        return p
    found = list_checkpoints(p)
    if not found:
        raise CheckpointError(
            f"resume path {p} is not a checkpoint: it has no complete checkpoints/step-*/ directory "
            f"(a checkpoint holds state.json and the {MARKER} marker)"
        )
    return found[-1]


def load_state(ckpt: Path) -> dict:
    try:
        return json.loads((ckpt / "state.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {ckpt}: state.json unreadable: {e}") from None
