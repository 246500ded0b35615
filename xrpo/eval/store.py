"""The resume store of `xrpo eval`: an output directory that a second run of the same command continues.

    settings.json              every setting that changes the samples or their grading (`SAMPLE_SETTINGS`), with a
                               format version; a run in the same directory refuses other ones (version 1 is read)
    per_problem/<dataset>.jsonl one record per finished problem (`xrpo.rollout.validate`), appended and fsynced per
                               chunk; a resumed run checks each record's reference answer and prompt hash and samples
                               only the problems not there yet

Files other than the per-problem ones are written atomically (the trainer's `write_atomic`: fsynced, then renamed).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from xrpo.data import DataError, Problem
from xrpo.eval.config import default_chunk_size
from xrpo.eval.spec import slug
from xrpo.rundir.files import write_atomic

__all__ = [
    "SAMPLE_SETTINGS",
    "SETTINGS_VERSION",
    "Appender",
    "check_settings",
    "per_problem_path",
    "prompt_sha",
    "read_records",
    "save_settings",
    "saved_records",
]

SETTINGS_VERSION = 2
# settings that change the samples or their grading: a resumed run must match them (the rest may change between
# runs). engine: another sampler implementation and its numerics, as dtype; chunk_size: with seed, which seed each
# problem samples with (chunk c of a dataset draws from seed (seed, dataset, c)).
SAMPLE_SETTINGS = (
    "model",
    "checkpoint",
    "gguf_file",
    "dtype",
    "engine",
    "n",
    "greedy",
    "temperature",
    "top_p",
    "max_new_tokens",
    "stop",
    "seed",
    "chunk_size",
    "prompt_template",
    "chat_template",
    "system_prompt",
    "icl_corpus",
    "icl_corpus_sha",
    "icl_k",
    "icl_style",
    "embedder",
    "max_prompt_tokens",
    "verifier",
    "verifier_args",
)


def per_problem_path(out: Path, name: str) -> Path:
    """The per-problem file of dataset ``name`` in the output directory ``out``."""
    return out / "per_problem" / f"{slug(name)}.jsonl"


def prompt_sha(problem: Problem) -> str:
    """The problem's prompt as the dataset gives it (text, or chat messages as JSON), first 16 hex digits of a
    SHA-256. The rest of what the model reads (template, chat template, system prompt, test-time ICL) is in
    settings.json."""
    text = (
        problem.prompt
        if isinstance(problem.prompt, str)
        else json.dumps(problem.prompt, ensure_ascii=False, sort_keys=True)
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def check_settings(path: Path, settings: dict) -> None:
    """A saved evaluation must have been sampled with the same settings (`SAMPLE_SETTINGS`)."""
    if not path.exists():
        return
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); use another --output") from None
    except (OSError, ValueError) as e:  # not UTF-8, a directory, ...
        raise ValueError(
            f"{path}: unreadable ({e}); expected the JSON settings xrpo eval writes: use another --output"
        ) from None
    if not isinstance(saved, dict):
        raise ValueError(
            f"{path}: expected a JSON object of settings, got {type(saved).__name__}; use another --output"
        )
    if saved.get("version") == 1:
        saved = _settings_from_v1(saved, settings)
    diff = [
        f"{k}: saved {saved.get(k)!r}, now {settings.get(k)!r}"
        for k in ("version", *SAMPLE_SETTINGS)
        if saved.get(k) != settings.get(k)
    ]
    if diff:
        raise ValueError(
            f"{path.parent} holds an evaluation with other settings ({'; '.join(diff)}); "
            "re-run with the saved settings to resume it, or use another --output"
        )


def _settings_from_v1(saved: dict, settings: dict) -> dict:
    """Version 1 recorded the engine, chunk size and verifier arguments of the latest run without checking them (a
    chunk size of None meant the default) and no hash of the ICL corpus, which is then taken as unchanged."""
    saved = dict(saved, version=SETTINGS_VERSION, icl_corpus_sha=settings.get("icl_corpus_sha"))
    saved.setdefault("verifier_args", {})  # written before --verifier-args existed: the verifier took none
    if saved.get("chunk_size") is None and isinstance(saved.get("n"), int) and saved["n"] >= 1:
        saved["chunk_size"] = default_chunk_size(saved.get("engine", "hf"), saved["n"])
    return saved


def save_settings(out: Path, settings: dict) -> None:
    # the execution settings (batch size, run directory) may change between runs: the latest are recorded
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "settings.json", json.dumps(settings, indent=1))


def saved_records(
    out: Path, name: str, source: str, problems: list[Problem], shas: dict[str, str], n: int, log
) -> dict[int, dict]:
    """The records of dataset ``name`` already in ``out``, by index into ``problems``, each checked against the
    problem as ``source`` now gives it: the same reference answer, the same prompt (``shas``: `prompt_sha` by id) and
    ``n`` samples. Records of problems not in ``problems`` (e.g. a smaller --limit than before) stay in the file and
    are left out."""
    per_file = per_problem_path(out, name)
    saved = read_records(per_file, log)
    index = {p.id: i for i, p in enumerate(problems)}
    mine, unhashed = {}, 0
    for pid, rec in saved.items():
        if pid not in index:
            continue
        i = index[pid]
        if rec.get("reference") != problems[i].answer:
            raise ValueError(
                f"{per_file}: problem {pid!r} was graded against reference "
                f"{rec.get('reference')!r} but {source} now gives {problems[i].answer!r}; use another --output"
            )
        if "prompt_sha" not in rec:
            unhashed += 1  # written before records carried the hash: its prompt is unknown
        elif rec["prompt_sha"] != shas[pid]:
            raise ValueError(
                f"{per_file}: problem {pid!r} of dataset {name} was sampled from another prompt than the one "
                f"{source} now gives (prompt_sha saved {rec['prompt_sha']!r}, now {shas[pid]!r}: another "
                f"prompt field or file?); re-run with the saved prompt field, or use another --output"
            )
        if rec.get("n") != n:
            raise ValueError(f"{out}: problem {pid!r} of {name} holds {rec.get('n')} samples, expected n={n}")
        mine[i] = rec
    if unhashed:
        log(
            f"{per_file}: {unhashed} saved problems have no prompt_sha (written by an older xrpo): their prompts "
            f"cannot be checked against {source}"
        )
    return mine


def read_records(path: Path, log) -> dict[str, dict]:
    """Records of a per-problem file by id. A last line cut short by an interruption is dropped (and removed from the
    file, so that appends start on a clean line); any other unreadable line is an error naming it."""
    if not path.exists():
        return {}
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    records: dict[str, dict] = {}
    good_end = 0
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        if not line.strip():
            if not last:
                good_end += len(line) + 1
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or not isinstance(rec.get("id"), str):
                raise ValueError("not a record with an id")
        except ValueError as e:
            if last or all(not x.strip() for x in lines[i + 1 :]):
                log(f"{path}: dropping an incomplete last record (line {i + 1}), left by an interrupted run")
                break
            raise DataError(f"{path} line {i + 1}: not a per-problem record ({e}); the file is damaged") from None
        if rec["id"] in records:
            raise DataError(f"{path} line {i + 1}: problem {rec['id']!r} appears twice")
        records[rec["id"]] = rec
        good_end += len(line) + (0 if last else 1)
    if good_end < len(raw):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return records


class Appender:
    """Appends records to a per-problem file: one JSON line each, flushed and fsynced per chunk. ``extra`` adds fields
    to the record of a problem id (the test-time ICL examples it was shown)."""

    def __init__(self, path: Path, extra: dict[str, dict] | None = None):
        self.path, self.extra = path, extra or {}
        path.parent.mkdir(parents=True, exist_ok=True)
        # a file not ending in a newline (truncated by read_records to its last good line) gets one first
        if path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n"):
            with open(path, "ab") as f:
                f.write(b"\n")

    def __call__(self, records: list[dict]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            for r in records:
                r.update(self.extra.get(r["id"], {}))
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
