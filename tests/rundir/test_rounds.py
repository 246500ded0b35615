"""The rounds.jsonl row: what `round_entry` writes, `check_round_entry` (the readers' check) accepts, and a damaged
row is refused naming the field."""

from __future__ import annotations

import json

import pytest

from xrpo.rundir.rounds import check_round_entry, round_entry


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
