"""Atomic writes of a run's files: a reader, or a crash, sees the old content or the new one, never a part of it."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "write_atomic"]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Replace ``path`` so that a reader, or a crash, sees the old content or the new one, never a part of it."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
