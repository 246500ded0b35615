"""xrpo.rollout.advantages: Algorithm 1 line 14 on a plan's records; s(y) from the log-probs the caller passes, and
which prompt an ICL-seeded rollout is scored under (icl_novelty)."""

from __future__ import annotations

import numpy as np
import pytest

from xrpo.algo.advantages import group_advantages
from xrpo.rollout.advantages import compute_advantages
from xrpo.rollout.planner import generate_rollouts
from xrpo.rollout.records import PlanConfig

from ._fakes import SAMPLING, ScriptedPolicy, problems_and_rates, renderer
from ._fakes import record as _record
from ._fakes import result as _result


def test_sharpening_uses_given_logprobs(verifier):
    probs, pp, pi = problems_and_rates()
    cfg = PlanConfig(rollouts_per_step=64, n_base=4, plan_rounds=0, icl=False, sharpen=True)
    res = generate_rollouts(probs, ScriptedPolicy(probs, pp, pi), verifier, renderer(), cfg, SAMPLING)
    # equal log-probs everywhere -> eta = 1 for all -> no bonus
    flat = [[-0.5] * len(x.completion_ids) for x in res.records]
    adv, _ = compute_advantages(res, cfg, token_logprobs=flat)
    np.testing.assert_allclose(adv, group_advantages(res.rewards, res.group_ids))
    assert res.advantages is None  # returned, not written into the plan
    with pytest.raises(ValueError, match="rows"):
        compute_advantages(res, cfg, token_logprobs=flat[:-1])


def test_icl_novelty_chooses_the_prompt_seeded_rollouts_are_scored_under():
    from xrpo.algo.advantages import length_normalized_loglik, sharpen_advantages

    # group 0: two plain rollouts (one right) and two ICL-seeded ones, right, sampled from another prompt
    recs = [
        _record(0, 0.0, "a", lps=(-1.0, -1.0)),
        _record(0, 1.0, "b", lps=(-1.2, -1.0)),
        _record(0, 1.0, "c", seeded=True, lps=(-0.1, -0.1), gen=(5, 5, 1)),
        _record(0, 1.0, "d", seeded=True, lps=(-0.2, -0.3), gen=(5, 5, 1)),
    ]
    train_lp = [[-1.0, -1.0], [-1.2, -1.0], [-3.0, -2.5], [-2.0, -2.6]]  # under the plain prompt: unlikely
    gen_lp = [x.logprobs for x in recs]  # the engine's, under the prompt each was sampled from
    rewards, groups = np.array([0.0, 1, 1, 1]), np.zeros(4, dtype=int)
    base = group_advantages(rewards, groups)

    def expect(lps, keep=slice(None)):
        lp = np.array(lps)
        out = base.copy()
        out[keep], _ = sharpen_advantages(
            base[keep], rewards[keep], length_normalized_loglik(lp, np.ones_like(lp, dtype=bool))[keep], groups[keep]
        )
        return out

    got = {}
    for mode in ("train", "sample", "exclude"):
        res = _result(
            [_record(x.problem_index, x.reward, x.text, x.seeded, x.logprobs, x.gen_prompt_ids) for x in recs]
        )
        got[mode] = compute_advantages(res, PlanConfig(icl_novelty=mode), token_logprobs=train_lp)
    np.testing.assert_array_equal(got["train"][0], expect(train_lp))
    np.testing.assert_array_equal(got["sample"][0], expect(train_lp[:2] + gen_lp[2:]))
    np.testing.assert_array_equal(got["exclude"][0], expect(train_lp, keep=np.array([1, 1, 0, 0], bool)))
    # under the plain prompt the seeded rollouts look novel and take the bonus; scored where they were sampled, or
    # left out, they do not
    assert got["train"][1]["adv/sharpened_seeded_count"] == 2
    assert got["sample"][1]["adv/sharpened_seeded_count"] == 0
    assert got["exclude"][1]["adv/sharpened_seeded_count"] == 0
    assert got["exclude"][0][2] == got["exclude"][0][3] == base[2]
    assert all(m["adv/sharpen_eligible_seeded"] == 2 for _, m in got.values())
    with pytest.raises(ValueError, match="icl_novelty must be one of"):
        PlanConfig(icl_novelty="both")
