"""Tests of xrpo.algo.knapsack_rl (Knapsack RL as its authors' code implements it).

- The committed table tests/algo/knapsack_rl_cases.json: random steps (8-64 prompts, 2-16 rollouts per prompt, rates
  from Beta mixtures with exact 0s and 1s; one earlier visit of 8 rollouts each, or visits of varied sizes and
  never-seen prompts), each with the estimate and the allocation the authors' own code gave (their repository's
  commit and files are in the table's "source"). Every case is reproduced exactly; where their code fails its own
  assertion (every prompt mixed, costs short of the budget) ours equals their code with the fallback off.
- A slow twin of the rule, loops only, written from the rule's description (the module docstring), against the
  vectorised code over random cases.
- Hand-computed cases with the arithmetic in comments, and the edges.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from xrpo.algo.knapsack_rl import authors_allocation, knapsack_values_exact, recent_rate, visit_cost

TABLE = Path(__file__).with_name("knapsack_rl_cases.json")


def history_counts(visits: list[str], window: int = 16) -> tuple[int, int, int, int, int]:
    """(last successes, last trials, window successes, window trials, observed) of one prompt's visits, each a
    string of 0/1 outcomes in the order they came."""
    every = "".join(visits)
    last = visits[-1] if visits else ""
    recent = every[-window:] if every else ""
    return last.count("1"), len(last), recent.count("1"), len(recent), len(every)


def estimate(history: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    return recent_rate(*np.array([history_counts(v) for v in history]).T)


# ---------------------------------------------------------------------------------------------------------------
# the authors' code, on the committed table
# ---------------------------------------------------------------------------------------------------------------


def load_table() -> dict:
    return json.loads(TABLE.read_text())


def test_the_table_names_its_source_and_holds_the_cases_it_says():
    t = load_table()
    src = t["source"]
    assert src["repository"] == "github.com/liziniu/KnapsackRL"
    assert re_hex40(src["commit"])
    assert set(src["files"]) >= {"verl/trainer/ppo/exploration_utils.py", "verl/utils/dataset/rl_dataset.py"}
    cases = t["cases"]
    assert len(cases) == 200 and [c["id"] for c in cases] == list(range(200))
    for c in cases:
        assert 8 <= c["prompts"] <= 64 and 2 <= c["rollouts_per_prompt"] <= 16 and len(c["history"]) == c["prompts"]
    # the table covers the rule's branches: the fallback on and off, no mixed prompt, their crash
    assert sum(c["their"].get("fallback") is True for c in cases) >= 100
    assert sum(c["their"].get("fallback") is False for c in cases) >= 40
    assert sum("error" in c["their"] for c in cases) >= 5


def re_hex40(s: str) -> bool:
    return len(s) == 40 and all(ch in "0123456789abcdef" for ch in s)


def test_the_estimate_is_theirs_on_every_case():
    for c in load_table()["cases"]:
        p, valid = estimate(c["history"])
        theirs = np.array(c["their_estimate"], dtype=np.float64)  # [valid, rate, rewards seen] per prompt
        assert valid.tolist() == (theirs[:, 0] == 1).tolist(), c["id"]
        # a rate is a ratio of two small integers, in float64 on both sides: equal to the bit
        assert p[valid].tolist() == theirs[valid, 1].tolist(), c["id"]


def test_every_case_is_the_allocation_of_their_code():
    same, crashed = 0, 0
    for c in load_table()["cases"]:
        p, valid = estimate(c["history"])
        budget = c["prompts"] * c["rollouts_per_prompt"]
        got = authors_allocation(p, valid, budget).tolist()
        assert sum(got) == budget
        if "error" in c["their"]:
            # their code fails its budget assertion (every prompt mixed, the costs short of the budget): ours gives
            # the knapsack the whole budget, what their code gives with its fallback off
            assert "Budget mismatch" in c["their"]["error"]
            assert got == c["their_no_fallback"], c["id"]
            crashed += 1
        else:
            assert got == c["their"]["counts"], c["id"]
            same += 1
    assert same + crashed == 200


# ---------------------------------------------------------------------------------------------------------------
# the slow twin, written from the rule's description (xrpo.algo.knapsack_rl's docstring)
# ---------------------------------------------------------------------------------------------------------------


def twin(rate: list[float], valid: list[bool], B: int, n_min=2, n_max=128, zero_at_floor=True) -> list[int]:
    P = len(rate)
    n = B // P
    lo = min(n_min, n)
    counts = [lo if valid[i] else n for i in range(P)]
    mixed = [i for i in range(P) if valid[i] and 0 < rate[i] < 1]
    zero = [i for i in range(P) if not valid[i] or rate[i] == 0]
    left = B - sum(counts)

    def spread(idx: list[int], total: int) -> None:
        for j, i in enumerate(idx):
            counts[i] += total // len(idx) + (1 if j < total % len(idx) else 0)

    if not mixed:
        if left > 0:
            if zero:
                spread(zero, left)
            else:
                counts = [0] * P
                spread(list(range(P)), B)
        return counts
    cost = 0
    for i in mixed:
        c = float(np.float32(math.log(1 - 0.9) / math.log(max(rate[i], 1 - rate[i]))))
        cost += int(min(n_max, c))
    budget = left
    if cost < left:
        takers = zero or [i for i in range(P) if i not in mixed]
        if takers:
            spread(takers, left - cost)
            budget = cost
    cap = n_max - lo
    # exact DP over (item, rollouts used), the best first; ties keep the smaller count of the later item
    best = {0: (0.0, [])}
    for i in mixed:
        x = float(np.float32(rate[i]))
        g = [(1 - x ** (k + lo) - (1 - x) ** (k + lo)) * x * (1 - x) ** 2 for k in range(cap + 1)]
        if zero_at_floor:
            g[0] = 0.0
        nxt: dict[int, tuple[float, list[int]]] = {}
        for w in range(min(budget, cap * len(mixed)) + 1):
            for k in range(0, min(cap, w) + 1):
                if w - k in best:
                    v = best[w - k][0] + g[k]
                    if w not in nxt or v > nxt[w][0]:
                        nxt[w] = (v, best[w - k][1] + [k])
        best = nxt
    placed = min(budget, cap * len(mixed))
    for i, k in zip(mixed, best[placed][1]):
        counts[i] += k
    spread(mixed, budget - placed)
    return counts


@pytest.mark.parametrize("seed", range(6))
def test_equals_the_slow_twin_on_random_steps(seed):
    rng = np.random.default_rng(seed)
    for _ in range(25):
        P = int(rng.integers(1, 9))
        B = int(rng.integers(0, 9)) * P + int(rng.integers(0, P))
        rate = rng.choice([0.0, 1.0, 0.5, 0.25, 1 / 3, 0.75, 0.1, 15 / 16], size=P).tolist()
        valid = (rng.random(P) < 0.8).tolist()
        rate = [r if v else 0.0 for r, v in zip(rate, valid)]
        n_max = int(rng.choice([2, 3, 5, 128]))
        for zero in (True, False):
            got = authors_allocation(rate, np.array(valid), B, n_max=n_max, zero_at_floor=zero)
            assert got.tolist() == twin(rate, valid, B, n_max=n_max, zero_at_floor=zero), (P, B, rate, valid, n_max)
            assert got.sum() == B


# ---------------------------------------------------------------------------------------------------------------
# by hand
# ---------------------------------------------------------------------------------------------------------------


def test_recent_rate_hand():
    # prompt 0: visits "10110100" (8) then "1100" (4): the last visit is short of 16, so the latest 12 rewards
    #           across both (all it has): 6 / 12 = 1/2; 12 >= 8 seen: valid
    # prompt 1: a last visit of 20 rollouts with 5 successes, >= 16: that visit alone, 5 / 20 = 1/4
    # prompt 2: 6 rewards seen, 3 successes: fewer than 8, invalid (its rate 1/2 is not used)
    # prompt 3: never seen: invalid, rate 0 (their default)
    # prompt 4: "1" * 10 then "0000000000" (10 + 10): the latest 16 are six 1s and ten 0s: 6 / 16
    hist = [["10110100", "1100"], ["0" * 15 + "1" * 5], ["101010"], [], ["1" * 10, "0" * 10]]
    p, valid = estimate(hist)
    np.testing.assert_array_equal(p, [0.5, 0.25, 0.5, 0.0, 6 / 16])
    np.testing.assert_array_equal(valid, [True, True, False, False, True])
    p, valid = recent_rate([0], [0], [0], [0], [0], min_rewards=0)  # their min_buffer_length 0: unseen is valid at 0
    assert p.tolist() == [0.0] and valid.tolist() == [True]


def test_recent_rate_refuses_inconsistent_counts():
    with pytest.raises(ValueError, match="recent_trials must be min\\(observed, window=16\\); not so at index 1"):
        recent_rate([1, 1], [2, 2], [1, 1], [2, 3], [2, 2])
    with pytest.raises(ValueError, match="last_successes must not exceed last_trials"):
        recent_rate([3], [2], [1], [2], [2])
    with pytest.raises(ValueError, match="last_trials must not exceed observed"):
        recent_rate([1], [4], [1], [2], [2])
    with pytest.raises(ValueError, match="observed must have shape"):
        recent_rate([1], [2], [1], [2], [2, 2])


def test_visit_cost_hand():
    # log(0.1) / log(max(p, 1 - p)): p = 1/2: 2.3026 / 0.6931 = 3.32 -> 3; p = 1/4: 2.3026 / 0.28768 = 8.004 -> 8;
    # p = 7/8: 2.3026 / 0.13353 = 17.24 -> 17; p = 0.01: 229.1 -> the cap 128
    assert visit_cost([0.5, 0.25, 7 / 8, 0.01]).tolist() == [3, 8, 17, 128]
    assert visit_cost([0.01], n_max=20).tolist() == [20]
    with pytest.raises(ValueError, match="rates in \\(0, 1\\)"):
        visit_cost([0.0])


def test_values_hand():
    # p = 1/2, n_min = 2: v(n) = (1 - 2 / 2^n) / 8: v(2) = 1/16, v(3) = 3/32, v(4) = 7/64
    g = knapsack_values_exact([0.5], 2, 2)
    assert g.tolist() == [[0.0, 3 / 32, 7 / 64]]
    assert knapsack_values_exact([0.5], 2, 2, zero_at_floor=False).tolist() == [[1 / 16, 3 / 32, 7 / 64]]


def test_authors_allocation_hand():
    # 4 prompts, B = 32 (n = 8): prompt 0 mixed at 3/8, prompt 1 never solved, prompt 2 always solved, prompt 3
    # unseen. Floors 2, 2, 2 and n = 8 for the unseen one: 14, so R = 18. Prompt 0's cost: log(0.1) / log(5/8) =
    # 4.90 -> 4 < 18: the fallback fires, the knapsack gets 4 (all to prompt 0: 2 + 4 = 6) and the surplus 14 goes
    # evenly to the prompts at rate 0, the never-solved and the unseen one: 7 each -> 9 and 15
    got = authors_allocation([3 / 8, 0.0, 1.0, 0.0], np.array([True, True, True, False]), 32)
    assert got.tolist() == [6, 9, 2, 15]
    # no prompt at rate 0: the surplus goes to the other unmixed prompts (here the always-solved one: 2 + 14 = 16,
    # and the mixed one at 3/8 gets its cost, 6); every prompt always solved: the even split
    assert authors_allocation([3 / 8, 1.0], np.array([True, True]), 24).tolist() == [6, 18]
    assert authors_allocation([1.0, 1.0, 1.0], np.array([True] * 3), 10).tolist() == [4, 3, 3]
    # costs above what is left: no fallback, the knapsack places all of it. Two prompts at 1/2 (cost 3 each),
    # B = 8: R = 4 < 6; the DP gives 2 each (v(4) + v(4) = 14/64 > v(3) + v(5) = 3/32 + 15/128 = 27/128)
    assert authors_allocation([0.5, 0.5], np.array([True, True]), 8).tolist() == [4, 4]


def test_every_prompt_mixed_and_costs_short_gives_the_knapsack_the_whole_budget():
    # where their code fails its assertion: two prompts at 1/2 cost 3 + 3 = 6 < R = 40 - 4 = 36, and there is no
    # unmixed prompt to take the surplus; here the knapsack places all 36 (concave g: 18 each)
    got = authors_allocation([0.5, 0.5], np.array([True, True]), 40)
    assert got.tolist() == [20, 20]


def test_zero_at_floor_is_their_solvers_value():
    # prompts at 1/2 and 1/32, one extra rollout to place (B = 5, n = 2, floors 2 + 2, R = 1 <= the costs):
    # with their value 0 at the floor the first extra rollout is worth g(1) = v(3): 1/2: 3/32 = 0.09375;
    # 1/32: (1 - (1/32)^3 - (31/32)^3) (1/32)(31/32)^2 = 0.0908 * 0.02933 = 0.00266: prompt 0 takes it.
    # With the formula's value the gain is v(3) - v(2): 1/2: 3/32 - 1/16 = 0.03125; 1/32: 0.00266 - 0.00178: still 0.
    # A case where the two differ: the floor's value counts only without the quirk (brute force below)
    for zero in (True, False):
        assert authors_allocation([0.5, 1 / 32], np.array([True, True]), 5, zero_at_floor=zero).tolist() == [3, 2]
    differ = 0
    rng = np.random.default_rng(0)
    for _ in range(200):
        rate = rng.choice([0.5, 0.25, 1 / 3, 0.75, 0.1, 15 / 16, 1 / 16], size=4).tolist()
        B = int(rng.integers(8, 24))
        a = authors_allocation(rate, np.ones(4, dtype=bool), B).tolist()
        b = authors_allocation(rate, np.ones(4, dtype=bool), B, zero_at_floor=False).tolist()
        differ += a != b
        assert a == twin(rate, [True] * 4, B) and b == twin(rate, [True] * 4, B, zero_at_floor=False)
    assert differ > 0  # the flag changes allocations


def test_the_cap_binds_the_knapsack_not_the_surplus():
    # one mixed prompt at 1/2 beside a never-solved one, n_max 3: the knapsack gives the mixed prompt at most
    # 3 (one extra); its cost is 3 (min(3, 3.32)), R = 20 - 4 = 16 > 3, so the knapsack gets 3, places 1 and
    # the 2 it cannot place go evenly back to the mixed prompt (their solver's remainder rule): 2 + 1 + 2 = 5;
    # the never-solved prompt takes the surplus 13 without a cap: 15
    assert authors_allocation([0.5, 0.0], np.array([True, True]), 20, n_max=3).tolist() == [5, 15]


def test_a_budget_short_of_the_floors_lowers_them():
    # B = 3 over 2 prompts: n = 1, the floor 2 is lowered to 1 (their code fails its assertion here)
    assert authors_allocation([0.5, 0.5], np.array([True, True]), 3).sum() == 3
    assert authors_allocation([0.5], np.array([True]), 0).tolist() == [0]


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="rate must lie in \\[0, 1\\]; found 1.5 at index 1"):
        authors_allocation([0.5, 1.5], np.array([True, True]), 4)
    with pytest.raises(ValueError, match="valid must be a bool array"):
        authors_allocation([0.5], np.array([1]), 4)
    with pytest.raises(ValueError, match="budget must be an integer >= 0"):
        authors_allocation([0.5], np.array([True]), 4.0)
    with pytest.raises(ValueError, match="n_max must be >= n_min"):
        authors_allocation([0.5], np.array([True]), 4, n_max=1)
