"""Users never see our tracker or our working sessions: code, docstrings, comments, config files, scripts and the
command line's help say what and why, never "issue #33", "#30's last note", "stop 41", "an earlier stop" or "the
second GPU session". The roots covered are COVERED (directories and top-level files); every text file under them is
read, this file excepted (its examples hold those wordings on purpose), and every `xrpo` command's --help."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# the directories and files whose text users (and contributors) read: the package, its configs and scripts, the
# README, CONTRIBUTING, the docs and the tests
COVERED = (
    "xrpo",
    "configs",
    "study",
    "benchmarks",
    "scripts",
    "examples",
    "README.md",
    "CONTRIBUTING.md",
    "docs",
    "tests",
)
TEXT = {".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt", ".json", ".cfg", ".ini", ""}
# data files: generated rows, no prose
SKIP = {".jsonl", ".parquet", ".png"}

# a reference to our tracker or to our working sessions, and not:
#   a Python noqa comment, "## 3.2 Heading", a hex colour ("#1f77b4", '"#333"'), an HTML entity ("&#39;"), a URL
#   fragment;
#   "a stop string", "every stop string", "a stop signal" (sampling and signals, not our working stops);
#   "the session keyring", "a session of its own", "a systemd session", "the test session", "a W&B session" (the
#   kernel's, the user's or a tool's session)
WORDING = re.compile(
    r"(?<![\w&#/\"'])#\d+(?!\w)"  # "#33", "(#19)", "#30's"
    r"|\b(?:issues?|PR|pull request|ticket)\s+#?\d+"  # "issue 32", "issue #33", "PR #12"
    r"|\bstops?\s+\d+\b"  # "stop 41", "at stop 42"
    r"|\b(?:an?\s+earlier|a\s+later|the\s+previous|the\s+next|the\s+last|this)\s+stop\b"  # "an earlier stop"
    r"(?!\s+(?:strings?|signals?|tokens?|sequences?|words?|reasons?)\b)"
    r"|\b(?:this|that|the|a|an|one|next|previous|earlier|later|last|first|second|third|fourth|our|those|these"
    r"|every|each|rare|same|another|other)\s+(?:(?:GPU|device|working)\s+)?sessions?\b"  # "the second GPU session"
    r"(?!\s+(?:keyrings?|leaders?|ids?|of\s+its\s+own)\b|_keyring)"
    r"|\bthe lead\b",  # who merges our work
    re.IGNORECASE,
)


def found(text: str) -> list[str]:
    """The tracker or session wordings in ``text``."""
    return [m.group(0) for m in WORDING.finditer(text)]


def covered_files() -> list[Path]:
    out = []
    for root in COVERED:
        top = ROOT / root
        for p in [top] if top.is_file() else sorted(top.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in SKIP and p.suffix in TEXT:
                out.append(p)
    return [p for p in out if p != Path(__file__).resolve()]


@pytest.mark.parametrize(
    "text, hits",
    [
        ("Issue #33, item 2: xrpo's own planner", ["Issue #33"]),
        ("beyond the paper (#33)", ["#33"]),
        ("(#30's last note counted 26)", ["#30"]),
        ("kernel memory no rlimit counts (issue 32): extended attributes", ["issue 32"]),
        ("issues 19 and 20", ["issues 19"]),
        ("see PR #12", ["PR #12"]),
        ("bugs fixed at stop 42, each with its test", ["stop 42"]),
        ("(same command, an earlier stop)", ["an earlier stop"]),
        ("second GPU session, 2026-11-26", ["second GPU session"]),
        ("the sessions that ran these studies", ["the sessions"]),
        ("what fits a session", ["a session"]),
        ("as the lead asked", ["the lead"]),
        ("measured in the second GPU\nsession", ["second GPU\nsession"]),
        # not ours
        ("x = 1  # noqa: E501 (a long URL)", []),
        ("## 3.2 Hierarchical rollout planning", []),
        ('color="#1f77b4", edgecolor="#333333"', []),
        ("an apostrophe is &#39; in HTML; https://example.org/page#3", []),
        ("a stop string ends the completion; every stop string must be non-empty; after a stop signal", []),
        ("the last stop token", []),
        ("clear the flags that stop removals; this stops the run", []),
        ("the caller's session keyring; join the session keyring; a systemd session; its own session", []),
        ("each busy process in a session of its own; the session leader; the session id", []),
        ("built once per test session; a W&B session; an HTTP session; a tmux session", []),
        ('layers = ["session", "rlimits"]; "minimal" (session, rlimits, walltime)', []),
        ("GRPO's 16 x 8 rollouts; Eq. (3); step 41 of 120", []),
    ],
)
def test_the_pattern(text, hits):
    assert found(text) == hits


def test_no_tracker_or_session_wording_in_the_covered_roots():
    files = covered_files()
    assert len(files) > 100  # the roots were read
    hits = []
    for p in files:
        text = p.read_text(encoding="utf-8", errors="replace")
        for m in WORDING.finditer(text):  # the whole text: a wording may run across a line break
            hits.append(f"{p.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}")
    assert not hits, "say what and why instead:\n" + "\n".join(hits)


def test_no_tracker_or_session_wording_in_the_cli_help():
    from xrpo.cli import build_parser

    parser = build_parser()
    texts = [parser.format_help()]
    for action in parser._subparsers._group_actions:  # the subcommands' parsers
        texts += [sub.format_help() for sub in action.choices.values()]
    assert len(texts) == 6  # the top level, train, verl, eval, report, simulate
    hits = [w for t in texts for w in found(t)]
    assert not hits, hits
