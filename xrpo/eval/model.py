"""MODEL of `xrpo eval`: where the weights come from, and the training settings that supply eval's defaults.

A run directory or checkpoint directory gives its latest (or that) checkpoint's model/ and the run's config.yaml;
anything else ("default", a transformers directory, a hub id, "package:NAME") is loaded as it is, with the trainer's
default settings. `run_defaults` is the one place eval reads a training config: everything after it takes the plain
`RunDefaults`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["ResolvedModel", "RunDefaults", "resolve_model", "run_defaults"]


@dataclass(frozen=True)
class RunDefaults:
    """What eval takes from a training config (the run's config.yaml, else the trainer's defaults)."""

    model_path: str
    """model.path: the model the run started from ("default" for the built-in model)."""
    dtype: str
    """model.dtype."""
    use_chat_template: bool | None
    """model.use_chat_template."""
    system_prompt: str | None
    """model.system_prompt."""
    cache_dir: str | None
    """model.cache_dir (where the built-in and converted models are cached)."""
    warmup_steps: int
    """model.warmup_steps (which built-in model)."""
    seed: int
    """seed (the built-in task's held-out split)."""
    train: str
    """data.train ("default": the built-in task)."""
    heldout: str | None
    """data.heldout."""
    n_heldout: int
    """data.n_heldout."""
    families: list[str] | None
    """data.families (the built-in task's families)."""
    levels: dict[str, list[int]] | None
    """data.levels (the built-in task's levels)."""
    prompt_key: str | None
    """data.prompt_key."""
    answer_key: str | None
    """data.answer_key."""
    id_key: str | None
    """data.id_key."""
    verifier: str
    """data.verifier."""
    verifier_args: dict
    """data.verifier_args."""
    prompt_template: str | None
    """data.prompt_template."""
    max_prompt_tokens: int
    """data.max_prompt_tokens."""
    max_new_tokens: int
    """rollout.max_new_tokens."""
    stop: tuple[str, ...]
    """rollout.stop."""
    max_batch_size: int
    """rollout.max_batch_size."""
    icl_style: str
    """rollout.icl_style."""
    icl_fewshot_example: str | None
    """rollout.icl_fewshot_example."""
    icl_fewshot_position: str
    """rollout.icl_fewshot_position."""
    embedder: str
    """rollout.embedder."""
    vllm_dtype: str
    """rollout.vllm_dtype."""
    vllm_kv_cache_gib: float | None
    """rollout.vllm_kv_cache_gib."""
    vllm_max_model_len: int | None
    """rollout.vllm_max_model_len."""
    vllm_enforce_eager: bool | None
    """rollout.vllm_enforce_eager."""


def run_defaults(cfg) -> RunDefaults:
    """The `RunDefaults` of a `xrpo.trainer.config.TrainConfig`."""
    m, d, r = cfg.model, cfg.data, cfg.rollout
    return RunDefaults(
        model_path=m.path,
        dtype=m.dtype,
        use_chat_template=m.use_chat_template,
        system_prompt=m.system_prompt,
        cache_dir=m.cache_dir,
        warmup_steps=m.warmup_steps,
        seed=cfg.seed,
        train=d.train,
        heldout=d.heldout,
        n_heldout=d.n_heldout,
        families=d.families,
        levels=d.levels,
        prompt_key=d.prompt_key,
        answer_key=d.answer_key,
        id_key=d.id_key,
        verifier=d.verifier,
        verifier_args=dict(d.verifier_args or {}),
        prompt_template=d.prompt_template,
        max_prompt_tokens=d.max_prompt_tokens,
        max_new_tokens=r.max_new_tokens,
        stop=tuple(r.stop),
        max_batch_size=r.max_batch_size,
        icl_style=r.icl_style,
        icl_fewshot_example=r.icl_fewshot_example,
        icl_fewshot_position=r.icl_fewshot_position,
        embedder=r.embedder,
        vllm_dtype=r.vllm_dtype,
        vllm_kv_cache_gib=r.vllm_kv_cache_gib,
        vllm_max_model_len=r.vllm_max_model_len,
        vllm_enforce_eager=r.vllm_enforce_eager,
    )


@dataclass
class ResolvedModel:
    spec: str
    """What the user named."""
    load_path: str
    """What `xrpo.models.loading` loads ("default", a directory, a hub id, package:NAME)."""
    run: RunDefaults
    """The settings the prompt / data defaults come from (the run's, or the trainer's defaults)."""
    run_dir: str | None
    """The run directory, when MODEL is a run or one of its checkpoints."""
    checkpoint: str | None
    """The checkpoint directory, when MODEL is a run or a checkpoint."""


def resolve_model(spec: str) -> ResolvedModel:
    """Where the weights come from and which training config supplies the defaults (see `EvalConfig.model`)."""
    from xrpo.models import loading
    from xrpo.rundir.checkpoints import MARKER, list_checkpoints
    from xrpo.trainer.config import TrainConfig
    from xrpo.trainer.config_loader import load_run_config

    p = Path(spec).expanduser()
    if p.is_dir():
        ckpt_dir = run_dir = None
        if (p / "config.yaml").is_file() and (p / "checkpoints").is_dir():
            found = list_checkpoints(p)
            if not found:
                raise FileNotFoundError(f"model {spec}: the run directory has no complete checkpoint")
            run_dir, ckpt_dir = p, found[-1]
        elif (p / "model").is_dir() and (p / MARKER).is_file():
            ckpt_dir = p
            if (p.parent.parent / "config.yaml").is_file():
                run_dir = p.parent.parent
        elif (p / "config.yaml").is_file() and not (p / "config.json").is_file():
            raise FileNotFoundError(f"model {spec}: a run directory without checkpoints/ (did the run save any?)")
        if ckpt_dir is not None:
            cfg = TrainConfig()
            if run_dir is not None:
                try:
                    cfg = load_run_config(run_dir / "config.yaml")
                except ValueError as e:  # it names the file
                    raise ValueError(f"model {spec}: cannot read the run's config: {e}") from None
            return ResolvedModel(
                spec, str(ckpt_dir / "model"), run_defaults(cfg), str(run_dir) if run_dir else None, str(ckpt_dir)
            )
    if not p.is_dir():  # a missing path or an unreachable hub id, before any loading
        loading.check_model_source(spec, field="model")
    cfg = TrainConfig()
    cfg.model.path = spec
    return ResolvedModel(spec, spec, run_defaults(cfg), None, None)
