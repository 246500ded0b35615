"""Building a `TrainConfig`: from, in order of precedence (last wins), the dataclass defaults, the method preset
named by ``method.name`` (`xrpo.algo.presets`), a YAML file (with its ``base`` files), and ``section.field=value``
overrides from the command line; its dict form (a run's config.yaml) and back; and `xrpo train --help`'s text.

Values are converted to each field's declared type by `xrpo.rundir.fields.coerce` (pydantic's `TypeAdapter`; a
command-line string is read as YAML first, except for a str field).
"""

from __future__ import annotations

import dataclasses
import textwrap
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

from xrpo.algo.presets import get_preset, list_presets
from xrpo.rundir.fields import coerce, field_docs
from xrpo.rundir.yamlfile import read_yaml
from xrpo.trainer.config import SECTIONS, TrainConfig

__all__ = [
    "build_config",
    "config_yaml",
    "flatten",
    "from_dict",
    "help_text",
    "load_config_file",
    "load_run_config",
    "to_dict",
]


def _set(cfg: TrainConfig, key: str, value: Any) -> None:
    parts = key.split(".")
    if len(parts) == 1:
        obj, attr = cfg, parts[0]
    elif len(parts) == 2 and parts[0] in SECTIONS:
        obj, attr = getattr(cfg, parts[0]), parts[1]
    else:
        raise ValueError(
            f"unknown config key {key!r}; keys are FIELD or SECTION.FIELD with SECTION in {list(SECTIONS)}"
        )
    valid = [f.name for f in fields(obj)]
    if len(parts) == 1 and attr in SECTIONS:  # `optim:` with nothing, or `optim: 5`, instead of its fields
        raise ValueError(
            f"config section {attr!r} must be a mapping of its fields (e.g. {attr}: {{FIELD: VALUE}}), "
            f"got {type(value).__name__} {value!r}"
        )
    if attr not in valid or attr in SECTIONS:
        where = parts[0] if len(parts) == 2 else "top level"
        raise ValueError(f"unknown config key {key!r}: {where} has fields {[v for v in valid if v not in SECTIONS]}")
    setattr(obj, attr, coerce(value, key, typing.get_type_hints(type(obj))[attr]))


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """A config dict (``{section: {field: value}}``) as ``{"section.field": value}``."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and k in SECTIONS and not prefix:
            out.update(flatten(v, key + "."))
        elif v is None and k in SECTIONS and not prefix:
            continue  # `optim:` with every field commented out: an empty section
        else:
            out[key] = v
    return out


def load_config_file(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A trainer YAML file as ``section.field`` values: ``(values, own)``, ``own`` being what the file itself sets.

    A top-level ``base: <path>`` (relative to the file) names a config file loaded first, whose values the file's own
    override field by field; a base may have a base of its own. A loop, a missing base or a base that is not a path
    is refused, naming the files.
    """
    return _load_config_file(Path(path), ())


def _load_config_file(p: Path, chain: tuple[Path, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    named = f" (the base named in {chain[-1]})" if chain else ""
    real = p.resolve()
    if real in chain:
        raise ValueError(f"config file {p}: its base chain loops: {' -> '.join(str(c) for c in (*chain, real))}")
    try:
        loaded = read_yaml(p) or {}
    except FileNotFoundError as e:
        raise FileNotFoundError(f"config file {e}{named}") from None
    except ValueError as e:
        raise ValueError(f"config file {e}{named}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"config file {p}: expected a mapping at the top level, got {type(loaded).__name__}")
    base = loaded.pop("base", None)
    values: dict[str, Any] = {}
    if base is not None:
        if not isinstance(base, str) or not base.strip():
            raise ValueError(
                f"config file {p}: base must be the path of another config file (relative to {p.parent}), got {base!r}"
            )
        values.update(_load_config_file(p.parent / base, (*chain, real))[0])
    own = flatten(loaded)
    values.update(own)
    return values, own


def build_config(yaml_path: str | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Defaults < method preset < YAML file (after its ``base``, `load_config_file`) < ``key=value`` overrides.
    Validated before it is returned."""
    values: dict[str, Any] = {}
    if yaml_path:
        values.update(load_config_file(yaml_path)[0])
    for item in overrides or []:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not of the form key=value")
        k, v = item.split("=", 1)
        values[k.strip()] = v
    cfg = TrainConfig()
    name = values.pop("method.name", None)
    if isinstance(name, str):
        name = name.strip()
    if name is not None:
        cfg.method.name = name
    for knob, value in get_preset(cfg.method.name).items():
        if not hasattr(cfg.method, knob):
            raise ValueError(f"preset {cfg.method.name!r} sets unknown knob {knob!r}")
        setattr(cfg.method, knob, value)
    for k, v in values.items():
        _set(cfg, k, v)
    return cfg.validate()


def to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)


def config_yaml(cfg: TrainConfig) -> str:
    """The text of a run's config.yaml: `to_dict` in field order (`load_run_config` reads it back to ``cfg``)."""
    import yaml

    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def from_dict(d: dict) -> TrainConfig:
    """Exact inverse of `to_dict` (used to reload a run's config.yaml on resume)."""
    if not isinstance(d, dict):
        raise ValueError(f"expected a mapping of config sections and fields, got {type(d).__name__}")
    cfg = TrainConfig()
    for k, v in flatten(d).items():
        if k == "method.name":
            cfg.method.name = v
            continue
        _set(cfg, k, v)
    return cfg.validate()


def load_run_config(path: str | Path) -> TrainConfig:
    """A run's saved config.yaml (what `xrpo train` wrote, for ``--resume`` and `xrpo eval RUN`); any error names
    the file."""
    p = Path(path)
    try:
        values = read_yaml(p) or {}  # its errors name the file
    except FileNotFoundError:
        raise FileNotFoundError(f"{p} does not exist: not an xrpo run directory (its config.yaml is missing)") from None
    try:
        return from_dict(values)
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from None


def help_text() -> str:
    lines = ["Configuration (set with key=value, or in a YAML file given with --config):", ""]
    default = TrainConfig()
    for prefix, cls, obj in [("", TrainConfig, default)] + [
        (f"{s}.", c, getattr(default, s)) for s, c in SECTIONS.items()
    ]:
        docs = field_docs(cls)
        if prefix:
            lines.append(f"[{prefix[:-1]}]")
        for f in sorted(fields(cls), key=lambda f: f.name != "name"):  # method.name first, then its knobs
            if f.name in SECTIONS:
                continue
            lines.append(f"  {prefix}{f.name} = {getattr(obj, f.name)!r}")
            lines.append(textwrap.fill(docs.get(f.name, ""), 100, initial_indent="      ", subsequent_indent="      "))
        lines.append("")
    lines.append(f"Method presets (method.name=...): {', '.join(list_presets())}")
    return "\n".join(lines)
