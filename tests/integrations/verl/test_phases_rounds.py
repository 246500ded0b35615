"""The verl driver's rounds.jsonl (`phases.append_rounds`): the trainer's rows, read back by `xrpo simulate
--rounds-file` (`xrpo.sim.runner.read_rounds_counts`) as a trainer run's."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("verl")

from xrpo.integrations.verl.phases import append_rounds  # noqa: E402
from xrpo.rundir.rounds import round_entry  # noqa: E402
from xrpo.sim.runner import read_rounds_counts  # noqa: E402


def test_rounds_rows_are_the_trainers_and_the_simulator_reads_them(tmp_path):
    path = tmp_path / "ckpt" / "rounds.jsonl"
    step1 = [
        round_entry(0, [2, 2], ["a", "b"], [1, 0]),
        round_entry(1, [3, 1], ["a", "b"], [0, 1], seeded=[1], truncated=1, dropped=2, nonuniform=True),
    ]
    append_rounds(str(path), 1, step1)
    append_rounds(str(path), 2, [round_entry(0, [4, 4], ["a", "c"], [4, 2])])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[1] == {
        "step": 1,
        "round": 1,
        "alloc": [3, 1],
        "seeded": [1],
        "flips": 1,  # the seeded prompt 1 had a correct rollout in that round
        "truncated": 1,
        "dropped": 2,
        "nonuniform": True,
        "problems": ["a", "b"],
        "successes": [0, 1],
    }
    wins, trials, info = read_rounds_counts(path)
    # problem ids sorted: a = 1/2 + 0/3 + 4/4, b = 0/2 (its round-1 rollout was ICL-seeded: left out), c = 2/4
    assert wins.tolist() == [5.0, 0.0, 2.0] and trials.tolist() == [9.0, 2.0, 4.0]
    assert info["steps"] == 2 and info["seeded_rollouts_excluded"] == 1
