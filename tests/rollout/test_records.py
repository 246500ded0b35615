"""The rounds.jsonl row: what `round_entry` writes, `check_round_entry` (the readers' check) accepts, and a damaged
row is refused naming the field."""

from __future__ import annotations

import json

import pytest

from xrpo.rollout.records import check_round_entry, round_entry


def test_what_round_entry_writes_reads_back():
    for row in (
        round_entry(0, [4, 4], ["a", "b"], [1, 4]),
        round_entry(2, [3, 0, 5], ["a", "b", "c"], [0, 0, 5], seeded=[0, 2], truncated=1, dropped=2, nonuniform=True),
    ):
        logged = json.loads(json.dumps({"step": 7, **row}))  # as the logger writes it and a reader gets it back
        assert check_round_entry(logged, "rounds.jsonl line 1", require=("step", "round", "alloc")) is logged


GOOD = {"step": 1, "round": 1, "alloc": [4, 2], "problems": ["a", "b"], "successes": [1, 2], "seeded": [1]}


@pytest.mark.parametrize(
    "change, match",
    [
        ({"step": "1"}, r"field 'step' must be an integer, got '1'"),
        ({"round": True}, r"field 'round' must be an integer, got True"),
        (
            {"alloc": [4, -1], "successes": [1, 0]},
            r"prompt 1 has successes=0 of alloc=-1; expected integers with 0 <= ",
        ),
        ({"successes": [1, 3]}, r"prompt 1 has successes=3 of alloc=2"),
        (
            {"alloc": [4, 2.5]},
            r"prompt 1 has successes=2 of alloc=2\.5; expected integers with 0 <= successes <= alloc",
        ),
        ({"successes": [1, 1.0]}, r"prompt 1 has successes=1\.0 of alloc=2"),
        ({"problems": ["a"]}, r"'alloc' / 'problems' / 'successes' must be lists of one length .*problems 1"),
        (
            {"alloc": "4,2"},
            r"'alloc' / 'problems' / 'successes' must be lists of one length \(one entry per prompt\); "
            r"got alloc '4,2', problems 2, successes 2$",
        ),
        ({"problems": ["a", None]}, r"'problems'\[1\] must be a problem id \(a string\), got None"),
        ({"seeded": [2]}, r"'seeded' must be a list of prompt indices in \[0, 2\), got \[2\]"),
        ({"seeded": [-1]}, r"'seeded' must be a list of prompt indices in \[0, 2\), got \[-1\]"),
    ],
)
def test_a_damaged_row_is_refused_naming_the_field(change, match):
    with pytest.raises(ValueError, match=r"^rounds\.jsonl line 3: " + match):
        check_round_entry({**GOOD, **change}, "rounds.jsonl line 3")


def test_required_fields_and_the_fields_alloc_indexes():
    with pytest.raises(ValueError, match=r"^x: expected a JSON object, got list$"):
        check_round_entry([1], "x")
    with pytest.raises(ValueError, match=r"^x: missing field\(s\) \['step', 'problems'\]$"):
        check_round_entry({"round": 0, "alloc": [1]}, "x", require=("step", "problems"))
    # "problems", "successes" and "seeded" index the prompts of "alloc": without it they mean nothing
    for key, value in (("successes", [1]), ("problems", ["a"]), ("seeded", [0])):
        with pytest.raises(ValueError, match=r"^x: missing field\(s\) \['alloc'\]$"):
            check_round_entry({"step": 1, key: value}, "x")
    # a row with only counts (an older run's round 0) is fine when nothing more is required
    assert check_round_entry({"step": 1, "round": 0}, "x") == {"step": 1, "round": 0}
    # an integer problem id (older runs) is accepted
    check_round_entry({**GOOD, "problems": [3, "b"]}, "x")


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
