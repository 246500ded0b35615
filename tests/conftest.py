"""Shared fixtures: a tiny tokenizer and a tiny random Qwen2 model, built once per test session.

Both are shared by every test that asks for them: do not modify them in place (deep-copy the model first).

Shared helpers of the tests that start processes (tests/sandbox, and tests/rewards through the verifiers), imported as
``from tests.conftest import ...`` (pytest has loaded this module under that name before any test module): `wait_gone`
for worker pools, `MARK`, `assert_nothing_left_running` and `world_readable_file` for the sandbox, `hold_run_lock`
for the run directory's lock (tests/rundir, tests/trainer), `fresh_python` for what a new interpreter imports.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


def tiny_training_texts() -> list[str]:
    """Texts in the default task's format, enough for the tokenizer to learn the common merges."""
    texts = [f"Q: {a}+{b}\nA: \\boxed{{{a + b}}}" for a in range(0, 40, 3) for b in range(0, 40, 7)]
    texts += [f"Q: What is {a} * {b} - {c}?\nA: \\boxed{{{a * b - c}}}" for a, b, c in [(3, 4, 5), (12, 7, 30)]]
    texts += ["Find the greatest common divisor of 12 and 18. The answer is \\boxed{6}."]
    return texts


def pytest_collection_modifyitems(config, items):
    """The slow end-to-end tests first (a stable sort: the others keep their order). Under pytest-xdist (the README's
    `-n 2`) a test starts when a worker reaches it, so the longest ones (verl's end-to-end run: minutes) start at
    once beside the rest instead of leaving one worker running them alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from xrpo.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer(tiny_training_texts())


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    from xrpo.models.tiny import build_tiny_model

    return build_tiny_model(tiny_tokenizer, seed=0)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """Run torch single-threaded: the tiny models' matrices are too small to gain from intra-op threads, and on a
    busy 2-core machine two OpenMP threads made generation up to 8x slower (measured: 16 prompts x 8 samples x 24
    tokens took 1.15 s with 1 thread and 9.7-43 s with 2 while other processes ran). XRPO_TEST_THREADS=N runs it
    with N threads instead: the suite must pass under every thread count (CONTRIBUTING.md, "Tolerances")."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("XRPO_TEST_THREADS", "1")))
    yield
    torch.set_num_threads(previous)


# ------------------------------------------------------------------ processes (tests/sandbox, tests/rewards)

_HOLD = (
    "import sys, time; from xrpo.rundir.lock import RunLock\n"
    "with RunLock(sys.argv[1], 'xrpo train') as lock:\n"
    "    lock.claim(); print('held', flush=True); time.sleep(120)\n"
)


def hold_run_lock(path) -> subprocess.Popen:
    """Another process holding run directory ``path``'s lock (as `xrpo train` would) until it is killed."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def fresh_python(code: str, timeout: float = 300) -> str:
    """The standard output of ``code`` run by a new interpreter (this one has imported whatever other tests did),
    which must exit 0."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


MARK = str(900000 + os.getpid() % 99999)  # a sleep duration that names this test session's stray processes


def _stat(pid: str) -> tuple[int, int]:
    """(parent pid, start time in clock ticks since boot) of a process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[19])


_SESSION_START = _stat(str(os.getpid()))[1]


def _another_sessions(pid: str) -> bool:
    """Whether a process belongs to other work on this shared machine (another pytest or training run grading code
    at the same time): its ancestors lead to init without passing through this test session. An orphan (parent init)
    is ours when it began during this test session: a sandboxed process that escaped its run."""
    me = os.getpid()
    try:
        parent, start = _stat(pid)
        if parent == 1:
            return start < _SESSION_START
        while parent > 1:
            if parent == me:
                return False
            parent = _stat(str(parent))[0]
    except (OSError, ValueError, IndexError):
        pass  # the process or an ancestor ended while we looked: not a survivor of ours
    return True


def sandbox_processes() -> list[str]:
    """Processes of a dedicated sandbox uid, or sleeping for this test session's marker, that this test run started."""
    from xrpo.sandbox import programs

    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            uid = os.stat(f"/proc/{name}").st_uid
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ours = MARK in cmd or (
            programs._UID_BASE <= uid < programs._UID_BASE + programs._UID_SLOTS and not _another_sessions(name)
        )
        if ours:
            found.append(f"{name} uid={uid} {cmd[:80]}")
    return found


def assert_nothing_left_running(grace: float = 5.0) -> None:
    """No sandboxed process outlives its run (clean-up may take a moment after the verdict)."""
    deadline = time.monotonic() + grace
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() == []


def open_to_others(directory: Path) -> None:
    """Let any user reach `directory`: o+rx on it and on the folders above it up to pytest's per-user temporary root
    (``pytest-of-USER``, which pytest makes 0o700). How deep a test's tmp_path lies depends on how pytest runs: one
    level more under pytest-xdist (``pytest-of-root/pytest-N/popen-gw0/test_x0``). Outside such a root (pytest
    --basetemp) the directory and the two above it."""
    chain = [directory, *directory.parents]
    top = next((i for i, d in enumerate(chain) if d.name.startswith("pytest-of-")), 2)
    for d in chain[: top + 1]:
        os.chmod(d, os.stat(d).st_mode | 0o005)


def world_readable_file(path: Path, text: str) -> Path:
    """`path` holding `text`, readable by any user: the file and the directories above it (`open_to_others`)."""
    path.write_text(text)
    path.chmod(0o644)
    open_to_others(path.parent)
    return path


def wait_gone(pids, timeout=10.0):
    """Return the pids still alive after up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.05)
    return alive


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of ours (the template) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True
