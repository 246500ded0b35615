"""`xrpo train rollout.engine=hf-cb rollout.planner=streaming`: XRPO's planning waves on transformers' continuous
batching, through the trainer's public entry point."""

from __future__ import annotations

from tests.trainer.conftest import STREAMING_OVERRIDES, base_overrides, check_streamed_runs
from xrpo.trainer.config_loader import build_config


def quiet(*_):
    pass


def test_streaming_planner_trains_on_the_continuous_batching_engine(trainer_env, tmp_path, monkeypatch):
    import xrpo.trainer.loop as loop
    from xrpo.rollout.hf_cb_engine import HFCBEngine

    engines = []
    real_build = loop.build_engine

    def recording_build(cfg, model, tokenizer):
        engines.append(real_build(cfg, model, tokenizer))
        return engines[-1]

    monkeypatch.setattr(loop, "build_engine", recording_build)
    overrides = [o for o in base_overrides(trainer_env, None, "xrpo", steps=2) if not o.startswith("output=")]
    overrides += ["rollout.engine=hf-cb", "threads=1", *STREAMING_OVERRIDES]
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        summary = loop.train(build_config(None, [f"output={out}", *overrides]), log=quiet)
        assert summary["steps"] == 2
        runs.append(out)
    assert len(engines) == 2 and all(isinstance(e, HFCBEngine) for e in engines)
    # the budget spent in waves, one of them admitted into a running batch, and a seed giving the same run: the
    # engine counts completion in engine steps and draws each rollout with its own key
    check_streamed_runs(runs)
