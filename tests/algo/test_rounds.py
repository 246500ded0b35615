"""The round planner (xrpo.algo.rounds): the allocator registry, a round's decisions by hand, the one-batch rule,
CurES's selection and DAPO's refill."""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import numpy as np
import pytest

from xrpo.algo.allocation import allocate_round, plan_phases, split_budget
from xrpo.algo.config import AllocationConfig, CuresConfig, check_knobs
from xrpo.algo.cures import beta_posterior, gradient_std, posterior_mean, rollout_counts
from xrpo.algo.knapsack import knapsack_allocation
from xrpo.algo.knapsack_rl import authors_allocation, recent_rate
from xrpo.algo.posterior_alloc import posterior_allocation
from xrpo.algo.rounds import (
    ALLOCATORS,
    Allocator,
    PromptHistory,
    allocator_names,
    batch_counts,
    cap_error,
    cures_select,
    get_allocator,
    history_window,
    is_nonuniform,
    plan_round,
    plans_rounds,
    refill_keep,
    refill_more,
    register_allocator,
    seed_candidates,
)


def test_registry_lists_valid_names_and_refuses_a_duplicate():
    assert {"hrp", "uniform", "cures"} <= set(allocator_names())
    with pytest.raises(ValueError, match="unknown allocation 'ppo'; valid allocations: hrp, uniform, cures, knapsack"):
        get_allocator("ppo")
    with pytest.raises(ValueError, match="allocator 'hrp' is already registered"):
        register_allocator("hrp")(lambda rewards, budget, knobs, history: np.zeros(len(rewards), dtype=np.int64))


def test_a_registered_allocator_is_a_valid_allocation_with_history():
    # a new rule registered by name: the config accepts it, plan_round calls it with the step's rewards and the
    # caller's history; then it is removed again so that other tests see the built-in registry
    seen = {}

    def most_trials(rewards, budget, knobs, history):
        seen["rewards"], seen["history"] = [r.tolist() for r in rewards], history
        out = np.zeros(len(rewards), dtype=np.int64)
        out[int(np.argmin(history.trials))] = budget  # everything to the least visited prompt
        return out

    register_allocator("least-visited")(most_trials)
    try:
        knobs = AllocationConfig(allocation="least-visited")
        check_knobs(knobs)  # a registered name is a valid config value
        hist = PromptHistory(successes=np.array([3, 0, 1]), trials=np.array([8, 2, 4]))
        rewards = [np.array([1.0, 0.0]), np.array([0.0, 0.0]), np.array([1.0, 1.0])]
        plan = plan_round(rewards, 6, knobs, icl=True, full_reward=1.0, history=hist)
        assert plan.alloc.tolist() == [0, 6, 0] and seen["history"] is hist
        assert seen["rewards"] == [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
        # prompt 1 gets rollouts and has no success so far: seeded; an even split of 6 over 3 is 2 each: non-uniform
        assert plan.seed.tolist() == [False, True, False] and plan.nonuniform
    finally:
        del ALLOCATORS["least-visited"]
    with pytest.raises(
        ValueError, match="allocation must be one of hrp, uniform, cures, knapsack or xrpo-plus, got .least-visited."
    ):
        check_knobs(AllocationConfig(allocation="least-visited"))


def test_plan_round_is_the_allocator_plus_the_icl_rule():
    rewards = [np.array([0.0, 0.0, 0.0]), np.array([1.0, 0.0, 0.5]), np.array([1.0, 1.0, 1.0]), np.array([0.0, 0.0])]
    hrp = AllocationConfig(allocation="hrp", alpha=0.05, lam=0.1)
    plan = plan_round(rewards, 10, hrp, icl=True, full_reward=1.0)
    np.testing.assert_array_equal(plan.alloc, allocate_round(rewards, 10, alpha=0.05, lam=0.1))
    # seeded: given rollouts and no reward >= 1 so far (prompts 0 and 3 when they get any; 1 and 2 are solved)
    assert plan.seed.tolist() == [bool(plan.alloc[0] > 0), False, False, bool(plan.alloc[3] > 0)]
    # full_reward decides "solved": with 0.5 prompt 1 counts as solved too, with 2.0 nothing does
    assert not plan_round(rewards, 10, hrp, icl=True, full_reward=0.5).seed[1]
    assert plan_round(rewards, 10, hrp, icl=True, full_reward=2.0).seed.tolist() == (plan.alloc > 0).tolist()
    assert not plan_round(rewards, 10, hrp, icl=False, full_reward=1.0).seed.any()
    uni = AllocationConfig(allocation="uniform", max_extra_per_prompt=2)
    # an even split capped at 2: 2 + 2 + 2 + 2 = 8 of 8
    got = plan_round(rewards, 8, uni, icl=False, full_reward=1.0)
    assert got.alloc.tolist() == split_budget(np.zeros(4), 8, max_per_prompt=2).tolist() == [2, 2, 2, 2]
    assert not got.nonuniform


def test_is_nonuniform_by_hand():
    # 8 over 4 divides: any spread is non-uniform; 9 over 4 does not: a spread of 1 is the even split
    assert not is_nonuniform([2, 2, 2, 2], 8) and is_nonuniform([3, 1, 2, 2], 8)
    assert not is_nonuniform([3, 2, 2, 2], 9) and is_nonuniform([4, 1, 2, 2], 9)
    # 7 over 3 does not divide: the even split differs by 1, a spread of 2 does not
    assert is_nonuniform([1, 3, 3], 7) and not is_nonuniform([2, 3, 2], 7)
    assert not is_nonuniform([], 0)


def test_seed_candidates_by_hand():
    assert seed_candidates([0, 3, 2, 1], [False, False, True, False]).tolist() == [False, True, False, True]


def test_plans_rounds_decides_one_batch_in_one_place():
    assert plans_rounds("hrp", icl=False) and plans_rounds("hrp", icl=True)
    assert not plans_rounds("uniform", icl=False)  # GRPO: nothing to plan, one batch
    assert plans_rounds("uniform", icl=True)  # the w/o-HRP ablation: rounds route unsolved prompts to ICL
    assert not plans_rounds("cures", icl=False) and not plans_rounds("cures", icl=True)  # the caller's counts
    assert not plans_rounds("knapsack", icl=False)  # Knapsack RL: the whole budget in one batch, from history
    assert plans_rounds("xrpo-plus", icl=False) and plans_rounds("xrpo-plus", icl=True)


def test_cures_select_is_the_posterior_composition_and_the_cures_allocator_its_counts():
    rng = np.random.default_rng(5)
    succ, trials = rng.integers(0, 5, size=12), np.full(12, 4)
    succ = np.minimum(succ, trials)
    pick = cures_select(succ, trials, 5, 40, np.random.default_rng(1), temp_scale=2.0, min_count=3)
    a, b = beta_posterior(succ, trials, 1.0, 1.0)
    p = posterior_mean(a, b)
    np.testing.assert_array_equal(pick.p, p)
    assert len(set(pick.idx.tolist())) == 5 and pick.counts.sum() == 40 and pick.counts.min() >= 3
    np.testing.assert_array_equal(pick.counts, rollout_counts(gradient_std(p[pick.idx]), 40, 3))
    # the registered allocator gives the same counts from the chosen prompts' history (CuresConfig's knobs)
    knobs = CuresConfig(cures_min_count=3)
    got = get_allocator("cures").fn([np.zeros(0)] * 5, 40, knobs, PromptHistory(succ[pick.idx], trials[pick.idx]))
    np.testing.assert_array_equal(got, pick.counts)
    with pytest.raises(ValueError, match="needs history"):
        get_allocator("cures").fn([np.zeros(0)] * 5, 40, knobs, None)


def test_refill_by_hand():
    rewards = np.array([1, 1, 0, 1, 0, 0, 1, 0], dtype=float)
    groups = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    # groups 1 and 3 have differing rewards; 0 (all right) and 2 (all wrong) do not
    assert refill_keep(rewards, groups, kept=0, want=4).tolist() == [1, 3]
    assert refill_keep(rewards, groups, kept=3, want=4).tolist() == [1]  # one slot left: the lowest id
    assert refill_more(3, 4, 1, 2) and not refill_more(4, 4, 1, 2) and not refill_more(3, 4, 2, 2)


# ---------------------------------------------------------------------------------------------------------------
# beyond the paper: knapsack and xrpo-plus as registered allocators
# ---------------------------------------------------------------------------------------------------------------


def test_knapsack_and_xrpo_plus_are_registered_with_their_flags():
    k, x = get_allocator("knapsack"), get_allocator("xrpo-plus")
    assert (k.adaptive, k.selects_prompts, k.uses_history) == (False, False, True)
    assert (x.adaptive, x.selects_prompts, x.uses_history) == (True, False, True)
    assert not get_allocator("hrp").uses_history and not get_allocator("uniform").uses_history
    check_knobs(AllocationConfig(allocation="knapsack"))
    check_knobs(AllocationConfig(allocation="xrpo-plus"))


def test_the_knapsack_allocator_is_the_authors_rule_on_the_reward_window():
    # prompts seen 8, 8, 8, 20 and 4 times: the last is too short for the estimate (4 < knapsack_min_rewards 8), the
    # fourth's last visit of 20 >= the window 16 is its rate alone (10 / 20)
    hist = PromptHistory(
        successes=np.array([0, 2, 8, 10, 3]),
        trials=np.array([8, 8, 8, 20, 4]),
        recent_successes=np.array([0, 2, 8, 9, 3]),
        recent_trials=np.array([8, 8, 8, 16, 4]),
        observed=np.array([8, 8, 8, 20, 4]),
    )
    knobs = AllocationConfig(allocation="knapsack")
    assert knobs.knapsack_fallback == "authors" and history_window(knobs) == 16
    rate, valid = recent_rate(*hist, window=16, min_rewards=8)
    assert rate.tolist()[:4] == [0.0, 0.25, 1.0, 0.5] and valid.tolist() == [True] * 4 + [False]
    got = batch_counts(knobs, 5, 40, hist)
    assert got.tolist() == authors_allocation(rate, valid, 40, n_min=2, n_max=128).tolist()
    # the knobs reach the rule: the window, the least rewards, the cap, the floor's value
    for change in ({"knapsack_min_rewards": 4}, {"knapsack_max_n": 3}):
        k2 = dataclasses.replace(knobs, **change)
        r2, v2 = recent_rate(*hist, window=k2.knapsack_window, min_rewards=k2.knapsack_min_rewards)
        want = authors_allocation(r2, v2, 40, n_max=k2.knapsack_max_n, zero_at_floor=k2.knapsack_zero_at_floor)
        assert batch_counts(k2, 5, 40, hist).tolist() == want.tolist() != got.tolist(), change
    # four prompts at 6, 5, 4 and 2 of 8, 12 rollouts: the costs (3, 3, 3, 8) exceed the 4 left after the floors;
    # their value 0 at the floor spreads the 4 one each; with the formula's value the prompt at 6/8 keeps its floor
    # and the one at 2/8 (the largest p(1 - p)^2) gets two
    k8 = np.array([6, 5, 4, 2])
    four = PromptHistory(k8, np.full(4, 8), k8, np.full(4, 8), np.full(4, 8))
    assert batch_counts(knobs, 4, 12, four).tolist() == [3, 3, 3, 3]
    no_zero = dataclasses.replace(knobs, knapsack_zero_at_floor=False)
    assert batch_counts(no_zero, 4, 12, four).tolist() == [2, 3, 3, 4]
    # no history: every prompt unseen, the even share each (GRPO's split)
    assert batch_counts(knobs, 5, 42, None).tolist() == [9, 9, 8, 8, 8]
    with pytest.raises(ValueError, match="latest rewards across visits"):
        batch_counts(knobs, 5, 40, PromptHistory(hist.successes, hist.trials))
    # the other allocators keep no window; the variants read from the paper's description neither
    assert history_window(dataclasses.replace(knobs, knapsack_fallback="leftover")) == 0
    assert [history_window(AllocationConfig(allocation=a)) for a in ("hrp", "uniform", "cures", "xrpo-plus")] == [0] * 4


def test_the_authors_rule_refuses_the_round_cap():
    check_knobs(AllocationConfig(allocation="knapsack", knapsack_fallback="leftover", max_extra_per_prompt=4))
    with pytest.raises(ValueError, match="max_extra_per_prompt must be null with allocation=knapsack"):
        check_knobs(AllocationConfig(allocation="knapsack", max_extra_per_prompt=4), "method.")
    for bad in ({"knapsack_fallback": "paper"}, {"knapsack_max_n": 1}, {"knapsack_window": 0}):
        with pytest.raises(ValueError, match=f"config field method.{next(iter(bad))}"):
            check_knobs(AllocationConfig(allocation="knapsack", **bad), "method.")


def test_batch_counts_is_knapsack_from_history_and_grpo_otherwise():
    hist = PromptHistory(np.array([0, 2, 4, 7, 0]), np.array([8, 8, 8, 8, 0]))
    knobs = AllocationConfig(allocation="knapsack", knapsack_fallback="leftover")
    got = batch_counts(knobs, 5, 40, hist)
    # the whole budget, n_min 2 (40 // 5 = 8 >= 2), no cap: knapsack_allocation itself
    assert got.tolist() == knapsack_allocation(hist.successes, hist.trials, 40, n_min=2).tolist()
    assert got.sum() == 40 and got.min() >= 2 and len(set(got.tolist())) > 1
    # no history: every prompt unseen at the same prior rate, so equal values: an even split
    assert batch_counts(knobs, 5, 40, None).tolist() == [8] * 5
    # a budget under 2 per prompt lowers n_min to the even share (here 1)
    assert batch_counts(knobs, 5, 7, hist).sum() == 7
    # GRPO (uniform) and the adaptive allocators' one batch: the even split, whatever the history
    for name in ("uniform", "hrp", "xrpo-plus"):
        assert batch_counts(AllocationConfig(allocation=name), 3, 10, None).tolist() == [4, 3, 3]


def test_the_xrpo_plus_allocator_is_posterior_allocation_on_the_step_and_history():
    rng = np.random.default_rng(0)
    for _ in range(50):
        P = int(rng.integers(1, 7))
        rewards = [rng.integers(0, 2, int(rng.integers(1, 5))).astype(np.float64) for _ in range(P)]
        hn = rng.integers(0, 6, P)
        hist = PromptHistory(rng.binomial(hn, 0.5), hn)
        budget = int(rng.integers(0, 20))
        cap = None if rng.random() < 0.5 else int(rng.integers(budget // P + 1, budget + 2))
        knobs = AllocationConfig(allocation="xrpo-plus", max_extra_per_prompt=cap)
        k = np.array([int((r >= 1.0).sum()) for r in rewards])
        m = np.array([len(r) for r in rewards])
        want = posterior_allocation(
            k, m, budget, history_successes=hist.successes, history_trials=hist.trials, max_per_prompt=cap
        )
        assert plan_round(rewards, budget, knobs, icl=False, full_reward=1.0, history=hist).alloc.tolist() == (
            want.tolist()
        )
        # without history: the step's rewards alone
        alone = posterior_allocation(k, m, budget, max_per_prompt=cap)
        assert get_allocator("xrpo-plus").fn(rewards, budget, knobs, None).tolist() == alone.tolist()
        # the knobs' size power reaches the planner
        power = float(rng.choice([0.0, 0.5]))
        knobs = AllocationConfig(allocation="xrpo-plus", max_extra_per_prompt=cap, group_size_power=power)
        want = posterior_allocation(k, m, budget, max_per_prompt=cap, size_power=power)
        assert get_allocator("xrpo-plus").fn(rewards, budget, knobs, None).tolist() == want.tolist()


def test_xrpo_plus_uses_the_history_and_seeds_unsolved_prompts():
    # two prompts at 0 of 2 this step: one solved 4 of 8 on its last visit, one 0 of 8. The posterior of the first
    # (Beta(1 + 4, 1 + 2 + 4)) expects a success, the second's (Beta(1, 1 + 2 + 8)) hardly: the round goes to the
    # first, and with ICL on both prompts given rollouts are seeded (no success so far)
    rewards = [np.zeros(2), np.zeros(2)]
    knobs = AllocationConfig(allocation="xrpo-plus")
    hist = PromptHistory(np.array([4, 0]), np.array([8, 8]))
    plan = plan_round(rewards, 4, knobs, icl=True, full_reward=1.0, history=hist)
    assert plan.alloc.tolist() == [4, 0] and plan.seed.tolist() == [True, False]
    swapped = plan_round(rewards, 4, knobs, icl=True, full_reward=1.0, history=PromptHistory(hist[0][::-1], hist[1]))
    assert swapped.alloc.tolist() == [0, 4]


@pytest.mark.parametrize("allocation", ["hrp", "uniform", "knapsack", "xrpo-plus"])
@pytest.mark.parametrize("icl", [False, True])
def test_cap_error_is_exactly_when_a_step_would_fail(allocation, icl):
    # cap_error is the config-time form of split_budget's / the allocators' refusal: over budgets, caps and
    # outcomes, it says "no" exactly when planning the step (as the trainer does: batch_counts, or plan_phases then
    # plan_round per round) raises for a too-small cap, and "yes" when it runs
    rng = np.random.default_rng(0)
    # (4, 25, 2): rounds of 9 and 8, the largest one binds (a cap of 2 holds 8, not 9); (3, 6, 0): no planning
    # round, any cap holds
    for P, budget, rounds in ((4, 32, 2), (6, 30, 3), (5, 22, 1), (4, 25, 2), (3, 6, 0)):
        for cap in (None, 0, 1, 2, 3, 4, 5, 6, 8):
            knobs = AllocationConfig(
                allocation=allocation,
                n_base=2,
                plan_rounds=rounds,
                max_extra_per_prompt=cap,
                knapsack_fallback="leftover",  # the knapsack variant a round cap applies to
            )
            err = cap_error(knobs, P, budget, icl=icl)
            hist = PromptHistory(rng.integers(0, 5, P), np.full(P, 4))
            try:
                if plans_rounds(allocation, icl):
                    rewards = [rng.integers(0, 2, 2).astype(float) for _ in range(P)]
                    for b in plan_phases(P, budget, 2, rounds).round_budgets:
                        x = plan_round(rewards, b, knobs, icl=icl, full_reward=1.0, history=hist).alloc
                        rewards = [np.concatenate([r, rng.integers(0, 2, n).astype(float)]) for r, n in zip(rewards, x)]
                else:
                    batch_counts(knobs, P, budget, hist)
                ran = True
            except ValueError:
                ran = False
            assert ran == (err is None), (P, budget, rounds, cap, err)
            if err is not None:
                assert f"at {cap} rollouts each" in err and f"allocation={allocation}" in err


def test_a_registry_entry_is_frozen_with_register_allocator_s_defaults():
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_allocator("hrp").adaptive = False
    reg = inspect.signature(register_allocator).parameters
    bare = Allocator("x", lambda rewards, budget, knobs, history: np.zeros(len(rewards), dtype=np.int64))
    flags = ("adaptive", "selects_prompts", "uses_history")
    assert tuple(getattr(bare, f) for f in flags) == tuple(reg[f].default for f in flags) == (True, False, False)


def test_keyword_only_arguments_stay_keyword_only():
    # a flag or knob passed by position would silently take another one's place
    for fn, names in (
        (register_allocator, ("adaptive", "selects_prompts", "uses_history")),
        (cap_error, ("icl",)),
        (plan_round, ("icl", "full_reward", "history", "allocator")),
        (cures_select, ("prior_alpha", "prior_beta", "temp_scale", "min_count")),
    ):
        params = inspect.signature(fn).parameters
        assert [params[n].kind for n in names] == [inspect.Parameter.KEYWORD_ONLY] * len(names), fn.__name__


def test_cures_defaults_are_cures_config_s():
    # cures_select's defaults and the cures allocator's fallbacks (knobs without CurES's fields) are CuresConfig's
    c = CuresConfig()
    sig = inspect.signature(cures_select).parameters
    assert [sig[n].default for n in ("prior_alpha", "prior_beta", "temp_scale", "min_count")] == [
        c.cures_prior_alpha,
        c.cures_prior_beta,
        c.cures_temp_scale,
        c.cures_min_count,
    ]
    fn = get_allocator("cures").fn
    hist = PromptHistory(np.array([0, 3, 6, 3]), np.array([1000, 5, 11, 3]))
    bare = fn([np.zeros(0)] * 4, 15, SimpleNamespace(), hist)
    # p = (k + 1) / (n + 2) = 1/1002, 4/7, 7/13, 4/5; sigma = sqrt(p (1 - p)) = 0.0316, 0.4949, 0.4985, 0.4000: prompt
    # 0's share of 15 (0.33) is below min_count, so it gets 2 and the other 13 go by sigma: 4.62, 4.65, 3.73 -> 4, 5, 4
    assert bare.tolist() == fn([np.zeros(0)] * 4, 15, c, hist).tolist() == [2, 4, 5, 4]
    # each of those knobs moves these counts, so the comparison above sees a wrong fallback
    for change in (
        {"cures_prior_alpha": 2.0},
        {"cures_prior_alpha": 1e-9},
        {"cures_prior_beta": 2.0},
        {"cures_prior_beta": 1e-9},
        {"cures_min_count": 1},
        {"cures_min_count": 3},
    ):
        assert fn([np.zeros(0)] * 4, 15, dataclasses.replace(c, **change), hist).tolist() != bare.tolist(), change


def test_batch_counts_asks_a_history_allocator_with_no_rewards_and_returns_int64():
    seen = {}

    def first_gets_all(rewards, budget, knobs, history):
        seen["sizes"] = [len(r) for r in rewards]
        return [budget] + [0] * (len(rewards) - 1)  # a list: batch_counts makes it the int64 counts

    register_allocator("first-gets-all", adaptive=False, uses_history=True)(first_gets_all)
    try:
        out = batch_counts(AllocationConfig(allocation="first-gets-all"), 3, 9)
    finally:
        del ALLOCATORS["first-gets-all"]
    assert isinstance(out, np.ndarray) and out.dtype == np.int64 and out.tolist() == [9, 0, 0]
    assert seen["sizes"] == [0, 0, 0]  # one batch: no rewards of the step yet
