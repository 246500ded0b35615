"""verl advantage estimator ``xrpo``: GRPO advantages over ragged groups plus novelty sharpening (XRPO §2.1, §3.3).

A thin adapter: verl's ``DataProto`` fields in, `xrpo.algo.advantages` does all the math, verl's (advantages, returns)
pair out. Registered under the name ``xrpo`` in verl's advantage-estimator registry when verl loads xrpo's plugin.

Inputs, as verl's ``compute_advantage`` passes them: ``token_level_rewards`` (B, T) whose row sum is the rollout's
reward R_i, ``response_mask`` (B, T), ``index`` (B,) the ``uid`` of each row's prompt (any hashable ids: XRPO gives
each prompt its own number of rows, so groups are found by id, never by reshaping), and ``config`` (verl's
``config.algorithm``, read for ``norm_adv_by_std_in_grpo`` and the ``xrpo`` block).

How the log-probs reach the estimator: Eq. (4)'s s(y) needs log pi_theta of every response token, and verl's
``compute_advantage`` passes an estimator no log-probs. `RayXRPOTrainer` therefore calls this estimator itself, after
verl recomputed ``old_log_probs`` with the actor (under the prompt each row is trained on), with
``old_log_probs=batch.batch["old_log_probs"]``. Called by verl's stock trainer (no log-probs), the estimator refuses
to run with sharpening on and says so; with ``algorithm.xrpo.sharpen=false`` it is plain ragged GRPO.

Rows whose response mask is all zero (the padding rows `RayXRPOTrainer` adds to fill a mini-batch, or a rollout that
produced no token) have no s(y) and no reward to compare: they are left out of every group statistic and get
advantage 0 (counted in ``adv/empty_rows``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xrpo.algo.advantages import group_advantages, length_normalized_loglik, sharpen_advantages
from xrpo.integrations.verl.config import xrpo_config

__all__ = ["ESTIMATOR_NAME", "compute_xrpo_outcome_advantage", "group_index"]

ESTIMATOR_NAME = "xrpo"


def group_index(index) -> np.ndarray:
    """Integer group ids (0..G-1, in sorted order of the ids) for verl's ``uid`` array (strings or any sortable)."""
    arr = np.asarray(index)
    if arr.ndim != 1:
        raise ValueError(f"index (the rows' uid) must be 1-D, got shape {arr.shape}")
    if arr.dtype == object and any(v is None for v in arr):
        raise ValueError("index (the rows' uid) holds None: every row needs its prompt's uid")
    return np.unique(arr, return_inverse=True)[1].reshape(-1).astype(np.int64)


def compute_xrpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float | None = None,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    old_log_probs: torch.Tensor | None = None,
    metrics: dict | None = None,
    **unused,
) -> tuple[torch.Tensor, torch.Tensor]:
    """XRPO's advantage for verl: A_i of GRPO over each uid's rows, then A_i^+ of Eq. (6) for correct rows.

    Args:
        token_level_rewards: (B, T); R_i = row sum (an outcome reward sits on the last response token).
        response_mask: (B, T), 1 on response tokens; all-zero rows are padding (advantage 0, no statistics).
        index: (B,) the prompt uid of each row.
        epsilon: added to the group std; default ``algorithm.xrpo.epsilon``.
        norm_adv_by_std_in_grpo: GRPO's std scaling (True) or Dr. GRPO's mean-only advantage (False); default
            ``algorithm.norm_adv_by_std_in_grpo``.
        config: verl's ``config.algorithm`` holding the ``xrpo`` block (required).
        old_log_probs: (B, T) log pi_old of the response tokens; required when ``algorithm.xrpo.sharpen`` is on.
        metrics: if a dict is given, the ``adv/*`` metrics are written into it.
        unused: other keyword arguments verl's ``compute_advantage`` may pass (``reward_baselines``); ignored.

    Returns:
        (advantages, returns), both (B, T): the per-row advantage broadcast over the response tokens (times the mask),
        as verl's outcome estimators return them.
    """
    xcfg = xrpo_config(config)
    if norm_adv_by_std_in_grpo is None:
        norm_adv_by_std_in_grpo = bool(config.get("norm_adv_by_std_in_grpo", True))
    eps = xcfg.epsilon if epsilon is None else float(epsilon)
    if token_level_rewards.ndim != 2 or response_mask.shape != token_level_rewards.shape:
        raise ValueError(
            f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask {tuple(response_mask.shape)} "
            "must both be (batch, response_length)"
        )
    n = token_level_rewards.shape[0]
    if len(index) != n:
        raise ValueError(f"index has {len(index)} uids for {n} rows")
    with torch.no_grad():
        rewards = token_level_rewards.sum(dim=-1).detach().cpu()
        mask = response_mask.detach().cpu() != 0
        valid = mask.any(dim=-1)
        rows = torch.nonzero(valid).reshape(-1).numpy()
        scalar = torch.zeros(n, dtype=rewards.dtype)
        m: dict[str, float] = {"adv/empty_rows": float(n - rows.size)}
        if rows.size:
            gid = group_index(np.asarray(index)[rows])
            r = rewards[rows]
            adv = torch.from_numpy(
                group_advantages(r, gid, scale="std" if norm_adv_by_std_in_grpo else "none", eps=eps)
            )
            m["adv/mean"] = float(adv.mean())
            m["adv/abs_mean"] = float(adv.abs().mean())
            if xcfg.sharpen:
                if old_log_probs is None:
                    raise ValueError(
                        "the xrpo advantage estimator needs old_log_probs for novelty sharpening (Eq. 4-6), and "
                        "verl's stock trainer does not pass them: run XRPO with RayXRPOTrainer "
                        "(python -m xrpo.integrations.verl.main), or set algorithm.xrpo.sharpen=false"
                    )
                if old_log_probs.shape != response_mask.shape:
                    raise ValueError(
                        f"old_log_probs {tuple(old_log_probs.shape)} must have the shape of response_mask "
                        f"{tuple(response_mask.shape)}"
                    )
                lp = old_log_probs.detach().cpu()[rows]
                scores = length_normalized_loglik(lp, mask[rows])
                adv, sm = sharpen_advantages(
                    adv,
                    r,
                    scores,
                    gid,
                    lam_nov=xcfg.lam_nov,
                    kappa_clip=xcfg.kappa_clip,
                    full_reward=xcfg.full_reward,
                )
                m.update(sm)
            scalar[rows] = torch.as_tensor(adv).to(scalar.dtype)
        advantages = scalar.to(response_mask.device).unsqueeze(-1) * response_mask
    if metrics is not None:
        metrics.update(m)
    return advantages, advantages


def register() -> None:
    """Add the estimator to verl's registry (idempotent: verl accepts re-registering the same function)."""
    from verl.trainer.ppo.core_algos import register_adv_est

    register_adv_est(ESTIMATOR_NAME)(compute_xrpo_outcome_advantage)
