"""DAPO's dynamic-sampling group filter (Yu et al. 2025, arXiv 2503.14476, §3.2 "Dynamic Sampling").

DAPO over-samples and drops every prompt whose rollouts all received the same reward (accuracy 1 or 0): such a group
has zero group-relative advantage and contributes no gradient. These functions are the filter; refilling the batch
with further generation rounds (up to ``max_gen_batches``) is the training loop's job.

Groups are identified by ``group_ids`` (one integer per rollout; ids need not be contiguous or sorted), never by
reshaping, because XRPO gives each prompt its own number of rollouts.

Difference from verl's DAPO recipe: verl keeps a group of a single rollout (``std > 0 or len == 1``); here a group of
one rollout has trivially equal rewards and is dropped, consistent with ``group_advantages`` giving it advantage 0.
Equality is exact by default (``max - min <= atol`` with ``atol = 0``), not ``std > 0``, so float round-off in a
mean cannot keep a constant group.
"""

from __future__ import annotations

import math
import sys
from numbers import Real

import numpy as np

__all__ = ["dynamic_sampling_keep_groups", "dynamic_sampling_mask"]


def _torch(x: object):
    """torch when ``x`` is a torch tensor, else None. torch is not imported here: whoever holds a tensor has imported
    it, and reading a config (which names these functions' modes) needs no torch."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and isinstance(x, torch.Tensor) else None


def _to_numpy(name: str, x: object) -> np.ndarray:
    if _torch(x) is not None:
        return x.detach().cpu().numpy()
    try:
        return np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - report any conversion failure as bad input
        raise ValueError(f"{name}: expected a 1-D array or tensor, got {type(x).__name__}") from exc


def _group_range(rewards: object, group_ids: object, atol: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate; return (unique ids sorted, keep flag per unique id, inverse index per rollout)."""
    r = _to_numpy("rewards", rewards)
    g = _to_numpy("group_ids", group_ids)
    if r.ndim != 1:
        raise ValueError(f"rewards: expected a 1-D array (one reward per rollout), got shape {r.shape}")
    if g.ndim != 1:
        raise ValueError(f"group_ids: expected a 1-D array (one id per rollout), got shape {g.shape}")
    if r.shape[0] != g.shape[0]:
        raise ValueError(f"group_ids: expected {r.shape[0]} ids (one per reward), got {g.shape[0]}")
    if r.dtype == np.bool_ or not (np.issubdtype(r.dtype, np.floating) or np.issubdtype(r.dtype, np.integer)):
        raise ValueError(f"rewards: expected real numbers, got dtype {r.dtype}")
    if g.size == 0 and g.dtype == np.float64:  # np.asarray([]) is float64; an empty id list is fine
        g = g.astype(np.int64)
    if g.dtype == np.bool_ or not np.issubdtype(g.dtype, np.integer):
        raise ValueError(f"group_ids: expected integer ids, got dtype {g.dtype}")
    r = r.astype(np.float64, copy=False)
    bad = np.flatnonzero(~np.isfinite(r))
    if bad.size:
        raise ValueError(f"rewards: expected finite values, got {r[bad[0]]} at index {int(bad[0])}")
    if isinstance(atol, bool) or not isinstance(atol, Real) or not math.isfinite(atol) or atol < 0:
        raise ValueError(f"atol: expected a finite number >= 0, got {atol!r}")
    uniq, inv = np.unique(g, return_inverse=True)
    inv = inv.reshape(-1)
    gmax = np.full(uniq.shape[0], -np.inf)
    gmin = np.full(uniq.shape[0], np.inf)
    np.maximum.at(gmax, inv, r)
    np.minimum.at(gmin, inv, r)
    # keep group g iff max_g R - min_g R > atol (rewards not all equal)
    keep = (gmax - gmin) > atol
    return uniq, keep, inv


def dynamic_sampling_keep_groups(rewards: object, group_ids: object, *, atol: float = 0.0) -> np.ndarray:
    """Ids of the groups whose rewards are not all equal (DAPO dynamic sampling, Yu et al. 2025 §3.2).

    Args:
        rewards: (N,) reward per rollout, numpy array, torch tensor or sequence of real numbers; finite.
        group_ids: (N,) integer group id per rollout (numpy or torch).
        atol: rewards within ``atol`` of each other count as equal (default 0: exact equality).

    Returns:
        A numpy array of the kept group ids, ascending, with ``group_ids``' dtype.
    """
    uniq, keep, _ = _group_range(rewards, group_ids, atol)
    return uniq[keep]


def dynamic_sampling_mask(rewards: object, group_ids: object, *, atol: float = 0.0):
    """Boolean mask over rollouts: True for rollouts whose group's rewards are not all equal.

    Args:
        rewards, group_ids, atol: as in :func:`dynamic_sampling_keep_groups`.

    Returns:
        (N,) bool mask: a ``torch.bool`` tensor on the device of ``rewards`` (or of ``group_ids``) when either is a
        torch tensor, otherwise a numpy array.
    """
    _, keep, inv = _group_range(rewards, group_ids, atol)
    mask = keep[inv]
    for x in (rewards, group_ids):
        if (torch := _torch(x)) is not None:
            return torch.from_numpy(mask).to(x.device)
    return mask
