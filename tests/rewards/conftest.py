import pytest

from tests.conftest import wait_gone
from xrpo.rewards import MathVerifier, shutdown_pools
from xrpo.sandbox import pool


@pytest.fixture(scope="session")
def math_verifier():
    """The pooled math verifier with a short limit (2 workers, as on CI's 2 cores)."""
    return MathVerifier(timeout=3.0, workers=2)


@pytest.fixture(scope="session", autouse=True)
def no_processes_left_behind():
    yield
    pids = [pid for p in list(pool._POOLS.values()) for pid in p.pids()]
    shutdown_pools()
    assert wait_gone(pids) == []
