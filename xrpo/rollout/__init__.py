"""Rollouts: engines that sample completions (`engine`, `hf_engine`, `vllm_engine`), the XRPO planner and TreePO's
tree sampler (`treepo`).

Import-light: `import xrpo.rollout` loads only the contract (`xrpo.rollout.engine`, standard library only). The engines
import torch / transformers / vLLM when first accessed (`xrpo.rollout.HFEngine`), and vLLM only when a `VLLMEngine` is
constructed.
"""

from __future__ import annotations

import importlib

from xrpo.rollout.engine import FINISH_REASONS, Rollout, RolloutEngine, SamplingParams, TokenPromptEngine

_LAZY = {
    "HFEngine": "xrpo.rollout.hf_engine",
    "VLLMEngine": "xrpo.rollout.vllm_engine",
    "generate_rollouts": "xrpo.rollout.planner",
    "PlanResult": "xrpo.rollout.records",
    "generate_tree_rollouts": "xrpo.rollout.treepo",
    "TreeConfig": "xrpo.rollout.treepo",
}

__all__ = ["FINISH_REASONS", "Rollout", "RolloutEngine", "SamplingParams", "TokenPromptEngine", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'xrpo.rollout' has no attribute {name!r}")
