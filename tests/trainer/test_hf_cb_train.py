"""`xrpo train rollout.engine=hf-cb rollout.planner=streaming`: XRPO's planning waves on transformers' continuous
batching, through the trainer's public entry point."""

from __future__ import annotations

import json
import math

from tests.trainer.conftest import base_overrides
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
    overrides += [
        "rollout.engine=hf-cb",
        "rollout.planner=streaming",
        "rollout.stream_quorum=0.25",
        "rollout.prompts_per_step=4",
        "rollout.rollouts_per_step=20",
        "rollout.max_new_tokens=12",
        # frequent characters of the tiny model's vocabulary end completions at various steps, so groups complete
        # at different engine steps (with every completion at the length limit, all would complete at once)
        "rollout.stop=['=', '+', '?', '{']",
        "threads=1",
    ]
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        summary = loop.train(build_config(None, [f"output={out}", *overrides]), log=quiet)
        assert summary["steps"] == 2
        runs.append(out)
    assert len(engines) == 2 and all(isinstance(e, HFCBEngine) for e in engines)
    metrics = [json.loads(x) for x in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert math.isfinite(m["loss/policy"]) and m["rollout/count"] == 20
    rounds = [json.loads(x) for x in (runs[0] / "rounds.jsonl").read_text().splitlines()]
    for step in (1, 2):
        waves = [r for r in rounds if r["step"] == step]
        assert sum(sum(r["alloc"]) for r in waves) == 20 and waves[0]["alloc"] == [2, 2, 2, 2]
        for t in (1, 2):  # every prompt is planned once per round of Algorithm 1
            assert sorted(q for r in waves[1:] if r["stage"] == t for q in r["members"]) == [0, 1, 2, 3]
    # some wave went in while other requests were decoding: the engine admitted it into the running batch
    assert any(r.get("in_flight", 0) > 0 for r in rounds)
    # a seed gives the same run: the engine counts completion in engine steps, and draws each rollout with its key
    for name in ("metrics.jsonl", "rounds.jsonl"):
        a = [json.loads(x) for x in (runs[0] / name).read_text().splitlines()]
        b = [json.loads(x) for x in (runs[1] / name).read_text().splitlines()]
        strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]  # noqa: E731
        assert strip(a) == strip(b)
    assert (runs[0] / "samples.jsonl").read_text() == (runs[1] / "samples.jsonl").read_text()
