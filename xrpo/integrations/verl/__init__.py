"""XRPO on verl, the distributed RL engine (Ray driver, FSDP/Megatron actors, vLLM/SGLang rollouts). See docs/verl.md.

Needs the ``verl`` extra (``pip install 'xrpo[verl]'``); nothing here is imported by ``import xrpo``. Thin adapters
over `xrpo.algo` and `xrpo.icl`, with no math of their own:

    config       ``algorithm.xrpo`` block (`XRPOConfig`, a verl BaseConfig) and the checks against verl's config;
                 hydra configs ``xrpo_base.yaml`` / ``xrpo_trainer.yaml``
    advantage    verl advantage estimator ``xrpo``: ragged GRPO by uid + novelty sharpening from old_log_probs
    agent_loop   verl agent loop ``xrpo_icl``: generate from the ICL prompt, store the original or the ICL prompt
    reward       verl reward function over xrpo's verifiers
    phases       Algorithm 1's driver-side steps on DataProto batches (allocation, ICL prompts, merge, pad/trim)
                 and each prompt's last visit for the allocators that read history (`VisitHistory`)
    trainer      `RayXRPOTrainer`, verl's PPO driver running XRPO's phases in each step
    plugin       registration through verl's ``verl.plugins`` entry point (driver and every Ray worker)
    main         launcher: ``python -m xrpo.integrations.verl.main`` / ``xrpo verl``
"""
