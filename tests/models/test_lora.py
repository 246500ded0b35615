"""xrpo.models.lora: the wrapped model starts as the base model, the merged weights inference engines receive equal
peft's own merge, and the HF engine samples from the adapted model."""

from __future__ import annotations

import copy

import pytest
import torch

from xrpo.models import lora

pytest.importorskip("peft")


def perturbed(tiny_model, seed=0, rank=4):
    """The tiny model with LoRA adapters whose B is random (as after training), so that the adapters matter."""
    model = lora.apply_lora(copy.deepcopy(tiny_model), rank=rank, alpha=16.0, base_path="/base")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def test_fresh_adapters_compute_the_base_model_and_only_they_train(tiny_model):
    model = lora.apply_lora(copy.deepcopy(tiny_model), rank=4, alpha=8.0, base_path="/base/dir")
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, tiny_model(ids).logits)  # B = 0: exactly the base function
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert model.peft_config["default"].base_model_name_or_path == "/base/dir"
    assert lora.is_lora_model(model) and not lora.is_lora_model(tiny_model)


def test_inference_state_dict_equals_peft_merge_and_leaves_the_model_alone(tiny_model):
    model = perturbed(tiny_model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    got = lora.inference_state_dict(model)
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    assert got.keys() == want.keys() == tiny_model.state_dict().keys()  # the base model's own names
    for k in want:
        # the same float32 operations as peft's merge (W + B @ A * scaling): equal to rounding
        torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-7)
    assert any(not torch.equal(got[k], tiny_model.state_dict()[k]) for k in got)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing merged in place
    assert lora.inference_state_dict(tiny_model).keys() == tiny_model.state_dict().keys()


def test_hf_engine_samples_from_the_adapted_model(tiny_model, tiny_tokenizer):
    from xrpo.rollout.engine import SamplingParams
    from xrpo.rollout.hf_engine import HFEngine

    model = perturbed(tiny_model, seed=1)
    merged = copy.deepcopy(model).merge_and_unload().eval()
    engine = HFEngine(model, tiny_tokenizer)
    out = engine.generate(["Q: 3 + 4\nA:", "Q: 12\nA:"], [2, 2], SamplingParams(max_new_tokens=8, seed=3))
    for r in (r for rs in out for r in rs):
        ids = torch.tensor([r.prompt_ids + r.completion_ids])
        with torch.no_grad():
            logp = torch.log_softmax(merged(ids).logits[0].float(), -1)
        p = len(r.prompt_ids)
        ref = logp[p - 1 : p - 1 + r.num_tokens].gather(1, torch.tensor(r.completion_ids)[:, None])[:, 0]
        # adapters on the fly (W x + s B (A x)) vs merged weights ((W + s B A) x), and a KV-cached decode vs one
        # forward: float32 rounding of sums over 64-wide rows, ~1e-6 on log-probs of size < 10
        torch.testing.assert_close(torch.tensor(r.logprobs), ref, rtol=0, atol=2e-5)


def test_adapter_dir_and_base(tmp_path, tiny_model):
    model = lora.apply_lora(copy.deepcopy(tiny_model), rank=2, alpha=4.0, base_path=str(tmp_path / "base"))
    model.save_pretrained(tmp_path / "ad")
    assert lora.is_adapter_dir(tmp_path / "ad") and not lora.is_adapter_dir(tmp_path)
    assert lora.adapter_base(tmp_path / "ad") == str(tmp_path / "base")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "adapter_config.json").write_text("{}")
    with pytest.raises(ValueError, match="names no base model"):
        lora.adapter_base(tmp_path / "bad")
