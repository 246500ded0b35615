"""The memory features and the trainer on a CUDA GPU (skipped without one; run by benchmarks/gpu_check.sh).

What CPU tests prove on the CPU is checked again where users train: the HF and continuous-batching engines' sampling
log-probs against the trainer's recompute (float32, and bfloat16 mixed precision), chunked log-probs and gradient
checkpointing against the plain forward, LoRA's adapted model against its merged weights, and a checkpoint written on
the GPU resumed on a CPU-only process."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from xrpo.trainer.config_loader import build_config
from xrpo.trainer.logprobs import completion_logprobs
from xrpo.trainer.loop import train
from xrpo.trainer.update import Policy, checkpointing

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PROMPTS = ["Q: 3 + 4 = ?\nA:", "Q: 12 + 13 = ?\nA:", "Q: 7\nA:"]


def quiet(*_):
    pass


def rows(n=5):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 400, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g).tolist()]
    prompts += [torch.randint(3, 400, (k,), generator=g).tolist() for k in (1, 4, 9, 3)[: n - 1]]
    comps = [torch.randint(3, 400, (k,), generator=g).tolist() for k in (3, 7, 1, 5, 2)[:n]]
    return prompts, comps


@pytest.mark.parametrize("engine_kind", ["hf", "hf-cb"])
@pytest.mark.parametrize("dtype,atol_max,atol_mean", [("float32", 1e-4, 1e-5), ("bfloat16", 0.1, 0.02)])
def test_engine_logprobs_match_the_trainers_recompute(
    tiny_model, tiny_tokenizer, dtype, atol_max, atol_mean, engine_kind
):
    # float32: a KV-cached decode against one full forward, float32 sums in other orders (TF32 is off by default
    # for matmuls): ~1e-6 on log-probs of size < 10, bounded at 1e-4. bfloat16 (mixed precision: float32 weights,
    # autocast): bfloat16's unit roundoff 2^-8 on logits of size < 8 gives ~0.03 per logit, so up to ~0.1 on a
    # log-prob and ~0.02 on average; a wrong prompt, position or temperature is off by order 1.
    # (the same bounds hold for the continuous-batching engine: a paged decode against one full forward)
    from xrpo.rollout.build import build_engine
    from xrpo.rollout.engine import SamplingParams

    model = copy.deepcopy(tiny_model).cuda().eval()
    auto = None if dtype == "float32" else torch.bfloat16
    engine = build_engine(
        engine_kind, tiny_tokenizer, model=model, max_seq_len=64, autocast_dtype=None if auto is None else dtype
    )
    out = engine.generate(PROMPTS, [4, 4, 4], SamplingParams(max_new_tokens=16, seed=0))
    flat = [r for rs in out for r in rs]
    policy = Policy(model, None, None, tiny_tokenizer.pad_token_id, autocast_dtype=auto)
    got = policy.logprobs(model, [r.prompt_ids for r in flat], [r.completion_ids for r in flat], 4096, 1.0)
    diffs = torch.cat([(torch.tensor(g) - torch.tensor(r.logprobs)).abs() for g, r in zip(got, flat)])
    assert diffs.max() < atol_max and diffs.mean() < atol_mean, (diffs.max(), diffs.mean())


def test_chunked_logprobs_and_checkpointing_equal_the_plain_forward_on_cuda(larger_model, tiny_tokenizer):
    # float64 on the GPU, as the CPU twins in test_logprobs / test_update (same bounds and reasons)
    model = copy.deepcopy(larger_model).cuda()
    prompts, comps = rows()
    pad = tiny_tokenizer.pad_token_id

    def run(m, chunk, ckpt):
        m.zero_grad(set_to_none=True)
        with checkpointing(m, ckpt):
            lp, mask = completion_logprobs(m, prompts, comps, pad, 0.8, chunk)
        (lp * mask).sum().backward()
        return lp.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}

    lp0, g0 = run(model, None, False)
    lp1, g1 = run(model, 3, False)
    ck = copy.deepcopy(model)
    ck.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lp2, g2 = run(ck, None, True)
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-6)
    torch.testing.assert_close(lp2, lp0, rtol=0, atol=1e-6)
    for n in g0:
        for g in (g1, g2):
            assert ((g[n] - g0[n]).norm() / g0[n].norm().clamp_min(1e-300)).item() < 1e-6, n


def test_lora_adapted_model_equals_its_merged_weights_on_cuda(tiny_model):
    pytest.importorskip("peft")
    from xrpo.models import lora

    model = lora.apply_lora(copy.deepcopy(tiny_model).double().cuda(), rank=4, alpha=8.0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    merged = copy.deepcopy(tiny_model).double().cuda()
    merged.load_state_dict(lora.inference_state_dict(model))
    ids = torch.tensor([[5, 6, 7, 8, 9]], device="cuda")
    with torch.no_grad():
        # float64: W x + s B (A x) against (W + s B A) x, ~1e-15 relative
        torch.testing.assert_close(model(ids).logits, merged(ids).logits, rtol=1e-10, atol=1e-10)


def test_a_checkpoint_written_on_the_gpu_resumes_on_a_cpu(trainer_env, tmp_path):
    out = tmp_path / "run"
    ov = trainer_env["overrides"](out, "xrpo", 2) + ["save_every=1", "keep_last=3"]
    train(build_config(None, ov), log=quiet)
    shutil.rmtree(out / "checkpoints" / "step-00000002")
    root, run_dir = str(trainer_env["root"]), str(out)
    code = (
        f"import sys, torch; sys.path.insert(0, {root!r}); assert not torch.cuda.is_available();"
        "from xrpo.trainer.loop import train;"
        f"s = train(None, resume={run_dir!r}, log=lambda *_: None); print(s['steps'])"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "2"
    state = json.loads((out / "checkpoints" / "step-00000002" / "state.json").read_text())
    assert state["step"] == 2
    assert Path(out / "checkpoints" / "step-00000002" / "model" / "model.safetensors").exists()
