"""Verifiers: reward functions that grade a completion against a reference answer.

`get_verifier("math")` returns the math verifier; `get_verifier("pkg.mod:obj")` imports a user verifier. See
`xrpo.rewards.registry` for the contract and `xrpo.rewards.math` for the math verifier's behaviour.
"""

from xrpo.rewards._pool import shutdown_pools
from xrpo.rewards.extract import extract_answer, normalize_answer
from xrpo.rewards.math import MathVerifier
from xrpo.rewards.registry import (
    VERIFIERS,
    FunctionVerifier,
    Verifier,
    VerifyResult,
    get_verifier,
    register_verifier,
)

__all__ = [
    "VERIFIERS",
    "FunctionVerifier",
    "MathVerifier",
    "Verifier",
    "VerifyResult",
    "extract_answer",
    "get_verifier",
    "normalize_answer",
    "register_verifier",
    "shutdown_pools",
]
