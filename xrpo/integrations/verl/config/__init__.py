"""The `algorithm.xrpo` config block of a verl run, and the checks that tie it to the rest of verl's config.

`XRPOConfig` is a verl `BaseConfig` dataclass, so verl's own machinery builds and validates it:
``verl.utils.config.omega_conf_to_dataclass(config.algorithm.xrpo)`` instantiates it through the block's ``_target_``
and its ``__post_init__`` rejects bad values. `validate_xrpo_config` adds the cross-section checks (budget against the
batch, the legacy trainer, and the verl settings `RayXRPOTrainer` does not honour: rollout correction, rollout skip,
critic warm-up). The hydra configs next to this file: ``xrpo_base.yaml`` holds this block with the paper's §4.1
defaults and the verl settings XRPO needs (estimator, reward function, KL loss, legacy driver); ``xrpo_trainer.yaml``
is verl's ``ppo_trainer`` followed by it.

The knobs are the sections of `xrpo.algo.config` that the single-machine planner (`xrpo.rollout.planner.PlanConfig`)
and trainer embed too, with their names, defaults and checks; the step's rollout budget is verl's
``data.train_batch_size * actor_rollout_ref.rollout.n`` unless ``rollouts_per_step`` sets it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from verl.base_config import BaseConfig

from xrpo.algo.config import (
    AllocationConfig,
    CorpusConfig,
    ICLConfig,
    ICLPromptConfig,
    SharpenConfig,
    check_int,
    check_knobs,
    check_number,
    section_values,
)
from xrpo.algo.rounds import ALLOCATORS, allocator_names, get_allocator
from xrpo.rollout.records import PlanConfig

__all__ = [
    "BATCH_ALIGN",
    "XRPOConfig",
    "rollouts_per_step",
    "validate_xrpo_config",
    "verl_allocations",
    "xrpo_config",
]

BATCH_ALIGN = ("pad", "trim")
_TARGET = "xrpo.integrations.verl.config.XRPOConfig"


def verl_allocations() -> tuple[str, ...]:
    """The registered allocations (`xrpo.algo.rounds`) that `RayXRPOTrainer` serves: all but those that choose the
    step's prompts (``selects_prompts``: CurES), since verl's dataloader chooses them. Those that read history
    (knapsack, xrpo-plus) get each prompt's last visit from the driver (`phases.VisitHistory`)."""
    return tuple(n for n in allocator_names() if not get_allocator(n).selects_prompts)


@dataclass
class XRPOConfig(BaseConfig, CorpusConfig, SharpenConfig, ICLPromptConfig, ICLConfig, AllocationConfig):
    """XRPO's knobs under ``algorithm.xrpo``: the allocation, ICL and sharpening sections of `xrpo.algo.config`
    (defaults: the paper's §4.1 and Table 4's default row), the step's budget, the ICL corpus and verl's batch."""

    rollouts_per_step: Optional[int] = None
    """Rollouts of the whole step, base rollouts included; None = data.train_batch_size * rollout.n."""
    corpus_init: Optional[str] = None
    """Optional JSONL of seed solutions (Algorithm 1's C_init), read by xrpo.icl.ICLCorpus.from_jsonl."""
    epsilon: float = 1e-6
    """Added to the group std of GRPO's advantage (verl's epsilon)."""
    batch_align: str = "pad"
    """How a step whose rollout count is not a multiple of the mini-batch size is fitted to it: "pad" adds rows
    with zero loss mask, "trim" first drops whole zero-variance groups (advantage 0, so no policy-gradient signal;
    with use_kl_loss they still carry a KL gradient, lost with them), then pads."""

    def __post_init__(self):
        where = "algorithm.xrpo."
        served = verl_allocations()
        if self.allocation not in served:
            why = ""
            if self.allocation in ALLOCATORS:  # registered, but it chooses the step's prompts
                why = (
                    f": {self.allocation} chooses each step's prompts and their counts itself, but on verl the "
                    "dataloader chooses the prompts and RayXRPOTrainer plans only their rollouts; run it with "
                    "`xrpo train`"
                )
            raise ValueError(
                f"config field {where}allocation must be one of {', '.join(served)}, got {self.allocation!r}{why}"
            )
        check_knobs(self, where)
        if self.icl_novelty != "train":
            raise ValueError(
                f"config field {where}icl_novelty must be train (the xrpo advantage estimator scores s(y) "
                f"with the old log-probs, under the prompt each row is trained under), got "
                f"{self.icl_novelty!r}"
            )
        if self.rollouts_per_step is not None:
            check_int(self, where, "rollouts_per_step", 1, " or null")
        check_number(self, where, "epsilon", 0)
        if self.corpus_init is not None and (not isinstance(self.corpus_init, str) or not self.corpus_init):
            raise ValueError(
                f"config field {where}corpus_init must be null or the path of a JSONL of seed solutions, got "
                f"{self.corpus_init!r}"
            )
        if self.batch_align not in BATCH_ALIGN:
            raise ValueError(f"algorithm.xrpo.batch_align must be one of {BATCH_ALIGN}, got {self.batch_align!r}")

    def plan_config(self, rollouts_per_step: int) -> PlanConfig:
        """The single-machine planner's config with these knobs (the sections both embed)."""
        return PlanConfig(
            rollouts_per_step=rollouts_per_step,
            **section_values(self, AllocationConfig, ICLConfig, ICLPromptConfig, SharpenConfig),
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
        target = block.get("_target_", _TARGET)  # (a null _target_ is not "in" an OmegaConf block)
        hint = "" if target == _TARGET else f" (its _target_ is {target!r}; expected {_TARGET})"
        raise ValueError(f"algorithm.xrpo is invalid: {cause}{hint}") from e
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
    from xrpo.algo.rounds import cap_error

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
        source = (
            "algorithm.xrpo.rollouts_per_step"
            if xcfg.rollouts_per_step is not None
            else f"data.train_batch_size x actor_rollout_ref.rollout.n = {prompts} x "
            f"{config.actor_rollout_ref.rollout.n}"
        )
        raise ValueError(
            f"XRPO budget: {total} rollouts per step ({source}) for data.train_batch_size={prompts} prompts does "
            f"not fit algorithm.xrpo.n_base={xcfg.n_base} and algorithm.xrpo.plan_rounds={xcfg.plan_rounds}: {e}"
        ) from None
    if xcfg.icl and xcfg.corpus_init is not None and not Path(xcfg.corpus_init).is_file():
        raise ValueError(
            f"algorithm.xrpo.corpus_init={xcfg.corpus_init!r} is not a file (a JSONL of seed solutions, which "
            "RayXRPOTrainer reads when it starts): give an existing file or null"
        )
    cap = cap_error(xcfg, prompts, total, icl=xcfg.icl)
    if cap is not None:
        raise ValueError(f"algorithm.xrpo.max_extra_per_prompt={xcfg.max_extra_per_prompt} {cap}")
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
