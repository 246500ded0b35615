"""A YAML file read for a run (a trainer config and its base files, a run's config.yaml, `xrpo simulate --config`):
every error names the file (and line), and a key given twice in one mapping is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["read_yaml"]


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a key given twice in one mapping (PyYAML keeps the last silently: a second
    ``optim:`` section would drop the first one's fields)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (first on line {first})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def read_yaml(p: Path) -> Any:
    """The YAML value of file ``p``; FileNotFoundError when there is none, ValueError naming the file (and line) when
    it is not a file, not UTF-8 or not YAML."""
    if not p.is_file():
        if p.exists():
            raise ValueError(f"{p} is not a file; expected a YAML file")
        raise FileNotFoundError(f"{p} does not exist")
    try:
        return yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except UnicodeDecodeError as e:
        line = p.read_bytes().count(b"\n", 0, e.start) + 1
        raise ValueError(f"{p} line {line}: not valid UTF-8 ({e.reason}); expected a YAML text file") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"{p}: not valid YAML ({what}{where})") from None
