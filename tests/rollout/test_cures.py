"""CurES in training (xrpo.rollout.cures): the warm-up before step 1, which visits every training problem. A scripted
policy with a known success rate per problem is the engine; the state's own rules are tests/algo/test_visits.py's."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_array_equal

from xrpo.algo.visits import CuresState
from xrpo.data import Problem
from xrpo.rewards import get_verifier
from xrpo.rollout.cures import warmup
from xrpo.rollout.engine import SamplingParams
from xrpo.rollout.prompts import PromptRenderer

from ._fakes import CharTokenizer, char_rollout


class RatePolicy:
    """A RolloutEngine that answers problem q correctly with probability rate[q]."""

    def __init__(self, problems, rates, seed=0):
        self.index = {f"Q: {p.prompt}\nA:": i for i, p in enumerate(problems)}
        self.problems, self.rates = problems, rates
        self.rng = np.random.default_rng(seed)
        self.calls = []

    def generate(self, prompts, counts, params):
        self.calls.append((list(prompts), list(counts)))
        out = []
        for prompt, n in zip(prompts, counts):
            q = self.index[prompt]
            rs = []
            for _ in range(n):
                ans = self.problems[q].answer if self.rng.random() < self.rates[q] else "-1"
                text = f" \\boxed{{{ans}}}"
                rs.append(char_rollout(prompt, text, [-0.5] * len(text)))
            out.append(rs)
        return out

    def sync_weights(self, model):
        pass


def problems(n):
    return [Problem(id=f"p{i}", prompt=f"{i} + {i} = ?", answer=str(2 * i)) for i in range(n)]


def renderer():
    return PromptRenderer(CharTokenizer(), use_chat_template=False, prompt_template="Q: {prompt}\nA:")


@pytest.fixture(scope="module")
def verifier():
    return get_verifier("math")


def test_warmup_counts_every_problem(verifier):
    probs = problems(10)
    rates = [1.0] * 3 + [0.0] * 3 + [0.5] * 4
    engine = RatePolicy(probs, rates)
    st = CuresState.new(10)
    m = warmup(st, probs, engine, verifier, renderer(), 4, lambda call: SamplingParams(seed=call), prompts_per_call=4)
    # 10 problems x 4 rollouts, in calls of 4 + 4 + 2 problems
    assert [c[1] for c in engine.calls] == [[4] * 4, [4] * 4, [4] * 2]
    assert_array_equal(st.trials, np.full(10, 4))
    assert_array_equal(st.successes[:6], [4, 4, 4, 0, 0, 0])
    assert st.warmup_rollouts == 40 and m["cures/warmup_rollouts"] == 40.0
    # posterior after 4 of 4 / 0 of 4: p = 5/6 and 1/6
    a, b = st.posterior()
    assert a[0] / (a[0] + b[0]) == pytest.approx(5 / 6) and a[3] / (a[3] + b[3]) == pytest.approx(1 / 6)
    assert m["cures/warmup_solved_frac"] == np.mean(st.successes > 0)
