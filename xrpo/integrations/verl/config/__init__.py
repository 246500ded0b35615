"""The `algorithm.xrpo` config block of a verl run, and the checks that tie it to the rest of verl's config.

`XRPOConfig` is a verl `BaseConfig` dataclass, so verl's own machinery builds and validates it:
``verl.utils.config.omega_conf_to_dataclass(config.algorithm.xrpo)`` instantiates it through the block's ``_target_``
and its ``__post_init__`` rejects bad values. `validate_xrpo_config` adds the cross-section checks (budget against the
batch, the legacy trainer, and the verl settings `RayXRPOTrainer` does not honour: rollout correction, rollout skip,
critic warm-up). The hydra configs next to this file: ``xrpo_base.yaml`` holds this block with the paper's §4.1
defaults and the verl settings XRPO needs (estimator, reward function, KL loss, legacy driver); ``xrpo_trainer.yaml``
is verl's ``ppo_trainer`` followed by it.

Field names and meanings are those of `xrpo.rollout.planner.PlanConfig` (the single-machine planner), whose checks are
reused; the step's rollout budget is verl's ``data.train_batch_size * actor_rollout_ref.rollout.n`` unless
``rollouts_per_step`` sets it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from verl.base_config import BaseConfig

from xrpo.algo.allocation import check_significance
from xrpo.rollout.planner import PlanConfig

__all__ = ["BATCH_ALIGN", "XRPOConfig", "rollouts_per_step", "validate_xrpo_config", "xrpo_config"]

BATCH_ALIGN = ("pad", "trim")


@dataclass
class XRPOConfig(BaseConfig):
    """XRPO's knobs under ``algorithm.xrpo`` (defaults: the paper's §4.1 and Table 4's default row)."""

    n_base: int = 4
    """Rollouts every prompt gets before planning (paper §4.1: 4); >= 2, the t quantile of Eq. (1) needs n >= 2."""
    plan_rounds: int = 2
    """Planning rounds that share the rest of the step's budget (paper §4.1: 2)."""
    rollouts_per_step: Optional[int] = None
    """Rollouts of the whole step, base rollouts included; None = data.train_batch_size * rollout.n."""
    allocation: str = "hrp"
    """"hrp" (priority Pi_q = Delta_q + phi_q, Eq. 3) or "uniform" (the w/o-HRP ablation)."""
    alpha: float = 0.05
    """Significance level of the Student-t confidence interval of Eq. (1), whose confidence is 1 - alpha (0.05 for a
    95% interval); in (0, 0.5): the paper's sensitivity table writes the confidence, 0.95, as alpha."""
    lam: float = 0.1
    """Exploration weight lambda of phi_q = lambda * sqrt(log(1 + T) / n_q)."""
    alloc_mode: str = "proportional"
    """"proportional" (the paper) or "greedy" (one rollout at a time to the argmax of Pi_q)."""
    max_extra_per_prompt: Optional[int] = None
    """Cap on the extra rollouts one prompt may receive in one round (None = no cap)."""
    icl: bool = True
    """ICL seeding of prompts with no success so far (§3.2); False = the w/o-ICL ablation."""
    icl_k: int = 2
    """Solved examples per ICL prompt (paper: 2)."""
    icl_min_similarity: float = 0.0
    """Retrieved problems below this cosine similarity are not used."""
    icl_train_prompt: str = "original"
    """Train ICL-seeded rollouts under the "original" prompt (default) or the "icl" prompt they were sampled from."""
    embedder: str = "wordllama"
    """Embedder of the ICL corpus (xrpo.icl.get_embedder): "wordllama", "minilm", "hash" or a sentence-transformers
    model such as the paper's Qwen/Qwen3-Embedding-8B."""
    corpus_max_per_problem: int = 2
    """Verified solutions kept per problem in the corpus."""
    corpus_init: Optional[str] = None
    """Optional JSONL of seed solutions (Algorithm 1's C_init), read by xrpo.icl.ICLCorpus.from_jsonl."""
    sharpen: bool = True
    """Novelty-guided advantage sharpening, Eq. (6); False = the w/o-AS ablation."""
    lam_nov: float = 2.5
    """lambda_nov of Eq. (6) (paper §4.1: 2.5)."""
    kappa_clip: float = 0.5
    """kappa_clip of Eq. (6) (paper §4.1: 0.5)."""
    full_reward: float = 1.0
    """Reward at or above which a rollout counts as correct (sharpening, ICL success, corpus)."""
    epsilon: float = 1e-6
    """Added to the group std of GRPO's advantage (verl's epsilon)."""
    batch_align: str = "pad"
    """How a step whose rollout count is not a multiple of the mini-batch size is fitted to it: "pad" adds rows
    with zero loss mask, "trim" first drops whole zero-variance groups (advantage 0, so no policy-gradient signal;
    with use_kl_loss they still carry a KL gradient, lost with them), then pads."""

    def __post_init__(self):
        check_significance(self.alpha, "algorithm.xrpo.alpha")
        # the planner's own checks (n_base >= 2, known allocation / icl_train_prompt, ...); its budget is checked
        # against the batch later, in validate_xrpo_config
        self.plan_config(rollouts_per_step=self.rollouts_per_step or 1)
        if self.rollouts_per_step is not None and self.rollouts_per_step < 1:
            raise ValueError(f"algorithm.xrpo.rollouts_per_step must be >= 1 or null, got {self.rollouts_per_step}")
        if self.alloc_mode not in ("proportional", "greedy"):
            raise ValueError(f"algorithm.xrpo.alloc_mode must be 'proportional' or 'greedy', got {self.alloc_mode!r}")
        for name in ("lam", "lam_nov", "kappa_clip", "epsilon", "icl_min_similarity"):
            if getattr(self, name) < 0:
                raise ValueError(f"algorithm.xrpo.{name} must be >= 0, got {getattr(self, name)}")
        if self.corpus_max_per_problem < 1:
            raise ValueError(f"algorithm.xrpo.corpus_max_per_problem must be >= 1, got {self.corpus_max_per_problem}")
        if self.batch_align not in BATCH_ALIGN:
            raise ValueError(f"algorithm.xrpo.batch_align must be one of {BATCH_ALIGN}, got {self.batch_align!r}")
        if not self.embedder:
            raise ValueError("algorithm.xrpo.embedder must name an embedder (e.g. 'wordllama')")

    def plan_config(self, rollouts_per_step: int) -> PlanConfig:
        """The single-machine planner's config with these knobs (its __post_init__ validates them)."""
        return PlanConfig(
            rollouts_per_step=rollouts_per_step, n_base=self.n_base, plan_rounds=self.plan_rounds,
            allocation=self.allocation, alpha=self.alpha, lam=self.lam, alloc_mode=self.alloc_mode,
            max_extra_per_prompt=self.max_extra_per_prompt, icl=self.icl, icl_k=self.icl_k,
            icl_min_similarity=self.icl_min_similarity, icl_train_prompt=self.icl_train_prompt,
            sharpen=self.sharpen, lam_nov=self.lam_nov, kappa_clip=self.kappa_clip, full_reward=self.full_reward,
        )


def xrpo_config(algorithm_config: Any) -> XRPOConfig:
    """The `XRPOConfig` of ``algorithm_config`` (verl's ``config.algorithm``: a DictConfig, dict or AlgoConfig).

    Goes through verl's ``omega_conf_to_dataclass``, so the block's ``_target_`` decides the class; a block without
    ``_target_`` (e.g. written as a plain dict in Python) is read as an `XRPOConfig`.
    """
    from verl.utils.config import omega_conf_to_dataclass

    block = algorithm_config.get("xrpo", None) if algorithm_config is not None else None
    if block is None:
        raise ValueError(
            "algorithm.xrpo is missing: the xrpo advantage estimator and RayXRPOTrainer read their knobs from it "
            "(compose xrpo_trainer.yaml or xrpo_base.yaml, or add the block with `+algorithm.xrpo.n_base=4 ...`)"
        )
    if isinstance(block, XRPOConfig):
        return block
    has_target = "_target_" in block
    try:
        cfg = omega_conf_to_dataclass(block, None if has_target else XRPOConfig)
    except Exception as e:  # hydra wraps the dataclass's ValueError in an InstantiationException
        cause = e
        while cause.__cause__ is not None:
            cause = cause.__cause__
        raise ValueError(f"algorithm.xrpo is invalid: {cause}") from e
    if not isinstance(cfg, XRPOConfig):
        raise ValueError(f"algorithm.xrpo._target_ must build an XRPOConfig, got {type(cfg).__name__}")
    return cfg


def rollouts_per_step(config: Any, xcfg: XRPOConfig) -> int:
    """The step's rollout budget: ``algorithm.xrpo.rollouts_per_step`` or ``train_batch_size * rollout.n``."""
    if xcfg.rollouts_per_step is not None:
        return int(xcfg.rollouts_per_step)
    return int(config.data.train_batch_size) * int(config.actor_rollout_ref.rollout.n)


def validate_xrpo_config(config: Any) -> XRPOConfig:
    """Check that a full verl config can run XRPO; returns the `XRPOConfig`. Raises ValueError naming the key.

    Runs on the driver before any worker starts (needs no GPU). verl's own ``validate_config`` is run separately.
    """
    from xrpo.algo.allocation import plan_phases

    algo = config.algorithm
    if algo.adv_estimator != "xrpo":
        raise ValueError(
            f"algorithm.adv_estimator is {algo.adv_estimator!r}; RayXRPOTrainer needs 'xrpo' (for GRPO, GSPO or DAPO "
            "use verl's own trainer: python -m verl.trainer.main_ppo)"
        )
    xcfg = xrpo_config(algo)
    if config.trainer.get("use_v1", False):
        raise ValueError(
            "trainer.use_v1 must be false: RayXRPOTrainer extends verl's RayPPOTrainer, whose driver runs the "
            "planning rounds; verl's v1 (TransferQueue) trainer streams rollouts and has no such hook"
        )
    prompts = int(config.data.train_batch_size)
    total = rollouts_per_step(config, xcfg)
    try:
        plan_phases(prompts, total, xcfg.n_base, xcfg.plan_rounds)
    except ValueError as e:
        raise ValueError(
            f"XRPO budget: {total} rollouts per step for data.train_batch_size={prompts} prompts does not fit "
            f"algorithm.xrpo.n_base={xcfg.n_base} and plan_rounds={xcfg.plan_rounds}: {e}"
        ) from None
    # settings RayXRPOTrainer.fit would otherwise drop without a word (it replaces verl's fit)
    corr = algo.get("rollout_correction", None) or {}
    if corr.get("bypass_mode", False):
        raise ValueError(
            "algorithm.rollout_correction.bypass_mode=true is not supported by RayXRPOTrainer: its fit always "
            "recomputes the old log-probs with the actor (the xrpo estimator's novelty needs them under the prompt "
            "each row is trained on; an ICL-seeded rollout trained under its original prompt was sampled under "
            "another), so bypass mode would be ignored. Set algorithm.rollout_correction.bypass_mode=false"
        )
    for key in ("rollout_is", "rollout_rs"):
        if corr.get(key, None) is not None:
            raise ValueError(
                f"algorithm.rollout_correction.{key}={corr.get(key)!r} is not supported by RayXRPOTrainer: its fit "
                "computes no rollout-correction IS weights or rejection mask (with icl_train_prompt=original an "
                "ICL-seeded row's rollout log-probs belong to the ICL prompt, not the trained one), so the setting "
                f"would be ignored. Set algorithm.rollout_correction.{key}=null"
            )
    skip = config.get("skip", None) or {}
    for name in skip:
        if name != "_target_" and (skip.get(name) or {}).get("enable", False):
            raise ValueError(
                f"skip.{name}.enable=true (verl's rollout-skip replay) is not supported by RayXRPOTrainer: the skip "
                "cache keys one generation call per step, but an XRPO step generates in several rounds whose sizes "
                "depend on the rewards; RayXRPOTrainer never initialises it, so it would be ignored. "
                f"Set skip.{name}.enable=false"
            )
    if int(config.trainer.get("critic_warmup", 0) or 0) > 0:
        raise ValueError(
            f"trainer.critic_warmup={config.trainer.critic_warmup} needs a critic; XRPO is critic-free and "
            "RayXRPOTrainer updates the actor from step 1, so the setting would be ignored. Set trainer.critic_warmup=0"
        )
    rm = config.get("reward", {}).get("reward_model", {})
    if rm.get("enable", False) and not rm.get("enable_resource_pool", False):
        raise ValueError(
            "reward.reward_model.enable=true with enable_resource_pool=false: a colocated reward model scores "
            "rollouts only after the rollout engine sleeps, but XRPO needs every round's rewards before the next "
            "round is planned; give the reward model its own pool (reward.reward_model.enable_resource_pool=true)"
        )
    filt = algo.get("filter_groups", None)
    if filt is not None and filt.get("enable", False):
        raise ValueError(
            "algorithm.filter_groups.enable=true (DAPO's dynamic sampling) is not supported by RayXRPOTrainer; "
            "run DAPO with verl's DAPO recipe"
        )
    return xcfg
