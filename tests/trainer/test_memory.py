"""xrpo.trainer.memory: the static part of the estimate is exact (weights, gradients and AdamW state of a real model,
full fine-tuning and LoRA), and the per-micro-batch activations are checked against what autograd really saves."""

from __future__ import annotations

import copy

import pytest
import torch

from xrpo.trainer import memory
from xrpo.trainer.logprobs import completion_logprobs
from xrpo.trainer.update import checkpointing


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def one_adamw_step(model):
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=1e-3)
    out = model(torch.tensor([[5, 6, 7, 8]])).logits
    out.float().logsumexp(-1).sum().backward()
    opt.step()
    return trained, opt


def state_bytes(opt) -> int:
    return sum(nbytes([s["exp_avg"], s["exp_avg_sq"]]) for s in opt.state.values())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_static_memory_is_exact_for_full_fine_tuning(tiny_model, dtype):
    model = copy.deepcopy(tiny_model).to(getattr(torch, dtype))
    trained, opt = one_adamw_step(model)
    e = memory.estimate_memory(
        memory.model_shape(model),
        dtype=dtype,
        param_dtype=dtype,
        lora=False,
        kl=True,
        micro_batch_tokens=64,
        completion_tokens=32,
        gradient_checkpointing=False,
        logprob_chunk_tokens=None,
    )
    assert e.weights == nbytes(model.parameters()) == e.reference
    assert e.gradients == nbytes(p.grad for p in trained)
    assert e.optimizer == state_bytes(opt)
    assert e.autocast == 0


def test_static_memory_is_exact_with_lora(tiny_model):
    pytest.importorskip("peft")
    from xrpo.models.lora import apply_lora

    model = apply_lora(copy.deepcopy(tiny_model).to(torch.bfloat16), rank=4, alpha=8.0)
    trained, opt = one_adamw_step(model)
    assert {p.dtype for p in trained} == {torch.float32}  # peft keeps adapters in float32
    e = memory.estimate_memory(
        memory.model_shape(model),
        dtype="bfloat16",
        param_dtype="bfloat16",
        lora=True,
        kl=True,
        micro_batch_tokens=64,
        completion_tokens=32,
        gradient_checkpointing=False,
        logprob_chunk_tokens=None,
    )
    assert e.weights == nbytes(model.parameters())
    assert e.gradients == nbytes(p.grad for p in trained)
    assert e.optimizer == state_bytes(opt)
    assert e.reference == 0  # the base model with adapters disabled: no copy


def test_hand_computed_micro_batch_terms():
    s = memory.ModelShape(
        n_params=1000, hidden=8, intermediate=16, layers=2, vocab=50, q_dim=8, kv_dim=4, lora_params=0
    )
    # per token per layer, c = 4: norms 2*(8*4 + 8*4) = 128; attention (8+4)*4 + (16+8)*4 + 8*4 = 48+96+32 = 176;
    # MLP 5*16*4 = 320 -> 624 bytes
    assert memory.layer_saved_bytes_per_token(s, 4) == 624
    kw = dict(dtype="float32", param_dtype="float32", lora=False, kl=False, micro_batch_tokens=10, completion_tokens=6)
    e = memory.estimate_memory(s, gradient_checkpointing=False, logprob_chunk_tokens=None, **kw)
    assert e.activations == 10 * 2 * 624
    # logits: 10*50*4 (all positions) + 6*50*(4+4+4) (gathered, float32, log-softmax), and backward's 10*50*4 + 6*50*4
    assert e.logits == 2000 + 3600 + 2000 + 1200
    assert memory.logits_bytes(s, 4, 10, 6, None) == (2000 + 3600, 2000 + 1200)
    e = memory.estimate_memory(s, gradient_checkpointing=True, logprob_chunk_tokens=4, **kw)
    assert e.activations == 10 * (2 * 8 * 4 + 624)  # each layer's input, plus one layer recomputed
    assert e.logits == 2 * 4 * 50 * 12 + 10 * 8 * 4  # one chunk, forward and backward; the final hidden states


def saved_bytes(model, prompts, comps, chunk, ckpt) -> int:
    """Bytes of the tensors autograd saves for the backward pass of one forward (parameters excluded, each storage
    once)."""
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), checkpointing(model, ckpt):
        completion_logprobs(model, prompts, comps, 0, 1.0, chunk)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(v for ptr, v in seen.items() if ptr not in params)


def test_activation_estimate_against_what_autograd_saves(larger_model):
    # measured, not assumed: the decoder's saved tensors of a 4 x 64-token micro-batch (chunked log-probs, so the
    # output projection saves almost nothing) are within 25% of the estimate; with checkpointing the forward keeps
    # each layer's input (the estimate's remainder is the one layer recomputed during the backward pass)
    model = copy.deepcopy(larger_model).float()
    prompts, comps = [[5] * 20] * 4, [[7] * 44] * 4
    shape = memory.model_shape(model)
    kw = dict(dtype="float32", param_dtype="float32", lora=False, kl=False, micro_batch_tokens=256)
    est = memory.estimate_memory(
        shape, completion_tokens=176, gradient_checkpointing=False, logprob_chunk_tokens=16, **kw
    )
    measured = saved_bytes(model, prompts, comps, 16, False)
    assert 0.8 < measured / est.activations < 1.25, (measured, est.activations)
    ckpt = copy.deepcopy(model)
    ckpt.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    est = memory.estimate_memory(
        shape, completion_tokens=176, gradient_checkpointing=True, logprob_chunk_tokens=16, **kw
    )
    measured = saved_bytes(ckpt, prompts, comps, 16, True)
    inputs = 256 * shape.layers * shape.hidden * 4
    assert inputs <= measured < est.activations, (inputs, measured, est.activations)


def test_format_names_every_component_and_warns_past_the_device():
    e = memory.MemoryEstimate(*(memory.GIB,) * 8)
    text = memory.format_estimate(e, device_bytes=4 * memory.GIB)
    for word in ("weights", "gradients", "optimizer", "reference", "activations", "logits", "vLLM", "total 8.00"):
        assert word in text
    assert "exceeds the device" in text
    assert "exceeds" not in memory.format_estimate(e, device_bytes=16 * memory.GIB)


def test_the_micro_batch_is_what_the_step_can_fill():
    # SmolLM2-135M's run: 24 rollouts of a 40-token prompt and 96 completion tokens fit one 8,192-token micro-batch
    # of 24 x 136 = 3,264 tokens (2,304 of them completions); filling the budget with 256-token prompts said 23 rows
    # x 352 = 8,096
    assert memory.largest_micro_batch(8192, 24, 40, 96) == (24 * 136, 24 * 96)
    assert memory.largest_micro_batch(8192, 128, 40, 96) == (60 * 136, 60 * 96)  # 8192 // 136 = 60 rows
    assert memory.largest_micro_batch(100, 24, 40, 96) == (136, 96)  # a row longer than the budget goes alone
    # the update's own packing never makes a larger one
    from xrpo.trainer.logprobs import micro_batches

    lengths = [40 + 96] * 20 + [30 + 96] * 4
    largest = max(len(b) * max(lengths[i] for i in b) for b in micro_batches(lengths, 8192))
    assert largest <= memory.largest_micro_batch(8192, 24, 40, 96)[0]


CHILD = """
import json, sys
import torch


def status(field):  # this process's own memory figures (kB in /proc/self/status)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))



torch.set_num_threads(1)
# the first forward / backward / AdamW step loads torch's CPU kernels: done on a toy model before the baseline
toy = torch.nn.Linear(64, 64)
toy(torch.randn(8, 64)).logsumexp(-1).sum().backward()
torch.optim.AdamW(toy.parameters()).step()
from transformers import LlamaConfig, LlamaForCausalLM
from xrpo.algo.losses import get_policy_loss
from xrpo.rollout.records import RolloutRecord
from xrpo.trainer import memory
from xrpo.trainer.config_loader import build_config
from xrpo.trainer.setup import memory_estimate
from xrpo.trainer.update import Policy, UpdateBatch, old_logprobs, policy_update
rows, prompt, completion = 12, 40, 96
# getrusage's ru_maxrss is kept across exec (a child of a large pytest worker starts at the worker's size): the
# high-water mark of this process's own memory is reset here instead (clear_refs 5) and read back at the end
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS")
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(hidden_size=128, intermediate_size=352, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=16000, tie_word_embeddings=False)).eval()
cfg = build_config(None, ["method.name=grpo", "method.kl_coef=0", f"rollout.rollouts_per_step={rows}",
    "rollout.prompts_per_step=4", "method.n_base=2", f"rollout.max_new_tokens={completion}",
    "optim.old_logprobs=recompute"])
g = torch.Generator().manual_seed(1)
recs = []
for i in range(rows):
    p = torch.randint(5, 16000, (prompt,), generator=g).tolist()
    c = torch.randint(5, 16000, (completion,), generator=g).tolist()
    recs.append(RolloutRecord(i % 4, i % 4, 0, False, p, p, c, [0.0] * completion, "length", ""))
policy = Policy(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-5),
    loss_fn=get_policy_loss("vanilla"), pad_id=0)
adv = torch.tensor([1.0 if i % 2 else -1.0 for i in range(rows)])
for step in (1, 2):  # the second update holds AdamW's state through its passes: the run's peak
    old, _, _ = old_logprobs(policy, recs, cfg, step)
    policy_update(policy, UpdateBatch(recs, adv, old, None), cfg, step)
peak = status("VmHWM") - before
est, _ = memory_estimate(cfg, model, prompt)
per_token = 4 * memory.layer_saved_bytes_per_token(memory.model_shape(model), 4)  # 4 layers, float32
print(json.dumps({"peak": peak, "layers": 4, "vocab": 16000, "tokens": est.activations // per_token, **{
    k: getattr(est, k) for k in ("weights", "gradients", "optimizer", "activations", "logits", "training_peak")}}))
"""


def test_the_estimate_against_the_measured_peak_of_two_updates():
    # a fresh process (its peak resident set is the measure) runs two updates of 12 rollouts of 40 + 96 tokens (the
    # shape of a short run's step: it does not fill the 8,192-token budget) on a small random Llama, against the
    # trainer's own estimate (xrpo.trainer.setup.memory_estimate)
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    # at the end of a forward these are all held (gradients are set to None before each mini-batch), and every
    # position's logits (float32) of the estimated micro-batch: the peak, which counts every resident byte, cannot be
    # below them
    live = r["weights"] + r["optimizer"] + r["activations"] + r["tokens"] * r["vocab"] * 4
    # the estimate counts everything that can be held at once (gradients, the log-softmax's copies and the
    # backward's logits gradients too); what it leaves out is the backward's transient buffers of one layer (at most
    # one layer's saved activations) and what the allocator keeps of freed memory (64 MiB)
    slack = r["activations"] // r["layers"] + 64 * 2**20
    assert live <= r["peak"] <= r["training_peak"] + slack, r
