"""xrpo.eval.model: MODEL resolved to the weights and the training settings that supply eval's defaults. Run and
checkpoint directories end to end: tests/eval/test_evaluate.py::test_run_and_checkpoint_directories."""

from __future__ import annotations

import dataclasses

import pytest

from xrpo.eval.model import RunDefaults, resolve_model, run_defaults
from xrpo.rundir.fields import field_docs
from xrpo.trainer.config_loader import build_config

# the setting each field of RunDefaults documents itself as: the docstring's first word
_documented = {name: doc.split()[0].rstrip(".:") for name, doc in field_docs(RunDefaults).items()}


def test_run_defaults_are_the_training_config():
    cfg = build_config(
        None,
        [
            "model.dtype=bfloat16",
            "model.system_prompt=hi",
            "data.n_heldout=7",
            "seed=5",
            "rollout.max_new_tokens=9",
            "rollout.stop=[END]",
            "rollout.icl_style=paper",
            "rollout.icl_fewshot_position=question",
            "rollout.vllm_kv_cache_gib=2.5",
            "data.verifier_args={timeout: 3}",
        ],
    )
    run = run_defaults(cfg)
    # every field holds the setting named in its docstring ("model.dtype.", "seed (...)")
    for f in dataclasses.fields(RunDefaults):
        name = _documented[f.name]
        owner = cfg
        for part in name.split(".")[:-1]:
            owner = getattr(owner, part)
        want = getattr(owner, name.split(".")[-1])
        assert getattr(run, f.name) == (tuple(want) if isinstance(want, list) else want), f.name
    assert (run.dtype, run.system_prompt, run.n_heldout, run.seed) == ("bfloat16", "hi", 7, 5)
    assert (run.max_new_tokens, run.stop, run.icl_style, run.vllm_kv_cache_gib) == (9, ("END",), "paper", 2.5)
    assert run.verifier_args == {"timeout": 3} and run.icl_fewshot_position == "question"
    assert run.verifier_args is not cfg.data.verifier_args  # eval never changes the run's config


def test_a_name_that_is_not_a_run(tmp_path):
    rm = resolve_model("default")
    assert (rm.spec, rm.load_path, rm.run_dir, rm.checkpoint, rm.run.model_path) == (
        "default",
        "default",
        None,
        None,
        "default",
    )
    (tmp_path / "config.yaml").write_text("steps: 1\n")
    with pytest.raises(FileNotFoundError, match="a run directory without checkpoints/"):
        resolve_model(str(tmp_path))
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(FileNotFoundError, match="the run directory has no complete checkpoint"):
        resolve_model(str(tmp_path))
