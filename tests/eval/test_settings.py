"""xrpo.eval.settings: every default of an evaluation filled in, from the model's run or the trainer's defaults."""

from __future__ import annotations

import dataclasses

import pytest

from xrpo.eval.config import EvalConfig
from xrpo.eval.model import resolve_model
from xrpo.eval.settings import PROMPT_TEMPLATES, resolve_settings
from xrpo.eval.store import SAMPLE_SETTINGS, SETTINGS_VERSION


def test_the_built_in_model_takes_the_training_defaults():
    cfg = EvalConfig(n=8)
    s = resolve_settings(cfg, resolve_model("default"), 8)
    run = resolve_model("default").run
    assert s["version"] == SETTINGS_VERSION and set(SAMPLE_SETTINGS) <= set(s)
    assert (s["model"], s["checkpoint"], s["run_dir"]) == ("default", None, None)  # not a local path: as named
    assert s["prompt_template"] == "Q: {prompt}\nA:"
    assert (s["max_new_tokens"], s["max_prompt_tokens"]) == (run.max_new_tokens, run.max_prompt_tokens)
    assert (s["dtype"], s["verifier"], s["verifier_args"], s["stop"]) == ("float32", "math", {}, list(run.stop))
    assert (s["temperature"], s["top_p"], s["n"], s["chunk_size"]) == (1.0, 0.95, 8, 64)  # 512 // 8
    assert (s["icl_corpus"], s["icl_k"], s["icl_style"], s["embedder"]) == (None, None, None, None)
    assert s["batch_size"] == run.max_batch_size


def test_another_model_and_the_options_that_override(tmp_path):
    rm = resolve_model(str(tmp_path))  # a directory that is not a run: loaded as a model, trainer defaults
    s = resolve_settings(EvalConfig(), rm, 32)
    assert s["model"] == str(tmp_path.resolve())
    assert (s["prompt_template"], s["max_new_tokens"], s["max_prompt_tokens"]) == ("{prompt}", 2048, 4096)
    s = resolve_settings(
        EvalConfig(
            prompt_template="boxed",
            max_new_tokens=5,
            greedy=True,
            stop=["\n"],
            seed=3,
            verifier_args="{timeout: 2}",
            engine="vllm",
            dtype="bfloat16",
        ),
        rm,
        1,
    )
    assert s["prompt_template"] == PROMPT_TEMPLATES["boxed"]
    assert (s["max_new_tokens"], s["temperature"], s["top_p"], s["stop"], s["seed"]) == (5, 0.0, 1.0, ["\n"], 3)
    assert (s["verifier_args"], s["engine"], s["chunk_size"], s["dtype"]) == ({"timeout": 2}, "vllm", 4096, "bfloat16")
    # a run's own settings win over the defaults; the options over both
    run = dataclasses.replace(rm.run, prompt_template="Problem: {prompt}", max_batch_size=7, dtype="bfloat16")
    s = resolve_settings(EvalConfig(), dataclasses.replace(rm, run=run), 4)
    assert (s["prompt_template"], s["batch_size"], s["dtype"]) == ("Problem: {prompt}", 7, "bfloat16")
    s = resolve_settings(EvalConfig(batch_size=3, dtype="float32"), dataclasses.replace(rm, run=run), 4)
    assert (s["batch_size"], s["dtype"]) == (3, "float32")


def test_errors(tmp_path):
    rm = resolve_model("default")
    with pytest.raises(ValueError, match="--prompt-template must contain {prompt} or be one of"):
        resolve_settings(EvalConfig(prompt_template="Q:"), rm, 4)
    with pytest.raises(FileNotFoundError, match="--icl-corpus .*nope.jsonl does not exist"):
        resolve_settings(EvalConfig(icl_corpus=str(tmp_path / "nope.jsonl")), rm, 4)
    with pytest.raises(ValueError, match="--verifier-args must be a YAML mapping"):
        resolve_settings(EvalConfig(verifier_args="[1, 2]"), rm, 4)
