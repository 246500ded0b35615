"""Tests of xrpo.algo.tree: TreePO's branching budget, its split, and the tree-based advantage (arXiv 2508.17445)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from xrpo.algo.tree import (
    TreeStructure,
    branch_budget,
    divergence_weights,
    divide_width,
    global_whiten,
    tree_advantages,
)

# ---------------------------------------------------------------------------------------------------------------
# slow reference twins: one leaf, one ancestor at a time
# ---------------------------------------------------------------------------------------------------------------


def ref_tree_advantages(rewards, ancestors: list[list[int]], weighting="mean"):
    """ancestors[i]: leaf i's ancestor node ids, root first. A node's sub-group is every leaf that has it among its
    ancestors (whatever column), so this does not rely on the column layout the fast code uses."""
    out = []
    for i, anc in enumerate(ancestors):
        num = den = 0.0
        for node in anc:
            group = [k for k in range(len(ancestors)) if node in ancestors[k]]
            if len(group) < 2:
                continue
            mean = sum(rewards[k] for k in group) / len(group)
            w = 1.0 if weighting == "mean" else float(len(group))
            num += w * (rewards[i] - mean)
            den += w
        out.append(num / den if den else 0.0)
    return np.array(out)


def ref_global_whiten(adv, lengths, eps=1e-8):
    tokens = [a for a, n in zip(adv, lengths) for _ in range(int(n))]  # broadcast to tokens, as verl does
    mu = sum(tokens) / len(tokens)
    var = sum((t - mu) ** 2 for t in tokens) / (len(tokens) - 1)
    return np.array([(a - mu) / math.sqrt(var + eps) for a in adv])


def as_matrix(ancestors: list[list[int]]) -> np.ndarray:
    D = max(len(a) for a in ancestors)
    m = np.full((len(ancestors), D), -1, dtype=np.int64)
    for i, a in enumerate(ancestors):
        m[i, : len(a)] = a
    return m


def random_forest(rng, trees: int) -> list[list[int]]:
    """Leaves' ancestor lists of `trees` random trees with unique node ids; a leaf is a node without children."""
    next_id = [0]
    leaves: list[list[int]] = []

    def grow(path: list[int], depth: int) -> None:
        node = next_id[0]
        next_id[0] += 1
        kids = 0 if depth >= 4 else int(rng.integers(0, 4)) if depth else int(rng.integers(1, 4))
        if kids == 0:
            leaves.append(path)  # the leaf's own node is not its ancestor
            return
        for _ in range(kids):
            grow(path + [node], depth + 1)

    for _ in range(trees):
        grow([], 0)
    order = rng.permutation(len(leaves))
    return [leaves[i] for i in order]


# ---------------------------------------------------------------------------------------------------------------
# tree_advantages
# ---------------------------------------------------------------------------------------------------------------

# One prompt, width 5:                       root (id 0)
#                                          /            \
#                                    a (id 1)            b (id 2)
#                                   /       \           /       \
#                          leaf a1 R=1    a2 (id 3)   leaf b1 R=0  leaf b2 R=0
#                                        /       \
#                                 leaf x R=1   leaf y R=0
HAND_ANCESTORS = [[0, 1], [0, 1, 3], [0, 1, 3], [0, 2], [0, 2]]  # a1, x, y, b1, b2
HAND_REWARDS = [1.0, 1.0, 0.0, 0.0, 0.0]


def test_tree_advantages_hand_mean():
    # sub-group means: root {a1,x,y,b1,b2} = 2/5 = 0.4; a {a1,x,y} = 2/3; a2 {x,y} = 1/2; b {b1,b2} = 0
    # a1: (1 - 0.4, 1 - 2/3) -> (0.6 + 1/3) / 2 = 0.466667
    # x:  (0.6, 1/3, 1 - 0.5) -> (0.6 + 1/3 + 0.5) / 3 = 0.477778
    # y:  (-0.4, -2/3, -0.5) -> -1.566667 / 3 = -0.522222
    # b1, b2: (-0.4, 0 - 0) -> -0.2
    adv, m = tree_advantages(HAND_REWARDS, as_matrix(HAND_ANCESTORS))
    assert_allclose(adv, [(0.6 + 1 / 3) / 2, (0.6 + 1 / 3 + 0.5) / 3, (-0.4 - 2 / 3 - 0.5) / 3, -0.2, -0.2], rtol=1e-12)
    assert m["adv/tree_subgroups_mean"] == pytest.approx((2 + 3 + 3 + 2 + 2) / 5)


def test_tree_advantages_hand_size_weighted():
    # Eq. (6): weights |G_j| = 5 (root), 3 (a), 2 (a2), 2 (b)
    # a1: (5*0.6 + 3*(1/3)) / 8 = 4/8 = 0.5;  x: (3 + 1 + 2*0.5) / 10 = 0.5;  y: (-2 - 2 - 1) / 10 = -0.5
    # b1: (5*(-0.4) + 2*0) / 7 = -2/7
    adv, _ = tree_advantages(HAND_REWARDS, as_matrix(HAND_ANCESTORS), weighting="size")
    assert_allclose(adv, [0.5, 0.5, -0.5, -2 / 7, -2 / 7], rtol=1e-12)


def test_tree_advantages_trees_do_not_mix_and_row_order_is_free():
    # a second prompt's tree (ids 10, 11) after the first one, rows shuffled: the first tree's values do not change
    other = [[10, 11], [10, 11], [10]]
    rewards = HAND_REWARDS + [1.0, 0.0, 1.0]
    anc = HAND_ANCESTORS + other
    perm = np.random.default_rng(0).permutation(len(anc))
    adv, _ = tree_advantages(np.array(rewards)[perm], as_matrix([anc[i] for i in perm]))
    alone, _ = tree_advantages(HAND_REWARDS, as_matrix(HAND_ANCESTORS))
    back = np.empty_like(adv)
    back[perm] = adv
    assert_allclose(back[:5], alone, rtol=1e-12)
    # second tree: root mean 2/3, node 11 mean 1/2
    # leaf 0: (1 - 2/3, 1 - 1/2) / 2 = 5/12; leaf 1: (-2/3, -1/2) / 2 = -7/12; leaf 2 (root only): 1 - 2/3 = 1/3
    assert_allclose(back[5:], [5 / 12, -7 / 12, 1 / 3], rtol=1e-12)


def test_tree_advantages_root_only_is_grpo_mean_centred():
    # every leaf hangs off the root: the tree advantage is R - mean(group), GRPO without the division by std
    r = np.array([1.0, 0.0, 0.0, 1.0, 1.0])
    adv, _ = tree_advantages(r, np.zeros((5, 1), dtype=int))
    assert_allclose(adv, r - 0.6, rtol=1e-12)


def test_tree_advantages_edge_cases():
    # all rewards equal: every sub-group advantage is exactly 0
    adv, m = tree_advantages([1.0] * 5, as_matrix(HAND_ANCESTORS))
    assert_array_equal(adv, np.zeros(5))
    assert m["adv/tree_zero_frac"] == 1.0
    # a tree with one leaf: no sub-group of two, advantage 0 (GRPO's singleton convention)
    adv, _ = tree_advantages([1.0], [[7]])
    assert_array_equal(adv, [0.0])
    # a chain under the root shared by two leaves counts once per depth: (R - m) at root, a, b -> same mean
    adv, _ = tree_advantages([1.0, 0.0], [[0, 1, 2], [0, 1, 2]])
    assert_allclose(adv, [0.5, -0.5])
    # empty batch
    adv, m = tree_advantages(np.zeros(0), np.zeros((0, 1), dtype=int))
    assert adv.shape == (0,) and m == {"adv/tree_subgroups_mean": 0.0, "adv/tree_zero_frac": 0.0}


@pytest.mark.parametrize(
    "rewards, anc, kwargs, match",
    [
        ([1.0, 0.0], [[0], [-1]], {}, "root in column 0"),
        ([1.0, 0.0], [[0, -1, 2], [0, 1, 2]], {}, "followed only by -1"),
        ([1.0], [[0], [0]], {}, r"shape \(N, D\)"),
        ([float("nan")], [[0]], {}, "finite"),
        ([1.0], [[0.5]], {}, "integers"),
        ([1.0], [[0]], {"weighting": "max"}, "weighting must be one of"),
    ],
)
def test_tree_advantages_bad_input(rewards, anc, kwargs, match):
    with pytest.raises(ValueError, match=match):
        tree_advantages(rewards, np.array(anc), **kwargs)


def test_tree_advantages_weighting_is_keyword_only():
    with pytest.raises(TypeError):
        tree_advantages([1.0, 0.0], np.zeros((2, 1), dtype=int), "size")


def test_tree_structure_is_frozen_and_hashable_by_identity():
    # frozen: a plan's trees cannot be edited after sampling; eq=False: compared and hashed by identity (comparing
    # numpy fields would be ambiguous), so a structure can key a dict
    ts = TreeStructure(ancestor_ids=np.zeros((2, 1), dtype=int), lengths=np.ones(2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ts.lengths = np.zeros(2)
    twin = TreeStructure(ancestor_ids=ts.ancestor_ids, lengths=ts.lengths)
    assert ts == ts and ts != twin and len({ts: 1, twin: 2}) == 2


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("weighting", ["mean", "size"])
def test_tree_advantages_matches_reference(seed, weighting):
    rng = np.random.default_rng(seed)
    anc = random_forest(rng, int(rng.integers(1, 5)))
    r = (rng.random(len(anc)) < 0.5).astype(float) if seed % 2 else rng.normal(0.0, 2.0, len(anc))
    got, _ = tree_advantages(r, as_matrix(anc), weighting=weighting)
    assert_allclose(got, ref_tree_advantages(r, anc, weighting), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# global_whiten
# ---------------------------------------------------------------------------------------------------------------


def test_global_whiten_hand():
    # A = [1, -1], L = [1, 3]: 4 tokens [1, -1, -1, -1]; mu = -2/4 = -0.5
    # var = (1.5^2 + 3 * 0.5^2) / (4 - 1) = (2.25 + 0.75) / 3 = 1.0  ->  A' = [1.5, -0.5] / sqrt(1 + 1e-8)
    assert_allclose(global_whiten([1.0, -1.0], [1, 3]), np.array([1.5, -0.5]) / math.sqrt(1 + 1e-8), rtol=1e-14)


def test_global_whiten_edge_cases():
    assert_array_equal(global_whiten([2.0], [1]), [0.0])  # one token: no variance
    # two tokens are enough: mu = 0.5, var = 2 * 0.25 / (2 - 1) = 0.5 -> (A - mu) / sqrt(0.5 + eps)
    assert_allclose(global_whiten([1.0, 0.0], [1, 1]), np.array([0.5, -0.5]) / math.sqrt(0.5 + 1e-8), rtol=1e-14)
    assert_array_equal(global_whiten([2.0, 5.0], [0, 0]), [0.0, 0.0])
    assert_allclose(global_whiten([3.0, 3.0], [2, 2]), [0.0, 0.0])  # equal values: centred to 0, no NaN
    with pytest.raises(ValueError, match="same shape"):
        global_whiten([1.0, 2.0], [1])
    with pytest.raises(ValueError, match=">= 0"):
        global_whiten([1.0], [-1])


@pytest.mark.parametrize("seed", range(5))
def test_global_whiten_matches_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 30))
    a, L = rng.normal(0, 1, n), rng.integers(1, 9, n)
    assert_allclose(global_whiten(a, L), ref_global_whiten(a, L), rtol=1e-10, atol=1e-12)
    # token-weighted mean of the result is 0
    assert abs(float((global_whiten(a, L) * L).sum())) < 1e-9


# ---------------------------------------------------------------------------------------------------------------
# branching budget and its split
# ---------------------------------------------------------------------------------------------------------------


def test_branch_budget_hand():
    # width 8, two live paths, nothing finished: each forks in two -> min(8 - 0, 2*0 + 2*2) = 4
    assert branch_budget(8, 0, 0, 2, 2) == 4
    # one of two paths finished: its forks move to the live one -> min(8 - 1, 2*1 + 2*1) = 4
    assert branch_budget(8, 1, 1, 1, 2) == 4
    # the width is reached: no more forks, one child per live path -> min(8 - 2, 2*2 + 2*6) = 6
    assert branch_budget(8, 2, 2, 6, 2) == 6
    # never below one child per live path, even past the width (the sampler never asks for this)
    assert branch_budget(4, 3, 0, 2, 2) == 2
    # wide branching is capped by the width left: min(16 - 0, 8 * 2) = 16
    assert branch_budget(16, 0, 0, 2, 8) == 16


@pytest.mark.parametrize(
    "args, match",
    [
        ((0, 0, 0, 1, 2), "width"),
        ((8, 1, 2, 1, 2), "finished_now"),
        ((8, 0, 0, 0, 2), "active"),
        ((8, 0, 0, 1, 0), "branch"),
        ((8.0, 0, 0, 1, 2), "width"),
    ],
)
def test_branch_budget_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        branch_budget(*args)


def test_branch_budget_smallest_tree():
    # a tree of width 1 (one rollout) runs one path and never forks
    assert branch_budget(1, 0, 0, 1, 2) == 1


@pytest.mark.parametrize("seed", range(20))
def test_branch_budget_never_exceeds_the_width(seed):
    # simulate trees: each step some live paths finish; the paths a tree runs + its leaves never exceed its width
    rng = np.random.default_rng(seed)
    w, b = int(rng.integers(1, 20)), int(rng.integers(1, 5))
    live, finished = min(b, w), 0
    while live:
        done = int(rng.binomial(live, 0.3))
        finished += done
        live -= done
        assert live + finished <= w
        if live == 0:
            break
        live = branch_budget(w, finished, done, live, b)
        assert live + finished <= w
    assert finished <= w


def test_divide_width_hand():
    assert_array_equal(divide_width(8, np.ones(3)), [3, 3, 2])  # 1 each, then 5 split 2/2/1, ties to the first
    assert_array_equal(divide_width(3, np.ones(3)), [1, 1, 1])
    # 1 each, then 4 by weight: quotas 2.8 / 0.8 / 0.4 -> floors 2/0/0, the 2 left go to the largest remainders
    assert_array_equal(divide_width(7, [0.7, 0.2, 0.1]), [4, 2, 1])
    with pytest.raises(ValueError, match="must be >= the number of live paths"):
        divide_width(2, np.ones(3))
    with pytest.raises(ValueError, match="non-empty"):
        divide_width(2, [])
    with pytest.raises(ValueError, match=r"weights must be a non-empty 1-D array \(one per live path\)"):
        divide_width(4, np.ones((2, 2)))
    # one live path takes the whole budget, down to a budget of 1
    assert_array_equal(divide_width(3, [1.0]), [3])
    assert_array_equal(divide_width(1, [0.5]), [1])
    with pytest.raises(ValueError, match=r"total must be an int >= 1, got 0"):
        divide_width(0, [1.0])


@pytest.mark.parametrize("seed", range(10))
def test_divide_width_sums_exactly_and_keeps_every_path(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    total = n + int(rng.integers(0, 30))
    w = divergence_weights(rng.normal(-2, 1, n), "low_logprob", 2.0)
    got = divide_width(total, w)
    assert got.sum() == total and got.min() >= 1 and got.dtype == np.int64


def test_divergence_weights_hand():
    # x = [-1, -3], T = 2: low -> softmax([0.5, 1.5]) = [1, e] / (1 + e); high -> the reverse
    low = divergence_weights([-1.0, -3.0], "low_logprob", 2.0)
    assert_allclose(low, [1 / (1 + math.e), math.e / (1 + math.e)], rtol=1e-12)
    assert_allclose(divergence_weights([-1.0, -3.0], "high_logprob", 2.0), low[::-1], rtol=1e-12)
    assert_allclose(divergence_weights([-1.0, -3.0, 0.0], "uniform"), [1 / 3] * 3)
    # extreme log-probs do not overflow
    assert_allclose(divergence_weights([-1e4, 0.0], "low_logprob", 1.0), [1.0, 0.0])
    for bad, match in [(dict(policy="random"), "policy"), (dict(temperature=0.0), "temperature")]:
        with pytest.raises(ValueError, match=match):
            divergence_weights([0.0], **{"policy": "low_logprob", **bad})
    # the temperature is a real number > 0, never a bool or a string
    for bad in (True, "2.0", -1.0, float("nan")):
        with pytest.raises(ValueError, match="temperature must be a number > 0"):
            divergence_weights([0.0], "low_logprob", bad)
    # the default temperature is the paper's T = 2
    x = [-1.0, -3.0, -0.5]
    assert_array_equal(divergence_weights(x, "low_logprob"), divergence_weights(x, "low_logprob", 2.0))
    # one log-prob per live path: a 2-D or empty array is refused for every policy
    for policy in ("uniform", "low_logprob"):
        for bad in ([[0.0, 1.0]], []):
            with pytest.raises(ValueError, match="non-empty 1-D"):
                divergence_weights(bad, policy)
