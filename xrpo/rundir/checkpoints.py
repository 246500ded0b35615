"""The checkpoints of a run directory: their layout and listing, which one a resume picks, what a new run refuses,
and their state.json. Writing one (the model, the optimiser, the random generators) is the trainer's
(`xrpo.trainer.checkpoint.save_checkpoint`); what is here needs no model, so eval, `xrpo report` and the study read
checkpoints without the trainer.

A checkpoint directory ``checkpoints/step-00000050/`` holds:
    model/            save_pretrained (safetensors) + tokenizer
    optimizer.pt      AdamW state
    scheduler.pt      learning-rate scheduler state
    rng.pt            python / numpy / torch RNG states
    state.json        step, data-order state, method state, the last metrics
    corpus/           the ICL corpus (when ICL is on)
    COMPLETE          written last; a directory without it is not a checkpoint

state.json's ``segments`` lists the run's segments (one per `xrpo train` process) up to this checkpoint, so that a
resumed run's summary counts the time, rollouts and tokens of every segment (``xrpo.trainer.records``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from xrpo.rundir.files import fsync_dir, write_atomic

__all__ = [
    "MARKER",
    "CheckpointError",
    "checkpoint_dir",
    "find_resume_checkpoint",
    "list_checkpoints",
    "load_state",
    "refuse_existing_run",
    "set_aside_later_checkpoints",
    "update_state",
]

MARKER = "COMPLETE"


class CheckpointError(ValueError):
    pass


def checkpoint_dir(output: Path, step: int) -> Path:
    return Path(output) / "checkpoints" / f"step-{step:08d}"


def list_checkpoints(output: Path) -> list[Path]:
    root = Path(output) / "checkpoints"
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith("step-") and not p.name.endswith(".tmp") and (p / MARKER).exists()
    ]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def find_resume_checkpoint(path: str | Path) -> Path:
    """``path`` is a run directory (its latest complete checkpoint is used) or a checkpoint directory."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"resume path {p} does not exist")
    if (p / MARKER).exists() and (p / "state.json").exists():
        return p
    found = list_checkpoints(p)
    if not found and (p / "config.yaml").is_file():
        raise CheckpointError(
            f"run directory {p} has no complete checkpoint yet (it stopped before its first one; the config's "
            f"save_every sets when that is): there is nothing to resume from. To start it again from step 0: "
            f"xrpo train --config {p / 'config.yaml'} (this overwrites the records it has)"
        )
    if not found:
        raise CheckpointError(
            f"resume path {p} is not a checkpoint: it has no complete checkpoints/step-*/ directory "
            f"(a checkpoint holds state.json and the {MARKER} marker)"
        )
    return found[-1]


def refuse_existing_run(output: str | Path) -> None:
    """A new run must not start in a directory that holds another run's checkpoints: it would overwrite that run's
    records and mix its checkpoints with the new ones (a run that stopped before its first checkpoint may be started
    again in place: there is nothing to resume)."""
    found = list_checkpoints(Path(output))
    if found:
        raise CheckpointError(
            f"output {output} already holds a run (checkpoints up to {found[-1].name}): continue it with "
            f"`xrpo train --resume {output}`, or give another output=DIR; nothing was changed"
        )


def set_aside_later_checkpoints(output: Path, step: int) -> list[Path]:
    """Rename the checkpoints after ``step`` to ``checkpoints/discarded-step-N``: a run resumed from ``step`` abandons
    them (their records are set aside too), and a later ``--resume RUN_DIR`` must not pick one of them up. They are
    kept, not deleted (nothing lists, resumes from or prunes them); returns their new paths."""
    moved = []
    for p in list_checkpoints(output):
        if int(p.name.split("-")[1]) > step:
            dest = p.with_name("discarded-" + p.name)
            n = 1
            while dest.exists():  # a step set aside by an earlier resume as well
                n += 1
                dest = p.with_name(f"discarded-{p.name}-{n}")
            os.replace(p, dest)
            moved.append(dest)
    if moved:
        fsync_dir(Path(output) / "checkpoints")
    return moved


def load_state(ckpt: Path) -> dict:
    """A checkpoint's state.json: a JSON object with an integer ``step`` (CheckpointError, naming the file, if not)."""
    path = Path(ckpt) / "state.json"
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not JSON, not UTF-8, an integer beyond int()'s digit limit
        raise CheckpointError(f"checkpoint {ckpt}: state.json unreadable: {e}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(state).__name__}")
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"{path}: field 'step' must be an integer >= 0, got {step!r}")
    return state


def update_state(ckpt: Path, **fields) -> None:
    """Set ``fields`` in a written checkpoint's state.json, atomically (the old state or the new one, both valid for
    its weights)."""
    state = load_state(ckpt)
    state.update(fields)
    write_atomic(Path(ckpt) / "state.json", json.dumps(state, indent=1, default=float))
