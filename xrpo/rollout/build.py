"""Building a rollout engine and a prompt renderer from plain settings: the one place that maps "hf" / "hf-cb" / "vllm"
to an engine and resolves the renderer's "auto" choices.

The trainer (`xrpo.trainer.setup`, from its config) and `xrpo eval` (from its settings) both call these, so an engine
and a renderer are built the same way whoever asks.
"""

from __future__ import annotations

__all__ = ["ENGINES", "STREAMING_ENGINES", "TRAINING_MODEL_ENGINES", "build_engine", "build_renderer"]

ENGINES = ("hf", "hf-cb", "vllm")
"""The engine kinds: hf (transformers generate, `xrpo.rollout.hf_engine`), hf-cb (transformers' continuous batching,
`xrpo.rollout.hf_cb_engine`) and vllm (`xrpo.rollout.vllm_engine`); docs/engines.md says which to pick when."""

STREAMING_ENGINES = ("hf-cb", "vllm")
"""The kinds that admit requests while others decode (`xrpo.rollout.engine.StreamingEngine`): what the streaming
planner needs to overlap its waves."""

TRAINING_MODEL_ENGINES = ("hf", "hf-cb")
"""The kinds that sample with the training model itself (no copy of the weights; `sync_weights` is a no-op)."""


def build_engine(
    kind: str,
    tokenizer,
    *,
    model=None,
    model_dir: str | None = None,
    dtype: str = "float32",
    seed: int = 0,
    max_batch_size: int | None = None,
    max_seq_len: int | None = None,
    vllm_dtype: str = "auto",
    gpu_memory_utilization: float | None = None,
    kv_cache_gib: float | None = None,
    max_model_len: int | None = None,
    enforce_eager: bool | None = None,
    autocast_dtype: str | None = None,
):
    """A `RolloutEngine` of kind ``kind``.

    Args:
        kind: "hf", "hf-cb" or "vllm" (`ENGINES`).
        tokenizer: the model's tokenizer (left padding, with a pad token: `xrpo.models.loading.load_tokenizer`).
        model: hf, hf-cb: the transformers model to sample from (required). vllm: optional; when given, its weights are
            loaded into vLLM after the start (the trainer's model, which on resume holds the checkpoint's weights).
        model_dir: vllm: the resolved model directory vLLM loads (`xrpo.models.loading.resolve_model_dir`; never a
            name such as "default" or "package:NAME", which mean nothing to vLLM). Required for vllm.
        dtype: the dtype the model computes in ("float32", "bfloat16").
        autocast_dtype: hf, hf-cb: None, or the dtype the engine samples in under `torch.autocast` (a model whose
            float32 parameters compute in bfloat16: mixed precision).
        seed: vllm: the engine's seed (for requests without their own).
        max_batch_size: hf: most sequences per generate call; hf-cb: most sequences decoding at once (None: the
            engine's default).
        max_seq_len: hf-cb: the longest prompt + completion in tokens, which sizes its KV cache (required).
        vllm_dtype: vllm: the dtype vLLM computes in; "auto" is ``dtype``, so that its log-probs match the model's.
        gpu_memory_utilization, kv_cache_gib, max_model_len, enforce_eager: vllm: as `VLLMEngine` takes them
            (``gpu_memory_utilization`` None: the engine's default).
    """
    if kind in TRAINING_MODEL_ENGINES:
        if model is None:
            raise ValueError(f"engine {kind}: samples from a loaded transformers model; pass model=")
        kw = {} if max_batch_size is None else {"max_batch_size": max_batch_size}
        if autocast_dtype is not None:
            import torch

            kw["autocast_dtype"] = getattr(torch, autocast_dtype)
        if kind == "hf":
            from xrpo.rollout.hf_engine import HFEngine

            return HFEngine(model, tokenizer, **kw)
        from xrpo.rollout.hf_cb_engine import HFCBEngine

        if max_seq_len is None:
            raise ValueError("engine hf-cb: sizes its KV cache for max_seq_len tokens per sequence; pass max_seq_len=")
        return HFCBEngine(model, tokenizer, max_seq_len=max_seq_len, **kw)
    if kind == "vllm":
        from xrpo.rollout.vllm_engine import VLLMEngine

        if model_dir is None:
            raise ValueError("engine vllm: loads a model directory; pass model_dir= (a resolved directory)")
        kw = {} if gpu_memory_utilization is None else {"gpu_memory_utilization": gpu_memory_utilization}
        compute = dtype if vllm_dtype == "auto" else vllm_dtype
        engine = VLLMEngine(
            model_dir,
            tokenizer=tokenizer,
            seed=seed,
            dtype=compute,
            kv_cache_gib=kv_cache_gib,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            **kw,
        )
        if model is not None:
            engine.sync_weights(model)
        return engine
    raise ValueError(f"unknown engine {kind!r}; valid engines: {', '.join(ENGINES)}")


def build_renderer(
    tokenizer,
    *,
    prompt_template: str,
    icl_style: str,
    default_model: bool,
    use_chat_template: bool | None = None,
    system_prompt: str | None = None,
    max_prompt_tokens: int | None = None,
    fewshot_example: str | None = None,
    fewshot_position: str = "start",
):
    """The `PromptRenderer` with its "auto" choices resolved.

    Args:
        prompt_template: the task's format string with {prompt}.
        icl_style: "paper", "fewshot" or "auto": fewshot for the built-in default model (``default_model``), which
            cannot read the paper's XML template; paper otherwise.
        fewshot_example: how one solved example is written, with {problem} and {solution} (None: the prompt template
            with the example's problem, followed by its solution).
        fewshot_position: where fewshot examples go ("start" or "question"; `PromptRenderer`).
        use_chat_template, system_prompt, max_prompt_tokens: as `PromptRenderer` takes them.
    """
    from xrpo.rollout.prompts import PromptRenderer

    if icl_style == "auto":
        icl_style = "fewshot" if default_model else "paper"
    example = fewshot_example or prompt_template.replace("{prompt}", "{problem}") + "{solution}"
    return PromptRenderer(
        tokenizer,
        use_chat_template=use_chat_template,
        icl_style=icl_style,
        prompt_template=prompt_template,
        max_prompt_tokens=max_prompt_tokens,
        system_prompt=system_prompt,
        fewshot_example=example,
        fewshot_position=fewshot_position,
    )
