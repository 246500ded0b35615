"""Model directories written once into the cache (`xrpo.models.loading.cache_root`): the built-in default model, GGUF
conversions, merged LoRA adapters.

A directory is complete when it holds ``COMPLETE``, written last into a temporary directory that is then renamed into
place, so that an interrupted build is never taken for a finished one. Builders of one directory take turns (an
``flock`` on ``<dir>.lock``): two runs started at once on a fresh machine (or two pytest-xdist workers) build it
once, and neither removes a directory the other is reading.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

__all__ = ["MARKER", "build_once", "is_complete"]

MARKER = "COMPLETE"


def is_complete(final: Path) -> bool:
    return (Path(final) / MARKER).exists()


def build_once(final: Path, build: Callable[[Path], None], *, marker: str = "ok\n", rebuild: bool = False) -> Path:
    """The directory ``final``, written by ``build(tmp)`` into a temporary directory, marked complete (``marker`` is
    the marker file's text) and renamed into place, unless it is complete already when this process's turn comes
    (``rebuild``: build it again all the same). Returns ``final``."""
    final = Path(final)
    if is_complete(final) and not rebuild:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.with_name(final.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when the process dies
        if is_complete(final) and not rebuild:  # another process built it while this one waited
            return final
        tmp = final.with_name(final.name + f".tmp{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        try:
            build(tmp)
            (tmp / MARKER).write_text(marker)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if final.exists():  # incomplete (a build killed before its rename left no such thing) or being rebuilt
            shutil.rmtree(final)
        os.replace(tmp, final)
    return final
