"""Peak memory and time of one update (forward + backward + AdamW step) on the CPU, with and without each memory
feature, at several completion lengths, against `xrpo.trainer.memory`'s estimate.

Each configuration runs in a fresh process; its peak is the process's peak resident set (ru_maxrss) minus the
resident set just before the model is built (Python, torch and its kernels, loaded by a toy update first), so it
counts what the update adds.
The model is a random Qwen2 with a 32,000-token vocabulary (Llama / Mistral size), small enough for this CPU, so
that the logits' share shows as it does on a GPU with Qwen's 151,936.

    python benchmarks/bench_memory.py                  # lengths 256 1024 3072, the four feature combinations
    python benchmarks/bench_memory.py --lengths 512 --features plain chunks
    python benchmarks/bench_memory.py --shape smollm2-135m --rows 8 --prompt-len 60 --lengths 96 --features plain

Prints a Markdown table (docs/benchmarks.md, "Memory features on the CPU").
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

FEATURES = {
    "plain": ("plain", False, None, 0),
    "checkpointing": ("checkpointing", True, None, 0),
    "chunks": ("chunked log-probs", False, 1024, 0),
    "both": ("checkpointing + chunks", True, 1024, 0),
}

CHILD = """
import json, resource, sys
sys.path.insert(0, {here!r})
import torch
torch.set_num_threads(2)
import bench_gpu
bench_gpu.SHAPES["cpu-32k"] = dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=32000, tie_word_embeddings=False)
# HuggingFaceTB/SmolLM2-135M-Instruct's shape (its config.json), random weights: memory depends on the shape alone
bench_gpu.SHAPES["smollm2-135m"] = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True)
# the first forward / backward / AdamW step loads torch's CPU kernels (hundreds of MB of code and buffers): done
# once on a toy model before the baseline, so that the peak counts what the update itself holds
toy = torch.nn.Linear(64, 64)
torch.optim.AdamW(toy.parameters()).step() if toy(torch.randn(8, 64)).logsumexp(-1).sum().backward() is None else None
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
r = bench_gpu.bench_update({shape!r}, "cpu", {feature!r}, rows={rows}, prompt_len={prompt_len},
                           completion_len={length}, repeats=1)
r["peak_gib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before) / 1024**3
print("RESULT " + json.dumps(r))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", nargs="+", type=int, default=[256, 1024, 3072])
    ap.add_argument("--features", nargs="+", choices=list(FEATURES), default=list(FEATURES))
    ap.add_argument("--shape", choices=["cpu-32k", "smollm2-135m"], default="cpu-32k")
    ap.add_argument("--rows", type=int, default=1, help="rollouts in the micro-batch")
    ap.add_argument("--prompt-len", type=int, default=64)
    args = ap.parse_args()
    here = str(Path(__file__).resolve().parent)
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    print("\n| completion tokens | feature | s / update | tokens/s | peak GiB (RSS) | estimate GiB | peak / est |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for length in args.lengths:
        for name in args.features:
            code = CHILD.format(
                here=here,
                feature=FEATURES[name],
                length=length,
                shape=args.shape,
                rows=args.rows,
                prompt_len=args.prompt_len,
            )
            res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            line = next((x for x in res.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(f"| {length} | {FEATURES[name][0]} | error: {res.stderr.strip().splitlines()[-1][:80]} | | | | |")
                continue
            r = json.loads(line[len("RESULT ") :])
            print(
                f"| {length} | {r['feature']} | {r['seconds']:.2f} | {r['tokens_per_s']:.0f} | {r['peak_gib']:.2f} "
                f"| {r['estimate_gib']:.2f} | {r['peak_gib'] / r['estimate_gib']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
