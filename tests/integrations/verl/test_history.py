"""Each prompt's last visit on verl: `RayXRPOTrainer` keeps the history `xrpo train` keeps for the allocators that
read it (knapsack, xrpo-plus; for Knapsack RL's authors' rule also each prompt's latest rewards across visits), hands
it to the round planner, logs ``alloc/history_frac`` and saves it with verl's checkpoint.

The driver runs as in test_trainer.py (verl's real agent loop and reward loop in this process, a tiny Llama in place
of the vLLM server, no Ray): two steps over the same four prompts, the second a revisit (an epoch later, as verl's
dataloader would hand them again), planned from the history the trainer builds from the first step's outcomes.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("verl")

from xrpo.algo.allocation import plan_phases  # noqa: E402
from xrpo.algo.knapsack_rl import authors_allocation, recent_rate  # noqa: E402
from xrpo.algo.rounds import batch_counts, history_window, one_batch_counts, plan_round  # noqa: E402
from xrpo.algo.visits import last_visit_state, visit_history  # noqa: E402
from xrpo.integrations.verl.phases import (  # noqa: E402
    HISTORY_FILE,
    ROUND_KEY,
    SEEDED_KEY,
    VisitHistory,
    plan_result,
    rewards_by_prompt,
)
from xrpo.rollout.cures import observe_visit  # noqa: E402

from .test_trainer import PROMPTS, _build, _rewards, _step_inputs  # noqa: E402

# 4 prompts x 8 rollouts: xrpo-plus has 2 base rollouts each (8), then two planning rounds of 12
N = 8
BUDGET = PROMPTS * N


def _trainer(tmp_path, llama, allocation, *more, seed=0):
    trainer, _ = _build(
        tmp_path,
        llama,
        f"algorithm.xrpo.allocation={allocation}",
        "algorithm.xrpo.icl=false",
        f"actor_rollout_ref.rollout.n={N}",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        *more,
        seed=seed,
    )
    return trainer


def _step(trainer):
    """One step's driver side as `fit` runs it: rollouts, the step's PlanResult, the history update."""
    batch, gen, uids = _step_inputs(trainer)
    metrics: dict = {}
    merged, rounds = trainer._xrpo_rollouts(batch, gen, {}, metrics)
    result, _ = plan_result(merged, uids, rounds, trainer.tokenizer, trainer.xrpo.full_reward)
    trainer._observe_visits(result)
    return merged, rounds, uids, result, metrics


@pytest.mark.parametrize("allocation", ["knapsack", "xrpo-plus"])
def test_a_revisit_is_planned_from_the_trainers_history(tmp_path, tiny_llama_dir, allocation):
    trainer = _trainer(tmp_path, tiny_llama_dir, allocation)
    x = trainer.xrpo
    assert isinstance(trainer.history, VisitHistory) and trainer.history.state.keep == "last"
    assert trainer.history.state.num_problems == 8  # the training set's rows (test_trainer.py writes 8 problems)

    # -------- step 1: every prompt new, the allocators plan as for no history
    merged1, rounds1, uids1, result1, m1 = _step(trainer)
    assert m1 == {"alloc/history_frac": 0.0}
    ids = rounds1[0]["problems"]
    assert ids == [f"p{i}" for i in range(PROMPTS)]
    if allocation == "knapsack":  # Knapsack RL, no ICL: one batch; with no history an even split, GRPO's
        assert len(rounds1) == 1 and rounds1[0]["alloc"] == one_batch_counts(PROMPTS, BUDGET).tolist()

    # the history the trainer would have built from these outcomes: its own state and rule, indexed as xrpo train
    # indexes it (the training set's positions: p_i is row i)
    trainer_state = last_visit_state(8, history_window(x))
    assert trainer.history.state.window == history_window(x) == (16 if allocation == "knapsack" else 0)
    observe_visit(trainer_state, [0, 1, 2, 3], result1, x.full_reward)
    expected, _ = visit_history(trainer_state, [0, 1, 2, 3])
    # ... which is each prompt's count of correct rollouts and its rollouts in step 1 (no ICL: none seeded)
    r1 = _rewards(merged1)
    row_uid = merged1.non_tensor_batch["uid"]
    assert expected.successes.tolist() == [int((r1[row_uid == u] >= 1).sum()) for u in uids1]
    assert expected.trials.tolist() == [int((row_uid == u).sum()) for u in uids1]
    assert sum(expected.trials) == BUDGET and 0 < sum(expected.successes) < BUDGET

    # -------- step 2: the same prompts again (new uids), planned from their last visit
    merged2, rounds2, uids2, _, m2 = _step(trainer)
    assert rounds2[0]["problems"] == ids and m2 == {"alloc/history_frac": 1.0}
    # whether the history moves a revisit's plan depends on what was sampled (knapsack: not when step 1's outcomes
    # give every prompt the same value; xrpo-plus plans each round from the step's own outcomes too, and the history
    # moves a round in about 3 revisits of 4 here): revisit until it has, checking the plan every time
    phases = plan_phases(PROMPTS, BUDGET, x.n_base, x.plan_rounds)
    for revisit in range(1, 9):
        if revisit > 1:  # the last visit is now the previous step's
            observe_visit(
                trainer_state, [0, 1, 2, 3], plan_result(merged2, uids2, rounds2, trainer.tokenizer, 1.0)[0], 1.0
            )
            expected, _ = visit_history(trainer_state, [0, 1, 2, 3])
            merged2, rounds2, uids2, _, m2 = _step(trainer)
            assert rounds2[0]["problems"] == ids and m2 == {"alloc/history_frac": 1.0}
        moved = 0
        if allocation == "knapsack":
            want = batch_counts(x, PROMPTS, BUDGET, expected)
            # the authors' rule on each prompt's latest rewards (8 per visit: a rate from the first revisit on)
            rate, valid = recent_rate(*expected, window=16, min_rewards=8)
            assert valid.all() and want.tolist() == authors_allocation(rate, valid, BUDGET).tolist()
            assert len(rounds2) == 1 and rounds2[0]["alloc"] == want.tolist(), revisit
            moved += want.tolist() != one_batch_counts(PROMPTS, BUDGET).tolist()
        else:
            assert [sum(r["alloc"]) for r in rounds2] == [PROMPTS * x.n_base, *phases.round_budgets]
            r2 = _rewards(merged2)
            rnd = merged2.non_tensor_batch[ROUND_KEY]
            for t, budget in enumerate(phases.round_budgets, start=1):
                keep = rnd < t
                so_far = rewards_by_prompt(merged2.non_tensor_batch["uid"][keep], r2[keep], uids2)
                want = plan_round(so_far, budget, x, icl=False, full_reward=x.full_reward, history=expected).alloc
                assert rounds2[t]["alloc"] == want.tolist(), (revisit, t)
                plain = plan_round(so_far, budget, x, icl=False, full_reward=x.full_reward).alloc
                moved += want.tolist() != plain.tolist()
        if moved:
            break
    assert moved >= 1  # precondition: some revisit is planned otherwise without the history (it fails when dropped)

    # after the last step each prompt's last visit is that step's
    observe_visit(trainer_state, [0, 1, 2, 3], plan_result(merged2, uids2, rounds2, trainer.tokenizer, 1.0)[0], 1.0)
    after, _ = trainer.history.before(ids)
    assert after.trials.tolist() == trainer_state.trials[:4].tolist()
    assert after.successes.tolist() == trainer_state.successes[:4].tolist()


def test_icl_seeded_rollouts_are_left_out_of_the_history(tmp_path, tiny_llama_dir):
    # math verifier: the random model never answers, so every prompt stays unsolved and its planning-round rollouts
    # are ICL-seeded from the corpus (room for the paper's template: test_trainer.py's ICL test); the last visit
    # counts the plain rollouts only, as in xrpo train
    trainer = _trainer(
        tmp_path,
        tiny_llama_dir,
        "xrpo-plus",
        "algorithm.xrpo.icl=true",
        "reward.custom_reward_function.reward_kwargs.verifier=math",
        "data.max_prompt_length=900",
    )
    trainer.corpus.add_many(
        [f"s{i}" for i in range(6)],
        [f"Q: {i} + {i + 1}" for i in range(6)],
        [f"\\boxed{{{2 * i + 1}}}" for i in range(6)],
        [0] * 6,
    )
    merged, rounds, uids, _, _ = _step(trainer)
    seeded = merged.non_tensor_batch[SEEDED_KEY]
    row_uid = merged.non_tensor_batch["uid"]
    assert seeded.any() and not _rewards(merged).any()  # precondition: seeded rows, all unsolved
    hist, _ = trainer.history.before(rounds[0]["problems"])
    assert hist.trials.tolist() == [int(((row_uid == u) & ~seeded).sum()) for u in uids]
    assert hist.trials.sum() < len(merged) and not hist.successes.any()


def _stub_verl_checkpoint(monkeypatch):
    """verl's own checkpoint code saves / loads the FSDP workers (GPU): stand-ins keep its bookkeeping only."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    monkeypatch.setattr(RayPPOTrainer, "_save_checkpoint", lambda self: None)
    monkeypatch.setattr(RayPPOTrainer, "_load_checkpoint", lambda self: setattr(self, "global_steps", 1))


def test_history_is_saved_with_the_checkpoint_and_restored_on_resume(tmp_path, tiny_llama_dir, monkeypatch):
    # verl's own checkpoint code saves / loads the FSDP workers (GPU); stand-ins do its bookkeeping, as for the corpus
    _stub_verl_checkpoint(monkeypatch)
    trainer = _trainer(tmp_path, tiny_llama_dir, "knapsack")
    _step(trainer)
    trainer.global_steps = 1
    trainer._save_checkpoint()
    path = tmp_path / "ckpt" / "global_step_1" / HISTORY_FILE
    saved = json.loads(path.read_text())
    assert saved["ids"] == [f"p{i}" for i in range(PROMPTS)] and len(saved["trials"]) == 8
    assert sum(saved["trials"]) == BUDGET  # step 1's visit of its 4 prompts
    # Knapsack RL's window: each prompt's latest rewards (its step-1 outcomes), as the history holds them
    assert saved["window"] == 16 and saved["observed"][:PROMPTS] == saved["trials"][:PROMPTS]
    assert [w.count("1") for w in saved["recent"]] == saved["successes"]
    assert not list(path.parent.glob("*.tmp"))  # written atomically: no temporary file left

    fresh = _trainer(tmp_path, tiny_llama_dir, "knapsack")
    assert not fresh.history.ids and not fresh.history.state.trials.any()
    fresh._load_checkpoint()
    assert fresh.global_steps == 1
    assert fresh.history.state_dict() == trainer.history.state_dict()
    ids = saved["ids"]
    a, b = trainer.history.before(ids)[0], fresh.history.before(ids)[0]
    assert all(np.array_equal(u, v) for u, v in zip(a, b)) and b.observed.sum() == BUDGET
    # the resumed run plans step 2 as the uninterrupted one
    x = trainer.xrpo
    assert batch_counts(x, PROMPTS, BUDGET, a).tolist() == batch_counts(x, PROMPTS, BUDGET, b).tolist()
    # a new id after the resume gets the next slot, as in the uninterrupted run
    assert fresh.history.slots(["p7"]).tolist() == trainer.history.slots(["p7"]).tolist() == [PROMPTS]

    # an old checkpoint (no history file: written by a run whose allocation reads none) is refused by name, as
    # `xrpo train` refuses a state.json without "history": planning as if no prompt had been seen is another run
    path.unlink()
    other = _trainer(tmp_path, tiny_llama_dir, "knapsack")
    with pytest.raises(FileNotFoundError, match="no per-prompt history at .*xrpo_history.json"):
        other._load_checkpoint()
    # ... and an allocation that reads no history neither writes nor needs one
    hrp = _trainer(tmp_path, tiny_llama_dir, "hrp")
    assert hrp.history is None
    hrp._load_checkpoint()
    hrp._save_checkpoint()
    assert not path.exists()

    # a damaged file is an error naming it
    path.write_text("{not json")
    with pytest.raises(ValueError, match="xrpo_history.json: per-prompt history is not valid JSON"):
        _trainer(tmp_path, tiny_llama_dir, "xrpo-plus")._load_checkpoint()


def test_a_run_resumed_from_a_path_saves_its_later_steps_in_their_own_folder(tmp_path, tiny_llama_dir, monkeypatch):
    # trainer.resume_mode=resume_path: verl loads from resume_from_path and saves step N to global_step_N; the
    # history (and the corpus) must follow both, not write step N's into the folder it resumed from
    _stub_verl_checkpoint(monkeypatch)
    trainer = _trainer(tmp_path, tiny_llama_dir, "knapsack")
    _step(trainer)
    trainer.global_steps = 1
    trainer._save_checkpoint()
    step1 = tmp_path / "ckpt" / "global_step_1"
    resumed = _trainer(
        tmp_path, tiny_llama_dir, "knapsack", "trainer.resume_mode=resume_path", f"trainer.resume_from_path={step1}"
    )
    resumed._load_checkpoint()
    assert resumed.history.state_dict() == trainer.history.state_dict()
    _step(resumed)
    resumed.global_steps = 2
    resumed._save_checkpoint()
    assert json.loads((step1 / HISTORY_FILE).read_text()) == trainer.history.state_dict()  # untouched
    assert json.loads((tmp_path / "ckpt" / "global_step_2" / HISTORY_FILE).read_text()) == resumed.history.state_dict()


# ------------------------------------------------------------------ VisitHistory alone (no model)
def test_visit_history_keys_by_problem_id_and_checks_what_it_loads(tmp_path):
    from xrpo.rollout.records import PlanResult, RolloutRecord

    def plan(rewards_per_prompt, seeded=()):
        recs = [
            RolloutRecord(q, q, 0, q in seeded, [], [], [], [], "stop", "", reward=r)
            for q, rs in enumerate(rewards_per_prompt)
            for r in rs
        ]
        return PlanResult(
            records=recs,
            rewards=np.array([x.reward for x in recs]),
            group_ids=np.array([x.group_id for x in recs]),
            rounds=[],
        )

    h = VisitHistory(3)
    assert h.slots(["b", "a", "b"]).tolist() == [0, 1, 0]
    # visit 1: b 1 of 2, a 0 of 1; visit 2 of b: 2 of 3 replaces it (the last visit), c's rollouts all ICL-seeded
    h.observe(["b", "a"], plan([[1.0, 0.0], [0.0]]), 1.0)
    h.observe(["b", "c"], plan([[1.0, 1.0, 0.0], [1.0]], seeded={1}), 1.0)
    hist, m = h.before(["a", "b", "c"])
    assert hist.successes.tolist() == [0, 2, 0] and hist.trials.tolist() == [1, 3, 0]
    assert m == {"alloc/history_frac": 2 / 3}
    with pytest.raises(ValueError, match="as many as the training set has rows"):
        h.slots(["d"])
    path = tmp_path / HISTORY_FILE
    h.save(str(path))
    back = VisitHistory(3)
    back.load(str(path))
    assert back.state_dict() == h.state_dict() and back.slots(["c"]).tolist() == [2]
    with pytest.raises(ValueError, match="was the run resumed with other training data"):
        VisitHistory(2).load(str(path))
    path.write_text(json.dumps({**h.state_dict(), "ids": ["a", "a", "b"]}))
    with pytest.raises(ValueError, match="a list of distinct problem ids"):
        VisitHistory(3).load(str(path))
