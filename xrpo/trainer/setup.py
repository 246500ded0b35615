"""Building what the loop needs from a config: model and tokenizer, data, rollout engine, ICL corpus. The model and
engine builders themselves take plain arguments (`xrpo.models.loading`, `xrpo.rollout.build`); these map the
`TrainConfig` onto them."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from xrpo.data import Problem, load_problems
from xrpo.models import loading
from xrpo.rollout.build import build_engine as build_rollout_engine
from xrpo.rollout.build import build_renderer
from xrpo.trainer.config import TrainConfig


def cache_root(cfg: TrainConfig) -> Path:
    return loading.cache_root(cfg.model.cache_dir)


def load_data(cfg: TrainConfig, log=print) -> tuple[list[Problem], list[Problem]]:
    d = cfg.data
    if d.train == "default":
        from xrpo.data.tasks import make_default_task

        train, heldout = make_default_task(
            n_train=d.n_train, n_heldout=d.n_heldout, seed=cfg.seed, families=d.families, levels=d.levels
        )
        if d.heldout:
            heldout = _load(d.heldout, d)[: d.n_heldout]
    else:
        train = _load(d.train, d)
        if not d.heldout:
            raise ValueError("data.heldout is required when data.train is a file (a held-out split to validate on)")
        heldout = _load(d.heldout, d)[: d.n_heldout]
    if not train:
        raise ValueError(f"data.train {d.train!r} has no problems")
    if not heldout:
        raise ValueError(f"data.heldout {d.heldout!r} has no problems")
    log(f"data: {len(train)} training problems, {len(heldout)} held-out problems")
    return train, heldout


def _load(path: str, d) -> list[Problem]:
    return load_problems(path, prompt_key=d.prompt_key, answer_key=d.answer_key, id_key=d.id_key)


def _model_source(cfg: TrainConfig) -> dict:
    """The `model.*` settings that say where the weights come from, as `xrpo.models.loading` takes them."""
    m = cfg.model
    return {"gguf_file": m.gguf_file, "cache_dir": m.cache_dir, "warmup_steps": m.warmup_steps}


def load_model(cfg: TrainConfig, *, path: str | None = None, log=print):
    """Returns (model, tokenizer, initial_model_path) of ``path or cfg.model.path`` (``path``: the KL reference), in
    `param_dtype`, through `xrpo.models.loading.load_model`; ``initial_model_path`` is the resolved directory (or hub
    id) the weights came from. The model to train comes from `load_policy`."""
    return loading.load_model(path or cfg.model.path, dtype=param_dtype(cfg), log=log, **_model_source(cfg))


def _trained_dtype(cfg: TrainConfig) -> str:
    """The dtype of the parameters the optimiser updates: model.master_dtype (None: float32); peft keeps LoRA's
    adapters in float32."""
    return "float32" if cfg.model.lora_rank > 0 else (cfg.model.master_dtype or "float32")


def param_dtype(cfg: TrainConfig) -> str:
    """The dtype the model is loaded in: the trained parameters' (`_trained_dtype`) for full fine-tuning; with LoRA
    the frozen base weights are held in model.dtype (no master copy is needed for weights that never update)."""
    return cfg.model.dtype if cfg.model.lora_rank > 0 else _trained_dtype(cfg)


def autocast_dtype(cfg: TrainConfig) -> str | None:
    """The dtype forward passes run in under `torch.autocast`, or None when the trained parameters already are in
    the compute dtype: bfloat16 compute over float32 master weights (or float32 adapters) is mixed precision."""
    return cfg.model.dtype if _trained_dtype(cfg) != cfg.model.dtype else None


def load_policy(cfg: TrainConfig, *, checkpoint_model: str | None = None, log=print):
    """Returns (model, tokenizer, initial_model_path): the model to train, in `param_dtype`, with the memory
    features of the config applied (LoRA adapters, gradient checkpointing). ``checkpoint_model``: a checkpoint's
    model directory to resume from (full weights, or with LoRA the adapter saved there on top of the base model)."""
    m = cfg.model
    lora_on = m.lora_rank > 0
    # full weights resume from the checkpoint; LoRA starts from the base model and puts the saved adapter on it
    src = checkpoint_model if checkpoint_model is not None and not lora_on else m.path
    model, tokenizer, init_path = loading.load_model(src, dtype=param_dtype(cfg), log=log, **_model_source(cfg))
    if src != m.path:  # the reference and vLLM start from the initial model, also on resume
        init_path = loading.resolve_model_dir(m.path, log=log, **_model_source(cfg))
    if lora_on:
        from xrpo.models import lora

        if checkpoint_model is not None:
            model = lora.load_adapter(model, checkpoint_model, trainable=True)
        else:
            model = lora.apply_lora(
                model,
                rank=m.lora_rank,
                alpha=m.lora_alpha,
                dropout=m.lora_dropout,
                target_modules=m.lora_target_modules,
                base_path=init_path,
            )
    if m.gradient_checkpointing:
        from xrpo.trainer.logprobs import unwrap_causal_lm

        # non-reentrant: no need for inputs that require grad (LoRA's frozen embeddings), and it composes with
        # the chunked log-probs' own checkpoints
        unwrap_causal_lm(model).gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, tokenizer, init_path


def build_engine(cfg: TrainConfig, model, tokenizer):
    """The rollout engine of `rollout.engine` (`xrpo.rollout.build.build_engine`). vLLM loads the resolved model
    directory (never `model.path` as written: "default" or "package:NAME" mean nothing to it) and then gets the
    training model's weights, which on resume are the checkpoint's."""
    r = cfg.rollout
    model_dir = None
    if r.engine == "vllm":
        model_dir = loading.resolve_model_dir(cfg.model.path, log=lambda *_: None, **_model_source(cfg))
    return build_rollout_engine(
        r.engine,
        tokenizer,
        model=model,
        model_dir=model_dir,
        dtype=cfg.model.dtype,
        seed=cfg.seed,
        max_batch_size=r.max_batch_size,
        max_seq_len=cfg.data.max_prompt_tokens + r.max_new_tokens,
        vllm_dtype=r.vllm_dtype,
        gpu_memory_utilization=r.vllm_gpu_memory_utilization,
        kv_cache_gib=r.vllm_kv_cache_gib,
        max_model_len=r.vllm_max_model_len,
        enforce_eager=r.vllm_enforce_eager,
        autocast_dtype=autocast_dtype(cfg),
    )


def new_corpus(cfg: TrainConfig):
    from xrpo.icl import ICLCorpus, get_embedder

    emb, keep = get_embedder(cfg.rollout.embedder), cfg.rollout.corpus_max_per_problem
    if cfg.rollout.icl_corpus:
        return ICLCorpus.from_jsonl(cfg.rollout.icl_corpus, emb, max_per_problem=keep)
    return ICLCorpus(emb, max_per_problem=keep)


def load_corpus(cfg: TrainConfig, path: Path):
    from xrpo.icl import ICLCorpus, get_embedder

    return ICLCorpus.load(path, get_embedder(cfg.rollout.embedder))


def make_renderer(cfg: TrainConfig, tokenizer):
    """The prompt renderer, with the "auto" choices resolved (see DataConfig.prompt_template, RolloutConfig)."""
    template = cfg.data.prompt_template or ("Q: {prompt}\nA:" if cfg.data.train == "default" else "{prompt}")
    return build_renderer(
        tokenizer,
        prompt_template=template,
        icl_style=cfg.rollout.icl_style,
        default_model=cfg.model.path == "default",
        use_chat_template=cfg.model.use_chat_template,
        system_prompt=cfg.model.system_prompt,
        max_prompt_tokens=cfg.data.max_prompt_tokens,
        fewshot_example=cfg.rollout.icl_fewshot_example,
        fewshot_position=cfg.rollout.icl_fewshot_position,
    )


def check_prompt_lengths(cfg: TrainConfig, tokenizer, renderer, problems: list[Problem]) -> None:
    """Every prompt, as the engine will receive it, fits ``data.max_prompt_tokens``; the error names the problem."""
    encoded = tokenizer([renderer.render(p) for p in problems], add_special_tokens=False)["input_ids"]
    for p, ids in zip(problems, encoded):
        if len(ids) > cfg.data.max_prompt_tokens:
            raise ValueError(
                f"problem {p.id}: prompt has {len(ids)} tokens, more than data.max_prompt_tokens="
                f"{cfg.data.max_prompt_tokens}"
            )


def lr_scheduler(optimizer, o, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``o.warmup_steps``, then constant or (``o.schedule == "cosine"``) cosine decay to 0 at
    ``steps``."""

    def lr_lambda(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "cosine":
            frac = (step - o.warmup_steps) / max(1, steps - o.warmup_steps)
            return 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


def memory_estimate(cfg: TrainConfig, model):
    """(`xrpo.trainer.memory.MemoryEstimate`, device capacity in bytes or None) of this config with this model."""
    from xrpo.trainer import memory

    r, o = cfg.rollout, cfg.optim
    device = next(model.parameters()).device
    capacity = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    shape = memory.model_shape(model)
    vllm = 0
    if r.engine == "vllm":
        if capacity is not None:
            vllm = int(r.vllm_gpu_memory_utilization * capacity)
        else:
            vllm = int(r.vllm_kv_cache_gib * memory.GIB) + shape.n_params * memory.DTYPE_BYTES[cfg.model.dtype]
    # a full micro-batch: rows as long as a prompt plus a completion, completions max_new_tokens long
    row = cfg.data.max_prompt_tokens + r.max_new_tokens
    rows = max(1, o.micro_batch_tokens // row)
    est = memory.estimate_memory(
        shape,
        dtype=cfg.model.dtype,
        param_dtype=param_dtype(cfg),
        lora=cfg.model.lora_rank > 0,
        kl=cfg.method.kl_coef > 0,
        micro_batch_tokens=min(o.micro_batch_tokens, rows * row),
        completion_tokens=rows * r.max_new_tokens,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        logprob_chunk_tokens=o.logprob_chunk_tokens,
        vllm_bytes=vllm,
    )
    return est, capacity
