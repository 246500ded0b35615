"""Fixtures of the rollout tests (their fakes: `_fakes.py`)."""

import pytest

from xrpo.rewards import get_verifier


@pytest.fixture(scope="module")
def verifier():
    """The math verifier, one per test module."""
    return get_verifier("math")
