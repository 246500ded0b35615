"""benchmarks/regime.py (the study's regime measurement, docs/results.md "The regime") on a scripted policy whose
behaviour is known, so that every arm's figures follow from the script: problems 0-7 are never solved from their
plain prompt, 8-15 always are, and from an ICL prompt the policy writes the solution of an example whose question is
the prompt's own (and fails otherwise), as a model that reads its context would."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.rollout._fakes import CharTokenizer, char_rollout, renderer
from xrpo.data import Problem
from xrpo.trainer.config_loader import build_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def regime():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import regime

    return regime


class Copier:
    """Reads its context: copies the solution of an example whose question equals the prompt's own."""

    def __init__(self, problems):
        self.by_text = {p.text: i for i, p in enumerate(problems)}
        self.problems = problems
        self.prompts: list[str] = []

    def generate(self, prompts, counts, params):
        out = []
        for prompt, n in zip(prompts, counts):
            self.prompts.append(prompt)
            head, last = prompt.rsplit("Q: ", 1)
            q = last.split("\nA:")[0]
            shown = dict(re.findall(r"Q: (.*?)\nA:(.*?)(?=\nQ: |\Z)", head, re.S))
            i = self.by_text[q]
            if head and q in shown:
                text = shown[q].rstrip("\n")
            elif not head and i >= 8:
                text = f" \\boxed{{{self.problems[i].answer}}}"
            else:
                text = " \\boxed{-1}"
            out.append([char_rollout(prompt, text, [-0.5] * len(text)) for _ in range(n)])
        return out


def test_arms_follow_the_script(regime, monkeypatch):
    from xrpo.trainer import setup

    train = [Problem(id=f"p{i}", prompt=f"{i} * 3 = ?", answer=str(3 * i)) for i in range(16)]
    heldout = [Problem(id=f"h{i}", prompt=f"{i} * 5 = ?", answer=str(5 * i)) for i in range(4)]
    engine = Copier(train + heldout)

    class Model:
        def eval(self):
            return self

    monkeypatch.setattr(setup, "load_data", lambda cfg, log=print: (train, heldout))
    monkeypatch.setattr(setup, "load_model", lambda cfg, log=print: (Model(), CharTokenizer(), None))
    monkeypatch.setattr(setup, "build_engine", lambda cfg, model, tok: engine)
    monkeypatch.setattr(setup, "make_renderer", lambda cfg, tok: renderer())
    cfg = build_config(None, ["rollout.embedder=hash"])
    m = regime.measure(cfg, prompts=16, n_base=4, extra=4, eval_samples=2, answer_in_context=True, log=lambda *a: None)
    # every group is all-wrong (0-7) or all-right (8-15); the 8 solved problems' base rollouts seed the corpus
    assert m["zero_variance_groups_at_n_base"] == 1.0 and m["mean_reward"] == 0.5
    assert m["prompts_by_successes"] == [8, 0, 0, 0, 0, 0, 0, 0, 8]
    assert m["hard_prompts"] == 8 and m["corpus_problems"] == 8 and m["hard_prompts_with_examples"] == 8
    # retrieved examples are other problems: no copy; the prompt's own question and answer: always copied
    assert m["plain"]["success_per_rollout"] == 0.0 and m["icl"]["success_per_rollout"] == 0.0
    a = m["answer_in_context"]
    assert a["success_per_rollout"] == 1.0 and a["flip_rate"] == 1.0
    assert m["answer_in_context_minus_plain_per_rollout"] == pytest.approx((1.0, 0.0))
    # the example is shaped like a verified solution (" \boxed{<answer>}") and holds this prompt's answer
    own = [p for p in engine.prompts if len(set(re.findall(r"Q: (.*?)\nA:", p))) == 1 and p.count("Q: ") == 2]
    assert len(own) == 8
    for p in own:
        q = p.rsplit("Q: ", 1)[1].split("\nA:")[0]
        i = int(q.split(" ")[0])
        assert p == f"Q: {q}\nA: \\boxed{{{3 * i}}}\nQ: {q}\nA:"
    # held-out problems (script indices 16-19) are solved from their plain prompt
    assert m["heldout_pass@1"] == 1.0 and m["heldout_problems"] == 4
