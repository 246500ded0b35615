"""Tests of the allocation simulator's core (xrpo.sim.model, xrpo.sim.latency, xrpo.algo.signal, the intervals of
xrpo.algo.simulate): hand-computed expectations (exact, by enumerating every reward sequence through the real step
functions), the best fixed allocation against brute force, budgets, determinism, CurES / DAPO against the trainer's
own components, and the paper's latency model."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from xrpo.algo.allocation import split_budget
from xrpo.algo.rounds import cures_select
from xrpo.algo.rounds import one_batch_counts as uniform_counts
from xrpo.algo.signal import (
    best_fixed_allocation,
    check_count,
    expected_informative_rollouts,
    finite_array,
    nonzero_variance_prob,
    oracle_allocation,
)
from xrpo.algo.stats import mean_ci
from xrpo.sim.latency import latency_ratio, phase_latency, round_latency, step_latency, stream_latency
from xrpo.sim.model import (
    StepOutcome,
    bernoulli_draw,
    dapo_step,
    fit_success_rate_mixture,
    fixed_outcome,
    icl_success_prob,
    mixture_moment,
    mixture_zero_variance_share,
    outcome_from_phased,
    phased_step,
    sample_mixture,
    step_metrics,
)


def cures_allocation(*args, **kwargs):
    """CurES's prompts and counts (`cures_select` without the distribution they were drawn from)."""
    pick = cures_select(*args, **kwargs)
    return pick.idx, pick.counts


# ---------------------------------------------------------------------------------------------------------------
# exact expectations by enumeration
# ---------------------------------------------------------------------------------------------------------------


def enumerate_phased(p, budget, **kw):
    """E[step_metrics] of phased_step over every reward sequence, exactly: the k-th rollout generated takes bit k of
    the sequence as its reward; a sequence's probability is the product of p or 1 - p of the prompts its rollouts
    went to (which depends on earlier bits, as the allocation does)."""
    p = np.asarray(p, dtype=np.float64)
    total: dict[str, float] = {}
    mass = 0.0
    for bits in itertools.product([0.0, 1.0], repeat=budget):
        pos, prob = [0], [1.0]

        def draw(idx, counts, seeded, rnd, bits=bits, pos=pos, prob=prob):
            out = []
            for q, c in zip(idx, counts):
                r = np.array(bits[pos[0] : pos[0] + c])
                pos[0] += c
                prob[0] *= float(np.prod(np.where(r == 1.0, p[q], 1.0 - p[q])))
                out.append(r)
            return out

        res = phased_step(len(p), budget, draw, **kw)
        assert pos[0] == budget  # every rollout consumed one bit: the budget is spent exactly
        mass += prob[0]
        for k, v in step_metrics(outcome_from_phased(p, res)).items():
            total[k] = total.get(k, 0.0) + prob[0] * v
    assert math.isclose(mass, 1.0, abs_tol=1e-12)
    return total


def test_nonzero_variance_prob_hand():
    # p = 0.5, n = 2: 1 - 0.25 - 0.25 = 0.5;  p = 0.2, n = 3: 1 - 0.008 - 0.512 = 0.48
    assert_allclose(nonzero_variance_prob([0.5, 0.2], [2, 3]), [0.5, 0.48], rtol=0, atol=1e-15)
    # fewer than two rollouts, or p in {0, 1}: never mixed
    assert_array_equal(nonzero_variance_prob([0.5, 0.5, 0.0, 1.0], [0, 1, 9, 9]), [0, 0, 0, 0])
    # expected informative rollouts: n * P(mixed) = 3 * 0.48 = 1.44
    assert_allclose(expected_informative_rollouts(0.2, 3), 1.44, rtol=0, atol=1e-15)


def test_two_prompt_uniform_hand():
    # p = (0.5, 0.2), 6 rollouts, 3 each: E[non-zero-variance groups] = (1 - 2 * 0.125) + 0.48 = 0.75 + 0.48 = 1.23,
    # E[informative rollouts] = 3 * 1.23 = 3.69
    p = np.array([0.5, 0.2])
    c = uniform_counts(2, 6)
    assert_array_equal(c, [3, 3])
    assert_allclose(nonzero_variance_prob(p, c).sum(), 1.23, rtol=0, atol=1e-15)
    # the same split through phased_step (n_base 3, no planning round), enumerated exactly
    e = enumerate_phased(p, 6, n_base=3, rounds=0)
    assert_allclose(e["informative_groups"], 1.23, rtol=0, atol=1e-12)
    assert_allclose(e["informative_rollouts"], 3.69, rtol=0, atol=1e-12)
    # and fixed_outcome's binomial draws agree with it (Monte Carlo, 4 standard errors)
    rng = np.random.default_rng(0)
    g = [step_metrics(fixed_outcome(p, c, rng))["informative_groups"] for _ in range(4000)]
    m, half = mean_ci(g)
    assert abs(m - 1.23) < 2 * half


def test_two_prompt_hrp_hand():
    # p = (0.5, 0.2), n_base 2, one planning round of 2 rollouts, HRP proportional (alpha 0.05, lambda 0.1).
    # After the base round a mixed prompt (1 of 2) has s = 0.7071 and priority
    #   Delta + phi = 0.7071 * (t_{.975,1}/sqrt 2 - t_{.975,2}/sqrt 3) + 0.1 sqrt(log 3 / 2)
    #               = 0.7071 * (8.9845 - 2.4842) + 0.0741 = 4.596 + 0.074 = 4.671,
    # an all-equal one only phi = 0.0741. Quotas: both mixed or both all-equal -> 1 each; one mixed -> 2 * 4.671 /
    # 4.745 = 1.97 and 0.03: floors 1 and 0, the leftover to the larger remainder: 2 to the mixed prompt, 0 to the
    # other (which stays all-equal).
    # P(mixed after base): A 2 * 0.5 * 0.5 = 0.5, B 2 * 0.2 * 0.8 = 0.32. A mixed prompt stays mixed. Both all-equal
    # (probability 0.5 * 0.68): each gets one rollout, which mixes A with probability 0.5 (0/2 then a success, or 2/2
    # then a failure), and B with 0.64 * 0.2 + 0.04 * 0.8 = 0.16 out of its 0.68:
    #   E[groups] = 0.5 + 0.32 + 0.68 * (0.5 * 0.5) + 0.5 * 0.16 = 0.82 + 0.17 + 0.08 = 1.07   (uniform: 1.23)
    e = enumerate_phased([0.5, 0.2], 6, n_base=2, rounds=1, alpha=0.05, lam=0.1)
    assert_allclose(e["informative_groups"], 1.07, rtol=0, atol=1e-12)
    # informative rollouts: a prompt mixed at the end has 2, 3 or 4 rollouts. A mixed after base: 2 (+2 if B is
    # all-equal: prob 0.68, +1 if B mixed too: 0.32) -> 0.5 * (2 + 0.68 * 2 + 0.32 * 1) = 0.5 * 3.68 = 1.84; B likewise
    # 0.32 * (2 + 0.5 * 2 + 0.5 * 1) = 0.32 * 3.5 = 1.12; both all-equal then mixed by their third rollout: 3 each
    # -> 3 * (0.68 * 0.25 + 0.5 * 0.16) = 3 * 0.25 = 0.75. Total 1.84 + 1.12 + 0.75 = 3.71 (uniform: 3.69).
    assert_allclose(e["informative_rollouts"], 3.71, rtol=0, atol=1e-12)
    assert_allclose(e["rollouts_generated"], 6.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("allocation,mode", [("hrp", "proportional"), ("hrp", "greedy"), ("uniform", "proportional")])
def test_always_or_never_solved_prompts_never_give_signal(allocation, mode):
    p = np.array([0.0, 1.0, 0.0, 1.0, 0.0])
    rng = np.random.default_rng(1)
    for _ in range(5):
        res = phased_step(5, 40, bernoulli_draw(p, p, rng), n_base=2, rounds=3, allocation=allocation, mode=mode)
        m = step_metrics(outcome_from_phased(p, res))
        assert m["informative_rollouts"] == 0 and m["informative_groups"] == 0 and m["sq_error"] == 0
        assert m["rollouts_p01"] == m["rollouts_all_equal"] == m["rollouts_generated"] == 40
    for o in (
        fixed_outcome(p, uniform_counts(5, 40), rng),
        fixed_outcome(p, oracle_allocation(p, 40, 2), rng),
        dapo_step(p, lambda k: np.zeros(k), 5, 40, 3, rng),
    ):
        m = step_metrics(o)
        assert m["informative_rollouts"] == 0 and m["rollouts_p01"] == m["rollouts_generated"]


def test_uniform_phases_are_the_even_split():
    # the w/o-HRP ablation: each planning round split evenly (the planner's test: 128 = 64 + 32 + 32 -> 2 each)
    rng = np.random.default_rng(0)
    p = rng.random(16)
    res = phased_step(16, 128, bernoulli_draw(p, p, rng), n_base=4, rounds=2, allocation="uniform")
    assert [a.tolist() for a in res.allocs] == [[4] * 16, [2] * 16, [2] * 16]
    assert res.nonuniform == [False, False]
    assert_array_equal(outcome_from_phased(p, res).counts, uniform_counts(16, 128))
    # GRPO's one batch is split_budget of zero priorities, exactly as the planner's single-batch path
    assert_array_equal(uniform_counts(7, 50), split_budget(np.zeros(7), 50))
    assert uniform_counts(7, 50).tolist() == [8, 7, 7, 7, 7, 7, 7]


@pytest.mark.parametrize("seed", range(6))
def test_every_method_spends_the_budget_exactly(seed):
    rng = np.random.default_rng(seed)
    Q = int(rng.integers(2, 12))
    n_base = int(rng.integers(2, 5))
    B = Q * n_base + int(rng.integers(0, 60))
    rounds = int(rng.integers(1, 4))
    p = sample_mixture([0.3, 0.5, 0.2], [0.0, (0.7, 1.5), 1.0], Q, rng)
    for mode in ("proportional", "greedy"):
        for cap in (None, 3):
            if cap is not None and cap * Q < -(-(B - Q * n_base) // rounds):
                continue
            res = phased_step(
                Q, B, bernoulli_draw(p, p, rng), n_base=n_base, rounds=rounds, mode=mode, max_per_prompt=cap, icl=True
            )
            o = outcome_from_phased(p, res)
            assert o.counts.sum() == B and np.all(o.counts >= n_base)
            if cap is not None:
                assert all(a.max() <= cap for a in res.allocs[1:])
    assert fixed_outcome(p, uniform_counts(Q, B), rng).counts.sum() == B
    oc = oracle_allocation(p, B, n_base)
    assert oc.sum() == B and oc.min() >= n_base
    idx, counts = cures_allocation(rng.binomial(4, p), np.full(Q, 4), Q, B, rng)
    assert counts.sum() == B and sorted(idx.tolist()) == list(range(Q))
    d = dapo_step(p, lambda k: sample_mixture([1.0], [(1, 1)], k, rng), Q, B, 4, rng)
    batches = d.counts.shape[0] // Q
    # kept groups of several batches: each at most ceil(B / Q) rollouts (the even split gives the earlier prompts one
    # more), so the trained batch can exceed B by less than Q when Q does not divide B, as in the training loop
    assert d.counts.sum() == B * batches and d.trained.sum() <= Q
    assert d.counts[d.trained].sum() <= Q * -(-B // Q)


def test_phased_step_is_deterministic_for_a_generator_seed():
    p = sample_mixture([1.0], [(0.5, 0.5)], 16, np.random.default_rng(3))
    runs = [phased_step(16, 128, bernoulli_draw(p, p, np.random.default_rng(7)), icl=True) for _ in range(2)]
    for a, b in zip(runs[0].rewards, runs[1].rewards):
        assert_array_equal(a, b)
    other = phased_step(16, 128, bernoulli_draw(p, p, np.random.default_rng(8)), icl=True)
    assert any(not np.array_equal(a, b) for a, b in zip(runs[0].rewards, other.rewards))


# ---------------------------------------------------------------------------------------------------------------
# ICL seeding
# ---------------------------------------------------------------------------------------------------------------


def test_icl_success_prob_hand():
    # clip(0.5 p + 0.1): p = 0 -> 0.1, p = 0.4 -> 0.3, p = 1 -> 0.6; clip(2 p): p = 0.7 -> 1
    assert_allclose(icl_success_prob([0.0, 0.4, 1.0], 0.5, 0.1), [0.1, 0.3, 0.6], rtol=0, atol=1e-15)
    assert_allclose(icl_success_prob([0.7, 0.2], 2.0), [1.0, 0.4], rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="icl mult"):
        icl_success_prob(0.5, -1.0)
    with pytest.raises(ValueError, match=r"p must hold probabilities in \[0, 1\]; found 1.5 at index \(1,\)"):
        icl_success_prob([0.5, 1.5])


def test_icl_seeds_unsolved_prompts_and_counts_flips():
    # prompt 0 is never solved plainly but always from its ICL prompt; prompt 1 is always solved; prompt 2 is 0/1
    p = np.array([0.0, 1.0, 0.0])
    p_icl = icl_success_prob(p, 1.0, 1.0)  # -> 1, 1, 1
    res = phased_step(3, 12, bernoulli_draw(p, p_icl, np.random.default_rng(0)), n_base=2, rounds=2, lam=0.1, icl=True)
    o = outcome_from_phased(p, res)
    for t in (1, 2):
        alloc, seeded = res.allocs[t], res.seeded[t]
        # round 1: prompts 0 and 2 have no success yet and are seeded where they got rollouts; after a flip a prompt
        # is solved and no longer seeded
        solved_before = np.sum(res.successes[:t], axis=0) > 0
        assert_array_equal(seeded, (alloc > 0) & ~solved_before)
        assert_array_equal(res.successes[t][seeded], alloc[seeded])  # p_icl = 1: every seeded rollout succeeds
    assert o.seeded.sum() == sum(s.sum() for s in res.seeded[1:]) and o.flips.sum() == o.seeded.sum()
    # without ICL a p = 0 prompt never succeeds
    res = phased_step(3, 12, bernoulli_draw(p, p_icl, np.random.default_rng(0)), n_base=2, rounds=2, icl=False)
    assert res.successes[1][0] == res.successes[2][0] == 0 and not any(s.any() for s in res.seeded)


# ---------------------------------------------------------------------------------------------------------------
# best fixed allocation
# ---------------------------------------------------------------------------------------------------------------


def brute_force(gain, budget, n_min):
    best, arg = -np.inf, None
    Q = gain.shape[0]
    for c in itertools.product(range(n_min, budget + 1), repeat=Q):
        if sum(c) == budget:
            v = sum(gain[q, c[q]] for q in range(Q))
            if v > best + 1e-12:
                best, arg = v, c
    return best, arg


def test_best_fixed_allocation_hand():
    # two prompts, 3 rollouts: gains a = [0, 1, 1.5, 1.6], b = [0, 0.9, 1.8, 2.0]
    # splits (0,3) 2.0, (1,2) 2.8, (2,1) 2.4, (3,0) 1.6 -> (1, 2)
    g = np.array([[0, 1, 1.5, 1.6], [0, 0.9, 1.8, 2.0]])
    assert best_fixed_allocation(g, 3).tolist() == [1, 2]
    # with at least 2 each the budget 3 is infeasible; with budget 3 and n_min 1: (1,2) 2.8 or (2,1) 2.4 -> (1, 2)
    assert best_fixed_allocation(g, 3, n_min=1).tolist() == [1, 2]
    with pytest.raises(ValueError, match="less than n_min"):
        best_fixed_allocation(g, 3, n_min=2)
    with pytest.raises(ValueError, match="shape"):
        best_fixed_allocation(g[:, :3], 3)


def test_best_fixed_allocation_edge_cases():
    # the default floor is n_min = 0: a prompt worth nothing at every count gets no rollout
    #   gains a = [0, 0, 0], b = [0, 1, 2]: (0, 2) 2, (1, 1) 1, (2, 0) 0 -> (0, 2)
    g = np.array([[0.0, 0.0, 0.0], [0.0, 1.0, 2.0]])
    assert best_fixed_allocation(g, 2).tolist() == [0, 2]
    # a single prompt with a floor takes the whole budget, whatever its gains
    assert best_fixed_allocation(np.array([[0.0, 5.0, 1.0]]), 2, n_min=1).tolist() == [2]
    # a budget of 0 is legal: nobody gets a rollout
    assert best_fixed_allocation(np.zeros((3, 1)), 0).tolist() == [0, 0, 0]


def test_oracle_allocation_edge_cases():
    # default n_min = 0: the never-solved prompt (p = 0, no signal at any n) gets nothing; the p = 0.5 prompt gets all
    # 4 rollouts, 4 (1 - 2 * 0.5^4) = 3.5 expected informative rollouts (3 would give only 3 (1 - 2/8) = 2.25)
    assert oracle_allocation([0.0, 0.5], 4).tolist() == [0, 4]
    assert oracle_allocation([0.0, 0.5], 4, objective="groups").tolist() == [0, 4]
    # a step budget of 0 gives every prompt 0 rollouts
    assert oracle_allocation([0.3, 0.5], 0).tolist() == [0, 0]


def test_check_count_and_finite_array():
    # a numpy integer comes back as a Python int (JSON-serialisable, exact arithmetic)
    out = check_count(np.int64(3), "budget", 0)
    assert out == 3 and type(out) is int
    assert check_count(0, "budget", 0) == 0
    # the error names the argument and the first non-finite index (one bad value: index (1,))
    with pytest.raises(ValueError, match=r"^x must be finite; found nan at index \(1,\)$"):
        finite_array([1.0, np.nan, 2.0], "x")
    with pytest.raises(ValueError, match=r"^x must be finite; found inf at index \(0, 1\)$"):
        finite_array([[1.0, np.inf], [np.nan, 0.0]], "x")
    assert_array_equal(finite_array([1, 2], "x"), np.array([1.0, 2.0]))


@pytest.mark.parametrize("seed", range(8))
def test_best_fixed_allocation_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    Q, B = int(rng.integers(1, 4)), int(rng.integers(0, 9))
    n_min = int(rng.integers(0, B // Q + 1))
    g = rng.normal(size=(Q, B + 1))
    c = best_fixed_allocation(g, B, n_min)
    best, _ = brute_force(g, B, n_min)
    assert c.sum() == B and c.min() >= n_min
    assert_allclose(g[np.arange(Q), c].sum(), best, rtol=0, atol=1e-12)


def test_oracle_beats_every_fixed_allocation_in_expectation():
    rng = np.random.default_rng(0)
    p = sample_mixture([0.3, 0.5, 0.2], [0.0, (0.7, 1.5), 1.0], 16, rng)
    obj = {"rollouts": expected_informative_rollouts, "groups": nonzero_variance_prob}
    for name, f in obj.items():
        best = f(p, oracle_allocation(p, 128, 4, name)).sum()
        for _ in range(50):
            other = 4 + np.bincount(rng.integers(0, 16, 64), minlength=16)  # a random allocation, n >= 4
            assert f(p, other).sum() <= best + 1e-12
        assert f(p, uniform_counts(16, 128)).sum() <= best + 1e-12
    # p = 0 and p = 1 prompts are worth nothing: they keep the floor, the rest goes to the others
    c = oracle_allocation([0.0, 1.0, 0.5], 20, 2)
    assert c[:2].tolist() == [2, 2] and c[2] == 16


# ---------------------------------------------------------------------------------------------------------------
# CurES and DAPO
# ---------------------------------------------------------------------------------------------------------------


def test_cures_allocation_is_cures_state_select():
    from xrpo.algo.visits import CuresState

    rng = np.random.default_rng(5)
    trials = rng.integers(0, 9, 40)
    succ = rng.binomial(trials, rng.random(40))
    st = CuresState.new(40)
    st.successes, st.trials = succ.astype(np.int64), trials.astype(np.int64)
    a_idx, a_counts, _ = st.select(16, 128, np.random.default_rng(11))
    b_idx, b_counts = cures_allocation(succ, trials, 16, 128, np.random.default_rng(11))
    assert_array_equal(a_idx, b_idx)
    assert_array_equal(a_counts, b_counts)


def test_dapo_refills_until_the_batch_is_full():
    rng = np.random.default_rng(0)
    # first batch: 4 never-solved prompts -> nothing kept; refill batches of p = 0.5 with 8 rollouts: a group is
    # all-equal with probability 2 / 256, so the second batch almost surely fills all 4 slots
    o = dapo_step(np.zeros(4), lambda k: np.full(k, 0.5), 4, 32, 10, rng)
    m = step_metrics(o)
    assert o.counts.shape[0] in (8, 12) and m["prompts"] == o.counts.shape[0]
    assert m["informative_groups"] == 4 and m["rollouts_trained"] == 32 and m["informative_rollouts"] == 32
    assert m["rollouts_generated"] == 8 * o.counts.shape[0] and m["rollouts_dropped"] == m["rollouts_generated"] - 32
    # never any signal: stops at max_gen_batches, trains on nothing
    o = dapo_step(np.zeros(4), lambda k: np.ones(k), 4, 32, 3, rng)
    assert o.counts.shape[0] == 12 and not o.trained.any()
    # max_gen_batches = 1 is GRPO with the filter: the kept groups are exactly the mixed ones
    p = np.full(6, 0.3)
    o = dapo_step(p, lambda k: p, 6, 12, 1, np.random.default_rng(2))
    assert_array_equal(o.trained, (o.successes > 0) & (o.successes < 2))


def test_dapo_keeps_the_lowest_group_ids_when_over_quota():
    # p = 0.5 and 40 rollouts per group: every group is mixed (but for 2^-39), the first batch fills the quota
    o = dapo_step(np.full(3, 0.5), lambda k: np.full(k, 0.5), 3, 3 * 40, 5, np.random.default_rng(0))
    assert o.counts.shape[0] == 3 and o.trained.all()
    # first batch: one mixed group of three; second: all three mixed -> only the first two of them are kept
    first = np.array([0.0, 0.5, 1.0])
    o = dapo_step(first, lambda k: np.full(k, 0.5), 3, 3 * 40, 5, np.random.default_rng(0))
    assert o.trained.tolist() == [False, True, False, True, True, False]


# ---------------------------------------------------------------------------------------------------------------
# metrics and intervals
# ---------------------------------------------------------------------------------------------------------------


def test_step_metrics_hand():
    # groups: (p 0.5, 4 rollouts, 2 ok), (p 0, 4, 0), (p 1, 2, 2), (p 0.25, 2, 1) dropped by DAPO
    o = StepOutcome(
        p=np.array([0.5, 0.0, 1.0, 0.25]),
        counts=np.array([4, 4, 2, 2]),
        successes=np.array([2, 0, 2, 1]),
        trained=np.array([True, True, True, False]),
        seeded=np.array([0, 2, 0, 0]),
        flips=np.array([0, 1, 0, 0]),
        nonuniform=(True, False),
    )
    m = step_metrics(o)
    assert m["rollouts_generated"] == 12 and m["rollouts_trained"] == 10 and m["prompts"] == 4
    # informative: only group 0 (group 3 is mixed but dropped)
    assert m["informative_rollouts"] == 4 and m["informative_groups"] == 1
    assert m["informative_share"] == 4 / 12 and m["groups_per_rollout"] == 1 / 12
    # squared errors (0.5-0.5)^2, 0, 0, (0.5-0.25)^2 = 0.0625 -> mean 0.015625
    assert m["sq_error"] == 0.015625
    assert m["rollouts_p01"] == 6 and m["rollouts_all_equal"] == 6 and m["rollouts_dropped"] == 2
    assert m["seeded_prompts"] == 2 and m["flips"] == 1 and m["planned_rounds"] == 2 and m["nonuniform_rounds"] == 1
    # eps 0.3 also counts the p = 0.25 prompt as never solved
    assert step_metrics(o, degenerate_eps=0.3)["rollouts_p01"] == 8


def test_sample_mixture():
    rng = np.random.default_rng(0)
    p = sample_mixture([0.25, 0.75], [0.0, (2.0, 6.0)], 40000, rng)
    assert np.all((p >= 0) & (p <= 1))
    # atoms are exact; the Beta(2, 6) part has mean 0.25: overall share of p == 0 about 0.25, mean 0.75 * 0.25
    assert abs(np.mean(p == 0.0) - 0.25) < 0.01
    assert abs(p.mean() - 0.1875) < 0.005
    with pytest.raises(ValueError, match="sum to 1"):
        sample_mixture([0.5, 0.4], [0.0, 1.0], 3, rng)
    with pytest.raises(ValueError, match=r"component 1: a fixed success rate must lie in \[0, 1\]"):
        sample_mixture([0.5, 0.5], [0.0, 1.5], 3, rng)
    with pytest.raises(ValueError, match="component 0: Beta parameters"):
        sample_mixture([1.0], [(0.0, 1.0)], 3, rng)


def test_mixture_moments_hand():
    w, comps = [0.25, 0.75], [0.0, (2.0, 6.0)]
    # E[p] = 0.75 * 2/8; E[p^2] = 0.75 * (2 * 3) / (8 * 9)
    assert mixture_moment(w, comps, 0) == pytest.approx(1.0, abs=1e-15)
    assert mixture_moment(w, comps, 1) == pytest.approx(0.1875, abs=1e-15)
    assert mixture_moment(w, comps, 2) == pytest.approx(0.0625, abs=1e-15)
    # groups of 2 all equal: p = 0 always (0.25); Beta(2, 6): E[p^2] + E[(1-p)^2] = 6/72 + 42/72 (1 - p ~ Beta(6, 2))
    assert mixture_zero_variance_share(w, comps, 2) == pytest.approx(0.25 + 0.75 * 48 / 72, abs=1e-15)
    assert mixture_zero_variance_share([0.5, 0.5], [0.3, 1.0], 3) == pytest.approx(
        0.5 * (0.3**3 + 0.7**3) + 0.5, abs=1e-15
    )
    assert mixture_zero_variance_share(w, comps, 1) == 1.0
    # the same figure from sampled rates and the per-prompt probability the simulator uses
    p = sample_mixture(w, comps, 400000, np.random.default_rng(3))
    for n in (4, 8):
        mc = 1.0 - nonzero_variance_prob(p, n).mean()
        assert abs(mixture_zero_variance_share(w, comps, n) - mc) < 0.003
    with pytest.raises(ValueError, match="summing to 1"):
        mixture_moment([0.5, 0.4], [0.0, 1.0], 2)
    with pytest.raises(ValueError, match="component 1: Beta parameters"):
        mixture_zero_variance_share([0.5, 0.5], [0.0, (1.0, -1.0)], 2)
    with pytest.raises(ValueError, match=r"component 0: a fixed success rate must lie in \[0, 1\]"):
        mixture_moment([1.0], [1.2], 2)


def test_fit_success_rate_mixture_recovers_a_known_mixture():
    rng = np.random.default_rng(0)
    p = sample_mixture([0.3, 0.2, 0.5], [0.0, 1.0, (0.7, 1.5)], 4000, rng)
    n = rng.integers(4, 17, 4000)
    w0, w1, wb, a, b = fit_success_rate_mixture(rng.binomial(n, p), n)
    assert abs(w0 - 0.3) < 0.03 and abs(w1 - 0.2) < 0.03 and abs(w0 + w1 + wb - 1) < 1e-12
    assert abs(a / (a + b) - 0.7 / 2.2) < 0.03  # the Beta part's mean
    # the raw rates would put every 0-of-n prompt at p = 0: 30% plus the Beta part's 0-of-n draws
    # all prompts 0 of n -> all weight on p = 0 (a Beta part can only approach it)
    w0, w1, wb, a, b = fit_success_rate_mixture(np.zeros(50), np.full(50, 8))
    assert w0 > 0.99


def test_fit_success_rate_mixture_likelihood_is_the_beta_binomial():
    # with one Beta component only (w0 = w1 = 0 enforced by data that has neither 0 nor n successes), the fit maximises
    # the Beta-binomial likelihood: compare with scipy's betabinom at the fitted and at a perturbed point
    from scipy import stats

    rng = np.random.default_rng(1)
    p = rng.beta(3.0, 5.0, 3000)
    n = np.full(3000, 12)
    k = rng.binomial(n, p)
    keep = (k > 0) & (k < n)
    w0, w1, wb, a, b = fit_success_rate_mixture(k[keep], n[keep])
    assert w0 < 1e-3 and w1 < 1e-3
    ll = stats.betabinom.logpmf(k[keep], n[keep], a, b).sum()
    for da, db in ((1.05, 1.0), (0.95, 1.0), (1.0, 1.05), (1.0, 0.95)):
        assert stats.betabinom.logpmf(k[keep], n[keep], a * da, b * db).sum() < ll
    with pytest.raises(ValueError, match="0 <= successes <= trials"):
        fit_success_rate_mixture([3], [2])


# ---------------------------------------------------------------------------------------------------------------
# latency model (XRPO paper, appendix "Latency Analysis")
# ---------------------------------------------------------------------------------------------------------------


def test_round_latency_hand():
    # N = 128, m_p = 8, n = 4, t0 = 1, dt = 0.1: T1 = ceil(128/8) = 16; T2 = 4 (ceil(32/8) + 0.1) = 16.4
    assert round_latency(128, 8, 4, 1.0, 0.1) == (16.0, 16.4)
    # N = 9, m_p = 2, n = 3: T1 = ceil(4.5) = 5, T2 = 3 ceil(1.5) = 6
    assert round_latency(9, 2, 3) == (5.0, 6.0)
    with pytest.raises(ValueError, match="must divide"):
        round_latency(10, 2, 3)


def test_latency_ratio_is_the_papers_closed_form():
    for N, m, n in [(128, 8, 3), (1024, 64, 2), (9, 2, 3), (7, 100, 5)]:
        closed = latency_ratio(N, m, n)
        # (N + n m_p - n) / (N + m_p - 1) = n - (n - 1) / (1 + (m_p - 1) / N)
        assert math.isclose(closed, (N + n * m - n) / (N + m - 1), rel_tol=1e-14)
        assert math.isclose(closed, n - (n - 1) / (1 + (m - 1) / N), rel_tol=1e-14)
    # where the ceilings are tight (N = 1 mod m_p and N / n = 1 mod m_p, e.g. n = m_p + 1 and N odd) the closed form
    # equals the ceiling model: N = 9, m_p = 2, n = 3 -> 12 / 10 = 6 / 5
    assert math.isclose(latency_ratio(9, 2, 3), 6 / 5, rel_tol=1e-14)
    t1, t2 = round_latency(45, 4, 5, 1.0, 0.0)  # 45 = 1 mod 4, 45 / 5 = 9 = 1 mod 4
    assert math.isclose(t2 / t1, latency_ratio(45, 4, 5), rel_tol=1e-14)
    # with dt: ((N + n m_p - n) / m_p + n dt / t0) / ((N + m_p - 1) / m_p); N = 9, m_p = 2, n = 3, dt / t0 = 0.5:
    # (12 / 2 + 1.5) / (10 / 2) = 7.5 / 5 = 1.5, and the ceiling model: (6 + 1.5) / 5
    assert math.isclose(latency_ratio(9, 2, 3, 0.5), 1.5, rel_tol=1e-14)
    t1, t2 = round_latency(9, 2, 3, 2.0, 1.0)
    assert math.isclose(t2 / t1, 1.5, rel_tol=1e-14)


def test_latency_limits():
    # m_p / N -> 0: no overhead; m_p / N -> inf: n times the one-batch time
    assert math.isclose(latency_ratio(10**12, 8, 3), 1.0, rel_tol=1e-9)
    assert math.isclose(latency_ratio(16, 10**12, 3), 3.0, rel_tol=1e-9)
    assert_allclose(latency_ratio(128, np.array([1, 10**15]), 4), [1.0, 4.0], rtol=1e-9)
    # the ceiling model reaches both limits exactly: m_p = 1 -> T2 = T1 (dt = 0); m_p >= N -> one wave per round
    t1, t2 = round_latency(120, 1, 3)
    assert t1 == t2 == 120
    t1, t2 = round_latency(120, 120, 3, 1.0, 0.0)
    assert (t1, t2) == (1.0, 3.0)


def test_stream_latency_hand():
    # 64 + 32 + 32 at m_p = 24: slots kept full, ceil(128 / 24) = 6 waves of t0 = 2 (rounds: 7, plus 3 dt)
    assert stream_latency([64, 32, 32], 24, 2.0) == 6 * 2.0
    # m_p >= N: every round decodes at once, each prompt's 3 rounds still in sequence
    assert stream_latency([64, 32, 32], 4096) == 3.0 == phase_latency([64, 32, 32], 4096)
    # large batch on a small engine: one batch's time
    assert stream_latency([64, 32, 32], 8) == phase_latency([128], 8) == 16.0
    assert stream_latency([64, 0], 24) == 3.0  # an empty round is not run
    with pytest.raises(ValueError, match="whole numbers"):
        stream_latency([1.5], 2)


def test_step_latency_hand():
    # two prompts; base groups [3, 5] and [2, 2]; round 1: [4] and [6, 1]; round 2: [] and [2]
    L = [[[3, 5], [2, 2]], [[4], [6, 1]], [[], [2]]]
    out = step_latency(L, step_cost=1.0, token_cost=0.5)
    # one batch: max of every length = 6; rounds: max(5, 2) + max(4, 6) + max(0, 2) = 5 + 6 + 2 = 13;
    # streaming: max(5 + 4 + 0, 2 + 6 + 2) = max(9, 10) = 10; tokens = 8 + 4 + 4 + 7 + 2 = 25 -> + 12.5
    assert (out["steps_batch"], out["steps_rounds"], out["steps_streaming"]) == (6.0, 13.0, 10.0)
    assert (out["time_batch"], out["time_rounds"], out["time_streaming"]) == (18.5, 25.5, 22.5)
    with pytest.raises(ValueError, match="same prompts"):
        step_latency([[[1]], [[1], [2]]])
    with pytest.raises(ValueError, match="whole numbers"):
        step_latency([[[1.5]]])


def test_phase_latency_hand():
    # XRPO's step 64 + 32 + 32 at m_p = 24: ceil(64/24) + 2 ceil(32/24) = 3 + 4 = 7 rounds of t0 = 2, + 3 dt of 0.5
    assert phase_latency([64, 32, 32], 24, 2.0, 0.5) == 7 * 2.0 + 1.5
    # a round of size 0 is not run
    assert phase_latency([64, 0], 24) == 3.0
    with pytest.raises(ValueError, match="whole numbers"):
        phase_latency([1.5], 2)
