from __future__ import annotations

from dataclasses import fields

import pytest

from xrpo.algo.presets import get_preset, list_presets
from xrpo.trainer.config import (
    SECTIONS, MethodConfig, TrainConfig, build_config, field_docs, from_dict, help_text, to_dict,
)


def test_every_field_has_a_docstring_in_help():
    text = help_text()
    for cls in [TrainConfig, *SECTIONS.values()]:
        docs = field_docs(cls)
        for f in fields(cls):
            if f.name in SECTIONS:
                continue
            assert docs.get(f.name), f"{cls.__name__}.{f.name} has no docstring"
            assert f.name in text


def test_presets_set_every_method_knob_and_overrides_win():
    for name in list_presets():
        cfg = build_config(None, [f"method.name={name}"])
        for knob, value in get_preset(name).items():
            assert getattr(cfg.method, knob) == value, (name, knob)
    cfg = build_config(None, ["method.name=grpo", "method.kl_coef=0", "method.clip_high=0.3"])
    assert cfg.method.kl_coef == 0.0 and cfg.method.clip_high == 0.3
    assert cfg.method.allocation == get_preset("grpo")["allocation"]
    # every preset knob is a MethodConfig field
    knobs = {f.name for f in fields(MethodConfig)} - {"name"}
    assert set(get_preset("xrpo")) <= knobs


def test_yaml_file_and_precedence(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("steps: 7\nmethod:\n  name: dapo\n  max_gen_batches: 5\noptim:\n  lr: 1.0e-5\n")
    cfg = build_config(str(p), ["optim.lr=3e-5"])
    assert cfg.steps == 7 and cfg.method.name == "dapo" and cfg.method.dynamic_sampling is True
    assert cfg.method.max_gen_batches == 5 and cfg.optim.lr == 3e-5


def test_round_trip():
    cfg = build_config(None, ["method.name=gspo", "eval_k=[1,2]", "data.prompt_template=Q: {prompt}\nA:"])
    assert from_dict(to_dict(cfg)) == cfg
    assert cfg.data.prompt_template == "Q: {prompt}\nA:"


@pytest.mark.parametrize("override, match", [
    ("stepz=3", "unknown config key 'stepz'"),
    ("optim.lrr=3", r"optim has fields \[.*'lr'"),
    ("foo.bar=1", "SECTION.FIELD"),
    ("steps=abc", "config field steps expects int"),
    ("method.icl=maybe", "expects true/false"),
    ("method.n_base=1", "method.n_base must be >= 2"),
    ("method.alpha=1.5", r"method.alpha=1.5: alpha is the significance level"),
    # the paper's sensitivity table writes the confidence level as alpha: 0.95 means alpha = 0.05
    ("method.alpha=0.95", r"must lie in \(0, 0.5\).*alpha = 0.95 there is alpha = 0.05 here"),
    ("method.alpha=0.5", r"must lie in \(0, 0.5\)"),
    ("rollout.temperature=0", r"rollout.temperature must be > 0"),
    ("rollout.temperature=0.7 & optim.old_logprobs=reuse", "optim.old_logprobs must be auto or recompute"),
    ("method.icl_novelty=both", "method.icl_novelty must be train, sample or exclude"),
    ("rollout.rollouts_per_step=10", "must be >= method.n_base x rollout.prompts_per_step = 64"),
    ("method.name=nope", "unknown"),
    ("eval_k=[1,64]", "every k must be in"),
    ("optim.schedule=linear", "optim.schedule must be constant or cosine"),
    ("data.prompt_template=no placeholder", "must contain {prompt}"),
    ("novalue", "not of the form key=value"),
])
def test_bad_values_name_the_field(override, match):
    with pytest.raises(ValueError, match=match):
        build_config(None, override.split(" & "))


def test_alpha_below_one_half_is_accepted_everywhere_it_is_configured():
    from xrpo.rollout.planner import PlanConfig

    assert build_config(None, ["method.alpha=0.49"]).method.alpha == 0.49
    assert PlanConfig(alpha=0.1).alpha == 0.1
    with pytest.raises(ValueError, match=r"alpha=0.95: alpha is the significance level"):
        PlanConfig(alpha=0.95)


def test_missing_config_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_config(str(tmp_path / "nope.yaml"))
