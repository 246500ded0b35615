"""Remove a directory tree that an untrusted program made, whatever shape it has: `remove_tree`.

`shutil.rmtree` recurses once per level (a tree a few thousand levels deep raised RecursionError, which
``ignore_errors=True`` does not catch, out of `run_program`'s clean-up), builds paths that pass PATH_MAX, and gives
up on a directory it cannot read or write (mode 000) or on an immutable file. Here the walk is a loop over one open
directory at a time (descending with ``openat``, climbing back through ``..`` checked against the recorded
device and inode), every operation is relative to a directory descriptor, and a refusal is repaired before it is
retried: permissions are widened to 0700 on the caller's own files, the immutable and append-only flags are cleared
(a root caller's program may set them). It never follows a symbolic link and never crosses into another file system.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["remove_tree"]

_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS = 0x80086601, 0x40086602  # _IOR / _IOW('f', 1, long) on 64-bit Linux
_FS_IMMUTABLE_FL, _FS_APPEND_FL = 0x10, 0x20
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str) -> list[str]:
    """Remove `path` and everything below it. Never raises (for anything the tree holds, nor for a missing `path`);
    returns what could not be removed and why (empty when all of it is gone)."""
    problems: list[str] = []
    try:
        parent = os.open(os.path.dirname(os.path.abspath(path)) or "/", _OPEN_DIR)
    except OSError as e:
        return [] if e.errno == errno.ENOENT else [f"{path}: {e}"]
    try:
        _remove_entry(parent, os.path.basename(os.path.abspath(path)), problems, path)
    except Exception as e:  # noqa: BLE001 - the promise is "never raises": report instead
        problems.append(f"{path}: {type(e).__name__}: {e}")
    finally:
        os.close(parent)
    return problems


def _clear_flags(fd: int) -> None:
    """Drop the immutable and append-only flags of the open file `fd` (needs CAP_LINUX_IMMUTABLE; a no-op where the
    file system has no such flags or they are not set)."""
    import fcntl
    import struct

    try:
        flags = struct.unpack("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, bytes(8))[:4])[0]
        if flags & (_FS_IMMUTABLE_FL | _FS_APPEND_FL):
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("i", flags & ~(_FS_IMMUTABLE_FL | _FS_APPEND_FL)) + bytes(4))
    except OSError:
        pass


def _repair(dir_fd: int, name: str | None) -> None:
    """Make `dir_fd` writable and searchable and clear the flags that stop removals in it, and of its entry `name`
    (a regular file or a directory; other kinds cannot carry the flags)."""
    _clear_flags(dir_fd)
    try:
        os.fchmod(dir_fd, 0o700)
    except OSError:
        pass
    if name is None:
        return
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
        try:  # a directory of mode 000 cannot be opened, even to clear its flags, before this
            os.chmod(name, 0o700, dir_fd=dir_fd, follow_symlinks=False)
        except (OSError, NotImplementedError):
            pass
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            return
        try:
            _clear_flags(fd)
        finally:
            os.close(fd)


def _retry(op, dir_fd: int, name: str) -> OSError | None:
    """Run ``op(name, dir_fd=dir_fd)``, repairing once after a refusal. The error that remains, or None."""
    for attempt in range(2):
        try:
            op(name, dir_fd=dir_fd)
            return None
        except FileNotFoundError:
            return None
        except OSError as e:
            if attempt or e.errno not in (errno.EACCES, errno.EPERM):
                return e
            _repair(dir_fd, name)
    return None


def _open_dir(dir_fd: int, name: str) -> int:
    try:
        return os.open(name, _OPEN_DIR, dir_fd=dir_fd)
    except PermissionError:
        _repair(dir_fd, name)
        return os.open(name, _OPEN_DIR, dir_fd=dir_fd)


def _remove_entry(parent: int, name: str, problems: list[str], path: str) -> None:
    try:
        st = os.lstat(name, dir_fd=parent)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        e = _retry(os.unlink, parent, name)
        if e is not None:
            problems.append(f"{path}: {e}")
        return
    # frames[k] = (name in its parent, (st_dev, st_ino), subdirectories still to remove or None before the scan);
    # frames[0] is `path` itself, and `cur` is open on the last frame's directory
    cur = _open_dir(parent, name)
    top = os.fstat(cur)
    frames: list[tuple[str, tuple[int, int], list[str] | None]] = [(name, (top.st_dev, top.st_ino), None)]
    try:
        while frames:
            fname, ident, todo = frames[-1]
            if todo is None:
                todo = _clear_files(cur, problems, path)
                frames[-1] = (fname, ident, todo)
            if todo:
                child = todo.pop()
                try:
                    new = _open_dir(cur, child)
                except OSError as e:
                    problems.append(f"{path}/.../{child}: {e}")
                    continue
                st = os.fstat(new)
                if st.st_dev != ident[0]:  # a mount point: never descend into another file system
                    os.close(new)
                    problems.append(f"{path}/.../{child}: another file system is mounted there")
                    continue
                os.close(cur)
                cur = new
                frames.append((child, (st.st_dev, st.st_ino), None))
                continue
            # this directory is empty now (or holds only what could not be removed): leave it and remove it
            frames.pop()
            if not frames:
                os.close(cur)
                cur = -1
                e = _retry(os.rmdir, parent, fname)
            else:
                up = os.open("..", _OPEN_DIR, dir_fd=cur)
                st = os.fstat(up)
                if (st.st_dev, st.st_ino) != frames[-1][1]:  # moved meanwhile: never remove outside the tree
                    os.close(up)
                    problems.append(f"{path}: a directory moved while it was being removed; stopped")
                    return
                os.close(cur)
                cur = up
                e = _retry(os.rmdir, cur, fname)
            if e is not None:
                problems.append(f"{path}/.../{fname}: {e}")
    finally:
        if cur >= 0:
            os.close(cur)


def _clear_files(dir_fd: int, problems: list[str], path: str) -> list[str]:
    """Unlink every entry of `dir_fd` that is not a directory; return the names of its subdirectories."""
    try:
        with os.scandir(dir_fd) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    except OSError:
        _repair(dir_fd, None)
        try:
            with os.scandir(dir_fd) as it:
                entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        except OSError as e:
            problems.append(f"{path}: {e}")
            return []
    subdirs = []
    for name, is_dir in entries:
        if is_dir:
            subdirs.append(name)
            continue
        e = _retry(os.unlink, dir_fd, name)
        if e is not None:
            if e.errno == errno.EISDIR:
                subdirs.append(name)
            else:
                problems.append(f"{path}/.../{name}: {e}")
    return subdirs
