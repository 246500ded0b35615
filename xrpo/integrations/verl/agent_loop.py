"""verl agent loop ``xrpo_icl``: generate from the ICL-seeded prompt, store the original or the ICL prompt's tokens.

XRPO §3.2 "Breaking Symmetry via ICL Seeding": a prompt whose rollouts all failed draws its later rollouts from a
prompt that shows K solved similar problems. `RayXRPOTrainer` sends such rows to verl's rollout with
``agent_name = "xrpo_icl"`` and two extra fields per row:

    xrpo_icl_prompt     the chat messages of the ICL prompt (the row's ``raw_prompt`` stays the original messages)
    xrpo_train_prompt   "original" or "icl" (``algorithm.xrpo.icl_train_prompt``)

The loop runs verl's single-turn loop on the ICL messages, then, for "original", replaces the prompt tokens it
returns by the original prompt's tokens, built by the same continuous-token builder a plain rollout uses: the
completion is then trained under the plain prompt q, as `xrpo.rollout.planner` does on one machine (the model is
evaluated without examples). The sampling log-probs (``rollout_log_probs``) stay those under the ICL prompt; the
trainer recomputes the old log-probs under the stored prompt before the update, so the PPO ratio starts at 1.
``extra_fields["xrpo_gen_prompt_len"]`` records the length of the prompt the rollout was sampled from.

Registered by xrpo's verl plugin in every process that imports verl, so verl's agent-loop workers (Ray actors) find
it by name. Text prompts only: a multimodal row is refused.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

__all__ = ["AGENT_NAME", "ICL_PROMPT_KEY", "TRAIN_PROMPT_KEY", "XRPOICLAgentLoop"]

AGENT_NAME = "xrpo_icl"
ICL_PROMPT_KEY = "xrpo_icl_prompt"
TRAIN_PROMPT_KEY = "xrpo_train_prompt"


@register(AGENT_NAME)
class XRPOICLAgentLoop(SingleTurnAgentLoop):
    """Single-turn generation from ``kwargs["xrpo_icl_prompt"]``; see the module docstring."""

    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs) -> AgentLoopOutput:
        icl = kwargs.get(ICL_PROMPT_KEY)
        if icl is None or len(icl) == 0:
            raise ValueError(
                f"agent loop {AGENT_NAME!r}: the row has no {ICL_PROMPT_KEY!r} messages (RayXRPOTrainer sets them "
                "for ICL-seeded rows only)"
            )
        train = kwargs.get(TRAIN_PROMPT_KEY, "original")
        if train not in ("original", "icl"):
            raise ValueError(
                f"agent loop {AGENT_NAME!r}: {TRAIN_PROMPT_KEY} must be 'original' or 'icl', got {train!r}"
            )
        if self.processor is not None and (await self.process_multi_modal_info(list(kwargs["raw_prompt"]))):
            raise ValueError(f"agent loop {AGENT_NAME!r}: ICL seeding supports text prompts only")
        output = await super().run(sampling_params, priority=priority, **{**kwargs, "raw_prompt": list(icl)})
        output.extra_fields["xrpo_gen_prompt_len"] = len(output.prompt_ids)
        if train == "original":
            output.prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
        return output
