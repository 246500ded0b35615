"""`method.name=treepo` and `treepo-sampling` end to end on the tiny model: the trainer's step with TreePO's sampler,
and TreePO's tree advantage (`treepo`) or GRPO's group advantage (`treepo-sampling`, the XRPO paper's TPO-S)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from xrpo.algo.advantages import group_advantages
from xrpo.algo.tree import global_whiten, tree_advantages
from xrpo.rollout import sources
from xrpo.rollout.advantages import tree_ancestor_ids
from xrpo.trainer.config_loader import build_config
from xrpo.trainer.loop import train


def quiet(*_):
    pass


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_treepo_trains_two_steps(trainer_env, tmp_path):
    out = tmp_path / "treepo"
    # 4 prompts x width 4; 6-token completions in segments of 2 tokens (at most 3 segments)
    cfg = build_config(None, trainer_env["overrides"](out, "treepo", steps=2) + ["method.tree_max_depth=3"])
    assert cfg.method.sampler == "tree" and cfg.method.tree_advantage
    summary = train(cfg, log=quiet)
    got = rows(out)
    assert len(got) == 2
    for r in got:
        assert math.isfinite(r["loss/policy"])
        assert r["tree/leaves"] == r["rollout/count"] == 16 and r["tree/underfilled"] == 0
        assert r["tree/segment_len"] == 2 and 1 <= r["tree/depth_mean"] <= r["tree/depth_max"] <= 3
        assert r["tree/nodes"] >= r["tree/leaves"] and 0 <= r["tree/tokens_saved_frac"] < 1
        assert "adv/tree_subgroups_mean" in r and r["tree/engine_cached_tokens"] > 0
        # the engine's log-probs are exact, so they are reused as the old log-probs (none recomputed)
        assert r["loss/recomputed_old_logprobs"] == 0
    before = load_file(str(trainer_env["model"] / "model.safetensors"))
    after = load_file(str(Path(summary["final_checkpoint"]) / "model" / "model.safetensors"))
    assert all(not torch.equal(before[k], after[k]) for k in before)


def test_treepo_sampling_trains_with_grpo_advantages(trainer_env, tmp_path, monkeypatch):
    # TPO-S: TreePO's sampler, GRPO's group advantage; each step's advantages are captured where the loop computes them
    seen = []
    real = sources.compute_advantages

    def spy(plan, pcfg, **kwargs):
        out = real(plan, pcfg, **kwargs)
        seen.append((pcfg, list(plan.records), plan.rewards.copy(), plan.group_ids.copy(), out[0].copy()))
        return out

    monkeypatch.setattr(sources, "compute_advantages", spy)
    out = tmp_path / "tpo-s"
    cfg = build_config(None, trainer_env["overrides"](out, "treepo-sampling", steps=2) + ["method.tree_max_depth=3"])
    assert cfg.method.sampler == "tree" and not cfg.method.tree_advantage and cfg.method.adv_scale == "std"
    summary = train(cfg, log=quiet)
    got = rows(out)
    assert len(got) == 2 and len(seen) == 2
    for r in got:
        assert math.isfinite(r["loss/policy"])
        # GRPO's budget: rollout.rollouts_per_step = 16 rollouts per step, all of them tree leaves
        assert r["rollout/count"] == r["tree/leaves"] == cfg.rollout.rollouts_per_step == 16
        assert r["tree/underfilled"] == 0 and "adv/tree_subgroups_mean" not in r
    differs = []
    for pcfg, records, rewards, group_ids, adv in seen:
        assert not pcfg.tree_advantage and not pcfg.sharpen
        # tree rollouts (every leaf has its path), 4 per prompt: GRPO's 16 over 4 prompts
        assert all(len(x.tree_path) >= 1 for x in records)
        np.testing.assert_array_equal(np.bincount(group_ids), [4, 4, 4, 4])
        # exactly GRPO's group advantage, (R - mean_g) / (std_g + eps) by prompt
        np.testing.assert_array_equal(adv, group_advantages(rewards, group_ids))
        tree_adv = global_whiten(
            tree_advantages(rewards, tree_ancestor_ids(records))[0], [len(x.completion_ids) for x in records]
        )
        differs.append(bool(np.any(adv != 0)) and not np.allclose(adv, tree_adv))
    # the parity rewards differ inside groups at both steps, so the two advantages can be told apart
    assert differs == [True, True]
    before = load_file(str(trainer_env["model"] / "model.safetensors"))
    after = load_file(str(Path(summary["final_checkpoint"]) / "model" / "model.safetensors"))
    assert all(not torch.equal(before[k], after[k]) for k in before)


def test_treepo_with_dynamic_sampling_merges_tree_metrics(trainer_env, tmp_path):
    out = tmp_path / "treepo-ds"
    cfg = build_config(
        None,
        trainer_env["overrides"](out, "treepo", steps=1)
        + ["method.dynamic_sampling=true", "method.max_gen_batches=2", "method.tree_divergence=low_logprob"],
    )
    train(cfg, log=quiet)
    (r,) = rows(out)
    # leaves of every generation batch, kept groups' rollouts only in the batch
    assert r["tree/leaves"] == 16 * r["rollout/gen_batches"] and r["rollout/count"] <= r["tree/leaves"]
    assert math.isfinite(r["loss/policy"])


@pytest.mark.parametrize(
    "override, match",
    [
        ("method.icl=true", "method.icl must be false with method.sampler=tree"),
        ("method.allocation=hrp", "method.allocation must be uniform with method.sampler=tree"),
        ("method.sharpen=true", "method.sharpen must be false with method.tree_advantage=true"),
        ("method.tree_divergence=random", "method.tree_divergence must be one of uniform, low_logprob or high_logprob"),
        ("method.tree_branch=0", "method.tree_branch must be >= 1"),
        ("method.tree_segment_len=-2", "method.tree_segment_len must be >= 0"),
        ("method.tree_divergence_temp=0", "method.tree_divergence_temp must be a finite number > 0"),
        ("method.sampler=beam", "method.sampler must be one of independent or tree"),
    ],
)
def test_treepo_config_errors_name_the_field(override, match):
    with pytest.raises(ValueError, match=match):
        build_config(None, ["method.name=treepo", override])


def test_tree_sampler_needs_a_leaf_per_prompt():
    with pytest.raises(ValueError, match="a tree needs at least one leaf"):
        build_config(
            None, ["method.name=treepo-sampling", "rollout.prompts_per_step=16", "rollout.rollouts_per_step=8"]
        )
    # the planner's n_base does not constrain the tree sampler: 16 prompts x 1 leaf is a valid (if degenerate) step
    assert build_config(None, ["method.name=treepo", "rollout.rollouts_per_step=16"]).rollout.rollouts_per_step == 16
    # the tree advantage works with independent rollouts too (each rollout's root is its group)
    cfg = build_config(None, ["method.name=grpo", "method.tree_advantage=true"])
    assert cfg.method.sampler == "independent"
