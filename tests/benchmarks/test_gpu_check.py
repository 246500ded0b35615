"""benchmarks/gpu_check.sh rehearsed on the CPU (--smoke): every stage of the GPU check runs end to end at toy sizes,
so that the script a GPU machine runs cannot rot between the rare runs on one. On the CPU the tests marked
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
    rows = [line for line in steps.splitlines() if line.startswith("| smoke")]
    assert [r.split(" | ")[1:3] for r in rows] == [["grpo", "hf"], ["xrpo", "hf"]], rows
    for row in rows:  # s/step, generate s, update s, / grpo: measured
        assert re.fullmatch(r"\| smoke \| \w+ \| hf( \| [0-9.]+){4} \|", row), row
    assert "steps exit 0" in (out / "steps.log").read_text()
    # the continuous-batching stage: both engines' generation, each arm's step time (hf-cb, and GRPO on hf)
    cb = (out / "cb.log").read_text()
    assert "cb tests exit 0" in cb and "cb exit 0" in cb, cb[-3000:]
    for engine in ("hf", "hf-cb"):
        for rows in (4, 8, 12):
            row = next(line for line in cb.splitlines() if f"| generation, {engine}, {rows} rows |" in line)
            assert re.search(r"rows \| \d+ \|", row), row
    assert re.search(r"\| generation, hf-cb / hf, 12 rows \| [0-9.]+x \|", cb), cb[-3000:]
    arms = [line.split(" | ")[1:3] for line in cb.splitlines() if re.match(r"\| smoke \| \S+ \| hf", line)]
    assert arms == [["grpo", "hf-cb"], ["xrpo-streaming", "hf-cb"], ["xrpo", "hf-cb"], ["grpo", "hf"]], arms
    assert not list(out.glob("*.json")) and len(list(out.iterdir())) <= 8 + 1  # what comes back, and XRPO_CACHE
    default = (out / "default.log").read_text()
    assert "default job: 2 steps" in default, default[-2000:]
