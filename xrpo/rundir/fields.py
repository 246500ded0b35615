"""What a config dataclass's fields tell the command line and the YAML loader: each field's docstring
(`field_docs`, the single source of ``--help`` and the docs) and its declared type (`coerce` converts a value to it,
`type_name` names it in an error). Shared by `xrpo train`, `xrpo eval` and `xrpo simulate` (`xrpo.cli`)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

__all__ = ["check_field_types", "coerce", "field_docs", "strip_optional", "type_name"]


def field_docs(cls) -> dict[str, str]:
    """The docstring under each dataclass field, inherited ones included (attribute docstrings are not kept at run
    time; read the source)."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base) and base.__module__.startswith("xrpo."):
            docs.update(_own_field_docs(base))
    for f in dataclasses.fields(cls):  # a knob under another name (xrpo.algo.config.knob): its section's docstring
        if "knob" in f.metadata and f.name not in docs:
            section, name = f.metadata["knob"]
            docs[f.name] = field_docs(section)[name] + (f" (method.{name})" if name != f.name else "")
    return docs


def _own_field_docs(cls) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for a, b in zip(body, body[1:]):
        if (
            isinstance(a, ast.AnnAssign)
            and isinstance(a.target, ast.Name)
            and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant)
            and isinstance(b.value.value, str)
        ):
            docs[a.target.id] = " ".join(b.value.value.split())
    return docs


def strip_optional(ftype: Any) -> tuple[Any, bool]:
    """``(T, True)`` for ``T | None``, ``(ftype, False)`` otherwise."""
    args = typing.get_args(ftype)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True  # noqa: UP007 (built at run time)
    return ftype, False


def type_name(ftype: Any) -> str:
    """A field type as an error message names it: ``int``, ``true/false``, ``list[str] or null``."""
    base, optional = strip_optional(ftype)
    name = "true/false" if base is bool else getattr(base, "__name__", None) or str(base).replace("typing.", "")
    if typing.get_origin(base) is list:
        name = f"list[{getattr(typing.get_args(base)[0], '__name__', '?')}]" if typing.get_args(base) else "list"
    return f"{name} or null" if optional else name


def coerce(value: Any, name: str, ftype: Any) -> Any:
    """A YAML/CLI value as the field's declared type ``ftype`` (pydantic's lax conversions, except that a bool field
    takes only true/false); a string from the command line is read as YAML first, except for a str field. Raises
    ValueError naming ``name`` and the type expected."""
    base, optional = strip_optional(ftype)
    if isinstance(value, str):
        if optional and value in ("null", "None", "~"):
            return None
        if base is not str:  # strings are taken verbatim (a prompt template like "Q: {prompt}" is not YAML)
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError as e:
                raise ValueError(f"config field {name}: cannot parse {value!r}: {e}") from None
    if isinstance(value, bool) and base in (int, float):
        raise ValueError(f"config field {name} expects {type_name(ftype)}, got {value!r}")
    if typing.get_origin(base) is list and isinstance(value, (str, int, float)):
        value = [value]  # eval_k=4 means [4]
    try:
        return TypeAdapter(ftype).validate_python(value, strict=True if base is bool else None)
    except ValidationError as e:
        why = "; ".join(err["msg"] for err in e.errors())
        raise ValueError(
            f"config field {name} expects {type_name(ftype)}, got {type(value).__name__} {value!r} ({why})"
        ) from None


def _is_a(value: Any, tp: Any) -> bool:
    base, optional = strip_optional(tp)
    if value is None:
        return optional
    if typing.get_origin(base) is list:
        (item,) = typing.get_args(base) or (Any,)
        return isinstance(value, list) and all(_is_a(v, item) for v in value)
    if base is float:  # an int is a float's value too; a bool is neither
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return base is Any or isinstance(value, base)


def check_field_types(obj: Any, name_of=lambda field: field) -> None:
    """Each field of the dataclass ``obj`` holds its declared type (``int``, ``float``, ``bool``, ``str``,
    ``list[...]``, ``... | None``; an int for a float): what a Python caller may pass where the command line would
    have converted. Raises ValueError naming the field as ``name_of(field)`` and the type expected."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if not _is_a(value, hints[f.name]):
            raise ValueError(f"{name_of(f.name)} expects {type_name(hints[f.name])}, got {value!r}")
