"""Per-token log-probs of completions under a causal LM, in micro-batches bounded by a token budget."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Pack row indices into micro-batches with ``rows x longest row <= token_budget`` (a longer row goes alone).

    Rows are sorted by length (longest first) so that padding stays small; the packing depends only on the lengths,
    so it is deterministic.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        L = lengths[i]
        if cur and max(cur_max, L) * (len(cur) + 1) > token_budget:
            batches.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, L)
    if cur:
        batches.append(cur)
    return batches


def completion_logprobs(
    model,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    temperature: float = 1.0,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi_T(y_t | x, y_<t) for each completion token, pi_T = softmax(logits / temperature).

    Args:
        prompts: B prompt token-id lists (any lengths >= 1).
        completions: B completion token-id lists (lengths >= 1).
        temperature: > 0; the sampling temperature of the rollouts, so that the log-probs are those of the
            distribution the tokens were drawn from (verl divides the logits by it in the same place).
        chunk_tokens: None: the model's own forward, which materialises the logits of every position (B x L x V).
            An int: the decoder's final hidden states only, then the output projection, log-softmax and gather over
            ``chunk_tokens`` completion tokens at a time, each chunk recomputed in the backward pass
            (`torch.utils.checkpoint`), so that at most one chunk's logits exist at once (`chunked_token_logprobs`).
    Returns:
        logprobs (B, T) float32 and mask (B, T) float32, T = longest completion; rows are right-padded, so position
        ids are the default 0..L-1 and no left-padding correction is needed.
    """
    B = len(prompts)
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if B != len(completions):
        raise ValueError(f"{B} prompts but {len(completions)} completions")
    device = next(model.parameters()).device
    rows = [list(p) + list(c) for p, c in zip(prompts, completions)]
    L = max(len(r) for r in rows)
    T = max(len(c) for c in completions)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r, dtype=torch.long)
        attn[b, : len(r)] = 1
    # the logit at position (len(prompt) - 1 + t) predicts completion token t
    start = torch.tensor([len(p) - 1 for p in prompts])
    t = torch.arange(T)
    pos = (start[:, None] + t[None, :]).clamp(max=L - 1)  # (B, T)
    mask = (t[None, :] < torch.tensor([len(c) for c in completions])[:, None]).float()  # (B, T)
    targets = torch.zeros((B, T), dtype=torch.long)
    for b, c in enumerate(completions):
        targets[b, : len(c)] = torch.tensor(list(c), dtype=torch.long)
    ids, attn, pos, targets, mask = (x.to(device) for x in (ids, attn, pos, targets, mask))
    if chunk_tokens is not None:
        lm = unwrap_causal_lm(model)
        check_plain_head(lm)
        # use_cache=False: a training forward must not build a KV cache (memory the backward pass never reads)
        hidden = lm.get_decoder()(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state  # (B, L, H)
        h = hidden.gather(1, pos[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, T, H)
        lp = chunked_token_logprobs(h, lm.get_output_embeddings(), targets, mask, temperature, chunk_tokens)
        return lp, mask
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits  # (B, L, V)
    sel = logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1])).float()  # (B, T, V)
    if temperature != 1.0:
        sel = sel / temperature
    # log-softmax only at completion positions: memory B*T*V instead of B*L*V
    lp = torch.log_softmax(sel, dim=-1).gather(-1, targets[..., None]).squeeze(-1)  # (B, T)
    return lp * mask, mask


@torch.no_grad()
def all_completion_logprobs(
    model,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    token_budget: int,
    temperature: float = 1.0,
    chunk_tokens: int | None = None,
) -> list[list[float]]:
    """`completion_logprobs` for many rows, micro-batched, returned as one list of floats per row (input order)."""
    out: list[list[float]] = [[] for _ in prompts]
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions)]
    for mb in micro_batches(lengths, token_budget):
        lp, _ = completion_logprobs(
            model, [prompts[i] for i in mb], [completions[i] for i in mb], pad_id, temperature, chunk_tokens
        )
        for j, i in enumerate(mb):
            out[i] = lp[j, : len(completions[i])].tolist()
    return out


def unwrap_causal_lm(model):
    """The transformers causal LM inside ``model`` (a `peft.PeftModel` holds it as its base model, adapters
    injected), whose ``get_decoder()`` and ``get_output_embeddings()`` the chunked path calls."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


# config attributes of architectures whose logits are not lm_head(hidden): the chunked path would be wrong for them
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def check_plain_head(lm) -> None:
    """Refuse architectures whose logits are not ``lm_head(final hidden state)`` (soft-capping, logit scales): the
    chunked path computes exactly that and would silently differ from the model's own forward."""
    cfg = getattr(lm, "config", None)
    for name in _LOGIT_TRANSFORMS:
        v = getattr(cfg, name, None)
        if v is not None and v != 1 and v != 1.0:
            raise ValueError(
                f"optim.logprob_chunk_tokens: {type(lm).__name__} transforms its logits ({name}={v}), which the "
                f"chunked log-probs do not reproduce; set optim.logprob_chunk_tokens=null for this model"
            )
    if lm.get_output_embeddings() is None or not hasattr(lm, "get_decoder"):
        raise ValueError(
            f"optim.logprob_chunk_tokens: {type(lm).__name__} has no output embedding / decoder to split the "
            f"forward at; set optim.logprob_chunk_tokens=null for this model"
        )


def _chunk_logprobs(h: torch.Tensor, weight: torch.Tensor, bias, targets: torch.Tensor, temperature: float):
    logits = torch.nn.functional.linear(h, weight, bias).float()  # (n, V)
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)  # (n,)


def chunked_token_logprobs(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    targets: torch.Tensor,
    mask: torch.Tensor,
    temperature: float,
    chunk_tokens: int,
) -> torch.Tensor:
    """log softmax(head(h) / T)[y] for the valid (mask = 1) positions, ``chunk_tokens`` rows of the output projection
    at a time.

    Args:
        hidden: (B, T, H) final hidden states at the positions predicting each completion token.
        head: the output projection (a Linear: weight (V, H), optional bias).
        targets, mask: (B, T) token ids and validity.
    Returns:
        (B, T) float32 log-probs, 0 where mask = 0.

    Each chunk runs under `torch.utils.checkpoint` (non-reentrant): its (chunk x V) logits are freed after the
    forward and recomputed in the backward pass, so peak memory holds one chunk's logits instead of every token's.
    The arithmetic per token is the unchunked path's (same matmul row, same float32 log-softmax), so values agree
    with it to float rounding of the matmul's blocking."""
    from torch.utils.checkpoint import checkpoint

    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(f"chunk_tokens: expected an int >= 1, got {chunk_tokens!r}")
    B, T, H = hidden.shape
    flat = mask.reshape(-1) > 0
    h = hidden.reshape(B * T, H)[flat]  # (N, H) valid positions only: padding costs no logits
    y = targets.reshape(-1)[flat]
    weight, bias = head.weight, getattr(head, "bias", None)
    parts = []
    for s in range(0, h.shape[0], chunk_tokens):
        hs, ys = h[s : s + chunk_tokens], y[s : s + chunk_tokens]
        if torch.is_grad_enabled() and (hs.requires_grad or weight.requires_grad):
            parts.append(checkpoint(_chunk_logprobs, hs, weight, bias, ys, temperature, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(hs, weight, bias, ys, temperature))
    out = torch.zeros(B * T, dtype=torch.float32, device=hidden.device)
    if parts:
        out = out.masked_scatter(flat, torch.cat(parts))
    return out.reshape(B, T)
