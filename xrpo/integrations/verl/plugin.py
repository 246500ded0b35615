"""xrpo's verl plugin: importing this module registers XRPO's pieces in verl's registries.

verl loads every ``verl.plugins`` entry point when ``verl`` itself is imported (``verl/__init__.py``; the environment
variable ``VERL_USE_EXTERNAL_PLUGINS`` can restrict or disable this). xrpo declares one in its package metadata::

    [project.entry-points."verl.plugins"]
    xrpo = "xrpo.integrations.verl.plugin"

so the driver and every Ray worker that imports verl (agent-loop workers, reward-loop workers, actor workers) see:

    advantage estimator  "xrpo"      xrpo.integrations.verl.advantage.compute_xrpo_outcome_advantage
    agent loop           "xrpo_icl"  xrpo.integrations.verl.agent_loop.XRPOICLAgentLoop

The reward function needs no registry: verl imports it from ``reward.custom_reward_function.path`` in each
reward worker (``pkg://xrpo.integrations.verl.reward``).

verl swallows a plugin's import error (it only logs it at debug level), so a broken install shows up later as
"Unknown advantage estimator simply: xrpo"; ``python -c "import verl, xrpo.integrations.verl.plugin"`` surfaces the
real error.
"""

from __future__ import annotations

from xrpo.integrations.verl import advantage, agent_loop, cpu

advantage.register()
if cpu.is_active():  # ``xrpo verl --cpu`` set XRPO_VERL_CPU=1 for the driver and its Ray workers; never on GPUs
    cpu.activate()

# agent_loop's @register("xrpo_icl") ran when it was imported
__all__ = ["advantage", "agent_loop"]
