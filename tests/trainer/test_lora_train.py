"""LoRA in the trainer (model.lora_rank > 0): only the adapters train and are checkpointed, the KL reference is the
base model with the adapters disabled, a resumed run continues exactly, and a LoRA run's checkpoint loads for
evaluation as the merged model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from xrpo.trainer.config_loader import build_config
from xrpo.trainer.loop import train

pytest.importorskip("peft")

RANK, ALPHA = 4, 8.0


def quiet(*_):
    pass


def lora_overrides(env, out, steps, *extra):
    return env["overrides"](out, "xrpo", steps) + [
        f"model.lora_rank={RANK}",
        f"model.lora_alpha={ALPHA}",
        "method.kl_coef=0.05",
        "save_every=1",
        "keep_last=5",
        *extra,
    ]


def ckpt(out, step):
    return out / "checkpoints" / f"step-{step:08d}"


def test_only_adapters_train_are_checkpointed_and_the_reference_is_the_base(trainer_env, tmp_path):
    out = tmp_path / "run"
    train(build_config(None, lora_overrides(trainer_env, out, 2)), log=quiet)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # step 1: B = 0, so the policy is exactly the base model, and the reference is the base model (adapters
    # disabled): the KL estimate is 0 to the last bit; at step 2 the adapters have moved, and so has the KL
    assert rows[0]["loss/kl"] == 0.0 and rows[1]["loss/kl"] > 0.0
    files = sorted(p.name for p in (ckpt(out, 2) / "model").iterdir())
    assert "adapter_config.json" in files and "adapter_model.safetensors" in files
    assert "model.safetensors" not in files  # no copy of the frozen base
    adapters = load_file(str(ckpt(out, 2) / "model" / "adapter_model.safetensors"))
    assert adapters and all("lora_" in k for k in adapters)
    # the base model is "all-linear" adapted: every linear layer but the head has A and B
    assert any("lora_B" in k for k in adapters) and any(v.abs().sum() > 0 for k, v in adapters.items() if "lora_B" in k)
    # the optimiser holds state for the adapters only
    opt = torch.load(ckpt(out, 2) / "optimizer.pt", weights_only=False)
    n_state = sum(v["exp_avg"].numel() for v in opt["state"].values())
    assert n_state == sum(v.numel() for v in adapters.values())


def test_resumed_lora_run_continues_exactly(trainer_env, tmp_path):
    full = tmp_path / "full"
    train(build_config(None, lora_overrides(trainer_env, full, 3)), log=quiet)
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    shutil.rmtree(ckpt(cut, 3))  # as if killed after step 2's checkpoint
    train(build_config(None, lora_overrides(trainer_env, cut, 3)), resume=str(cut), log=quiet)
    a = load_file(str(ckpt(full, 3) / "model" / "adapter_model.safetensors"))
    b = load_file(str(ckpt(cut, 3) / "model" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_lora_checkpoint_loads_as_the_merged_model(trainer_env, tmp_path):
    from xrpo.models.loading import load_model

    out = tmp_path / "run"
    train(build_config(None, lora_overrides(trainer_env, out, 2)), log=quiet)
    merged, tok, src = load_model(str(ckpt(out, 2) / "model"), device="cpu", log=quiet)
    assert not hasattr(merged, "peft_config")  # a plain transformers model, as evaluation expects
    # the reference twin: the base weights plus (alpha / r) B @ A, read from the files themselves
    base = load_file(str(trainer_env["model"] / "model.safetensors"))
    ad = load_file(str(ckpt(out, 2) / "model" / "adapter_model.safetensors"))
    want = dict(base)
    for k in ad:
        if ".lora_A." in k:
            name = k.split("base_model.model.", 1)[1].replace(".lora_A.weight", ".weight")
            want[name] = base[name] + (ALPHA / RANK) * ad[k.replace("lora_A", "lora_B")] @ ad[k]
    got = merged.state_dict()
    changed = 0
    for name, w in want.items():
        # the same product and sum in float32 (peft: B @ A * scaling, then added): rounding-level differences only
        torch.testing.assert_close(got[name], w, rtol=1e-6, atol=1e-7)
        changed += not torch.equal(w, base[name])
    assert changed > 0
    assert tok.pad_token_id is not None


def test_xrpo_eval_of_a_lora_run(trainer_env, tmp_path):
    # the user's path: `xrpo eval RUN_DIR data` on a LoRA run evaluates its latest checkpoint, merged into its base
    from xrpo.cli import main

    out = tmp_path / "run"
    train(build_config(None, lora_overrides(trainer_env, out, 2)), log=quiet)
    res = tmp_path / "eval"
    args = ["eval", str(out), str(trainer_env["heldout"]), "--n", "2", "--k", "1", "--max-new-tokens", "6"]
    rc = main([*args, "--verifier", "parity_verifier:verify", "--output", str(res)])
    assert rc == 0
    results = json.loads((res / "results.json").read_text())
    assert results["settings"]["model"].endswith("step-00000002/model")  # the run's latest (adapter) checkpoint
    assert "pass@1" in json.dumps(results["average"])
