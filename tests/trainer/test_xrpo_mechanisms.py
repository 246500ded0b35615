"""XRPO's three mechanisms inside real training steps, checked by value against `xrpo.algo` on the same batch.

A 5-step XRPO run on the ends-with-alnum task (tests/trainer/conftest.py) hands every step to ``train(on_step=...)``;
from the step's records (rewards by round, prompts, completions) and old log-probs the tests recompute:

    allocation   each planning round's counts = `allocate_round` on the rewards of the rounds before it, with the
                 round budgets of `plan_phases`;
    ICL seeding  the seeded prompts = those with rollouts in the round and no correct rollout so far, whose
                 neighbours exist in the corpus as it was after the previous step; their prompt = those neighbours'
                 problems and solutions (fewshot style) followed by the plain prompt;
    advantages   `group_advantages`, then `sharpen_advantages` with s(y) = `length_normalized_loglik` of the old
                 log-probs: which rollouts got a bonus and how much; and the advantages the loss received.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from xrpo.algo.advantages import group_advantages, length_normalized_loglik, sharpen_advantages
from xrpo.algo.allocation import allocate_round, plan_phases
from xrpo.trainer.config_loader import build_config
from xrpo.trainer.loop import train

STEPS = 5
P, BUDGET, N_BASE, ROUNDS, K = 8, 64, 4, 2, 2  # learn_overrides and the xrpo preset


def quiet(*_):
    pass


@pytest.fixture(scope="module")
def xrpo_run(trainer_env, loss_spy, tmp_path_factory):
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("xrpo_mech")
    train_ids = None
    steps = []

    def on_step(rep):
        nonlocal train_ids
        # the corpus keeps changing: what retrieval returns after this step, for every training problem, is what the
        # next step's ICL seeding must have used
        corpus = rep.corpus
        from xrpo.data import load_problems

        if train_ids is None:
            probs = load_problems(str(trainer_env["train"]))
            train_ids = ([p.id for p in probs], [p.text for p in probs])
        found = corpus.retrieve_many(*train_ids, k=K) if len(corpus) else [[] for _ in train_ids[0]]
        steps.append(
            {
                "report": rep,
                "retrieved": dict(zip(train_ids[0], found)),
                "calls": list(loss_spy.calls),
                "corpus_ids": set(corpus.problem_ids()),
            }
        )
        loss_spy.calls.clear()

    loss_spy.calls.clear()
    ov = trainer_env["learn_overrides"](out, "xrpo", STEPS) + [f"method.policy_loss={loss_spy.name}"]
    train(build_config(None, ov), log=quiet, on_step=on_step)
    return {"steps": steps, "tok": AutoTokenizer.from_pretrained(trainer_env["model"])}


def _rewards_by_prompt(records, before_round: int) -> list[np.ndarray]:
    by = [[] for _ in range(P)]
    for x in records:
        if x.round < before_round:
            by[x.problem_index].append(x.reward)
    return [np.asarray(r, dtype=np.float64) for r in by]


def test_allocation_counts_are_allocate_round_on_the_rewards_so_far(xrpo_run):
    budgets = plan_phases(P, BUDGET, N_BASE, ROUNDS).round_budgets
    nonuniform = 0
    for s in xrpo_run["steps"]:
        plan = s["report"].plan
        counts = Counter((x.round, x.problem_index) for x in plan.records)
        assert [counts[(0, q)] for q in range(P)] == [N_BASE] * P
        for t, budget in enumerate(budgets, start=1):
            want = allocate_round(_rewards_by_prompt(plan.records, t), budget, alpha=0.05, lam=0.1)
            assert [counts[(t, q)] for q in range(P)] == want.tolist(), (t, want)
            assert plan.rounds[t]["alloc"] == want.tolist()
            nonuniform += int(want.max() - want.min() > 1)
        assert len(plan.records) == BUDGET
    assert nonuniform > 0  # the rounds were not all even splits


def test_icl_seeding_picks_the_unsolved_prompts_and_their_neighbours(xrpo_run):
    tok = xrpo_run["tok"]
    seeded_total = 0
    retrieved_before: dict = {}
    for s in xrpo_run["steps"]:
        rep = s["report"]
        plan = rep.plan
        plain = {x.problem_index: x.gen_prompt_ids for x in plan.records if x.round == 0}
        for t in range(1, ROUNDS + 1):
            rewards = _rewards_by_prompt(plan.records, t)
            alloc = plan.rounds[t]["alloc"]
            want = [
                q
                for q in range(P)
                if alloc[q] > 0 and not (rewards[q] >= 1.0).any() and retrieved_before.get(rep.problems[q].id)
            ]
            assert plan.rounds[t]["seeded"] == want, (t, plan.rounds[t]["seeded"], want)
            seeded_total += len(want)
            for x in (x for x in plan.records if x.round == t):
                assert x.seeded == (x.problem_index in want)
                assert x.train_prompt_ids == plain[x.problem_index]  # trained under the original prompt
                text = tok.decode(x.gen_prompt_ids)
                plain_text = tok.decode(plain[x.problem_index])
                if x.seeded:
                    shots = [
                        f"Q: {e.problem}\nA:{e.solution}" for e in retrieved_before[rep.problems[x.problem_index].id]
                    ]
                    assert text == "\n".join(shots) + "\n" + plain_text
                else:
                    assert text == plain_text
        retrieved_before = s["retrieved"]
        # every problem solved in this step is now in the corpus
        assert {rep.problems[x.problem_index].id for x in plan.records if x.reward >= 1} <= s["corpus_ids"]
    assert seeded_total >= 5


def test_advantages_are_grpo_plus_the_novelty_bonus_on_the_same_batch(xrpo_run):
    sharpened = sharpened_seeded = 0
    for s in xrpo_run["steps"]:
        rep = s["report"]
        plan = rep.plan
        rewards = np.array([x.reward for x in plan.records])
        groups = np.array([x.problem_index for x in plan.records])
        np.testing.assert_array_equal(plan.group_ids, groups)
        base = group_advantages(rewards, groups)
        lp, mask = np.zeros((len(rep.old_logprobs), 3)), np.zeros((len(rep.old_logprobs), 3), dtype=bool)
        for i, row in enumerate(rep.old_logprobs):
            assert len(row) == len(plan.records[i].completion_ids)
            lp[i, : len(row)], mask[i, : len(row)] = row, True
        want, m = sharpen_advantages(
            base, rewards, length_normalized_loglik(lp, mask), groups, lam_nov=2.5, kappa_clip=0.5
        )
        np.testing.assert_allclose(plan.advantages, want, rtol=1e-12, atol=1e-12)
        # which rollouts got a bonus, and how much
        bonus = plan.advantages - base
        hit = np.flatnonzero(bonus > 0)
        np.testing.assert_array_equal(hit, np.flatnonzero(want - base > 0))
        assert all(rewards[hit] >= 1.0)
        seeded = np.array([x.seeded for x in plan.records])
        metrics = rep.metrics
        assert metrics["adv/sharpened_count"] == len(hit) == m["adv/sharpened_count"]
        assert metrics["adv/sharpened_seeded_count"] == int(seeded[hit].sum())
        assert metrics["adv/sharpen_eligible_seeded"] == int((seeded & (rewards >= 1)).sum())
        sharpened += len(hit)
        sharpened_seeded += int(seeded[hit].sum())
        # the loss received exactly these advantages, one per rollout
        given = np.concatenate([c["adv"].numpy() for c in s["calls"]])
        np.testing.assert_array_equal(np.sort(given), np.sort(plan.advantages.astype(np.float32)))
    assert sharpened > 0 and sharpened_seeded > 0, (sharpened, sharpened_seeded)


@pytest.mark.parametrize("mode", ["sample", "exclude"])
def test_icl_novelty_scores_seeded_rollouts_as_configured(trainer_env, tmp_path, mode):
    # method.icl_novelty: "sample" scores an ICL-seeded rollout's s(y) under the ICL prompt it was sampled from (the
    # hf engine's log-probs at temperature 1), "exclude" leaves it out of sharpening
    checked = []

    def on_step(rep):
        plan = rep.plan
        rewards = np.array([x.reward for x in plan.records])
        groups = plan.group_ids
        moved = np.array([x.seeded and x.train_prompt_ids != x.gen_prompt_ids for x in plan.records])
        rows = [
            x.logprobs if (mode == "sample" and m) else old for x, old, m in zip(plan.records, rep.old_logprobs, moved)
        ]
        lp, mask = np.zeros((len(rows), 3)), np.zeros((len(rows), 3), dtype=bool)
        for i, r in enumerate(rows):
            lp[i, : len(r)], mask[i, : len(r)] = r, True
        base = group_advantages(rewards, groups)
        keep = ~moved if mode == "exclude" else np.ones(len(rows), dtype=bool)
        want = base.copy()
        want[keep], _ = sharpen_advantages(
            base[keep], rewards[keep], length_normalized_loglik(lp, mask)[keep], groups[keep]
        )
        np.testing.assert_allclose(plan.advantages, want, rtol=1e-12, atol=1e-12)
        checked.append(int((moved & (rewards >= 1) & (base > 0)).sum()))

    ov = trainer_env["learn_overrides"](tmp_path / mode, "xrpo", 4) + [f"method.icl_novelty={mode}"]
    train(build_config(None, ov), log=quiet, on_step=on_step)
    assert sum(checked) > 0, checked  # seeded correct rollouts in mixed groups, where the choice matters
