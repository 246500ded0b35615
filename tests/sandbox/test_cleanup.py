"""`remove_tree` (xrpo/sandbox/cleanup.py) on trees a program can make: deep, wide, unreadable, immutable; and
`run_program`'s clean-up under ``isolation="minimal"``, where the program's tree is on the host's disk."""

from __future__ import annotations

import fcntl
import os
import struct
import tempfile
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import assert_nothing_left_running
from xrpo.sandbox import Limits, run_program
from xrpo.sandbox.cleanup import remove_tree

ROOT = os.geteuid() == 0
NOBODY = 65534
IMMUTABLE, APPEND = 0x10, 0x20


def _scratch() -> str:
    """A fresh directory for one test, on a tmpfs where there is one: the trees' shapes are what is tested, and a
    disk's journal made each removal of a directory ~2 ms on the shared dev VM (a 2,100-level chain: 4.5 s)."""
    shm = "/dev/shm"
    usable = os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK)
    return tempfile.mkdtemp(prefix="xrpo-cleanup-test-", dir=shm if usable else None)


def _set_flags(fd: int, flags: int) -> None:
    """Set (or with 0, clear) the immutable / append-only flags, keeping the file system's own (ext4's extents)."""
    old = struct.unpack("i", fcntl.ioctl(fd, 0x80086601, bytes(8))[:4])[0]  # FS_IOC_GETFLAGS
    new = (old & ~(IMMUTABLE | APPEND)) | flags
    fcntl.ioctl(fd, 0x40086602, struct.pack("i", new) + bytes(4))  # FS_IOC_SETFLAGS


def _flags_supported(directory: str) -> bool:
    """Whether this caller can set the immutable flag on files of `directory`'s file system."""
    fd, path = tempfile.mkstemp(dir=directory)
    try:
        _set_flags(fd, IMMUTABLE)
        _set_flags(fd, 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        os.unlink(path)


# one level of the tree: files in it (with their mode and flags), empty subdirectories beside the deep branch,
# a symlink and a hard link to files outside the tree, the directory's own mode and flags
LEVEL = st.fixed_dictionaries(
    {
        "files": st.lists(st.tuples(st.sampled_from([0o000, 0o444, 0o644]), st.sampled_from([0, IMMUTABLE, APPEND]))),
        "subdirs": st.lists(st.sampled_from([0o000, 0o500, 0o300, 0o700]), max_size=4),
        "links": st.booleans(),
        "mode": st.sampled_from([0o000, 0o100, 0o500, 0o555, 0o700]),
        "flags": st.sampled_from([0, 0, IMMUTABLE, APPEND]),
    }
)
TREE = st.tuples(
    st.lists(LEVEL, min_size=1, max_size=6),  # the top levels, described one by one
    st.sampled_from([0, 0, 0, 3, 2100]),  # then a chain this deep (its paths pass PATH_MAX at 2,048 levels)
    st.sampled_from([0, 0, 400]),  # and a directory this wide at its bottom
)


def build(top: str, tree, outside: str, flags: bool) -> None:
    """Make `tree` under `top` with descriptor-relative calls only (its paths pass PATH_MAX)."""
    levels, depth, width = tree
    levels = list(levels) + [{"files": [], "subdirs": [], "links": False, "mode": 0o000, "flags": 0}] * depth
    cur = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for i, level in enumerate(levels):
        for k, (mode, fl) in enumerate(level["files"]):
            fd = os.open(f"f{k}", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=cur)
            os.write(fd, b"x")
            os.fchmod(fd, mode)
            if flags and fl:
                _set_flags(fd, fl)
            os.close(fd)
        for k, mode in enumerate(level["subdirs"]):
            os.mkdir(f"s{k}", mode, dir_fd=cur)
        if level["links"]:
            os.symlink(outside, "sym", dir_fd=cur)
            os.link(outside, "hard", dst_dir_fd=cur)
            os.mkfifo("fifo", dir_fd=cur)
        if i == len(levels) - 1:
            for k in range(width):
                os.close(os.open(f"w{k}", os.O_CREAT | os.O_WRONLY, 0o000, dir_fd=cur))
        nxt = None
        if i + 1 < len(levels):
            os.mkdir("d", dir_fd=cur)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
        if i > 0:  # the top itself keeps its mode, so that the test can see it is gone
            os.fchmod(cur, level["mode"])
        if flags and level["flags"]:
            _set_flags(cur, level["flags"])
        os.close(cur)
        cur = nxt
    if cur is not None:
        os.close(cur)


def check_removal(base: str, tree, flags: bool) -> list[str]:
    outside = os.path.join(base, "outside.txt")
    with open(outside, "w") as f:
        f.write("keep")
    top = tempfile.mkdtemp(dir=base)  # a fresh one per example: a failed example's tree stays for the report
    try:
        build(top, tree, outside, flags)
        problems = remove_tree(top)
        assert not os.path.lexists(top), problems
        assert problems == []
        with open(outside) as f:  # the targets of its links are untouched
            assert f.read() == "keep"
        return problems
    finally:
        os.unlink(outside)


@settings(max_examples=15, deadline=None)
@given(tree=TREE)
def test_any_tree_is_removed_as_the_callers_user(tree):
    """As an unprivileged caller (the program ran as the caller's user): modes 000 stop an ordinary removal."""
    if not ROOT:
        base = _scratch()
        try:
            check_removal(base, tree, flags=False)
        finally:
            remove_tree(base)
        return
    base = _scratch()  # not pytest's tmp_path, which is closed to other users
    os.chown(base, NOBODY, NOBODY)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe and its exit status
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            check_removal(base, tree, flags=False)
            code = 0
        except BaseException as e:  # noqa: BLE001
            os.write(w, repr(e).encode()[:4000])
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        message = f.read().decode()
    _, status = os.waitpid(pid, 0)
    left = os.listdir(base)
    remove_tree(base)
    assert status == 0, message
    assert left == []


@pytest.mark.skipif(not ROOT, reason="immutable and append-only flags need CAP_LINUX_IMMUTABLE (a root caller)")
@settings(max_examples=15, deadline=None)
@given(tree=TREE)
def test_any_tree_is_removed_as_root_with_immutable_files(tree):
    base = _scratch()
    try:
        check_removal(base, tree, flags=_flags_supported(base))
    finally:
        remove_tree(base)


def test_a_missing_path_and_a_file():
    assert remove_tree("/nonexistent/xrpo-cleanup-test") == []
    fd, path = tempfile.mkstemp()
    os.close(fd)
    assert remove_tree(path) == [] and not os.path.exists(path)


def test_minimal_isolation_cleans_up_a_deep_unreadable_immutable_tree():
    """Under ``isolation="minimal"`` the program's work dir is a directory of the host's. A tree 1,500 levels deep
    (past the interpreter's recursion limit) made shutil.rmtree raise RecursionError out of run_program and stay on
    disk; here it also holds directories of mode 000 and, as a root caller's program may make, immutable files."""
    program = textwrap.dedent("""
        import fcntl, os, struct
        print(os.getcwd())
        fd = os.open(".", os.O_RDONLY)
        for i in range(1500):
            os.mkdir("d", dir_fd=fd)
            if i % 500 == 0:
                f = os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd)
                try:
                    old = struct.unpack("i", fcntl.ioctl(f, 0x80086601, bytes(8))[:4])[0]
                    fcntl.ioctl(f, 0x40086602, struct.pack("i", old | 0x10) + bytes(4))  # immutable
                except OSError:
                    pass
                os.close(f)
            nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
            if i % 7 == 3:
                os.fchmod(fd, 0)
            os.close(fd)
            fd = nxt
        os.fchmod(fd, 0)
        print("built")
    """)
    res = run_program(
        program,
        "stdin",
        [""],
        isolation="minimal",
        limits=Limits(timeout=20, sample_timeout=30, memory_mb=256),
    )
    t = res.tests[0]
    assert t.status == "ok", t
    workdir, built = t.stdout.decode().split()
    assert built == "built" and os.path.basename(workdir).startswith("xrpo-sandbox-")
    assert not os.path.lexists(workdir)
    assert_nothing_left_running()
