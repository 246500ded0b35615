"""Errors before work: a config whose mistake needs no model to see fails before any data or model is loaded (the
loaders are replaced by ones that fail the test), with a message naming the field; `xrpo train` prints it as one
line and writes nothing."""

from __future__ import annotations

import importlib.util
import socket

import pytest

import xrpo.trainer.loop as loop
import xrpo.trainer.setup as setup
from xrpo.cli import main
from xrpo.trainer.config_loader import build_config, to_dict
from xrpo.trainer.loop import train


@pytest.fixture
def no_loading(monkeypatch):
    def fail(*_, **__):
        raise AssertionError("data or a model was loaded before the config's checks")

    for module, name in ((setup, "load_data"), (setup, "load_model"), (loop, "build_engine")):
        monkeypatch.setattr(module, name, fail)


BAD = [
    ("model.path={tmp}/nonexistent", FileNotFoundError, r"model.path .*/nonexistent does not exist"),
    ("model.path=package:no_such_package_xrpo", FileNotFoundError, r"model.path package:no_such_package_xrpo"),
    ("data.verifier=nope", ValueError, r"data.verifier='nope': unknown verifier 'nope'; registered: .*math"),
    ("data.verifier=no_such_module_xrpo:verify", ValueError, r"data.verifier='no_such_module_xrpo:verify'"),
    ("data.train={tmp}/missing.jsonl", FileNotFoundError, r"data.train .*/missing.jsonl does not exist"),
    ("data.heldout={tmp}/missing.jsonl", FileNotFoundError, r"data.heldout .*/missing.jsonl does not exist"),
    ("rollout.icl_corpus={tmp}/corpus.jsonl", FileNotFoundError, r"rollout.icl_corpus .*/corpus.jsonl does not"),
    ("report_to=[wandb,nope]", ValueError, r"report_to: unknown tracker 'nope'; valid: mlflow, tensorboard, wandb"),
    ("report_to=[tensorboard]", ValueError, r"report_to names tensorboard while tensorboard is false"),
]


@pytest.mark.parametrize("override, error, message", BAD)
def test_a_bad_field_fails_before_anything_is_loaded(trainer_env, tmp_path, no_loading, override, error, message):
    out = tmp_path / "run"
    ov = trainer_env["overrides"](out, "xrpo", steps=1) + [override.format(tmp=tmp_path)]
    with pytest.raises(error, match=message):
        train(build_config(None, ov), log=lambda *_: None)
    assert not out.exists()  # nothing written: the same output works once the field is fixed


def test_a_sentence_transformers_embedder_that_cannot_be_had_fails_before_anything_loads(
    trainer_env, tmp_path, no_loading, monkeypatch
):
    pytest.importorskip("sentence_transformers")
    from huggingface_hub import constants

    with socket.socket() as s:  # a port nothing listens on: the hub cannot be reached
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for embedder, message in (
        (f"{tmp_path}/embedder", r"rollout.embedder .*/embedder does not exist"),
        ("someone/embedder", r"rollout.embedder someone/embedder is not a local directory, not in the hub cache"),
    ):
        ov = trainer_env["overrides"](tmp_path / "run", "xrpo", steps=1) + [f"rollout.embedder={embedder}"]
        with pytest.raises(FileNotFoundError, match=message):
            train(build_config(None, ov), log=lambda *_: None)
        assert not (tmp_path / "run").exists()


def test_a_gguf_model_without_its_file_named_fails_before_the_data_loads(trainer_env, tmp_path, no_loading):
    gguf_only = tmp_path / "weights"
    gguf_only.mkdir()
    (gguf_only / "model.Q4_1.gguf").write_bytes(b"GGUF")
    ov = trainer_env["overrides"](tmp_path / "run", "xrpo", steps=1) + [f"model.path={gguf_only}"]
    with pytest.raises(ValueError, match=r"pass the file to load as model.gguf_file, one of: model.Q4_1.gguf"):
        train(build_config(None, ov), log=lambda *_: None)
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_an_engine_whose_extra_is_missing_names_the_extra(trainer_env, tmp_path, no_loading):
    ov = trainer_env["overrides"](tmp_path / "run", "xrpo", steps=1) + ["rollout.engine=vllm"]
    with pytest.raises(ImportError, match=r"rollout.engine=vllm needs vllm, which is not installed: pip install"):
        train(build_config(None, ov), log=lambda *_: None)


def test_the_cli_prints_one_line(trainer_env, tmp_path, no_loading, capsys):
    ov = trainer_env["overrides"](tmp_path / "run", "xrpo", steps=1) + ["data.verifier=nope"]
    assert main(["train", *ov]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("xrpo train: error: data.verifier='nope': unknown verifier")


def test_a_tracker_whose_package_is_missing_names_its_install_command(trainer_env, tmp_path, no_loading):
    """A tracker registered through the public registry whose package is not installed (none is: the name is made
    up), as wandb or mlflow would be on a machine without the trackers extra."""
    from xrpo.trainer.trackers import TRACKERS, Tracker, register_tracker

    @register_tracker("test-missing-package")
    class Missing(Tracker):
        module = "xrpo_no_such_tracker_package"
        install = "pip install 'xrpo[trackers]'"

    try:
        ov = trainer_env["overrides"](tmp_path / "run", "xrpo", steps=1) + ["report_to=[test-missing-package]"]
        with pytest.raises(
            ImportError,
            match=r"report_to=test-missing-package needs xrpo_no_such_tracker_package, which is not installed: "
            r"pip install 'xrpo\[trackers\]'",
        ):
            train(build_config(None, ov), log=lambda *_: None)
        assert not (tmp_path / "run").exists()
    finally:
        del TRACKERS["test-missing-package"]


def test_references_the_verifier_cannot_grade_fail_before_the_model_is_loaded(trainer_env, tmp_path, monkeypatch):
    """The data is needed to see it, the model is not: arithmetic answers given to the code verifier (every rollout
    would score 0) are refused right after the data is read, naming the file and the problems."""

    def fail(*_, **__):
        raise AssertionError("the model was loaded before the references were checked")

    monkeypatch.setattr(setup, "load_policy", fail)
    ov = trainer_env["overrides"](tmp_path / "run", "xrpo", steps=1) + ["data.verifier=code"]
    with pytest.raises(ValueError, match=r"data.train \(.*train\.jsonl\): 24 of 24 reference answers cannot be graded"):
        train(build_config(None, ov), log=lambda *_: None)


def test_train_check_runs_the_checks_and_prints_the_config_it_would_write(trainer_env, tmp_path, no_loading, capsys):
    out = tmp_path / "run"
    ov = trainer_env["overrides"](out, "grpo", steps=3) + ["rollout.max_new_tokens=17"]
    assert main(["train", "--check", *ov]) == 0
    printed = capsys.readouterr().out
    assert not out.exists()  # nothing written, nothing loaded (no_loading)
    # what it prints is the config the run writes, and reads back as a --config file to the same config
    (tmp_path / "checked.yaml").write_text(printed)
    assert to_dict(build_config(str(tmp_path / "checked.yaml"))) == to_dict(build_config(None, ov))
    assert printed.startswith("# xrpo train --check: the checks that need no model or data passed")
    # a field the run would refuse is refused the same way, before anything loads
    assert main(["train", "--check", *ov, f"model.path={tmp_path}/nonexistent"]) == 2
    assert f"model.path {tmp_path}/nonexistent does not exist" in capsys.readouterr().err
    # an output directory that holds another run's checkpoints
    (out / "checkpoints" / "step-00000002").mkdir(parents=True)
    (out / "checkpoints" / "step-00000002" / "COMPLETE").write_text("ok\n")
    assert main(["train", "--check", *ov]) == 2
    assert f"output {out} already holds a run (checkpoints up to step-00000002)" in capsys.readouterr().err
