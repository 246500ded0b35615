"""One GPU, the paper's setting, measured on random-initialised models of real shapes (no weights needed):
generation tokens/s with the HF engine, update tokens/s and peak memory of one micro-batch with each memory feature
(against `xrpo.trainer.memory`'s estimate), and XRPO / GRPO step time at the paper's budget with the HF engine.

    python benchmarks/bench_gpu.py --out DIR                      # Qwen2.5-0.5B and 1.5B shapes, on CUDA
    python benchmarks/bench_gpu.py --out DIR --smoke              # a tiny shape on the CPU: the CI rehearsal
    python benchmarks/bench_gpu.py --out DIR --shapes qwen2.5-0.5b --no-update --gen-engines hf hf-cb \\
        --gen-rows 16 64 128 --step-engine hf-cb --step-arms grpo xrpo-streaming xrpo grpo@hf --tag cb
        # the continuous-batching engine against the HF engine: generation, and steps (ARM@ENGINE: another engine)

Writes DIR/bench_gpu.json (every figure) and DIR/bench_gpu.md (the table docs/benchmarks.md's "## GPU" quotes).
Peak memory is `torch.cuda.max_memory_allocated` on CUDA; on the CPU (the smoke run) it is not measured. Each
measurement runs in its own try block: an out-of-memory or any error is recorded in the table, and the rest goes on.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import tempfile
import time
import traceback
from pathlib import Path

import torch

SHAPES = {
    # Qwen2.5-0.5B / 1.5B (config.json of the released models): tied embeddings, 151,936-token vocabulary
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "smoke": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=True),
}  # fmt: skip

# (name, model.gradient_checkpointing, optim.logprob_chunk_tokens, model.lora_rank); bf16 compute over float32
# master weights throughout (model.dtype=bfloat16), as a GPU user trains
FEATURES = [
    ("plain", False, None, 0),
    ("checkpointing", True, None, 0),
    ("chunked log-probs", False, 1024, 0),
    ("checkpointing + chunks", True, 1024, 0),
    ("LoRA r16 + checkpointing + chunks", True, 1024, 16),
]
GIB = 1024**3


def random_model(shape: str, device: str, dtype=torch.float32):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(max_position_embeddings=4096, **SHAPES[shape])
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    return model.to(dtype).eval()


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def reset_peak(device):
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak(device):
    return torch.cuda.max_memory_allocated() if device == "cuda" else None


def tokenizer():
    from xrpo.models.tiny import build_tiny_tokenizer

    texts = [f"Q: {a} + {b} = ?\nA: \\boxed{{{a + b}}}" for a in range(40) for b in range(40)]
    return build_tiny_tokenizer(texts)


# ------------------------------------------------------------------------------------------------- generation
def bench_generation(shape, device, rows, new_tokens, engine="hf"):
    from xrpo.rollout.build import build_engine
    from xrpo.rollout.engine import SamplingParams

    model = random_model(shape, device)
    tok = tokenizer()
    kind = engine
    engine = build_engine(
        kind,
        tok,
        model=model,
        max_batch_size=rows,
        max_seq_len=32 + new_tokens,
        autocast_dtype="bfloat16" if device == "cuda" else None,
    )
    prompts = [[(7 * i + j) % 400 + 3 for j in range(32)] for i in range(rows)]
    params = SamplingParams(max_new_tokens=new_tokens, seed=0)
    engine.generate_ids(prompts[:2], [1, 1], SamplingParams(max_new_tokens=4, seed=0))  # warm-up
    reset_peak(device)
    sync(device)
    steps0 = getattr(engine, "steps", 0)
    t0 = time.perf_counter()
    out = engine.generate_ids(prompts, [1] * rows, params)
    sync(device)
    dt = time.perf_counter() - t0
    n = sum(r.num_tokens for rs in out for r in rs)
    res = {"engine": kind, "rows": rows, "tokens": n, "seconds": dt, "tokens_per_s": n / dt}
    res["peak_gib"] = _gib(peak(device))
    if kind == "hf-cb":
        res["engine_steps"] = engine.steps - steps0
        res["attention"] = engine.attention
    del engine, model
    return res


# ----------------------------------------------------------------------------------------------------- update
def bench_update(shape, device, feature, rows, prompt_len, completion_len, repeats):
    from xrpo.models import lora as lora_mod
    from xrpo.trainer import memory
    from xrpo.trainer.logprobs import completion_logprobs
    from xrpo.trainer.update import Policy, checkpointing

    name, ckpt, chunk, rank = feature
    if rank:
        base = random_model(shape, device, torch.bfloat16 if device == "cuda" else torch.float32)
        model = lora_mod.apply_lora(base, rank=rank, alpha=2.0 * rank)
    else:
        model = random_model(shape, device)
    if ckpt:
        model_lm = model.get_base_model() if rank else model
        model_lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=1e-6)
    auto = torch.bfloat16 if device == "cuda" else None
    policy = Policy(model, opt, None, 0, autocast_dtype=auto, logprob_chunk_tokens=chunk, gradient_checkpointing=ckpt)
    g = torch.Generator().manual_seed(0)
    vocab = SHAPES[shape]["vocab_size"]
    prompts = [torch.randint(3, vocab, (prompt_len,), generator=g).tolist() for _ in range(rows)]
    comps = [torch.randint(3, vocab, (completion_len,), generator=g).tolist() for _ in range(rows)]

    def step():
        opt.zero_grad(set_to_none=True)
        with policy.compute(), checkpointing(model, ckpt):
            lp, mask = completion_logprobs(model, prompts, comps, 0, 1.0, chunk)
        (-(lp * mask).sum() / mask.sum()).backward()
        opt.step()

    step()  # warm-up; AdamW allocates its state here
    reset_peak(device)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        step()
    sync(device)
    dt = (time.perf_counter() - t0) / repeats
    tokens = rows * (prompt_len + completion_len)
    est = memory.estimate_memory(
        memory.model_shape(model),
        dtype="bfloat16" if auto is not None else "float32",
        param_dtype=("bfloat16" if device == "cuda" else "float32") if rank else "float32",
        lora=bool(rank),
        kl=False,
        micro_batch_tokens=tokens,
        completion_tokens=rows * completion_len,
        gradient_checkpointing=ckpt,
        logprob_chunk_tokens=chunk,
    )
    res = {
        "feature": name,
        "tokens": tokens,
        "seconds": dt,
        "tokens_per_s": tokens / dt,
        "peak_gib": _gib(peak(device)),
        "estimate_gib": est.training_peak / GIB,
        "estimate": {k: v / GIB for k, v in est.__dict__.items()},
    }
    return res


# ------------------------------------------------------------------------------------------------- step time
def bench_steps(
    shape,
    device,
    out: Path,
    steps: int,
    new_tokens: int,
    prompts_per_step: int,
    rollouts: int,
    arms=("grpo", "xrpo"),
    engine="hf",
    res=None,
    save=lambda: None,
):
    """The arms (bench_step.py's: grpo, xrpo, xrpo-streaming; ARM@ENGINE on another engine than ``engine``) one
    after the other at one budget. `res` is filled arm by arm (and `save` called after each), and every step's times
    are printed as it ends, so a run stopped by its time limit keeps what it measured."""
    from bench_step import arm_overrides

    from xrpo.trainer.config_loader import build_config
    from xrpo.trainer.loop import train

    tmp = Path(tempfile.mkdtemp(prefix="bench_gpu_"))
    model_dir = tmp / "model"
    model = random_model(shape, "cpu")
    model.save_pretrained(model_dir)
    tokenizer().save_pretrained(model_dir)
    del model
    rows = [{"id": f"p{i}", "problem": f"{i} + {i + 3} = ?", "answer": str(2 * i + 3)} for i in range(64)]
    (tmp / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    res = {} if res is None else res
    for method in arms:
        arm_engine = method.partition("@")[2] or engine
        times = []
        ov = [
            *arm_overrides(method, engine),
            f"output={tmp / method}",
            f"steps={steps}",
            f"model.path={model_dir}",
            "model.dtype=bfloat16" if device == "cuda" else "model.dtype=float32",
            "model.gradient_checkpointing=true",
            "optim.logprob_chunk_tokens=1024",
            f"data.train={tmp / 'train.jsonl'}",
            f"data.heldout={tmp / 'held.jsonl'}",
            "data.prompt_template=Q: {prompt}\nA:",
            f"rollout.prompts_per_step={prompts_per_step}",
            f"rollout.rollouts_per_step={rollouts}",
            f"rollout.max_new_tokens={new_tokens}",
            "rollout.embedder=hash",
            "optim.lr=2e-6",
            "eval_samples=1",
            "eval_k=[1]",
            "eval_every=0",
            "save_every=0",
            "log_samples_every=0",
            "progress=false",
            "tensorboard=false",
        ]

        def on_step(r, times=times, method=method):
            times.append(r.metrics)
            m = r.metrics
            print(
                f"  {method} step {len(times)}: step {m['time/step']:.2f}s generate {m.get('time/generate', 0):.2f}s "
                f"update {m['time/update']:.2f}s rollouts {m.get('rollout/count', 0):.0f}",
                flush=True,
            )

        reset_peak(device)
        train(build_config(None, ov), log=lambda *_: None, on_step=on_step)
        later = times[1:] or times  # the first step compiles kernels and allocates the optimiser's state
        res[method] = {
            "engine": arm_engine,
            "step_s": sorted(m["time/step"] for m in later)[len(later) // 2],
            "generate_s": sorted(m.get("time/generate", 0.0) for m in later)[len(later) // 2],
            "update_s": sorted(m["time/update"] for m in later)[len(later) // 2],
            "rollouts": sum(m.get("rollout/count", 0) for m in later) / len(later),
            "peak_gib": _gib(peak(device)),
        }
        save()
    return res


def _gib(x):
    return None if x is None else x / GIB


def attempt(what, fn, *a, **kw):
    t0 = time.perf_counter()
    try:
        r = fn(*a, **kw)
    except Exception as e:  # noqa: BLE001 - recorded in the table; the rest of the benchmark goes on
        traceback.print_exc()
        r = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    print(f"[{time.perf_counter() - t0:6.1f}s] {what}: {json.dumps(r, default=str)[:300]}", flush=True)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="a tiny shape on the CPU, seconds: the CI rehearsal")
    ap.add_argument("--shapes", nargs="*", default=["qwen2.5-0.5b", "qwen2.5-1.5b"], choices=list(SHAPES))
    ap.add_argument("--step-shapes", nargs="*", default=["qwen2.5-0.5b"], choices=list(SHAPES))
    ap.add_argument("--step-tokens", type=int, default=256, help="max_new_tokens of the step-time runs")
    ap.add_argument("--steps", type=int, default=3, help="steps per method in the step-time runs")
    ap.add_argument("--tag", default="", help="suffix of the output files (bench_gpu-TAG.json / .md)")
    ap.add_argument("--gen-engines", nargs="+", default=["hf"], choices=["hf", "hf-cb"], help="generation engines")
    ap.add_argument("--gen-rows", nargs="+", type=int, default=[128], help="rollouts per generation call")
    ap.add_argument("--no-update", action="store_true", help="skip the update table")
    ap.add_argument("--step-engine", default="hf", choices=["hf", "hf-cb"], help="the step-time runs' engine")
    ap.add_argument("--step-arms", nargs="+", default=["grpo", "xrpo"], help="ARM or ARM@ENGINE (bench_step.py)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    shapes, step_shapes = args.shapes, args.step_shapes
    if args.smoke:  # the smoke shape in place of the real ones; an empty list stays empty (a stage left out)
        shapes, step_shapes = ["smoke"][: len(shapes)], ["smoke"][: len(step_shapes)]
    # sizes: a GPU micro-batch of 8 x (256 + 768) = 8,192 tokens; the smoke run's of 2 x (8 + 8)
    upd = (
        dict(rows=8, prompt_len=256, completion_len=768, repeats=2)
        if not args.smoke
        else dict(rows=2, prompt_len=8, completion_len=8, repeats=1)
    )
    gen = dict(new_tokens=128) if not args.smoke else dict(new_tokens=4)
    gen_rows = args.gen_rows if not args.smoke else [min(r, 4 * (i + 1)) for i, r in enumerate(args.gen_rows)]
    stp = (
        dict(steps=args.steps, new_tokens=args.step_tokens, prompts_per_step=16, rollouts=128)
        if not args.smoke
        else dict(steps=2, new_tokens=4, prompts_per_step=4, rollouts=16)
    )
    stp.update(arms=args.step_arms, engine=args.step_engine)
    report = {
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "smoke": args.smoke,
        "shapes": {},
    }

    suffix = f"-{args.tag}" if args.tag else ""

    def save():  # after every measurement: a run stopped by its time limit keeps what it measured
        (out / f"bench_gpu{suffix}.json").write_text(json.dumps(report, indent=1, default=str))
        (out / f"bench_gpu{suffix}.md").write_text(render(report, upd, gen, stp))

    for shape in shapes:
        r = report["shapes"].setdefault(shape, {})
        r["generation"] = []
        for rows in gen_rows:  # the engines alternate at each row count
            for engine in args.gen_engines:
                what = f"{shape} generation {engine} {rows} rows"
                got = attempt(what, bench_generation, shape, device, rows=rows, engine=engine, **gen)
                r["generation"].append({"engine": engine, "rows": rows, **got})
                save()
        r["update"] = []
        for f in FEATURES if not args.no_update else []:
            r["update"].append(attempt(f"{shape} update {f[0]}", bench_update, shape, device, f, **upd))
            save()
    for shape in step_shapes:
        r = report["shapes"].setdefault(shape, {})
        r["steps"] = {}
        got = attempt(f"{shape} steps", bench_steps, shape, device, out, **stp, res=r["steps"], save=save)
        if "error" in got:
            r["steps"]["error"] = got["error"]
        save()
    save()
    print((out / f"bench_gpu{suffix}.md").read_text())


def render(report, upd, gen, stp) -> str:
    def f(x, d=1):
        return "-" if x is None else f"{x:.{d}f}"

    lines = [
        f"device: {report['device']}, torch {report['torch']}" + (" (smoke: CPU rehearsal)" if report["smoke"] else ""),
        "",
        f"Generation (bf16 autocast on CUDA): one call of R rows x {gen['new_tokens']} new tokens, prompts of 32 "
        "tokens; hf = transformers generate, hf-cb = transformers' continuous batching.",
        f"Update: one micro-batch of {upd['rows']} x ({upd['prompt_len']} + {upd['completion_len']}) tokens, "
        "forward + backward + AdamW step, bf16 compute over float32 master weights (LoRA: bf16 base).",
        "",
        "| shape | what | tokens/s | peak GiB | estimate GiB |",
        "|---|---|---:|---:|---:|",
    ]
    for shape, r in report["shapes"].items():
        gens = r.get("generation") or []
        for g in gens:
            err = g.get("error")
            what = f"generation, {g['engine']}, {g['rows']} rows"
            lines.append(f"| {shape} | {what} | {err or f(g['tokens_per_s'], 0)} | {f(g.get('peak_gib'), 2)} | |")
        by = {(g["engine"], g["rows"]): g.get("tokens_per_s") for g in gens}
        for (engine, rows), tps in by.items():
            base = by.get(("hf", rows))
            if engine != "hf" and tps and base:
                lines.append(f"| {shape} | generation, {engine} / hf, {rows} rows | {tps / base:.2f}x | | |")
        for u in r.get("update", []):
            if "error" in u:
                lines.append(f"| {shape} | update: ? | {u['error']} | | |")
                continue
            lines.append(
                f"| {shape} | update: {u['feature']} | {f(u['tokens_per_s'], 0)} | {f(u['peak_gib'], 2)} "
                f"| {f(u['estimate_gib'], 2)} |"
            )
    lines += [
        "",
        f"Step time at the budget of {stp['prompts_per_step']} prompts x {stp['rollouts']} rollouts per step, "
        f"{stp['new_tokens']} new tokens, {stp['engine']} engine unless the arm names another (median of steps "
        f"2-{stp['steps']}); ratios to grpo on the same engine:",
        "",
        "| shape | arm | engine | s/step | generate s | update s | / grpo |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for shape, r in report["shapes"].items():
        s = r.get("steps")
        if s is None:
            continue
        arms = {k: v for k, v in s.items() if isinstance(v, dict)}
        if "error" in s and not arms:
            lines.append(f"| {shape} | {s['error']} | | | | | |")
            continue
        for arm, a in arms.items():
            grpo = arms.get("grpo" + (f"@{arm.partition('@')[2]}" if "@" in arm else ""), {})
            ratio = a["step_s"] / grpo["step_s"] if grpo.get("step_s") else None
            lines.append(
                f"| {shape} | {arm.partition('@')[0]} | {a['engine']} | {f(a.get('step_s'), 2)} "
                f"| {f(a.get('generate_s'), 2)} | {f(a.get('update_s'), 2)} | {f(ratio, 3)} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
