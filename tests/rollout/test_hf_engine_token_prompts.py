"""HFEngine.generate_ids (token-id prompts) and HFEngine.reuse_prefixes (KV reuse for continued rows), tiny model."""

from __future__ import annotations

import copy

import pytest
import torch

from xrpo.rollout.engine import SamplingParams, TokenPromptEngine
from xrpo.rollout.hf_engine import HFEngine

PROMPTS = ["Q: 1+1\nA:", "Q: What is 123 + 456 - 7?\nA:", "Q: 9\nA:"]


def reference_logprobs(model, prompt_ids, completion_ids) -> torch.Tensor:
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    p = len(prompt_ids)
    return logp[p - 1 : p - 1 + len(completion_ids)].gather(1, torch.tensor(completion_ids)[:, None])[:, 0]


def encode(tok, prompts):
    return [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]


def test_generate_ids_equals_generate_on_the_encoded_prompts(tiny_tokenizer, tiny_model):
    engine = HFEngine(tiny_model, tiny_tokenizer)
    assert isinstance(engine, TokenPromptEngine)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    by_text = engine.generate(PROMPTS, [2, 0, 3], params)
    by_ids = engine.generate_ids(encode(tiny_tokenizer, PROMPTS), [2, 0, 3], params)
    assert by_text == by_ids  # same rows, same seed: identical rollouts (ids, log-probs, text, finish reason)


@pytest.mark.parametrize(
    "prompt_ids, counts, match",
    [
        ("abc", [1], "list of token-id lists"),
        ([[]], [1], r"prompt_ids\[0\]: expected a non-empty prompt"),
        ([[1, "2"]], [1], r"prompt_ids\[0\]\[1\]: expected a token id"),
        ([[1, -1]], [1], r"prompt_ids\[0\]\[1\]"),
        ([[1], [2]], [1], "one count per prompt"),
        ([[10**7]], [1], "outside the model's vocabulary"),
    ],
)
def test_generate_ids_bad_input(tiny_tokenizer, tiny_model, prompt_ids, counts, match):
    with pytest.raises(ValueError, match=match):
        HFEngine(tiny_model, tiny_tokenizer).generate_ids(prompt_ids, counts, SamplingParams(max_new_tokens=2))


def _continue(engine, first, counts, params):
    """Second segment: continue every first-segment row (prompt + its tokens) `counts[k]` times."""
    prompts = [r.prompt_ids + r.completion_ids for rs in first for r in rs]
    return prompts, engine.generate_ids(prompts, counts, params)


def test_reused_prefixes_give_exact_log_probs_and_count_cached_tokens(tiny_tokenizer, tiny_model):
    engine = HFEngine(tiny_model, tiny_tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=4, seed=0)
    ids = encode(tiny_tokenizer, PROMPTS)  # different lengths: the first chunk is left-padded
    with engine.reuse_prefixes():
        first = engine.generate_ids(ids, [2, 1, 2], params)
        assert all(r.finish_reason == "length" for rs in first for r in rs)  # the random model rarely says EOS
        before = dict(engine.token_counts)
        prompts, second = _continue(engine, first, [3, 1, 2, 1, 1], params)
        after = dict(engine.token_counts)
    rows = sum(len(rs) for rs in second)
    # each continued row computed one uncached token (the last one of its prompt); the rest came from the cache
    assert after["prefill"] - before["prefill"] == rows
    assert after["cached"] - before["cached"] == sum((len(p) - 1) * c for p, c in zip(prompts, [3, 1, 2, 1, 1]))
    for p, rs in zip(prompts, second):
        for r in rs:
            assert r.prompt_ids == p
            torch.testing.assert_close(
                torch.tensor(r.logprobs), reference_logprobs(tiny_model, p, r.completion_ids), rtol=0, atol=1e-5
            )


def test_reuse_does_not_change_greedy_continuations(tiny_tokenizer, tiny_model):
    params = SamplingParams(temperature=0.0, max_new_tokens=3)
    ids = encode(tiny_tokenizer, PROMPTS)
    plain = HFEngine(tiny_model, tiny_tokenizer)
    reusing = HFEngine(tiny_model, tiny_tokenizer, max_batch_size=2)  # the continuation is split over chunks too
    want = _continue(plain, plain.generate_ids(ids, [1, 1, 1], params), [2, 1, 1], params)[1]
    with reusing.reuse_prefixes():
        got = _continue(reusing, reusing.generate_ids(ids, [1, 1, 1], params), [2, 1, 1], params)[1]
        assert reusing.token_counts["cached"] > 0
    assert [[r.completion_ids for r in rs] for rs in got] == [[r.completion_ids for r in rs] for rs in want]
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)


def test_reuse_store_lifetime(tiny_tokenizer, tiny_model):
    eos_heavy = copy.deepcopy(tiny_model)
    with torch.no_grad():
        eos_heavy.model.embed_tokens.weight[tiny_tokenizer.eos_token_id] *= 60
    engine = HFEngine(eos_heavy, tiny_tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=1)
    ids = encode(tiny_tokenizer, PROMPTS)
    with engine.reuse_prefixes():
        first = engine.generate_ids(ids, [8, 8, 8], params)
        kept = {tuple(r.prompt_ids + r.completion_ids) for rs in first for r in rs if r.finish_reason == "length"}
        # only rows that ran to max_new_tokens can be continued; EOS-ended ones are not kept
        assert set(engine._prefixes) == kept and 0 < len(kept) < 24
        key = next(iter(kept))
        engine.generate_ids([list(key)], [2], params)
        assert key not in engine._prefixes  # used once, dropped
        with pytest.raises(RuntimeError, match="cannot be nested"):
            with engine.reuse_prefixes():
                pass
    assert engine._prefixes is None
    # outside the block nothing is cached
    n = engine.token_counts["cached"]
    engine.generate_ids([list(key)], [1], params)
    assert engine.token_counts["cached"] == n
