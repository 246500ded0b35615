"""Verifiers: reward functions that grade a completion against a reference answer.

`get_verifier("math")` returns the math verifier, `get_verifier("code")` the sandboxed code verifier;
`get_verifier("pkg.mod:obj")` imports a user verifier. See `xrpo.rewards.registry` for the contract,
`xrpo.rewards.math` and `xrpo.rewards.code` for the built-in verifiers; the sandbox and the worker pools they run in
are `xrpo.sandbox`.
"""

from xrpo.rewards.code import CodeVerifier, extract_code
from xrpo.rewards.code_formats import parse_tests
from xrpo.rewards.extract import extract_answer, normalize_answer
from xrpo.rewards.math import MathVerifier
from xrpo.rewards.registry import (
    VERIFIERS,
    FunctionVerifier,
    Verifier,
    VerifyResult,
    get_verifier,
    raise_reference_errors,
    register_verifier,
)
from xrpo.sandbox import shutdown_pools

__all__ = [
    "VERIFIERS",
    "CodeVerifier",
    "FunctionVerifier",
    "MathVerifier",
    "Verifier",
    "VerifyResult",
    "extract_answer",
    "extract_code",
    "get_verifier",
    "normalize_answer",
    "parse_tests",
    "raise_reference_errors",
    "register_verifier",
    "shutdown_pools",
]
