"""RayXRPOTrainer's driver on CPU: the phases of Algorithm 1 through verl's real agent loop and reward loop.

The trainer is built as verl builds it (config from xrpo_trainer.yaml, verl's RLHFDataset over a parquet written by
xrpo's writer), without worker groups; its rollout manager is verl's AgentLoopWorker in this process with a tiny
Llama answering in place of the vLLM server (tests/integrations/conftest.py). What needs GPUs and is not run here:
verl's actor/reference workers (FSDP/Megatron), the vLLM/SGLang servers, Ray, and therefore `fit` itself.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from verl import DataProto  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: E402
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker  # noqa: E402
from verl.trainer.ppo.utils import Role, create_rl_dataset, create_rl_sampler  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.utils.dataset.rl_dataset import collate_fn  # noqa: E402

from xrpo.algo.allocation import allocate_round  # noqa: E402
from xrpo.data import Problem, save_problems_verl_parquet  # noqa: E402
from xrpo.integrations.verl.main import load_config  # noqa: E402
from xrpo.integrations.verl.phases import PAD_KEY, ROUND_KEY, SEEDED_KEY, align_batch, plan_result  # noqa: E402
from xrpo.integrations.verl.trainer import RayXRPOTrainer, minibatch_multiple, pads_scale_the_loss  # noqa: E402
from xrpo.rollout.corpus import update_corpus  # noqa: E402
from xrpo.rollout.step import rollout_metrics  # noqa: E402

PROMPTS = 4


def _build(tmp_path, llama, *overrides, seed=0):
    from ..conftest import EVEN_VERIFIER, InProcessHandle, InProcessRolloutManager, TinyServer

    path, model = llama
    probs = [
        Problem(id=f"p{i}", prompt=f"Q: {i} + {i + 3}\nA:", answer=str(2 * i + 3), data_source="arith")
        for i in range(8)
    ]
    save_problems_verl_parquet(probs, tmp_path / "train.parquet")
    save_problems_verl_parquet(probs[:4], tmp_path / "val.parquet")
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={path}",
            f"data.train_files={tmp_path / 'train.parquet'}",
            f"data.val_files={tmp_path / 'val.parquet'}",
            f"data.train_batch_size={PROMPTS}",
            "actor_rollout_ref.rollout.n=4",
            "algorithm.xrpo.n_base=2",
            "data.max_prompt_length=384",
            "data.max_response_length=10",
            "actor_rollout_ref.rollout.agent.num_workers=3",
            "algorithm.xrpo.embedder=hash",
            f"reward.custom_reward_function.reward_kwargs.verifier={EVEN_VERIFIER}",
            "data.dataloader_num_workers=0",
            "data.shuffle=false",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}",
            "trainer.device=cpu",
            *overrides,
        ]
    )
    mc = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    train = create_rl_dataset(cfg.data.train_files, cfg.data, mc.tokenizer, None, is_train=True)
    val = create_rl_dataset(cfg.data.val_files, cfg.data, mc.tokenizer, None, is_train=False)
    trainer = RayXRPOTrainer(
        config=cfg,
        tokenizer=mc.tokenizer,
        role_worker_mapping={Role.ActorRollout: object},
        resource_pool_manager=None,
        train_dataset=train,
        val_dataset=val,
        collate_fn=collate_fn,
        train_sampler=create_rl_sampler(cfg.data, train),
    )
    server = TinyServer(model, mc.tokenizer, int(cfg.actor_rollout_ref.rollout.response_length), seed=seed)
    worker = AgentLoopWorker(cfg, server, None, [InProcessHandle(RewardLoopWorker(cfg))])
    trainer.async_rollout_manager = InProcessRolloutManager(worker)
    return trainer, server


def _step_inputs(trainer):
    batch = DataProto.from_single_dict(next(iter(trainer.train_dataloader)))
    batch.meta_info["temperature"] = 1.0
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    uids = list(batch.non_tensor_batch["uid"])
    gen = trainer._get_gen_batch(batch)
    gen.meta_info["global_steps"] = 1
    return batch, gen, uids


def _rewards(rows: DataProto) -> np.ndarray:
    return rows.batch["rm_scores"].sum(-1).numpy()


def test_phases_through_verls_agent_loop(tmp_path, tiny_llama_dir):
    trainer, server = _build(tmp_path, tiny_llama_dir)
    batch, gen, uids = _step_inputs(trainer)
    timing: dict = {}
    merged, rounds = trainer._xrpo_rollouts(batch, gen, timing)

    # budget 4 prompts x 4 = 16: 2 base rollouts each, then rounds of 4 and 4
    assert len(merged) == 16 and [sum(r["alloc"]) for r in rounds] == [8, 4, 4]
    row_uid = merged.non_tensor_batch["uid"]
    rnd = merged.non_tensor_batch[ROUND_KEY]
    for q, u in enumerate(uids):  # every group keeps its uid, with as many rows as allocated to it
        assert int((row_uid == u).sum()) == sum(r["alloc"][q] for r in rounds)
    # each round's allocation is allocate_round (Eqs. 1-3) on the rewards of the rounds before it
    rewards = _rewards(merged)
    for t in (1, 2):
        before = [rewards[(row_uid == u) & (rnd < t)] for u in uids]
        assert rounds[t]["alloc"] == allocate_round(before, 4, alpha=0.05, lam=0.1).tolist()
    # verl's agent loop was called once per round, padded to its 3 workers; rewards came from xrpo's reward fn
    assert [len(b) for b in trainer.async_rollout_manager.batches] == [9, 6, 6]
    assert set(merged.non_tensor_batch["score"].tolist()) <= {0.0, 1.0}
    assert np.array_equal(merged.non_tensor_batch["score"].astype(float), rewards)
    # the per-round routing fields are gone; empty corpus: nothing seeded
    assert not {"agent_name", "priority", "xrpo_icl_prompt"} & set(merged.non_tensor_batch)
    assert not merged.non_tensor_batch[SEEDED_KEY].any()
    assert {"gen_round_0", "gen_round_1", "gen_round_2", "xrpo_plan"} <= set(timing)

    # xrpo's metrics and corpus update on the step, as the trainer runs them
    result, problems = plan_result(merged, uids, rounds, trainer.tokenizer, 1.0)
    m = rollout_metrics(result, len(uids))
    assert m["rollout/count"] == 16 and m["alloc/rounds"] == 2 and m["rollout/reward_mean"] == rewards.mean()
    assert [p.id for p in problems] == [f"p{i}" for i in range(PROMPTS)]
    solved = {problems[q].id for q in range(PROMPTS) if rewards[row_uid == uids[q]].max() >= 1}
    assert update_corpus(result, problems, trainer.corpus, trainer.xrpo_plan, 1) == {
        "icl/corpus_added": float((rewards >= 1).sum()),
        "icl/skipped_empty_solutions": 0.0,
    }
    assert set(trainer.corpus.problem_ids()) == solved


@pytest.mark.parametrize("train_prompt", ["original", "icl"])
def test_icl_rows_generate_from_the_icl_prompt_and_store_the_configured_one(tmp_path, tiny_llama_dir, train_prompt):
    # math verifier: the random model never answers, so every prompt stays unsolved and is ICL-seeded
    # the paper's template with two examples is ~480 tokens of the tiny tokenizer: room for it
    trainer, server = _build(
        tmp_path,
        tiny_llama_dir,
        "reward.custom_reward_function.reward_kwargs.verifier=math",
        f"algorithm.xrpo.icl_train_prompt={train_prompt}",
        "data.max_prompt_length=900",
    )
    trainer.corpus.add_many(
        [f"s{i}" for i in range(6)],
        [f"Q: {i} + {i + 1}" for i in range(6)],
        [f"\\boxed{{{2 * i + 1}}}" for i in range(6)],
        [0] * 6,
    )
    batch, gen, uids = _step_inputs(trainer)
    merged, rounds = trainer._xrpo_rollouts(batch, gen, {})
    seeded = merged.non_tensor_batch[SEEDED_KEY]
    rnd = merged.non_tensor_batch[ROUND_KEY]
    assert not _rewards(merged).any()
    # every prompt that received rollouts in a planning round was seeded there
    assert np.array_equal(seeded, rnd > 0)
    assert rounds[1]["seeded"] == [q for q in range(PROMPTS) if rounds[1]["alloc"][q] > 0]
    # the seeded requests went through the xrpo_icl agent loop with the paper's template
    icl_calls = [trainer.tokenizer.decode(c) for c in server.calls if "<examples>" in trainer.tokenizer.decode(c)]
    routed = sum(
        int((b.non_tensor_batch.get("agent_name", np.array([])) == "xrpo_icl").sum())
        for b in trainer.async_rollout_manager.batches
    )
    # (the batches sent include the copies that pad a round to the 3 agent-loop workers; their outputs are dropped)
    assert len(icl_calls) == routed >= int(seeded.sum()) and all("<new_problem>" in c for c in icl_calls)
    prompts = merged.batch["prompts"]
    row_uid = merged.non_tensor_batch["uid"]
    for i in np.flatnonzero(seeded):
        plain = np.flatnonzero((row_uid == row_uid[i]) & ~seeded)[0]
        text = trainer.tokenizer.decode(prompts[i][merged.batch["attention_mask"][i, : prompts.shape[1]].bool()])
        if train_prompt == "original":
            # trained under the plain prompt: the very tokens of the prompt's base rollouts
            assert torch.equal(prompts[i], prompts[plain]) and "<examples>" not in text
        else:
            assert "<examples>" in text and not torch.equal(prompts[i], prompts[plain])
    # ICL-seeded rows share their group (uid) with the prompt's plain rows
    assert {row_uid[i] for i in np.flatnonzero(seeded)} <= set(row_uid[~seeded])
    # verl's rollout-vs-actor diagnostics: the actor's old log-probs equal the sampler's on the plain rows; on an ICL
    # row trained under its original prompt they belong to another prompt (shifted here), so only an "icl" run may
    # compare them
    merged.batch["old_log_probs"] = merged.batch["rollout_log_probs"] + torch.from_numpy(seeded)[:, None].float()
    diag = trainer._mismatch_metrics(merged)
    assert diag["training/rollout_probs_diff_valid"] == 1
    if train_prompt == "original":
        assert diag["training/rollout_probs_diff_max"] == 0.0  # the seeded rows are left out
    else:
        assert diag["training/rollout_probs_diff_max"] > 0.0  # a probability difference: e^(lp + 1) - e^lp


def test_ragged_step_is_padded_to_the_minibatch_and_advantages_use_old_log_probs(tmp_path, tiny_llama_dir):
    # 14 rollouts for 4 prompts: not a multiple of the 16-sequence mini-batch (ppo_mini_batch_size 4 x n 4)
    trainer, _ = _build(tmp_path, tiny_llama_dir, "algorithm.xrpo.rollouts_per_step=14")
    batch, gen, uids = _step_inputs(trainer)
    merged, rounds = trainer._xrpo_rollouts(batch, gen, {})
    assert len(merged) == 14 and [sum(r["alloc"]) for r in rounds] == [8, 3, 3]
    multiple = minibatch_multiple(dp_size=2, ppo_mini_batch_size=4, rollout_n=4)
    assert multiple == 16
    aligned, info = align_batch(merged, multiple, "pad")
    assert len(aligned) == 16 and info["batch/pad_rows"] == 2.0
    pad = aligned.non_tensor_batch[PAD_KEY]
    assert not aligned.batch["response_mask"][pad].any() and not aligned.batch["rm_scores"][pad].any()
    # the trainer's advantage step: the registered estimator with old_log_probs (here the sampler's own log-probs,
    # which the tiny model computed; on GPUs verl's actor recomputes them)
    aligned.batch["old_log_probs"] = aligned.batch["rollout_log_probs"].clone()
    aligned.batch["token_level_rewards"] = aligned.batch["rm_scores"]
    metrics: dict = {}
    trainer._xrpo_advantage(aligned, metrics)
    adv = aligned.batch["advantages"]
    assert not adv[pad].any() and metrics["adv/empty_rows"] == 2.0
    # zero-variance groups get exactly 0; groups with mixed rewards get a nonzero signal
    r = _rewards(aligned)
    for u in uids:
        rows = aligned.non_tensor_batch["uid"] == u
        flat = r[rows].max() == r[rows].min()
        assert (not adv[rows].any()) if flat else adv[rows].abs().sum() > 0


@pytest.mark.parametrize(
    "agg, loss_mode, scaled",
    [
        ("token-mean", "vanilla", False),
        ("token-sum", "vanilla", False),
        ("seq-mean-token-mean", "vanilla", True),
        ("seq-mean-token-sum", "gspo", True),
        ("seq-mean-token-sum-norm", "vanilla", True),
        ("token-mean", "sapo", True),
    ],
)
def test_padding_warning_names_the_loss_modes_that_padding_scales(tmp_path, tiny_llama_dir, agg, loss_mode, scaled):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, _ = _build(
            tmp_path,
            tiny_llama_dir,
            f"actor_rollout_ref.actor.loss_agg_mode={agg}",
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}",
        )
    mine = [str(w.message) for w in caught if "padding rows included" in str(w.message)]
    assert pads_scale_the_loss(trainer.config.actor_rollout_ref.actor) is scaled
    assert len(mine) == int(scaled) and all(f"loss_agg_mode={agg}" in m for m in mine)


def test_an_embedder_that_does_not_load_is_named_by_its_key(tmp_path, tiny_llama_dir):
    # not a built-in embedder, and no sentence-transformers model of that name here: the trainer names the key
    with pytest.raises(ValueError, match=r"config field algorithm\.xrpo\.embedder: embedder '.*no-such-embedder'"):
        _build(tmp_path, tiny_llama_dir, f"algorithm.xrpo.embedder={tmp_path / 'no-such-embedder'}")


def test_xrpo_icl_loop_refuses_a_row_without_its_icl_prompt(tmp_path, tiny_llama_dir):
    trainer, _ = _build(tmp_path, tiny_llama_dir)
    _, gen, _ = _step_inputs(trainer)
    gen.non_tensor_batch["agent_name"] = np.array(["xrpo_icl"] * len(gen), dtype=object)
    with pytest.raises(ValueError, match="has no 'xrpo_icl_prompt' messages"):
        trainer.async_rollout_manager.generate_sequences(gen)


def test_corpus_travels_with_checkpoints(tmp_path, tiny_llama_dir, monkeypatch):
    # verl's own checkpoint code saves / loads the FSDP workers (GPU); stand-ins here do only its bookkeeping
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    trainer, _ = _build(tmp_path, tiny_llama_dir, f"trainer.default_local_dir={tmp_path / 'ckpt'}")
    monkeypatch.setattr(RayPPOTrainer, "_save_checkpoint", lambda self: None)
    monkeypatch.setattr(RayPPOTrainer, "_load_checkpoint", lambda self: setattr(self, "global_steps", 3))
    trainer.corpus.add_many(["p1", "p2"], ["Q: 1 + 4", "Q: 2 + 5"], ["\\boxed{5}", "\\boxed{7}"], [1, 1])
    trainer.global_steps = 3
    trainer._save_checkpoint()
    assert (tmp_path / "ckpt" / "global_step_3" / "xrpo_corpus").is_dir()
    fresh, _ = _build(tmp_path, tiny_llama_dir, f"trainer.default_local_dir={tmp_path / 'ckpt'}")
    assert len(fresh.corpus) == 0
    fresh._load_checkpoint()
    assert sorted(fresh.corpus.problem_ids()) == ["p1", "p2"]
    # a checkpoint without a corpus (not written by RayXRPOTrainer) is refused, not silently restarted empty
    other, _ = _build(tmp_path, tiny_llama_dir, f"trainer.default_local_dir={tmp_path / 'other'}")
    with pytest.raises(FileNotFoundError, match="no ICL corpus"):
        other._load_checkpoint()
