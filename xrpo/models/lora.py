"""LoRA adapters through `peft`: wrapping a causal LM for training, the merged weights inference engines load, and
reading an adapter checkpoint back.

Only the adapter weights train (and are checkpointed); the base weights stay frozen. Three consumers see the model:
    - the training loop and the HF rollout engine use the `peft.PeftModel` itself (adapters applied on the fly: the
      same function as the merged weights, up to float rounding);
    - the KL reference is the same model with its adapters disabled (`peft.PeftModel.disable_adapter`), so no second
      copy of the base model is held;
    - vLLM and `xrpo eval` load merged weights: `inference_state_dict` computes W + delta for every adapted layer with
      peft's own `get_delta_weight`, leaving the training model untouched (merging in place and unmerging would add
      a float rounding to the frozen base weights at every step).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = [
    "ADAPTER_CONFIG",
    "apply_lora",
    "inference_state_dict",
    "is_adapter_dir",
    "is_lora_model",
    "load_adapter",
    "merged_model",
    "require_peft",
]

ADAPTER_CONFIG = "adapter_config.json"
"""The file peft writes beside an adapter's weights; a model directory holding it is an adapter checkpoint."""

INSTALL_HINT = "pip install 'xrpo[lora]'"


def require_peft():
    try:
        import peft
    except ImportError:  # pragma: no cover - the lora extra is part of "all"
        raise ImportError(f"LoRA (model.lora_rank > 0) needs peft: {INSTALL_HINT}") from None
    return peft


def apply_lora(
    model,
    *,
    rank: int,
    alpha: float,
    dropout: float = 0.0,
    target_modules: list[str] | str = "all-linear",
    base_path: str | None = None,
):
    """``model`` wrapped as a trainable `peft.PeftModel` with fresh LoRA adapters of ``rank`` (B initialised to
    zero, so the wrapped model computes exactly the base model's function at step 0).

    ``target_modules``: module-name suffixes ("q_proj", ...) or "all-linear" (every linear layer but the output
    head, peft's shorthand). ``base_path``: recorded in the adapter's config as the base model it applies to, so
    that a saved adapter can be loaded without the run's config (`load_adapter`)."""
    peft = require_peft()
    cfg = peft.LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=target_modules,
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_path,
    )
    wrapped = peft.get_peft_model(model, cfg)
    if base_path is not None:
        wrapped.peft_config["default"].base_model_name_or_path = base_path
    return wrapped


def is_lora_model(model) -> bool:
    try:
        import peft
    except ImportError:
        return False
    return isinstance(model, peft.PeftModel)


def is_adapter_dir(path) -> bool:
    return Path(path).is_dir() and (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_base(path) -> str:
    """The base model an adapter directory applies to (as recorded by `apply_lora`)."""
    cfg_file = Path(path) / ADAPTER_CONFIG
    try:
        base = json.loads(cfg_file.read_text()).get("base_model_name_or_path")
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{cfg_file}: unreadable adapter config: {e}") from None
    if not base:
        raise ValueError(f"{cfg_file}: names no base model (base_model_name_or_path); cannot load the adapter alone")
    return base


def load_adapter(base_model, path, *, trainable: bool):
    """``base_model`` with the adapter saved in ``path`` applied (trainable for a resumed run, frozen for
    evaluation)."""
    peft = require_peft()
    return peft.PeftModel.from_pretrained(base_model, str(path), is_trainable=trainable)


def _lora_layers(model):
    from peft.tuners.lora import LoraLayer

    inner = model.get_base_model()
    for name, module in inner.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


def inference_state_dict(model) -> dict:
    """The state dict an inference engine loads: ``model.state_dict()`` for a plain model; for a `peft.PeftModel`,
    the base model's names (as in its own checkpoint) with every adapted weight replaced by W + delta (peft's
    `get_delta_weight` of the active adapter: scaling x B @ A). Tensors are fresh for merged weights and the model's
    own (detached) otherwise; the model is not modified."""
    if not is_lora_model(model):
        return model.state_dict()
    import torch

    inner = model.get_base_model()
    active = model.active_adapter
    out = {}
    for key, tensor in inner.state_dict().items():
        if "lora_" in key:
            continue
        out[key.replace(".base_layer.", ".")] = tensor.detach()
    with torch.no_grad():
        for name, module in _lora_layers(model):
            if active not in module.lora_A:
                continue
            w = module.get_base_layer().weight
            out[f"{name}.weight"] = w.detach() + module.get_delta_weight(active).to(w.dtype)
    return out


def merged_model(model):
    """A plain transformers model with the adapters merged into its weights (``merge_and_unload``); the argument
    is consumed. A plain model is returned as it is."""
    if not is_lora_model(model):
        return model
    return model.merge_and_unload()
