"""Registration through verl's ``verl.plugins`` entry point, in fresh processes; xrpo's core stays free of verl."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("verl")

PROBE = """
import json, sys
import verl
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
print(json.dumps({
    "estimator": getattr(ADV_ESTIMATOR_REGISTRY.get("xrpo"), "__qualname__", None),
    "agent_loop": _agent_loop_registry.get("xrpo_icl", {}).get("_target_"),
    "plugin_loaded": "xrpo.integrations.verl.plugin" in sys.modules,
}))
"""


def _probe(env_extra: dict) -> dict:
    env = {**os.environ, **env_extra}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # fresh interpreters importing verl: ~15 s each on the busy 2-core VM
def test_import_verl_registers_xrpo_through_the_entry_point():
    # a fresh interpreter that only imports verl: xrpo's entry point must register the estimator and the agent loop
    got = _probe({"VERL_USE_EXTERNAL_PLUGINS": "auto"})
    assert got == {
        "estimator": "compute_xrpo_outcome_advantage",
        "agent_loop": "xrpo.integrations.verl.agent_loop.XRPOICLAgentLoop",
        "plugin_loaded": True,
    }


@pytest.mark.slow  # fresh interpreters importing verl: ~15 s each on the busy 2-core VM
def test_entry_point_is_the_mechanism():
    # with verl's plugin discovery off nothing registers: the registration above came from the entry point
    got = _probe({"VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert got == {"estimator": None, "agent_loop": None, "plugin_loaded": False}
    # and the entry point can be selected by its name
    assert _probe({"VERL_USE_EXTERNAL_PLUGINS": "xrpo"})["plugin_loaded"] is True


def test_xrpo_core_does_not_import_verl():
    code = (
        "import sys, xrpo, xrpo.algo.advantages, xrpo.algo.allocation, xrpo.rollout.planner, xrpo.icl, "
        "xrpo.rewards, xrpo.data, xrpo.trainer.loop, xrpo.cli\n"
        "print(sorted(m for m in sys.modules if m == 'verl' or m.startswith('verl.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"
