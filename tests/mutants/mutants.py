"""The fixed list of mutants: realistic defects of xrpo/algo, the planner, the batch sources and the trainer, each
with the tests that must kill it by a failing assertion (`run_mutants.py`).

A mutant replaces ``original`` (which must occur exactly once in ``path``, byte for byte) by ``mutated``. When the code
changes so that a mutant's text no longer occurs, `tests/mutants/test_mutants.py` fails and names it: update the
mutant's text to the new code (the defect it models usually still exists), or drop it if the code it guarded is gone.
``tests`` are pytest arguments (files, node ids, ``-k`` expressions) run with ``-x``: pick the fastest tests that
should catch the defect, so that a mutant that survives points at a hole in them.
"""

from __future__ import annotations

from typing import NamedTuple


class Mutant(NamedTuple):
    name: str
    path: str
    original: str
    mutated: str
    tests: tuple[str, ...]
    why: str


ADV = "tests/algo/test_advantages.py"
LOSSES = "tests/algo/test_losses.py"
ALLOC = "tests/algo/test_allocation.py"
PLANNER = "tests/rollout/test_planner.py"
UPDATE = "tests/trainer/test_update.py"
MECH = "tests/trainer/test_xrpo_mechanisms.py"
SOURCES = "tests/rollout/test_sources.py"

MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------------------------------------------------------ xrpo/algo/advantages
    Mutant(
        "adv-std-ddof0",
        "xrpo/algo/advantages.py",
        "std = np.sqrt(groups.sum(dev * dev) / np.maximum(groups.counts - 1, 1))",
        "std = np.sqrt(groups.sum(dev * dev) / groups.counts)",
        (ADV,),
        "group std with ddof=0 instead of verl/TRL's ddof=1 (off by one in a group statistic)",
    ),
    Mutant(
        "adv-sign",
        "xrpo/algo/advantages.py",
        "adv = np.divide(dev, groups.spread(denom), out=dev)",
        "adv = np.divide(-dev, groups.spread(denom))",
        (ADV,),
        "GRPO advantage with the wrong sign",
    ),
    Mutant(
        "adv-group-mean-off-by-one",
        "xrpo/algo/advantages.py",
        "d -= self.spread(self.sum(d) / self.counts)",
        "d -= self.spread(self.sum(d) / (self.counts + 1))",
        (ADV,),
        "group mean divided by n + 1",
    ),
    Mutant(
        "sharpen-novelty-sign",
        "xrpo/algo/advantages.py",
        "bonus = np.subtract(1.0, eta)",
        "bonus = np.subtract(eta, 1.0)",
        (ADV,),
        "Eq. (6) rewards typical rollouts (eta > 1) instead of novel ones",
    ),
    Mutant(
        "sharpen-eligible-strict",
        "xrpo/algo/advantages.py",
        "    eligible = r >= full\n    # Eq. (6)",
        "    eligible = r > full\n    # Eq. (6)",
        (ADV,),
        "a rollout with exactly full reward is not sharpened",
    ),
    Mutant(
        "sharpen-cap-max",
        "xrpo/algo/advantages.py",
        "np.minimum(bonus, kappa_a, out=bonus)",
        "np.maximum(bonus, kappa_a, out=bonus)",
        (ADV,),
        "the bonus is no longer capped at kappa_clip * A",
    ),
    Mutant(
        "loglik-no-length-norm",
        "xrpo/algo/advantages.py",
        "return (sums / counts).astype(lp.dtype, copy=False)",
        "return sums.astype(lp.dtype, copy=False)",
        (ADV,),
        "s(y) of Eq. (4) without the 1/|y|",
    ),
    Mutant(
        "adv-kind-tree-whiten-inverted",
        "xrpo/algo/advantages.py",
        '    if scale == "std":\n        adv = global_whiten(adv, tree.lengths)',
        '    if scale == "none":\n        adv = global_whiten(adv, tree.lengths)',
        (ADV,),
        "the tree kind whitens with scale='none' and not with 'std' (TreePO's Eq. (5) denominator)",
    ),
    Mutant(
        "adv-kind-abs-mean-signed",
        "xrpo/algo/advantages.py",
        '"adv/abs_mean": float(np.mean(np.abs(adv)))',
        '"adv/abs_mean": float(np.mean(adv))',
        (ADV,),
        "the logged adv/abs_mean of every advantage kind is the signed mean",
    ),
    # ------------------------------------------------------------------------------------------ xrpo/algo/losses
    Mutant(
        "clip-bounds-swapped",
        "xrpo/algo/losses.py",
        "torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)",
        "torch.clamp(ratio, 1.0 - clip_high, 1.0 + clip_low)",
        (LOSSES,),
        "clip_low and clip_high swapped in the surrogate",
    ),
    Mutant(
        "ratio-old-new-swapped",
        "xrpo/algo/losses.py",
        "    log_ratio = logp - old\n    # r_t = exp(log pi_theta - log pi_old)",
        "    log_ratio = old - logp\n    # r_t = exp(log pi_theta - log pi_old)",
        (LOSSES,),
        "importance ratio pi_old / pi_theta",
    ),
    Mutant(
        "surrogate-max",
        "xrpo/algo/losses.py",
        "return -torch.minimum(ratio * adv, torch.clamp(",
        "return -torch.maximum(ratio * adv, torch.clamp(",
        (LOSSES,),
        "the optimistic instead of the pessimistic bound of PPO's objective",
    ),
    Mutant(
        "kl-k3-sign",
        "xrpo/algo/losses.py",
        "        d = ref - logp\n",
        "        d = logp - ref\n",
        (LOSSES,),
        "k3 estimator with the log-ratio the wrong way round",
    ),
    Mutant(
        "token-mean-local-denominator",
        "xrpo/algo/losses.py",
        "        return masked.sum() / denom\n",
        "        return masked.sum() / max(n_local, 1)\n",
        (LOSSES,),
        "token-mean over the micro-batch, ignoring global_tokens (accumulation != full batch)",
    ),
    Mutant(
        "gspo-no-length-norm",
        "xrpo/algo/losses.py",
        "return log_ratio.sum(dim=-1) / valid.sum(dim=-1).clamp(min=1).to(log_ratio.dtype)",
        "return log_ratio.sum(dim=-1)",
        (LOSSES,),
        "GSPO's sequence ratio without the 1/|y| power",
    ),
    # ------------------------------------------------------------------------------------------ xrpo/algo/allocation
    Mutant(
        "delta-wrong-count",
        "xrpo/algo/allocation.py",
        "delta = s * (_t_over_sqrt(n, alpha) - _t_over_sqrt(n + 1.0, alpha))",
        "delta = s * (_t_over_sqrt(n, alpha) - _t_over_sqrt(n + 2.0, alpha))",
        (ALLOC,),
        "Eq. (2) with h(n + 2) instead of h(n + 1)",
    ),
    Mutant(
        "phi-count-off-by-one",
        "xrpo/algo/allocation.py",
        "phi = lam * np.sqrt(math.log1p(T) / n)",
        "phi = lam * np.sqrt(math.log1p(T) / (n + 1))",
        (ALLOC,),
        "exploration bonus with n_q + 1",
    ),
    Mutant(
        "t-quantile-one-sided",
        "xrpo/algo/allocation.py",
        "return _t_quantile(1.0 - alpha / 2.0, n - 1.0) / np.sqrt(n)",
        "return _t_quantile(1.0 - alpha, n - 1.0) / np.sqrt(n)",
        (ALLOC,),
        "one-sided t quantile in Eq. (1)",
    ),
    Mutant(
        "remainder-order",
        "xrpo/algo/allocation.py",
        "order = np.lexsort((idx, -rem))",
        "order = np.lexsort((idx, rem))",
        (ALLOC,),
        "leftover rollouts to the smallest remainders",
    ),
    Mutant(
        "phase-budget-off-by-one",
        "xrpo/algo/allocation.py",
        "per, extra = divmod(remainder, r)",
        "per, extra = divmod(remainder - 1, r)",
        (ALLOC,),
        "planning rounds one rollout short of the step's budget",
    ),
    Mutant(
        "alpha-accepts-a-confidence-level",
        "xrpo/algo/allocation.py",
        "if not 0.0 < a < 0.5:",
        "if not 0.0 < a < 1.0:",
        ("tests/trainer/test_config.py",),
        "method.alpha=0.95 (the paper table's confidence level) accepted",
    ),
    Mutant(
        "dynamic-sampling-keeps-all",
        "xrpo/algo/sampling.py",
        "keep = (gmax - gmin) > atol",
        "keep = (gmax - gmin) >= atol",
        ("tests/algo/test_sampling.py",),
        "DAPO keeps groups whose rewards are all equal",
    ),
    Mutant(
        "tree-advantage-sign",
        "xrpo/algo/tree.py",
        "a_ij = r[rows] - mean[inv]",
        "a_ij = mean[inv] - r[rows]",
        ("tests/algo/test_tree.py",),
        "TreePO's sub-group advantage with the wrong sign",
    ),
    # ------------------------------------------------------------------------------------------ xrpo/rollout/planner
    Mutant(
        "round-budget-off-by-one",
        "xrpo/rollout/planner.py",
        "[np.asarray(self.by_prompt[q]) for q in members],\n                budget,\n",
        "[np.asarray(self.by_prompt[q]) for q in members],\n                budget - 1,\n",
        (PLANNER,),
        "each planning round allocates one rollout less than its budget",
    ),
    Mutant(
        "icl-seeds-solved-prompts",
        "xrpo/rollout/planner.py",
        "return any(r >= self.cfg.full_reward for r in self.by_prompt[q])",
        "return any(r > self.cfg.full_reward for r in self.by_prompt[q])",
        (PLANNER,),
        "a prompt solved with exactly full reward is still ICL-seeded",
    ),
    Mutant(
        "icl-one-neighbour-too-many",
        "xrpo/rollout/planner.py",
        "k=cfg.icl_k,\n",
        "k=cfg.icl_k + 1,\n",
        (PLANNER,),
        "K + 1 examples in the ICL prompt",
    ),
    Mutant(
        "icl-trained-under-icl-prompt",
        "xrpo/rollout/planner.py",
        'if self.cfg.icl_train_prompt == "original":',
        'if self.cfg.icl_train_prompt != "original":',
        (PLANNER,),
        "ICL-seeded rollouts trained under the ICL prompt by default",
    ),
    Mutant(
        "flips-count-earlier-rounds",
        "xrpo/rollout/planner.py",
        "successes = step.successes(new)\n",
        "successes = step.successes(step.records)\n",
        (PLANNER, "tests/rollout/test_streaming.py"),
        "a round's successes (and flips) counted over the rollouts before it too",
    ),
    Mutant(
        "solved-frac-fixed-threshold",
        "xrpo/rollout/planner.py",
        "np.any(rewards[result.group_ids == q] >= full_reward) for q in range(num_prompts)",
        "np.any(rewards[result.group_ids == q] >= 1.0) for q in range(num_prompts)",
        (PLANNER,),
        "rollout/solved_prompt_frac ignores full_reward",
    ),
    Mutant(
        "zero-variance-counts-only-failures",
        "xrpo/rollout/planner.py",
        "zero_var += int(r.size > 0 and np.all(r == r[0]))",
        "zero_var += int(r.size > 0 and np.all(r == 0))",
        ("tests/trainer/test_train.py::test_xrpo_step_metrics_hold_the_values_of_the_step",),
        "rollout/zero_variance_group_frac misses all-correct groups",
    ),
    Mutant(
        "novelty-from-engine-logprobs",
        "xrpo/rollout/advantages.py",
        "lps = list(token_logprobs) if token_logprobs is not None else [x.logprobs for x in recs]",
        "lps = [x.logprobs for x in recs]",
        ("tests/rollout/test_advantages.py",),
        "s(y) from the sampling prompt's log-probs whatever the caller passes",
    ),
    Mutant(
        "sharpen-one-group",
        "xrpo/rollout/advantages.py",
        "scores[keep],\n            result.group_ids[keep],\n",
        "scores[keep],\n            np.zeros_like(result.group_ids[keep]),\n",
        (MECH,),
        "novelty measured against the whole batch instead of the rollout's group",
    ),
    Mutant(
        "blank-count-wrong",
        "xrpo/rollout/corpus.py",
        '"icl/skipped_empty_solutions": float(len(correct) - len(good))',
        '"icl/skipped_empty_solutions": float(len(result.records) - len(good))',
        ("tests/rollout/test_corpus.py",),
        "skipped blank solutions counted against all rollouts",
    ),
    # ------------------------------------------------------------------------------------------ xrpo/trainer
    Mutant(
        "advantages-negated",
        "xrpo/trainer/loop.py",
        "adv = torch.tensor(plan.advantages, dtype=torch.float32)",
        "adv = -torch.tensor(plan.advantages, dtype=torch.float32)",
        (MECH,),
        "the loss receives -A (the audit's first defect)",
    ),
    Mutant(
        "icl-old-logprobs-from-generation-prompt",
        "xrpo/trainer/update.py",
        "if not reuse_lp or x.train_prompt_ids != x.gen_prompt_ids]",
        "if not reuse_lp]",
        (f"{UPDATE}::test_first_minibatch_ratio_is_one_for_every_rollout_icl_seeded_included",),
        "ICL-seeded rollouts keep the ICL prompt's log-probs as old log-probs (the audit's second defect)",
    ),
    Mutant(
        "kl-sign",
        "xrpo/trainer/update.py",
        "loss = loss + m.kl_coef * kl_loss",
        "loss = loss - m.kl_coef * kl_loss",
        (f"{UPDATE}::test_kl_term_enters_the_loss_and_holds_the_policy_near_the_reference",),
        "the KL term pushes away from the reference",
    ),
    Mutant(
        "reference-is-the-policy",
        "xrpo/trainer/update.py",
        "return self.logprobs(self.ref_model, prompts,",
        "return self.logprobs(self.model, prompts,",
        (f"{UPDATE}::test_kl_term_enters_the_loss_and_holds_the_policy_near_the_reference",),
        "KL against the current policy instead of the frozen reference",
    ),
    Mutant(
        "lora-reference-keeps-adapters",
        "xrpo/trainer/update.py",
        "            with self.model.disable_adapter():",
        "            with contextlib.nullcontext():",
        ("tests/trainer/test_lora_train.py::test_only_adapters_train_are_checkpointed_and_the_reference_is_the_base",),
        "LoRA's KL reference is the adapted policy itself instead of the base model (adapters left on)",
    ),
    Mutant(
        "chunked-logprobs-ignore-temperature",
        "xrpo/trainer/logprobs.py",
        "    if temperature != 1.0:\n        logits = logits / temperature\n"
        "    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])",
        "    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])",
        ("tests/trainer/test_logprobs.py::test_chunked_logprobs_equal_the_full_forward_values_and_gradients",),
        "the chunked log-probs forget the sampling temperature",
    ),
    Mutant(
        "checkpointing-never-active",
        "xrpo/trainer/update.py",
        "    for m in layers:\n        m.training = True\n",
        "    for m in layers:\n        pass\n",
        (f"{UPDATE}::test_gradient_checkpointing_recomputes_layers_and_keeps_loss_and_gradients",),
        "gradient checkpointing configured but never run (the layers stay in eval mode, where transformers skips it)",
    ),
    Mutant(
        "reference-model-always-loaded",
        "xrpo/trainer/loop.py",
        "    if m.kl_coef > 0 and cfg.model.lora_rank == 0:\n",
        "    if True:\n",
        (f"{UPDATE}::test_without_kl_no_reference_model_is_loaded",),
        "a reference model is built (and its KL logged) with kl_coef = 0",
    ),
    Mutant(
        "clip-arguments-swapped",
        "xrpo/trainer/update.py",
        "clip_low=m.clip_low,\n                    clip_high=m.clip_high,\n",
        "clip_low=m.clip_high,\n                    clip_high=m.clip_low,\n",
        (f"{UPDATE}::test_clipping_binds_exactly_where_the_ratio_leaves_its_bounds",),
        "the trainer hands the loss swapped clip bounds",
    ),
    Mutant(
        "old-logprobs-at-temperature-1",
        "xrpo/trainer/update.py",
        "[comps[i] for i in redo], o.micro_batch_tokens, r.temperature\n        )",
        "[comps[i] for i in redo], o.micro_batch_tokens, 1.0\n        )",
        (f"{UPDATE}::test_sampling_temperature_is_used_for_old_logprobs_the_policy_forward_and_the_reference",),
        "old log-probs at temperature 1 while the rollouts were sampled at T",
    ),
    Mutant(
        "policy-forward-at-temperature-1",
        "xrpo/trainer/update.py",
        "pad_id,\n                        cfg.rollout.temperature,\n",
        "pad_id,\n                        1.0,\n",
        (f"{UPDATE}::test_sampling_temperature_is_used_for_old_logprobs_the_policy_forward_and_the_reference",),
        "the loss's policy forward ignores the sampling temperature",
    ),
    Mutant(
        "reuse-at-any-temperature",
        "xrpo/trainer/loop.py",
        " and auto_reuse)) and r.temperature == 1.0",
        " and auto_reuse))",
        (f"{UPDATE}::test_sampling_temperature_is_used_for_old_logprobs_the_policy_forward_and_the_reference",),
        "the engine's temperature-1 log-probs reused as old log-probs at another temperature",
    ),
    Mutant(
        "dropout-in-policy-forward",
        "xrpo/trainer/loop.py",
        "            # the model stays in eval mode (module docstring: dropout would break the ratio of the first "
        "mini-batch)\n",
        "            model.train()\n",
        (f"{UPDATE}::test_dropout_does_not_enter_the_policy_forward",),
        "training mode (dropout) in the policy forward, eval mode for the old log-probs",
    ),
    Mutant(
        "loss-policy-includes-kl",
        "xrpo/trainer/update.py",
        'out["loss/policy"] = float(np.mean(step_losses)) if step_losses else 0.0',
        'out["loss/policy"] = float(np.mean(step_totals)) if step_losses else 0.0',
        (f"{UPDATE}::test_kl_term_enters_the_loss_and_holds_the_policy_near_the_reference",),
        "loss/policy logs the policy loss plus beta * KL",
    ),
    Mutant(
        "ratio-extremes-averaged",
        "xrpo/trainer/update.py",
        '_EXTREMES = ("loss/ratio_max", "loss/ratio_min")',
        "_EXTREMES = ()",
        (f"{UPDATE}::test_clipping_binds_exactly_where_the_ratio_leaves_its_bounds",),
        "loss/ratio_max and loss/ratio_min averaged over micro-batches instead of max / min",
    ),
    Mutant(
        "icl-novelty-knob-ignored",
        "xrpo/trainer/loop.py",
        "**section_values(cfg.method, AdvantageConfig, AllocationConfig, ICLConfig, SharpenConfig),",
        "**section_values(cfg.method, AdvantageConfig, AllocationConfig, ICLConfig),",
        (f"{MECH}::test_icl_novelty_scores_seeded_rollouts_as_configured",),
        "the sharpening section (method.icl_novelty ...) never reaches the planner",
    ),
    Mutant(
        "novelty-not-under-training-prompt",
        "xrpo/trainer/loop.py",
        "batch_advantages(batch, pcfg, token_logprobs=old_lp, sample_logprobs=sample_lp)",
        "batch_advantages(batch, pcfg, token_logprobs=None, sample_logprobs=sample_lp)",
        (MECH,),
        "sharpening scores s(y) with the engine's log-probs (ICL prompt) instead of the training prompt's",
    ),
    # ------------------------------------------------------------------------------------ xrpo/rollout/sources.py
    Mutant(
        "dapo-keeps-flat-groups",
        "xrpo/rollout/sources.py",
        "keep = dynamic_sampling_keep_groups(b.plan.rewards, b.plan.group_ids)[: self.prompts_per_step - kept]",
        "keep = np.unique(b.plan.group_ids)[: self.prompts_per_step - kept]",
        (SOURCES,),
        "DAPO's refill keeps groups whose rewards are all equal",
    ),
    Mutant(
        "dapo-same-seed-every-batch",
        "xrpo/rollout/sources.py",
        "b = self.inner.sample(step, gen_batches)",
        "b = self.inner.sample(step, 0)",
        (SOURCES,),
        "every refill batch of a step sampled with the same seed",
    ),
    Mutant(
        "epoch-order-not-restored",
        "xrpo/rollout/sources.py",
        'self.order = EpochSampler(len(self.ctx.problems), self.ctx.seed, **state["sampler"])',
        "self.order = EpochSampler(len(self.ctx.problems), self.ctx.seed)",
        (SOURCES,),
        "a resumed run restarts the data order from the first epoch",
    ),
    Mutant(
        "cures-posterior-not-updated",
        "xrpo/rollout/sources.py",
        "plan.metrics.update(self.state.observe(idx, plan.rewards, plan.group_ids))",
        'plan.metrics.update({"cures/successes": 0.0, "cures/trials": float(plan.rewards.size)})',
        ("tests/trainer/test_cures.py::test_cures_two_steps",),
        "CurES never adds a step's rewards to its posterior",
    ),
    Mutant(
        "logprob-position-off-by-one",
        "xrpo/trainer/logprobs.py",
        "start = torch.tensor([len(p) - 1 for p in prompts])",
        "start = torch.tensor([len(p) for p in prompts])",
        ("tests/trainer/test_logprobs.py",),
        "each completion token scored by the logit that follows it instead of the one that predicts it",
    ),
    Mutant(
        "checkpoint-listed-without-its-marker",
        "xrpo/trainer/checkpoint.py",
        'and not p.name.endswith(".tmp") and (p / MARKER).exists()',
        'and not p.name.endswith(".tmp")',
        ("tests/trainer/test_checkpoint.py",),
        "a checkpoint killed before its COMPLETE marker is listed and resumed from",
    ),
    Mutant(
        "one-seed-for-every-round",
        "xrpo/rollout/planner.py",
        "    if rnd == 0 or sampling.seed is None:\n        return sampling\n",
        "    if True:\n        return sampling\n",
        (f"{PLANNER}::test_planning_rounds_do_not_redraw_the_base_rollouts_of_an_engine_seeded_per_prompt",),
        "every planning round samples with the step's seed: vLLM redraws a prompt's base rollouts as its extras",
    ),
)
