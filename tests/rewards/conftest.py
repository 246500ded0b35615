import os
import time

import pytest

from xrpo.rewards import MathVerifier, _pool, shutdown_pools


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


@pytest.fixture(scope="session")
def math_verifier():
    """The pooled math verifier with a short limit (2 workers, as on CI's 2 cores)."""
    return MathVerifier(timeout=3.0, workers=2)


@pytest.fixture(scope="session", autouse=True)
def no_processes_left_behind():
    yield
    pids = [pid for pool in list(_pool._POOLS.values()) for pid in pool.pids()]
    shutdown_pools()
    assert wait_gone(pids) == []
