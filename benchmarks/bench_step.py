"""Per-step wall time of XRPO against GRPO at the same rollout budget on the default task, measured in one process.

Each arm trains from the same cached default model for a block of steps; blocks alternate (xrpo, grpo, xrpo, ...)
so that load on a shared machine hits every arm alike. Reported: median step time and its split into generate / plan /
retrieve / verify / old log-probs / update, each arm's ratio to grpo (paper, §4.2: 1.047), and the allocation
figures of the XRPO arms (streaming against rounds).

Arms: ``grpo``, ``xrpo`` (Algorithm 1's rounds) and ``xrpo-streaming`` (``rollout.planner=streaming``, which needs
an engine that streams: ``--engine hf-cb`` or ``--engine vllm``). Each block runs every arm once, in the order given
(``--arms grpo xrpo-streaming``: g, s, g, s, ...); an arm's ratio to grpo is also taken block by block (the median of
its steps over grpo's in the same block), whose spread over blocks is the run-to-run noise.

An arm NAME@ENGINE runs on another engine than ``--engine`` (``--arms grpo grpo@hf``: GRPO on both, interleaved).

``--gen-rows`` first measures generation alone: tokens/s of ``--engine`` against the hf engine (transformers
``generate``) on the same model and prompts, one call of R rollouts per measurement for each R, the two engines
alternating call by call.

    python benchmarks/bench_step.py                 # 3 blocks x 10 steps, xrpo and grpo, hf engine
    python benchmarks/bench_step.py --blocks 1 --steps 4   # quick sanity run
    python benchmarks/bench_step.py --engine hf-cb --arms grpo xrpo-streaming --gen-rows 16 32 64 128
    python benchmarks/bench_step.py --engine vllm --arms xrpo-streaming xrpo grpo
    python benchmarks/bench_step.py --engine vllm --arms xrpo-streaming xrpo grpo \\
        --config configs/smollm2_arith_vllm.yaml   # SmolLM2-135M (its task and budget)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
import weakref
from pathlib import Path

import numpy as np

from xrpo.rollout.build import ENGINES
from xrpo.sim.latency import step_latency
from xrpo.trainer.config_loader import build_config
from xrpo.trainer.loop import train
from xrpo.trainer.setup import build_engine

PARTS = ["time/generate", "time/plan", "time/retrieve", "time/verify", "time/old_logprobs", "time/update"]
ARMS = {
    "grpo": ["method.name=grpo"],
    "xrpo": ["method.name=xrpo"],
    "xrpo-streaming": ["method.name=xrpo", "rollout.planner=streaming"],
    # one planning round instead of the paper's two: a prompt's chain of dependent generations is 2 long, not 3
    "xrpo-1round": ["method.name=xrpo", "method.plan_rounds=1"],
    "xrpo-streaming-1round": ["method.name=xrpo", "rollout.planner=streaming", "method.plan_rounds=1"],
}
QUALITY = [
    "alloc/rounds",
    "alloc/nonuniform_rounds",
    "adv/nonzero_frac",
    "icl/flips",
    "icl/seeded_prompts",
    "rollout/solved_prompt_frac",
]
STEPS = ["engine/steps", "model/engine_steps", "model/engine_steps_rounds"]


def arm_overrides(arm: str, engine: str) -> list[str]:
    """An arm's config overrides, to come after every other: ``NAME`` (`ARMS`) on ``engine``, or ``NAME@ENGINE`` on
    ENGINE."""
    name, _, own = arm.partition("@")
    if name not in ARMS or (own and own not in ENGINES):
        raise SystemExit(f"--arms: unknown arm {arm!r}; arms are {', '.join(ARMS)}, optionally @{'|@'.join(ENGINES)}")
    return [*ARMS[name], f"rollout.engine={own or engine}"]


def run_block(
    arm: str, steps: int, seed: int, out: Path, config: str | None, extra: list[str], engine: str
) -> list[dict]:
    overrides = [
        f"steps={steps}",
        f"seed={seed}",
        f"output={out}",
        "eval_every=0",
        "save_every=0",
        "log_samples_every=0",
        "progress=false",
        "tensorboard=false",
        "eval_samples=1",
        "eval_k=[1]",
    ]
    if config is None:
        overrides.append("data.n_heldout=8")
    cfg = build_config(config, overrides + extra + arm_overrides(arm, engine))
    rows: list[dict] = []
    train(
        cfg,
        log=lambda *_: None,
        on_step=lambda r: rows.append(report_row(r)),
        engine_factory=counting_build_engine,
    )
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    for m, extra_m in zip(metrics, rows):
        m.update(extra_m)
    return metrics


ENGINE_STEPS = [0]  # engine steps so far (counted by `counting_build_engine`)
COUNTING = [None, 0]  # a weak reference to the engine that counts its own steps (HFCBEngine.steps), and those seen
COUNTING_NOW = [False]  # whether the engine last built counts its steps


def engine_steps() -> int:
    engine = COUNTING[0]() if COUNTING[0] is not None else None
    if engine is not None:
        ENGINE_STEPS[0] += engine.steps - COUNTING[1]
        COUNTING[1] = engine.steps
    return ENGINE_STEPS[0]


def counting_build_engine(cfg, model, tokenizer):
    """The trainer's engine (`xrpo.trainer.setup.build_engine`), with its engine steps counted (vLLM's engine loop,
    or the hf-cb engine's forward passes, which it counts itself; held weakly, so that a block's engine and its cache
    go with its run) to compare with the engine-step latency model; given to `train` as its ``engine_factory``."""
    engine = build_engine(cfg, model, tokenizer)
    COUNTING_NOW[0] = hasattr(engine, "llm") or hasattr(engine, "steps")
    if hasattr(engine, "llm"):
        core, step = engine.llm.llm_engine, engine.llm.llm_engine.step

        def counted():
            ENGINE_STEPS[0] += 1
            return step()

        core.step = counted
    elif hasattr(engine, "steps"):
        engine_steps()  # what the previous engine counted
        COUNTING[:] = [weakref.ref(engine), engine.steps]
    return engine


def bench_tokens(kind: str, rows_list: list[int], repeats: int, config: str | None, extra: list[str]) -> list[dict]:
    """tokens/s of engine ``kind`` and of the hf engine, one ``generate`` call of R rollouts (16 prompts of the
    task, R / 16 each, at least one) per measurement, the engines alternating call by call."""
    import torch

    from xrpo.rollout.engine import SamplingParams
    from xrpo.trainer.setup import load_data, load_model, make_renderer

    cfg = build_config(config, ["data.n_heldout=8", *extra])
    threads = cfg.threads or (1 if cfg.model.path == "default" else None)  # as `xrpo train` sets them
    if threads:
        torch.set_num_threads(threads)
    train_problems, _ = load_data(cfg, log=lambda *_: None)
    model, tok, _ = load_model(cfg, log=lambda *_: None)
    renderer = make_renderer(cfg, tok)
    prompts = [renderer.render(p) for p in train_problems[:16]]
    top = max(rows_list)
    engines = {}
    for k in dict.fromkeys(["hf", kind]):
        c = build_config(config, ["data.n_heldout=8", *extra, f"rollout.engine={k}", f"rollout.max_batch_size={top}"])
        engines[k] = build_engine(c, model, tok)
    rows_out = []
    for rows in rows_list:
        n = min(rows, len(prompts))
        counts = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
        got = {k: [] for k in engines}
        for rep in range(repeats + 1):  # the first pair warms up
            for k, engine in engines.items():
                params = SamplingParams(cfg.rollout.temperature, max_new_tokens=cfg.rollout.max_new_tokens, seed=rep)
                t0 = time.perf_counter()
                out = engine.generate(prompts[:n], counts, params)
                dt = time.perf_counter() - t0
                if rep:
                    got[k].append(sum(r.num_tokens for rs in out for r in rs) / dt)
        row = {"rows": rows, **{f"{k} tokens/s": float(np.median(v)) for k, v in got.items()}}
        if kind != "hf":
            pairs = [a / b for a, b in zip(got[kind], got["hf"])]
            row["ratio"], row["ratio_min"], row["ratio_max"] = float(np.median(pairs)), min(pairs), max(pairs)
        print(json.dumps(row), flush=True)
        rows_out.append(row)
    return rows_out


def report_row(report) -> dict:
    """Figures the metrics rows lack: the share of rollouts whose advantage is non-zero, the engine steps the step
    took, and those `step_latency`'s model predicts from the step's rollout lengths (each arm under its own
    schedule: one batch, rounds, or ideal streaming)."""
    plan = report.plan
    adv = plan.advantages
    stage = {i: r.get("stage", r["round"]) for i, r in enumerate(plan.rounds)}
    stages = sorted(set(stage.values()))
    P = len(report.problems)
    lengths = [[[] for _ in range(P)] for _ in stages]
    for x in plan.records:
        lengths[stages.index(stage[x.round])][x.problem_index].append(len(x.completion_ids))
    model = step_latency(lengths)
    streamed = any("members" in r for r in plan.rounds)
    kind = "batch" if len(stages) == 1 else ("streaming" if streamed else "rounds")
    row = {
        "adv/nonzero_frac": float(np.mean(np.abs(adv) > 1e-12)) if adv is not None and adv.size else 0.0,
        "model/engine_steps": model[f"steps_{kind}"],
        "model/engine_steps_rounds": model["steps_rounds"],
        # nan where the arm's engine counts no steps (hf)
        "engine/steps": float(engine_steps() - report_row.last) if COUNTING_NOW[0] else float("nan"),
    }
    report_row.last = engine_steps()
    return row


report_row.last = 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--engine", choices=list(ENGINES), default="hf")
    ap.add_argument("--arms", nargs="+", default=["xrpo", "grpo"], help=f"{', '.join(ARMS)}; NAME@ENGINE on another")
    ap.add_argument("--config", help="a training config (YAML) to start from instead of the defaults")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides, every arm")
    ap.add_argument("--gen-rows", nargs="*", type=int, default=[], help="rollouts per call of the tokens/s runs")
    ap.add_argument("--gen-repeats", type=int, default=5, help="measured calls per engine and row count")
    args = ap.parse_args()
    if "grpo" not in args.arms:
        args.arms.append("grpo")
    extra = list(args.set)
    if args.engine == "vllm" and not any(s.startswith("rollout.vllm_kv_cache_gib") for s in extra):
        extra.append("rollout.vllm_kv_cache_gib=0.5")
    tokens = bench_tokens(args.engine, args.gen_rows, args.gen_repeats, args.config, extra) if args.gen_rows else []
    rows: dict[str, list[dict]] = {a: [] for a in args.arms}
    per_block: dict[str, list[float]] = {a: [] for a in args.arms}  # the median step of each block
    with tempfile.TemporaryDirectory() as tmp:
        for b in range(args.blocks):
            for arm in args.arms:
                got = run_block(arm, args.steps, b, Path(tmp) / f"{arm}-{b}", args.config, extra, args.engine)
                rows[arm].extend(got[1:])  # the first step of a block pays one-off warm-up costs
                per_block[arm].append(float(np.median([r["time/step"] for r in got[1:] or got])))
    med = {
        m: {k: float(np.median([r.get(k, 0.0) for r in rs])) for k in PARTS + ["time/step"]} for m, rs in rows.items()
    }
    n = len(rows["grpo"])
    print(
        f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.2f} at the end; engine {args.engine}; {args.blocks} blocks x {args.steps} steps per "
        f"arm, median over {n} steps; config {args.config or 'default'} {' '.join(args.set)}"
    )
    if tokens:
        print()
        print(f"generation alone, tokens/s ({args.gen_repeats} calls per engine and row count, alternating; median):")
        print(f"| rollouts per call | hf | {args.engine} | {args.engine} / hf (min-max over call pairs) |")
        print("|---:|---:|---:|---|")
        for t in tokens:
            cells = f"{t.get('ratio', 1.0):.2f} ({t.get('ratio_min', 1.0):.2f}-{t.get('ratio_max', 1.0):.2f})"
            print(f"| {t['rows']} | {t['hf tokens/s']:.0f} | {t[f'{args.engine} tokens/s']:.0f} | {cells} |")
    print()
    print(
        "| arm | step (s) | "
        + " | ".join(k.split("/")[1] for k in PARTS)
        + " | step / grpo | per block: median (min-max) |"
    )
    print("|---|---|" + "---|" * len(PARTS) + "---|---|")
    for m in args.arms:
        ratio = med[m]["time/step"] / med["grpo"]["time/step"]
        blocks = [a / g for a, g in zip(per_block[m], per_block["grpo"])]
        print(
            f"| {m} | {med[m]['time/step']:.3f} | "
            + " | ".join(f"{med[m][k]:.3f}" for k in PARTS)
            + f" | {ratio:.3f} | {np.median(blocks):.3f} ({min(blocks):.3f}-{max(blocks):.3f}) |"
        )
    print()
    print("per-step means (± standard error over steps):")
    print("| arm | " + " | ".join(QUALITY) + " | completion length |")
    print("|---|" + "---|" * (len(QUALITY) + 1))
    for m in args.arms:
        cells = []
        for k in QUALITY + ["rollout/response_length_mean"]:
            x = np.array([r.get(k, 0.0) for r in rows[m]], dtype=float)
            cells.append(f"{x.mean():.3f} ± {x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else 0.0:.3f}")
        print(f"| {m} | " + " | ".join(cells) + " |")
    if args.engine in ("hf-cb", "vllm"):
        print()
        print("engine steps per training step (the engine's, measured; the engine-step model's for the arm's")
        print("schedule, and for rounds on the same rollout lengths), median:")
        print("| arm | " + " | ".join(STEPS) + " |")
        print("|---|" + "---|" * len(STEPS))
        for m in args.arms:
            print(f"| {m} | " + " | ".join(f"{np.median([r[k] for r in rows[m]]):.1f}" for k in STEPS) + " |")


if __name__ == "__main__":
    main()
