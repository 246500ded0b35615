"""A tiny random Llama with xrpo's tiny tokenizer, saved for verl: the model of the two-step GPU smoke test.

    python examples/verl/make_tiny_model.py --out /tmp/xrpo-verl-smoke/model
    python examples/verl/make_tiny_model.py --from-default --out /tmp/xrpo-verl-cpu/model   # the built-in model

``--from-default`` saves the built-in model (xrpo's tiny Qwen2, warm-started on the built-in task, so it solves some
of it) as the same function in Llama's layout: Qwen2 is Llama with q/k/v biases, which Llama's ``attention_bias``
gives together with an o_proj bias, set to 0 here; the logits are checked equal before saving.

Offline (no download). A Llama rather than xrpo's tiny Qwen2: verl's agent loop picks its tokenisation protocol from
``config.json``'s ``model_type``, and its Qwen protocol needs Qwen's special tokens (``<|im_end|>``), which the tiny
tokenizer does not have; for ``llama`` verl uses its generic protocol. Head size 64, which vLLM's attention kernels
support. It learns nothing useful in two steps: the smoke test checks that the pipeline runs, not that it trains well.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_tiny_llama(tokenizer, *, seed: int = 0):
    """A randomly initialised LlamaForCausalLM sized for ``tokenizer`` (2 layers, d_model 128, 2 heads of 64)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=256,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(seed)
        return LlamaForCausalLM(cfg).eval()


def default_model_as_llama(warmup_steps: int = 280, max_positions: int = 1024):
    """The built-in model (`xrpo.models.loading.resolve_model_dir("default")`) as a LlamaForCausalLM computing the
    same logits, and its tokenizer. It declares ``max_positions`` of context: the paper's ICL template alone takes
    300-400 tokens of the tiny tokenizer, beyond the built-in model's 256. RoPE has no position table, so the
    weights are unchanged; the model was trained on at most 256 positions and does what it does beyond them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from xrpo.models.loading import resolve_model_dir

    src = resolve_model_dir("default", warmup_steps=warmup_steps)
    qwen = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    c = qwen.config
    if getattr(c, "use_sliding_window", False):
        raise ValueError(f"{src}: a sliding-window Qwen2 has no Llama equivalent")
    cfg = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        intermediate_size=c.intermediate_size,
        hidden_act=c.hidden_act,
        max_position_embeddings=max(max_positions, c.max_position_embeddings),
        rms_norm_eps=c.rms_norm_eps,
        rope_parameters=c.rope_parameters,
        tie_word_embeddings=c.tie_word_embeddings,
        attention_bias=True,
        pad_token_id=c.pad_token_id,
        eos_token_id=c.eos_token_id,
        bos_token_id=c.bos_token_id,
    )
    llama = LlamaForCausalLM(cfg).eval()
    missing, unexpected = llama.load_state_dict(qwen.state_dict(), strict=False)
    if unexpected or any(not k.endswith("self_attn.o_proj.bias") for k in missing):
        raise ValueError(f"{src}: not a Llama-shaped Qwen2 (missing {missing}, unexpected {unexpected})")
    with torch.no_grad():
        for layer in llama.model.layers:
            layer.self_attn.o_proj.bias.zero_()
        ids = torch.arange(1, min(c.vocab_size, 64)).unsqueeze(0)
        torch.testing.assert_close(llama(ids).logits, qwen(ids).logits)
    return llama, AutoTokenizer.from_pretrained(src)


def main(argv: list[str] | None = None) -> int:
    from xrpo.data import make_default_task, warmup_texts
    from xrpo.models.tiny import build_tiny_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for config.json, the weights and the tokenizer")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--from-default", action="store_true", help="the built-in (warm-started) model, as a Llama")
    args = ap.parse_args(argv)
    out = Path(args.out).expanduser()
    if args.from_default:
        model, tokenizer = default_model_as_llama()
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        print(f"{out}: the built-in model as a Llama, {sum(p.numel() for p in model.parameters())} parameters")
        return 0
    train, _ = make_default_task(n_train=256, n_heldout=0, seed=args.seed)
    tokenizer = build_tiny_tokenizer(warmup_texts(train))
    model = build_tiny_llama(tokenizer, seed=args.seed)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"{out}: tiny Llama, {sum(p.numel() for p in model.parameters())} parameters, vocab {len(tokenizer)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
