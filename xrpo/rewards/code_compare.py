"""Output comparison of the `code` verifier: does what a program printed or returned match the expected output?

The rules an RL reward needs: an integer is right only when it is exactly the expected integer (a tolerance on
integers rewards answers near 1e9 that are off by hundreds); a tolerance applies only where the expected value is a
real number; special values (nan, inf, Infinity, sNaN) are words, never numbers; nothing a program prints or returns
raises out of the comparison (it fails the test, with what differed in ``detail``):

- stdin tests, ``compare="tokens"`` (default): the tokens (split at ASCII whitespace) of stdout and of the
  expected output must pair up. An expected integer (``[+-]?[0-9]+``) is matched by the same integer, of any
  length, with any sign or leading zeros, or written with a fraction of zeros only (``5.000``); never within a
  tolerance, never with an exponent or another script's digits. An expected real number (a decimal literal with
  a fraction or an exponent, finite as a float) is matched by any finite decimal literal within ``float_tol``
  (1e-6) absolutely or relatively (the checker of most Codeforces problems with real-valued answers). Any other
  token (words, nan, inf, an expected real that overflows) is matched by the same bytes only.
  ``compare="lines"`` is LiveCodeBench's rule: the stripped output and expected output have the same number of
  lines, and each line matches exactly or as a list of exactly equal decimal literals (``1.50`` = ``1.5``;
  NaN / Infinity / sNaN are words there too).
- function-call tests: the returned value (tuples as lists, as LiveCodeBench does) equals the expected value:
  an expected int only by an int or float of exactly that value (Python's ``==``, never an overflow); an expected
  float by an int or float within ``float_tol`` (NaN only by NaN, an infinity only by itself); bools only by
  bools; strings, None, lists and dicts by the same structure. An expected value wrapped in a one-element list
  also accepts the bare value (the APPS/TACO convention ``outputs[i] == [value]``). A returned JSON text that
  does not parse (nested past the recursion limit, an int past Python's 4,300-digit limit, not UTF-8) fails, and
  so does one longer than 8 times the expected value's JSON plus 64 bytes, unparsed (json.loads would build
  objects up to 18 times its size).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["compare_returned", "compare_stdout", "compare_values"]

# Everything below reads what a program printed or returned, so it gives a verdict for any bytes and never raises,
# and its work is linear in their size: no regular expression that can backtrack over a token (bytes methods only),
# no int() of a digit string (Python refuses those past 4,300 digits), no list of every token or line of a 16 MB
# output (pieces come a chunk at a time). Work done per token or per line in Python stops at the first difference,
# so it is bounded by the expected output's size (the dataset's), whatever the program prints; the rest (decoding
# nothing, splitting, comparing bytes) runs in C at memory speed.

_CHUNK = 1 << 16  # a chunk of single-byte tokens splits into a list 8 times its size
_SPACES = (b" ", b"\n", b"\t", b"\r", b"\x0b", b"\x0c")  # what bytes.split() splits at: ASCII whitespace


def _next_space(data: bytes, pos: int) -> int:
    """Index of the first ASCII whitespace byte at or after `pos`, or -1 (memchr a window at a time: a regular
    expression's character class is ten times slower)."""
    n = len(data)
    while pos < n:
        end = min(n, pos + _CHUNK)
        hits = [i for i in (data.find(c, pos, end) for c in _SPACES) if i >= 0]
        if hits:
            return min(hits)
        pos = end
    return -1


def _pieces(data: bytes, sep: bytes | None) -> Iterator[bytes]:
    """``data.split(sep)``, lazily: a chunk (cut at a separator) at a time, so that memory stays O(chunk)."""
    start, n = 0, len(data)
    while n - start > _CHUNK:
        if sep is None:
            cut = _next_space(data, start + _CHUNK)
        else:
            cut = data.find(sep, start + _CHUNK)
        if cut < 0:
            break
        yield from data[start:cut].split(sep)
        start = cut if sep is None else cut + len(sep)
    yield from data[start:].split(sep)


def _show(token: bytes, n: int = 50) -> str:
    return repr(bytes(token[:n]).decode("utf-8", "replace"))


def _int_token(tok: bytes, zero_fraction: bool = False) -> bytes | None:
    """The canonical digits of an integer literal (``[+-]?[0-9]+``; with `zero_fraction`, also followed by a point and
    zeros only), or None. ASCII digits only: int() would take other scripts' digits and underscores."""
    neg = tok[:1] == b"-"
    if tok[:1] in (b"+", b"-"):
        tok = tok[1:]
    if zero_fraction:
        tok, point, frac = tok.partition(b".")
        if point and frac.strip(b"0"):
            return None
    if not tok.isdigit():  # bytes.isdigit: ASCII only; False for b""
        return None
    digits = tok.lstrip(b"0") or b"0"
    return b"-" + digits if neg and digits != b"0" else digits


def _decimal_syntax(tok: bytes) -> bool:
    """Is `tok` a decimal literal: ``[+-]?(digits[.digits]|.digits)([eE][+-]?digits)?`` (ASCII)? Words such as
    nan, inf, Infinity and sNaN are not."""
    s = tok[1:] if tok[:1] in (b"+", b"-") else tok
    mant, e, exp = s.replace(b"E", b"e").partition(b"e")
    if e and not (exp[1:] if exp[:1] in (b"+", b"-") else exp).isdigit():
        return False
    whole, _, frac = mant.partition(b".")
    return bool(whole or frac) and (not whole or whole.isdigit()) and (not frac or frac.isdigit())


def _real(tok: bytes) -> float | None:
    """The finite value of a decimal literal, or None (not one, or it overflows)."""
    if not _decimal_syntax(tok):
        return None
    x = float(tok)
    return x if math.isfinite(x) else None


def _within(x: float, y: float, tol: float) -> bool:
    d = abs(x - y)  # both finite: at worst inf, never an exception
    return d <= tol or d <= tol * abs(y)


def _tokens_match(got: bytes, want: bytes, tol: float) -> bool:
    if got == want:
        return True
    want_int = _int_token(want)
    if want_int is not None:  # an integer is expected: exactly that integer
        return _int_token(got, zero_fraction=True) == want_int
    y = _real(want)
    if y is None:  # a word, or a real that overflows: only the same text matches
        return False
    x = _real(got)
    return x is not None and _within(x, y, tol)


def _decimal(tok: bytes) -> Decimal | None:
    if not _decimal_syntax(tok):
        return None
    try:
        return Decimal(tok.decode("ascii"))
    except (InvalidOperation, ValueError):  # an exponent past Decimal's range
        return None


def _decimal_lines_match(got: bytes, want: bytes) -> bool:
    """LiveCodeBench's second chance for a line: both lines are decimals, pairwise exactly equal."""
    mine = _pieces(got, None)
    for b in _pieces(want, None):
        a = next(mine, None)
        if a is None:
            return False
        da, db = _decimal(a), _decimal(b)
        if da is None or db is None or da != db:
            return False
    return next(mine, None) is None


def _as_bytes(text: str | bytes) -> bytes:
    return text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)


def compare_stdout(
    output: str | bytes, expected: str | bytes, *, mode: str = "tokens", float_tol: float = 1e-6
) -> tuple[bool, str]:
    """Does a program's stdout match the expected output? Returns `(match, what differed)` (rules in the module
    docstring). Gives a verdict for any bytes: never raises for what `output` holds."""
    got, want = _as_bytes(output), _as_bytes(expected)
    if mode == "tokens":
        if got == want:
            return True, ""
        mine, theirs = _pieces(got, None), _pieces(want, None)
        k = 0
        for b in theirs:
            a = next(mine, None)
            if a is None:
                return False, f"got {k} tokens, expected {k + 1 + sum(1 for _ in theirs)}"
            if a != b and not _tokens_match(a, b, float_tol):
                return False, f"token {k}: got {_show(a)}, expected {_show(b)}"
            k += 1
        # not counted: a program's extra tokens cost the grader nothing beyond this one
        return (True, "") if next(mine, None) is None else (False, f"got more than the {k} tokens expected")
    if mode == "lines":
        got, want = got.strip(), want.strip()
        if got == want:
            return True, ""
        n_got, n_want = got.count(b"\n") + 1, want.count(b"\n") + 1
        if n_got != n_want:
            return False, f"got {n_got} lines, expected {n_want}"
        for k, (a, b) in enumerate(zip(_pieces(got, b"\n"), _pieces(want, b"\n"))):
            a, b = a.strip(), b.strip()
            if a != b and not _decimal_lines_match(a, b):
                return False, f"line {k}: got {_show(a)}, expected {_show(b)}"
        return True, ""
    raise ValueError(f"compare: expected 'tokens' or 'lines', got {mode!r}")


def compare_values(got: Any, expected: Any, *, float_tol: float = 1e-6, unwrap: bool = True) -> bool:
    """Equality of a returned value and the expected one (rules in the module docstring); never raises for
    JSON data (a huge int against a float, NaN, infinities included)."""
    if _equal(got, expected, float_tol):
        return True
    # APPS / TACO store a function's expected value wrapped in a list
    return unwrap and isinstance(expected, list) and len(expected) == 1 and _equal(got, expected[0], float_tol)


def _equal(a: Any, b: Any, tol: float) -> bool:
    # Recursion follows `b` (the reference) only as deep as `a` is deep too: a returned value nested more deeply
    # than the expected one costs nothing.
    if b is None or isinstance(b, bool):
        return a is b
    if isinstance(b, int):  # exactly: Python compares an int with a float exactly, without converting either
        return type(a) in (int, float) and a == b
    if isinstance(b, float):
        if type(a) not in (int, float):
            return False
        if math.isnan(b):
            return isinstance(a, float) and math.isnan(a)
        if math.isinf(b):
            return a == b
        try:
            x = float(a)
        except OverflowError:  # an int past the float range is not near any finite float
            return False
        return math.isfinite(x) and _within(x, b, tol)
    if isinstance(b, str):
        return isinstance(a, str) and a == b
    if isinstance(b, list):
        return isinstance(a, list) and len(a) == len(b) and all(_equal(x, y, tol) for x, y in zip(a, b))
    if isinstance(b, dict):
        return isinstance(a, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k], tol) for k in b)
    return type(a) is type(b) and a == b


def _show_value(value: Any, n: int | None = 100) -> str:
    try:
        return json.dumps(value)[:n]
    except (TypeError, ValueError, RecursionError):
        return repr(value)[:n]


def compare_returned(value: bytes, expected: Any, *, float_tol: float = 1e-6) -> tuple[bool, str]:
    """Does the JSON text a function-call test sent back (`TestOutcome.value`) hold the expected value? Returns
    `(match, what differed)`; gives a verdict for any bytes (a value nested too deeply for json, an int past its
    digit limit, bytes that are not JSON all fail)."""
    # json.loads builds objects many times the size of their text ("[]," is a 56-byte list): a value whose JSON
    # is far longer than any writing of the expected one (floats' repr at most 8 times, "1.0" for 1) is not parsed
    limit = 8 * len(_show_value(expected, None)) + 64
    if len(value) > limit:
        return False, f"the returned value's JSON has {len(value)} bytes, more than any match could ({limit})"
    try:
        got = json.loads(value)
    except RecursionError:
        return False, "the returned value could not be read (nested too deeply)"
    except (TypeError, ValueError):  # UnicodeDecodeError included
        return False, "the returned value could not be read (not JSON)"
    if compare_values(got, expected, float_tol=float_tol):
        return True, ""
    return False, f"returned {_show(value, 100)[1:-1]}, expected {_show_value(expected)}"
