"""Tests for xrpo.algo.sampling (DAPO dynamic sampling): hand cases, torch inputs, a loop twin, validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xrpo.algo.sampling import dynamic_sampling_keep_groups, dynamic_sampling_mask


def _ref_keep_groups(rewards, group_ids, atol=0.0):
    """Loop twin: collect each group's rewards in a dict, keep the ids whose max - min exceeds atol."""
    groups: dict[int, list[float]] = {}
    for r, g in zip(rewards, group_ids):
        groups.setdefault(int(g), []).append(float(r))
    return sorted(g for g, rs in groups.items() if max(rs) - min(rs) > atol)


def test_hand_computed():
    # group 7: (1, 0, 1) mixed -> kept; group 3: (1, 1) all correct -> dropped; group 12: (0, 0, 0) -> dropped;
    # group 5: a single rollout -> trivially all equal -> dropped; group -2: (0.5, 0.25) -> kept
    rewards = [1, 1, 0, 1, 0, 0, 1, 1, 0, 0.5, 0.25]
    gids = [7, 3, 7, 3, 12, 12, 7, 5, 12, -2, -2]
    np.testing.assert_array_equal(dynamic_sampling_keep_groups(rewards, gids), [-2, 7])
    np.testing.assert_array_equal(
        dynamic_sampling_mask(rewards, gids),
        [True, False, True, False, False, False, True, False, False, True, True],
    )


def test_numpy_and_torch_inputs_agree():
    rewards = np.array([0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    gids = np.array([4, 4, 9, 9, 2, 2])
    expected_mask = np.array([True, True, False, False, False, False])
    m_np = dynamic_sampling_mask(rewards, gids)
    assert isinstance(m_np, np.ndarray) and m_np.dtype == np.bool_
    np.testing.assert_array_equal(m_np, expected_mask)
    m_t = dynamic_sampling_mask(torch.tensor(rewards), torch.tensor(gids))
    assert isinstance(m_t, torch.Tensor) and m_t.dtype == torch.bool and m_t.device == torch.tensor(0.0).device
    np.testing.assert_array_equal(m_t.numpy(), expected_mask)
    # mixed inputs: a torch tensor anywhere gives a torch mask
    assert isinstance(dynamic_sampling_mask(rewards, torch.tensor(gids)), torch.Tensor)
    keep = dynamic_sampling_keep_groups(torch.tensor(rewards, dtype=torch.float32), torch.tensor(gids))
    assert isinstance(keep, np.ndarray)
    np.testing.assert_array_equal(keep, [4])
    # a float32 reward tensor with requires_grad is fine (detached)
    r = torch.tensor([0.0, 1.0], requires_grad=True)
    np.testing.assert_array_equal(dynamic_sampling_keep_groups(r, torch.tensor([1, 1])), [1])


def test_atol():
    rewards = [0.1 + 0.2, 0.3, 1.0, 1.0 + 1e-9]
    gids = [0, 0, 1, 1]
    # exact comparison: 0.1 + 0.2 != 0.3 in floating point, 1.0 != 1.0 + 1e-9
    np.testing.assert_array_equal(dynamic_sampling_keep_groups(rewards, gids), [0, 1])
    np.testing.assert_array_equal(dynamic_sampling_keep_groups(rewards, gids, atol=1e-6), [])
    for bad in (-1.0, float("nan"), float("inf"), True, "0.1", None):  # a finite real >= 0, never a bool
        with pytest.raises(ValueError, match=r"atol: expected a finite number >= 0, got"):
            dynamic_sampling_keep_groups(rewards, gids, atol=bad)
        with pytest.raises(ValueError, match=r"atol: expected a finite number >= 0, got"):
            dynamic_sampling_mask(rewards, gids, atol=bad)
    # atol is keyword-only (a third positional argument is refused, not read as the tolerance)
    for fn in (dynamic_sampling_keep_groups, dynamic_sampling_mask):
        with pytest.raises(TypeError):
            fn(rewards, gids, 1e-6)


def test_empty_and_all_equal():
    assert dynamic_sampling_keep_groups([], []).size == 0
    assert dynamic_sampling_mask(np.zeros(0), np.zeros(0, dtype=np.int64)).shape == (0,)
    assert not dynamic_sampling_mask([1.0] * 5, [0, 0, 1, 1, 1]).any()


@pytest.mark.parametrize("seed", range(20))
def test_matches_loop_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    n_groups = int(rng.integers(1, 30))
    ids = rng.choice(rng.integers(-1000, 1000, n_groups), n)  # non-contiguous, unsorted ids
    binary = seed % 2 == 0
    rewards = rng.integers(0, 2, n).astype(float) if binary else rng.choice([0.0, 0.5, 1.0], n)
    expected = _ref_keep_groups(rewards, ids)
    np.testing.assert_array_equal(dynamic_sampling_keep_groups(rewards, ids), expected)
    np.testing.assert_array_equal(dynamic_sampling_mask(rewards, ids), np.isin(ids, expected))
    np.testing.assert_array_equal(
        dynamic_sampling_mask(torch.from_numpy(rewards), torch.from_numpy(ids)).numpy(), np.isin(ids, expected)
    )


def test_validation():
    with pytest.raises(ValueError, match="group_ids"):
        dynamic_sampling_mask([1.0, 0.0], [0])
    with pytest.raises(ValueError, match="rewards"):
        dynamic_sampling_mask([[1.0, 0.0]], [0, 0])
    with pytest.raises(ValueError, match="group_ids"):
        dynamic_sampling_mask([1.0, 0.0], [0.0, 0.5])
    with pytest.raises(ValueError, match="group_ids"):
        dynamic_sampling_mask([1.0, 0.0], [True, False])
    with pytest.raises(ValueError, match="rewards"):
        dynamic_sampling_mask([1.0, float("nan")], [0, 0])
    with pytest.raises(ValueError, match="rewards"):
        dynamic_sampling_keep_groups(torch.tensor([1.0, float("inf")]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="rewards"):
        dynamic_sampling_keep_groups(["a", "b"], [0, 0])
