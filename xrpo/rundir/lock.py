"""One writer per output directory: `xrpo train` (new or ``--resume``) and `xrpo eval` hold ``DIR/.xrpo.lock`` while
they write there, and a second process pointed at the same directory is refused, told which pid on which host holds it.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on that file, not a pid file: the kernel releases it when its holder dies,
however it dies (SIGKILL, OOM killer, node reboot), so a stale lock needs no guessing from pids (which are reused,
and mean nothing across the hosts of a cluster). The file holds the holder's pid, host and start time, for the
refusal message only; a holder that exits normally empties it, so a next holder that finds it filled knows the
previous one was killed and says so.

What it does NOT protect against: on NFS, Linux emulates flock with POSIX byte-range locks, which hold across
clients on NFSv4 (lockd on v3) but not on every cluster filesystem (Lustre needs its ``flock`` mount option); there a
second writer is not detected.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

LOCK_NAME = ".xrpo.lock"


class RunLockedError(ValueError):
    """The directory is held by another live process (its message names the pid and host)."""


def make_output_dir(directory: str | Path, option: str) -> Path:
    """Create output directory ``directory`` (and its parents) if needed; ValueError naming ``option`` (how the user
    gave it: ``output``, ``--output``) and the path when it, or a parent, exists and is not a directory."""
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        raise ValueError(
            f"{option} {path}: {blocker} is an existing file; expected a directory (or a path that does not exist "
            "yet, which is created)"
        ) from None
    return path


class RunLock:
    """``with RunLock(dir, "xrpo train", log=...):`` holds ``dir`` or raises `RunLockedError` at once.

    Taking the lock writes nothing but the lock file; call `claim` once the process's own checks passed to record who
    holds it (a process refused for another reason then leaves the file as it found it)."""

    def __init__(self, directory: str | Path, what: str, *, log=print):
        self.path = Path(directory) / LOCK_NAME
        self.what = what
        self.log = log
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        make_output_dir(self.path.parent, "output")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunLockedError(
                f"{self.path.parent} is in use by {_describe(_read(self.path))}: one process writes a run directory "
                f"at a time. Wait for it to finish or stop it, or give another output directory; nothing was changed"
            ) from None
        self._fd = fd
        # read through the held descriptor: closing another descriptor of the file would drop a POSIX lock (NFS)
        previous = _parse(os.pread(fd, 1 << 16, 0))
        if previous:
            # a holder that exits empties the file: this one was killed (the kernel released its lock)
            self.log(
                f"{self.path.parent}: taking over the lock of {_describe(previous)}, which ended without "
                f"releasing it (killed); its lock was stale"
            )
        return self

    def claim(self) -> None:
        """Record this process as the holder (pid, host, start time) in the lock file."""
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": self.what,
        }
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps(info).encode() + b"\n", 0)
        os.fsync(self._fd)

    def __exit__(self, *exc) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)  # released normally: the next holder finds no stale holder
        finally:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None


def _read(path: Path) -> dict:
    try:
        return _parse(path.read_bytes())
    except OSError:
        return {}


def _parse(data: bytes) -> dict:
    try:
        info = json.loads(data.decode("utf-8")) if data.strip() else {}
    except ValueError:  # written by a holder killed mid-write
        return {}
    return info if isinstance(info, dict) else {}


def _describe(info: dict) -> str:
    if not info:
        return "another process (it has not written its pid and host yet)"
    return (
        f"{info.get('command', 'another xrpo process')} (pid {info.get('pid', '?')} on host {info.get('host', '?')}, "
        f"started {info.get('started', '?')})"
    )
