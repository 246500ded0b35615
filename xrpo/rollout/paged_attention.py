"""Attention over a packed batch of requests without a batch-wide mask: the `HFCBEngine`'s attention for models that
run on sdpa.

transformers' continuous batching packs a step's requests into one sequence (each request's new tokens, and each
request's cached keys read back from the paged cache). Its sdpa path (`paged|sdpa`) then attends every query to every
key of the step under a block-diagonal mask: the work grows with (the batch's queries) x (the batch's cached tokens),
and the mask it keeps for that is `max_batch_tokens` x (cache tokens + `max_batch_tokens`) floats, allocated and
filled at start (1.4 GB for the trainer's default engine). Its flash-attention path instead attends each request to
its own keys (`flash_attn_varlen_func`), which CPUs and GPUs without flash-attn do not have.

`varlen_attention` is that varlen attention in plain torch: each request's queries and keys are gathered into a
padded (requests, longest, heads, dim) batch and attend under a per-request causal mask aligned to the end (query i
of a request with q queries and k keys sees keys up to k - q + i, as flash's `causal=True` does), within a sliding
window when the layer has one. Work: requests x longest query x longest key sequence. `paged_sdpa_forward` is the
attention function transformers calls (registered as `paged|xrpo_sdpa` by `register`); without "sdpa" or "eager"
in its name transformers allocates no mask for it.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["ATTENTION", "begin_step", "register", "varlen_attention", "paged_sdpa_forward"]

ATTENTION = "paged|xrpo_sdpa"
"""The name `HFCBEngine` gives this attention (transformers' `AttentionInterface`)."""


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_q: list[int],
    cu_k: list[int],
    *,
    scaling: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention of each request's queries to its own keys, the requests packed one after the other.

    Args:
        query: (total_q, heads, dim), request b's queries at rows cu_q[b]:cu_q[b + 1].
        key, value: (total_k, kv_heads, dim), request b's keys at rows cu_k[b]:cu_k[b + 1] (its cached keys, then
            those of its queries); heads a multiple of kv_heads (grouped-query attention).
        cu_q, cu_k: cumulative lengths, len = requests + 1, starting at 0; a request has at least one query and at
            least as many keys as queries.
        scaling: the softmax scale (None: 1 / sqrt(dim)).
        window: a sliding window: query i attends to the ``window`` keys ending at its own position (None: all).

    Returns:
        (total_q, heads, dim).
    """
    q_rows, k_rows, q_valid, allowed = _layout(tuple(cu_q), tuple(cu_k), window, query.device)
    q = query[q_rows].transpose(1, 2)  # (B, heads, Q, dim)
    k, v = key[k_rows].transpose(1, 2), value[k_rows].transpose(1, 2)  # (B, kv_heads, K, dim)
    if q.shape[1] != k.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scaling)
    return out.transpose(1, 2)[q_valid]  # back to the packed order: (total_q, heads, dim)


@functools.lru_cache(maxsize=4)
def _layout(cu_q: tuple[int, ...], cu_k: tuple[int, ...], window: int | None, device: torch.device):
    """The padded layout of a step's requests (the same for every layer of a step: cached): the packed rows of each
    request's queries and keys, (B, Q) and (B, K) (padding: row 0), which query slots are real, and the mask
    (B, 1, Q, K) of the keys each query attends to."""
    lq_list = [b - a for a, b in zip(cu_q, cu_q[1:])]
    lk_list = [b - a for a, b in zip(cu_k, cu_k[1:])]
    lq = torch.tensor(lq_list, device=device)[:, None]  # (B, 1)
    lk = torch.tensor(lk_list, device=device)[:, None]
    i = torch.arange(max(lq_list), device=device)  # query offset within its request
    j = torch.arange(max(lk_list), device=device)  # key offset within its request
    q_valid, k_valid = i < lq, j < lk  # (B, Q), (B, K)
    q_rows = torch.where(q_valid, torch.tensor(cu_q[:-1], device=device)[:, None] + i, 0)
    k_rows = torch.where(k_valid, torch.tensor(cu_k[:-1], device=device)[:, None] + j, 0)
    at = (lk - lq)[:, :, None] + i[None, :, None]  # (B, Q, 1): the key position of query i
    allowed = k_valid[:, None, :] & (j <= at)
    if window is not None:
        allowed = allowed & (j > at - window)
    allowed = allowed | (~q_valid[:, :, None] & (j == 0))  # padding queries see one key: no NaN rows
    return q_rows, k_rows, q_valid, allowed[:, None]


_LENGTHS: dict = {}  # this step's cumulative lengths as lists, by tensor (`begin_step` clears it)


def begin_step() -> None:
    """Forget the last step's lengths: the engine calls this before each step's forward pass."""
    _LENGTHS.clear()


def _as_list(cu: torch.Tensor, n: int) -> list[int]:
    """``cu[:n]`` as a list, read from the device once per step (the same for every layer of the step)."""
    key = (cu.data_ptr(), n)
    got = _LENGTHS.get(key)
    if got is None:
        got = _LENGTHS[key] = cu[:n].tolist()
    return got


def paged_sdpa_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention-function signature, called by each attention layer inside a continuous-batching step:
    ``query`` (1, heads, total_q, dim) and ``key`` / ``value`` (1, kv_heads, total_q, dim) of the step's new tokens,
    ``kwargs`` the step's paged-cache arguments (``cache``, ``read_index``, ``write_index``, ``cu_seq_lens_q``,
    ``cu_seq_lens_k``, a dict by layer type when the model has several) and the layer's ``sliding_window``. The new
    keys go into the cache, the requests' keys come back packed, and `varlen_attention` does the rest; returns
    ((1, total_q, heads, dim), None)."""
    key, value = kwargs["cache"].update(
        key_states=key,
        value_states=value,
        layer_idx=module.layer_idx,
        read_index=kwargs["read_index"],
        write_index=kwargs["write_index"],
    )
    # models pass their window with the call (Mistral, Qwen2, Gemma 2); some keep it on the module
    window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None) or None
    cu_k = kwargs["cu_seq_lens_k"]
    if isinstance(cu_k, dict):
        cu_k = cu_k["sliding_attention" if window and "sliding_attention" in cu_k else "full_attention"]
    cu_q = _as_list(kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_q"].shape[0])
    out = varlen_attention(
        query[0].transpose(0, 1), key, value, cu_q, _as_list(cu_k, len(cu_q)), scaling=scaling, window=window
    )
    return out.unsqueeze(0), None


def register() -> None:
    """Make `ATTENTION` a name transformers' models accept (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, paged_sdpa_forward)
