"""What `xrpo eval` samples with: the engine, the prompt renderer and (test-time ICL) the corpus, built from the
evaluation's settings through the same builders as the trainer's (`xrpo.models.loading`, `xrpo.rollout.build`)."""

from __future__ import annotations

from pathlib import Path

from xrpo.eval.config import EvalConfig
from xrpo.eval.model import ResolvedModel

__all__ = ["build", "context_length"]


def build(cfg: EvalConfig, rm: ResolvedModel, settings: dict, log):
    """(engine, renderer, corpus): corpus is None without --icl-corpus."""
    import torch

    from xrpo.models import loading
    from xrpo.rollout.build import build_engine, build_renderer

    run = rm.run
    source = {"gguf_file": settings["gguf_file"], "cache_dir": run.cache_dir, "warmup_steps": run.warmup_steps}
    threads = cfg.threads or (1 if run.model_path == "default" else None)
    if threads:
        torch.set_num_threads(threads)
    if cfg.engine == "vllm":
        # vLLM loads the weights itself: no transformers copy of the model is needed to evaluate
        model_dir = loading.resolve_model_dir(rm.load_path, log=log, **source)
        try:
            tokenizer = loading.load_tokenizer(model_dir)
        except OSError as e:
            raise FileNotFoundError(f"model {rm.spec}: no tokenizer could be loaded from {model_dir}: {e}") from None
        kv_cache = cfg.vllm_kv_cache_gib if cfg.vllm_kv_cache_gib is not None else run.vllm_kv_cache_gib
        max_len = cfg.vllm_max_model_len if cfg.vllm_max_model_len is not None else run.vllm_max_model_len
        if max_len is not None and max_len <= settings["max_new_tokens"]:
            raise ValueError(
                f"--vllm-max-model-len {max_len} leaves no room for a prompt with --max-new-tokens "
                f"{settings['max_new_tokens']}: it must exceed it"
            )
        engine = build_engine(
            "vllm",
            tokenizer,
            model_dir=model_dir,
            dtype=settings["dtype"],
            seed=cfg.seed,
            vllm_dtype=run.vllm_dtype,
            gpu_memory_utilization=cfg.vllm_gpu_memory_utilization or 0.9,
            kv_cache_gib=kv_cache,
            max_model_len=max_len,
            enforce_eager=run.vllm_enforce_eager,
        )
    else:
        model, tokenizer, _ = loading.load_model(rm.load_path, dtype=settings["dtype"], log=log, **source)
        model.eval()
        engine = build_engine(
            cfg.engine,
            tokenizer,
            model=model,
            max_batch_size=settings["batch_size"],
            max_seq_len=settings["max_prompt_tokens"] + settings["max_new_tokens"],
        )
    renderer = build_renderer(
        tokenizer,
        prompt_template=settings["prompt_template"],
        icl_style=settings["icl_style"] or run.icl_style,
        default_model=run.model_path == "default",
        use_chat_template=settings["chat_template"],
        system_prompt=settings["system_prompt"],
        max_prompt_tokens=settings["max_prompt_tokens"],
        fewshot_example=run.icl_fewshot_example,
        fewshot_position=run.icl_fewshot_position,
    )
    context = context_length(engine)
    if context is not None and settings["max_new_tokens"] >= context:  # else every problem would be skipped, unsolved
        raise ValueError(
            f"--max-new-tokens {settings['max_new_tokens']} leaves no room for a prompt in the model's context of "
            f"{context} tokens (prompt + completion): give at most {context - 1}"
        )
    if context is not None and renderer.max_prompt_tokens:
        # an ICL prompt must leave room for the completion in the model's context
        renderer.max_prompt_tokens = max(1, min(renderer.max_prompt_tokens, context - settings["max_new_tokens"]))
    corpus = None
    if cfg.icl_corpus:
        from xrpo.eval.icl import load_corpus

        corpus = load_corpus(cfg.icl_corpus, settings["embedder"])
        log(
            f"test-time ICL: {len(corpus)} solved problems from {Path(cfg.icl_corpus)}, {cfg.icl_k} examples per prompt"
        )
    return engine, renderer, corpus


def context_length(engine) -> int | None:
    """The longest prompt + completion the engine's model takes (None: unknown)."""
    if getattr(engine, "max_model_len", None):
        return int(engine.max_model_len)
    config = getattr(getattr(engine, "model", None), "config", None)
    return getattr(config, "max_position_embeddings", None)
