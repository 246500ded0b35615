"""The worker pool behind the math verifier (xrpo/sandbox/pool.py, xrpo/sandbox/_pool_worker.py)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import wait_gone
from xrpo.sandbox import WorkerPool

from . import _tasks

T = _tasks.__name__
# The directory from which `T` is importable: workers get the caller's sys.path, and pytest's import mode may not
# leave it there.
TASKS_ROOT = str(Path(_tasks.__file__).resolve().parents[T.count(".")])


@pytest.fixture(scope="module", autouse=True)
def tasks_importable():
    sys.path.insert(0, TASKS_ROOT)
    yield
    sys.path.remove(TASKS_ROOT)


@pytest.fixture(scope="module")
def pool():
    p = WorkerPool(2)
    yield p
    pids = p.pids()
    p.close()
    assert wait_gone(pids) == []


def test_results_in_order(pool):
    out = pool.run(f"{T}:echo", [(i,) for i in range(20)], timeout=10)
    assert out == [("ok", i) for i in range(20)]
    assert pool.run(f"{T}:echo", [], timeout=10) == []


def test_error_and_timeout_are_reported_per_task(pool):
    before = pool.pids()
    out = pool.run(
        f"{T}:sleep_then",
        [(0.0, "a"), (60.0, "never"), (0.0, "b")],
        timeout=1.0,
    )
    assert out == [("ok", "a"), ("timeout", None), ("ok", "b")]
    # the overrunning worker was killed and replaced; the pool still has 2 workers
    after = pool.pids()
    assert len(after) == 3 and len(set(before) & set(after)) == 2  # 2 workers + the template
    assert pool.run(f"{T}:fail", [("boom",)], timeout=5) == [("error", "ValueError: boom")]


def test_dead_worker_is_replaced(pool):
    out = pool.run(f"{T}:die", [(3,)], timeout=5)
    assert out == [("error", "worker process died")]
    assert pool.run(f"{T}:echo", [(1,), (2,)], timeout=5) == [("ok", 1), ("ok", 2)]


def test_batch_runs_in_parallel(pool, tmp_path):
    # each task waits for the other to arrive: both succeed only if the two run at the same time
    out = pool.run(f"{T}:rendezvous", [(str(tmp_path), "a", 2, 20.0), (str(tmp_path), "b", 2, 20.0)], timeout=30)
    assert out == [("ok", True), ("ok", True)]


def test_two_overruns_at_once(pool):
    start = time.monotonic()
    out = pool.run(f"{T}:sleep_then", [(60.0, 0), (60.0, 1)], timeout=1.0)
    elapsed = time.monotonic() - start
    assert out == [("timeout", None), ("timeout", None)]
    assert elapsed < 30  # hang guard only


def test_concurrent_callers_from_threads(pool):
    results = {}

    def call(k):
        results[k] = pool.run(f"{T}:echo", [(k * 100 + i,) for i in range(10)], timeout=10)

    threads = [threading.Thread(target=call, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {k: [("ok", k * 100 + i) for i in range(10)] for k in range(4)}


def test_memory_cap_turns_a_runaway_into_an_error():
    capped = WorkerPool(1, max_memory_mb=256)
    try:
        assert capped.run(f"{T}:allocate", [(16,)], timeout=10) == [("ok", 16 * 2**20)]
        assert capped.run(f"{T}:allocate", [(2048,)], timeout=10) == [("error", "MemoryError: ")]
    finally:
        capped.close()


def test_bad_arguments(pool):
    with pytest.raises(ValueError, match="workers: expected an integer >= 1"):
        WorkerPool(0)
    with pytest.raises(ValueError, match="timeout: expected a positive number"):
        pool.run(f"{T}:echo", [(1,)], timeout=0)


def test_closed_pool_refuses_work():
    p = WorkerPool(1)
    pids = p.pids()
    p.close()
    p.close()  # idempotent
    assert wait_gone(pids) == []
    with pytest.raises(RuntimeError, match="shut down"):
        p.run(f"{T}:echo", [(1,)], timeout=5)


def test_bad_initializer_is_a_clear_error():
    with pytest.raises(RuntimeError, match="failed to start: ModuleNotFoundError"):
        WorkerPool(1, initializer="no_such_module_xyz:init")


SCRIPT = textwrap.dedent(
    """
    # deliberately no `if __name__ == "__main__":` guard: workers must not re-import this script
    import sys, time
    from xrpo.rewards import get_verifier
    from xrpo.sandbox.pool import _POOLS
    v = get_verifier("math", timeout=5, workers=2)
    assert v(r"\\boxed{0.5}", "1/2").score == 1.0
    print(" ".join(str(p) for pool in _POOLS.values() for p in pool.pids()), flush=True)
    if sys.argv[1] == "hang":
        time.sleep(600)
    """
)


def _start_script(tmp_path, mode):
    script = tmp_path / "use_verifier.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 3, pids  # 2 workers and the template
    return proc, pids


def test_processes_end_with_the_interpreter(tmp_path):
    proc, pids = _start_script(tmp_path, "exit")
    assert proc.wait(60) == 0
    assert wait_gone(pids) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_processes_end_when_the_caller_is_killed(tmp_path):
    proc, pids = _start_script(tmp_path, "hang")
    proc.kill()  # SIGKILL: no atexit hook runs
    proc.wait(10)
    assert wait_gone(pids) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_pool_survives_the_loss_of_its_template():
    p = WorkerPool(2)
    try:
        assert p.run(f"{T}:echo", [(1,)], timeout=5) == [("ok", 1)]
        *workers, template = p.pids()
        os.kill(template, signal.SIGKILL)  # the workers die with it
        assert wait_gone(workers + [template]) == []
        # dead idle workers are noticed before a task is sent, and the template is restarted
        assert p.run(f"{T}:echo", [(2,), (3,)], timeout=5) == [("ok", 2), ("ok", 3)]
        assert len(p.pids()) == 3 and not set(p.pids()) & set(workers + [template])
    finally:
        p.close()
