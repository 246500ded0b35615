"""The planner (Algorithm 1) on a scripted policy with known success probabilities, and on a tiny random model.

The scripted policy is a real `RolloutEngine` whose answer is right with a fixed probability per problem (higher from
an ICL prompt); that makes the allocation checkable against the known rates.
"""

from __future__ import annotations

import numpy as np
import pytest

from xrpo.algo.advantages import group_advantages
from xrpo.data import Problem
from xrpo.icl import ICLCorpus, get_embedder
from xrpo.rollout.engine import SamplingParams
from xrpo.rollout.planner import generate_rollouts
from xrpo.rollout.prompts import PromptRenderer
from xrpo.rollout.records import PlanConfig

from ._fakes import (
    SAMPLING,
    CharTokenizer,
    ScriptedPolicy,
    char_rollout,
    plan_rollouts,
    problems_and_rates,
    renderer,
)
from ._fakes import record as _record
from ._fakes import result as _result


def test_budget_spent_exactly_and_groups_keep_their_prompt(verifier):
    probs, pp, pi = problems_and_rates()
    cfg = PlanConfig(rollouts_per_step=128, n_base=4, plan_rounds=2, icl=False, sharpen=False)
    res = generate_rollouts(probs, ScriptedPolicy(probs, pp, pi), verifier, renderer(), cfg, SAMPLING)
    assert len(res.records) == 128
    # base round 4 x 16 = 64, then 32 + 32
    assert [sum(r["alloc"]) for r in res.rounds] == [64, 32, 32]
    for x in res.records:
        assert x.group_id == x.problem_index
        assert x.reward == (1.0 if x.text == f" \\boxed{{{probs[x.problem_index].answer}}}" else 0.0)
    sizes = np.bincount(res.group_ids, minlength=16)
    assert sizes.sum() == 128 and sizes.min() >= 4


def test_mid_success_prompts_get_more_extra_rollouts_than_solved_ones(verifier):
    probs, pp, pi = problems_and_rates()
    cfg = PlanConfig(rollouts_per_step=128, n_base=4, plan_rounds=2, icl=False, sharpen=False)
    extra = np.zeros(16)
    for seed in range(20):
        res = generate_rollouts(probs, ScriptedPolicy(probs, pp, pi, seed=seed), verifier, renderer(), cfg, SAMPLING)
        extra += np.bincount(res.group_ids, minlength=16) - 4
    solved, never, mid = extra[:4].mean(), extra[4:8].mean(), extra[8:].mean()
    # all-solved and never-solved prompts have s_q = 0: only the exploration bonus phi_q reaches them. In round 1 a
    # 2-of-4 prompt has Pi = 0.577 * (3.182/2 - 2.776/sqrt(5)) + 0.1 * sqrt(log(33)/4) = 0.202 + 0.094 = 0.296
    # against 0.094: about 3x the rollouts; in round 2 its n_q has grown, and 12.5% of mid prompts look all-equal
    # after 4 base rollouts, so over the step the measured ratio is about 1.7
    assert mid > 1.3 * solved
    assert mid > 1.3 * never
    # same n_q and zero variance -> same priority; only largest-remainder ties (broken by prompt order, and the solved
    # prompts come first) separate them: less than half a rollout per prompt per step
    assert abs(solved - never) / 20 < 0.5


def test_uniform_ablation_splits_evenly(verifier):
    probs, pp, pi = problems_and_rates()
    cfg = PlanConfig(rollouts_per_step=128, n_base=4, plan_rounds=2, allocation="uniform", icl=True, sharpen=False)
    res = generate_rollouts(probs, ScriptedPolicy(probs, pp, pi), verifier, renderer(), cfg, SAMPLING)
    assert [r["alloc"] for r in res.rounds[1:]] == [[2] * 16, [2] * 16]
    assert not any(r["nonuniform"] for r in res.rounds[1:])


def test_grpo_path_is_one_engine_call(verifier):
    probs, pp, pi = problems_and_rates()
    engine = ScriptedPolicy(probs, pp, pi)
    cfg = PlanConfig(rollouts_per_step=128, n_base=4, plan_rounds=2, allocation="uniform", icl=False, sharpen=False)
    res = generate_rollouts(probs, engine, verifier, renderer(), cfg, SAMPLING)
    assert len(engine.calls) == 1 and engine.calls[0][1] == [8] * 16
    assert len(res.records) == 128


@pytest.mark.parametrize("allocation,icl", [("hrp", True), ("uniform", False), ("cures", False)])
def test_rounds_record_problem_ids_and_successes_per_prompt(verifier, allocation, icl):
    # rounds.jsonl must let a reader recover per-prompt success rates (xrpo simulate --rounds-file): every round
    # names its problems and counts each prompt's correct rollouts of that round
    probs, pp, pi = problems_and_rates()
    cfg = PlanConfig(rollouts_per_step=128, n_base=4, plan_rounds=2, allocation=allocation, icl=icl, sharpen=False)
    counts = [8] * 16 if allocation == "cures" else None
    res = generate_rollouts(
        probs,
        ScriptedPolicy(probs, pp, pi, seed=3),
        verifier,
        renderer(),
        cfg,
        SAMPLING,
        corpus=seeded_corpus(probs) if icl else None,
        counts=counts,
    )
    assert len(res.rounds) == (3 if allocation == "hrp" else 1)
    for r in res.rounds:
        assert r["problems"] == [p.id for p in probs]
        in_round = [x for x in res.records if x.round == r["round"]]
        assert r["alloc"] == [sum(x.problem_index == q for x in in_round) for q in range(16)]
        assert r["successes"] == [sum(x.problem_index == q and x.reward >= 1.0 for x in in_round) for q in range(16)]
    total = np.sum([r["successes"] for r in res.rounds], axis=0)
    # the always-solved prompts succeed on every rollout, the never-solved ones only from an ICL prompt
    sizes = np.bincount(res.group_ids, minlength=16)
    np.testing.assert_array_equal(total[:4], sizes[:4])
    if not icl:
        assert total[4:8].sum() == 0
    if icl:
        assert res.rounds[1]["flips"] == sum(res.rounds[1]["successes"][q] > 0 for q in res.rounds[1]["seeded"])


def seeded_corpus(probs):
    corpus = ICLCorpus(get_embedder("hash"))
    # solutions of the always-solved problems are in the corpus (as after a first step)
    for p in probs[:4]:
        corpus.add(p.id, p.text, f" \\boxed{{{p.answer}}}", 0)
    return corpus


def _unsolved_before(res, rnd: int) -> set[int]:
    """Prompts without a correct rollout in the rounds before ``rnd``."""
    solved = {x.problem_index for x in res.records if x.round < rnd and x.reward >= 1}
    return set(range(16)) - solved


def test_zero_success_prompts_are_icl_seeded_and_flip(verifier):
    probs, pp, pi = problems_and_rates()
    corpus = seeded_corpus(probs)
    cfg = PlanConfig(rollouts_per_step=128, n_base=4, plan_rounds=2, icl=True, sharpen=False)
    engine = ScriptedPolicy(probs, pp, pi)
    res = generate_rollouts(probs, engine, verifier, renderer(), cfg, SAMPLING, corpus=corpus)
    # in each round exactly the prompts still unsolved that were allocated rollouts; the never-solved ones (4-7) all
    # got rollouts in round 1 (a zero-variance prompt's exploration bonus alone buys it one of the 32)
    for t in (1, 2):
        alloc = res.rounds[t]["alloc"]
        assert res.rounds[t]["seeded"] == sorted(q for q in _unsolved_before(res, t) if alloc[q] > 0)
    seeded = set(res.rounds[1]["seeded"])
    assert set(range(4, 8)) <= seeded
    # the ICL prompt holds examples from the corpus and ends with the plain prompt
    icl_prompts = [p for p in engine.calls[1][0] if p.count("Q: ") > 1]
    assert len(icl_prompts) == len(seeded)
    assert all(p.endswith("\nA:") for p in icl_prompts)
    # seeded rollouts are trained under the ORIGINAL prompt by default
    plain_ids = {x.problem_index: x.gen_prompt_ids for x in res.records if x.round == 0}
    for x in res.records:
        assert x.train_prompt_ids == plain_ids[x.problem_index]
        if x.seeded:
            assert x.gen_prompt_ids != x.train_prompt_ids
    flips = sum(
        any(x.reward >= 1 for x in res.records if x.round == r["round"] and x.problem_index == q)
        for r in res.rounds[1:]
        for q in r["seeded"]
    )
    assert flips == sum(r["flips"] for r in res.rounds[1:]) == res.metrics["icl/flips"]
    assert res.metrics["icl/seeded_prompts"] == len(res.rounds[1]["seeded"]) + len(res.rounds[2]["seeded"])
    assert (
        res.metrics["icl/seeded_rollouts"]
        == sum(r["alloc"][q] for r in res.rounds[1:] for q in r["seeded"])
        == sum(x.seeded for x in res.records)
    )


def test_flips_over_seeds(verifier):
    probs, pp, pi = problems_and_rates()
    cfg = PlanConfig(rollouts_per_step=128, n_base=4, plan_rounds=2, icl=True, sharpen=False)
    flips = expected = var = 0.0
    for seed in range(10):
        res = generate_rollouts(
            probs,
            ScriptedPolicy(probs, pp, pi, seed=seed),
            verifier,
            renderer(),
            cfg,
            SAMPLING,
            corpus=seeded_corpus(probs),
        )
        flips += res.metrics["icl/flips"]
        for r in res.rounds[1:]:
            for q in r["seeded"]:
                # a seeded prompt flips when one of its alloc ICL rollouts (each right with p_icl) is right
                p = 1 - (1 - pi[q]) ** r["alloc"][q]
                expected, var = expected + p, var + p * (1 - p)
    # measured against the scripted policy's rates: within 4 standard deviations of the expected count
    assert expected > 20
    assert abs(flips - expected) <= 4 * var**0.5, (flips, expected, var**0.5)


def test_icl_train_prompt_option(verifier):
    probs, pp, pi = problems_and_rates()
    cfg = PlanConfig(rollouts_per_step=128, icl=True, sharpen=False, icl_train_prompt="icl")
    res = generate_rollouts(
        probs, ScriptedPolicy(probs, pp, pi), verifier, renderer(), cfg, SAMPLING, corpus=seeded_corpus(probs)
    )
    assert any(x.seeded for x in res.records)
    for x in res.records:
        assert x.train_prompt_ids == x.gen_prompt_ids


def test_no_icl_without_corpus_entries(verifier):
    probs, pp, pi = problems_and_rates()
    cfg = PlanConfig(rollouts_per_step=128, icl=True, sharpen=False)
    empty = ICLCorpus(get_embedder("hash"))
    res = generate_rollouts(probs, ScriptedPolicy(probs, pp, pi), verifier, renderer(), cfg, SAMPLING, corpus=empty)
    assert not any(x.seeded for x in res.records)


def test_advantages_and_corpus_update(verifier):
    probs, pp, pi = problems_and_rates()
    corpus = ICLCorpus(get_embedder("hash"))
    cfg = PlanConfig(rollouts_per_step=128, icl=True, sharpen=True)
    res = plan_rollouts(
        probs, ScriptedPolicy(probs, pp, pi), verifier, renderer(), cfg, SAMPLING, corpus=corpus, step=3
    )
    base = group_advantages(res.rewards, res.group_ids)
    # sharpening only ever raises correct rollouts' advantages, never touches wrong ones
    wrong = res.rewards < 1
    np.testing.assert_array_equal(res.advantages[wrong], base[wrong])
    assert np.all(res.advantages[~wrong] >= base[~wrong])
    assert res.metrics["adv/sharpened_count"] > 0
    solved = {probs[x.problem_index].id for x in res.records if x.reward == 1}
    assert len(corpus) == len(solved)


def test_bad_config():
    with pytest.raises(ValueError, match="n_base"):
        PlanConfig(n_base=1)
    with pytest.raises(ValueError, match="allocation"):
        PlanConfig(allocation="random")
    with pytest.raises(ValueError, match="icl_train_prompt"):
        PlanConfig(icl_train_prompt="both")


def test_planner_on_tiny_random_model(tiny_model, tiny_tokenizer, verifier):
    from xrpo.algo.advantages import length_normalized_loglik, sharpen_advantages
    from xrpo.algo.allocation import allocate_round
    from xrpo.rollout.hf_engine import HFEngine

    probs, _, _ = problems_and_rates()
    engine = HFEngine(tiny_model, tiny_tokenizer)
    rend = PromptRenderer(
        tiny_tokenizer,
        use_chat_template=False,
        icl_style="fewshot",
        prompt_template="Q: {prompt}\nA:",
        fewshot_example="Q: {problem}\nA:{solution}",
    )
    corpus = seeded_corpus(probs)
    retrieved = corpus.retrieve_many([p.id for p in probs[:8]], [p.text for p in probs[:8]], k=2)
    cfg = PlanConfig(rollouts_per_step=48, n_base=2, plan_rounds=2, icl=True, sharpen=True)
    res = plan_rollouts(probs[:8], engine, verifier, rend, cfg, SamplingParams(max_new_tokens=6, seed=0), corpus=corpus)
    assert len(res.records) == 48
    for x in res.records:
        assert len(x.completion_ids) == len(x.logprobs) >= 1
        assert x.reward == verifier.verify_batch([x.text], [probs[x.problem_index].answer])[0].score
        # a seeded rollout was sampled from the neighbours' fewshot prompt, and is trained under the plain one
        plain = rend.render(probs[x.problem_index])
        want = rend.render_icl(probs[x.problem_index], retrieved[x.problem_index]).text if x.seeded else plain
        assert tiny_tokenizer.decode(x.gen_prompt_ids) == want
        assert tiny_tokenizer.decode(x.train_prompt_ids) == plain
    # a random model never solves these: every prompt is unsolved, so all extra rollouts come from ICL prompts, and the
    # planning rounds split their budgets by the priority of the zero rewards so far (the exploration bonus alone)
    assert all(x.seeded for x in res.records if x.round > 0) and any(x.round > 0 for x in res.records)
    for t, budget in ((1, 16), (2, 16)):
        so_far = [np.array([x.reward for x in res.records if x.round < t and x.problem_index == q]) for q in range(8)]
        assert res.rounds[t]["alloc"] == allocate_round(so_far, budget, alpha=0.05, lam=0.1).tolist()
    # advantages: all rewards 0, so GRPO gives 0 and sharpening has no correct rollout to adjust
    T = max(len(x.logprobs) for x in res.records)
    lp, mask = np.zeros((48, T)), np.zeros((48, T), dtype=bool)
    for i, x in enumerate(res.records):
        lp[i, : len(x.logprobs)], mask[i, : len(x.logprobs)] = x.logprobs, True
    want, _ = sharpen_advantages(
        group_advantages(res.rewards, res.group_ids), res.rewards, length_normalized_loglik(lp, mask), res.group_ids
    )
    np.testing.assert_array_equal(res.advantages, want)
    assert not res.advantages.any() and res.metrics["adv/sharpened_count"] == 0


# ---------------------------------------------------------------------------------------------------------------
# allocation="cures": the caller's counts (CurES chooses them) in one engine call
# ---------------------------------------------------------------------------------------------------------------


def test_fixed_counts_are_one_engine_call(verifier):
    probs, pp, pi = problems_and_rates()
    engine = ScriptedPolicy(probs[:4], pp[:4], pi[:4])
    # n_base=4 would need 16 rollouts for 4 prompts: fixed counts have no base phase, so 10 rollouts are fine
    cfg = PlanConfig(rollouts_per_step=10, n_base=4, allocation="cures", icl=False, sharpen=False)
    res = generate_rollouts(probs[:4], engine, verifier, renderer(), cfg, SAMPLING, counts=[2, 5, 0, 3])
    assert len(engine.calls) == 1 and engine.calls[0][1] == [2, 5, 0, 3]
    assert np.bincount(res.group_ids, minlength=4).tolist() == [2, 5, 0, 3]
    assert res.rounds == [
        {
            "round": 0,
            "alloc": [2, 5, 0, 3],
            "seeded": [],
            "flips": 0,
            "truncated": 0,
            "problems": ["p0", "p1", "p2", "p3"],
            "successes": [2, 5, 0, 3],
        }
    ]
    assert res.metrics["rollout/count"] == 10 and res.metrics["alloc/rounds"] == 0


def test_fixed_counts_bad_input(verifier):
    probs, pp, pi = problems_and_rates()
    engine = ScriptedPolicy(probs[:2], pp[:2], pi[:2])
    cfg = PlanConfig(rollouts_per_step=6, allocation="cures", icl=False)
    with pytest.raises(ValueError, match="needs counts"):
        generate_rollouts(probs[:2], engine, verifier, renderer(), cfg, SAMPLING)
    with pytest.raises(ValueError, match="counts sum to 5, not rollouts_per_step=6"):
        generate_rollouts(probs[:2], engine, verifier, renderer(), cfg, SAMPLING, counts=[2, 3])
    with pytest.raises(ValueError, match="2 integers >= 0"):
        generate_rollouts(probs[:2], engine, verifier, renderer(), cfg, SAMPLING, counts=[7, -1])
    with pytest.raises(ValueError, match="2 integers >= 0"):
        generate_rollouts(probs[:2], engine, verifier, renderer(), cfg, SAMPLING, counts=[6])
    with pytest.raises(ValueError, match="only used with allocation='cures'"):
        generate_rollouts(
            probs[:2],
            engine,
            verifier,
            renderer(),
            PlanConfig(rollouts_per_step=8, n_base=4, icl=False),
            SAMPLING,
            counts=[4, 4],
        )
    with pytest.raises(ValueError, match="config field icl must be false with allocation=cures"):
        PlanConfig(allocation="cures", icl=True)
    assert engine.calls == []


# ---------------------------------------------------------------------------------------------------------------
# guards and metric meanings
# ---------------------------------------------------------------------------------------------------------------


def test_solved_prompt_frac_counts_rewards_at_or_above_full_reward():
    from xrpo.rollout.step import rollout_metrics

    res = _result([_record(0, 0.7, "a"), _record(0, 0.0, "b"), _record(1, 0.4, "c"), _record(1, 0.4, "d")])
    res.rounds = [{"round": 0, "alloc": [2, 2], "seeded": [], "flips": 0, "truncated": 0}]
    assert rollout_metrics(res, 2)["rollout/solved_prompt_frac"] == 0.0
    assert rollout_metrics(res, 2, full_reward=0.5)["rollout/solved_prompt_frac"] == 0.5
    assert rollout_metrics(res, 2, full_reward=0.4)["rollout/solved_prompt_frac"] == 1.0


def test_truncated_and_dropped_examples_mean_the_same_in_both_icl_styles():
    from xrpo.icl import Example

    probs, _, _ = problems_and_rates()
    long = Example("p9", "9 + 9 = ?", " " + "x" * 1000 + " \\boxed{18}", 0.9)
    short = Example("p8", "8 + 8 = ?", " \\boxed{16}", 0.8)
    for style, example in (("paper", "{problem}\n{solution}"), ("fewshot", "Q: {problem}\nA:{solution}")):
        rend = PromptRenderer(
            CharTokenizer(),
            use_chat_template=False,
            icl_style=style,
            prompt_template="Q: {prompt}\nA:",
            fewshot_example=example,
            max_prompt_tokens=800,
        )
        icl = rend.render_icl(probs[1], [short, long])
        if style == "paper":
            # the paper's template cuts the long solution to fit and keeps both examples
            assert (icl.truncated, icl.dropped, icl.num_examples) == (1, 0, 2)
            assert "x" * 1000 not in icl.text and " \\boxed{16}" in icl.text
        else:
            # fewshot never cuts a solution: it leaves the less similar example out
            assert (icl.truncated, icl.dropped, icl.num_examples) == (0, 1, 1)
            assert icl.text == "Q: 8 + 8 = ?\nA: \\boxed{16}\nQ: 1 + 1 = ?\nA:"
        assert len(icl.text) <= 800


# ---------------------------------------------------------------------------------------------------------------
# the allocation simulator (xrpo simulate) runs the planner's allocation
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "allocation,mode,icl,cap",
    [
        ("hrp", "proportional", True, None),
        ("hrp", "greedy", True, None),
        ("hrp", "proportional", False, 3),
        ("uniform", "proportional", True, None),
    ],
)
@pytest.mark.parametrize("seed", range(3))
def test_simulator_allocation_equals_the_planners_on_the_same_rewards(verifier, allocation, mode, icl, cap, seed):
    from xrpo.sim.model import phased_step

    probs = [Problem(id=f"p{i}", prompt=f"{i} + {i} = ?", answer=str(2 * i)) for i in range(12)]
    rng = np.random.default_rng(seed)
    pp = [0.0, 0.0, 1.0] + list(np.round(rng.random(9), 2))
    pi = [0.6, 0.0, 1.0] + pp[3:]
    cfg = PlanConfig(
        rollouts_per_step=100,
        n_base=3,
        plan_rounds=3,
        allocation=allocation,
        alloc_mode=mode,
        lam=0.1,
        alpha=0.05,
        max_extra_per_prompt=cap,
        icl=icl,
        sharpen=False,
    )
    res = generate_rollouts(
        probs,
        ScriptedPolicy(probs, pp, pi, seed=seed),
        verifier,
        renderer(),
        cfg,
        SAMPLING,
        corpus=seeded_corpus(probs[2:3]) if icl else None,
    )

    def replay(idx, counts, seeded, rnd):
        # the planner's rewards of this round, per prompt, in generation order; the simulator must ask for exactly the
        # counts the planner allocated and seed exactly the prompts the planner seeded
        out = []
        for q, c in zip(idx, counts):
            r = [x for x in res.records if x.round == rnd and x.problem_index == q]
            assert len(r) == c, f"round {rnd} prompt {q}: simulator allocated {c}, planner {len(r)}"
            assert all(x.seeded == bool(seeded[q]) for x in r)
            out.append(np.array([x.reward for x in r]))
        return out

    sim = phased_step(
        12,
        100,
        replay,
        n_base=3,
        rounds=3,
        allocation=allocation,
        mode=mode,
        alpha=0.05,
        lam=0.1,
        max_per_prompt=cap,
        icl=icl,
    )
    assert [a.tolist() for a in sim.allocs] == [r["alloc"] for r in res.rounds]
    assert [np.flatnonzero(s).tolist() for s in sim.seeded] == [r["seeded"] for r in res.rounds]
    assert [s.tolist() for s in sim.successes] == [r["successes"] for r in res.rounds]
    assert sim.nonuniform == [r["nonuniform"] for r in res.rounds[1:]]
    if icl:
        assert any(r["seeded"] for r in res.rounds)  # the case is exercised


class PerPromptSeeds:
    """Seeds as vLLM does: the request of prompt i in a call draws from (seed, i), its j-th rollout from that + j."""

    def generate(self, prompts, counts, params):
        out = []
        for i, (prompt, n) in enumerate(zip(prompts, counts)):
            rollouts = []
            for j in range(n):
                rng = np.random.default_rng([params.seed, i, j])
                text = " " + "".join(rng.choice(list("0123456789"), size=12))
                rollouts.append(char_rollout(prompt, text, [-1.0] * len(text)))
            out.append(rollouts)
        return out

    def sync_weights(self, model):
        pass


def test_planning_rounds_do_not_redraw_the_base_rollouts_of_an_engine_seeded_per_prompt(verifier):
    # each round samples with its own seed: with the step's seed in every round, an engine that seeds prompt i's
    # request from (seed, i) (vLLM) gave every extra rollout of a prompt the text of one of its base rollouts
    probs, _, _ = problems_and_rates()
    cfg = PlanConfig(rollouts_per_step=128, n_base=4, plan_rounds=2, icl=False, sharpen=False)
    res = generate_rollouts(
        probs, PerPromptSeeds(), verifier, renderer(), cfg, SamplingParams(max_new_tokens=12, seed=7)
    )
    base = {(x.problem_index, x.text) for x in res.records if x.round == 0}
    extra = [x for x in res.records if x.round > 0]
    assert len(extra) == 64 and not any((x.problem_index, x.text) in base for x in extra)
    assert len({(x.problem_index, x.text) for x in res.records}) == 128  # and no round repeats another


# ---------------------------------------------------------------------------------------------------------------
# what a generated-mutant survey of planner.py found unchecked
# ---------------------------------------------------------------------------------------------------------------


def test_one_prompt_is_a_step_and_no_prompt_is_refused(verifier):
    probs, pp, pi = problems_and_rates()
    cfg = PlanConfig(rollouts_per_step=8, n_base=4, plan_rounds=1, icl=False, sharpen=False)
    res = generate_rollouts(probs[:1], ScriptedPolicy(probs[:1], pp[:1], pi[:1]), verifier, renderer(), cfg, SAMPLING)
    assert len(res.records) == 8 and set(res.group_ids.tolist()) == {0}
    with pytest.raises(ValueError, match="^problems is empty$"):
        generate_rollouts([], ScriptedPolicy(probs, pp, pi), verifier, renderer(), cfg, SAMPLING)


def test_history_of_the_wrong_length_is_refused(verifier):
    from xrpo.algo.rounds import PromptHistory

    probs, pp, pi = problems_and_rates()
    cfg = PlanConfig(rollouts_per_step=64, n_base=4, plan_rounds=0, allocation="knapsack", icl=False, sharpen=False)
    ok = np.zeros(16, dtype=np.int64)
    # any array one short, the reward window's too (Knapsack RL's authors' rule reads it)
    for history in (
        PromptHistory(ok[:15], ok),
        PromptHistory(ok, ok[:15]),
        PromptHistory(ok, ok, ok, ok, ok[:15]),
        PromptHistory(ok, ok, ok[:15], ok, ok),
    ):
        with pytest.raises(ValueError, match=r"history must hold 16 prompts' successes and trials"):
            generate_rollouts(
                probs, ScriptedPolicy(probs, pp, pi), verifier, renderer(), cfg, SAMPLING, history=history
            )
    # of the right length it is used (knapsack reads it): no error
    full = PromptHistory(ok, ok, ok, ok, ok)
    generate_rollouts(probs, ScriptedPolicy(probs, pp, pi), verifier, renderer(), cfg, SAMPLING, history=full)


def test_streaming_is_not_used_for_a_step_that_has_nothing_to_plan(verifier):
    # GRPO with planner=streaming: one batch, as with rounds (a streaming row has "members" and "stage")
    probs, pp, pi = problems_and_rates()
    engine = ScriptedPolicy(probs, pp, pi)
    cfg = PlanConfig(
        rollouts_per_step=64,
        n_base=4,
        plan_rounds=2,
        allocation="uniform",
        icl=False,
        sharpen=False,
        planner="streaming",
    )
    res = generate_rollouts(probs, engine, verifier, renderer(), cfg, SAMPLING)
    assert len(engine.calls) == 1 and len(res.rounds) == 1
    assert "members" not in res.rounds[0] and "stage" not in res.rounds[0]
    # nothing drawn from an ICL prompt in a one-batch step
    assert res.rounds[0]["seeded"] == [] and not any(x.seeded for x in res.records)


@pytest.mark.parametrize("allocation, icl", [("hrp", False), ("uniform", False), ("hrp", True)])
def test_step_timings_are_non_negative_and_within_the_call(verifier, allocation, icl):
    import time

    probs, pp, pi = problems_and_rates()
    # 16 prompts x 4 base rollouts, then 64 more over two planning rounds (hrp) or one batch of 128 (uniform)
    cfg = PlanConfig(rollouts_per_step=128, n_base=4, plan_rounds=2, allocation=allocation, icl=icl, sharpen=False)
    corpus = seeded_corpus(probs) if icl else None
    t0 = time.perf_counter()
    res = generate_rollouts(probs, ScriptedPolicy(probs, pp, pi), verifier, renderer(), cfg, SAMPLING, corpus=corpus)
    wall = time.perf_counter() - t0
    timings = {k: v for k, v in res.metrics.items() if k.startswith("time/")}
    assert timings.keys() == {"time/generate", "time/verify", "time/plan", "time/retrieve"}
    # each phase's time is a part of the call's: >= 0, and together no more than the call took
    assert all(v >= 0 for v in timings.values()) and sum(timings.values()) <= wall
    assert timings["time/generate"] > 0
    assert len(res.rounds) == (3 if allocation == "hrp" else 1)
    # the never-solved prompts are seeded from the corpus: retrieval ran (and only then)
    assert (timings["time/retrieve"] > 0) == icl and (res.metrics["icl/seeded_prompts"] > 0) == icl


def test_a_round_of_one_rollout_is_planned(verifier):
    # 2 prompts x 4 base rollouts + 1 = 9: the one planning round has a budget of 1 rollout, which it places
    probs, pp, pi = problems_and_rates()
    cfg = PlanConfig(rollouts_per_step=9, n_base=4, plan_rounds=1, icl=False, sharpen=False)
    res = generate_rollouts(probs[:2], ScriptedPolicy(probs[:2], pp[:2], pi[:2]), verifier, renderer(), cfg, SAMPLING)
    assert [sum(r["alloc"]) for r in res.rounds] == [8, 1] and len(res.records) == 9


def test_keyword_only_arguments_after_sampling(verifier):
    probs, pp, pi = problems_and_rates()
    cfg = PlanConfig(rollouts_per_step=64, n_base=4, plan_rounds=2, icl=False, sharpen=False)
    with pytest.raises(TypeError):
        generate_rollouts(probs, ScriptedPolicy(probs, pp, pi), verifier, renderer(), cfg, SAMPLING, None)


def test_round_sampling_seeds_each_planning_round_apart():
    import dataclasses

    from xrpo.rollout.step import round_sampling

    seeded = dataclasses.replace(SAMPLING, seed=5)
    # round 0 samples with the step's parameters; an unseeded step stays unseeded in every round
    assert round_sampling(seeded, 0) is seeded
    assert all(round_sampling(dataclasses.replace(SAMPLING, seed=None), r).seed is None for r in range(4))
    # rounds 1, 2, ... get seeds of their own, drawn from (seed, round): reproducible, distinct, non-negative int32
    seeds = [round_sampling(seeded, r).seed for r in range(1, 40)]
    assert seeds == [round_sampling(seeded, r).seed for r in range(1, 40)]
    assert len(set(seeds + [5])) == 40 and all(0 <= s < 2**31 for s in seeds)
    assert round_sampling(seeded, 1).temperature == seeded.temperature  # only the seed changes


def test_planning_rounds_without_icl_cut_and_drop_no_examples(verifier):
    probs, pp, pi = problems_and_rates()
    cfg = PlanConfig(rollouts_per_step=128, n_base=4, plan_rounds=2, icl=False, sharpen=False)
    res = generate_rollouts(probs, ScriptedPolicy(probs, pp, pi), verifier, renderer(), cfg, SAMPLING)
    assert [(r["truncated"], r["dropped"], r["seeded"]) for r in res.rounds[1:]] == [(0, 0, [])] * 2
