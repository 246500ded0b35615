"""xrpo's verifiers as verl's reward function (xrpo.integrations.verl.reward), loaded the way verl loads it."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

from verl.trainer.ppo.reward import get_custom_reward_fn  # noqa: E402

from xrpo.integrations.verl.main import load_config  # noqa: E402
from xrpo.integrations.verl.reward import compute_score  # noqa: E402


def verl_loaded(*overrides):
    # verl resolves reward.custom_reward_function.path (pkg://...) and merges reward_kwargs into every call
    fn = get_custom_reward_fn(load_config(overrides=list(overrides)))
    assert fn is not None
    return fn


def test_math_verifier_through_verls_loader():
    fn = verl_loaded()
    right = fn(
        data_source="dapo",
        solution_str="... so the answer is \\boxed{\\frac{1}{2}}",
        ground_truth="0.5",
        extra_info={"index": "p1"},
    )
    assert right == {"score": 1.0, "acc": 1.0, "pred": "\\frac{1}{2}"}
    wrong = fn(data_source="dapo", solution_str="\\boxed{3}", ground_truth="4", extra_info={})
    assert wrong == {"score": 0.0, "acc": 0.0, "pred": "3"}
    # no answer at all: reward 0, and "" for verl's majority vote (maj@k = cons@k)
    assert fn(data_source="dapo", solution_str="I give up", ground_truth="4")["pred"] == ""


def test_numeric_ground_truth_and_verl_internal_kwargs():
    assert compute_score("d", "\\boxed{12}", 12)["score"] == 1.0
    assert compute_score("d", "\\boxed{12}", 12.0)["score"] == 1.0
    # verl adds these when a reward model is configured; they are not errors
    assert compute_score("d", "\\boxed{1}", "1", reward_router_address=None, reward_model_tokenizer=None)["acc"] == 1.0


@pytest.mark.parametrize("gt", [None, "", "   ", True, float("nan"), ["1", "2"]])
def test_bad_ground_truth_names_the_row(gt):
    with pytest.raises(ValueError, match="extra_info.index='p7'") as e:
        compute_score("aime", "\\boxed{1}", gt, {"index": "p7"})
    assert "data_source='aime'" in str(e.value)


def test_config_typos_are_errors_not_zero_rewards():
    fn = verl_loaded("+reward.custom_reward_function.reward_kwargs.verfier=math")
    with pytest.raises(ValueError, match="unknown reward_kwargs \\['verfier'\\]"):
        fn(data_source="d", solution_str="\\boxed{1}", ground_truth="1")
    fn = verl_loaded("reward.custom_reward_function.reward_kwargs.verifier=nope")
    with pytest.raises(ValueError, match="unknown verifier 'nope'"):
        fn(data_source="d", solution_str="\\boxed{1}", ground_truth="1")


def test_percentages_grade_right_under_verls_antlr_pin():
    # verl's config stack (hydra-core, omegaconf) pins antlr4 4.9.*, under which latex2sympy2_extended 1.11.0's parser
    # crashed on every percentage; xrpo.rewards.math patches that parser (see _patch_antlr49_parser)
    from importlib.metadata import version

    assert version("antlr4-python3-runtime").startswith("4.9.")
    fn = verl_loaded()
    assert fn(data_source="d", solution_str="\\boxed{50\\%}", ground_truth="50")["score"] == 1.0
    assert fn(data_source="d", solution_str="\\boxed{25\\%}", ground_truth="\\frac14")["score"] == 1.0
