"""Each training problem's outcome counts across steps (xrpo.algo.visits): CurES's posterior updates, selection from
it, the last visit with ICL-seeded rollouts left out, Knapsack RL's window of latest rewards, and the state dict a
checkpoint stores."""

from __future__ import annotations

import json

import numpy as np
import pytest
from numpy.testing import assert_array_equal

from xrpo.algo.visits import CuresState, last_visit_state, visit_history


def test_unseen_problems_keep_the_prior_and_are_drawn_uniformly():
    st = CuresState.new(6)
    a, b = st.posterior()
    assert_array_equal(a, np.ones(6)) and assert_array_equal(b, np.ones(6))
    idx, counts, m = st.select(4, 18, np.random.default_rng(0))
    assert len(set(idx.tolist())) == 4
    # every p = 1/2, T = 100: the distribution is exactly uniform, every sigma 1/2, so 18 rollouts split evenly
    assert m["cures/entropy"] == pytest.approx(1.0, abs=1e-15) and m["cures/prob_max_rel"] == pytest.approx(1.0)
    assert_array_equal(counts, [5, 5, 4, 4])
    assert m["cures/p_mean"] == 0.5 and m["cures/seen_frac"] == 0.0


def test_observe_hand():
    st = CuresState.new(6)
    # step drew problems [5, 2]; rollouts 0-2 belong to group 0 (problem 5), 3-4 to group 1 (problem 2)
    # rewards [1, 0, 1 | 0, 0.5]: with threshold 0.5, 0.5 is not a success -> problem 5: 2 of 3, problem 2: 0 of 2
    m = st.observe([5, 2], [1.0, 0.0, 1.0, 0.0, 0.5], [0, 0, 0, 1, 1])
    assert_array_equal(st.successes, [0, 0, 0, 0, 0, 2])
    assert_array_equal(st.trials, [0, 0, 2, 0, 0, 3])
    assert m == {"cures/successes": 2.0, "cures/trials": 5.0}
    a, b = st.posterior()
    # alpha_5 = 1 + 2 = 3, beta_5 = 1 + 1 = 2; alpha_2 = 1, beta_2 = 1 + 2 = 3
    assert (a[5], b[5], a[2], b[2]) == (3.0, 2.0, 1.0, 3.0)
    # a second observation accumulates (no decay)
    st.observe([5], [1.0], [0])
    assert (st.successes[5], st.trials[5]) == (3, 4)
    with pytest.raises(ValueError, match="group_ids must index"):
        st.observe([5], [1.0, 1.0], [0, 1])
    with pytest.raises(ValueError, match="problem indices"):
        st.observe([6], [1.0], [0])


def test_observe_keep_last_replaces_a_visit_and_mask_leaves_rollouts_out():
    st = CuresState.new(4, keep="last")
    # problems [3, 1]: 3 gets [1, 0, 1] (2 of 3), 1 gets [0, 1] with its second rollout masked out (0 of 1)
    st.observe([3, 1], [1.0, 0.0, 1.0, 0.0, 1.0], [0, 0, 0, 1, 1], mask=np.array([True, True, True, True, False]))
    assert_array_equal(st.successes, [0, 0, 0, 2])
    assert_array_equal(st.trials, [0, 1, 0, 3])
    # the next visit of problem 3 replaces its counts (1 of 2); problem 1, not visited, keeps its own
    st.observe([3], [0.0, 1.0], [0, 0])
    assert_array_equal(st.successes, [0, 0, 0, 1])
    assert_array_equal(st.trials, [0, 1, 0, 2])
    # a visit whose rollouts are all masked out leaves the problem's last visit as it was
    st.observe([1], [1.0, 1.0], [0, 0], mask=np.array([False, False]))
    assert (st.successes[1], st.trials[1]) == (0, 1)
    with pytest.raises(ValueError, match="mask must be a bool array"):
        st.observe([1], [1.0], [0], mask=[1])
    with pytest.raises(ValueError, match="keep must be 'all' or 'last'"):
        CuresState.new(2, keep="first")


def test_a_window_keeps_the_latest_rewards_across_visits_beside_the_last_visit():
    # Knapsack RL's history (window 4): problem 0 visited with [1, 0, 1], then [0, 0, 1] with its middle rollout
    # masked out; problem 2 with five rollouts at once
    st = last_visit_state(3, 4)
    st.observe([0, 2], [1.0, 0.0, 1.0] + [1.0, 1.0, 0.0, 1.0, 0.0], [0, 0, 0, 1, 1, 1, 1, 1])
    st.observe([0], [0.0, 0.0, 1.0], [0, 0, 0], mask=np.array([True, False, True]))
    # the last visits (problem 0: 1 of 2 counted), and the latest outcomes across visits: problem 0's
    # 1 0 1 | 0 1 -> the latest 4: 0 1 0 1; problem 2's 1 1 0 1 0 -> 1 0 1 0; problem 1 never seen
    assert_array_equal(st.successes, [1, 0, 3]) and assert_array_equal(st.trials, [2, 0, 5])
    assert_array_equal(st.observed, [5, 0, 5])
    h, metrics = visit_history(st, [2, 1, 0])
    assert_array_equal(h.successes, [3, 0, 1]) and assert_array_equal(h.trials, [5, 0, 2])
    assert_array_equal(h.recent_successes, [2, 0, 2]) and assert_array_equal(h.recent_trials, [4, 0, 4])
    assert_array_equal(h.observed, [5, 0, 5]) and metrics == {"alloc/history_frac": 2 / 3}
    # the checkpoint's form: each window a string of 0/1, oldest first; it loads back to the same history
    d = json.loads(json.dumps(st.state_dict()))
    assert d["recent"] == ["0101", "", "1010"] and d["observed"] == [5, 0, 5] and d["window"] == 4
    back = last_visit_state(3, 4)
    back.load_state_dict(d)
    assert all(np.array_equal(a, b) for a, b in zip(visit_history(back, [2, 1, 0])[0], h))
    # without a window (xrpo-plus, the knapsack variants): the history and the checkpoint are the last visit alone
    plain = last_visit_state(3)
    plain.observe([0], [1.0, 0.0], [0, 0])
    assert set(plain.state_dict()) == {"successes", "trials", "warmup_rollouts"}
    assert visit_history(plain, [0])[0].observed is None
    # what a window cannot be loaded from, each named
    with pytest.raises(ValueError, match="keeps no latest rewards per problem"):
        last_visit_state(3, 4).load_state_dict(plain.state_dict())
    with pytest.raises(ValueError, match="latest 4 rewards, this run reads the latest 8"):
        last_visit_state(3, 8).load_state_dict(d)
    for bad in ({"recent": ["0101", "", "10"]}, {"recent": ["01x1", "", "1010"]}, {"observed": [5, 0, 1]}):
        with pytest.raises(ValueError, match="history is malformed"):
            last_visit_state(3, 4).load_state_dict({**d, **bad})
    with pytest.raises(ValueError, match="window must be an integer >= 0"):
        last_visit_state(3, -1)


def test_selection_prefers_uncertain_problems_with_a_sharp_temperature():
    # problem 0 always solved (8 of 8), 1 never (0 of 8), 2 half (4 of 8): p = [0.9, 0.1, 0.5]
    st = CuresState.new(3, temp_scale=0.05)
    st.observe([0, 1, 2], [1.0] * 8 + [0.0] * 8 + [1.0, 0.0] * 4, np.repeat([0, 1, 2], 8))
    drawn = np.zeros(3)
    for s in range(300):
        idx, counts, _ = st.select(1, 4, np.random.default_rng(s))
        drawn[idx] += 1
    # logits sqrt(p(1-p)) / (c alpha): [0.3 / (0.05 * 9), 0.3 / (0.05 * 1), 0.5 / (0.05 * 5)] = [0.667, 6, 2]
    # P ~ exp: [0.0047, 0.978, 0.018] -> the never-solved problem (lowest alpha) dominates
    assert drawn[1] > 250
    # counts follow sigma = sqrt(p(1-p)) of the drawn prompts: [0.3, 0.3, 0.5] over a budget of 22 -> 6, 6, 10
    counts = st.select(3, 22, np.random.default_rng(0))[1]
    idx = st.select(3, 22, np.random.default_rng(0))[0]
    assert_array_equal(counts[np.argsort(idx)], [6, 6, 10])


def test_state_dict_round_trip_is_json():
    st = CuresState.new(4)
    st.observe([1, 3], [1.0, 0.0, 1.0], [0, 0, 1])
    st.warmup_rollouts = 12
    d = json.loads(json.dumps(st.state_dict()))
    other = CuresState.new(4)
    other.load_state_dict(d)
    assert_array_equal(other.successes, st.successes) and assert_array_equal(other.trials, st.trials)
    assert other.warmup_rollouts == 12
    # same state, same generator: same prompts and counts
    for x, y in zip(st.select(3, 9, np.random.default_rng(5)), other.select(3, 9, np.random.default_rng(5))):
        if isinstance(x, dict):
            assert x == y
        else:
            assert_array_equal(x, y)
    with pytest.raises(ValueError, match="covers 4 problems, the training set has 5"):
        CuresState.new(5).load_state_dict(d)
    with pytest.raises(ValueError, match="successes <= trials"):
        CuresState.new(4).load_state_dict({"successes": [1, 0, 0, 0], "trials": [0, 0, 0, 0]})
    with pytest.raises(ValueError, match="malformed"):
        CuresState.new(4).load_state_dict({"trials": [0, 0, 0, 0]})


def test_select_needs_enough_problems():
    with pytest.raises(ValueError, match="only 3 problems"):
        CuresState.new(3).select(4, 16, np.random.default_rng(0))
