"""The single-machine XRPO / GRPO / DAPO / GSPO training loop. Reads top to bottom:

    setup       config -> output dir, model + tokenizer (+ frozen reference when kl_coef > 0), data, verifier,
                ICL corpus, rollout engine, optimizer; or all of it restored from a checkpoint (--resume)
    each step   1. rollouts   the planner (Algorithm 1): base rollouts, planning rounds, ICL seeding, verification;
                              or TreePO's tree sampler (method.sampler=tree, xrpo.rollout.treepo);
                              DAPO: dynamic sampling refills the batch with groups whose rewards differ;
                              CurES: prompts and counts from the Beta posterior, which the verified rewards update
                2. old log-probs recomputed by the training model under each rollout's training prompt
                3. advantages GRPO by group id + novelty sharpening (Eq. 6) scored on those log-probs;
                              or TreePO's tree advantage (method.tree_advantage)
                4. update     policy loss from the registry (+ beta * KL to the reference), micro-batches by token
                              budget with gradient accumulation, ppo_epochs x mini_batches optimizer steps
                5. corpus     correct rollouts join the ICL corpus (Algorithm 1 line 15)
                6. log / validate / checkpoint
    end         final validation, summary.json

Old log-probs and the engine's sampling log-probs: the engine returns log pi(y_t) at temperature 1 under the prompt the
rollout was *generated* from. The loss needs log pi_old(y_t) under the prompt it is *trained* on; for an ICL-seeded
rollout trained under the original prompt these differ, so those are always recomputed with the training model. For
the others, `optim.old_logprobs` decides: the hf engine samples with the training model itself, so its log-probs are
reused ("auto"; equal to a forward pass within 1e-5, tested); vLLM's numerics differ from the trainer's, so they are
recomputed before the update, as verl does (`compute_log_prob` before `update_actor`). With one epoch and one
mini-batch the ratio is then 1 (up to float rounding where log-probs are reused) and the clip
never binds (on-policy GRPO); the clip matters for later
mini-batches/epochs and for GSPO. Sharpening's s(y) (Eq. 4) also uses these recomputed log-probs, so novelty is
measured under the prompt the advantage is applied to (method.icl_novelty chooses otherwise for ICL-seeded rollouts).

Sampling temperature T (rollout.temperature): the rollouts are drawn from pi_T = softmax(logits / T). As verl does
(`logits.div_(temperature)` in its actor's log-prob computation), the old log-probs, the policy forward of the loss,
the reference log-probs of the KL term and sharpening's s(y) all use pi_T, so the PPO ratio compares the distribution
the tokens were drawn from with its update. The engine's log-probs are temperature-1 ones, so they are only reused
when T = 1.

Train mode: the model is never put in training mode. Old log-probs come from a forward pass without dropout (and the
hf engine samples without it); a policy forward with dropout would be a different, random function, and the ratio on
the first mini-batch would not be 1. verl and TRL switch dropout off for RL (TRL: `disable_dropout`); keeping the
model in eval mode switches off every train-only behaviour at once (dropout modules, the attention dropout that
transformers' attention layers apply only when `self.training`, MoE router noise).

Deviations from the paper (see also the planner's docstring):
    - the loss of each step is normalised over the step's whole mini-batch (global token / sequence counts), so
      gradient accumulation over micro-batches gives exactly the full-batch gradient.
    - the default learning rate is 1e-4, not the paper's 2e-6: the built-in model has 1.1M parameters.
"""
from __future__ import annotations

import copy
import json
import math
import random
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import yaml

from xrpo.algo.config import (
    AdvantageConfig, AllocationConfig, ICLConfig, ICLPromptConfig, SharpenConfig, TreePOConfig, section_values,
)
from xrpo.algo.losses import aggregate_loss, get_policy_loss, kl_penalty
from xrpo.algo.sampling import dynamic_sampling_keep_groups
from xrpo.rewards import get_verifier, raise_reference_errors
from xrpo.rollout import cures as cures_lib
from xrpo.rollout.engine import SamplingParams
from xrpo.rollout.planner import (
    PlanConfig, PlanResult, compute_advantages, generate_rollouts, rollout_metrics, update_corpus,
)
from xrpo.rollout.treepo import TreeConfig, generate_tree_rollouts, merge_tree_metrics
from xrpo.rollout.validate import sample_and_score
from xrpo.trainer import checkpoint as ckpt
from xrpo.trainer.config import TrainConfig, from_dict, to_dict
from xrpo.trainer.logging import RunLogger
from xrpo.trainer.logprobs import all_completion_logprobs, completion_logprobs, micro_batches
from xrpo.trainer.setup import build_engine, load_corpus, load_data, load_model, make_renderer, new_corpus

class NonFiniteLossError(RuntimeError):
    pass


@dataclass
class StepReport:
    """What one training step did, handed to ``train(on_step=...)`` after the step is logged. The objects are the
    loop's own (the corpus keeps changing in later steps): read them, copy what you keep."""

    step: int
    problems: list
    """The step's prompts; ``plan.records[i].problem_index`` indexes this list."""
    plan: PlanResult
    """Rollouts (records with prompts, completions, rewards, rounds, ICL seeding), group ids, the advantages the loss
    was given (``plan.advantages``; None for a step without rollouts) and the per-round allocations."""
    old_logprobs: list
    """Per rollout, the old log-probs of the PPO ratio (under the prompt it is trained under, at the sampling
    temperature)."""
    metrics: dict
    """The row written to metrics.jsonl for this step."""
    corpus: object | None
    """The ICL corpus after this step's update (None without ICL)."""

class EpochSampler:
    """Data order: a fresh permutation per epoch from (seed, epoch); its state is two integers, so resume is exact."""

    def __init__(self, n: int, seed: int, epoch: int = 0, pos: int = 0):
        self.n, self.seed, self.epoch, self.pos = n, seed, epoch, pos

    def _perm(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.n)

    def next(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            perm = self._perm()
            take = min(k - len(out), self.n - self.pos)
            out.extend(int(i) for i in perm[self.pos : self.pos + take])
            self.pos += take
            if self.pos == self.n:
                self.epoch, self.pos = self.epoch + 1, 0
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

def plan_config(cfg: TrainConfig) -> PlanConfig:
    """The planner's config: the method and rollout sections it embeds, and the step's budget."""
    return PlanConfig(
        rollouts_per_step=cfg.rollout.rollouts_per_step,
        **section_values(cfg.method, AdvantageConfig, AllocationConfig, ICLConfig, SharpenConfig),
        **section_values(cfg.rollout, ICLPromptConfig),
    )

def tree_config(cfg: TrainConfig) -> TreeConfig:
    return TreeConfig(rollouts_per_step=cfg.rollout.rollouts_per_step, **section_values(cfg.method, TreePOConfig))

def merge_plans(parts: list[tuple[list, PlanResult, np.ndarray]], full_reward: float = 1.0) -> tuple[list, PlanResult]:
    """Concatenate the kept groups of several generation batches (DAPO), renumbering problems and group ids."""
    problems, records, rounds = [], [], []
    metrics: dict[str, float] = {}
    for probs, res, keep in parts:
        remap = {}
        for g in keep:
            remap[int(g)] = len(problems)
            problems.append(probs[int(g)])
        for x in res.records:
            if x.group_id in remap:
                y = copy.copy(x)
                y.problem_index = y.group_id = remap[x.group_id]
                records.append(y)
        rounds.extend(res.rounds)
        for k, v in res.metrics.items():
            if k.startswith("time/"):
                metrics[k] = metrics.get(k, 0.0) + v
    merged = PlanResult(
        records=records,
        rewards=np.array([x.reward for x in records], dtype=np.float64),
        group_ids=np.array([x.group_id for x in records], dtype=np.int64),
        rounds=rounds, metrics=metrics,
    )
    # rollout / alloc / icl figures describe the kept groups, not the last generation batch before filtering
    if problems:
        merged.metrics.update(rollout_metrics(merged, len(problems), full_reward=full_reward))
    merged.metrics.update(merge_tree_metrics([res.metrics for _, res, _ in parts]))  # TreePO: every batch's trees
    return problems, merged

def train(cfg: TrainConfig, *, resume: str | None = None, log=print,
          on_step: Callable[[StepReport], None] | None = None) -> dict:
    """Run the configured training (or resume one) and return the summary (also in summary.json). ``on_step`` is
    called after every step with a `StepReport` (for tests, custom logging or early stopping by raising)."""
    # ================================================================ setup
    t_start = time.perf_counter()
    state: dict = {}
    ckpt_path = None
    if resume:
        ckpt_path = ckpt.find_resume_checkpoint(resume)
        state = ckpt.load_state(ckpt_path)
        output = ckpt_path.parent.parent
        saved = yaml.safe_load((output / "config.yaml").read_text())
        cfg = from_dict(saved)
        log(f"resuming {output} from {ckpt_path.name}")
    else:
        cfg.validate()
        output = Path(cfg.output or Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S"))
        output.mkdir(parents=True, exist_ok=True)
        cfg.output = str(output)
        (output / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    m, r, o = cfg.method, cfg.rollout, cfg.optim
    threads = cfg.threads or (1 if cfg.model.path == "default" else None)
    if threads:
        torch.set_num_threads(threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    train_problems, heldout = load_data(cfg, log=log)
    model, tokenizer, init_path = load_model(cfg, log=log)
    if ckpt_path is not None:
        model, tokenizer, _ = load_model(cfg, path=str(ckpt_path / "model"), log=log)
    ref_model = None
    if m.kl_coef > 0:
        # the reference is the initial policy, also on resume
        ref_model, _, _ = load_model(cfg, path=init_path, log=lambda *_: None)
        ref_model.eval().requires_grad_(False)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    renderer = make_renderer(cfg, tokenizer)
    every = train_problems + heldout
    encoded = tokenizer([renderer.render(p) for p in every], add_special_tokens=False)["input_ids"]
    for p, ids in zip(every, encoded):
        if len(ids) > cfg.data.max_prompt_tokens:
            raise ValueError(f"problem {p.id}: prompt has {len(ids)} tokens, more than data.max_prompt_tokens="
                             f"{cfg.data.max_prompt_tokens}")
    verifier = get_verifier(cfg.data.verifier, **cfg.data.verifier_args)
    raise_reference_errors(verifier, train_problems, f"data.train ({cfg.data.train})")
    raise_reference_errors(verifier, heldout, f"data.heldout ({cfg.data.heldout})")
    corpus = None
    if m.icl:
        corpus = load_corpus(cfg, ckpt_path / "corpus") if ckpt_path is not None else new_corpus(cfg)
    engine = build_engine(cfg, model, tokenizer)
    pcfg = plan_config(cfg)
    tcfg = tree_config(cfg) if m.sampler == "tree" else None

    def sample_rollouts(batch: list, sampling: SamplingParams) -> PlanResult:
        # method.sampler: TreePO's trees of segments, or the planner's independent rollouts (Algorithm 1)
        if tcfg is not None:
            return generate_tree_rollouts(batch, engine, verifier, renderer, tcfg, sampling)
        return generate_rollouts(batch, engine, verifier, renderer, pcfg, sampling, corpus=corpus)
    # the hf engine samples with the training model itself, so its temperature-1 log-probs are the old log-probs at
    # temperature 1; at any other temperature they are not the sampling distribution's (validate refuses "reuse" there)
    reuse_lp = (o.old_logprobs == "reuse" or (o.old_logprobs == "auto" and r.engine == "hf")) and r.temperature == 1.0
    loss_fn = get_policy_loss(m.policy_loss)

    optimizer = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)

    def lr_lambda(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "cosine":
            frac = (step - o.warmup_steps) / max(1, cfg.steps - o.warmup_steps)
            return 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        return 1.0

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    sampler = EpochSampler(len(train_problems), cfg.seed)
    # CurES replaces the epoch order: its posterior picks the prompts (and their counts) of every step
    cures = None
    if m.allocation == "cures":
        cures = cures_lib.CuresState.new(
            len(train_problems), prior_alpha=m.cures_prior_alpha, prior_beta=m.cures_prior_beta,
            temp_scale=m.cures_temp_scale, min_count=m.cures_min_count, success_threshold=m.cures_success_threshold,
        )
        if r.prompts_per_step > len(train_problems):
            raise ValueError(f"rollout.prompts_per_step={r.prompts_per_step}: CurES draws that many distinct problems "
                             f"per step, but the training set has {len(train_problems)}")
    start_step = 0
    history: list[dict] = []
    if ckpt_path is not None:
        optimizer.load_state_dict(torch.load(ckpt_path / "optimizer.pt", weights_only=False))
        scheduler.load_state_dict(torch.load(ckpt_path / "scheduler.pt", weights_only=False))
        ckpt.set_rng_state(torch.load(ckpt_path / "rng.pt", weights_only=False))
        sampler = EpochSampler(len(train_problems), cfg.seed, **state["sampler"])
        start_step = state["step"]
        history = state.get("eval_history", [])
        if cures is not None:
            if "cures" not in state:
                raise ckpt.CheckpointError(f"checkpoint {ckpt_path} has no CurES state (state.json: 'cures')")
            cures.load_state_dict(state["cures"])

    # on resume the records are first brought back to the checkpoint's step (the killed run may have logged later ones)
    logger = RunLogger(output, cfg, resume_state=state if ckpt_path is not None else None, t_start=t_start, log=log)
    eval_sampling = SamplingParams(temperature=cfg.eval_temperature, top_p=1.0, max_new_tokens=r.max_new_tokens,
                                   stop=tuple(r.stop), seed=cfg.seed + 7)

    def validate(step: int) -> dict:
        t0 = time.perf_counter()
        vm, _ = sample_and_score(heldout, engine, verifier, renderer, n=cfg.eval_samples, sampling=eval_sampling,
                                 ks=cfg.eval_k)
        vm["time/validate"] = time.perf_counter() - t0
        history.append({"step": step, **vm})
        return vm

    if start_step == 0:
        before = validate(0)
        state["before"] = before
        logger.log_eval(0, before)
        if cures is not None and m.cures_warmup_rollouts > 0:
            # CurES's precompute stage: the posterior starts from rollouts of every problem under the initial model
            per_call = max(1, r.rollouts_per_step // m.cures_warmup_rollouts)
            wm = cures_lib.warmup(
                cures, train_problems, engine, verifier, renderer, m.cures_warmup_rollouts,
                lambda call: SamplingParams(temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens,
                                            stop=tuple(r.stop), seed=cfg.seed * 1_000_003 + 999_983 + call),
                per_call,
            )
            state["cures_warmup"] = wm
            log(f"CurES warm-up: {wm['cures/warmup_rollouts']:.0f} rollouts of {len(train_problems)} problems in "
                f"{wm['cures/warmup_time_s']:.1f}s (mean posterior accuracy {wm['cures/warmup_p_mean']:.3f})")
    before = state.get("before", {})

    # ================================================================ training steps
    step = start_step
    totals = {k: 0.0 for k in ["alloc/rounds", "alloc/nonuniform_rounds", "alloc/max_extra", "icl/seeded_prompts",
                               "icl/flips", "adv/sharpened_count"]}
    totals.update(state.get("totals", {}))
    for step in range(start_step + 1, cfg.steps + 1):
        if cfg.time_limit is not None and time.perf_counter() - t_start > cfg.time_limit:
            log(f"time limit of {cfg.time_limit:.0f}s reached after step {step - 1}")
            step -= 1
            break
        t_step = time.perf_counter()
        model.eval()
        # -------- 1. rollouts (Algorithm 1 lines 1-13; DAPO refills with informative groups)
        def sampling_for(batch: int) -> SamplingParams:
            return SamplingParams(temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens,
                                  stop=tuple(r.stop), seed=cfg.seed * 1_000_003 + step * 101 + batch)

        if m.dynamic_sampling:
            parts, kept, gen_batches = [], 0, 0
            while kept < r.prompts_per_step and gen_batches < m.max_gen_batches:
                batch = [train_problems[i] for i in sampler.next(r.prompts_per_step)]
                res = sample_rollouts(batch, sampling_for(gen_batches))
                keep = dynamic_sampling_keep_groups(res.rewards, res.group_ids)[: r.prompts_per_step - kept]
                parts.append((batch, res, keep))
                kept += len(keep)
                gen_batches += 1
            problems, plan = merge_plans(parts, full_reward=pcfg.full_reward)
            plan.metrics["rollout/gen_batches"] = float(gen_batches)
            plan.metrics["rollout/kept_groups"] = float(kept)
        elif cures is not None:
            # CurES: draw prompts from the posterior (generator seeded by the step: resume draws the same), generate
            # the counts in one batch, then add the verified rewards to the posterior
            idx, counts, cm = cures.select(r.prompts_per_step, r.rollouts_per_step,
                                           np.random.default_rng([cfg.seed, step, 31]))
            problems = [train_problems[i] for i in idx]
            plan = generate_rollouts(problems, engine, verifier, renderer, pcfg, sampling_for(0), corpus=corpus,
                                     counts=[int(c) for c in counts])
            plan.metrics.update(cm)
            plan.metrics.update(cures.observe(idx, plan.rewards, plan.group_ids))
        else:
            problems = [train_problems[i] for i in sampler.next(r.prompts_per_step)]
            plan = sample_rollouts(problems, sampling_for(0))
        records = plan.records
        metrics = dict(plan.metrics)

        if records:
            # -------- 2. old log-probs under the training prompts
            t0 = time.perf_counter()
            prompts = [x.train_prompt_ids for x in records]
            comps = [x.completion_ids for x in records]
            old_lp = [list(x.logprobs) for x in records]
            redo = [i for i, x in enumerate(records) if not reuse_lp or x.train_prompt_ids != x.gen_prompt_ids]
            if redo:
                fresh = all_completion_logprobs(model, [prompts[i] for i in redo], [comps[i] for i in redo], pad_id,
                                                o.micro_batch_tokens, r.temperature)
                for i, v in zip(redo, fresh):
                    old_lp[i] = v
            metrics["loss/recomputed_old_logprobs"] = float(len(redo))
            ref_lp = (all_completion_logprobs(ref_model, prompts, comps, pad_id, o.micro_batch_tokens, r.temperature)
                      if ref_model is not None else None)
            metrics["time/old_logprobs"] = time.perf_counter() - t0
            if not all(math.isfinite(v) for row in old_lp for v in row):
                raise NonFiniteLossError(
                    f"the policy's log-probs are non-finite at step {step} (the model diverged); nothing was saved "
                    f"over the last good checkpoint. Lower optim.lr or enable optim.grad_clip."
                )

            # -------- 3. advantages (Algorithm 1 line 14)
            sample_lp = None
            if pcfg.sharpen and pcfg.icl_novelty == "sample":
                # method.icl_novelty=sample: ICL-seeded rollouts are scored under the prompt they were sampled from
                moved = [i for i, x in enumerate(records) if x.seeded and x.train_prompt_ids != x.gen_prompt_ids]
                sample_lp = [list(x.logprobs) for x in records]
                if moved and not reuse_lp:
                    fresh = all_completion_logprobs(model, [records[i].gen_prompt_ids for i in moved],
                                                    [comps[i] for i in moved], pad_id, o.micro_batch_tokens,
                                                    r.temperature)
                    for i, v in zip(moved, fresh):
                        sample_lp[i] = v
            compute_advantages(plan, pcfg, token_logprobs=old_lp, sample_logprobs=sample_lp)
            metrics.update({k: v for k, v in plan.metrics.items() if k.startswith("adv/")})

            # -------- 4. policy update
            t0 = time.perf_counter()
            # the model stays in eval mode (module docstring: dropout would break the ratio of the first mini-batch)
            adv = torch.tensor(plan.advantages, dtype=torch.float32)
            upd = _update(model, optimizer, loss_fn, cfg, records, adv, old_lp, ref_lp, pad_id, step)
            scheduler.step()
            metrics.update(upd)
            metrics["time/update"] = time.perf_counter() - t0
            # the next step samples from the updated policy: a no-op for the hf engine (it holds this very model),
            # a weight load for vLLM
            engine.sync_weights(model)
        else:
            metrics["loss/skipped_empty_batch"] = 1.0

        # -------- 5. corpus update (Algorithm 1 line 15)
        if corpus is not None:
            metrics.update(update_corpus(plan, problems, corpus, pcfg, step))
            metrics["icl/corpus_problems"] = float(len(corpus))
            metrics["icl/corpus_solutions"] = float(corpus.num_solutions)

        # -------- 6. log / validate / checkpoint
        metrics["optim/lr"] = scheduler.get_last_lr()[0]
        metrics["time/step"] = time.perf_counter() - t_step
        logger.log_step(step, metrics)
        logger.log_rounds(step, plan.rounds)
        if on_step is not None:
            on_step(StepReport(step=step, problems=problems, plan=plan, old_logprobs=old_lp if records else [],
                               metrics=metrics, corpus=corpus))
        for k in totals:
            if k != "alloc/max_extra":
                totals[k] += metrics.get(k, 0.0)
        totals["alloc/max_extra"] = max(totals["alloc/max_extra"], metrics.get("alloc/max_extra", 0.0))
        if cfg.log_samples_every and step % cfg.log_samples_every == 0:
            logger.log_samples(step, problems, records)
        if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
            logger.log_eval(step, validate(step))
        if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps:
            state["totals"] = dict(totals)
            state.update(logger.checkpoint_state(step))
            if cures is not None:
                state["cures"] = cures.state_dict()
            _save(output, step, model, tokenizer, optimizer, scheduler, corpus, sampler, state, history, cfg)

    # ================================================================ end
    model.eval()
    final_step = step
    if history and history[-1]["step"] == final_step:
        # this model is validated already (stopped by time_limit after an eval_every step, or a finished run resumed)
        after = {k: v for k, v in history[-1].items() if k != "step"}
    else:
        after = validate(final_step)
        logger.log_eval(final_step, after)
    if not ckpt.list_checkpoints(output) or ckpt.list_checkpoints(output)[-1].name != f"step-{final_step:08d}":
        state["totals"] = dict(totals)
        state.update(logger.checkpoint_state(final_step))
        if cures is not None:
            state["cures"] = cures.state_dict()
        _save(output, final_step, model, tokenizer, optimizer, scheduler, corpus, sampler, state, history, cfg)
    else:
        # the final checkpoint was written before the final validation: it learns it (a resumed run then keeps its
        # row) and this segment's end, after the row is logged (a kill in between: the row is set aside, redone)
        ckpt.update_state(ckpt.list_checkpoints(output)[-1], eval_history=history,
                          **logger.checkpoint_state(final_step))
    key = "eval/pass@1"
    summary = {
        "method": m.name,
        "steps": final_step,
        "heldout_problems": len(heldout),
        "heldout_samples_per_problem": cfg.eval_samples,
        "heldout_before": before,
        "heldout_after": after,
        "pass@1_before": before.get(key),
        "pass@1_after": after.get(key),
        "eval_history": history,
        "xrpo": {
            "planned_rounds": int(totals["alloc/rounds"]),
            "nonuniform_round_share": totals["alloc/nonuniform_rounds"] / max(totals["alloc/rounds"], 1.0),
            "max_extra": totals["alloc/max_extra"],
            "seeded_prompts": totals["icl/seeded_prompts"],
            "flips": totals["icl/flips"],
            "sharpened": totals["adv/sharpened_count"],
        },
        **({"cures": {
            "warmup_rollouts": cures.warmup_rollouts,
            "warmup_time_s": state.get("cures_warmup", {}).get("cures/warmup_time_s", 0.0),
            "seen_frac": float(np.mean(cures.trials > 0)),
            "rollouts_observed": int(cures.trials.sum()),
        }} if cures is not None else {}),
        **logger.run_totals(final_step),  # wall time, rollouts, tokens over every segment of a resumed run
        "output": str(output),
        "final_checkpoint": str(ckpt.list_checkpoints(output)[-1]),
    }
    ckpt.write_atomic(output / "summary.json", json.dumps(summary, indent=1))
    logger.close(summary)
    return summary

def _save(output, step, model, tokenizer, optimizer, scheduler, corpus, sampler, state, history, cfg) -> None:
    st = {"sampler": sampler.state(), "before": state.get("before", {}), "eval_history": history,
          "totals": state.get("totals", {})}
    for key in ("cures", "cures_warmup", "segments"):  # CurES's posterior and warm-up; the run's segments
        if key in state:
            st[key] = state[key]
    ckpt.save_checkpoint(output, step, model=model, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler,
                         state=st, corpus=corpus, keep_last=cfg.keep_last)

def _update(model, optimizer, loss_fn, cfg: TrainConfig, records, adv, old_lp, ref_lp, pad_id, step) -> dict:
    """ppo_epochs x mini_batches optimizer steps; each mini-batch accumulates micro-batches bounded by tokens."""
    m, o = cfg.method, cfg.optim
    n = len(records)
    sums: dict[str, float] = {}
    weight = 0.0
    grad_norms = []
    step_losses: list[float] = []
    step_kls: list[float] = []
    step_totals: list[float] = []
    extremes: dict[str, float] = {}
    rng = np.random.default_rng([cfg.seed, step, 17])
    for _ in range(o.ppo_epochs):
        order = rng.permutation(n) if o.mini_batches > 1 else np.arange(n)
        for mb in np.array_split(order, o.mini_batches):
            mb = [int(i) for i in mb]
            if not mb:
                continue
            global_tokens = sum(len(records[i].completion_ids) for i in mb)
            lengths = [len(records[i].train_prompt_ids) + len(records[i].completion_ids) for i in mb]
            optimizer.zero_grad(set_to_none=True)
            # with global denominators the micro-batch losses add up to the mini-batch loss exactly
            mb_loss = mb_kl = mb_total = 0.0
            for micro in micro_batches(lengths, o.micro_batch_tokens):
                idx = [mb[j] for j in micro]
                lp, mask = completion_logprobs(
                    model, [records[i].train_prompt_ids for i in idx], [records[i].completion_ids for i in idx],
                    pad_id, cfg.rollout.temperature,
                )
                old = _pad([old_lp[i] for i in idx], lp.shape[1])
                loss, lm = loss_fn(
                    lp, old, adv[idx], mask, clip_low=m.clip_low, clip_high=m.clip_high, agg_mode=m.loss_agg,
                    global_tokens=global_tokens, global_seqs=len(mb), max_tokens=cfg.rollout.max_new_tokens,
                )
                mb_loss += float(loss.detach())
                if ref_lp is not None:
                    kl = kl_penalty(lp, _pad([ref_lp[i] for i in idx], lp.shape[1]), kind=m.kl_estimator)
                    kl_loss = aggregate_loss(kl, mask, m.loss_agg, global_tokens=global_tokens,
                                             global_seqs=len(mb), max_tokens=cfg.rollout.max_new_tokens)
                    mb_kl += float(kl_loss.detach())
                    loss = loss + m.kl_coef * kl_loss
                if not torch.isfinite(loss):
                    raise NonFiniteLossError(
                        f"non-finite loss ({float(loss)}) at step {step}; nothing was saved over the last good "
                        f"checkpoint. Lower optim.lr or check the rewards/log-probs."
                    )
                loss.backward()
                mb_total += float(loss.detach())
                w = float(mask.sum())
                if w > 0:  # ratio statistics of a micro-batch without valid tokens are NaN; it carries no weight
                    for k, v in lm.items():
                        if k in _EXTREMES:
                            pick = max if k.endswith("_max") else min
                            extremes[k] = pick(extremes[k], float(v)) if k in extremes else float(v)
                        else:
                            sums[k] = sums.get(k, 0.0) + float(v) * w
                    weight += w
            step_losses.append(mb_loss)
            step_totals.append(mb_total)
            if ref_lp is not None:
                step_kls.append(mb_kl)
            if o.grad_clip > 0:
                gn = torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
            else:
                gn = torch.sqrt(sum((p.grad.detach() ** 2).sum() for p in model.parameters() if p.grad is not None))
            if not torch.isfinite(gn):
                raise NonFiniteLossError(f"non-finite gradient norm at step {step}; nothing was saved")
            grad_norms.append(float(gn))
            optimizer.step()
            # a finite loss can still step the weights to inf/NaN (e.g. a far too large learning rate); stop here,
            # before the next generation or checkpoint sees them
            if not all(torch.isfinite(p).all() for p in model.parameters()):
                raise NonFiniteLossError(
                    f"non-finite parameters after the optimizer step at step {step}; nothing was saved over the "
                    f"last good checkpoint. Lower optim.lr or enable optim.grad_clip."
                )
    out = {k: v / max(weight, 1.0) for k, v in sums.items()}
    out.update(extremes)
    out["loss/policy"] = float(np.mean(step_losses)) if step_losses else 0.0
    if step_kls:
        out["loss/kl"] = float(np.mean(step_kls))
        out["loss/total"] = float(np.mean(step_totals))
    out["loss/grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
    out["loss/tokens"] = float(sum(len(x.completion_ids) for x in records))
    return out

# per-micro-batch extremes of the loss metrics: the step's value is their max / min, not a token-weighted mean
_EXTREMES = ("loss/ratio_max", "loss/ratio_min")


def _pad(rows: list[list[float]], T: int) -> torch.Tensor:
    out = torch.zeros((len(rows), T), dtype=torch.float32)
    for i, v in enumerate(rows):
        out[i, : len(v)] = torch.tensor(v, dtype=torch.float32)
    return out
