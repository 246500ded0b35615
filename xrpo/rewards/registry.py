"""Verifier registry: `VerifyResult`, the `Verifier` base class, `register_verifier`, `get_verifier`.

A verifier turns one completion and its reference answer into a reward. Built-in verifiers register themselves by
name (`@register_verifier("math")`); anything else is reached by a dotted import path (`"pkg.mod:obj"` or
`"pkg.mod.obj"`), where `obj` is

- a `Verifier` subclass or any other class: instantiated with the keyword arguments of `get_verifier`;
- a plain function `(completion, reference) -> VerifyResult | float`: used as the verifier itself;
- a factory: any other callable, called with the keyword arguments and expected to return a verifier. A function that
  accepts two positional arguments is taken as the verifier itself unless keyword arguments are given;
- an instance: a `Verifier` object, or a callable object with the verifier signature.

Whatever is found is wrapped so that it behaves like a `Verifier`: callable on one pair and with a `verify_batch`.
User verifiers run in the caller's process with no time limit (they may hold state that does not survive a trip to a
worker process, such as a loaded reward model); an exception raised for one completion gives that item score 0 with
reason "error" instead of failing the batch.

Adding a verifier that needs isolation: subclass `Verifier` and implement `verify_batch`. Work that may hang but is
trusted goes through `xrpo.sandbox.WorkerPool.run` (per-item wall-clock limit; a worker that overruns is killed
and replaced), as the `math` verifier does; untrusted programs go through `xrpo.sandbox.run_program`, as the
`code` verifier (`xrpo.rewards.code`) does. Register the class with `@register_verifier("name")`.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "VERIFIERS",
    "FunctionVerifier",
    "VerifyResult",
    "Verifier",
    "get_verifier",
    "register_verifier",
]


@dataclass(frozen=True)
class VerifyResult:
    """The verdict on one completion.

    Attributes:
        score: the reward (1.0 right, 0.0 wrong for the built-in verifiers).
        answer: the final answer extracted from the completion, normalised so that identical answers written with
            different spacing give the same string (cons@k votes on it); None when no answer was found.
        reason: why the score is 0 ("no_answer", "mismatch", "timeout", ...); None for a correct answer.
        metadata: verifier-specific details (extraction source, method, canonical form, error text).
    """

    score: float
    answer: str | None
    reason: str | None = None
    metadata: dict = field(default_factory=dict)


class Verifier:
    """Base class of verifiers: subclasses implement `verify_batch`.

    `verifier(completion, reference)` grades one pair through `verify_batch`, so a subclass that isolates work in
    worker processes applies the same isolation to single calls.
    """

    name: str = ""

    def __call__(self, completion: str, reference: str) -> VerifyResult:
        return self.verify_batch([completion], [reference])[0]

    def verify_batch(self, completions: Sequence[str], references: Sequence[str]) -> list[VerifyResult]:
        raise NotImplementedError(f"{type(self).__name__} must implement verify_batch(completions, references)")

    def reference_errors(self, references: Sequence[str]) -> list[tuple[int, str]]:
        """(index, what is wrong) for every reference this verifier cannot grade, checked once when a dataset is
        loaded so that a malformed row stops the run before its first step, named by the caller (file, problem
        id). The default accepts every string; verifiers with a reference format (``code``) override it."""
        return []


def raise_reference_errors(verifier: Verifier, problems: Sequence, where: str, limit: int = 5) -> None:
    """Raise ValueError naming `where` (a file or split), the problem ids and what is wrong when `verifier` cannot
    grade some of the problems' reference answers (`Verifier.reference_errors`)."""
    errors = verifier.reference_errors([p.answer for p in problems])
    if errors:
        lines = [f"  problem {problems[i].id!r} (row {i}): {msg}" for i, msg in errors[:limit]]
        more = f"\n  ... and {len(errors) - limit} more" if len(errors) > limit else ""
        raise ValueError(
            f"{where}: {len(errors)} of {len(problems)} reference answers cannot be graded by the "
            f"{verifier.name or type(verifier).__name__!r} verifier:\n" + "\n".join(lines) + more
        )


def check_batch(completions: Sequence[str], references: Sequence[str]) -> tuple[list[str], list[str]]:
    """Validate a batch: two sequences of strings of equal length. Returns them as lists."""
    if isinstance(completions, str) or not isinstance(completions, Sequence):
        raise ValueError(f"completions: expected a list of strings, got {type(completions).__name__}")
    if isinstance(references, str) or not isinstance(references, Sequence):
        raise ValueError(f"references: expected a list of strings, got {type(references).__name__}")
    if len(completions) != len(references):
        raise ValueError(
            f"completions and references must have the same length, got {len(completions)} and {len(references)}"
        )
    for name, seq in (("completions", completions), ("references", references)):
        for i, s in enumerate(seq):
            if not isinstance(s, str):
                raise ValueError(f"{name}[{i}]: expected str, got {type(s).__name__}")
    return list(completions), list(references)


class FunctionVerifier(Verifier):
    """Wraps a user callable `(completion, reference) -> VerifyResult | float` as a `Verifier`.

    Runs in the caller's process, one item at a time, with no time limit. An exception raised by the callable gives
    that item `VerifyResult(0.0, None, "error", {"error": "..."})`; a return value that is neither a `VerifyResult`
    nor a finite number raises `TypeError` (a bug in the verifier, not in the completion).
    """

    def __init__(self, fn: Callable[[str, str], Any], name: str = ""):
        if not callable(fn):
            raise ValueError(f"verifier {name or fn!r}: expected a callable, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", type(fn).__name__)
        # A duck-typed verifier object may batch better than a loop over its __call__.
        batch = getattr(fn, "verify_batch", None)
        self._batch = batch if callable(batch) else None

    def _coerce(self, value: Any) -> VerifyResult:
        if isinstance(value, VerifyResult):
            return value
        if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
            return VerifyResult(float(value), None)
        raise TypeError(
            f"verifier {self.name!r} returned {type(value).__name__} {value!r:.80}; expected a VerifyResult or a "
            "finite float"
        )

    def verify_batch(self, completions: Sequence[str], references: Sequence[str]) -> list[VerifyResult]:
        completions, references = check_batch(completions, references)
        if self._batch is not None:
            out = list(self._batch(completions, references))
            if len(out) != len(completions):
                raise TypeError(
                    f"verifier {self.name!r}: verify_batch returned {len(out)} results for {len(completions)} items"
                )
            return [self._coerce(v) for v in out]
        results = []
        for c, r in zip(completions, references):
            try:
                value = self.fn(c, r)
            except Exception as e:  # a bad completion must not sink the batch
                results.append(VerifyResult(0.0, None, "error", {"error": f"{type(e).__name__}: {e}"[:500]}))
                continue
            results.append(self._coerce(value))
        return results


VERIFIERS: dict[str, Callable[..., Verifier]] = {}


def register_verifier(name: str) -> Callable:
    """Decorator registering a verifier class or factory under `name`; a duplicate name raises `ValueError`."""
    if not isinstance(name, str) or not name or ":" in name or "." in name:
        raise ValueError(
            f"verifier name: expected a non-empty string without ':' or '.' (those mark dotted paths), got {name!r}"
        )

    def decorator(factory: Callable[..., Verifier]) -> Callable[..., Verifier]:
        if name in VERIFIERS:
            raise ValueError(f"verifier {name!r} is already registered (by {VERIFIERS[name]!r})")
        if not callable(factory):
            raise ValueError(f"verifier {name!r}: expected a class or factory, got {type(factory).__name__}")
        VERIFIERS[name] = factory
        return factory

    return decorator


def get_verifier(name: str, **kwargs: Any) -> Verifier:
    """Return the verifier registered as `name`, or import one by dotted path, built with `kwargs`.

    Raises `ValueError` for an unknown name (listing the registered ones) or a path that cannot be imported.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"verifier: expected a registered name or a dotted path 'pkg.mod:obj', got {name!r}")
    if name in VERIFIERS:
        try:
            verifier = VERIFIERS[name](**kwargs)
        except TypeError as e:  # an unknown or missing keyword argument (as `_as_verifier` does for a dotted path)
            raise ValueError(f"verifier {name!r}: cannot instantiate with {kwargs}: {e}") from e
        if not isinstance(verifier, Verifier):
            verifier = FunctionVerifier(verifier, name)
        return verifier
    if ":" not in name and "." not in name:
        raise ValueError(
            f"unknown verifier {name!r}; registered: {', '.join(sorted(VERIFIERS)) or '(none)'}; "
            "or give a dotted import path 'pkg.mod:obj'"
        )
    obj = _import_object(name)
    return _as_verifier(obj, name, kwargs)


def _import_object(path: str) -> Any:
    if ":" in path:
        module_name, _, attr_path = path.partition(":")
        if not module_name or not attr_path or ":" in attr_path:
            raise ValueError(f"verifier path {path!r}: expected 'pkg.mod:obj'")
        module = _import_module(module_name, path)
    else:
        # 'pkg.mod.obj': the longest importable prefix is the module, the rest are attributes.
        parts = path.split(".")
        if not all(parts):
            raise ValueError(f"verifier path {path!r}: expected 'pkg.mod.obj' or 'pkg.mod:obj'")
        module = None
        for cut in range(len(parts) - 1, 0, -1):
            module_name = ".".join(parts[:cut])
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as e:
                if not _is_missing(e, module_name):
                    raise ValueError(f"verifier path {path!r}: importing {module_name!r} failed: {e}") from e
                continue
            except Exception as e:
                raise ValueError(f"verifier path {path!r}: importing {module_name!r} failed: {e!r}") from e
            attr_path = ".".join(parts[cut:])
            break
        if module is None:
            raise ValueError(
                f"unknown verifier {path!r}: no module of that path can be imported; registered verifiers: "
                f"{', '.join(sorted(VERIFIERS)) or '(none)'}"
            )
    obj = module
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise ValueError(
                f"verifier path {path!r}: {obj.__name__ if obj is module else obj!r} has no attribute {attr!r}"
            ) from None
    return obj


def _is_missing(e: ModuleNotFoundError, module_name: str) -> bool:
    """True when `module_name` itself (or a parent package) is missing, not a module it imports."""
    return e.name is not None and (module_name == e.name or module_name.startswith(e.name + "."))


def _import_module(module_name: str, path: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if _is_missing(e, module_name):
            raise ValueError(f"verifier path {path!r}: no module named {module_name!r}") from e
        raise ValueError(f"verifier path {path!r}: importing {module_name!r} failed: {e}") from e
    except Exception as e:
        raise ValueError(f"verifier path {path!r}: importing {module_name!r} failed: {e!r}") from e


def _takes_two_positional(fn: Callable) -> bool:
    try:
        inspect.signature(fn).bind("completion", "reference")
    except TypeError:
        return False
    except ValueError:  # builtins without a signature: assume the verifier signature
        return True
    return True


def _as_verifier(obj: Any, path: str, kwargs: dict) -> Verifier:
    if inspect.isclass(obj):
        try:
            obj = obj(**kwargs)
        except TypeError as e:
            raise ValueError(f"verifier {path!r}: cannot instantiate with {kwargs}: {e}") from e
    elif isinstance(obj, Verifier) or (callable(obj) and not kwargs and _takes_two_positional(obj)):
        if kwargs:
            raise ValueError(f"verifier {path!r} is an instance; it takes no keyword arguments, got {sorted(kwargs)}")
    elif callable(obj):  # a factory
        try:
            obj = obj(**kwargs)
        except TypeError as e:
            raise ValueError(f"verifier factory {path!r}: cannot call with {kwargs}: {e}") from e
    else:
        raise ValueError(f"verifier {path!r}: expected a class, function or factory, got {type(obj).__name__}")
    if isinstance(obj, Verifier):
        return obj
    if not callable(obj):
        raise ValueError(f"verifier {path!r}: the factory returned a non-callable {type(obj).__name__}")
    return FunctionVerifier(obj, path)
