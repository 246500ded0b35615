"""Load `Problem`s from JSONL, JSON, parquet and Hugging Face `datasets` directories (saving them: `xrpo.data.writers`).

Details and the reasons for them: docs/data.md, section "Loading problems (`xrpo.data.loaders`)".
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xrpo.data.problem import DataError, Problem

__all__ = [
    "FORMATS",
    "LAYOUTS",
    "NamedLayout",
    "load_problems",
    "load_problems_with_layout",
    "register_layout",
]

FORMATS = ("jsonl", "json", "parquet", "datasets")
_EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".pq": "parquet"}
_PROMPT_KEYS = ("problem", "question", "prompt")
_ANSWER_KEYS = ("answer", "solution", "ground_truth")
_MISSING = object()


def python_spelling(arg: str, value: str | None) -> str:
    """How an error message writes argument ``arg`` of `load_problems` (set to ``value`` when given): as Python."""
    return arg if value is None else f"{arg}={value!r}"


# ---------------------------------------------------------------------------------------------------------------
# Reading records
# ---------------------------------------------------------------------------------------------------------------


def _detect_format(path: Path, spell: Callable = python_spelling) -> str:
    if path.is_dir():
        return "datasets"
    suffix = path.suffix.lower()
    if suffix in _EXTENSIONS:
        return _EXTENSIONS[suffix]
    raise ValueError(
        f"{path}: cannot tell the format from the extension {suffix!r}; pass "
        f"{' or '.join(spell('fmt', f) for f in FORMATS)} "
        f"(known extensions: {sorted(_EXTENSIONS)}, or a datasets save_to_disk directory)"
    )


def _not_utf8(path: Path) -> DataError:
    """The error for a file that is not UTF-8 text, naming the line and column of its first bad byte."""
    raw = path.read_bytes()
    bom = 3 if raw.startswith(b"\xef\xbb\xbf") else 0
    try:
        raw[bom:].decode("utf-8")
        pos = len(raw) - 1  # not reached: the caller's decoder failed on these bytes
    except UnicodeDecodeError as e:
        pos = bom + e.start
    line = raw.count(b"\n", 0, pos) + 1
    col = pos - (raw.rfind(b"\n", 0, pos) + 1) + 1
    return DataError(
        f"{path} line {line}: not valid UTF-8 (byte 0x{raw[pos]:02x} at column {col}); "
        "expected UTF-8 text: re-save the file as UTF-8"
    )


def _iter_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    # utf-8-sig: a byte-order mark (some Windows editors write one) is skipped
    with open(path, encoding="utf-8-sig") as f:
        try:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path} line {lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
                except ValueError as e:  # e.g. an integer beyond Python's digit limit for int()
                    raise DataError(f"{path} line {lineno}: not valid JSON ({e})") from None
                yield f"line {lineno}", record
        except UnicodeDecodeError:
            raise _not_utf8(path) from None


def _iter_json(path: Path, spell: Callable = python_spelling) -> Iterator[tuple[str, Any]]:
    with open(path, encoding="utf-8-sig") as f:
        try:
            data = json.load(f)
        except UnicodeDecodeError:
            raise _not_utf8(path) from None
        except json.JSONDecodeError as e:
            hint = (
                f" (it looks like JSON Lines: use a .jsonl extension or {spell('fmt', 'jsonl')})"
                if e.msg == "Extra data"
                else ""
            )
            raise DataError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}){hint}") from None
        except ValueError as e:  # e.g. an integer beyond Python's digit limit for int()
            raise DataError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of objects at the top level, got {type(data).__name__}")
    for i, record in enumerate(data):
        yield f"row {i} (0-based)", record


def _iter_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a file that is not parquet
        raise DataError(f"{path}: not a readable parquet file ({e})") from None
    i = 0
    for batch in pf.iter_batches(batch_size=1024):
        for record in batch.to_pylist():
            yield f"row {i} (0-based)", record
            i += 1


def _iter_datasets(path: Path) -> Iterator[tuple[str, Any]]:
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if p.is_dir())
        raise DataError(
            f"{path}: is a datasets DatasetDict with splits {splits}; pass the directory of one split, "
            f"e.g. {path / (splits[0] if splits else 'train')}"
        )
    if not (path / "state.json").is_file() and not (path / "dataset_info.json").is_file():
        raise DataError(
            f"{path}: is a directory but not a datasets save_to_disk directory (no state.json or dataset_info.json)"
        )
    try:
        import datasets
    except ImportError:
        raise ImportError(
            f"loading {path} (a datasets save_to_disk directory) needs the `datasets` package: "
            "pip install 'xrpo[datasets]'"
        ) from None
    ds = datasets.load_from_disk(str(path))
    for i, record in enumerate(ds):
        yield f"row {i} (0-based)", record


_READERS = {"jsonl": _iter_jsonl, "json": _iter_json, "parquet": _iter_parquet, "datasets": _iter_datasets}


# ---------------------------------------------------------------------------------------------------------------
# Fields
# ---------------------------------------------------------------------------------------------------------------


def _lookup(record: dict, key: str) -> Any:
    """Value at `key` in `record`, walking dotted parts into dicts and integer parts into lists; else _MISSING."""
    if key in record:
        return record[key]
    cur: Any = record
    for part in key.split("."):
        if isinstance(cur, dict):
            if part not in cur:
                return _MISSING
            cur = cur[part]
        elif isinstance(cur, (list, tuple)) and part.lstrip("-").isdigit():
            idx = int(part)
            if not -len(cur) <= idx < len(cur):
                return _MISSING
            cur = cur[idx]
        else:
            return _MISSING
    return cur


def _root(key: str, record: dict) -> str:
    """The top-level field a (possibly dotted) key reads from."""
    return key if key in record else key.split(".", 1)[0]


def _answer_to_str(value: Any, where: str, key: str, spell: Callable = python_spelling) -> str:
    if isinstance(value, bool):
        raise DataError(f"{where}: field '{key}' must be a string or a number, got a boolean ({value})")
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{where}: field '{key}' is an empty string; expected a reference answer")
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise DataError(f"{where}: field '{key}' is {value}; expected a finite number or a string")
        return str(int(value)) if value.is_integer() else repr(value)
    if value is None:
        raise DataError(f"{where}: field '{key}' is null; expected a reference answer")
    # a code problem's reference is its test cases: an object, or a list of objects; the verifier gets their JSON
    if isinstance(value, dict) or (
        isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) for v in value)
    ):
        try:
            return json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise DataError(f"{where}: field '{key}' holds test cases that are not JSON-serialisable ({e})") from None
    if isinstance(value, (list, tuple)):
        if not value:
            raise DataError(f"{where}: field '{key}' is an empty list; expected a reference answer")
        if any(isinstance(v, dict) for v in value):
            raise DataError(
                f"{where}: field '{key}' mixes test-case objects with other values; expected a list of "
                "objects (test cases) or one reference answer"
            )
        raise DataError(
            f"{where}: field '{key}' is a list of {len(value)} answers; xrpo needs one reference string: "
            f"choose one with {spell('answer_key', key + '.0')} or join them in the file"
        )
    raise DataError(f"{where}: field '{key}' must be a string or a number, got {type(value).__name__}")


def _id_to_str(value: Any, where: str, key: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataError(f"{where}: field '{key}' (the id) must be a string or an integer, got {value!r}")
    if isinstance(value, str) and not value:
        raise DataError(f"{where}: field '{key}' (the id) is an empty string")
    return str(value)


def _merge_metadata(meta: dict, value: Any) -> bool:
    """Merge a `metadata` field (object or JSON-object string) into `meta`; False if it is neither."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return False
    if isinstance(value, dict):
        meta.update(value)
        return True
    return False


_GSM8K_MARK = "####"
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")


def _gsm8k_answer(value: Any, where: str, key: str) -> Any:
    """GSM8K's answer field is a worked solution ending in ``#### 42``: keep what follows the last ``####``."""
    if not isinstance(value, str):
        return value
    if _GSM8K_MARK not in value:
        raise DataError(
            f"{where}: field '{key}' has no '{_GSM8K_MARK} <final answer>' line, which every GSM8K "
            "answer ends with (pass a column mapping or another layout if the file is not GSM8K)"
        )
    final = value.rsplit(_GSM8K_MARK, 1)[1].strip()
    if not final:
        raise DataError(f"{where}: field '{key}' has nothing after its last '{_GSM8K_MARK}'")
    return final.replace(",", "") if _THOUSANDS.match(final) else final


@dataclass(frozen=True)
class NamedLayout:
    """A dataset layout known by name: the fields that recognise it and the fields each part of a Problem comes from.

    ``id_key`` None means: an ``id`` field, else ``extra_info.index``, else the record's position.
    ``answer_transform(value, where, key)`` turns the raw answer field into the reference (GSM8K keeps what follows
    ``####``); it runs only when the answer comes from ``answer_key``. ``answer_fields``: further fields the
    reference carries (a code problem's private tests, its function name): the reference is then the JSON object of
    ``answer_key`` and those of them the record has, and they stay out of the metadata. ``prompt_transform(prompt,
    record)`` completes the prompt from other fields (a code problem's starter code); both run only for the
    layout's own fields.
    """

    name: str
    requires: tuple[str, ...]
    prompt_key: str
    answer_key: str
    id_key: str | None = None
    detect: Callable[[dict], bool] | None = None
    answer_transform: Callable[[Any, str, str], Any] | None = None
    answer_fields: tuple[str, ...] = ()
    prompt_transform: Callable[[Any, dict], Any] | None = None

    def matches(self, record: dict) -> bool:
        if not all(_lookup(record, k) is not _MISSING for k in self.requires):
            return False
        return self.detect is None or self.detect(record)


LAYOUTS: dict[str, NamedLayout] = {}


def register_layout(layout: NamedLayout) -> NamedLayout:
    """Add a named layout (tried after the built-in ones, before ``generic``); a duplicate name raises."""
    if layout.name in LAYOUTS or layout.name == "generic":
        raise ValueError(f"layout {layout.name!r} is already registered")
    LAYOUTS[layout.name] = layout
    return layout


register_layout(
    NamedLayout(
        "verl",
        ("prompt", "reward_model"),
        "prompt",
        "reward_model.ground_truth",
        detect=lambda r: isinstance(r.get("reward_model"), dict),
    )
)
register_layout(NamedLayout("math500", ("problem", "answer", "unique_id"), "problem", "answer", "unique_id"))
register_layout(NamedLayout("aime2024", ("ID", "Problem", "Answer"), "Problem", "Answer", "ID"))
register_layout(NamedLayout("matharena", ("problem_idx", "problem", "answer"), "problem", "answer", "problem_idx"))
register_layout(
    NamedLayout(
        "gsm8k",
        ("question", "answer"),
        "question",
        "answer",
        detect=lambda r: "problem" not in r and isinstance(r.get("answer"), str) and _GSM8K_MARK in r["answer"],
        answer_transform=_gsm8k_answer,
    )
)


def _with_starter_code(prompt: Any, record: dict) -> Any:
    """A code problem's prompt followed by its starter code (the function or class the tests call), as LiveCodeBench's
    and APPS's own prompts show it; a problem without starter code (stdin tests) is left as it is."""
    starter = record.get("starter_code")
    if not isinstance(prompt, str) or not isinstance(starter, str) or not starter.strip():
        return prompt
    return f"{prompt}\n\nComplete this starter code:\n```python\n{starter.rstrip()}\n```"


# code datasets as their publishers ship them (the `code` verifier reads the references: docs/code.md)
register_layout(
    NamedLayout(
        # livecodebench/code_generation_lite: public tests, private tests (compressed), metadata holding func_name
        "livecodebench",
        ("question_content", "public_test_cases"),
        "question_content",
        "public_test_cases",
        "question_id",
        answer_fields=("private_test_cases", "metadata", "starter_code"),
        prompt_transform=_with_starter_code,
    )
)
register_layout(
    NamedLayout(
        # codeparrot/apps and BAAI/TACO: input_output = {inputs, outputs[, fn_name]} as a JSON string
        "apps",
        ("question", "input_output"),
        "question",
        "input_output",
        "problem_id",
        answer_fields=("starter_code",),
        prompt_transform=_with_starter_code,
    )
)


def _find_key(record: dict, candidates: tuple[str, ...]) -> str | None:
    """The first candidate present in `record`, matched exactly; failing that, ignoring case."""
    for k in candidates:
        if k in record:
            return k
    lower = {k.lower(): k for k in reversed(list(record)) if isinstance(k, str)}
    for k in candidates:
        if k in lower:
            return lower[k]
    return None


class _Layout:
    """Which fields of a record give each part of a Problem (decided from the first record)."""

    def __init__(
        self,
        first: dict,
        where: str,
        path: Path,
        prompt_key,
        answer_key,
        id_key,
        layout=None,
        spell: Callable = python_spelling,
    ) -> None:
        self.spell = spell
        if layout is not None:  # a known name or "generic": load_problems_with_layout checked it
            named = LAYOUTS.get(layout)
        else:
            named = next((lay for lay in LAYOUTS.values() if lay.matches(first)), None)
        self.name = named.name if named is not None else "generic"
        self.transform = None
        if prompt_key is None:
            prompt_key = named.prompt_key if named is not None else _find_key(first, _PROMPT_KEYS)
            if prompt_key is None:
                raise DataError(
                    f"{path} {where}: no prompt field: expected one of {list(_PROMPT_KEYS)} or verl's 'prompt' "
                    f"(or pass {spell('prompt_key', 'FIELD')}); fields present: {sorted(first)}"
                )
        if answer_key is None:
            answer_key = named.answer_key if named is not None else _find_key(first, _ANSWER_KEYS)
            if answer_key is None:
                raise DataError(
                    f"{path} {where}: no answer field: expected one of {list(_ANSWER_KEYS)} or verl's "
                    f"'reward_model.ground_truth' (or pass {spell('answer_key', 'FIELD')}); fields present: "
                    f"{sorted(first)}"
                )
        if named is not None and named.answer_transform is not None and answer_key == named.answer_key:
            self.transform = named.answer_transform
        own_answer = named is not None and answer_key == named.answer_key
        self.answer_fields = named.answer_fields if own_answer else ()
        own_prompt = named is not None and prompt_key == named.prompt_key
        self.prompt_transform = named.prompt_transform if own_prompt else None
        if id_key is None:
            if named is not None and named.id_key is not None and _lookup(first, named.id_key) is not _MISSING:
                id_key = named.id_key
            elif "id" in first:
                id_key = "id"
            elif _lookup(first, "extra_info.index") is not _MISSING:
                id_key = "extra_info.index"
        self.prompt_key, self.answer_key, self.id_key = prompt_key, answer_key, id_key

    def describe(self) -> dict:
        return {
            "layout": self.name,
            "prompt": self.prompt_key,
            "answer": self.answer_key,
            "id": self.id_key if self.id_key is not None else "<record position>",
        }


def _make_problem(record: Any, where: str, index: int, layout: _Layout, stem: str, data_source: str | None) -> Problem:
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected an object with named fields, got {type(record).__name__}")

    prompt = _lookup(record, layout.prompt_key)
    if prompt is _MISSING:
        raise DataError(f"{where}: missing field '{layout.prompt_key}' (the prompt); fields present: {sorted(record)}")
    if prompt is None:
        raise DataError(f"{where}: field '{layout.prompt_key}' (the prompt) is null")
    if not isinstance(prompt, (str, list, tuple)):
        raise DataError(
            f"{where}: field '{layout.prompt_key}' (the prompt) must be text or a list of chat messages, "
            f"got {type(prompt).__name__}"
        )

    if layout.prompt_transform is not None:
        prompt = layout.prompt_transform(prompt, record)

    raw_answer = _lookup(record, layout.answer_key)
    if raw_answer is _MISSING:
        raise DataError(f"{where}: missing field '{layout.answer_key}' (the answer); fields present: {sorted(record)}")
    if layout.transform is not None:
        raw_answer = layout.transform(raw_answer, where, layout.answer_key)
    if layout.answer_fields:
        raw_answer = {layout.answer_key: raw_answer, **{k: record[k] for k in layout.answer_fields if k in record}}
    answer = _answer_to_str(raw_answer, where, layout.answer_key, layout.spell)

    if layout.id_key is None:
        pid = f"{stem}-{index}"
    else:
        raw_id = _lookup(record, layout.id_key)
        if raw_id is _MISSING:
            raise DataError(f"{where}: missing field '{layout.id_key}' (the id); fields present: {sorted(record)}")
        pid = _id_to_str(raw_id, where, layout.id_key)

    if data_source is None:
        ds = record.get("data_source", "")
        if ds is None:
            ds = ""
        if not isinstance(ds, str):
            raise DataError(f"{where}: field 'data_source' must be a string, got {type(ds).__name__}")
    else:
        ds = data_source

    used = {_root(layout.prompt_key, record), _root(layout.answer_key, record), "data_source", *layout.answer_fields}
    if layout.id_key is not None:
        used.add(_root(layout.id_key, record))
    meta: dict = {}
    for key, value in record.items():
        # __index_level_0__: the index column pandas' to_parquet adds; not data
        if key in used or key.startswith("__index_level_") or (key == "metadata" and _merge_metadata(meta, value)):
            continue
        meta[key] = value
    if layout.name == "verl" and isinstance(record.get("extra_info"), dict):
        for key, value in record["extra_info"].items():
            if layout.id_key == "extra_info.index" and key == "index":
                continue
            if key == "metadata" and _merge_metadata(meta, value):
                continue
            meta[key] = value
        meta.pop("extra_info", None)

    try:
        return Problem(id=pid, prompt=prompt, answer=answer, data_source=ds, metadata=meta)
    except ValueError as e:
        raise DataError(f"{where}: field '{layout.prompt_key}': {e}") from None


def load_problems(
    path: str | os.PathLike,
    *,
    fmt: str | None = None,
    prompt_key: str | None = None,
    answer_key: str | None = None,
    id_key: str | None = None,
    data_source: str | None = None,
    limit: int | None = None,
    layout: str | None = None,
) -> list[Problem]:
    """Read problems from a JSONL / JSON / parquet file or a `datasets` directory (see the module docstring).

    Args:
        path: the file or directory.
        fmt: one of ``FORMATS``; detected from the extension (or a directory) when None.
        prompt_key / answer_key / id_key: field names (dotted for nested fields) overriding the detected layout.
        data_source: a value for every problem's ``data_source`` (overrides the file's field).
        limit: read only the first ``limit`` records (a positive integer); later records are not validated.
        layout: a name from `LAYOUTS` or "generic"; detected from the first record when None.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: a bad argument. DataError (a ValueError): a malformed file or record, naming the file, the record
            (``line N`` / ``row N (0-based)``) and the field; an empty file; duplicate ids.
        ImportError: a `datasets` directory without the `datasets` package.
    """
    return load_problems_with_layout(
        path,
        fmt=fmt,
        prompt_key=prompt_key,
        answer_key=answer_key,
        id_key=id_key,
        data_source=data_source,
        limit=limit,
        layout=layout,
    )[0]


def load_problems_with_layout(
    path: str | os.PathLike,
    *,
    fmt: str | None = None,
    prompt_key: str | None = None,
    answer_key: str | None = None,
    id_key: str | None = None,
    data_source: str | None = None,
    limit: int | None = None,
    layout: str | None = None,
    spelling: Callable[[str, str | None], str] | None = None,
) -> tuple[list[Problem], dict]:
    """`load_problems`, also returning how the file was read: ``{"format", "layout", "prompt", "answer", "id"}``
    (the format, the layout's name and the field each part came from).

    ``spelling(arg, value)``: how error messages write argument ``arg`` (``fmt``, ``prompt_key``, ``answer_key``,
    ``id_key``, ``layout``), set to ``value`` or (None) alone, for a caller whose users do not write Python
    (default `python_spelling`: ``answer_key='x'``)."""
    spell = spelling or python_spelling
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"load_problems: {path} does not exist")
    if fmt is None:
        fmt = _detect_format(path, spell)
    elif fmt not in FORMATS:
        raise ValueError(f"{path}: {spell('fmt', None)}: unknown format {fmt!r}; valid formats: {list(FORMATS)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit: expected a positive integer or None, got {limit!r}")
    for name, value in (("prompt_key", prompt_key), ("answer_key", answer_key), ("id_key", id_key)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"{spell(name, None)}: expected a non-empty field name or None, got {value!r}")
    if data_source is not None and not isinstance(data_source, str):
        raise ValueError(f"data_source: expected a string or None, got {type(data_source).__name__}")
    if layout is not None and layout != "generic" and layout not in LAYOUTS:
        raise ValueError(
            f"{path}: {spell('layout', None)}: unknown layout {layout!r}; valid layouts: {[*LAYOUTS, 'generic']}"
        )
    if fmt != "datasets" and path.is_dir():
        raise ValueError(f"{path}: is a directory, but {spell('fmt', fmt)} expects a file")
    if fmt == "datasets" and not path.is_dir():
        raise ValueError(f"{path}: {spell('fmt', 'datasets')} expects a save_to_disk directory, got a file")

    stem = path.name if path.is_dir() else path.stem
    problems: list[Problem] = []
    first_seen: dict[str, str] = {}
    lay: _Layout | None = None
    records = _iter_json(path, spell) if fmt == "json" else _READERS[fmt](path)
    for index, (pos, record) in enumerate(records):
        where = f"{path} {pos}"
        if lay is None:
            if not isinstance(record, dict):
                raise DataError(f"{where}: expected an object with named fields, got {type(record).__name__}")
            lay = _Layout(record, pos, path, prompt_key, answer_key, id_key, layout, spell)
        problem = _make_problem(record, where, index, lay, stem, data_source)
        if problem.id in first_seen:
            raise DataError(f"{where}: duplicate id {problem.id!r} (first seen at {first_seen[problem.id]})")
        first_seen[problem.id] = pos
        problems.append(problem)
        if limit is not None and len(problems) == limit:
            break  # before the reader parses the next record
    if not problems or lay is None:
        raise DataError(f"no problems in {path}")
    return problems, {"format": fmt, **lay.describe()}
