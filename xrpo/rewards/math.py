"""The `math` verifier: final-answer extraction plus equivalence checking with math-verify, under a time limit.

Grading one completion against a reference:

1. extract the final answer (`xrpo.rewards.extract`: the last `\\boxed{}`/`\\fbox{}`, else the last `#### X`, else the
   last "answer is X" / "Answer: X", else, with `last_number=True`, the last number; a completion longer than
   `max_chars` is searched only in its tail). The answer is the expression that follows the marker, not the rest of
   its line: "The answer is 18, since 30 - 12 = 18." answers 18, "18 girls" is 18, "not 18" and "18 or 19" are not
   18 (the rules: the `extract` module's docstring and docs/rewards.md). None -> score 0, reason "no_answer"
   (`metadata["extraction"]` says why: no marker, unbalanced braces, empty box); an answer longer than
   `max_answer_chars` -> reason "answer_too_long". A reference that contains a box or `####` is reduced the same
   way, so a full reference solution works.
2. fast path: the normalised answer equals the normalised reference answer -> score 1 without sympy.
3. otherwise math-verify decides (`math_verify.parse` on the answer and on the reference, each wrapped as
   `\\boxed{...}`, then `math_verify.verify(gold, pred)`): fractions, decimals, LaTeX, intervals, sets, percentages,
   degrees and units in `\\text{}` as math-verify handles them. Equal -> 1, else 0 with reason "mismatch".

Time limit: step 3 runs in a shared pool of worker processes (`xrpo.sandbox.pool`), each item under a wall-clock
limit of `timeout` seconds; a worker that overruns is killed and replaced and the item gets score 0, reason "timeout"
(reason "error", with `metadata["error"]`, if the worker raised or died). math-verify's own limits use SIGALRM, which
only works in the main thread and cannot interrupt C code, so they are turned off and the process limit is the only
one. `verify_batch` grades each distinct (answer, reference) pair once and spreads those over all workers, so a batch
takes at most about `timeout * ceil(n / workers)` seconds; a single call goes through the same pool. With
`in_process=True` everything runs in the caller's thread with NO time limit (for callers that cannot have
subprocesses; a pathological answer can then hang the caller).

`VerifyResult.answer` is the normalised extracted answer (`normalize_answer`): equal strings for the same answer
written with different spacing, delimiters or `\\dfrac`/`\\frac`, but "1/2" and "0.5" remain different strings, hence
different cons@k votes. `metadata["canonical"]` is a best-effort value-level form from the sympy value math-verify
parsed (numbers and percentages as exact fractions: "0.5", "1/2" and "50%" all give "1/2"; other expressions
printed as parsed, never evaluated). It is set whenever step 3 ran; pass `canonical=True` to compute it for every
answered item (this sends the fast-path items through math-verify too). `metadata["source"]` is where the answer
was found ("boxed", "####", "answer_is", "last_number") and `metadata["method"]` what decided ("exact", "math_verify").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from xrpo.rewards.extract import extract_answer, normalize_answer, reference_answer
from xrpo.rewards.registry import Verifier, VerifyResult, check_batch, register_verifier
from xrpo.sandbox import default_workers, shared_pool

__all__ = ["MathVerifier", "grade_answer"]

_CANONICAL_MAX_CHARS = 200


class _DropTimeoutDisabledWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


def _quiet_math_verify() -> None:
    # We disable math-verify's signal timeouts on purpose; its one-time warning about that is noise.
    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropTimeoutDisabledWarning) for f in logger.filters):
            logger.addFilter(_DropTimeoutDisabledWarning())
    _patch_antlr49_parser()


@lru_cache(maxsize=1)
def _patch_antlr49_parser() -> None:
    # With antlr4-python3-runtime 4.9.* (pinned by hydra-core/omegaconf, i.e. whenever verl is installed) math-verify
    # uses latex2sympy2_extended's parser generated for antlr 4.9.3, whose AtomContext (1.11.0) lacks the FUNC_GAMMA
    # accessor that the converter tests before PERCENT_NUMBER: every percentage ("50\%") raised AttributeError and was
    # graded wrong. That grammar has no gamma token, so the accessor's answer is "absent".
    from importlib.metadata import PackageNotFoundError, version

    try:
        if not version("antlr4-python3-runtime").startswith("4.9."):
            return
        from latex2sympy2_extended.gen.antlr4_9_3.PSParser import PSParser
    except (PackageNotFoundError, ImportError):
        return
    if not hasattr(PSParser.AtomContext, "FUNC_GAMMA"):
        PSParser.AtomContext.FUNC_GAMMA = lambda self: None


@lru_cache(maxsize=1)
def _extraction_config():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


def _parse(answer: str) -> list:
    from math_verify import parse

    return parse("\\boxed{" + answer + "}", extraction_config=_extraction_config(), parsing_timeout=None)


# LaTeX parsing dominates the cost (tens of ms for a set or an interval) and the same strings recur: each reference
# G times per step, common answers ("1/2", "0") across prompts. Parsed sympy values are immutable, so cache them.
_parse_cached = lru_cache(maxsize=8192)(_parse)


def _canonical(parsed: list) -> str | None:
    """Best effort value-level form of a parsed answer: numbers and percentages of numbers become exact fractions
    (0.5, 1/2 and 50% all give "1/2"); other expressions are printed as parsed, never evaluated (evaluating could
    take longer than the time limit and lose the verdict)."""
    import sympy

    value = next((v for v in parsed if isinstance(v, sympy.Basic)), None)
    if value is None:
        return None
    percent = sympy.UnevaluatedExpr(sympy.Rational(1, 100))
    if isinstance(value, sympy.Mul) and len(value.args) == 2 and value.args[1] == percent:
        base = value.args[0]
        if isinstance(base, sympy.Number):
            value = _exact(base) / 100
    elif isinstance(value, sympy.Number):
        value = _exact(value)
    text = str(value)
    return text if len(text) <= _CANONICAL_MAX_CHARS else None


def _exact(number):
    import sympy

    # A Float prints 15 significant digits: "0.5" -> 1/2, the string the fraction 1/2 gives.
    return sympy.Rational(str(number)) if isinstance(number, sympy.Float) else number


def grade_answer(answer: str, reference: str, want_canonical: bool = True) -> tuple[bool, str | None]:
    """Is `answer` mathematically equivalent to `reference` (both bare LaTeX, no delimiters)? Runs math-verify with
    its signal timeouts off, so it works in any thread but has no time limit of its own.

    Returns `(equivalent, canonical form of answer or None)`.
    """
    from math_verify import verify

    _quiet_math_verify()
    gold = _parse_cached(reference)
    pred = _parse_cached(answer)
    ok = bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None)
    if not ok and gold and pred:
        # math-verify equates a percentage with its number for integers only (9% and 9, but not 12.5% and 12.5);
        # the same rule for every number
        plain_gold, plain_pred = _without_percent(gold), _without_percent(pred)
        if (plain_gold, plain_pred) != (gold, pred):
            ok = verify(plain_gold, plain_pred, timeout_seconds=None)
    return ok, (_canonical(pred) if want_canonical else None)


def _without_percent(parsed: list) -> list:
    """A parsed number X% (math-verify's X * UnevaluatedExpr(1/100)) as the number X; anything else unchanged."""
    from math_verify.grader import get_pct_val
    from sympy import Number

    out = []
    for value in parsed:
        base = get_pct_val(value)
        out.append(base if isinstance(base, Number) else value)
    return out


# One answer down each of math-verify's comparison paths: exact and numeric equality, sympy's simplify (whose first
# call imports sympy.physics and sympy.combinatorics: 0.3-0.7 s here that a fresh worker would otherwise spend inside
# an item's time limit), sets (one against a number), intervals, functions.
_WARM_UP = (
    ("\\frac{1}{2}", "0.5"),
    ("2^{10}", "5"),
    ("x^2+1", "(x+1)^2"),
    ("(0,1]", "[0,2)"),
    ("\\{1\\}", "\\{2\\}"),
    ("1, x", "1"),
    ("\\sin(x)", "\\cos(x)"),
)


def _warm_up() -> None:
    """Worker initializer: import what sympy and math-verify import on first use and compile math-verify's regexes
    before taking tasks, so that no item's time limit pays for it."""
    for answer, reference in _WARM_UP:
        grade_answer(answer, reference)


@register_verifier("math")
class MathVerifier(Verifier):
    """Verifier for math answers (see the module docstring).

    Args:
        timeout: wall-clock seconds allowed per item for the math-verify step.
        workers: worker processes; default the number of usable CPU cores, at most 8. Verifiers with the same
            `workers` and `max_memory_mb` share one pool.
        in_process: grade in the caller's thread, without subprocesses and WITHOUT any time limit.
        max_chars: a completion longer than this is searched for its answer only in its last `max_chars` characters.
        max_answer_chars: an answer longer than this is not graded (score 0, reason "answer_too_long").
        canonical: compute `metadata["canonical"]` for every answered item, even those the fast path settles.
        max_memory_mb: address-space headroom per worker (a runaway expression fails with MemoryError, graded 0);
            None for no cap.
        last_number: when the completion has no box, `####` or "answer is" / "Answer:", grade its last number
            (math-verify's and lighteval's anchorless fallback). Off by default: it grades the working of a
            completion cut off by max_new_tokens on whatever number it reached, and turns "no answer" (a format the
            prompt did not get across) into "mismatch".
    """

    name = "math"

    def __init__(
        self,
        *,
        timeout: float = 5.0,
        workers: int | None = None,
        in_process: bool = False,
        max_chars: int = 1_000_000,
        max_answer_chars: int = 10_000,
        canonical: bool = False,
        max_memory_mb: int | None = 4096,
        last_number: bool = False,
    ):
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
            raise ValueError(f"timeout: expected a positive number of seconds, got {timeout!r}")
        if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
            raise ValueError(f"workers: expected None or an integer >= 1, got {workers!r}")
        for arg, value in (("max_chars", max_chars), ("max_answer_chars", max_answer_chars)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{arg}: expected an integer >= 1, got {value!r}")
        if max_memory_mb is not None and (not isinstance(max_memory_mb, int) or max_memory_mb < 1):
            raise ValueError(f"max_memory_mb: expected None or an integer >= 1, got {max_memory_mb!r}")
        self.timeout = float(timeout)
        self.workers = workers or min(default_workers(), 8)
        self.in_process = bool(in_process)
        self.max_chars = max_chars
        self.max_answer_chars = max_answer_chars
        self.canonical = bool(canonical)
        self.max_memory_mb = max_memory_mb
        if not isinstance(last_number, bool):
            raise ValueError(f"last_number: expected true or false, got {last_number!r}")
        self.last_number = last_number

    def __repr__(self) -> str:
        mode = "in_process" if self.in_process else f"workers={self.workers}, timeout={self.timeout:g}"
        return f"MathVerifier({mode})"

    def _pool(self):
        return shared_pool(self.workers, initializer="xrpo.rewards.math:_warm_up", max_memory_mb=self.max_memory_mb)

    def reference_errors(self, references: Sequence[str]) -> list[tuple[int, str]]:
        """Every reference no answer can match: not a string, empty, or a code problem's test cases (a JSON object or
        a list of objects, the form the data loader gives them), which would score every rollout 0."""
        errors = []
        for i, ref in enumerate(references):
            if not isinstance(ref, str):
                errors.append((i, f"expected a string, got {type(ref).__name__}"))
            elif not ref.strip():
                errors.append((i, "empty reference answer"))
            elif ref.lstrip()[0] in "{[":
                try:
                    value = json.loads(ref)
                except ValueError:  # not JSON: a LaTeX set, interval or list
                    continue
                if isinstance(value, dict) or (
                    isinstance(value, list) and value and all(isinstance(v, dict) for v in value)
                ):
                    errors.append(
                        (i, "holds test cases (JSON objects), not a math answer: grade it with the 'code' verifier")
                    )
        return errors

    def verify_batch(self, completions: Sequence[str], references: Sequence[str]) -> list[VerifyResult]:
        completions, references = check_batch(completions, references)
        for i, ref in enumerate(references):
            if not ref.strip():
                raise ValueError(f"references[{i}]: empty reference answer")
        results: list[VerifyResult | None] = [None] * len(completions)
        jobs: list[tuple[int, str, str, str, dict]] = []  # (index, raw answer, reference answer, answer, metadata)
        gold_cache: dict[str, tuple[str, str]] = {}
        for i, (completion, reference) in enumerate(zip(completions, references)):
            ex = extract_answer(
                completion,
                max_chars=self.max_chars,
                max_answer_chars=self.max_answer_chars,
                last_number=self.last_number,
            )
            if ex.answer is None:
                reason = "answer_too_long" if ex.detail == "answer_too_long" else "no_answer"
                results[i] = VerifyResult(0.0, None, reason, {"extraction": ex.detail})
                continue
            if reference not in gold_cache:
                gold = reference_answer(reference)
                gold_cache[reference] = (gold, normalize_answer(gold))
            gold, gold_norm = gold_cache[reference]
            answer = normalize_answer(ex.answer)
            meta: dict[str, Any] = {"source": ex.source}
            if answer == gold_norm:
                meta["method"] = "exact"
                results[i] = VerifyResult(1.0, answer, None, meta)
                if not self.canonical:
                    continue
            jobs.append((i, ex.answer, gold, answer, meta))
        if jobs:
            # A group of rollouts often repeats an answer: grade each distinct (answer, reference) pair once.
            distinct = list(dict.fromkeys((raw, gold) for _, raw, gold, _, _ in jobs))
            graded = dict(zip(distinct, self._grade(distinct)))
            for i, raw, gold, answer, meta in jobs:
                status, value = graded[(raw, gold)]
                settled = results[i]  # the exact-match verdict stands; math-verify only adds the canonical form
                if status == "ok":
                    ok, canonical = value
                    meta["canonical"] = canonical
                    if settled is None:
                        meta["method"] = "math_verify"
                        results[i] = VerifyResult(1.0 if ok else 0.0, answer, None if ok else "mismatch", meta)
                elif settled is None:
                    meta["method"] = "math_verify"
                    if status == "error":
                        meta["error"] = value
                    results[i] = VerifyResult(0.0, answer, status, meta)
        return results  # type: ignore[return-value]

    def _grade(self, pairs: list[tuple[str, str]]) -> list[tuple[str, Any]]:
        if self.in_process:
            out = []
            for answer, gold in pairs:
                try:
                    out.append(("ok", grade_answer(answer, gold)))
                except Exception as e:
                    out.append(("error", f"{type(e).__name__}: {e}"[:500]))
            return out
        return self._pool().run("xrpo.rewards.math:grade_answer", pairs, self.timeout)
