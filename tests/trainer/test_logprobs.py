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
