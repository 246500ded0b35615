"""`xrpo simulate` through the command line's main(): the outputs, --config with flags over it, --sweep, --help
listing every option, and bad input reported in one line with exit status 2."""

from __future__ import annotations

import json
import re

import pytest

from xrpo.cli import build_parser, main
from xrpo.rundir.fields import field_docs
from xrpo.sim.runner import SimConfig

PNG = b"\x89PNG\r\n\x1a\n"


def test_simulate_writes_table_json_and_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "sim"
    rc = main(
        [
            "simulate",
            "--steps",
            "20",
            "--methods",
            "uniform,hrp,dapo,oracle",
            "--dist",
            "0.5*0 + 0.5*beta(1,3)",
            "--icl",
            "--icl-mult",
            "0.5",
            "--concurrency",
            "1,64",
            "--output",
            str(out),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    md = (out / "simulate.md").read_text()
    assert md in printed and "| hrp | " in md and "ICL p_icl = clip(0.5 p + 0, 0, 1)" in md
    res = json.loads((out / "simulate.json").read_text())
    assert list(res["methods"]) == ["uniform", "hrp", "dapo", "oracle"]
    assert res["config"]["steps"] == 20 and res["config"]["icl"] is True and res["config"]["concurrency"] == [1, 64]
    assert [r["concurrency"] for r in res["latency"]] == [1, 64]
    for name in ("simulate.png", "latency.png"):
        assert (out / name).read_bytes()[:8] == PNG


def test_config_file_and_flags_over_it(tmp_path, capsys):
    cfg = tmp_path / "sim.yaml"
    cfg.write_text("steps: 12\nmethods: [uniform, hrp]\nlam: 0.5\nprompts: 8\nrollouts: 64\n")
    out = tmp_path / "o"
    assert main(["simulate", "--config", str(cfg), "--lam", "0.2", "--output", str(out), "--no-plots"]) == 0
    res = json.loads((out / "simulate.json").read_text())
    assert (res["config"]["steps"], res["config"]["lam"], res["config"]["prompts"]) == (12, 0.2, 8)
    assert not (out / "simulate.png").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("stepz: 3\n")
    assert main(["simulate", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("xrpo simulate: error: --config:") and "unknown option 'stepz'" in err and "\n" not in err


def test_sweep_writes_its_table(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "sw"
    assert (
        main(["simulate", "--steps", "10", "--methods", "uniform,hrp", "--sweep", "n_base=2,4", "--output", str(out)])
        == 0
    )
    sw = json.loads((out / "sweep.json").read_text())
    assert sw["name"] == "n_base" and sw["values"] == [2, 4]
    assert (out / "sweep.md").read_text().count("\n") == 4
    assert (out / "sweep_n_base.png").read_bytes()[:8] == PNG


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--methods", "uniform,grpo"], "methods: unknown method 'grpo'"),
        (["--dist", "0.5*0 + 0.6*1"], "dist: weights must sum to 1"),
        (["--rounds-file", "no/such/run"], "rounds_file: no/such/run does not exist"),
        (["--rollouts", "10"], "rollouts must be >= 64 (n_base * prompts = 4 * 16)"),
        (["--sweep", "steps=1,2"], "sweep: cannot sweep 'steps'"),
    ],
)
def test_bad_input_is_one_line(argv, match, capsys):
    assert main(["simulate", "--steps", "5", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("xrpo simulate: error:") and match in err and "\n" not in err


GOOD_ROUND = {"step": 1, "round": 0, "alloc": [4, 4], "problems": ["a", "b"], "successes": [1, 2]}


@pytest.mark.parametrize(
    "row, match",
    [
        ({"seeded": 5}, r"line 1: 'seeded' must be a list of prompt indices in \[0, 2\), got 5"),
        ({"seeded": "0"}, r"line 1: 'seeded' must be a list of prompt indices in \[0, 2\), got '0'"),
        ({"round": "x"}, r"line 1: field 'round' must be an integer, got 'x'"),
        ({"alloc": [True, 4], "successes": [True, 2]}, r"line 1: prompt 0 has successes=True of alloc=True"),
        ({"problems": [["a"], "b"]}, r"line 1: 'problems'\[0\] must be a problem id \(a string\), got \['a'\]"),
    ],
)
def test_a_malformed_rounds_file_names_the_line_and_field(tmp_path, capsys, row, match):
    path = tmp_path / "rounds.jsonl"
    path.write_text(json.dumps({**GOOD_ROUND, **row}) + "\n")
    assert main(["simulate", "--steps", "3", "--rounds-file", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"xrpo simulate: error: {path} ") and "\n" not in err
    assert re.search(match, err), err


@pytest.mark.parametrize(
    "text, match",
    [
        ("methods: 5\n", r"c\.yaml: config field methods expects list\[str\], got list \[5\]"),
        ("prompts: 8.5\n", r"c\.yaml: config field prompts expects int, got float 8\.5"),
        ("t0: {a: 1}\n", r"c\.yaml: config field t0 expects float, got dict"),
        ("lam: [1\n", r"c\.yaml: not valid YAML \(.* at line 2, column 1\)"),
        (b"# caf\xe9\nlam: 1\n", r"c\.yaml line 1: not valid UTF-8"),
        ("lam: 1\nlam: 2\n", r"c\.yaml: not valid YAML \(key 'lam' is given twice"),
    ],
)
def test_a_bad_config_file_names_the_file_and_option(tmp_path, capsys, text, match):
    path = tmp_path / "c.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert main(["simulate", "--steps", "3", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("xrpo simulate: error: --config: ") and "\n" not in err
    assert re.search(match, err), err


def test_a_value_out_of_range_in_a_config_file_names_the_file(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("lam: .nan\n")
    assert main(["simulate", "--steps", "3", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "xrpo simulate: error: lam: config field lam must be a finite number >= 0, got nan "
        f"(options from --config {path} and the command line)"
    )


def test_a_directory_as_config_or_a_file_as_output_is_refused(tmp_path, capsys):
    assert main(["simulate", "--steps", "3", "--config", str(tmp_path)]) == 2
    assert f"--config: {tmp_path} is not a file; expected a YAML file" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("x")
    assert main(["simulate", "--steps", "3", "--no-plots", "--output", str(tmp_path / "notes.txt")]) == 2
    assert "notes.txt is an existing file; expected a directory" in capsys.readouterr().err


def test_help_lists_every_option_with_its_meaning():
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["simulate"]
    text = sub.format_help()
    docs = field_docs(SimConfig)
    for name in SimConfig.__dataclass_fields__:
        flag = "--" + name.replace("_", "-")
        assert flag in text, flag
        action = next(a for a in sub._actions if flag in a.option_strings)
        assert action.help.startswith(docs[name][:40].replace("%", "%%")), name
