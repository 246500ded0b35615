"""xrpo.rollout.hf_cb_engine.HFCBEngine on the tiny random Qwen2 model (CPU): log-probs against a fresh forward pass,
a rollout's tokens independent of its batch, seeds, stop strings and EOS, streaming waves that really overlap, weight
sync without a new cache manager, LoRA, mixed precision, and models the engine refuses."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from xrpo.rollout.engine import RolloutEngine, SamplingParams, StreamingEngine, TokenPromptEngine
from xrpo.rollout.hf_cb_engine import HFCBEngine

from .test_hf_engine import PROMPTS, pick_stop_string, reference_logprobs, slow_stop_cut


def engine_on(model, tok, **kw):
    kw.setdefault("max_batch_size", 32)
    kw.setdefault("max_seq_len", 96)
    return HFCBEngine(model, tok, **kw)


@pytest.fixture(scope="module")
def engine(tiny_tokenizer, tiny_model):
    return engine_on(tiny_model, tiny_tokenizer)


@pytest.fixture(scope="module")
def eos_heavy_model(tiny_tokenizer, tiny_model):
    """The tiny model with its EOS embedding row scaled up (tied): completions end by EOS at various steps."""
    model = copy.deepcopy(tiny_model)
    with torch.no_grad():
        model.model.embed_tokens.weight[tiny_tokenizer.eos_token_id] *= 60
    return model


def ids(out):
    return [[r.completion_ids for r in rs] for rs in out]


# ---- log-probs ---------------------------------------------------------------------------------------------------
def test_logprobs_equal_a_fresh_forward_pass(engine, tiny_tokenizer, tiny_model, eos_heavy_model):
    # the tolerance of the HF engine's tests: forward passes of the same tokens in other batch shapes (here a packed
    # paged batch against one unpadded row) have no short derived bound; 1e-5 is the envelope CONTRIBUTING
    # ("Tolerances") measured for the tiny models' log-probs
    heavy = engine_on(eos_heavy_model, tiny_tokenizer)
    for model, eng in ((tiny_model, engine), (eos_heavy_model, heavy)):
        out = eng.generate(PROMPTS, [3, 5, 2, 6], SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=24, seed=9))
        assert [len(rs) for rs in out] == [3, 5, 2, 6]
        reasons = Counter()
        for prompt, rollouts in zip(PROMPTS, out):
            for r in rollouts:
                assert r.prompt_ids == tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"]
                torch.testing.assert_close(torch.tensor(r.logprobs), reference_logprobs(model, r), rtol=0, atol=1e-5)
                reasons[r.finish_reason] += 1
        if model is eos_heavy_model:  # EOS-terminated rollouts, EOS log-prob included, were among those checked
            assert reasons["eos"] >= 2 and reasons["length"] >= 2


def test_logprobs_are_temperature_one_whatever_the_sampling(engine, tiny_model):
    (r,) = engine.generate(PROMPTS[:1], [1], SamplingParams(temperature=0.5, top_p=0.8, max_new_tokens=8, seed=0))[0]
    ids_ = torch.tensor([r.prompt_ids + r.completion_ids])
    with torch.no_grad():
        logits = tiny_model(ids_).logits[0]
    p = len(r.prompt_ids)
    at_half = torch.log_softmax(logits / 0.5, -1)[p - 1 : -1].gather(1, torch.tensor(r.completion_ids)[:, None])[:, 0]
    assert not torch.allclose(torch.tensor(r.logprobs), at_half, atol=1e-3)
    torch.testing.assert_close(torch.tensor(r.logprobs), reference_logprobs(tiny_model, r), rtol=0, atol=1e-5)


def test_greedy_is_the_argmax_of_the_raw_logits_in_a_batch_or_alone(engine, tiny_model):
    params = SamplingParams(temperature=0, max_new_tokens=12)
    batched = engine.generate(PROMPTS, [2, 1, 1, 1], params)
    assert batched[0][0].completion_ids == batched[0][1].completion_ids
    for prompt, rs in zip(PROMPTS, batched):
        (alone,) = engine.generate([prompt], [1], params)[0]
        assert rs[0].completion_ids == alone.completion_ids
        full = torch.tensor([alone.prompt_ids + alone.completion_ids])
        with torch.no_grad():
            logits = tiny_model(full).logits[0]
        assert logits[len(alone.prompt_ids) - 1 : -1].argmax(-1).tolist() == alone.completion_ids


# ---- seeds -------------------------------------------------------------------------------------------------------
def test_a_rollout_draws_the_same_tokens_whatever_else_is_in_the_batch(engine):
    # transformers samples a step's rows together; the engine's keys make rollout j of prompt i a function of
    # (seed, i, j) only, as vLLM's per-request seeds do
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=16, seed=4)
    full = engine.generate(PROMPTS, [2, 3, 1, 2], params)
    only_second = engine.generate(["", PROMPTS[1], "", ""], [0, 3, 0, 0], params)
    fewer = engine.generate(PROMPTS, [1, 0, 1, 0], params)
    assert ids(only_second)[1] == ids(full)[1]
    assert ids(fewer)[0] == ids(full)[0][:1] and ids(fewer)[2] == ids(full)[2]
    for a, b in zip(only_second[1], full[1]):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)


def test_same_seed_same_rollouts_fresh_engine_too_and_global_rng_untouched(engine, tiny_tokenizer, tiny_model):
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=12, seed=7)
    torch.manual_seed(99)
    state = torch.get_rng_state()
    a = engine.generate(PROMPTS, [2, 2, 2, 2], params)
    assert torch.equal(torch.get_rng_state(), state)  # seeded calls leave the caller's RNG alone
    assert ids(engine.generate(PROMPTS, [2, 2, 2, 2], params)) == ids(a)
    assert ids(engine_on(tiny_model, tiny_tokenizer, max_batch_size=3).generate(PROMPTS, [2, 2, 2, 2], params)) == ids(
        a
    )
    c = engine.generate(PROMPTS, [2, 2, 2, 2], SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=12, seed=8))
    assert ids(c) != ids(a)
    assert all(rs[0].completion_ids != rs[1].completion_ids for rs in a)  # distinct samples, not copies
    # the same prompt at two positions of a call: other keys, other samples
    twice = engine.generate([PROMPTS[0], PROMPTS[0]], [2, 2], params)
    assert ids(twice)[0] == ids(a)[0] and ids(twice)[1] != ids(twice)[0]


def test_each_position_draws_afresh(engine, tiny_model):
    # a rollout's key is drawn at every position with that position (the noise of step t is not step t-1's): the
    # tiny random model's next-token distributions barely change between steps, so reused noise would repeat the
    # previous token far more often than the model's own probability of repeating it says
    params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=13)
    out = engine.generate(PROMPTS[:2], [32, 32], params)
    repeats, expected, variance = 0, 0.0, 0.0
    for r in (r for rs in out for r in rs):
        full = torch.tensor([r.prompt_ids + r.completion_ids])
        with torch.no_grad():
            probs = torch.softmax(tiny_model(full).logits[0].double(), -1)
        p = len(r.prompt_ids)
        for t in range(1, r.num_tokens):
            q = probs[p - 1 + t, r.completion_ids[t - 1]].item()  # P(y_t = y_{t-1})
            repeats += r.completion_ids[t] == r.completion_ids[t - 1]
            expected, variance = expected + q, variance + q * (1 - q)
    # a sum of independent Bernoullis: within 6 standard deviations of its mean (+1 for its discreteness)
    assert abs(repeats - expected) < 6 * variance**0.5 + 1, (repeats, expected)


def test_unseeded_calls_draw_from_the_global_rng(engine):
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    torch.manual_seed(5)
    a = engine.generate(PROMPTS[:2], [1, 1], params)
    torch.manual_seed(5)
    b = engine.generate(PROMPTS[:2], [1, 1], params)
    c = engine.generate(PROMPTS[:2], [1, 1], params)  # the RNG has moved on
    assert ids(a) == ids(b) and ids(a) != ids(c)


# ---- stop strings, EOS -------------------------------------------------------------------------------------------
def test_stop_strings_cut_ids_logprobs_and_text_consistently(engine, tiny_tokenizer, tiny_model):
    free = SamplingParams(temperature=0.8, max_new_tokens=24, seed=11)
    unstopped = engine.generate(PROMPTS, [2, 2, 2, 2], free)
    stop = (pick_stop_string(unstopped[1][0].text),)
    stopped = engine.generate(
        PROMPTS, [2, 2, 2, 2], SamplingParams(temperature=0.8, max_new_tokens=24, seed=11, stop=stop)
    )
    reasons = Counter()
    for rs_free, rs_stop in zip(unstopped, stopped):
        for f, s in zip(rs_free, rs_stop):
            expected = slow_stop_cut(tiny_tokenizer, f.completion_ids, stop)
            if expected is None:
                assert (s.completion_ids, s.finish_reason, s.text) == (f.completion_ids, f.finish_reason, f.text)
            else:
                k, text = expected
                assert s.finish_reason == "stop" and s.completion_ids == f.completion_ids[:k] and s.text == text
                torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(f.logprobs[:k]), rtol=0, atol=1e-5)
            reasons[s.finish_reason] += 1
    assert stopped[1][0].finish_reason == "stop" and sum(reasons.values()) == 8


def test_finish_reasons_eos_and_length_and_extra_eos_ids(tiny_tokenizer, tiny_model, eos_heavy_model):
    eos = tiny_tokenizer.eos_token_id
    out = engine_on(eos_heavy_model, tiny_tokenizer).generate(
        PROMPTS, [4, 4, 4, 4], SamplingParams(temperature=1.0, max_new_tokens=12, seed=0)
    )
    seen = Counter()
    for r in (r for rs in out for r in rs):
        seen[r.finish_reason] += 1
        if r.finish_reason == "eos":
            assert r.completion_ids[-1] == eos and r.completion_ids.count(eos) == 1
            assert r.text == tiny_tokenizer.decode(r.completion_ids[:-1])
        else:
            assert len(r.completion_ids) == 12 and eos not in r.completion_ids
    assert seen["eos"] >= 1 and seen["length"] >= 1
    # any id of eos_token_ids ends a completion (chat models end turns with several)
    greedy = SamplingParams(temperature=0, max_new_tokens=16)
    (free,) = engine_on(tiny_model, tiny_tokenizer).generate(PROMPTS[:1], [1], greedy)[0]
    third = free.completion_ids[2]
    k = free.completion_ids.index(third)
    (r,) = engine_on(tiny_model, tiny_tokenizer, eos_token_ids=[eos, third]).generate(PROMPTS[:1], [1], greedy)[0]
    assert r.finish_reason == "eos" and r.completion_ids == free.completion_ids[: k + 1]


# ---- streaming ---------------------------------------------------------------------------------------------------
def test_a_request_submitted_mid_decoding_finishes_before_a_barrier_would_let_it_start(engine):
    assert isinstance(engine, StreamingEngine)
    long = SamplingParams(temperature=0, max_new_tokens=40)
    short = SamplingParams(temperature=1.0, max_new_tokens=3, seed=1)
    start = engine.steps
    engine.submit("long", PROMPTS[0], 2, long, index=0)
    engine.submit("first", PROMPTS[1], 2, short, index=1)
    done = engine.wait()
    assert [k for k, _ in done] == ["first"] and engine.steps - start == 3
    # "long" is decoding; a request submitted now joins its batch
    submitted_at = engine.steps - start
    engine.submit("late", PROMPTS[2], 2, short, index=2)
    done = engine.wait()
    late_done = engine.steps - start
    assert [k for k, _ in done] == ["late"]
    done = engine.wait()
    long_done = engine.steps - start
    assert [k for k, _ in done] == ["long"] and all(r.finish_reason == "length" for r in done[0][1])
    assert engine.wait() == []
    # a barrier (everything submitted before generates to the end first) would start "late" at step 40 at the
    # earliest; it finished 3 steps after its submission, while "long" still decoded
    assert late_done == submitted_at + 3 < long_done == 40


def test_submitted_requests_draw_what_generate_draws(engine):
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=10, seed=21, stop=("q",))
    expected = engine.generate(PROMPTS, [2, 3, 1, 2], params)
    # submitted in another order, with unrelated requests decoding beside them
    engine.submit("noise", "Q: 5 + 5\nA:", 4, SamplingParams(temperature=1.0, max_new_tokens=20, seed=3), index=0)
    for i in (3, 1):
        engine.submit(i, PROMPTS[i], [2, 3, 1, 2][i], params, index=i)
    got = dict(engine.wait())
    engine.submit(0, PROMPTS[0], 2, params, index=0)
    engine.submit(2, PROMPTS[2], 1, params, index=2)
    while len(got) < 5:
        got.update(engine.wait())
    assert [[r.completion_ids for r in got[i]] for i in range(4)] == ids(expected)
    assert [[r.finish_reason for r in got[i]] for i in range(4)] == [[r.finish_reason for r in rs] for rs in expected]


def test_wait_returns_completed_requests_in_submission_order_and_refuses_misuse(engine):
    params = SamplingParams(temperature=0, max_new_tokens=2)
    engine.submit("b", PROMPTS[1], 1, params)
    engine.submit("a", PROMPTS[0], 1, params)
    with pytest.raises(ValueError, match="key 'a' is already in flight"):
        engine.submit("a", PROMPTS[0], 1, params)
    with pytest.raises(RuntimeError, match="2 streamed requests are in flight"):
        engine.generate(PROMPTS[:1], [1], params)
    assert [k for k, _ in engine.wait()] == ["b", "a"]
    assert engine.wait() == []


# ---- weights -----------------------------------------------------------------------------------------------------
def test_sync_weights_keeps_one_cache_manager(tiny_tokenizer, tiny_model, monkeypatch):
    from xrpo.models.tiny import build_tiny_model

    model = copy.deepcopy(tiny_model)
    inits = Counter()
    real_init = model.init_continuous_batching

    def counted(*args, **kwargs):
        inits["n"] += 1
        return real_init(*args, **kwargs)

    monkeypatch.setattr(model, "init_continuous_batching", counted)
    engine = engine_on(model, tiny_tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=2)
    before = engine.generate(PROMPTS[:2], [2, 2], params)
    # the training model itself is updated in place (an optimiser step): sync is a no-op, the next call samples
    # from the new weights
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.sync_weights(model)
    after = engine.generate(PROMPTS[:2], [2, 2], params)
    assert ids(after) != ids(before)
    for r in (r for rs in after for r in rs):
        torch.testing.assert_close(torch.tensor(r.logprobs), reference_logprobs(model, r), rtol=0, atol=1e-5)
    # a separate inference copy gets the training weights copied in
    own = build_tiny_model(tiny_tokenizer, seed=1)
    copy_engine = engine_on(own, tiny_tokenizer)
    copy_engine.sync_weights(model)
    assert ids(copy_engine.generate(PROMPTS[:2], [2, 2], params)) == ids(after)
    assert inits["n"] == 1  # one manager for the first engine, whatever the syncs
    with pytest.raises(ValueError, match="cannot copy its weights"):
        copy_engine.sync_weights(build_tiny_model(tiny_tokenizer, d_model=32, layers=1, heads=2, ffn=64))


def test_lora_adapters_sample_as_their_merged_weights(tiny_tokenizer, tiny_model):
    pytest.importorskip("peft")
    from xrpo.models import lora

    model = lora.apply_lora(copy.deepcopy(tiny_model), rank=4, alpha=8.0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    merged = copy.deepcopy(tiny_model)
    merged.load_state_dict(lora.inference_state_dict(model))
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=6)
    out = engine_on(model, tiny_tokenizer).generate(PROMPTS[:3], [2, 2, 2], params)
    for r in (r for rs in out for r in rs):
        # adapters unmerged (W x + s B A x) against merged weights ((W + s B A) x): float32 sums in another order,
        # within the engine envelope
        torch.testing.assert_close(torch.tensor(r.logprobs), reference_logprobs(merged, r), rtol=0, atol=1e-5)
    assert ids(engine_on(merged, tiny_tokenizer).generate(PROMPTS[:3], [2, 2, 2], params)) == ids(out)


def test_mixed_precision_samples_in_bfloat16(tiny_tokenizer, tiny_model):
    model = copy.deepcopy(tiny_model)
    engine = engine_on(model, tiny_tokenizer, autocast_dtype=torch.bfloat16)
    out = engine.generate(PROMPTS, [2, 2, 2, 2], SamplingParams(max_new_tokens=12, seed=0))
    assert next(model.parameters()).dtype == torch.float32
    diffs = []
    for r in (r for rs in out for r in rs):
        full = torch.tensor([r.prompt_ids + r.completion_ids])
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(full).logits[0].float()
        p = len(r.prompt_ids)
        ref = torch.log_softmax(logits, -1)[p - 1 : -1].gather(1, torch.tensor(r.completion_ids)[:, None])[:, 0]
        diffs.append((ref - torch.tensor(r.logprobs)).abs())
        f32 = reference_logprobs(model, r)
        assert not torch.allclose(torch.tensor(r.logprobs), f32, rtol=0, atol=1e-5)  # really computed in bfloat16
    d = torch.cat(diffs)
    # a cached decode against one full forward, both in bfloat16 (mixed precision): bfloat16's unit roundoff 2^-8
    # on the tiny model's logits (< 8) is ~0.03 per logit, up to ~0.1 on a log-prob and ~0.02 on average (the
    # bounds of the HF engine's test on CUDA, tests/trainer/test_memory_gpu.py)
    assert d.max() < 0.1 and d.mean() < 0.02, (d.max(), d.mean())


# ---- model state, protocol, refusals -----------------------------------------------------------------------------
def test_model_mode_and_attention_restored_and_no_gradients(tiny_tokenizer, tiny_model):
    model = copy.deepcopy(tiny_model)
    model.train()
    impl = model.config._attn_implementation
    modes = []
    hook = model.model.layers[0].register_forward_hook(lambda mod, args, out: modes.append(mod.training))
    engine = engine_on(model, tiny_tokenizer)
    assert model.training and model.config._attn_implementation == impl
    engine.submit("k", PROMPTS[0], 2, SamplingParams(max_new_tokens=3, seed=0))
    assert model.config._attn_implementation == impl  # the trainer may run between submit and wait
    engine.wait()
    hook.remove()
    assert modes and not any(modes)
    assert model.training and model.config._attn_implementation == impl
    assert all(p.grad is None for p in model.parameters())


def test_is_a_streaming_and_token_prompt_engine(engine, tiny_tokenizer):
    assert isinstance(engine, RolloutEngine) and isinstance(engine, TokenPromptEngine)
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=3)
    by_text = engine.generate(PROMPTS[:2], [1, 2], params)
    by_ids = engine.generate_ids([r[0].prompt_ids for r in by_text], [1, 2], params)
    assert ids(by_ids) == ids(by_text)


@pytest.mark.parametrize(
    "prompts, counts, params, match",
    [
        ("Q: 1+1\nA:", [1], SamplingParams(), "prompts: expected a list"),
        (PROMPTS[:2], [1, -2], SamplingParams(), r"counts\[1\]"),
        (["Q: 1+1", ""], [1, 1], SamplingParams(max_new_tokens=4), r"prompts\[1\]: encodes to no tokens"),
        (
            PROMPTS[:1],
            [1],
            SamplingParams(max_new_tokens=95),
            r"prompts\[0\]: \d+ prompt tokens \+ .*max_seq_len of 96",
        ),
    ],
)
def test_generate_bad_input(engine, prompts, counts, params, match):
    with pytest.raises(ValueError, match=match):
        engine.generate(prompts, counts, params)
    assert engine.generate(PROMPTS[:1], [1], SamplingParams(max_new_tokens=2, seed=0))[0][0].num_tokens == 2


def test_constructor_bad_input_and_models_the_engine_cannot_serve(tiny_tokenizer, tiny_model):
    import transformers

    for kwargs, match in ((dict(max_batch_size=0), "max_batch_size"), (dict(eos_token_ids=[]), "eos")):
        with pytest.raises(ValueError, match=match):
            engine_on(tiny_model, tiny_tokenizer, **kwargs)
    with pytest.raises(ValueError, match="has no continuous batching.*rollout.engine=hf"):
        HFCBEngine(torch.nn.Linear(2, 2), tiny_tokenizer)

    # a model that takes its positions from the length of what it is given, not from position_ids, runs under
    # transformers' continuous batching (which packs the step's requests into one sequence) with wrong positions:
    # the engine's probe refuses it, naming the engine to use (transformers 5.10's sliding windows failed the same way)
    class PositionsFromLength(type(tiny_model)):
        def forward(self, *args, position_ids=None, **kwargs):
            return super().forward(*args, **kwargs)

    wrong = PositionsFromLength(tiny_model.config)
    wrong.load_state_dict(tiny_model.state_dict())
    with pytest.raises(
        ValueError, match="other log-probs than a plain forward pass for PositionsFromLength.*engine=hf"
    ):
        engine_on(wrong.eval(), tiny_tokenizer)
    # BLOOM's attention cannot switch to a paged implementation at all
    bloom = transformers.BloomForCausalLM(
        transformers.BloomConfig(vocab_size=len(tiny_tokenizer), hidden_size=32, n_layer=1, n_head=2)
    )
    with pytest.raises(ValueError, match="cannot serve BloomForCausalLM.*paged.*engine=hf"):
        engine_on(bloom, tiny_tokenizer)
    # GPT-2 (learned absolute positions) is served, and its log-probs hold
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=len(tiny_tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=128)
    ).eval()
    (r,) = engine_on(gpt2, tiny_tokenizer).generate(PROMPTS[:1], [1], SamplingParams(max_new_tokens=6, seed=0))[0]
    torch.testing.assert_close(torch.tensor(r.logprobs), reference_logprobs(gpt2, r), rtol=0, atol=1e-5)
