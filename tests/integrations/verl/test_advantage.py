"""The ``xrpo`` advantage estimator on ragged verl DataProto batches: the numbers of xrpo.algo, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from tensordict import TensorDict  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_adv_estimator_fn  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

from xrpo.algo.advantages import group_advantages, length_normalized_loglik, sharpen_advantages  # noqa: E402
from xrpo.integrations.verl.main import load_config  # noqa: E402


def algo_config(*overrides):
    return load_config(overrides=list(overrides)).algorithm


def estimator():
    # through verl's registry: the plugin registered it when verl was imported
    return get_adv_estimator_fn("xrpo")


def ragged_batch(seed: int, n_groups: int = 7, T: int = 12, pads: int = 0):
    """A DataProto with groups of 2..9 rows in shuffled order, outcome rewards on the last response token,
    random response lengths and log-probs, string uids, and ``pads`` padding rows (all-zero mask)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 10, size=n_groups)
    uids = np.concatenate([[f"uid-{g}-{rng.integers(1e9)}"] * s for g, s in enumerate(sizes)])
    uids = np.concatenate([uids, [f"pad-{i}" for i in range(pads)]])
    n = len(uids)
    lengths = rng.integers(1, T + 1, size=n)
    lengths[n - pads :] = 0
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)
    rewards = rng.choice([0.0, 1.0, 0.5], size=n, p=[0.5, 0.4, 0.1]).astype(np.float32)
    rewards[n - pads :] = 0.0
    tlr = np.zeros((n, T), dtype=np.float32)
    real = lengths > 0
    tlr[np.flatnonzero(real), lengths[real] - 1] = rewards[real]
    lp = (-rng.exponential(1.0, size=(n, T))).astype(np.float32)
    perm = rng.permutation(n)
    td = TensorDict(
        {
            "token_level_rewards": torch.from_numpy(tlr[perm]),
            "response_mask": torch.from_numpy(mask[perm]),
            "old_log_probs": torch.from_numpy(lp[perm]),
        },
        batch_size=n,
    )
    return DataProto(batch=td, non_tensor_batch={"uid": np.array(uids[perm], dtype=object)})


def expected(batch: DataProto, scale="std", sharpen=True, lam_nov=2.5, kappa=0.5, eps=1e-6):
    """xrpo.algo on the same arrays: the rows with a response, groups by uid."""
    mask = batch.batch["response_mask"]
    valid = mask.sum(-1) > 0
    rows = torch.nonzero(valid).reshape(-1)
    uids = batch.non_tensor_batch["uid"][rows.numpy()]
    gid = np.unique(uids, return_inverse=True)[1].reshape(-1)
    r = batch.batch["token_level_rewards"].sum(-1)[rows]
    adv = group_advantages(r, gid, scale=scale, eps=eps)
    if sharpen:
        s = length_normalized_loglik(batch.batch["old_log_probs"][rows], mask[rows] != 0)
        adv, _ = sharpen_advantages(adv, r, s, gid, lam_nov=lam_nov, kappa_clip=kappa)
    adv = torch.from_numpy(adv)  # xrpo.algo is numpy: CPU tensors in, numpy arrays out
    out = torch.zeros(len(batch), dtype=adv.dtype)
    out[rows] = adv
    return out


def run(batch: DataProto, cfg, **kw):
    metrics: dict = {}
    adv, ret = estimator()(
        token_level_rewards=batch.batch["token_level_rewards"],
        response_mask=batch.batch["response_mask"],
        index=batch.non_tensor_batch["uid"],
        config=cfg,
        old_log_probs=batch.batch["old_log_probs"],
        metrics=metrics,
        **kw,
    )
    return adv, ret, metrics


def test_hand_computed_sharpening_and_padding():
    # uid "a": rows 0 and 3, rewards 1 and 0; uid "b": rows 1, 2, 4, all reward 0; row 5 is padding (no token).
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0]])
    tlr = torch.zeros(6, 3)
    tlr[0, 1] = 1.0
    # s(y) (Eq. 4): row 0 = (-3 - 3) / 2 = -3, row 3 = (-1 - 1 - 1) / 3 = -1; masked entries (99) are ignored
    lp = torch.tensor(
        [[-3.0, -3.0, 99.0], [-1.0, 99, 99], [-2.0, 99, 99], [-1.0, -1.0, -1.0], [-0.5, 99, 99], [99.0, 99, 99]]
    )
    uid = np.array(["a", "b", "b", "a", "b", "pad"], dtype=object)
    metrics: dict = {}
    adv, ret = estimator()(
        token_level_rewards=tlr, response_mask=mask, index=uid, config=algo_config(), old_log_probs=lp, metrics=metrics
    )
    # group a: mean 0.5, std (ddof 1) = sqrt((0.25 + 0.25) / 1) = sqrt(0.5)
    a0 = 0.5 / (math.sqrt(0.5) + 1e-6)  # = 0.70710578...
    # Eq. (5): s_bar = -2, eta_0 = exp(-3 + 2) = exp(-1) = 0.367879
    # Eq. (6), row 0 has full reward: bonus = min(max(2.5 * (1 - 0.367879), 0), 0.5 * A_0) = min(1.5803, 0.353553)
    a0_plus = a0 + min(2.5 * (1 - math.exp(-1)), 0.5 * a0)  # = 1.06065867...
    want = torch.tensor([a0_plus, 0.0, 0.0, -a0, 0.0, 0.0])
    assert torch.allclose(adv[:, 0], want, atol=1e-6, rtol=0)
    # broadcast over the response tokens, zero outside the mask; returns equal advantages (outcome estimator)
    assert torch.equal(adv, adv[:, :1] * mask) and torch.equal(adv, ret)
    assert metrics["adv/empty_rows"] == 1.0 and metrics["adv/sharpened_count"] == 1.0
    assert metrics["adv/sharpen_eligible"] == 1.0
    assert metrics["adv/max_bonus"] == pytest.approx(0.5 * a0, abs=1e-6)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("pads", [0, 3])
def test_identical_to_xrpo_algo_on_ragged_batches(seed, pads):
    batch = ragged_batch(seed, pads=pads)
    adv, _, metrics = run(batch, algo_config())
    want = expected(batch)
    assert torch.equal(adv, want.unsqueeze(-1) * batch.batch["response_mask"])
    assert metrics["adv/empty_rows"] == float(pads)


@pytest.mark.parametrize("seed", range(3))
def test_knobs_reach_xrpo_algo(seed):
    batch = ragged_batch(100 + seed)
    # Dr. GRPO (no std scaling), other sharpening strengths, sharpening off
    cfg = algo_config(
        "algorithm.norm_adv_by_std_in_grpo=false",
        "algorithm.xrpo.lam_nov=1.0",
        "algorithm.xrpo.kappa_clip=0.25",
        "algorithm.xrpo.epsilon=0.01",
    )
    adv, _, _ = run(batch, cfg, norm_adv_by_std_in_grpo=False)
    assert torch.equal(
        adv[:, 0].masked_fill(batch.batch["response_mask"][:, 0] == 0, 0),
        expected(batch, scale="none", lam_nov=1.0, kappa=0.25, eps=0.01).masked_fill(
            batch.batch["response_mask"][:, 0] == 0, 0
        ),
    )
    adv, _, m = run(batch, algo_config("algorithm.xrpo.sharpen=false"))
    assert torch.equal(adv, expected(batch, sharpen=False).unsqueeze(-1) * batch.batch["response_mask"])
    assert "adv/sharpened_count" not in m


def test_padding_rows_change_nothing():
    batch = ragged_batch(7)
    extra = ragged_batch(7, n_groups=1, pads=4)
    pads = extra[np.flatnonzero(extra.batch["response_mask"].sum(-1).numpy() == 0)]
    assert len(pads) == 4
    padded = DataProto.concat([batch, pads])
    a, _, _ = run(batch, algo_config())
    b, _, _ = run(padded, algo_config())
    assert torch.equal(b[: len(batch)], a) and not b[len(batch) :].any()


def test_stock_verl_compute_advantage_without_sharpening_is_ragged_grpo():
    # verl's own compute_advantage (no log-probs passed) with adv_estimator=xrpo and sharpening off
    batch = ragged_batch(3)
    cfg = algo_config("algorithm.xrpo.sharpen=false")
    out = compute_advantage(batch, adv_estimator="xrpo", config=cfg)
    assert torch.equal(
        out.batch["advantages"], expected(batch, sharpen=False).unsqueeze(-1) * batch.batch["response_mask"]
    )
    # and it agrees with verl's GRPO estimator (float32 arithmetic there, float64 in xrpo.algo)
    grpo, _ = compute_grpo_outcome_advantage(
        batch.batch["token_level_rewards"], batch.batch["response_mask"], batch.non_tensor_batch["uid"]
    )
    assert torch.allclose(out.batch["advantages"], grpo, atol=1e-5, rtol=1e-5)


def test_stock_verl_path_refuses_sharpening_without_log_probs():
    with pytest.raises(ValueError, match="RayXRPOTrainer"):
        compute_advantage(ragged_batch(4), adv_estimator="xrpo", config=algo_config())


def test_bad_inputs_are_named():
    b = ragged_batch(5)
    with pytest.raises(ValueError, match="index has"):
        estimator()(
            token_level_rewards=b.batch["token_level_rewards"],
            response_mask=b.batch["response_mask"],
            index=b.non_tensor_batch["uid"][:-1],
            config=algo_config(),
            old_log_probs=b.batch["old_log_probs"],
        )
    with pytest.raises(ValueError, match="algorithm.xrpo is missing"):
        estimator()(
            token_level_rewards=b.batch["token_level_rewards"],
            response_mask=b.batch["response_mask"],
            index=b.non_tensor_batch["uid"],
            config={"norm_adv_by_std_in_grpo": True},
        )
    lp = b.batch["old_log_probs"].clone()
    lp[0, 0] = float("nan")
    if b.batch["response_mask"][0, 0]:
        with pytest.raises(ValueError, match="finite"):
            estimator()(
                token_level_rewards=b.batch["token_level_rewards"],
                response_mask=b.batch["response_mask"],
                index=b.non_tensor_batch["uid"],
                config=algo_config(),
                old_log_probs=lp,
            )
