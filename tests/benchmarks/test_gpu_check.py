"""benchmarks/gpu_check.sh rehearsed on the CPU (--smoke): every stage of the GPU check runs end to end at toy sizes,
so that the script a lent GPU runs cannot rot between the rare sessions that have one. On the CPU the tests marked
gpu skip; the benchmark tables and the default job must come out with numbers, not errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_rehearses_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--smoke", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "xrpo imports: ok" in (out / "env.txt").read_text()
    tests = (out / "pytest.txt").read_text()
    assert re.search(r"\d+ skipped", tests) and "pytest exit 0" in tests, tests[-2000:]
    table = (out / "bench_gpu.md").read_text()
    for what in ("generation", "plain", "checkpointing", "chunked log-probs", "LoRA r16"):
        row = next(line for line in table.splitlines() if what in line)
        assert re.search(r"\| \d+ \|", row), row  # a measured tokens/s, not an error
    steps = (out / "bench_gpu-steps.md").read_text()
    row = next(line for line in steps.splitlines() if line.startswith("| smoke"))
    assert re.fullmatch(r"\| smoke( \| [0-9.]+){5} \|", row), row
    assert "steps exit 0" in (out / "steps.log").read_text()
    default = (out / "default.log").read_text()
    assert "default job: 2 steps" in default, default[-2000:]
