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
) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi_T(y_t | x, y_<t) for each completion token, pi_T = softmax(logits / temperature).

    Args:
        prompts: B prompt token-id lists (any lengths >= 1).
        completions: B completion token-id lists (lengths >= 1).
        temperature: > 0; the sampling temperature of the rollouts, so that the log-probs are those of the
            distribution the tokens were drawn from (verl divides the logits by it in the same place).
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
    logits = model(input_ids=ids, attention_mask=attn).logits  # (B, L, V)
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
) -> list[list[float]]:
    """`completion_logprobs` for many rows, micro-batched, returned as one list of floats per row (input order)."""
    out: list[list[float]] = [[] for _ in prompts]
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions)]
    for mb in micro_batches(lengths, token_budget):
        lp, _ = completion_logprobs(model, [prompts[i] for i in mb], [completions[i] for i in mb], pad_id, temperature)
        for j, i in enumerate(mb):
            out[i] = lp[j, : len(completions[i])].tolist()
    return out
