"""`xrpo eval` and `xrpo report` through the command line's main(): a tiny model saved to disk, a small JSONL and CHAMP
by name; the outputs a person looks at; bad input reported in one line with exit status 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from xrpo.algo.passk import majority_vote, mean_pass_at_k
from xrpo.cli import main

PNG = b"\x89PNG\r\n\x1a\n"
VERIFIER = textwrap.dedent("""
    from xrpo.rewards import VerifyResult

    def verify(completion, reference):
        return VerifyResult(score=float(len(completion) % 2 == 0), answer=str(len(completion) % 2))
""")


# a verifier slow enough (0.1 s a sample) that a signal lands between two chunks of problems
SLOW_VERIFIER = VERIFIER.replace(
    "def verify(completion, reference):", "def verify(completion, reference):\n    time.sleep(0.1)"
)
SLOW_VERIFIER = "import time\n" + SLOW_VERIFIER


@pytest.fixture(scope="module")
def env(tmp_path_factory, tiny_model, tiny_tokenizer):
    root = tmp_path_factory.mktemp("cli_eval")
    tiny_model.save_pretrained(root / "model")
    tiny_tokenizer.save_pretrained(root / "model")
    rows = [{"id": f"a{i}", "question": f"What is {i} + {i}?", "answer": 2 * i} for i in range(6)]
    (root / "arith.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "cli_parity_verifier.py").write_text(VERIFIER)
    (root / "cli_slow_verifier.py").write_text(SLOW_VERIFIER)
    return root


@pytest.mark.slow
def test_eval_end_to_end(env, tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(env))
    out = tmp_path / "out"
    rc = main(
        [
            "eval",
            str(env / "model"),
            str(env / "arith.jsonl"),
            "champ",
            "--n",
            "4",
            "--k",
            "1,2",
            "4",
            "--limit",
            "5",
            "--max-new-tokens",
            "8",
            "--verifier",
            "cli_parity_verifier:verify",
            "--output",
            str(out),
            "--chunk-size",
            "3",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| Metric | arith | champ | Avg. |" in printed
    for name in ["results.json", "results.md", "settings.json", "per_problem/arith.jsonl", "per_problem/champ.jsonl"]:
        assert (out / name).is_file(), name
    for name in ["pass_at_k.png", "lengths.png"]:
        assert (out / name).read_bytes()[:8] == PNG
    res = json.loads((out / "results.json").read_text())
    assert res["ks"] == [1, 2, 4] and list(res["datasets"]) == ["arith", "champ"]
    assert res["datasets"]["champ"]["loaded_as"]["kept"] == 190
    for name in ["arith", "champ"]:
        recs = [json.loads(x) for x in (out / "per_problem" / f"{name}.jsonl").read_text().splitlines()]
        assert len(recs) == 5 and recs == res["per_problem"][name]
        m = res["datasets"][name]["metrics"]
        ns, cs = [r["n"] for r in recs], [r["c"] for r in recs]
        for k in (1, 2, 4):
            assert m[f"pass@{k}"] == pytest.approx(mean_pass_at_k(ns, cs, k), abs=1e-12)
        assert m["cons@4"] == pytest.approx(sum(majority_vote(r["answers"], r["correct"]) for r in recs) / 5)
    assert res["average"]["pass@1"] == pytest.approx(
        (res["datasets"]["arith"]["metrics"]["pass@1"] + res["datasets"]["champ"]["metrics"]["pass@1"]) / 2
    )
    md = (out / "results.md").read_text()
    assert f"| pass@1 | {100 * res['datasets']['arith']['metrics']['pass@1']:.2f} |" in md
    assert "| cons@4 |" in md and "| problems (Avg.: total) | 5 | 5 | 10 |" in md
    # integer answers of the file are strings in the records
    assert res["per_problem"]["arith"][3]["reference"] == "6"


def test_eval_malformed_row_names_file_and_row(env, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "1"}\n{"question": "q2"}\n')
    rc = main(["eval", str(env / "model"), str(bad), "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"xrpo eval: error: {bad} line 2: missing field 'answer' (the answer)" in err
    assert not (tmp_path / "o").exists()  # the data is checked before anything is written or loaded


@pytest.mark.parametrize(
    "args, message",
    [
        (["--n", "4", "--k", "8"], "every --k must be in [1, n=4], got [8]"),
        (["--greedy", "--n", "4"], "--greedy draws one sample per problem"),
        (["--temperature", "0"], "--temperature must be a finite number > 0 (use --greedy"),
        (["--prompt-template", "no placeholder"], "--prompt-template must contain {prompt}"),
        (["--verifier", "no_such_verifier"], "unknown verifier 'no_such_verifier'"),
        (["--verifier-args", "{timeoutt: 1}"], "verifier 'math': cannot instantiate with {'timeoutt': 1}"),
    ],
)
def test_eval_bad_options(env, tmp_path, capsys, args, message):
    rc = main(["eval", str(env / "model"), str(env / "arith.jsonl"), "--output", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "o").exists()  # nothing written: the same --output works once the option is fixed


def test_eval_column_map_applies_to_a_dataset_with_options(env, tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(env))
    data = tmp_path / "upper.jsonl"
    rows = [{"key": f"u{i}", "Q": f"What is {i} + 1?", "A": i + 1} for i in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    rc = main(
        [
            "eval",
            str(env / "model"),
            f"{data}:name=U,id=key",
            "--column-map",
            "prompt=Q,answer=A",
            "--n",
            "2",
            "--limit",
            "2",
            "--max-new-tokens",
            "4",
            "--verifier",
            "cli_parity_verifier:verify",
            "--output",
            str(out),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    res = json.loads((out / "results.json").read_text())
    assert res["datasets"]["U"]["loaded_as"] == {
        "format": "jsonl",
        "layout": "generic",
        "prompt": "Q",
        "answer": "A",
        "id": "key",
    }
    assert [r["id"] for r in res["per_problem"]["U"]] == ["u0", "u1"]


@pytest.mark.parametrize(
    "name, text, spec, message",
    [
        (
            "upper.jsonl",
            '{"Q": "q", "A": "1"}\n',
            ":name=U",
            "no prompt field: expected one of ['problem', 'question', 'prompt'] or verl's 'prompt' "
            "(or pass {path}:prompt=FIELD)",
        ),
        (
            "many.jsonl",
            '{"question": "q", "answers": ["1", "2"]}\n',
            ":answer=answers",
            "field 'answers' is a list of 2 answers; xrpo needs one reference string: "
            "choose one with {path}:answer=answers.0",
        ),
        (
            "rows.txt",
            '{"question": "q", "answer": "1"}\n',
            "",
            "cannot tell the format from the extension '.txt'; pass {path}:format=jsonl or {path}:format=json or",
        ),
        ("rows.txt", '{"question": "q", "answer": "1"}\n', ":format=csv", "{path}: format: unknown format 'csv'"),
        ("rows.jsonl", '{"question": "q", "answer": "1"}\n', ":layout=nope", "{path}: layout: unknown layout 'nope'"),
    ],
)
def test_eval_data_errors_use_the_command_line_syntax(env, tmp_path, capsys, name, text, spec, message):
    path = tmp_path / name
    path.write_text(text)
    rc = main(["eval", str(env / "model"), f"{path}{spec}", "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert message.format(path=path) in err, err
    assert "_key" not in err and "fmt" not in err  # the Python API's keywords


def test_eval_missing_data_and_model(env, tmp_path, capsys):
    assert main(["eval", str(env / "model"), str(tmp_path / "nope.jsonl")]) == 2
    assert "nope.jsonl does not exist" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "no_model"), str(env / "arith.jsonl"), "--output", str(tmp_path / "o")]) == 2
    assert f"model {tmp_path / 'no_model'} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_help_lists_every_option(capsys):
    from xrpo.eval.config import EvalConfig

    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = capsys.readouterr().out
    for name in EvalConfig.__dataclass_fields__:
        if name not in ("model", "data"):
            assert "--" + name.replace("_", "-") in text, name
    assert "--no-chat-template" in text


def test_report_command(capsys, tmp_path):
    assert main(["report", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_eval_stopped_by_sigterm_keeps_what_it_finished(env, tmp_path, capsys):
    """A real `xrpo eval` process sent SIGTERM (a scheduler's preemption) exits 130 naming how to continue, with the
    problems of its finished chunks on disk; the same command then samples only the others."""
    out = tmp_path / "out"
    argv = [
        "eval",
        str(env / "model"),
        str(env / "arith.jsonl"),
        "--n",
        "4",
        "--max-new-tokens",
        "8",
        "--chunk-size",
        "1",
        "--verifier",
        "cli_slow_verifier:verify",
        "--output",
        str(out),
        "--threads",
        "1",
    ]
    env_vars = dict(os.environ, PYTHONPATH=os.pathsep.join([str(env), *sys.path]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "xrpo.cli", *argv],
        env=env_vars,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    done = out / "per_problem" / "arith.jsonl"
    deadline = time.time() + 120
    try:
        while proc.poll() is None and time.time() < deadline:
            if done.exists() and done.read_text().count("\n") >= 1:
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.01)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read()
    assert rc == 130, err
    assert "interrupted; finished problems are saved: re-run the same command to continue" in err
    kept = len(done.read_text().splitlines())
    assert 1 <= kept < 6
    sys.path.insert(0, str(env))
    try:
        assert main(argv) == 0
    finally:
        sys.path.remove(str(env))
    assert f"{kept} problems already scored, {6 - kept} to go" in capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert results["sampled_problems_this_run"] == 6 - kept
