"""Tests for xrpo.algo.presets: completeness, valid values, paper values, exact ablation diffs, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xrpo.algo.losses import AGG_MODES, KL_ESTIMATORS, get_policy_loss, kl_penalty
from xrpo.algo.presets import (
    DEFAULT_SOURCES,
    DEFAULTS,
    KNOB_NAMES,
    PRESETS,
    Knob,
    get_preset,
    list_presets,
    preset_changes,
    preset_sources,
)

# docs/design.md, `presets` paragraph: the fields of xrpo.algo.config's method sections, section by section
DESIGN_KNOBS = (
    "policy_loss clip_low clip_high loss_agg kl_coef kl_estimator"  # LossConfig
    " adv_scale tree_advantage"  # AdvantageConfig
    " allocation n_base plan_rounds alpha lam alloc_mode max_extra_per_prompt group_size_power"
    " knapsack_fallback knapsack_max_n knapsack_window knapsack_min_rewards knapsack_zero_at_floor"  # AllocationConfig
    " icl icl_k"  # ICLConfig
    " sharpen icl_novelty lam_nov kappa_clip full_reward"  # SharpenConfig
    " sampler dynamic_sampling max_gen_batches"  # BatchConfig
    " tree_segment_len tree_max_depth tree_branch tree_init_branch tree_divergence tree_divergence_temp"
    " tree_fallback"  # TreePOConfig
    " cures_prior_alpha cures_prior_beta cures_temp_scale cures_warmup_rollouts cures_min_count"
    " cures_success_threshold"  # CuresConfig
).split()

EXPECTED_PRESETS = {
    "grpo",
    "grpo-deepseekmath",
    "dapo",
    "gspo",
    "dr_grpo",
    "xrpo",
    "xrpo-gspo",
    "xrpo-no-hrp",
    "xrpo-no-icl",
    "xrpo-no-as",
    "xrpo-no-as-icl",
    "treepo-sampling",
    "treepo",
    "cures",
    "knapsack",
    "xrpo-plus",
    "xrpo-plus-sqrt",
    "xrpo-plus-groups",
}


def _is_real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


VALID = {
    "adv_scale": lambda v: v in ("std", "none"),
    "policy_loss": lambda v: v in ("vanilla", "gspo", "gspo_token"),
    "clip_low": lambda v: _is_real(v) and 0 <= v < 1,
    "clip_high": lambda v: _is_real(v) and v >= 0,
    "loss_agg": lambda v: v in AGG_MODES,
    "kl_coef": lambda v: _is_real(v) and v >= 0,
    "kl_estimator": lambda v: v in KL_ESTIMATORS,
    "allocation": lambda v: v in ("uniform", "hrp", "cures", "knapsack", "xrpo-plus"),
    "n_base": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 2,
    "plan_rounds": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
    "alpha": lambda v: _is_real(v) and 0 < v < 0.5,
    "lam": lambda v: _is_real(v) and v >= 0,
    "alloc_mode": lambda v: v in ("proportional", "greedy"),
    "max_extra_per_prompt": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    "group_size_power": lambda v: _is_real(v) and 0 <= v <= 1,
    "knapsack_fallback": lambda v: v in ("authors", "leftover", "jeffreys"),
    "knapsack_max_n": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 2,
    "knapsack_window": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
    "knapsack_min_rewards": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "knapsack_zero_at_floor": lambda v: isinstance(v, bool),
    "full_reward": lambda v: _is_real(v),
    "icl": lambda v: isinstance(v, bool),
    "icl_k": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
    "sharpen": lambda v: isinstance(v, bool),
    "lam_nov": lambda v: _is_real(v) and v >= 0,
    "kappa_clip": lambda v: _is_real(v) and v >= 0,
    "icl_novelty": lambda v: v in ("train", "sample", "exclude"),
    "dynamic_sampling": lambda v: isinstance(v, bool),
    "max_gen_batches": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
    "sampler": lambda v: v in ("independent", "tree"),
    "tree_segment_len": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "tree_max_depth": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
    "tree_branch": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
    "tree_init_branch": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
    "tree_divergence": lambda v: v in ("uniform", "low_logprob", "high_logprob"),
    "tree_divergence_temp": lambda v: _is_real(v) and v > 0,
    "tree_fallback": lambda v: isinstance(v, bool),
    "tree_advantage": lambda v: isinstance(v, bool),
    "cures_prior_alpha": lambda v: _is_real(v) and v > 0,
    "cures_prior_beta": lambda v: _is_real(v) and v > 0,
    "cures_temp_scale": lambda v: _is_real(v) and v > 0,
    "cures_warmup_rollouts": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "cures_min_count": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 2,
    "cures_success_threshold": lambda v: _is_real(v),
}


def test_knob_names_are_the_design_names():
    assert list(KNOB_NAMES) == DESIGN_KNOBS
    assert set(VALID) == set(DESIGN_KNOBS)


def test_preset_names():
    assert set(list_presets()) == EXPECTED_PRESETS
    assert list_presets() == list(PRESETS)


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_every_preset_lists_only_its_changes_with_a_valid_value_and_a_source(name):
    preset = PRESETS[name]
    assert list(preset) == [k for k in DESIGN_KNOBS if k in preset]  # in knob order
    for knob, k in preset.items():
        assert isinstance(k, Knob)
        value, source = k  # a Knob is a (value, source) tuple
        assert VALID[knob](value), f"{name}.{knob} = {value!r}"
        assert value != DEFAULTS[knob], f"{name}.{knob} restates the default"
        assert isinstance(source, str) and len(source) > 20, f"{name}.{knob} has no source"
        assert "inactive" not in source
    assert preset_changes(name) == {knob: k.value for knob, k in preset.items()}
    # every knob resolves: the defaults, then the preset's changes; each with its source
    assert get_preset(name) == {knob: preset[knob].value if knob in preset else DEFAULTS[knob] for knob in DESIGN_KNOBS}
    assert preset_sources(name) == {
        knob: preset[knob].source if knob in preset else DEFAULT_SOURCES[knob] for knob in DESIGN_KNOBS
    }


def test_defaults_are_valid_sourced_and_the_sections_own():
    from dataclasses import fields

    from xrpo.algo.config import METHOD_SECTIONS

    assert DEFAULTS == {f.name: f.default for s in METHOD_SECTIONS for f in fields(s)}
    assert list(DEFAULT_SOURCES) == DESIGN_KNOBS
    for knob, value in DEFAULTS.items():
        assert VALID[knob](value), knob
        assert len(DEFAULT_SOURCES[knob]) > 20, knob


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_preset_runs_through_the_real_loss(name):
    # every preset's loss settings are accepted by the registry, the aggregation and the KL estimator
    p = get_preset(name)
    rng = np.random.default_rng(0)
    old = torch.tensor(rng.normal(-1.0, 0.3, (3, 5)))
    logp = (old + torch.tensor(rng.normal(0.0, 0.1, (3, 5)))).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    loss, metrics = get_policy_loss(p["policy_loss"])(
        logp,
        old,
        torch.tensor([1.0, -0.5, 0.2], dtype=torch.float64),
        mask,
        clip_low=p["clip_low"],
        clip_high=p["clip_high"],
        agg_mode=p["loss_agg"],
        max_tokens=5,
    )
    kl = kl_penalty(logp, old, p["kl_estimator"], mask=mask)
    assert torch.isfinite(loss) and torch.isfinite(kl).all()
    assert set(metrics) >= {"loss/clipfrac_low", "loss/clipfrac_high", "loss/approx_kl"}


def _diff(a: str, b: str) -> set[str]:
    pa, pb = get_preset(a), get_preset(b)
    return {k for k in DESIGN_KNOBS if pa[k] != pb[k]}


@pytest.mark.parametrize(
    ("ablation", "knobs"),
    [
        ("xrpo-no-hrp", {"allocation"}),
        ("xrpo-no-icl", {"icl"}),
        ("xrpo-no-as", {"sharpen"}),
        ("xrpo-no-as-icl", {"icl", "sharpen"}),
        ("xrpo-gspo", {"policy_loss", "clip_low", "clip_high", "loss_agg"}),
    ],
)
def test_ablations_differ_from_xrpo_in_exactly_their_knobs(ablation, knobs):
    assert _diff(ablation, "xrpo") == knobs
    x, a = get_preset("xrpo"), get_preset(ablation)
    if "allocation" in knobs:
        assert a["allocation"] == "uniform"
    if "icl" in knobs:
        assert a["icl"] is False
    if "sharpen" in knobs:
        assert a["sharpen"] is False
    # the changed knobs cite the ablation's own sentence, the unchanged ones XRPO's
    sa, sx = preset_sources(ablation), preset_sources("xrpo")
    for k in DESIGN_KNOBS:
        assert (sa[k] != sx[k]) == (k in knobs), k
    assert x["allocation"] == "hrp"


def test_xrpo_values_from_the_paper():
    p = get_preset("xrpo")
    # XRPO §4.1 Training Setup and §4.3 sensitivity table (alpha written there as confidence 0.95)
    assert p["n_base"] == 4 and p["plan_rounds"] == 2
    assert p["alpha"] == 0.05 and p["lam"] == 0.1
    assert p["icl"] is True and p["icl_k"] == 2
    assert p["sharpen"] is True and p["lam_nov"] == 2.5 and p["kappa_clip"] == 0.5
    assert p["kl_coef"] == 0.001 and p["allocation"] == "hrp" and p["alloc_mode"] == "proportional"
    assert p["dynamic_sampling"] is False
    # XRPO's loss is its GRPO baseline's
    loss_knobs = ("adv_scale", "policy_loss", "clip_low", "clip_high", "loss_agg", "kl_coef", "kl_estimator")
    assert {k: p[k] for k in loss_knobs} == {k: get_preset("grpo")[k] for k in loss_knobs}
    assert "0.95" in preset_sources("xrpo")["alpha"]


def test_baseline_values():
    grpo = get_preset("grpo")
    # XRPO §4.1: "Token-Level Policy Gradient Loss and clipping with eps in [0.2, 0.28]"; beta 0.001
    assert (grpo["policy_loss"], grpo["loss_agg"], grpo["clip_low"], grpo["clip_high"]) == (
        "vanilla",
        "token-mean",
        0.2,
        0.28,
    )
    assert grpo["kl_coef"] == 0.001 and grpo["adv_scale"] == "std"
    assert grpo["allocation"] == "uniform" and not grpo["icl"] and not grpo["sharpen"]
    assert not grpo["dynamic_sampling"]

    ds = get_preset("grpo-deepseekmath")
    assert (ds["clip_low"], ds["clip_high"], ds["loss_agg"], ds["kl_coef"]) == (0.2, 0.2, "seq-mean-token-mean", 0.04)

    dapo = get_preset("dapo")
    assert (dapo["clip_low"], dapo["clip_high"], dapo["loss_agg"]) == (0.2, 0.28, "token-mean")
    assert dapo["dynamic_sampling"] is True and dapo["max_gen_batches"] > 1
    assert _diff("dapo", "grpo") == {"dynamic_sampling", "max_gen_batches"}

    gspo = get_preset("gspo")
    assert (gspo["policy_loss"], gspo["clip_low"], gspo["clip_high"]) == ("gspo", 3e-4, 4e-4)
    assert gspo["loss_agg"] == "seq-mean-token-mean"

    dr = get_preset("dr_grpo")
    assert dr["adv_scale"] == "none" and dr["loss_agg"] == "seq-mean-token-sum-norm"
    for name in ("grpo", "grpo-deepseekmath", "dapo", "gspo", "dr_grpo"):
        p = get_preset(name)
        assert p["allocation"] == "uniform" and p["icl"] is False and p["sharpen"] is False, name


def test_sources_quote_their_papers():
    assert "Token-Level Policy Gradient Loss" in preset_sources("grpo")["loss_agg"]
    assert "three of its four components" in preset_sources("dapo")["dynamic_sampling"]
    assert "complement GSPO" in preset_sources("xrpo-gspo")["policy_loss"]
    assert "β = 0.001" in preset_sources("xrpo")["kl_coef"]
    assert "The KL coefficient is 0.04." in preset_sources("grpo-deepseekmath")["kl_coef"]
    assert "2503.20783" in preset_sources("dr_grpo")["adv_scale"]
    assert "xrpo default" in preset_sources("grpo")["kl_estimator"]
    assert "w/o HRP" in preset_sources("xrpo-no-hrp")["allocation"]
    # a knob a preset leaves alone keeps the default's source (XRPO's setting)
    assert preset_sources("grpo")["alpha"] == DEFAULT_SOURCES["alpha"] and "0.95" in DEFAULT_SOURCES["alpha"]


def test_get_preset_returns_a_copy():
    p = get_preset("xrpo")
    p["icl"] = False
    assert get_preset("xrpo")["icl"] is True
    s = preset_sources("xrpo")
    s["icl"] = ""
    assert preset_sources("xrpo")["icl"]


def test_unknown_preset_lists_valid_names():
    for fn in (get_preset, preset_sources):
        with pytest.raises(ValueError, match="valid presets: grpo, grpo-deepseekmath, dapo") as e:
            fn("ppo")
        for name in EXPECTED_PRESETS:
            assert name in str(e.value)


def test_treepo_presets():
    # TreePO (arXiv 2508.17445): 14 segments, binary branching from 2 initial paths, even split, fallback
    tps, tp = get_preset("treepo-sampling"), get_preset("treepo")
    for p in (tps, tp):
        assert p["sampler"] == "tree" and p["tree_max_depth"] == 14 and p["tree_segment_len"] == 0
        assert (p["tree_branch"], p["tree_init_branch"], p["tree_divergence"], p["tree_fallback"]) == (
            2,
            2,
            "uniform",
            True,
        )
        assert p["allocation"] == "uniform" and not p["icl"] and not p["sharpen"] and not p["dynamic_sampling"]
    # TPO-S is the XRPO paper's GRPO baseline with TreePO's sampler; treepo adds the tree advantage
    assert _diff("treepo-sampling", "grpo") == {"sampler"}
    assert _diff("treepo", "treepo-sampling") == {"tree_advantage"}
    assert tp["tree_advantage"] is True and tps["tree_advantage"] is False
    # every other preset samples independently; TreePO's values are the defaults, sourced from TreePO
    for name in EXPECTED_PRESETS - {"treepo", "treepo-sampling"}:
        assert get_preset(name)["sampler"] == "independent" and not get_preset(name)["tree_advantage"], name
        assert "TreePO's value (used with sampler='tree')" in preset_sources(name)["tree_max_depth"]
    src = preset_sources("treepo")
    assert "14 × 512 is the sweet spot" in src["tree_max_depth"]
    assert "TreePO sampling strategy" in preset_sources("treepo-sampling")["sampler"]
    assert "we therefore adopt averaging" in src["tree_advantage"]
    assert "REINFORCE++" in src["adv_scale"] and "fixed_avg" in src["tree_divergence"]


def test_cures_preset():
    p = get_preset("cures")
    # CurES changes prompt selection and rollout counts only: the loss is the grpo baseline's, as for dapo / gspo
    assert _diff("cures", "grpo") == {"allocation"}
    assert p["allocation"] == "cures" and p["icl"] is False and p["sharpen"] is False
    assert p["dynamic_sampling"] is False
    # the authors' code: Beta(alpha + 1, beta + 1), t = (alpha + 1) / 1e-2, num_rollout_min = 4, threshold 0.5
    assert (p["cures_prior_alpha"], p["cures_prior_beta"]) == (1.0, 1.0)
    assert p["cures_temp_scale"] == 100.0 and p["cures_warmup_rollouts"] == 4
    assert p["cures_success_threshold"] == 0.5 and p["cures_min_count"] == 2
    src = preset_sources("cures")
    assert "2510.01037" in src["allocation"]
    assert "Beta(alpha + 1, beta + 1)" in src["cures_prior_alpha"]
    assert "1e-2" in src["cures_temp_scale"]
    assert "num_rollout_min=4" in src["cures_warmup_rollouts"]
    assert "requires precomputing prompt difficulty" in src["cures_warmup_rollouts"]
    assert "xrpo default" in src["cures_min_count"]
    # CurES's values are the defaults, used by allocation=cures only
    assert "CurES's value (used with allocation='cures')" in preset_sources("xrpo")["cures_temp_scale"]


def test_allocation_beyond_the_paper_presets():
    # knapsack is GRPO with Knapsack RL's counts; xrpo-plus is XRPO with the posterior planner and n_base 2 (the
    # planner's choice, measured in the simulator), every other knob as xrpo
    assert _diff("knapsack", "grpo") == {"allocation"} and get_preset("knapsack")["allocation"] == "knapsack"
    assert _diff("xrpo-plus", "xrpo") == {"allocation", "n_base"}
    p = get_preset("xrpo-plus")
    assert p["allocation"] == "xrpo-plus" and p["n_base"] == 2 and p["icl"] and p["sharpen"]
    assert "2509.25849" in preset_sources("knapsack")["allocation"]
    src = preset_sources("xrpo-plus")
    assert "posterior_alloc" in src["allocation"] and "1.344" in src["n_base"] and "1.397" in src["n_base"]
    # the variants that value prompts with a gradient differ from xrpo-plus in the size power only
    for name, power in (("xrpo-plus-sqrt", 0.5), ("xrpo-plus-groups", 0.0)):
        assert _diff(name, "xrpo-plus") == {"group_size_power"} and get_preset(name)["group_size_power"] == power
        assert "step 4" in preset_sources(name)["group_size_power"]
    assert get_preset("xrpo-plus")["group_size_power"] == 1.0
