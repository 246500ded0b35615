"""A tiny random Llama with xrpo's tiny tokenizer, saved for verl: the model of the two-step GPU smoke test.

    python examples/verl/make_tiny_model.py --out /tmp/xrpo-verl-smoke/model

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


def main(argv: list[str] | None = None) -> int:
    from xrpo.data import make_default_task, warmup_texts
    from xrpo.models.tiny import build_tiny_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for config.json, the weights and the tokenizer")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    train, _ = make_default_task(n_train=256, n_heldout=0, seed=args.seed)
    tokenizer = build_tiny_tokenizer(warmup_texts(train))
    model = build_tiny_llama(tokenizer, seed=args.seed)
    out = Path(args.out).expanduser()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"{out}: tiny Llama, {sum(p.numel() for p in model.parameters())} parameters, vocab {len(tokenizer)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
