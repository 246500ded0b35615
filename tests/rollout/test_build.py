"""xrpo.rollout.build: an engine from its kind and plain settings, the renderer's "auto" choices resolved. The vLLM
engine itself is tested in test_vllm_engine.py, and built through here by the trainer's vllm tests and `xrpo eval
--engine vllm`."""

from __future__ import annotations

import pytest

from xrpo.data import Problem
from xrpo.rollout.build import ENGINES, STREAMING_ENGINES, TRAINING_MODEL_ENGINES, build_engine, build_renderer
from xrpo.rollout.engine import StreamingEngine
from xrpo.rollout.hf_cb_engine import HFCBEngine
from xrpo.rollout.hf_engine import HFEngine


def test_hf_engine(tiny_model, tiny_tokenizer):
    engine = build_engine("hf", tiny_tokenizer, model=tiny_model, max_batch_size=7)
    assert isinstance(engine, HFEngine) and engine.model is tiny_model and engine.tokenizer is tiny_tokenizer
    assert engine.max_batch_size == 7
    # vLLM's settings mean nothing to the hf engine; no batch size: the engine's own default
    default = HFEngine(tiny_model, tiny_tokenizer).max_batch_size
    assert build_engine("hf", tiny_tokenizer, model=tiny_model, kv_cache_gib=3.0).max_batch_size == default


def test_hf_cb_engine(tiny_model, tiny_tokenizer):
    engine = build_engine("hf-cb", tiny_tokenizer, model=tiny_model, max_batch_size=5, max_seq_len=40)
    assert isinstance(engine, HFCBEngine) and engine.model is tiny_model and engine.tokenizer is tiny_tokenizer
    assert (engine.max_batch_size, engine.max_seq_len) == (5, 40)
    # the KV cache cannot hold sequences longer than the model's context (256 positions here)
    assert build_engine("hf-cb", tiny_tokenizer, model=tiny_model, max_seq_len=10**6).max_seq_len == 256
    # which kinds stream and which sample with the training model, as the trainer reads them
    assert isinstance(engine, StreamingEngine) and not isinstance(HFEngine(tiny_model, tiny_tokenizer), StreamingEngine)
    assert STREAMING_ENGINES == ("hf-cb", "vllm") and TRAINING_MODEL_ENGINES == ("hf", "hf-cb")


def test_errors(tiny_tokenizer):
    assert ENGINES == ("hf", "hf-cb", "vllm")
    with pytest.raises(ValueError, match="unknown engine 'sglang'; valid engines: hf, hf-cb, vllm"):
        build_engine("sglang", tiny_tokenizer)
    for kind in ("hf", "hf-cb"):
        with pytest.raises(ValueError, match=f"engine {kind}: samples from a loaded transformers model; pass model="):
            build_engine(kind, tiny_tokenizer)
    with pytest.raises(ValueError, match="engine hf-cb: sizes its KV cache for max_seq_len tokens"):
        build_engine("hf-cb", tiny_tokenizer, model=object())
    with pytest.raises(ValueError, match="engine vllm: loads a model directory; pass model_dir="):
        build_engine("vllm", tiny_tokenizer)


def test_renderer_auto_choices(tiny_tokenizer):
    p = Problem(id="p", prompt="1+1", answer="2")
    r = build_renderer(
        tiny_tokenizer,
        prompt_template="Q: {prompt}\nA:",
        icl_style="auto",
        default_model=True,
        use_chat_template=False,
        max_prompt_tokens=99,
        system_prompt="be brief",
    )
    # the built-in model reads examples in its own format: the template with the example's problem, then its solution
    assert (r.icl_style, r.fewshot_example) == ("fewshot", "Q: {problem}\nA:{solution}")
    assert (r.max_prompt_tokens, r.system_prompt, r.use_chat_template) == (99, "be brief", False)
    assert r.render(p) == "Q: 1+1\nA:"
    r = build_renderer(
        tiny_tokenizer,
        prompt_template="{prompt}",
        icl_style="auto",
        default_model=False,
        fewshot_example="P: {problem} S: {solution}",
    )
    assert (r.icl_style, r.fewshot_example) == ("paper", "P: {problem} S: {solution}")
    assert (
        build_renderer(tiny_tokenizer, prompt_template="{prompt}", icl_style="fewshot", default_model=False).icl_style
        == "fewshot"
    )
