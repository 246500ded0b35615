"""xrpo.eval.store: the resume store. settings.json refuses other sample settings (and reads version 1); the
per-problem files survive an interrupted write, name a damaged line, and are checked against the problems."""

from __future__ import annotations

import json

import pytest

from xrpo.data import DataError, Problem
from xrpo.eval import store


def rec(pid, answer="1", n=2, **kw):
    return {
        "id": pid,
        "reference": answer,
        "n": n,
        "c": 1,
        "answers": ["1", None],
        "correct": [True, False],
        "scores": [1.0, 0.0],
        "lengths": [3, 4],
        "truncated": 0,
        **kw,
    }


def test_records_round_trip_and_an_interrupted_last_line(tmp_path):
    path = store.per_problem_path(tmp_path, "AIME'24")
    assert path == tmp_path / "per_problem" / "AIME_24.jsonl"
    assert store.read_records(path, print) == {}
    store.Appender(path, {"b": {"prompt_sha": "x"}})([rec("a"), rec("b")])
    assert store.read_records(path, print) == {"a": rec("a"), "b": rec("b", prompt_sha="x")}
    good = path.read_bytes()
    path.write_bytes(good + b'{"id": "c", "refer')  # a write cut short
    logs = []
    assert list(store.read_records(path, logs.append)) == ["a", "b"]
    assert logs == [f"{path}: dropping an incomplete last record (line 3), left by an interrupted run"]
    assert path.read_bytes() == good  # removed, so that the next append starts on a clean line
    store.Appender(path)([rec("c")])
    assert list(store.read_records(path, print)) == ["a", "b", "c"]


def test_a_record_cut_before_its_newline_is_kept_and_the_next_append_starts_a_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(rec("a")))  # complete, but the newline never written
    assert list(store.read_records(path, print)) == ["a"]
    store.Appender(path)([rec("b")])
    assert list(store.read_records(path, print)) == ["a", "b"]


def test_damaged_files_name_the_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(rec("a")) + "\n{oops\n" + json.dumps(rec("b")) + "\n")
    with pytest.raises(DataError, match=r"p\.jsonl line 2: not a per-problem record"):
        store.read_records(path, print)
    path.write_text(json.dumps(rec("a")) + "\n" + json.dumps(rec("a")) + "\n")
    with pytest.raises(DataError, match=r"p\.jsonl line 2: problem 'a' appears twice"):
        store.read_records(path, print)


SETTINGS = {
    "version": 2,
    "model": "/m",
    "checkpoint": None,
    "gguf_file": None,
    "dtype": "float32",
    "n": 8,
    "greedy": False,
    "temperature": 1.0,
    "top_p": 0.95,
    "max_new_tokens": 24,
    "stop": [],
    "seed": 0,
    "prompt_template": "Q: {prompt}\nA:",
    "chat_template": None,
    "system_prompt": None,
    "icl_corpus": None,
    "icl_corpus_sha": None,
    "icl_k": None,
    "icl_style": None,
    "embedder": None,
    "max_prompt_tokens": 256,
    "verifier": "math",
    "verifier_args": {},
    "engine": "vllm",
    "chunk_size": 512,
    "batch_size": 256,
    "run_dir": None,
}


def test_settings_are_checked(tmp_path):
    path = tmp_path / "settings.json"
    store.check_settings(path, SETTINGS)  # nothing saved yet
    store.save_settings(tmp_path, SETTINGS)
    assert json.loads(path.read_text()) == SETTINGS
    store.check_settings(path, dict(SETTINGS, batch_size=7, run_dir="/r"))  # execution settings may change
    with pytest.raises(
        ValueError,
        match=r"holds an evaluation with other settings \(top_p: saved 0.95, now 0.9; "
        r"seed: saved 0, now 1\); re-run with the saved settings",
    ):
        store.check_settings(path, dict(SETTINGS, top_p=0.9, seed=1))
    path.write_text("[1]")
    with pytest.raises(ValueError, match="expected a JSON object of settings, got list"):
        store.check_settings(path, SETTINGS)
    path.write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        store.check_settings(path, SETTINGS)
    path.write_bytes(b'{"n": "\xe9"}')
    with pytest.raises(ValueError, match=r"settings\.json: unreadable \('utf-8' codec .*use another --output"):
        store.check_settings(path, SETTINGS)
    path.unlink()
    path.mkdir()
    with pytest.raises(ValueError, match=r"settings\.json: unreadable \(\[Errno 21\] Is a directory"):
        store.check_settings(path, SETTINGS)


def test_settings_of_version_1(tmp_path):
    # version 1: chunk_size None meant the default (vllm: 4096 // n), no corpus hash, no verifier arguments
    v1 = {k: v for k, v in SETTINGS.items() if k not in ("icl_corpus_sha", "verifier_args")}
    v1.update(version=1, chunk_size=None)
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(v1))
    store.check_settings(path, SETTINGS)
    with pytest.raises(ValueError, match=r"chunk_size: saved 512, now 256"):
        store.check_settings(path, dict(SETTINGS, chunk_size=256))
    with pytest.raises(ValueError, match=r"verifier_args: saved \{\}, now \{'timeout': 2\}"):
        store.check_settings(path, dict(SETTINGS, verifier_args={"timeout": 2}))


def test_saved_records_are_checked_against_the_problems(tmp_path):
    problems = [Problem(id="a", prompt="1+0", answer="1"), Problem(id="b", prompt="1+1", answer="2")]
    shas = {p.id: store.prompt_sha(p) for p in problems}
    path = store.per_problem_path(tmp_path, "d")
    store.Appender(path)([rec("b", "2", prompt_sha=shas["b"]), rec("z")])
    # problem z is not asked for (a smaller --limit): kept in the file, left out
    assert store.saved_records(tmp_path, "d", "d.jsonl", problems, shas, 2, print) == {
        1: rec("b", "2", prompt_sha=shas["b"])
    }
    with pytest.raises(ValueError, match=r"problem 'b' of d holds 2 samples, expected n=4"):
        store.saved_records(tmp_path, "d", "d.jsonl", problems, shas, 4, print)
    changed = [problems[0], Problem(id="b", prompt="1+1", answer="3")]
    with pytest.raises(ValueError, match=r"problem 'b' was graded against reference '2' but d.jsonl now gives '3'"):
        store.saved_records(tmp_path, "d", "d.jsonl", changed, shas, 2, print)
    with pytest.raises(ValueError, match=r"problem 'b' of dataset d was sampled from another prompt"):
        store.saved_records(tmp_path, "d", "d.jsonl", problems, dict(shas, b="0" * 16), 2, print)
    # a record written before records carried the hash: read, with a note
    path.write_text(json.dumps(rec("a")) + "\n")
    logs = []
    assert list(store.saved_records(tmp_path, "d", "d.jsonl", problems, shas, 2, logs.append)) == [0]
    assert logs == [
        f"{path}: 1 saved problems have no prompt_sha (written by an older xrpo): their prompts cannot "
        f"be checked against d.jsonl"
    ]


def test_prompt_sha():
    import hashlib

    assert store.prompt_sha(Problem(id="a", prompt="1+1", answer="2")) == hashlib.sha256(b"1+1").hexdigest()[:16]
    chat = [{"role": "user", "content": "1+1"}]
    assert (
        store.prompt_sha(Problem(id="a", prompt=chat, answer="2"))
        == hashlib.sha256(json.dumps(chat, sort_keys=True).encode()).hexdigest()[:16]
    )
