"""The policy update of a training step: old log-probs under each rollout's training prompt, then
``optim.ppo_epochs x optim.mini_batches`` optimizer steps of the registered policy loss (+ beta * KL to the reference),
each accumulating micro-batches bounded by ``optim.micro_batch_tokens``.

The old log-probs are recomputed by the training model under the prompt each rollout is trained on (always for an
ICL-seeded rollout trained under its original prompt; otherwise unless ``optim.old_logprobs`` reuses the engine's), at
the sampling temperature, as verl does; docs/methods.md, "The policy update", explains the choices. The loss of a
mini-batch is normalised over the whole mini-batch (global token / sequence counts), so accumulating micro-batches
gives exactly the full-batch gradient.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from xrpo.algo.losses import aggregate_loss, is_advantage_weighted, kl_penalty
from xrpo.trainer.config import TrainConfig
from xrpo.trainer.logprobs import all_completion_logprobs, completion_logprobs, micro_batches


class NonFiniteLossError(RuntimeError):
    pass


@dataclass
class Policy:
    """The model being trained and what updates it."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable
    """The policy loss from the registry (`xrpo.algo.losses.get_policy_loss`)."""
    pad_id: int
    ref_model: torch.nn.Module | None = None
    """The frozen reference of the KL term (None when method.kl_coef = 0)."""
    reuse_logprobs: bool = False
    """Reuse the engine's log-probs as old log-probs where a rollout is trained under the prompt it was sampled from."""
    reference_is_base: bool = False
    """The KL reference is ``model`` with its LoRA adapters disabled (no second copy of the base model)."""
    autocast_dtype: torch.dtype | None = None
    """Mixed precision: every forward runs under `torch.autocast` in this dtype (float32 master weights)."""
    logprob_chunk_tokens: int | None = None
    """Completion tokens per chunk of the output projection (`xrpo.trainer.logprobs.chunked_token_logprobs`)."""
    gradient_checkpointing: bool = False
    """The training forward recomputes each decoder layer's activations in the backward pass."""

    @property
    def has_reference(self) -> bool:
        return self.ref_model is not None or self.reference_is_base

    def compute(self):
        """The context every forward of the policy (and reference) runs in: autocast for mixed precision."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(next(self.model.parameters()).device.type, dtype=self.autocast_dtype)

    def logprobs(self, model, prompts, completions, token_budget: int, temperature: float) -> list[list[float]]:
        """`all_completion_logprobs` of ``model`` (the policy or the reference) in this policy's compute context."""
        with self.compute():
            return all_completion_logprobs(
                model, prompts, completions, self.pad_id, token_budget, temperature, self.logprob_chunk_tokens
            )

    def reference_logprobs(self, prompts, completions, token_budget: int, temperature: float) -> list[list[float]]:
        if self.reference_is_base:
            with self.model.disable_adapter():
                return self.logprobs(self.model, prompts, completions, token_budget, temperature)
        return self.logprobs(self.ref_model, prompts, completions, token_budget, temperature)


@contextlib.contextmanager
def checkpointing(model, enabled: bool):
    """transformers runs a decoder layer under gradient checkpointing only when that layer is in training mode; the
    trainer keeps the model in eval mode (no dropout, so that the first mini-batch's ratio is exactly 1). Inside this
    block only the layers that carry transformers' checkpointing switch are flagged as training: their submodules,
    dropout included, stay in eval mode, so the forward computes exactly what it computes outside."""
    if not enabled:
        yield
        return
    from transformers import PreTrainedModel

    layers = [
        m
        for m in model.modules()
        if getattr(m, "gradient_checkpointing", False) is True and not m.training and not isinstance(m, PreTrainedModel)
    ]
    for m in layers:
        m.training = True
    try:
        yield
    finally:
        for m in layers:
            m.training = False


@dataclass
class UpdateBatch:
    """One step's rollouts as the update sees them."""

    records: list
    advantages: torch.Tensor
    """(N,) one advantage per rollout."""
    old_logprobs: list
    """Per rollout, log pi_old of its completion tokens under its training prompt, at the sampling temperature."""
    ref_logprobs: list | None
    """Per rollout, the reference model's log-probs (None without a KL term)."""


def old_logprobs(policy: Policy, records: list, cfg: TrainConfig, step: int) -> tuple[list, list | None, float]:
    """The old log-probs of the PPO ratio and the reference log-probs (None without a reference model) of every
    rollout under its training prompt, and how many rows were recomputed."""
    r, o = cfg.rollout, cfg.optim
    reuse_lp = policy.reuse_logprobs
    prompts = [x.train_prompt_ids for x in records]
    comps = [x.completion_ids for x in records]
    old_lp = [list(x.logprobs) for x in records]
    redo = [i for i, x in enumerate(records) if not reuse_lp or x.train_prompt_ids != x.gen_prompt_ids]
    if redo:
        fresh = policy.logprobs(
            policy.model, [prompts[i] for i in redo], [comps[i] for i in redo], o.micro_batch_tokens, r.temperature
        )
        for i, v in zip(redo, fresh):
            old_lp[i] = v
    ref_lp = (
        policy.reference_logprobs(prompts, comps, o.micro_batch_tokens, r.temperature) if policy.has_reference else None
    )
    if not all(math.isfinite(v) for row in old_lp for v in row):
        raise NonFiniteLossError(
            f"the policy's log-probs are non-finite at step {step} (the model diverged); nothing was saved "
            f"over the last good checkpoint. Lower optim.lr or enable optim.grad_clip."
        )
    return old_lp, ref_lp, float(len(redo))


def sample_logprobs(policy: Policy, records: list, cfg: TrainConfig) -> list | None:
    """method.icl_novelty=sample: the log-probs sharpening scores an ICL-seeded rollout with, under the prompt it was
    sampled from (the engine's, unless they cannot be reused); None when sharpening does not need them."""
    m, r, o = cfg.method, cfg.rollout, cfg.optim
    if not (m.sharpen and m.icl_novelty == "sample"):
        return None
    moved = [i for i, x in enumerate(records) if x.seeded and x.train_prompt_ids != x.gen_prompt_ids]
    sample_lp = [list(x.logprobs) for x in records]
    if moved and not policy.reuse_logprobs:
        fresh = policy.logprobs(
            policy.model,
            [records[i].gen_prompt_ids for i in moved],
            [records[i].completion_ids for i in moved],
            o.micro_batch_tokens,
            r.temperature,
        )
        for i, v in zip(moved, fresh):
            sample_lp[i] = v
    return sample_lp


def zero_gradient(batch: UpdateBatch, cfg: TrainConfig) -> bool:
    """Whether the step's loss has a gradient of exactly 0, known without computing it: every advantage is 0, the
    policy loss is advantage-weighted (registered so: every term a multiple of an advantage, as the built-in clipped
    surrogates are) and there is no KL term. With method.kl_coef > 0 the update always runs: the KL term pulls the
    policy back wherever it differs from the reference (k1's gradient is the log-probs' own, never 0; k3's is 0 only
    where the log-probs equal the reference's exactly, which only the forward pass would tell), and AdamW turns even a
    tiny gradient into a step of about the learning rate."""
    return (
        batch.ref_logprobs is None
        and is_advantage_weighted(cfg.method.policy_loss)
        and not bool(torch.any(batch.advantages != 0))
    )


def _zero_grads(model: torch.nn.Module) -> None:
    """Every trained parameter's gradient set to 0, as a backward pass of a loss whose gradient is 0 leaves it (every
    trained parameter of a causal LM takes part in its forward, so each gets a gradient tensor)."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)


def policy_update(policy: Policy, batch: UpdateBatch, cfg: TrainConfig, step: int) -> dict:
    """ppo_epochs x mini_batches optimizer steps; each mini-batch accumulates micro-batches bounded by tokens.

    When the gradient is exactly 0 (`zero_gradient`: every advantage 0, no KL term) the forward and backward passes
    are left out and each optimizer step gets zero gradients: AdamW's state advances (its step count, the decay of its
    moments) and weight decay applies exactly as after the full computation, so the parameters and the optimizer's
    state after the step are the same (tests/trainer/test_update.py); the ratio and clip metrics of the loss, which
    only the forward pass gives, are then not logged, and ``loss/skipped_zero_advantage`` is."""
    m, o = cfg.method, cfg.optim
    skip = zero_gradient(batch, cfg)
    model, optimizer, loss_fn, pad_id = policy.model, policy.optimizer, policy.loss_fn, policy.pad_id
    records, adv, old_lp, ref_lp = batch.records, batch.advantages, batch.old_logprobs, batch.ref_logprobs
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
            if skip:
                _zero_grads(model)
            for micro in [] if skip else micro_batches(lengths, o.micro_batch_tokens):
                idx = [mb[j] for j in micro]
                with policy.compute(), checkpointing(model, policy.gradient_checkpointing):
                    lp, mask = completion_logprobs(
                        model,
                        [records[i].train_prompt_ids for i in idx],
                        [records[i].completion_ids for i in idx],
                        pad_id,
                        cfg.rollout.temperature,
                        policy.logprob_chunk_tokens,
                    )
                # the loss's inputs on the device of the log-probs (the model's: CUDA on a GPU)
                old = _pad([old_lp[i] for i in idx], lp.shape[1]).to(lp.device)
                loss, lm = loss_fn(
                    lp,
                    old,
                    adv[idx].to(lp.device),
                    mask,
                    clip_low=m.clip_low,
                    clip_high=m.clip_high,
                    agg_mode=m.loss_agg,
                    global_tokens=global_tokens,
                    global_seqs=len(mb),
                    max_tokens=cfg.rollout.max_new_tokens,
                )
                mb_loss += float(loss.detach())
                if ref_lp is not None:
                    kl = kl_penalty(lp, _pad([ref_lp[i] for i in idx], lp.shape[1]).to(lp.device), kind=m.kl_estimator)
                    kl_loss = aggregate_loss(
                        kl,
                        mask,
                        m.loss_agg,
                        global_tokens=global_tokens,
                        global_seqs=len(mb),
                        max_tokens=cfg.rollout.max_new_tokens,
                    )
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
                gn = torch.sqrt(
                    sum((p.grad.detach().float() ** 2).sum() for p in model.parameters() if p.grad is not None)
                )
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
    if skip:
        out["loss/skipped_zero_advantage"] = 1.0
    return out


# per-micro-batch extremes of the loss metrics: the step's value is their max / min, not a token-weighted mean
_EXTREMES = ("loss/ratio_max", "loss/ratio_min")


def _pad(rows: list[list[float]], T: int) -> torch.Tensor:
    out = torch.zeros((len(rows), T), dtype=torch.float32)
    for i, v in enumerate(rows):
        out[i, : len(v)] = torch.tensor(v, dtype=torch.float32)
    return out
