"""DATA of `xrpo eval`: the data-spec language and the datasets it names.

A spec is ``SOURCE`` or ``SOURCE:key=value,...``: SOURCE is a path (JSONL / JSON / parquet / a datasets directory,
named layouts detected: `xrpo.data.loaders`), "champ" (`xrpo.data.benchmarks`) or "default" (the training task's
held-out split); the keys are name, prompt, answer, id, layout and format. ``--column-map`` (the same keys but name)
applies to every file; a spec's own options override it key by key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from xrpo.data import Problem
from xrpo.eval.model import RunDefaults

__all__ = ["DataSpec", "dataset_name", "describe", "load_dataset", "parse_data_spec", "slug"]

_SPEC_KEYS = {"name", "prompt", "answer", "id", "layout", "format"}
# how a data spec writes each argument of xrpo.data.load_problems_with_layout (for its error messages)
_SPEC_NAMES = {"prompt_key": "prompt", "answer_key": "answer", "id_key": "id", "layout": "layout", "fmt": "format"}


@dataclass
class DataSpec:
    source: str
    """"champ", "default" or a path."""
    name: str | None = None
    prompt_key: str | None = None
    answer_key: str | None = None
    id_key: str | None = None
    layout: str | None = None
    fmt: str | None = None


def _parse_mapping(text: str, where: str) -> dict[str, str]:
    out = {}
    for item in text.split(","):
        if "=" not in item:
            raise ValueError(f"{where}: expected key=value items separated by commas, got {item!r}")
        k, v = (s.strip() for s in item.split("=", 1))
        if k not in _SPEC_KEYS:
            raise ValueError(f"{where}: unknown key {k!r}; valid keys: {sorted(_SPEC_KEYS)}")
        if not v:
            raise ValueError(f"{where}: empty value for {k!r}")
        out[k] = v
    return out


_BUILTIN_DATA = ("champ", "default")


def parse_data_spec(spec: str, column_map: str | None = None) -> DataSpec:
    """``SOURCE`` or ``SOURCE:key=value,...`` (keys name, prompt, answer, id, layout, format). ``column_map`` (the
    same keys but name) applies to every file; the spec's own options override it key by key. The built-in datasets
    (champ, default) take name only, and no column map."""
    source, opts = spec, None
    if ":" in spec:
        head, tail = spec.rsplit(":", 1)
        if re.match(r"^\s*\w+\s*=", tail) and head:
            source, opts = head, tail
    shared = _parse_mapping(column_map, "--column-map") if column_map else {}
    if "name" in shared:
        raise ValueError(
            "--column-map: 'name' would give every dataset the same name; name one dataset with DATA:name=NAME"
        )
    own = _parse_mapping(opts, f"data spec {spec!r}") if opts else {}
    if source in _BUILTIN_DATA:
        fields = sorted(set(own) - {"name"})
        if fields:
            raise ValueError(
                f"data spec {spec!r}: {source} is a built-in dataset with fixed fields; it takes only "
                f"name=, got {', '.join(f + '=' for f in fields)}"
            )
        mapping = own  # the column map is for files
    else:
        mapping = {**shared, **own}
    return DataSpec(
        source=source,
        name=mapping.get("name"),
        prompt_key=mapping.get("prompt"),
        answer_key=mapping.get("answer"),
        id_key=mapping.get("id"),
        layout=mapping.get("layout"),
        fmt=mapping.get("format"),
    )


_GENERIC_STEMS = {"test", "train", "validation", "val", "dev", "data", "dataset", "eval", "default", "heldout"}


def dataset_name(spec: DataSpec) -> str:
    """The name of a dataset in the tables and its per-problem file: name=, else its source's stem."""
    if spec.name:
        return spec.name
    if spec.source in ("champ", "default"):
        return spec.source
    p = Path(spec.source)
    stem = p.name if p.is_dir() else p.stem
    # "aime24/test.parquet" -> "aime24-test": a bare "test" names nothing
    if stem.lower() in _GENERIC_STEMS or re.fullmatch(r"(test|train)-\d+-of-\d+", stem):
        parent = p.resolve().parent.name
        return f"{parent}-{stem}" if parent else stem
    return stem


def slug(name: str) -> str:
    """A dataset name as a file name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "dataset"


def describe(info: dict) -> str:
    if info.get("layout") in ("champ", "default task"):
        return info.get("note", info["layout"])
    return (
        f"{info.get('format')}, layout {info.get('layout')}: prompt={info.get('prompt')}, "
        f"answer={info.get('answer')}, id={info.get('id')}"
    )


def load_dataset(spec: DataSpec, run: RunDefaults, limit: int | None) -> tuple[list[Problem], dict]:
    """The problems a spec names (the first ``limit``) and how they were read (layout and fields, for the log and
    results.json)."""
    # the names win over a file of the same name (write ./champ for that)
    if spec.source == "champ":
        from xrpo.data.benchmarks import load_champ

        problems, excluded = load_champ()
        info = {
            "layout": "champ",
            "kept": len(problems),
            "excluded": len(excluded),
            "note": f"champ-dataset: {len(problems)} of {len(problems) + len(excluded)} problems have an "
            f"automatically gradeable answer (xrpo.data.benchmarks)",
        }
        return (problems[:limit] if limit else problems), info
    if spec.source == "default":
        return _default_heldout(run, limit)
    from xrpo.data import load_problems_with_layout

    src = Path(spec.source)
    if not src.exists() and re.fullmatch(r"[\w.-]+/[\w.-]+", spec.source):
        raise FileNotFoundError(
            f"data {spec.source}: no such file or directory. A hub dataset? xrpo reads local copies: save one with "
            f"datasets.load_dataset('{spec.source}', split='test').save_to_disk(DIR) (or to_parquet) and pass DIR"
        )

    def spell(arg: str, value: str | None) -> str:
        # errors name the data spec option to write, not load_problems' keyword
        name = _SPEC_NAMES.get(arg, arg)
        return name if value is None else f"{spec.source}:{name}={value}"

    return load_problems_with_layout(
        spec.source,
        fmt=spec.fmt,
        prompt_key=spec.prompt_key,
        answer_key=spec.answer_key,
        id_key=spec.id_key,
        layout=spec.layout,
        limit=limit,
        spelling=spell,
    )


def _default_heldout(run: RunDefaults, limit: int | None) -> tuple[list[Problem], dict]:
    if run.heldout:
        from xrpo.data import load_problems_with_layout

        problems, info = load_problems_with_layout(
            run.heldout, prompt_key=run.prompt_key, answer_key=run.answer_key, id_key=run.id_key
        )
        problems = problems[: run.n_heldout]
        info["note"] = f"the run's held-out file {run.heldout}"
    elif run.train == "default":
        from xrpo.data.tasks import make_default_task

        # the held-out split depends only on (n_heldout, seed, families, levels): it is drawn before, and apart
        # from, the training set
        _, problems = make_default_task(
            n_train=0, n_heldout=run.n_heldout, seed=run.seed, families=run.families, levels=run.levels
        )
        info = {
            "layout": "default task",
            "note": f"the built-in task's held-out split ({run.n_heldout} problems, seed {run.seed})",
        }
    else:
        raise ValueError("data 'default': the run trained on a file and has no data.heldout to evaluate on")
    return (problems[:limit] if limit else problems), info
