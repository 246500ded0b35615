"""The record types of a step's rollouts, through what is computed from them: `rollout_metrics` by hand. The
rounds.jsonl row: tests/rundir/test_rounds.py."""

from __future__ import annotations

from xrpo.rundir.rounds import round_entry


def test_rollout_metrics_by_hand():
    import dataclasses

    import numpy as np

    from xrpo.rollout.records import PlanResult
    from xrpo.rollout.step import rollout_metrics

    from ._fakes import record

    def rec(q, reward, n_tokens, seeded=False, finish="eos"):
        x = record(q, reward, "", seeded, lps=(-0.5,) * n_tokens)
        x.round, x.finish_reason = 0, finish
        return x

    # 5 prompts: q0 rewards 1, 0, 1 (mixed; its last rollout ICL-seeded); q1 0, 0 (all equal); q2 1, 1, 1, 1 (all
    # equal, solved); q3 none; q4 one rollout (trivially all equal). 10 rollouts, 1 cut at max length.
    recs = [rec(0, 1.0, 2), rec(0, 0.0, 4), rec(0, 1.0, 6, seeded=True)]
    recs += [rec(1, 0.0, 3, finish="length"), rec(1, 0.0, 1)] + [rec(2, 1.0, 2) for _ in range(4)] + [rec(4, 0.0, 5)]
    ids = list("abcde")
    rounds = [
        round_entry(0, [1, 2, 4, 0, 1], ids, [1, 0, 4, 0, 0]),
        # the planning round: 2 more rollouts for q0 only; q0 and q1 drawn from their ICL prompts, q0 succeeded
        round_entry(1, [2, 0, 0, 0, 0], ids, [1, 0, 0, 0, 0], seeded=[0, 1], truncated=2, dropped=1, nonuniform=True),
    ]
    res = PlanResult(
        records=recs,
        rewards=np.array([x.reward for x in recs]),
        group_ids=np.array([x.group_id for x in recs]),
        rounds=rounds,
    )
    rewards = [1, 0, 1, 0, 0, 1, 1, 1, 1, 0]
    assert rollout_metrics(res, 5) == {
        "rollout/count": 10.0,
        "rollout/reward_mean": 6 / 10,
        "rollout/reward_std": float(np.std(rewards)),  # the population std, sqrt(0.6 * 0.4)
        "rollout/response_length_mean": (2 + 4 + 6 + 3 + 1 + 8 + 5) / 10,
        "rollout/truncation_rate": 1 / 10,
        # q1, q2 and q4 (one rollout) are all-equal; q3 has no rollout and is not counted: 3 of 5
        "rollout/zero_variance_group_frac": 3 / 5,
        "rollout/solved_prompt_frac": 2 / 5,  # q0 and q2 have a reward >= 1
        "rollout/group_size_min": 0.0,
        "rollout/group_size_max": 4.0,
        "alloc/rounds": 1.0,
        "alloc/nonuniform_rounds": 1.0,
        "alloc/max_extra": 2.0,  # the planning round's rollouts per prompt: 2, 0, 0, 0, 0
        "alloc/zero_extra_frac": 4 / 5,
        "icl/seeded_prompts": 2.0,
        "icl/flips": 1.0,  # of the seeded q0 and q1, q0 had a success in that round
        "icl/flip_rate": 0.5,
        "icl/seeded_rollouts": 1.0,
        "icl/truncated_examples": 2.0,
        "icl/dropped_examples": 1.0,
    }
    # full_reward sets what counts as solved: with 2.0 no prompt is
    assert rollout_metrics(res, 5, full_reward=2.0)["rollout/solved_prompt_frac"] == 0.0
    # a seeded prompt without a success: a flip rate of 0 of 1; a planned row without "dropped" drops 0 examples
    no_flip = rollout_metrics(
        dataclasses.replace(res, rounds=[rounds[0], round_entry(1, [1, 0, 0, 0, 0], ids, [0] * 5, seeded=[0])]), 5
    )
    assert (no_flip["icl/flip_rate"], no_flip["icl/dropped_examples"]) == (0.0, 0.0)
    # a round 0 alone: no planned figures
    alone = rollout_metrics(dataclasses.replace(res, rounds=rounds[:1]), 5)
    assert (alone["alloc/rounds"], alone["alloc/max_extra"], alone["alloc/zero_extra_frac"]) == (0.0, 0.0, 0.0)
    assert (alone["icl/flip_rate"], alone["icl/dropped_examples"]) == (0.0, 0.0)
    # an empty plan: every mean is 0, not NaN
    empty = rollout_metrics(PlanResult(records=[], rewards=np.zeros(0), group_ids=np.zeros(0, dtype=np.int64)), 2)
    assert all(empty[k] == 0.0 for k in ("rollout/reward_mean", "rollout/reward_std", "rollout/response_length_mean"))
    assert empty["rollout/truncation_rate"] == 0.0 and empty["rollout/zero_variance_group_frac"] == 0.0
