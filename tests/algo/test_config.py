"""xrpo.algo.config: the knob sections, each declared once; check_knobs names the failing key and its prefix."""

from __future__ import annotations

import dataclasses
import math

import pytest

from xrpo.algo import config as knobs
from xrpo.algo.config import METHOD_SECTIONS, check_knobs, knob_names, section_values


@dataclasses.dataclass
class Everything(knobs.CorpusConfig, knobs.ICLPromptConfig, *reversed(METHOD_SECTIONS)):
    """One object embedding every section, as verl's algorithm.xrpo block embeds its sections."""


def test_defaults_pass_and_every_knob_has_one_owner():
    check_knobs(Everything(), "method.")
    names = knob_names()
    assert len(names) == len(set(names))  # no knob declared in two sections
    assert set(names) | set(knob_names((knobs.ICLPromptConfig, knobs.CorpusConfig))) == {
        f.name for f in dataclasses.fields(Everything)
    }
    owners = {f.name: s.__name__ for s in METHOD_SECTIONS for f in dataclasses.fields(s)}
    assert owners["lam_nov"] == "SharpenConfig" and owners["n_base"] == "AllocationConfig"
    assert section_values(Everything(lam_nov=3.0), knobs.SharpenConfig)["lam_nov"] == 3.0


BAD = [
    ("clip_low", -0.1, "must be a finite number >= 0"),
    ("loss_agg", "sum", "must be one of"),
    ("kl_coef", math.nan, "must be a finite number >= 0"),
    ("kl_coef", math.inf, "must be a finite number >= 0, got inf"),
    ("clip_high", math.inf, "must be a finite number >= 0, got inf"),
    ("kl_estimator", "k9", "must be one of"),
    ("adv_scale", "mad", "must be one of std or none"),
    ("allocation", "random", "must be one of hrp, uniform, cures, knapsack or xrpo-plus"),
    ("n_base", 1, r"must be >= 2 \(the t quantile needs n >= 2\)"),
    ("n_base", 2.0, "must be an int >= 2"),
    ("n_base", True, "must be an int >= 2"),
    ("plan_rounds", -1, "must be >= 0"),
    ("alpha", 0.5, "alpha"),
    ("lam", -1.0, "must be a finite number >= 0"),
    ("lam", math.inf, "must be a finite number >= 0, got inf"),
    ("alloc_mode", "fair", "must be one of proportional or greedy"),
    ("max_extra_per_prompt", -1, "or null"),
    ("icl_k", 0, "must be >= 1"),
    ("icl_train_prompt", "both", "must be one of original or icl"),
    ("icl_min_similarity", -0.5, "must be a finite number >= 0 and <= 1"),
    ("icl_min_similarity", 1.5, r"and <= 1, got 1.5"),
    ("icl_novelty", "skip", "must be one of train, sample or exclude"),
    ("lam_nov", "2.5", "must be a finite number >= 0"),
    ("lam_nov", math.inf, "must be a finite number >= 0, got inf"),
    ("kappa_clip", -1, "must be a finite number >= 0"),
    ("kappa_clip", math.inf, "must be a finite number >= 0, got inf"),
    ("full_reward", math.inf, "must be a finite number"),
    ("sampler", "beam", "must be one of independent or tree"),
    ("max_gen_batches", 0, "must be >= 1"),
    ("tree_segment_len", -1, r"\(0: derived\)"),
    ("tree_branch", 0, "must be >= 1"),
    ("tree_divergence_temp", 0.0, "must be a finite number > 0"),
    ("tree_divergence_temp", math.inf, "must be a finite number > 0, got inf"),
    ("cures_prior_alpha", 0.0, "must be a finite number > 0"),
    ("cures_min_count", 1, "a group of one has no reward variance"),
    ("embedder", "", "must name an embedder"),
    ("corpus_max_per_problem", 0, "must be >= 1"),
    # a switch is a bool, not what YAML or an untyped block makes of "false", null or 0 (each would read the other way)
    ("icl", "false", "must be true or false, got 'false'"),
    ("sharpen", None, "must be true or false, got None"),
    ("dynamic_sampling", 1, "must be true or false, got 1"),
    ("tree_advantage", 0, "must be true or false, got 0"),
    ("tree_fallback", "yes", "must be true or false, got 'yes'"),
]


@pytest.mark.parametrize("name,value,match", BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_a_bad_value_names_the_key_with_its_prefix(name, value, match):
    with pytest.raises(ValueError, match=rf"algorithm\.xrpo\.{name}\b.*{match}"):
        check_knobs(dataclasses.replace(Everything(), **{name: value}), "algorithm.xrpo.")


@pytest.mark.parametrize(
    "changes,key",
    [
        ({"tree_advantage": True, "sharpen": True}, "sharpen"),
        ({"allocation": "cures", "icl": True}, "icl"),
        ({"allocation": "cures", "icl": False, "dynamic_sampling": True}, "dynamic_sampling"),
        ({"sampler": "tree", "allocation": "hrp", "icl": False}, "allocation"),
        ({"sampler": "tree", "allocation": "uniform", "icl": True}, "icl"),
    ],
)
def test_rules_across_sections(changes, key):
    with pytest.raises(ValueError, match=rf"config field method\.{key} must"):
        check_knobs(dataclasses.replace(Everything(), **changes), "method.")


def test_only_the_embedded_sections_are_checked():
    @dataclasses.dataclass
    class JustSharpen(knobs.SharpenConfig):
        pass

    check_knobs(JustSharpen())
    with pytest.raises(ValueError, match="config field lam_nov must be a finite number >= 0, got -1.0"):
        check_knobs(JustSharpen(lam_nov=-1.0))
