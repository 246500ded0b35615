"""`RayXRPOTrainer`: XRPO's Algorithm 1 inside verl's PPO driver (in the style of verl's DAPO recipe trainer).

Details and the reasons for them: docs/verl.md,
sections "What runs in one step" and "`RayXRPOTrainer`: deviations, and what `fit` keeps".
"""

from __future__ import annotations

import math
import os
import uuid
import warnings
from pprint import pprint

import numpy as np
import torch
from tqdm import tqdm
from verl import DataProto
from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto
from verl.trainer.ppo.core_algos import agg_loss, get_adv_estimator_fn
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    compute_variance_proxy_metrics,
)
from verl.trainer.ppo.ray_trainer import (
    RayPPOTrainer,
    apply_kl_penalty,
    compute_response_mask,
    compute_spec_decode_metrics,
)
from verl.trainer.ppo.reward import extract_reward
from verl.utils.checkpoint.checkpoint_manager import should_save_ckpt_esi
from verl.utils.debug import marked_timer
from verl.utils.metric import reduce_metrics

from xrpo.algo.allocation import plan_phases
from xrpo.algo.rounds import batch_counts, get_allocator, history_window, plan_round, plans_rounds
from xrpo.integrations.verl.advantage import ESTIMATOR_NAME
from xrpo.integrations.verl.config import rollouts_per_step, validate_xrpo_config
from xrpo.integrations.verl.phases import (
    HISTORY_FILE,
    PAD_KEY,
    VisitHistory,
    align_batch,
    append_rounds,
    check_icl_prompts,
    finish_round,
    icl_seed,
    mark_padding,
    merge_rounds,
    plan_result,
    problem_id,
    problem_text,
    rewards_by_prompt,
    round_gen_batch,
    rows_sampled_as_trained,
    trained_rows,
)
from xrpo.rollout.corpus import update_corpus
from xrpo.rollout.step import rollout_metrics
from xrpo.rundir.rounds import round_entry

__all__ = [
    "CORPUS_DIR",
    "HISTORY_FILE",
    "RayXRPOTrainer",
    "SEQ_MEAN_MODES",
    "minibatch_multiple",
    "pads_scale_the_loss",
]

CORPUS_DIR = "xrpo_corpus"
ROUNDS_FILE = "rounds.jsonl"
# verl's loss aggregations that divide by a fixed mini-batch size (core_algos.agg_loss's global_batch_size)
SEQ_MEAN_MODES = ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean")


def minibatch_multiple(dp_size: int, ppo_mini_batch_size: int, rollout_n: int) -> int:
    """The batch-size multiple verl's actor update needs: its mini-batch (``ppo_mini_batch_size * rollout.n``
    sequences, split evenly over ``dp_size`` ranks) and the data-parallel split."""
    mini = int(ppo_mini_batch_size) * int(rollout_n)
    return mini * int(dp_size) // math.gcd(mini, int(dp_size))


def pads_scale_the_loss(actor_config) -> bool:
    """Whether padding rows scale verl's actor loss: verl's ``_update_actor`` passes ``global_batch_size =
    ppo_mini_batch_size * rollout.n`` and ``agg_loss`` divides the ``seq-mean-*`` sums by it, padding rows
    included; ``token-mean`` / ``token-sum`` count only masked-in tokens. SAPO aggregates its policy term with
    seq-mean-token-mean whatever ``loss_agg_mode`` says."""
    loss_mode = (actor_config.get("policy_loss", None) or {}).get("loss_mode", "vanilla")
    return actor_config.get("loss_agg_mode", "token-mean") in SEQ_MEAN_MODES or loss_mode == "sapo"


class RayXRPOTrainer(RayPPOTrainer):
    """verl's PPO driver running XRPO's phases within each step; see the module docstring."""

    def __init__(self, config, *args, **kwargs):
        self.xrpo = validate_xrpo_config(config)  # before verl builds datasets and loaders: fail fast
        super().__init__(config, *args, **kwargs)
        if self.use_critic:
            raise ValueError("XRPO is critic-free: algorithm.adv_estimator=xrpo must not enable a critic")
        actor_cfg = self.config.actor_rollout_ref.actor
        if pads_scale_the_loss(actor_cfg):
            warnings.warn(
                f"actor_rollout_ref.actor.loss_agg_mode={actor_cfg.loss_agg_mode} (policy_loss.loss_mode="
                f"{actor_cfg.policy_loss.get('loss_mode', 'vanilla')}): verl divides each mini-batch's sequence-mean "
                "loss by ppo_mini_batch_size * rollout.n, padding rows included, so a step RayXRPOTrainer pads to "
                "the mini-batch multiple trains with its loss scaled by about 1 - batch/pad_frac (logged each step; "
                "token-mean is exact). Keep the step's budget a multiple of the mini-batch to avoid padding "
                "(docs/verl.md)",
                stacklevel=2,
            )
        self.xrpo_budget = rollouts_per_step(self.config, self.xrpo)
        self.xrpo_plan = self.xrpo.plan_config(self.xrpo_budget)
        self.corpus = None
        if self.xrpo.icl:
            from xrpo.icl import ICLCorpus, get_embedder

            try:
                emb = get_embedder(self.xrpo.embedder)
            except ValueError as e:
                raise ValueError(f"config field algorithm.xrpo.embedder: {e}") from e
            if self.xrpo.corpus_init:
                self.corpus = ICLCorpus.from_jsonl(
                    self.xrpo.corpus_init, emb, max_per_problem=self.xrpo.corpus_max_per_problem
                )
            else:
                self.corpus = ICLCorpus(emb, max_per_problem=self.xrpo.corpus_max_per_problem)
        # each prompt's last visit, for an allocator that reads it (knapsack, xrpo-plus), as xrpo train keeps it
        self.history = None
        if get_allocator(self.xrpo.allocation).uses_history:
            self.history = VisitHistory(len(self.train_dataset), history_window(self.xrpo))

    # ------------------------------------------------------------------ checkpoints: the corpus and history go along
    def _step_folder(self) -> str:
        """The folder verl's ``_save_checkpoint`` writes step ``global_steps`` to."""
        tr = self.config.trainer
        return os.path.join(os.path.abspath(tr.default_local_dir), f"global_step_{self.global_steps}")

    def _resume_folder(self) -> str:
        """The folder verl's ``_load_checkpoint`` resumed from: ``resume_from_path`` if given, else the step's."""
        tr = self.config.trainer
        if tr.resume_mode == "resume_path" and tr.resume_from_path:
            return os.path.abspath(tr.resume_from_path)
        return self._step_folder()

    def _rounds_file(self) -> str:
        """rounds.jsonl next to the run's checkpoints (``trainer.default_local_dir``), the trainer's rows."""
        return os.path.join(os.path.abspath(self.config.trainer.default_local_dir), ROUNDS_FILE)

    def _save_checkpoint(self):
        super()._save_checkpoint()
        if self.corpus is not None:
            self.corpus.save(os.path.join(self._step_folder(), CORPUS_DIR))
        if self.history is not None:
            self.history.save(os.path.join(self._step_folder(), HISTORY_FILE))

    def _load_checkpoint(self):
        out = super()._load_checkpoint()
        if self.global_steps == 0:  # a fresh start
            return out
        folder = self._resume_folder()
        if self.corpus is not None:
            path = os.path.join(folder, CORPUS_DIR)
            if not os.path.isdir(path):
                raise FileNotFoundError(
                    f"resuming XRPO at step {self.global_steps}: no ICL corpus at {path} (the checkpoint was not "
                    "written by RayXRPOTrainer); start a new run or set algorithm.xrpo.icl=false"
                )
            from xrpo.icl import ICLCorpus

            self.corpus = ICLCorpus.load(path, self.corpus.embedder)
        if self.history is not None:
            path = os.path.join(folder, HISTORY_FILE)
            if not os.path.isfile(path):
                # as xrpo train refuses a checkpoint without "history": planning as if no prompt had been seen
                # would not be the run that was interrupted
                raise FileNotFoundError(
                    f"resuming XRPO at step {self.global_steps}: no per-prompt history at {path}, which "
                    f"algorithm.xrpo.allocation={self.xrpo.allocation} reads (the checkpoint was written by a run "
                    "whose allocation reads none, or by a RayXRPOTrainer that did not keep it); start a new run or "
                    "resume with the allocation the checkpoint was written with"
                )
            self.history.load(path)
        return out

    def _observe_visits(self, result) -> None:
        """The step's visit becomes each of its prompts' last visit (``result``: the step's `plan_result`, whose
        rounds name the prompts' problem ids), before the step's checkpoint saves the history."""
        if self.history is not None:
            self.history.observe(result.rounds[0]["problems"], result, self.xrpo.full_reward)

    # ------------------------------------------------------------------ generation of one step (Alg. 1 lines 1-13)
    def _generate(self, gen: DataProto) -> DataProto:
        # verl's agent-loop manager splits a batch evenly over its workers: pad with copies, drop their outputs
        padded, pad = pad_dataproto_to_divisor(gen, int(self.config.actor_rollout_ref.rollout.agent.num_workers))
        out = self.async_rollout_manager.generate_sequences(padded)
        return unpad_dataproto(out, pad)

    def _xrpo_rollouts(
        self, batch: DataProto, gen_batch: DataProto, timing_raw: dict, metrics: dict | None = None
    ) -> tuple[DataProto, list]:
        """The step's rollouts (Algorithm 1 lines 1-13) and its rounds.jsonl rows; ``metrics`` gets
        ``alloc/history_frac`` when the allocation reads history."""
        x = self.xrpo
        n_prompts = len(batch)
        uids = list(batch.non_tensor_batch["uid"])
        raw = gen_batch.non_tensor_batch["raw_prompt"]
        extra = batch.non_tensor_batch.get("extra_info", np.array([None] * n_prompts, dtype=object))
        default_agent = self.config.actor_rollout_ref.rollout.agent.default_agent_loop
        prompt_len = int(self.config.actor_rollout_ref.rollout.prompt_length)
        tmpl_kwargs = dict(self.config.data.get("apply_chat_template_kwargs", {}) or {})
        phases = plan_phases(n_prompts, self.xrpo_budget, x.n_base, x.plan_rounds)
        # the problem ids of rounds.jsonl's "problems", as plan_result and the corpus key them
        ids = [problem_id(extra[q], raw[q]) for q in range(n_prompts)]
        # each prompt's last visit (knapsack, xrpo-plus; zeros on a first visit) as xrpo train hands it to the planner
        history = None
        if self.history is not None:
            history, history_metrics = self.history.before(ids)
            if metrics is not None:
                metrics.update(history_metrics)
        parts, rounds = [], []
        row_uids: list = []
        row_rewards: list = []

        def run(counts: np.ndarray, icl: dict, rnd: int) -> None:
            gen, _ = round_gen_batch(gen_batch, counts, icl, x.icl_train_prompt, default_agent)
            gen.meta_info = dict(gen_batch.meta_info)
            with marked_timer(f"gen_round_{rnd}", timing_raw, color="red"):
                out = self._generate(gen)
            # verl's agent-loop timings (agent_loop/generate_sequences/max, ...), one set per round
            for key, val in (out.meta_info.get("timing", None) or {}).items():
                timing_raw[f"gen_round_{rnd}/{key}"] = val
            part = finish_round(batch, out, counts, rnd, set(icl))
            parts.append(part)
            row_uids.extend(part.non_tensor_batch["uid"])
            row_rewards.extend(part.batch["rm_scores"].sum(-1).tolist())

        def successes(rows) -> list[int]:  # correct rollouts per prompt among a round's rows
            got = rewards_by_prompt(rows.non_tensor_batch["uid"], rows.batch["rm_scores"].sum(-1).tolist(), uids)
            return [int(np.count_nonzero(r >= x.full_reward)) for r in got]

        if not plans_rounds(x.allocation, x.icl):
            # nothing to plan: the whole budget in one call, placed from the prompts' last visits (knapsack) or split
            # evenly (the planner's GRPO path)
            counts = batch_counts(x, n_prompts, self.xrpo_budget, history)
            run(counts, {}, 0)
            rounds.append(round_entry(0, counts, ids, successes(parts[-1])))
        else:
            run(np.full(n_prompts, x.n_base, dtype=np.int64), {}, 0)
            rounds.append(round_entry(0, [x.n_base] * n_prompts, ids, successes(parts[-1])))
            for t, budget in enumerate(phases.round_budgets, start=1):
                if budget == 0:
                    continue
                with marked_timer("xrpo_plan", timing_raw):
                    so_far = rewards_by_prompt(row_uids, row_rewards, uids)
                    corpus_ready = x.icl and self.corpus is not None and len(self.corpus) > 0
                    plan = plan_round(so_far, budget, x, icl=corpus_ready, full_reward=x.full_reward, history=history)
                icl, truncated, dropped = {}, 0, 0
                # Alg. 1 lines 9-10: a prompt with no correct rollout so far is seeded with solved neighbours
                unsolved = [int(q) for q in np.flatnonzero(plan.seed)]
                if unsolved:
                    with marked_timer("xrpo_retrieve", timing_raw):
                        found = self.corpus.retrieve_many(
                            [ids[q] for q in unsolved],
                            [problem_text(raw[q]) for q in unsolved],
                            k=x.icl_k,
                            min_similarity=x.icl_min_similarity,
                        )
                        for q, examples in zip(unsolved, found):
                            if examples:
                                msgs, cut, left_out = icl_seed(
                                    raw[q], examples, self.tokenizer, prompt_len, tmpl_kwargs
                                )
                                dropped += left_out
                                if msgs is not None:
                                    icl[q] = msgs
                                    truncated += cut
                run(plan.alloc, icl, t)
                rounds.append(
                    round_entry(
                        t,
                        plan.alloc,
                        ids,
                        successes(parts[-1]),
                        seeded=sorted(icl),
                        truncated=truncated,
                        dropped=dropped,
                        nonuniform=plan.nonuniform,
                    )
                )
        merged = merge_rounds(parts)
        if x.icl and x.icl_train_prompt == "original":
            check_icl_prompts(merged)
        return merged, rounds

    # ------------------------------------------------------------------ advantages (Alg. 1 line 14)
    def _xrpo_advantage(self, batch: DataProto, metrics: dict) -> DataProto:
        fn = get_adv_estimator_fn(ESTIMATOR_NAME)
        adv_metrics: dict = {}
        adv, ret = fn(
            token_level_rewards=batch.batch["token_level_rewards"],
            response_mask=batch.batch["response_mask"],
            index=batch.non_tensor_batch["uid"],
            config=self.config.algorithm,
            norm_adv_by_std_in_grpo=self.config.algorithm.get("norm_adv_by_std_in_grpo", True),
            old_log_probs=batch.batch["old_log_probs"],
            metrics=adv_metrics,
        )
        batch.batch["advantages"] = adv
        batch.batch["returns"] = ret
        metrics.update(adv_metrics)
        return batch

    # ------------------------------------------------------------------ verl's per-step extras
    def _mismatch_metrics(self, batch: DataProto) -> dict:
        """verl's rollout-vs-actor log-prob diagnostics (``training/rollout_probs_diff_*`` and the metrics-only
        ``rollout_corr/*``), over the rows whose rollout log-probs were sampled under the prompt they are trained
        on: an ICL-seeded row trained under its original prompt was sampled under another, and padding rows have
        no tokens. (verl's fit computes them on the whole batch when the rollout returns log-probs.)"""
        if "rollout_log_probs" not in batch.batch.keys():
            return {}
        rows = rows_sampled_as_trained(batch, self.xrpo.icl_train_prompt)
        if len(rows) == 0 or not batch.batch["response_mask"][rows].any():
            return {}
        from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
        from verl.utils.debug.metrics import calculate_debug_metrics

        sub = batch.select_idxs(rows)
        out = calculate_debug_metrics(sub)
        if self.config.algorithm.get("rollout_correction", None) is not None:
            # rollout_is / rollout_rs are refused by validate_xrpo_config: metrics only, the batch is untouched
            _, _, corr = compute_rollout_correction_and_rejection_mask(
                old_log_prob=sub.batch["old_log_probs"],
                rollout_log_prob=sub.batch["rollout_log_probs"],
                response_mask=sub.batch["response_mask"],
            )
            out.update(corr)
        return out

    # ------------------------------------------------------------------ the training loop
    def fit(self):
        """verl's ``RayPPOTrainer.fit`` (0.9.1) with XRPO's generation and advantage; see the module docstring."""
        from omegaconf import OmegaConf
        from verl.utils.tracking import Tracking

        if self._dump_executor._shutdown:
            self._init_dump_executor()
        logger = Tracking(
            project_name=self.config.trainer.project_name,
            experiment_name=self.config.trainer.experiment_name,
            default_backend=self.config.trainer.logger,
            config=OmegaConf.to_container(self.config, resolve=True),
        )
        self.global_steps = 0
        self._load_checkpoint()
        self.checkpoint_manager.update_weights(self.global_steps)
        current_epoch = self.global_steps // len(self.train_dataloader)
        if self.config.trainer.get("val_before_train", True):
            val_metrics = self._validate()
            pprint(f"Initial validation metrics: {val_metrics}")
            logger.log(data=val_metrics, step=self.global_steps)
            if self.config.trainer.get("val_only", False):
                self._shutdown_dump_executor()
                return
        progress = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="Training Progress")
        self.global_steps += 1
        self.max_steps_duration = 0
        last_val_metrics = None
        rollout_cfg = self.config.actor_rollout_ref.rollout
        actor_cfg = self.config.actor_rollout_ref.actor
        profiler = self.config.global_profiler
        profile_steps = profiler.steps or []
        continuous = bool(profiler.get("profile_continuous_steps", False))
        prev_profile, curr_profile = False, self.global_steps in profile_steps
        finalize_async = getattr(self.actor_rollout_wg, "async_calls_finalize_fn_exec", None)

        for epoch in range(current_epoch, self.config.trainer.total_epochs):
            for batch_dict in self.train_dataloader:
                if finalize_async is not None:  # async checkpoint saves of the last step finish in the background
                    finalize_async(blocking=False)
                metrics: dict = {}
                timing_raw: dict = {}
                with marked_timer("start_profile", timing_raw):
                    self._start_profiling(not prev_profile and curr_profile if continuous else curr_profile)
                batch = DataProto.from_single_dict(batch_dict)
                batch.meta_info["temperature"] = rollout_cfg.temperature
                batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
                prompt_uids = list(batch.non_tensor_batch["uid"])
                gen_batch = self._get_gen_batch(batch)
                gen_batch.meta_info["global_steps"] = self.global_steps
                is_last_step = self.global_steps >= self.total_training_steps

                with marked_timer("step", timing_raw):
                    # -------- 1-2. base rollouts and planning rounds; rewards come from verl's reward loop
                    with marked_timer("gen", timing_raw, color="red"):
                        if curr_profile:
                            self.llm_server_manager.start_profile()
                        batch, rounds = self._xrpo_rollouts(batch, gen_batch, timing_raw, metrics)
                        self.checkpoint_manager.sleep_replicas()
                        if curr_profile:
                            self.llm_server_manager.stop_profile()
                    result, problems = plan_result(batch, prompt_uids, rounds, self.tokenizer, self.xrpo.full_reward)
                    append_rounds(self._rounds_file(), self.global_steps, rounds)
                    self._observe_visits(result)
                    metrics.update(rollout_metrics(result, len(prompt_uids), full_reward=self.xrpo.full_reward))

                    # -------- 3. fit the ragged batch to verl's data-parallel / mini-batch multiples
                    if "response_mask" not in batch.batch.keys():
                        batch.batch["response_mask"] = compute_response_mask(batch)
                    multiple = minibatch_multiple(
                        self._get_dp_size(self.actor_rollout_wg, "actor"), actor_cfg.ppo_mini_batch_size, rollout_cfg.n
                    )
                    batch, align = align_batch(batch, multiple, self.xrpo.batch_align)
                    metrics.update(align)
                    if self.config.trainer.balance_batch:
                        self._balance_batch(batch, metrics=metrics)
                    batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
                    mm = batch.non_tensor_batch.get("multi_modal_inputs")
                    batch.meta_info["images_seqlens"] = [
                        s
                        for m in (mm if mm is not None else [])
                        if m and "images_seqlens" in m
                        for s in m["images_seqlens"].tolist()
                    ]
                    reward_tensor, reward_extra = extract_reward(batch)

                    # -------- 4. old log-probs (actor, under each row's stored prompt), reference, advantages
                    with marked_timer("old_log_prob", timing_raw, color="blue"):
                        old_log_prob, mfu = self._compute_old_log_prob(batch)
                        entropy = agg_loss(
                            loss_mat=old_log_prob.batch["entropys"],
                            loss_mask=batch.batch["response_mask"],
                            loss_agg_mode=actor_cfg.loss_agg_mode,
                            loss_scale_factor=actor_cfg.loss_scale_factor,
                        )
                        metrics.update({"actor/entropy": entropy.detach().item(), "perf/mfu/actor_infer": mfu})
                        old_log_prob.batch.pop("entropys")
                        if "routed_experts" in batch.batch and "routed_experts" in old_log_prob.batch:
                            raise ValueError(  # verl's own check (router replay R2 and R3 at once)
                                "Detected conflicting router replay configuration: router_replay.mode='R2' and "
                                "enable_rollout_routing_replay=True cannot be enabled simultaneously"
                            )
                        batch = batch.union(old_log_prob)
                        metrics.update(self._mismatch_metrics(batch))
                    if self.use_reference_policy:
                        with marked_timer("ref", timing_raw, color="olive"):
                            batch = batch.union(self._compute_ref_log_prob(batch))
                    with marked_timer("adv", timing_raw, color="brown"):
                        batch.batch["token_level_scores"] = reward_tensor
                        if reward_extra:
                            batch.non_tensor_batch.update({k: np.array(v) for k, v in reward_extra.items()})
                        if self.config.algorithm.use_kl_in_reward:
                            batch, kl_metrics = apply_kl_penalty(
                                batch, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty=self.config.algorithm.kl_penalty
                            )
                            metrics.update(kl_metrics)
                        else:
                            batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
                        batch = self._xrpo_advantage(batch, metrics)

                    # -------- 5. actor update with verl's policy loss, corpus update, checkpoint, weight sync
                    with marked_timer("update_actor", timing_raw, color="red"):
                        actor_output = self._update_actor(batch)
                    # corpus update (Alg. 1 line 15), before the checkpoint: step N's checkpoint holds step N's corpus
                    if self.corpus is not None:
                        metrics.update(update_corpus(result, problems, self.corpus, self.xrpo_plan, self.global_steps))
                        metrics["icl/corpus_problems"] = float(len(self.corpus))
                        metrics["icl/corpus_solutions"] = float(self.corpus.num_solutions)
                    # verl's elastic early save: the capacity block (ESI) expires before another step would end
                    esi_expiring = should_save_ckpt_esi(
                        max_steps_duration=self.max_steps_duration,
                        redundant_time=self.config.trainer.esi_redundant_time,
                    )
                    if self.config.trainer.save_freq > 0 and (
                        is_last_step or self.global_steps % self.config.trainer.save_freq == 0 or esi_expiring
                    ):
                        if esi_expiring:
                            print("Force saving checkpoint: ESI instance expiration approaching.")
                        with marked_timer("save_checkpoint", timing_raw, color="green"):
                            self._save_checkpoint()
                    with marked_timer("update_weights", timing_raw, color="red"):
                        self.checkpoint_manager.update_weights(self.global_steps)
                    metrics.update(reduce_metrics(actor_output.meta_info["metrics"]))

                    # -------- 6. the rollout dump
                    rollout_dir = self.config.trainer.get("rollout_data_dir", None)
                    if rollout_dir:
                        dump = mark_padding(reward_extra, batch.non_tensor_batch[PAD_KEY])
                        self._log_rollout_data(batch, {**dump, **trained_rows(batch)}, timing_raw, rollout_dir)

                if self.config.trainer.test_freq > 0 and (
                    is_last_step or self.global_steps % self.config.trainer.test_freq == 0
                ):
                    with marked_timer("testing", timing_raw, color="green"):
                        val_metrics = self._validate()
                        if is_last_step:
                            last_val_metrics = val_metrics
                    metrics.update(val_metrics)
                with marked_timer("stop_profile", timing_raw):
                    next_profile = self.global_steps + 1 in profile_steps
                    run_command = bool(
                        curr_profile and profile_steps and (self.global_steps == max(profile_steps) or is_last_step)
                    )
                    self._stop_profiling(
                        curr_profile and not next_profile if continuous else curr_profile, run_command=run_command
                    )
                    prev_profile, curr_profile = curr_profile, next_profile
                self.max_steps_duration = max(self.max_steps_duration, timing_raw["step"])

                # -------- 7. metrics: verl's, then xrpo's (docs/metrics.md)
                metrics.update({"training/global_step": self.global_steps, "training/epoch": epoch})
                metrics.update(compute_data_metrics(batch=batch, use_critic=False))
                metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing_raw))
                metrics.update(
                    compute_throughout_metrics(
                        batch=batch, timing_raw=timing_raw, n_gpus=self.resource_pool_manager.get_n_gpus()
                    )
                )
                metrics.update(
                    compute_variance_proxy_metrics(batch=batch, gradient_norm=metrics.get("actor/grad_norm", None))
                )
                nt = batch.non_tensor_batch
                metrics.update(
                    compute_spec_decode_metrics(
                        *(
                            nt.get(k)
                            for k in ("spec_num_draft_tokens", "spec_num_accepted_tokens", "spec_num_verify_steps")
                        ),
                        non_padding_mask=~nt[PAD_KEY],
                    )
                )
                logger.log(data=metrics, step=self.global_steps)
                progress.update(1)
                self.global_steps += 1
                if is_last_step:
                    if finalize_async is not None:
                        finalize_async(blocking=True)
                    self._shutdown_dump_executor()
                    pprint(f"Final validation metrics: {last_val_metrics}")
                    progress.close()
                    return
                # verl's experimental hook: a dataset may change after each training batch
                if hasattr(self.train_dataset, "on_batch_end"):
                    self.train_dataset.on_batch_end(batch=batch)
        self._shutdown_dump_executor()
