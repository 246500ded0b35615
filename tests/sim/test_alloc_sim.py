"""Tests of the simulator's methods beyond the paper: knapsack and its variants, xrpo-plus and its ablations,
registered in xrpo.sim.methods as calls of the library's allocators ("knapsack" through `batch_counts`, "xrpo-plus"
through `phased_step` and `plan_round`): budgets, phases, ICL seeding, the same draws as the library's functions by
hand, and xrpo-plus's gain on the study's measured rates."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_array_equal

from xrpo.algo.knapsack import knapsack_allocation
from xrpo.algo.knapsack_rl import authors_allocation, recent_rate
from xrpo.algo.posterior_alloc import fit_beta_prior, posterior_allocation
from xrpo.algo.visits import last_visit_state
from xrpo.sim.methods import StepContext
from xrpo.sim.model import StepOutcome, last_visit_draw, neighbor_rates, step_metrics
from xrpo.sim.runner import SIM_METHODS, SimConfig, simulate

NEW = [
    "knapsack",
    "knapsack-leftover",
    "knapsack-jeffreys",
    "xrpo-plus",
    "xrpo-plus-no-history",
    "xrpo-plus-batch-prior",
    "xrpo-plus-variance-prior",
    "xrpo-plus-batch-prior-no-history",
    "xrpo-plus-neighbors",
]
STUDY_FIT = "0.2159*0 + 0.0342*1 + 0.7499*beta(1.251,1.151)"  # GRPO seed 0's rates in the study (docs/results.md)


def test_every_method_spends_the_budget_exactly():
    assert set(NEW) <= set(SIM_METHODS)
    res = simulate(SimConfig(dist=STUDY_FIT, methods=["uniform", *NEW], steps=4), latency=False)
    for m in NEW:
        assert res["methods"][m]["rollouts_generated"] == {"mean": 128.0, "ci": 0.0}, m
        assert res["methods"][m]["prompts"]["mean"] == 16.0


def _step(name, p, rng, **cfg):
    """One step of the registered method ``name`` on the rates ``p``."""
    c = SimConfig(prompts=len(p), methods=[name], **cfg)
    return SIM_METHODS[name](StepContext(c, None), np.asarray(p, dtype=np.float64), rng)


def test_knapsack_is_the_authors_rule_on_the_trainers_history_of_the_last_visit():
    # the simulated visit (8 rollouts at the same rate, one by one) observed into the trainer's own history
    # (last_visit_state with Knapsack RL's window of 16), then the registered allocator's counts from it
    p = np.array([0.0, 0.2, 0.5, 0.9, 1.0, 0.35, 0.6, 0.05])
    out = _step("knapsack", p, np.random.default_rng(5), rollouts=64, n_base=2, last_visit=8)
    rng = np.random.default_rng(5)
    ok = (rng.random((8, 8)) < p[:, None]).astype(np.float64)
    state = last_visit_state(8, 16)
    state.observe(np.arange(8), ok.ravel(), np.repeat(np.arange(8), 8))
    assert state.state_dict()["recent"] == ["".join(str(int(x)) for x in row) for row in ok]
    rate, valid = recent_rate(ok.sum(1), np.full(8, 8), ok.sum(1), np.full(8, 8), np.full(8, 8))
    assert valid.all()  # 8 rewards seen, the least the authors' estimate counts
    counts = authors_allocation(rate, valid, 64)
    assert_array_equal(out.counts, counts)
    assert_array_equal(out.successes, rng.binomial(counts, p))
    # a visit of 4 is too short for their estimate: every prompt gets the even share (8), GRPO's split
    out = _step("knapsack", p, np.random.default_rng(0), rollouts=64, n_base=2, last_visit=4)
    assert_array_equal(out.counts, np.full(8, 8))


@pytest.mark.parametrize("fallback", ["leftover", "jeffreys"])
def test_knapsack_variants_are_knapsack_allocation_on_the_last_visit(fallback):
    p = np.array([0.0, 0.2, 0.5, 0.9, 1.0, 0.35])
    name = f"knapsack-{fallback}"
    out = _step(name, p, np.random.default_rng(5), rollouts=36, n_base=2, last_visit=8)
    rng = np.random.default_rng(5)
    h = last_visit_draw(p, 8, rng)
    counts = knapsack_allocation(h.successes, h.trials, 36, fallback=fallback)
    assert_array_equal(out.counts, counts)
    assert_array_equal(out.successes, rng.binomial(counts, p))  # then the batch's rewards, from the same stream
    # never seen: every prompt at the prior 1/2, equal values, the budget split evenly
    out = _step(name, p, np.random.default_rng(0), rollouts=36, n_base=2, last_visit=0)
    assert_array_equal(out.counts, np.full(6, 6))
    # the trainer's cap (max_extra_per_prompt caps knapsack's whole count): at 6 x 6 = 36 the even split is forced
    out = _step(name, p, np.random.default_rng(5), rollouts=36, n_base=2, last_visit=8, max_extra=6)
    assert_array_equal(out.counts, np.full(6, 6))


@pytest.mark.parametrize(
    "name, prior, neighbors",
    [
        ("xrpo-plus", "flat", False),
        ("xrpo-plus-batch-prior", "batch", False),
        ("xrpo-plus-variance-prior", "batch-variance", False),
        ("xrpo-plus-neighbors", "flat", True),
    ],
)
def test_xrpo_plus_runs_algorithm_1s_phases(name, prior, neighbors):
    p = np.array([0.0, 0.1, 0.3, 0.5, 0.6, 0.8, 0.95, 1.0])
    out = _step(name, p, np.random.default_rng(1), rollouts=80, n_base=4, rounds=3, last_visit=8)
    assert out.counts.sum() == 80 and np.all(out.counts >= 4) and len(out.nonuniform) == 3
    # the same draws by hand: last visit, (neighbours,) base round, the prior fitted to the base round and the last
    # visit, then each round of 16 from posterior_allocation
    rng = np.random.default_rng(1)
    h = last_visit_draw(p, 8, rng)
    hk, hn = h.successes, h.trials
    mean = neighbor_rates(p, rng) if neighbors else None
    m = np.full(8, 4)
    k = rng.binomial(m, p)
    pr = prior
    if prior != "flat":
        pr = fit_beta_prior(k + hk, m + hn, moment="variance" if prior == "batch-variance" else "flat")
    for b in (16, 16, 16):
        x = posterior_allocation(k, m, b, history_successes=hk, history_trials=hn, prior=pr, prior_mean=mean)
        k, m = k + rng.binomial(x, p), m + x
    assert_array_equal(out.counts, m)
    assert_array_equal(out.successes, k)


def test_xrpo_plus_seeds_unsolved_prompts():
    # every prompt at p = 0 and an ICL prompt that always succeeds (p_icl = clip(0 p + 1, 0, 1)): the first round's
    # rollouts are all seeded and all flip; nothing is seeded in the second round (every prompt that got rollouts is
    # solved by then)
    p = np.zeros(4)
    out = _step("xrpo-plus", p, np.random.default_rng(0), rollouts=32, icl=True, icl_mult=0.0, icl_add=1.0)
    assert out.seeded.sum() >= 1
    assert_array_equal(out.flips, out.seeded)
    assert np.all(out.successes[out.seeded > 0] > 0)
    # without ICL nothing is seeded and nothing is solved
    out = _step("xrpo-plus", p, np.random.default_rng(0), rollouts=32)
    assert out.seeded.sum() == 0 and out.successes.sum() == 0


def test_last_visit_must_be_a_count():
    with pytest.raises(ValueError, match="last_visit must be >= 0, got -1"):
        SimConfig(last_visit=-1)


def test_xrpo_plus_gains_more_than_hrp_on_the_studys_rates():
    # measured at 300 steps (docs/results.md): xrpo-plus 1.30 +/- 0.02 x uniform's informative rollouts, HRP 1.04
    # +/- 0.02. At 150 steps the intervals are ~1.4x wider; the test asks xrpo-plus's lower bound to clear 1.2 and
    # HRP's upper bound: a planner that ignored its posterior or its history would not (no-history: 1.20, knapsack
    # 0.99)
    res = simulate(SimConfig(dist=STUDY_FIT, methods=["uniform", "hrp", "xrpo-plus"], steps=150), latency=False)
    plus = res["methods"]["xrpo-plus"]["vs_uniform"]["informative_share"]
    hrp = res["methods"]["hrp"]["vs_uniform"]["informative_share"]
    assert plus["ratio"] - plus["ci"] > 1.2
    assert plus["ratio"] - plus["ci"] > hrp["ratio"] + hrp["ci"]


def test_step_metrics_group_value_is_the_planners_objective_measured():
    # groups of 8 (mixed), 2 (mixed), 4 (all wrong), 6 (mixed, dropped by a filter): the objective sums n^gamma over
    # the trained mixed groups only
    o = StepOutcome(
        p=np.full(4, 0.5),
        counts=np.array([8, 2, 4, 6]),
        successes=np.array([3, 1, 0, 2]),
        trained=np.array([True, True, True, False]),
        seeded=np.zeros(4, dtype=np.int64),
        flips=np.zeros(4, dtype=np.int64),
    )
    assert step_metrics(o, size_power=1.0)["group_value"] == 10.0  # = informative rollouts
    assert step_metrics(o, size_power=0.0)["group_value"] == 2.0  # = informative groups
    got = step_metrics(o, size_power=0.5)
    assert got["group_value"] == pytest.approx(np.sqrt(8) + np.sqrt(2), rel=1e-15)
    assert got["group_value_per_rollout"] == pytest.approx((np.sqrt(8) + np.sqrt(2)) / 20, rel=1e-15)
    with pytest.raises(ValueError, match="size_power"):
        step_metrics(o, size_power=2.0)


def test_group_size_power_reaches_the_planner_and_the_figures():
    # the simulator's xrpo-plus is the registered allocator with the knob: gamma = 1/2 draws the same base round,
    # then plans each round with posterior_allocation(size_power=0.5)
    p = np.array([0.0, 0.1, 0.3, 0.5, 0.6, 0.8, 0.95, 1.0])
    out = _step("xrpo-plus", p, np.random.default_rng(1), rollouts=48, n_base=2, last_visit=0, group_size_power=0.5)
    rng = np.random.default_rng(1)
    m = np.full(8, 2)
    k = rng.binomial(m, p)
    for b in (16, 16):
        x = posterior_allocation(k, m, b, size_power=0.5)
        k, m = k + rng.binomial(x, p), m + x
    assert_array_equal(out.counts, m)
    # the figures report the objective with the config's gamma, and its ratio to uniform
    res = simulate(
        SimConfig(dist=STUDY_FIT, methods=["uniform", "xrpo-plus"], steps=30, n_base=2, group_size_power=0.5),
        latency=False,
    )
    u, x = res["methods"]["uniform"], res["methods"]["xrpo-plus"]
    assert u["group_value"]["mean"] > u["informative_groups"]["mean"]  # groups of 8: sqrt(8) each
    assert x["vs_uniform"]["group_value_per_rollout"]["ratio"] == pytest.approx(
        x["group_value_per_rollout"]["mean"] / u["group_value_per_rollout"]["mean"], rel=1e-12
    )
    with pytest.raises(ValueError, match="group_size_power"):
        SimConfig(group_size_power=1.5)
