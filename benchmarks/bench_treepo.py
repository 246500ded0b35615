"""What TreePO's prefix sharing saves with the transformers engine: tokens the model computes and wall time.

For the same number of rollouts (16 prompts x width 8) and the same completion limit, four ways of sampling them:

    independent        HFEngine.generate: 8 i.i.d. completions per prompt, one call (GRPO's rollouts)
    tree, KV reuse     the TreePO sampler on HFEngine: continued paths keep their KV cache (reuse_prefixes)
    tree, no reuse     the TreePO sampler on an engine without reuse_prefixes: every segment re-reads its prefix
    tree leaves alone  the tree's own leaves, each generated on its own (computed from their lengths, not run)

"Computed" counts the real (non-padding) token positions the model ran (HFEngine.token_counts: prompt tokens not taken
from a cache + generated tokens fed back); "cached" the positions served from the KV cache. Wall times are medians
over alternating repeats (torch on 1 thread).

Two workloads: the default job's (the cached default model, 24-token limit, TreePO's 14 segments -> 2-token segments;
its completions end after about 6 tokens) and a long-path one (the tiny random model, which rarely says EOS, 64-token
limit in 8 segments of 8), where sharing is largest.

Then (unless --train-blocks 0) the training step itself: blocks of default-job steps alternating grpo /
treepo-sampling / treepo from the same start model (`bench_step.run_block`), first step of each block dropped,
median step and generate time per method.

    python benchmarks/bench_treepo.py [--repeats 5] [--train-blocks 2 --train-steps 8]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from xrpo.rollout.engine import SamplingParams
from xrpo.rollout.hf_engine import HFEngine
from xrpo.rollout.treepo import TreeConfig, generate_tree_rollouts


class NoReuse:
    """HFEngine's generate_ids without its reuse_prefixes: what a backend without a prefix cache does."""

    def __init__(self, engine: HFEngine):
        self.engine = engine
        self.token_counts = engine.token_counts

    def generate_ids(self, prompt_ids, counts, params):
        return self.engine.generate_ids(prompt_ids, counts, params)


class Zero:
    def verify_batch(self, texts, refs):
        from xrpo.rewards import VerifyResult

        return [VerifyResult(score=0.0, answer=None) for _ in texts]


def default_workload():
    from xrpo.data.tasks import make_default_task
    from xrpo.rollout.prompts import PromptRenderer
    from xrpo.trainer.config import TrainConfig
    from xrpo.trainer.setup import load_model

    cfg = TrainConfig()
    model, tok, _ = load_model(cfg, log=lambda *_: None)
    train, _ = make_default_task(n_train=64, n_heldout=8, seed=0)
    return (
        "default job: default model, 24 tokens, 14 segments of 2",
        model.eval(),
        tok,
        train[:16],
        PromptRenderer(tok, prompt_template="Q: {prompt}\nA:"),
        24,
        TreeConfig(rollouts_per_step=128),
    )


def long_workload():
    from xrpo.data import Problem
    from xrpo.models.tiny import TINY_CHARSET_TEXTS, build_tiny_model, build_tiny_tokenizer
    from xrpo.rollout.prompts import PromptRenderer

    tok = build_tiny_tokenizer(list(TINY_CHARSET_TEXTS) * 4)
    model = build_tiny_model(tok, seed=0).eval()
    problems = [Problem(id=f"p{i}", prompt=f"What is {i} * {i + 7} - {3 * i}?", answer="0") for i in range(16)]
    return (
        "long paths: random tiny model (rarely says EOS), 64 tokens, 8 segments of 8",
        model,
        tok,
        problems,
        PromptRenderer(tok, prompt_template="Q: {prompt}\nA:"),
        64,
        TreeConfig(rollouts_per_step=128, tree_max_depth=8),
    )


def run(workload, repeats: int) -> None:
    name, model, tok, problems, renderer, max_new, tcfg = workload
    engine = HFEngine(model, tok, max_batch_size=256)
    prompts = [renderer.render(p) for p in problems]
    times: dict[str, list[float]] = {"independent": [], "tree, KV reuse": [], "tree, no reuse": []}
    counts: dict[str, dict] = {}
    extra: dict[str, float] = {}
    for rep in range(repeats):
        params = SamplingParams(temperature=1.0, max_new_tokens=max_new, seed=rep)
        for label in times:
            before = dict(engine.token_counts)
            t0 = time.perf_counter()
            if label == "independent":
                outs = engine.generate(prompts, [8] * len(prompts), params)
                lengths = [len(r.completion_ids) for rs in outs for r in rs]
            else:
                eng = engine if label == "tree, KV reuse" else NoReuse(engine)
                res = generate_tree_rollouts(problems, eng, Zero(), renderer, tcfg, params)
                lengths = [len(x.completion_ids) for x in res.records]
                if label == "tree, KV reuse":
                    prompt_tokens = sum(len(x.gen_prompt_ids) for x in res.records)
                    extra = {
                        "leaves_prefill": prompt_tokens,
                        "leaves_decode": sum(max(n - 1, 0) for n in lengths),
                        "saved_frac": res.metrics["tree/tokens_saved_frac"],
                        "depth": res.metrics["tree/depth_mean"],
                        "calls": res.metrics["tree/engine_calls"],
                    }
            times[label].append(time.perf_counter() - t0)
            if rep == repeats - 1:
                counts[label] = {k: engine.token_counts[k] - before[k] for k in before}
                counts[label]["len"] = statistics.mean(lengths)
    print(f"### {name}")
    print()
    print("| sampling | wall time (s) | computed tokens (prefill + decode) | from KV cache | mean completion |")
    print("|---|---|---|---|---|")
    for label in times:
        c = counts[label]
        print(
            f"| {label} | {statistics.median(times[label]):.3f} | {c['prefill'] + c['decode']:,} "
            f"({c['prefill']:,} + {c['decode']:,}) | {c['cached']:,} | {c['len']:.1f} |"
        )
    lp, ld = extra["leaves_prefill"], extra["leaves_decode"]
    print(f"| tree leaves alone | - | {lp + ld:,} ({lp:,} + {ld:,}) | 0 | {counts['tree, KV reuse']['len']:.1f} |")
    print()
    print(
        f"tree: {extra['depth']:.2f} segments per leaf, {extra['calls']:.0f} engine calls; generated tokens saved "
        f"by sharing (tree/tokens_saved_frac): {extra['saved_frac']:.3f}"
    )
    print()


def train_steps(blocks: int, steps: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_step import run_block

    methods = ("grpo", "treepo-sampling", "treepo")
    rows: dict[str, list[dict]] = {m: [] for m in methods}
    with tempfile.TemporaryDirectory() as tmp:
        for b in range(blocks):
            for m in methods:
                rows[m].extend(run_block(m, steps, b, Path(tmp) / f"{m}-{b}")[1:])
    print(
        f"### Training step, default job ({blocks} blocks x {steps} steps per method, median over "
        f"{len(rows['grpo'])} steps)"
    )
    print()
    print("| method | step (s) | generate (s) | old log-probs (s) | update (s) | completion (tokens) | tokens saved |")
    print("|---|---|---|---|---|---|---|")
    for m in methods:
        med = {
            k: statistics.median([r.get(k, 0.0) for r in rows[m]])
            for k in (
                "time/step",
                "time/generate",
                "time/old_logprobs",
                "time/update",
                "rollout/response_length_mean",
                "tree/tokens_saved_frac",
            )
        }
        saved = f"{med['tree/tokens_saved_frac']:.3f}" if m != "grpo" else "-"
        print(
            f"| {m} | {med['time/step']:.3f} | {med['time/generate']:.3f} | {med['time/old_logprobs']:.3f} | "
            f"{med['time/update']:.3f} | {med['rollout/response_length_mean']:.2f} | {saved} |"
        )
    print()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--train-blocks", type=int, default=2)
    ap.add_argument("--train-steps", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(
        f"machine: {platform.machine()} {platform.processor() or 'cpu'}, torch {torch.__version__}, 1 thread, "
        f"{args.repeats} repeats (median)"
    )
    print()
    with torch.no_grad():
        for w in (default_workload(), long_workload()):
            run(w, args.repeats)
    if args.train_blocks > 0:
        train_steps(args.train_blocks, args.train_steps)


if __name__ == "__main__":
    main()
