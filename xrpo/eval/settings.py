"""The settings of an evaluation: `EvalConfig`'s options with every default filled in, from the model's run (its
config.yaml) or the trainer's defaults. What they hold is what settings.json records (`xrpo.eval.store`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from xrpo.eval.config import EvalConfig, default_chunk_size
from xrpo.eval.model import ResolvedModel
from xrpo.eval.store import SETTINGS_VERSION

__all__ = ["PROMPT_TEMPLATES", "resolve_settings"]

PROMPT_TEMPLATES = {
    "boxed": "{prompt}\nPlease reason step by step, and put your final answer within \\boxed{}.",
}
"""Named prompt templates for ``prompt_template`` (the "boxed" one is the Qwen2.5-Math instruction)."""


def resolve_settings(cfg: EvalConfig, rm: ResolvedModel, n: int) -> dict:
    """Every setting of the evaluation of ``rm`` with ``n`` samples per problem, defaults filled in (docs/eval.md,
    MODEL). Raises for a prompt template without {prompt} and a missing --icl-corpus."""
    run = rm.run
    from_run = rm.run_dir is not None
    is_default_model = run.model_path == "default"
    template = cfg.prompt_template
    if template is None:
        if from_run or run.prompt_template:
            template = run.prompt_template or ("Q: {prompt}\nA:" if run.train == "default" else "{prompt}")
        else:
            template = "Q: {prompt}\nA:" if is_default_model else "{prompt}"
    template = PROMPT_TEMPLATES.get(template, template)
    if "{prompt}" not in template:
        raise ValueError(
            f"--prompt-template must contain {{prompt}} or be one of {sorted(PROMPT_TEMPLATES)}, got {template!r}"
        )
    if cfg.max_new_tokens is not None:
        max_new = cfg.max_new_tokens
    else:
        max_new = run.max_new_tokens if (from_run or is_default_model) else 2048
    if cfg.max_prompt_tokens is not None:
        max_prompt = cfg.max_prompt_tokens
    else:
        max_prompt = run.max_prompt_tokens if (from_run or is_default_model) else 4096
    if cfg.icl_corpus is not None and not Path(cfg.icl_corpus).exists():
        raise FileNotFoundError(f"--icl-corpus {cfg.icl_corpus} does not exist")
    return {
        "version": SETTINGS_VERSION,
        "model": str(Path(rm.load_path).expanduser().resolve())
        if Path(rm.load_path).expanduser().exists()
        else rm.spec,
        "checkpoint": rm.checkpoint,
        # checkpoints are safetensors even when the run started from a GGUF file
        "gguf_file": cfg.gguf_file if rm.checkpoint is None else None,
        "dtype": cfg.dtype or run.dtype,
        "n": n,
        "greedy": cfg.greedy,
        "temperature": 0.0 if cfg.greedy else float(cfg.temperature),
        "top_p": 1.0 if cfg.greedy else float(cfg.top_p),
        "max_new_tokens": int(max_new),
        "stop": list(cfg.stop if cfg.stop is not None else run.stop),
        "seed": cfg.seed,
        "prompt_template": template,
        "chat_template": cfg.chat_template if cfg.chat_template is not None else run.use_chat_template,
        "system_prompt": cfg.system_prompt if cfg.system_prompt is not None else run.system_prompt,
        "icl_corpus": str(Path(cfg.icl_corpus).resolve()) if cfg.icl_corpus else None,
        "icl_corpus_sha": corpus_sha(Path(cfg.icl_corpus)) if cfg.icl_corpus else None,
        "icl_k": cfg.icl_k if cfg.icl_corpus else None,
        "icl_style": (cfg.icl_style or run.icl_style) if cfg.icl_corpus else None,
        "embedder": (cfg.embedder or run.embedder) if cfg.icl_corpus else None,
        "max_prompt_tokens": int(max_prompt),
        "verifier": cfg.verifier or run.verifier,
        "verifier_args": _verifier_args(cfg.verifier_args, run.verifier_args),
        "engine": cfg.engine,
        "chunk_size": cfg.chunk_size or default_chunk_size(cfg.engine, n),
        # execution settings: recorded, free to change between runs
        "batch_size": cfg.batch_size or run.max_batch_size,
        "run_dir": rm.run_dir,
    }


def corpus_sha(path: Path) -> str:
    """What a test-time ICL corpus shows: its JSONL, or a saved corpus directory's entries and meta (the embeddings
    and index follow from them and the embedder, a setting of its own). First 16 hex digits of a SHA-256."""
    files = [path / "meta.json", path / "entries.jsonl"] if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"--icl-corpus {path}: {f} not found: not a JSONL file or a saved ICL corpus")
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _verifier_args(text: str | None, default: dict) -> dict:
    if text is None:
        return dict(default or {})
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"--verifier-args: cannot parse {text!r} as YAML: {e}") from None
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(
            f"--verifier-args must be a YAML mapping of keyword arguments, e.g. '{{timeout: 2}}', got {text!r}"
        )
    return value
