"""xrpo.rollout.hf_engine.HFEngine on the tiny random Qwen2 model (CPU)."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from xrpo.rollout.engine import Rollout, RolloutEngine, SamplingParams
from xrpo.rollout.hf_engine import HFEngine

# Prompts of different token lengths, so that a batch of them is left-padded.
PROMPTS = [
    "Q: 1+1\nA:",
    "Q: What is 123 + 456 - 7?\nA:",
    "Q: 9\nA:",
    "Find the greatest common divisor of 12 and 18, then add 3.\nA:",
]


@pytest.fixture(scope="module")
def eos_heavy_model(tiny_tokenizer, tiny_model):
    """The tiny model with its EOS embedding row scaled up (tied, so the EOS logit grows with it): in some contexts
    EOS becomes likely, so completions end by EOS at various steps and others run to the length limit."""
    model = copy.deepcopy(tiny_model)
    with torch.no_grad():
        model.model.embed_tokens.weight[tiny_tokenizer.eos_token_id] *= 60
    return model


def reference_logprobs(model, rollout: Rollout) -> torch.Tensor:
    """log pi(y_t | x, y_<t) from one unpadded forward pass over prompt + completion."""
    ids = torch.tensor([rollout.prompt_ids + rollout.completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    p = len(rollout.prompt_ids)
    # position p - 1 + t predicts completion token t
    return logp[p - 1 : p - 1 + rollout.num_tokens].gather(1, torch.tensor(rollout.completion_ids)[:, None])[:, 0]


def prompt_lengths(tok, prompts):
    return [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]


# ---- (a) the log-prob test ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["tiny_model", "eos_heavy_model"])
def test_logprobs_equal_a_fresh_forward_pass(request, tiny_tokenizer, which):
    model = request.getfixturevalue(which)
    assert len(set(prompt_lengths(tiny_tokenizer, PROMPTS))) == len(PROMPTS)  # left padding really happens
    engine = HFEngine(model, tiny_tokenizer, max_batch_size=64)
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=24, seed=1234)
    out = engine.generate(PROMPTS, [3, 5, 2, 6], params)
    assert [len(rs) for rs in out] == [3, 5, 2, 6]
    checked = Counter()
    for prompt, rollouts in zip(PROMPTS, out):
        for r in rollouts:
            assert r.prompt_ids == tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"]
            assert tiny_tokenizer.pad_token_id not in r.prompt_ids
            ref = reference_logprobs(model, r)
            torch.testing.assert_close(torch.tensor(r.logprobs), ref, rtol=0, atol=1e-5)
            assert all(lp <= 0 for lp in r.logprobs)
            checked[r.finish_reason] += 1
    assert sum(checked.values()) == 16
    if which == "eos_heavy_model":
        # EOS-terminated rollouts, EOS log-prob included, were among those checked
        assert checked["eos"] >= 2 and checked["length"] >= 2


def test_logprobs_are_temperature_one_not_sampling_distribution(tiny_tokenizer, tiny_model):
    """Sampling at temperature 0.5 must not change the returned quantity: raw-logit log-probs."""
    engine = HFEngine(tiny_model, tiny_tokenizer)
    r = engine.generate(PROMPTS[:1], [1], SamplingParams(temperature=0.5, max_new_tokens=8, seed=0))[0][0]
    ids = torch.tensor([r.prompt_ids + r.completion_ids])
    with torch.no_grad():
        logits = tiny_model(ids).logits[0]
    p = len(r.prompt_ids)
    at_half = torch.log_softmax(logits / 0.5, -1)[p - 1 : -1].gather(1, torch.tensor(r.completion_ids)[:, None])[:, 0]
    assert not torch.allclose(torch.tensor(r.logprobs), at_half, atol=1e-3)
    torch.testing.assert_close(torch.tensor(r.logprobs), reference_logprobs(tiny_model, r), rtol=0, atol=1e-5)


# ---- (b) left padding: batched greedy == unbatched greedy --------------------------------------------------------
def test_batched_greedy_equals_unbatched_greedy(tiny_tokenizer, tiny_model):
    params = SamplingParams(temperature=0, max_new_tokens=16)
    engine = HFEngine(tiny_model, tiny_tokenizer, max_batch_size=64)
    batched = engine.generate(PROMPTS, [1] * len(PROMPTS), params)
    for prompt, (b,) in zip(PROMPTS, batched):
        (alone,) = engine.generate([prompt], [1], params)[0]
        assert b.completion_ids == alone.completion_ids
        assert b.text == alone.text and b.finish_reason == alone.finish_reason
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(alone.logprobs), rtol=0, atol=1e-5)
        # and greedy means argmax of the raw logits at every step
        ids = torch.tensor([alone.prompt_ids + alone.completion_ids])
        with torch.no_grad():
            logits = tiny_model(ids).logits[0]
        p = len(alone.prompt_ids)
        assert logits[p - 1 : -1].argmax(-1).tolist() == alone.completion_ids


def test_chunking_does_not_change_greedy_rollouts(tiny_tokenizer, tiny_model):
    params = SamplingParams(temperature=0, max_new_tokens=10)
    counts = [2, 1, 0, 3]
    one_chunk = HFEngine(tiny_model, tiny_tokenizer, max_batch_size=64).generate(PROMPTS, counts, params)
    small_chunks = HFEngine(tiny_model, tiny_tokenizer, max_batch_size=2).generate(PROMPTS, counts, params)
    for a_list, b_list, n in zip(one_chunk, small_chunks, counts):
        assert len(a_list) == len(b_list) == n
        for a, b in zip(a_list, b_list):
            assert a.completion_ids == b.completion_ids and a.prompt_ids == b.prompt_ids
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)
        # greedy: all rollouts of one prompt are the same
        assert len({tuple(r.completion_ids) for r in a_list}) <= 1


# ---- (c) seeds ---------------------------------------------------------------------------------------------------
def test_same_seed_same_rollouts_and_global_rng_untouched(tiny_tokenizer, tiny_model):
    engine = HFEngine(tiny_model, tiny_tokenizer, max_batch_size=4)
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=12, seed=7)
    torch.manual_seed(99)
    state = torch.get_rng_state()
    a = engine.generate(PROMPTS, [2, 2, 2, 2], params)
    assert torch.equal(torch.get_rng_state(), state)  # seeded calls leave the caller's RNG alone
    b = engine.generate(PROMPTS, [2, 2, 2, 2], params)
    assert [[r.completion_ids for r in rs] for rs in a] == [[r.completion_ids for r in rs] for rs in b]
    assert [[r.logprobs for r in rs] for rs in a] == [[r.logprobs for r in rs] for rs in b]
    c = engine.generate(PROMPTS, [2, 2, 2, 2], SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=12, seed=8))
    assert [[r.completion_ids for r in rs] for rs in a] != [[r.completion_ids for r in rs] for rs in c]
    # the rollouts of one prompt are distinct samples, not copies
    assert all(rs[0].completion_ids != rs[1].completion_ids for rs in a)


def test_unseeded_calls_draw_from_the_global_rng(tiny_tokenizer, tiny_model):
    engine = HFEngine(tiny_model, tiny_tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    torch.manual_seed(5)
    a = engine.generate(PROMPTS[:2], [1, 1], params)
    torch.manual_seed(5)
    b = engine.generate(PROMPTS[:2], [1, 1], params)
    c = engine.generate(PROMPTS[:2], [1, 1], params)  # RNG has moved on
    ids = lambda out: [r.completion_ids for rs in out for r in rs]  # noqa: E731
    assert ids(a) == ids(b) and ids(a) != ids(c)


# ---- (d) stop strings --------------------------------------------------------------------------------------------
def slow_stop_cut(tok, ids, stop):
    """Reference: the shortest prefix whose decoding contains a stop string, grown one token at a time."""
    for k in range(1, len(ids) + 1):
        text = tok.decode(ids[:k], skip_special_tokens=True)
        ends = [text.find(s) + len(s) for s in stop if s in text]
        if ends:
            return k, text[: min(ends)]
    return None


def pick_stop_string(text: str, min_start: int = 3) -> str:
    """A two-character printable-ASCII substring of `text` first occurring at or after `min_start`."""
    for i in range(min_start, len(text) - 1):
        s = text[i : i + 2]
        if all(32 <= ord(ch) < 127 for ch in s) and text.find(s) == i:
            return s
    raise AssertionError(f"no usable stop string in {text!r}")


def test_stop_strings_cut_ids_logprobs_and_text_consistently(tiny_tokenizer, tiny_model):
    engine = HFEngine(tiny_model, tiny_tokenizer, max_batch_size=64)
    free = SamplingParams(temperature=0.8, max_new_tokens=24, seed=11)
    counts = [2, 2, 2, 2]
    unstopped = engine.generate(PROMPTS, counts, free)
    # a stop string taken from the middle of one sampled completion, so it is certain to fire there
    stop = (pick_stop_string(unstopped[1][0].text),)
    stopped = engine.generate(PROMPTS, counts, SamplingParams(temperature=0.8, max_new_tokens=24, seed=11, stop=stop))
    reasons = Counter()
    for rs_free, rs_stop in zip(unstopped, stopped):
        for f, s in zip(rs_free, rs_stop):
            # same seed: a row samples the same tokens until it stops, so the stopped rollout is a cut of the free one
            expected = slow_stop_cut(tiny_tokenizer, f.completion_ids, stop)
            if expected is None:
                assert s.completion_ids == f.completion_ids and s.finish_reason == f.finish_reason
                assert s.text == f.text
            else:
                k, text = expected
                assert s.finish_reason == "stop"
                assert s.completion_ids == f.completion_ids[:k]
                assert s.text == text and s.text.endswith(stop[0])
                torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(f.logprobs[:k]), rtol=0, atol=1e-5)
            torch.testing.assert_close(torch.tensor(s.logprobs), reference_logprobs(tiny_model, s), rtol=0, atol=1e-5)
            reasons[s.finish_reason] += 1
    assert reasons["stop"] >= 1 and reasons["stop"] + reasons["length"] + reasons["eos"] == 8
    assert stopped[1][0].finish_reason == "stop"


def test_earliest_of_several_stop_strings_wins(tiny_tokenizer, tiny_model):
    engine = HFEngine(tiny_model, tiny_tokenizer)
    sampled = SamplingParams(temperature=1.0, max_new_tokens=24, seed=5)
    (free,) = engine.generate(PROMPTS[1:2], [1], sampled)[0]
    early = pick_stop_string(free.text, min_start=2)
    late = pick_stop_string(free.text, min_start=free.text.find(early) + 6)
    with_stops = SamplingParams(temperature=1.0, max_new_tokens=24, seed=5, stop=(late, early))
    (r,) = engine.generate(PROMPTS[1:2], [1], with_stops)[0]
    assert r.finish_reason == "stop" and r.text.endswith(early) and late not in r.text
    assert (len(r.completion_ids), r.text) == slow_stop_cut(tiny_tokenizer, free.completion_ids, (late, early))
    # a stop string that never occurs changes nothing
    never = SamplingParams(temperature=1.0, max_new_tokens=24, seed=5, stop=("\x07\x07",))
    (same,) = engine.generate(PROMPTS[1:2], [1], never)[0]
    assert "\x07\x07" not in free.text
    assert same.completion_ids == free.completion_ids and same.finish_reason == free.finish_reason


# ---- (e) finish reasons ------------------------------------------------------------------------------------------
def test_finish_reasons_eos_and_length(tiny_tokenizer, eos_heavy_model):
    eos = tiny_tokenizer.eos_token_id
    engine = HFEngine(eos_heavy_model, tiny_tokenizer)
    out = engine.generate(PROMPTS, [4, 4, 4, 4], SamplingParams(temperature=1.0, max_new_tokens=12, seed=0))
    seen = Counter()
    for rs in out:
        for r in rs:
            seen[r.finish_reason] += 1
            if r.finish_reason == "eos":
                # EOS is the last completion token, appears nowhere else, and carries its own log-prob
                assert r.completion_ids[-1] == eos and r.completion_ids.count(eos) == 1
                assert len(r.logprobs) == len(r.completion_ids) <= 12
                assert "<eos>" not in r.text
                assert r.text == tiny_tokenizer.decode(r.completion_ids[:-1])
            else:
                assert r.finish_reason == "length"
                assert len(r.completion_ids) == 12 and eos not in r.completion_ids
                assert r.text == tiny_tokenizer.decode(r.completion_ids, skip_special_tokens=True)
    assert seen["eos"] >= 1 and seen["length"] >= 1
    # greedy on the short prompt: the EOS-heavy model ends at once; the completion is exactly [EOS]
    (r,) = engine.generate(["Q: 9\nA:"], [1], SamplingParams(temperature=0, max_new_tokens=12))[0]
    assert (r.completion_ids, r.finish_reason, r.text) == ([eos], "eos", "")
    torch.testing.assert_close(torch.tensor(r.logprobs), reference_logprobs(eos_heavy_model, r), rtol=0, atol=1e-5)


def test_extra_eos_token_ids_end_completions(tiny_tokenizer, tiny_model):
    """Chat models end turns with tokens besides the tokenizer's EOS: any id in eos_token_ids ends a completion."""
    greedy = SamplingParams(temperature=0, max_new_tokens=16)
    (free,) = HFEngine(tiny_model, tiny_tokenizer).generate(PROMPTS[:1], [1], greedy)[0]
    third = free.completion_ids[2]
    k = free.completion_ids.index(third)  # its first occurrence (<= 2)
    engine = HFEngine(tiny_model, tiny_tokenizer, eos_token_ids=[tiny_tokenizer.eos_token_id, third])
    (r,) = engine.generate(PROMPTS[:1], [1], greedy)[0]
    assert r.finish_reason == "eos" and r.completion_ids == free.completion_ids[: k + 1]
    assert r.logprobs == pytest.approx(free.logprobs[: k + 1], abs=1e-5)


def test_default_eos_ids_merge_tokenizer_and_generation_config(tiny_tokenizer, tiny_model):
    model = copy.deepcopy(tiny_model)
    model.generation_config.eos_token_id = [tiny_tokenizer.eos_token_id, 7]
    assert HFEngine(model, tiny_tokenizer).eos_token_ids == [tiny_tokenizer.eos_token_id, 7]
    assert HFEngine(tiny_model, tiny_tokenizer).eos_token_ids == [tiny_tokenizer.eos_token_id]


def test_model_generation_config_does_not_leak_into_sampling(tiny_tokenizer, tiny_model):
    """A checkpoint's generation_config (here a repetition penalty and top-k 1) must not change what is sampled."""
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)
    clean = HFEngine(tiny_model, tiny_tokenizer).generate(PROMPTS, [2, 2, 2, 2], params)
    model = copy.deepcopy(tiny_model)
    model.generation_config.repetition_penalty = 5.0
    model.generation_config.top_k = 1
    dirty = HFEngine(model, tiny_tokenizer).generate(PROMPTS, [2, 2, 2, 2], params)
    assert [[r.completion_ids for r in rs] for rs in clean] == [[r.completion_ids for r in rs] for rs in dirty]
    assert model.generation_config.top_k == 1  # and it is restored afterwards


# ---- (f) counts --------------------------------------------------------------------------------------------------
def test_zero_counts_give_empty_lists(tiny_tokenizer, tiny_model):
    engine = HFEngine(tiny_model, tiny_tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=4, seed=0)
    out = engine.generate(PROMPTS, [0, 3, 0, 1], params)
    assert [len(rs) for rs in out] == [0, 3, 0, 1]
    assert engine.generate(PROMPTS, [0, 0, 0, 0], params) == [[], [], [], []]
    assert engine.generate([], [], params) == []
    # a prompt with count 0 is not even tokenised: an empty prompt there is fine
    assert [len(rs) for rs in engine.generate(["", PROMPTS[0]], [0, 1], params)] == [0, 1]


# ---- model state, weights, protocol ------------------------------------------------------------------------------
def test_eval_mode_during_generation_and_restored(tiny_tokenizer, tiny_model):
    model = copy.deepcopy(tiny_model)
    model.train()
    modes = []
    hook = model.model.layers[0].register_forward_hook(lambda mod, args, out: modes.append(mod.training))
    HFEngine(model, tiny_tokenizer).generate(PROMPTS[:1], [1], SamplingParams(max_new_tokens=3, seed=0))
    hook.remove()
    assert modes and not any(modes)
    assert model.training
    assert all(p.grad is None for p in model.parameters())


def test_sync_weights(tiny_tokenizer, tiny_model):
    from xrpo.models.tiny import build_tiny_model

    engine = HFEngine(tiny_model, tiny_tokenizer)
    before = tiny_model.model.embed_tokens.weight.clone()
    engine.sync_weights(tiny_model)  # same object: nothing to do
    assert engine.model is tiny_model and torch.equal(tiny_model.model.embed_tokens.weight, before)

    own = build_tiny_model(tiny_tokenizer, seed=1)
    engine = HFEngine(own, tiny_tokenizer)
    engine.sync_weights(tiny_model)  # a separate copy gets the training weights
    for (name, a), b in zip(own.state_dict().items(), tiny_model.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="cannot copy its weights"):
        engine.sync_weights(build_tiny_model(tiny_tokenizer, d_model=32, layers=1, heads=2, ffn=64))


def test_is_a_rollout_engine(tiny_tokenizer, tiny_model):
    assert isinstance(HFEngine(tiny_model, tiny_tokenizer), RolloutEngine)


# ---- (g) validation ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "prompts, counts, params, match",
    [
        ("Q: 1+1\nA:", [1], SamplingParams(), "prompts: expected a list"),
        (PROMPTS, [1, 1], SamplingParams(), r"counts: expected one count per prompt \(4\), got 2"),
        (PROMPTS[:2], [1, -2], SamplingParams(), r"counts\[1\]"),
        (PROMPTS[:1], [1], dict(temperature=1.0), "params"),
        (["Q: 1+1", ""], [1, 1], SamplingParams(max_new_tokens=4), r"prompts\[1\]: encodes to no tokens"),
        (PROMPTS[:1], [1], SamplingParams(max_new_tokens=250), r"prompts\[0\]: \d+ prompt tokens \+ max_new_tok"),
        (["Q: " + "1" * 300], [1], SamplingParams(max_new_tokens=4), r"prompts\[0\].*context of 256 positions"),
    ],
)
def test_generate_bad_input(tiny_tokenizer, tiny_model, prompts, counts, params, match):
    engine = HFEngine(tiny_model, tiny_tokenizer)
    with pytest.raises(ValueError, match=match):
        engine.generate(prompts, counts, params)


@pytest.mark.parametrize("kwargs, match", [(dict(max_batch_size=0), "max_batch_size"), (dict(eos_token_ids=[]), "eos")])
def test_constructor_bad_input(tiny_tokenizer, tiny_model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        HFEngine(tiny_model, tiny_tokenizer, **kwargs)
    with pytest.raises(ValueError, match="model"):
        HFEngine(object(), tiny_tokenizer)
