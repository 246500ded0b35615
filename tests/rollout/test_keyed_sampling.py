"""xrpo.rollout.keyed_sampling: the hash against a plain-Python twin, uniforms that look uniform and independent, and
draws distributed as softmax(z / T) on the top-p nucleus, whatever else is in the batch."""

from __future__ import annotations

import math

import pytest
import torch

from xrpo.rollout.keyed_sampling import KEY_BITS, keyed_sample, request_key, uniforms

M32 = 0xFFFFFFFF


def fmix32_slow(x: int) -> int:
    """murmur3's finaliser on Python ints (the reference twin of the tensor version)."""
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & M32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & M32
    return x ^ (x >> 16)


def uniform_slow(key: int, position: int, token: int) -> float:
    r0 = fmix32_slow((key & M32) ^ fmix32_slow(position ^ 0x9E3779B9))
    r1 = fmix32_slow(((key >> 32) & M32) ^ fmix32_slow((position + 0x7F4A7C15) & M32))
    h = fmix32_slow(r0 ^ fmix32_slow(r1 ^ fmix32_slow(token ^ 0x27D4EB2F)))
    return (h + 0.5) * 2.0**-32


def test_uniforms_equal_the_plain_python_twin():
    g = torch.Generator().manual_seed(0)
    keys = [0, 1, 2**63 - 1, 2**32, *torch.randint(0, 2**62, (5,), generator=g).tolist()]
    positions = [0, 1, 2**32 - 1, 7, *torch.randint(0, 5000, (5,), generator=g).tolist()]
    u = uniforms(torch.tensor(keys), torch.tensor(positions), 37)
    assert u.dtype == torch.float64 and u.shape == (len(keys), 37)
    for r, (k, p) in enumerate(zip(keys, positions)):
        # the same arithmetic on exact integers: equal to the last bit
        assert u[r].tolist() == [uniform_slow(k, p, v) for v in range(37)]


def test_uniforms_are_uniform_and_rows_independent():
    n, v = 512, 256
    u = uniforms(torch.arange(n, dtype=torch.int64) * 7919, torch.arange(n) % 13, v)
    assert bool(((u > 0) & (u < 1)).all())
    flat = u.flatten()
    # 131,072 i.i.d. U(0,1): mean 1/2 with standard error sqrt(1/12 / N) = 8e-4; variance 1/12 with standard error
    # sqrt((1/80 - 1/144) / N) = 2.1e-4; bounds at 6 standard errors
    assert abs(flat.mean().item() - 0.5) < 6 * math.sqrt(1 / 12 / flat.numel())
    assert abs(flat.var().item() - 1 / 12) < 6 * math.sqrt((1 / 80 - 1 / 144) / flat.numel())
    # Kolmogorov-Smirnov distance to U(0,1): 1.95 / sqrt(N) is its 0.1% critical value
    s = flat.sort().values
    grid = torch.arange(1, s.numel() + 1, dtype=torch.float64) / s.numel()
    assert (s - grid).abs().max().item() < 1.95 / math.sqrt(s.numel())
    # neighbouring keys, and one key at neighbouring positions, are uncorrelated: the correlation of two
    # independent rows of V uniforms has standard error 1/sqrt(V)
    c = torch.corrcoef(u[:64])
    assert (c - torch.eye(64, dtype=torch.float64)).abs().max().item() < 5 / math.sqrt(v)
    same_key = uniforms(torch.full((64,), 12345), torch.arange(64), v)
    c = torch.corrcoef(same_key)
    assert (c - torch.eye(64, dtype=torch.float64)).abs().max().item() < 5 / math.sqrt(v)


def test_request_keys_are_stable_distinct_and_fit():
    keys = {request_key(s, i, j) for s in range(3) for i in range(20) for j in range(20)}
    assert len(keys) == 1200 and all(0 <= k < 2**KEY_BITS for k in keys)
    assert request_key(7, 3, 2) == 6872228880523361658  # the same in every process and run


def draw(logits_row, n, temperature=1.0, top_p=1.0, position=0):
    logits = logits_row.expand(n, -1).clone()
    keys = torch.tensor([request_key(0, 0, j) for j in range(n)])
    return keyed_sample(
        logits, keys, torch.full((n,), position), torch.full((n,), float(temperature)), torch.full((n,), float(top_p))
    )


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.6, 1.0), (1.3, 0.8)])
def test_draws_follow_softmax_at_the_temperature_on_the_nucleus(temperature, top_p):
    z = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    n = 20000
    tokens, logprobs = draw(z, n, temperature, top_p)
    p = torch.softmax(z.double() / temperature, -1)
    # the nucleus as transformers' TopPLogitsWarper keeps it: drop the least likely tokens while their cumulative
    # probability stays <= 1 - top_p
    order = p.argsort()
    keep = torch.ones_like(p, dtype=torch.bool)
    keep[order[p[order].cumsum(0) <= 1 - top_p]] = False
    q = torch.where(keep, p, 0) / p[keep].sum()
    counts = torch.bincount(tokens, minlength=len(z)).double()
    assert counts[~keep].sum() == 0
    # Pearson's chi-square over the kept tokens, k - 1 degrees of freedom: 30 is far beyond its 1e-4 quantile for
    # k <= 6 (18.5 at 4 degrees); the keys are fixed, so this passes or fails the same way every time
    expected = n * q[keep]
    chi2 = (((counts[keep] - expected) ** 2) / expected).sum().item()
    assert chi2 < 30, (chi2, counts.tolist(), expected.tolist())
    # the returned log-probs are the raw (temperature-1, untruncated) ones of the drawn token
    raw = torch.log_softmax(z, -1)
    assert torch.equal(logprobs, raw[tokens])


def test_greedy_rows_take_the_argmax_beside_sampled_rows():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 50, generator=g)
    temperature = torch.tensor([0.0, 1.0, 0.0, 0.7, 1.0, 0.0])
    tokens, _ = keyed_sample(
        logits, torch.arange(6) * 11, torch.zeros(6, dtype=torch.int64), temperature, torch.ones(6)
    )
    greedy = temperature == 0
    assert tokens[greedy].tolist() == logits[greedy].argmax(-1).tolist()
    assert tokens[~greedy].tolist() != logits[~greedy].argmax(-1).tolist()


def test_a_row_draws_the_same_token_alone_or_in_any_batch():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(9, 40, generator=g)
    keys = torch.tensor([request_key(5, i, 0) for i in range(9)])
    pos = torch.arange(9) * 3
    t, p = torch.full((9,), 0.9), torch.full((9,), 0.95)
    batch, lps = keyed_sample(logits, keys, pos, t, p)
    perm = torch.randperm(9, generator=g)
    shuffled, _ = keyed_sample(logits[perm], keys[perm], pos[perm], t[perm], p[perm])
    assert shuffled.tolist() == batch[perm].tolist()
    for r in range(9):
        alone, lp = keyed_sample(logits[r : r + 1], keys[r : r + 1], pos[r : r + 1], t[:1], p[:1])
        assert alone.item() == batch[r].item() and lp.item() == lps[r].item()
    # another key or another position draws afresh (not always the same token)
    other_key, _ = keyed_sample(logits, keys + 1, pos, t, p)
    other_pos, _ = keyed_sample(logits, keys, pos + 1, t, p)
    assert other_key.tolist() != batch.tolist() and other_pos.tolist() != batch.tolist()


def test_nan_logits_still_give_a_token_and_a_nan_logprob():
    logits = torch.tensor([[0.0, float("nan"), 1.0], [float("nan")] * 3])
    tokens, lps = keyed_sample(
        logits, torch.tensor([1, 2]), torch.zeros(2, dtype=torch.int64), torch.ones(2), torch.ones(2)
    )
    assert tokens.tolist()[0] in (0, 2) and 0 <= tokens[1].item() < 3
    assert torch.isnan(lps).all()
