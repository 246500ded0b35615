"""Mutation testing in CI: the fixed mutants of mutants.py still apply to the code, and the tests kill every one.

`run_mutants.py` holds the machinery and the outcome definitions; CONTRIBUTING.md has the kill rate and how to add a
mutant.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _runner():
    spec = importlib.util.spec_from_file_location("xrpo_run_mutants", HERE / "run_mutants.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_mutant_still_applies_to_the_code_and_compiles():
    rm = _runner()
    names = [m.name for m in rm.MUTANTS]
    assert len(names) == len(set(names)) and len(names) >= 25
    for m in rm.MUTANTS:
        assert m.path.startswith(
            (
                "xrpo/algo/",
                "xrpo/eval/results.py",
                "xrpo/rollout/planner.py",
                "xrpo/rollout/step.py",
                "xrpo/rollout/sources.py",
                "xrpo/rollout/cures.py",
                "xrpo/rollout/advantages.py",
                "xrpo/rollout/corpus.py",
                "xrpo/rundir/",
                "xrpo/icl/",
                "xrpo/rewards/math.py",
                "xrpo/rewards/extract.py",
                "xrpo/rewards/code.py",
                "xrpo/sandbox/",
                "xrpo/trainer/",
            )
        ), m.name
        assert m.original != m.mutated and m.tests, m.name
        compile(rm.mutated_source(m), m.path, "exec")  # raises StaleMutant when the code moved on
        for t in m.tests:
            assert (ROOT / t.split("::")[0]).is_file(), (m.name, t)


def test_a_mutant_whose_text_is_gone_stops_the_run(tmp_path):
    rm = _runner()
    stale = rm.Mutant("stale", "xrpo/algo/losses.py", "this text is not in the file", "x", ("tests",), "")
    with pytest.raises(rm.StaleMutant, match="occurs 0 times in xrpo/algo/losses.py"):
        rm.mutated_source(stale)


def test_the_tests_kill_every_mutant_by_an_assertion():
    # the slowest test of the suite (CONTRIBUTING.md gives its time): each mutant runs its tests with -x in a child
    proc = subprocess.run(
        [sys.executable, str(HERE / "run_mutants.py"), "--jobs", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "kill rate:" in proc.stdout
