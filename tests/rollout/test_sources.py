"""Tests for xrpo.rollout.sources: the registry, the choice of source, DAPO's refill by hand, and the state every
source checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

from xrpo.data import Problem
from xrpo.rollout import sources
from xrpo.rollout.records import PlanConfig, PlanResult, RolloutRecord
from xrpo.rollout.sources import (
    CuresSource,
    DynamicSampling,
    PlannerSource,
    SourceContext,
    TreeSource,
    build_source,
    get_source,
    register_source,
    source_name,
)
from xrpo.trainer.config_loader import build_config

PROBLEMS = [Problem(id=f"p{i}", prompt=f"q{i}", answer=str(i)) for i in range(6)]


def ctx(**kw) -> SourceContext:
    base = dict(
        problems=PROBLEMS,
        engine=None,
        verifier=None,
        renderer=None,
        plan=PlanConfig(rollouts_per_step=8, icl=False, sharpen=False, allocation="uniform"),
        prompts_per_step=2,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=4,
        stop=(),
        seed=3,
    )
    base.update(kw)
    return SourceContext(**base)


def test_registry_names_and_errors():
    assert set(sources.SOURCES) >= {"planner", "tree", "cures"}
    with pytest.raises(ValueError, match="unknown batch source 'beam'; valid sources: planner, tree, cures"):
        get_source("beam")
    with pytest.raises(ValueError, match="already registered"):
        register_source("planner")(PlannerSource)


@pytest.mark.parametrize(
    "preset, name, wrapped",
    [
        ("xrpo", "planner", False),
        ("grpo", "planner", False),
        ("dapo", "planner", True),
        ("treepo", "tree", False),
        ("cures", "cures", False),
    ],
)
def test_each_preset_gets_its_source(preset, name, wrapped):
    m = build_config(None, [f"method.name={preset}"]).method
    assert source_name(m) == name
    s = build_source(ctx(), m)
    assert isinstance(s, DynamicSampling) == wrapped
    inner = s.inner if wrapped else s
    assert isinstance(inner, {"planner": PlannerSource, "tree": TreeSource, "cures": CuresSource}[name])


def test_dynamic_sampling_refuses_a_source_that_chooses_its_prompts():
    m = build_config(None, ["method.name=cures"]).method
    with pytest.raises(ValueError, match="CuresSource chooses its own prompts"):
        DynamicSampling(CuresSource(ctx(), m), 3, 2, 1.0)


class Scripted(PlannerSource):
    """Rewards by hand: generation batch b of a step gets REWARDS[b], two rollouts per prompt."""

    REWARDS = [[[1, 1], [0, 1]], [[0, 0], [1, 0]], [[1, 0], [1, 0]]]

    def __init__(self, c):
        super().__init__(c)
        self.calls = []

    def generate(self, problems, sampling):
        b = len(self.calls)
        self.calls.append(([p.id for p in problems], sampling.seed))
        recs = [
            RolloutRecord(
                problem_index=q,
                group_id=q,
                round=0,
                seeded=False,
                gen_prompt_ids=[q],
                train_prompt_ids=[q],
                completion_ids=[7, 8],
                logprobs=[0.0, 0.0],
                finish_reason="eos",
                text=f"b{b}q{q}r{j}",
                reward=float(r),
            )
            for q, rs in enumerate(self.REWARDS[b])
            for j, r in enumerate(rs)
        ]
        return PlanResult(
            records=recs,
            rewards=np.array([x.reward for x in recs]),
            group_ids=np.array([x.group_id for x in recs]),
            metrics={"time/generate": 1.0},
        )


def test_dynamic_sampling_keeps_informative_groups_until_full():
    c = ctx()
    inner = Scripted(c)
    batch = DynamicSampling(inner, max_gen_batches=3, prompts_per_step=2, full_reward=1.0).next_batch(step=5)
    # batch 0: group 0 (1, 1) is dropped, group 1 (0, 1) kept; batch 1: group 0 (0, 0) dropped, group 1 (1, 0) kept:
    # 2 groups after 2 generation batches, so the third is never drawn
    assert len(inner.calls) == 2
    first, second = inner.calls
    assert [p.id for p in batch.problems] == [first[0][1], second[0][1]]
    # each generation batch has its own seed: seed * 1_000_003 + step * 101 + batch
    assert [s for _, s in inner.calls] == [3 * 1_000_003 + 5 * 101, 3 * 1_000_003 + 5 * 101 + 1]
    # the kept groups renumbered 0, 1; their rollouts in order
    assert [x.text for x in batch.plan.records] == ["b0q1r0", "b0q1r1", "b1q1r0", "b1q1r1"]
    np.testing.assert_array_equal(batch.plan.group_ids, [0, 0, 1, 1])
    np.testing.assert_array_equal(batch.plan.rewards, [0, 1, 1, 0])
    m = batch.plan.metrics
    assert (m["rollout/gen_batches"], m["rollout/kept_groups"], m["time/generate"]) == (2.0, 2.0, 2.0)
    assert m["rollout/count"] == 4.0 and m["rollout/zero_variance_group_frac"] == 0.0


def test_dynamic_sampling_stops_at_max_gen_batches():
    inner = Scripted(ctx(prompts_per_step=2))
    inner.REWARDS = [[[1, 1], [0, 0]]] * 2  # nothing informative
    batch = DynamicSampling(inner, max_gen_batches=2, prompts_per_step=2, full_reward=1.0).next_batch(step=1)
    assert len(inner.calls) == 2 and batch.problems == [] and batch.plan.records == []
    assert batch.plan.metrics["rollout/kept_groups"] == 0.0


def test_epoch_order_state_round_trip():
    a = PlannerSource(ctx())
    a.order.next(5)
    b = PlannerSource(ctx())
    b.load_state_dict(a.state_dict())
    assert a.state_dict() == b.state_dict() == {"sampler": {"epoch": 0, "pos": 5, "deferred": []}}
    assert b.order.next(4) == a.order.next(4)


def test_a_draw_across_an_epoch_boundary_holds_distinct_problems_and_every_epoch_visits_each_once():
    from xrpo.rollout.sources import EpochSampler

    # 7 problems, 3 per draw: draws cross epoch boundaries at changing offsets; 7 draws take exactly 3 epochs
    deferrals = 0
    for seed in range(20):
        order = EpochSampler(7, seed)
        draws = []
        for _ in range(7):
            draws.append(order.next(3))
            deferrals += bool(order.deferred)
        assert all(len(set(d)) == 3 for d in draws), (seed, draws)
        counts = np.bincount([i for d in draws for i in d], minlength=7)
        assert counts.tolist() == [3] * 7, (seed, draws)  # 3 epochs, each problem once in each
        assert order.deferred == [] and (order.epoch, order.pos) == (3, 0)
    # a repeat at a boundary (the permutations' job, not this test's) happened, so the deferral was exercised
    assert deferrals > 0


def test_a_deferred_problem_survives_a_checkpoint():
    from xrpo.rollout.sources import EpochSampler

    a = next(o for o in (EpochSampler(7, s) for s in range(50)) if [o.next(3), o.next(3), o.next(3)] and o.deferred)
    b = EpochSampler(7, a.seed, **a.state())
    assert [b.next(3) for _ in range(5)] == [a.next(3) for _ in range(5)]


def test_dynamic_sampling_refills_with_problems_the_step_has_not_drawn():
    # 6 problems, 2 per generation batch, nothing kept: the third batch ends the epoch, the fourth starts the next
    # one, whose first problems may be the first three batches'. They are deferred, not drawn twice in a step
    for seed in range(10):
        inner = Scripted(ctx(prompts_per_step=2, seed=seed))
        inner.REWARDS = [[[1, 1], [0, 0]]] * 3
        inner.order.next(2)  # the step starts at position 2 of the epoch
        DynamicSampling(inner, max_gen_batches=3, prompts_per_step=2, full_reward=1.0).next_batch(step=1)
        ids = [i for call, _ in inner.calls for i in call]
        assert len(ids) == len(set(ids)) == 6, (seed, inner.calls)


def test_a_step_cannot_draw_more_problems_than_the_training_set_has():
    with pytest.raises(ValueError, match=r"rollout.prompts_per_step=7: a step draws that many distinct problems, "):
        PlannerSource(ctx(prompts_per_step=7))


def test_history_is_kept_only_for_allocators_that_read_it_and_round_trips():
    assert PlannerSource(ctx()).history is None  # GRPO: no history, the state is the epoch order alone
    for name in ("knapsack", "xrpo-plus"):
        c = ctx(plan=PlanConfig(rollouts_per_step=8, icl=False, sharpen=False, allocation=name, n_base=2))
        a = PlannerSource(c)
        assert a.history.keep == "last" and a.history.num_problems == len(PROBLEMS)
        a.history.observe([4, 1], np.array([1.0, 0.0, 1.0]), np.array([0, 0, 1]))
        b = PlannerSource(c)
        b.load_state_dict(a.state_dict())
        np.testing.assert_array_equal(b.history.trials, [0, 1, 0, 0, 2, 0])
        np.testing.assert_array_equal(b.history.successes, [0, 1, 0, 0, 1, 0])
        with pytest.raises(ValueError, match="no per-prompt history"):
            b.load_state_dict({"sampler": {"epoch": 0, "pos": 0}})


def test_cures_state_round_trip_and_missing_state():
    m = build_config(None, ["method.name=cures", "method.cures_prior_beta=2"]).method
    a = CuresSource(ctx(), m)
    assert a.state.prior_beta == 2.0 and a.warmup_rollouts == 4
    a.state.observe([0, 0, 3], np.array([1.0, 0.0, 1.0]), np.array([0, 1, 2]))
    a.warmup_metrics = {"cures/warmup_time_s": 1.5}
    b = CuresSource(ctx(), m)
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(b.state.trials, [2, 0, 0, 1, 0, 0])
    np.testing.assert_array_equal(b.state.successes, [1, 0, 0, 1, 0, 0])
    assert b.summary()["cures"]["warmup_time_s"] == 1.5 and b.summary()["cures"]["rollouts_observed"] == 3
    with pytest.raises(ValueError, match="no CurES state"):
        b.load_state_dict({"sampler": {"epoch": 0, "pos": 0}})
    with pytest.raises(ValueError, match="CurES draws that many distinct problems per step"):
        CuresSource(ctx(prompts_per_step=7), m)
