"""Sampling with a key per row: what a row draws depends on its key, its position and its logits only, never on the
other rows of the batch.

Why: a continuous-batching engine (`xrpo.rollout.hf_cb_engine`) decodes every running request in one batch whose
members change from step to step. transformers draws the whole batch with one ``torch.multinomial`` from one
generator, so a rollout's tokens would depend on which requests happened to share its steps, and a seeded call could
not give a request the tokens another call gives it. torch has no vectorised draw with a generator per row, so the
uniforms come from a counter-based hash instead: ``u(key, position, token)``, a pure function of three integers
(murmur3's 32-bit finaliser, ``fmix32``, composed over them), the same on a CPU and on a GPU.

A draw is Gumbel-max: with G_v = -log(-log u_v), i.i.d. Gumbel(0, 1) when the u_v are i.i.d. uniform,
argmax_v (z_v / T + G_v) is distributed as softmax(z / T) (Gumbel 1954; the Gumbel-max trick of Maddison et al.
2014). Top-p first masks the tokens outside the nucleus as transformers' ``TopPLogitsWarper`` does, so that the draw
is from the renormalised nucleus. Precision: u takes 2**32 values, so a token's probability is honoured to about
2**-32; a key is 63 bits, a position 32.

`keyed_sample` also returns the log-prob of each drawn token under the raw logits (temperature 1, no top-p): the
quantity every engine returns (`xrpo.rollout.engine`).
"""

from __future__ import annotations

import random

import torch

__all__ = ["KEY_BITS", "request_key", "uniforms", "keyed_sample"]

KEY_BITS = 63
"""Bits of a key (a non-negative int64)."""

_M32 = 0xFFFFFFFF


def request_key(seed: int, index: int, child: int) -> int:
    """The key of rollout ``child`` of the prompt at position ``index`` of a call seeded with ``seed``: distinct,
    well-spread keys for every (seed, index, child), the same in every process (a string seed is hashed with SHA-512 by
    `random.Random`, not with Python's salted ``hash``)."""
    return random.Random(f"xrpo-keyed:{seed}:{index}:{child}").getrandbits(KEY_BITS)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 tensors of values in [0, 2**32), without leaving int64's range: c in 16-bit halves,
    each product below 2**48."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser (a bijection of [0, 2**32) with full avalanche), on int64 tensors."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def uniforms(key: torch.Tensor, position: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniforms in (0, 1), float64 (R, vocab_size): row r's are a function of (key[r], position[r]) only.

    Args:
        key: int64 (R,), keys in [0, 2**63).
        position: int64 (R,), the row's position (tokens generated before it) in [0, 2**32).
        vocab_size: V.
    """
    key = key.to(torch.int64)
    position = position.to(torch.int64) & _M32
    # two 32-bit row values from the key's halves, each mixed with the position
    r0 = _fmix32((key & _M32) ^ _fmix32(position ^ 0x9E3779B9))
    r1 = _fmix32(((key >> 32) & _M32) ^ _fmix32((position + 0x7F4A7C15) & _M32))
    v = _fmix32(torch.arange(vocab_size, dtype=torch.int64, device=key.device) ^ 0x27D4EB2F)
    h = _fmix32(r0[:, None] ^ _fmix32(r1[:, None] ^ v[None, :]))  # (R, V) in [0, 2**32)
    return (h.to(torch.float64) + 0.5) * 2.0**-32


def _top_p_mask(scaled: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """True where a token lies outside row r's nucleus: transformers' `TopPLogitsWarper` rule (tokens sorted by
    ascending probability are removed while the cumulative probability is <= 1 - top_p; the most likely token always
    stays), with one top_p per row (rows with top_p = 1 keep every token)."""
    sorted_logits, sorted_idx = torch.sort(scaled, dim=-1, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = (cumulative <= (1 - top_p)[:, None]) & (top_p < 1)[:, None]
    remove[:, -1] = False
    return remove.scatter(-1, sorted_idx, remove)


def keyed_sample(
    logits: torch.Tensor,
    key: torch.Tensor,
    position: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from softmax(logits / temperature) restricted to its top-p nucleus, with row r's noise
    from (key[r], position[r]) (`uniforms`); temperature 0 is greedy (argmax of the logits).

    Args:
        logits: (R, V) raw next-token logits.
        key, position: int64 (R,) (`uniforms`).
        temperature: (R,) >= 0.
        top_p: (R,) in (0, 1].

    Returns:
        tokens int64 (R,), and float32 (R,) log softmax(logits)[token]: the raw (temperature-1) log-prob.
    """
    logits = logits.float()
    temperature = temperature.to(logits.device, torch.float32)
    greedy = temperature <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    top_p = top_p.to(logits.device, torch.float32)
    if bool((top_p < 1).any()):
        scaled = scaled.masked_fill(_top_p_mask(scaled, top_p), float("-inf"))
    gumbel = -torch.log(-torch.log(uniforms(key, position, logits.shape[-1])))
    noised = torch.where(greedy[:, None], logits.double(), scaled.double() + gumbel)
    # a diverged policy (NaN logits) still yields token ids; its log-probs stay NaN for the caller to see
    tokens = torch.nan_to_num(noised, nan=float("-inf")).argmax(dim=-1)
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    return tokens, logprobs
