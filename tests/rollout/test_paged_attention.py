"""xrpo.rollout.paged_attention: the padded varlen attention against a per-request loop (its slow twin), over random
packed batches, grouped-query heads and sliding windows; its use by the continuous-batching engine."""

from __future__ import annotations

import math

import pytest
import torch

from xrpo.rollout.paged_attention import ATTENTION, varlen_attention


def slow_varlen(query, key, value, cu_q, cu_k, scaling, window):
    """Each request alone, each query alone: softmax over the keys it may see (the last len(q) keys are its
    requests' own tokens, query i being key k - q + i)."""
    heads, kv_heads = query.shape[1], key.shape[1]
    out = torch.empty_like(query)
    for b in range(len(cu_q) - 1):
        q = query[cu_q[b] : cu_q[b + 1]]
        k, v = key[cu_k[b] : cu_k[b + 1]], value[cu_k[b] : cu_k[b + 1]]
        for i in range(len(q)):
            at = len(k) - len(q) + i
            lo = 0 if window is None else max(0, at - window + 1)
            for h in range(heads):
                g = h // (heads // kv_heads)
                scores = [float(q[i, h] @ k[j, g]) * scaling for j in range(lo, at + 1)]
                top = max(scores)
                w = [math.exp(s - top) for s in scores]
                out[cu_q[b] + i, h] = sum(wj * v[lo + n, g] for n, wj in enumerate(w)) / sum(w)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_equals_each_request_attended_alone(seed):
    g = torch.Generator().manual_seed(seed)
    requests = int(torch.randint(1, 6, (1,), generator=g))
    lq = torch.randint(1, 6, (requests,), generator=g).tolist()  # decode (1) and prefill chunks (> 1)
    past = torch.randint(0, 8, (requests,), generator=g).tolist()
    lk = [q + p for q, p in zip(lq, past)]
    kv_heads, group = [(1, 2), (2, 1), (2, 2)][seed % 3]
    dim = 8
    window = None if seed % 2 else 3
    cu_q = [0, *torch.tensor(lq).cumsum(0).tolist()]
    cu_k = [0, *torch.tensor(lk).cumsum(0).tolist()]
    query = torch.randn(cu_q[-1], kv_heads * group, dim, generator=g, dtype=torch.float64)
    key = torch.randn(cu_k[-1], kv_heads, dim, generator=g, dtype=torch.float64)
    value = torch.randn(cu_k[-1], kv_heads, dim, generator=g, dtype=torch.float64)
    scaling = dim**-0.5
    got = varlen_attention(query, key, value, cu_q, cu_k, scaling=scaling, window=window)
    expected = slow_varlen(query, key, value, cu_q, cu_k, scaling, window)
    # float64 both: softmax-weighted sums of at most 12 terms in another order, within 12 * 2**-53 * sum|w v| =
    # 1.3e-15 * max|v| (the weights sum to 1; standard normal values stay below 10 here), plus an ulp or two of
    # each exp: below 1e-13
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-13)


def test_the_engine_attends_through_it_on_sdpa_and_leaves_eager_to_transformers(tiny_tokenizer, tiny_model):
    import copy

    from xrpo.rollout.engine import SamplingParams
    from xrpo.rollout.hf_cb_engine import HFCBEngine

    from .test_hf_engine import PROMPTS, reference_logprobs

    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=1)
    on_sdpa = HFCBEngine(tiny_model, tiny_tokenizer, max_batch_size=8, max_seq_len=64)
    eager = copy.deepcopy(tiny_model)
    eager.set_attn_implementation("eager")
    on_eager = HFCBEngine(eager, tiny_tokenizer, max_batch_size=8, max_seq_len=64)
    assert (on_sdpa.attention, on_eager.attention) == (ATTENTION, "paged|eager")
    assert tiny_model.config._attn_implementation == "sdpa" and eager.config._attn_implementation == "eager"
    a = on_sdpa.generate(PROMPTS, [2, 1, 2, 1], params)
    b = on_eager.generate(PROMPTS, [2, 1, 2, 1], params)
    for rs_a, rs_b in zip(a, b):
        for ra, rb in zip(rs_a, rs_b):
            # the same keys draw the same tokens when the two attentions agree to float rounding; both match a plain
            # forward pass within the engine envelope (tests/rollout/test_hf_cb_engine.py)
            assert ra.completion_ids == rb.completion_ids
            torch.testing.assert_close(torch.tensor(ra.logprobs), reference_logprobs(tiny_model, ra), rtol=0, atol=1e-5)
