"""How much memory a training config needs, estimated before the first step (printed at start) so that a user learns
it from a line of the log rather than from an out-of-memory error.

The estimate is arithmetic over the model's shape and the config; it is an upper-bound-minded model, not a trace:
    weights        every parameter in its dtype (LoRA: the frozen base in model.dtype + float32 adapters)
    gradients      the trained parameters, in their dtype
    optimizer      AdamW's two moments per trained parameter, in its dtype
    reference      a second copy of the weights for the KL term (none with LoRA: adapters disabled instead)
    autocast       mixed precision: autocast's bfloat16 copies of the weights, alive during a forward/backward
    activations    what autograd keeps of one micro-batch (`largest_micro_batch`: as many of the step's rows as
                   optim.micro_batch_tokens holds, each as long as the longest prompt plus max_new_tokens) through
                   the decoder: every layer's saved tensors, or with gradient checkpointing each layer's input plus
                   one layer's saved tensors during its recomputation
    logits         the output projection's share: every position's logits and the float32 log-softmax of the
                   completion positions (plus their gradients), or one chunk's with optim.logprob_chunk_tokens
    vllm           vLLM's share (GPU: rollout.vllm_gpu_memory_utilization of the device; CPU: its KV cache and a copy
                   of the weights)
Per-token saved-tensor counts follow the Llama / Qwen2 decoder layer (RMSNorm, rotary attention through SDPA, SwiGLU
MLP); `benchmarks/bench_memory.py` measures the peak against this estimate (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MemoryEstimate", "estimate_memory", "format_estimate", "largest_micro_batch", "logits_bytes", "model_shape"]

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 1024**3


@dataclass
class ModelShape:
    """What the estimate needs of a decoder-only transformer."""

    n_params: int
    hidden: int
    intermediate: int
    layers: int
    vocab: int
    q_dim: int
    """num_attention_heads x head_dim."""
    kv_dim: int
    """num_key_value_heads x head_dim."""
    lora_params: int = 0
    """Adapter parameters (trained) when LoRA is on; n_params counts the base model only."""


def model_shape(model) -> ModelShape:
    """The shape of a loaded transformers causal LM (a `peft.PeftModel` too: base and adapters counted apart)."""
    cfg = model.config
    base = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    adapters = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    return ModelShape(
        n_params=base,
        hidden=cfg.hidden_size,
        intermediate=getattr(cfg, "intermediate_size", 4 * cfg.hidden_size),
        layers=cfg.num_hidden_layers,
        vocab=cfg.vocab_size,
        q_dim=heads * head_dim,
        kv_dim=kv_heads * head_dim,
        lora_params=adapters,
    )


@dataclass
class MemoryEstimate:
    weights: int
    gradients: int
    optimizer: int
    reference: int
    autocast: int
    activations: int
    logits: int
    vllm: int

    @property
    def static(self) -> int:
        """Held for the whole run: weights, gradients, optimiser state, reference."""
        return self.weights + self.gradients + self.optimizer + self.reference

    @property
    def training_peak(self) -> int:
        """The trainer's peak during an update (static + one micro-batch's forward/backward), vLLM excluded."""
        return self.static + self.autocast + self.activations + self.logits

    @property
    def total(self) -> int:
        return self.training_peak + self.vllm


def layer_saved_bytes_per_token(s: ModelShape, c: int) -> int:
    """Bytes autograd saves per token in one decoder layer computing in ``c``-byte floats.

    Counted from the Llama / Qwen2 layer: two RMSNorms (each keeps its input upcast to float32 and its normalised
    output: h*4 + h*c), the q/k/v projections' shared input (counted in the norm's output), rotary q and k (q + kv),
    SDPA's q, k, v, output and log-sum-exp (q + 2 kv + q, the row statistics negligible), o_proj's input (q), and
    SwiGLU: gate and up outputs, SiLU's output and the product's input (4 i), down_proj's input (i).
    """
    norms = 2 * (s.hidden * 4 + s.hidden * c)
    attn = (s.q_dim + s.kv_dim) * c + (2 * s.q_dim + 2 * s.kv_dim) * c + s.q_dim * c
    mlp = 5 * s.intermediate * c
    return norms + attn + mlp


def largest_micro_batch(token_budget: int, rows: int, prompt_tokens: int, completion_tokens: int) -> tuple[int, int]:
    """(tokens, completion tokens) of the largest micro-batch an update makes, what `estimate_memory` takes: rows of at
    most ``prompt_tokens + completion_tokens`` (a micro-batch pads to its longest row), as many as ``token_budget``
    holds (at least one: a longer row goes alone, `xrpo.trainer.logprobs.micro_batches`) and no more than the
    ``rows`` a mini-batch has. A budget larger than the step's rollouts need is not filled: bounding by it alone put
    SmolLM2-135M's 24-rollout update at 8,192 tokens of 256-token prompts, 2.5 times its size."""
    row = prompt_tokens + completion_tokens
    n = max(1, min(rows, token_budget // row))
    return n * row, n * completion_tokens


def estimate_memory(
    s: ModelShape,
    *,
    dtype: str,
    param_dtype: str,
    lora: bool,
    kl: bool,
    micro_batch_tokens: int,
    completion_tokens: int,
    gradient_checkpointing: bool,
    logprob_chunk_tokens: int | None,
    vllm_bytes: int = 0,
) -> MemoryEstimate:
    """Bytes per component (see the module docstring).

    Args:
        dtype: the compute dtype (model.dtype); param_dtype: the dtype parameters are held in.
        micro_batch_tokens: tokens (padded rows x length) of one forward/backward micro-batch.
        completion_tokens: of those, the completion positions whose logits go through log-softmax (at most
            micro_batch_tokens; rows x rollout.max_new_tokens for a full micro-batch).
        vllm_bytes: what the vLLM engine takes (0 for the hf engine, which samples with the training model).
    """
    c, p = DTYPE_BYTES[dtype], DTYPE_BYTES[param_dtype]
    trained = s.lora_params if lora else s.n_params
    trained_bytes = 4 if lora else p  # peft keeps adapters in float32
    weights = s.n_params * p + (s.lora_params * 4 if lora else 0)
    gradients = trained * trained_bytes
    optimizer = 2 * trained * trained_bytes
    reference = s.n_params * p if (kl and not lora) else 0
    autocast = s.n_params * c if c < p else 0
    tokens = micro_batch_tokens
    per_layer = layer_saved_bytes_per_token(s, c)
    if gradient_checkpointing:
        activations = tokens * (s.layers * s.hidden * c + per_layer)
    else:
        activations = tokens * s.layers * per_layer
    forward, backward = logits_bytes(s, c, tokens, min(completion_tokens, tokens), logprob_chunk_tokens)
    return MemoryEstimate(
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        reference=reference,
        autocast=autocast,
        activations=activations,
        logits=forward + backward,
        vllm=vllm_bytes,
    )


def logits_bytes(s: ModelShape, c: int, tokens: int, comp: int, chunk_tokens: int | None) -> tuple[int, int]:
    """The output projection's share of a micro-batch of ``tokens`` positions, ``comp`` of them completions, computing
    in ``c``-byte floats, as `xrpo.trainer.logprobs.completion_logprobs` computes them: (the forward's, the
    backward's). Upper-bound-minded: the float32 upcast is counted also where it is no copy (float32 compute), which
    stands for the log-softmax backward's temporaries of that size."""
    if chunk_tokens is None:
        # every position's logits (compute dtype), the completion positions' gathered copy, its float32 upcast and
        # log-softmax output; the backward holds gradients of the same sizes
        return tokens * s.vocab * c + comp * s.vocab * (c + 4 + 4), tokens * s.vocab * c + comp * s.vocab * 4
    # one chunk: its logits (compute dtype), float32 copy and log-softmax output, and their gradients in the
    # backward's recomputation; the final hidden states of the micro-batch
    chunk = min(chunk_tokens, comp)
    return chunk * s.vocab * (c + 4 + 4) + tokens * s.hidden * c, chunk * s.vocab * (c + 4 + 4)


def format_estimate(e: MemoryEstimate, *, device_bytes: int | None = None) -> str:
    """One line per component and the total, in GiB (with the device's capacity when known)."""

    def g(x: int) -> str:
        return f"{x / GIB:.2f}"

    lines = [
        f"memory estimate (GiB): weights {g(e.weights)}, gradients {g(e.gradients)}, optimizer {g(e.optimizer)}, "
        f"reference {g(e.reference)}, autocast copies {g(e.autocast)}",
        f"  per micro-batch: activations {g(e.activations)}, logits {g(e.logits)}; vLLM {g(e.vllm)}",
        f"  training peak {g(e.training_peak)}, total {g(e.total)}"
        + (f" of {g(device_bytes)} on the device" if device_bytes else ""),
    ]
    if device_bytes and e.total > device_bytes:
        lines.append(
            "  the estimate exceeds the device: consider model.gradient_checkpointing, optim.logprob_chunk_tokens, "
            "a smaller optim.micro_batch_tokens, model.lora_rank or a lower rollout.vllm_gpu_memory_utilization"
        )
    return "\n".join(lines)
