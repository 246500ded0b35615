"""xrpo.trainer.logprobs: completion log-probs of a padded batch against one unpadded forward per row (the reference
twin), at a sampling temperature, and the micro-batch packing."""

from __future__ import annotations

import random

import pytest
import torch

from xrpo.trainer.logprobs import all_completion_logprobs, completion_logprobs, micro_batches


def reference_logprobs(model, prompt, completion, temperature):
    # one row, no padding: the logit at position len(prompt) - 1 + t predicts completion token t
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[len(prompt) - 1 + t, tok].item() for t, tok in enumerate(completion)]


def random_rows(seed, vocab, n=7):
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(1, 9))] for _ in range(n)]
    comps = [[rng.randrange(3, vocab) for _ in range(rng.randint(1, 6))] for _ in range(n)]
    return prompts, comps


@pytest.mark.parametrize("seed,temperature", [(0, 1.0), (1, 0.7), (2, 1.3)])
def test_padded_batch_equals_one_forward_per_row(tiny_model, tiny_tokenizer, seed, temperature):
    prompts, comps = random_rows(seed, tiny_model.config.vocab_size)
    pad = tiny_tokenizer.pad_token_id
    with torch.no_grad():
        lp, mask = completion_logprobs(tiny_model, prompts, comps, pad, temperature)
    assert lp.shape == mask.shape == (len(prompts), max(len(c) for c in comps))
    for b, (p, c) in enumerate(zip(prompts, comps)):
        assert mask[b].tolist() == [1.0] * len(c) + [0.0] * (lp.shape[1] - len(c))
        torch.testing.assert_close(lp[b, : len(c)], torch.tensor(reference_logprobs(tiny_model, p, c, temperature)))
        assert lp[b, len(c) :].abs().sum().item() == 0.0
    # micro-batched, in input order, equal to the one batch
    for budget in (1, 12, 40, 10_000):
        rows = all_completion_logprobs(tiny_model, prompts, comps, pad, budget, temperature)
        for b, c in enumerate(comps):
            torch.testing.assert_close(torch.tensor(rows[b]), lp[b, : len(c)])


def test_temperature_changes_the_log_probs(tiny_model, tiny_tokenizer):
    prompts, comps = random_rows(3, tiny_model.config.vocab_size, n=2)
    pad = tiny_tokenizer.pad_token_id
    with torch.no_grad():
        a, _ = completion_logprobs(tiny_model, prompts, comps, pad, 1.0)
        b, _ = completion_logprobs(tiny_model, prompts, comps, pad, 0.5)
    assert not torch.allclose(a, b)


def test_bad_arguments(tiny_model):
    with pytest.raises(ValueError, match="temperature must be > 0"):
        completion_logprobs(tiny_model, [[1]], [[2]], 0, 0.0)
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        completion_logprobs(tiny_model, [[1], [2]], [[2]], 0)
    with pytest.raises(ValueError, match="token_budget must be >= 1"):
        micro_batches([3], 0)


@pytest.mark.parametrize("seed", range(5))
def test_micro_batches_pack_every_row_once_within_the_budget(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 30) for _ in range(rng.randint(1, 40))]
    budget = rng.randint(1, 120)
    batches = micro_batches(lengths, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= budget
    assert batches == micro_batches(list(lengths), budget)  # deterministic
    # longest first: padding stays small
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat, reverse=True)


# ------------------------------------------------------------------------------------- log-probs by chunks
def grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def loss_and_grads(model, prompts, comps, pad, temperature, chunk):
    model.zero_grad(set_to_none=True)
    lp, mask = completion_logprobs(model, prompts, comps, pad, temperature, chunk)
    # a weighted sum, so that every token's log-prob carries a different gradient
    w = torch.linspace(0.5, 1.5, lp.numel()).reshape(lp.shape)
    (lp * w * mask).sum().backward()
    return lp.detach(), grads(model)


@pytest.mark.parametrize("which", ["tiny", "larger"])
@pytest.mark.parametrize("chunk,temperature", [(1, 1.0), (7, 0.7), (10_000, 1.3)])
def test_chunked_logprobs_equal_the_full_forward_values_and_gradients(
    tiny_model, tiny_tokenizer, larger_model, which, chunk, temperature
):
    # float64 models: both paths compute the same float64 hidden states and logits up to summation order (~1e-16
    # relative), then the same float32 log-softmax; they can differ only where a float64 logit rounds to float32 on
    # the other side of a rounding boundary (one float32 ulp of that logit), hence atol 1e-6 on log-probs of size ~10
    # and a relative gradient-norm bound of 1e-6. A wrong position, temperature or target differs by order 1.
    import copy

    model = copy.deepcopy(tiny_model).double() if which == "tiny" else copy.deepcopy(larger_model)
    pad = tiny_tokenizer.pad_token_id
    prompts, comps = random_rows(5, tiny_model.config.vocab_size, n=6)
    lp_full, g_full = loss_and_grads(model, prompts, comps, pad, temperature, None)
    lp_chunk, g_chunk = loss_and_grads(model, prompts, comps, pad, temperature, chunk)
    torch.testing.assert_close(lp_chunk, lp_full, rtol=0, atol=1e-6)
    assert set(g_chunk) == set(g_full) and len(g_full) == len(list(model.parameters()))
    for name in g_full:
        err = (g_chunk[name] - g_full[name]).norm() / g_full[name].norm().clamp_min(1e-30)
        assert err < 1e-6, (name, float(err))


def test_chunked_logprobs_hold_one_chunk_of_logits(tiny_model, tiny_tokenizer, monkeypatch):
    # the output projection runs on at most chunk_tokens rows at a time, over valid (unpadded) positions only, and
    # again per chunk in the backward pass (recomputed, not stored)
    import xrpo.trainer.logprobs as lpm

    rows = []
    real = lpm._chunk_logprobs

    def spy(h, *a):
        rows.append(h.shape[0])
        return real(h, *a)

    monkeypatch.setattr(lpm, "_chunk_logprobs", spy)
    prompts, comps = random_rows(6, tiny_model.config.vocab_size, n=5)
    n_valid = sum(len(c) for c in comps)
    lp, mask = completion_logprobs(tiny_model, prompts, comps, tiny_tokenizer.pad_token_id, 1.0, 4)
    assert rows == [4] * (n_valid // 4) + ([n_valid % 4] if n_valid % 4 else [])
    rows.clear()
    lp.sum().backward()
    tiny_model.zero_grad(set_to_none=True)
    assert sorted(rows) == sorted([4] * (n_valid // 4) + ([n_valid % 4] if n_valid % 4 else []))


def test_chunked_logprobs_refuse_models_whose_logits_are_transformed(tiny_model, tiny_tokenizer):
    import copy

    model = copy.deepcopy(tiny_model)
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match=r"optim.logprob_chunk_tokens.*final_logit_softcapping=30.0"):
        completion_logprobs(model, [[5, 6]], [[7]], tiny_tokenizer.pad_token_id, 1.0, 8)
    with pytest.raises(ValueError, match="chunk_tokens: expected an int >= 1"):
        completion_logprobs(tiny_model, [[5, 6]], [[7]], tiny_tokenizer.pad_token_id, 1.0, 0)
