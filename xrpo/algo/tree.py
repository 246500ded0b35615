"""TreePO's tree arithmetic: branching budgets, their split over live paths, and the tree-based advantage.

Li et al. 2025, "TreePO: Bridging the Gap of Policy Optimization and Efficacy and Inference Efficiency with Heuristic
Tree-based Modeling" (arXiv 2508.17445). Section 2.2 (segment-level tree sampling, "Branching Budget Transfer",
fallback), Section 4.4 (probability-based branching), Section 2.3 Eqs. (4)-(5) (tree-based advantage) and Section 4.2
Eq. (6) (the subgroup-size weighted variant). Behaviour the paper leaves open follows the authors' verl fork
(github.com/multimodal-art-projection/TreePO: `vllm_rollout_spmd.py::generate_sequences_tree_deepth_first_vanilla_mode`,
`core_algos.py::compute_tree_reinforce_plus_plus_baseline_outcome_advantage`); deviations are listed per function and
in docs/methods.md.

Pure numpy: integers and arrays in, arrays (and a metric dict) out. A tree is described to `tree_advantages` by each
leaf's ancestor node ids, one column per depth (column 0 the root), so leaves of different prompts, trees of
different shapes and leaves at different depths mix freely in one batch; nothing is reshaped per prompt.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from xrpo.algo.allocation import split_budget

__all__ = [
    "DIVERGENCE_POLICIES",
    "TREE_WEIGHTINGS",
    "TreeStructure",
    "branch_budget",
    "divergence_weights",
    "divide_width",
    "tree_advantages",
    "global_whiten",
]

DIVERGENCE_POLICIES = ("uniform", "low_logprob", "high_logprob")
TREE_WEIGHTINGS = ("mean", "size")


@dataclass(frozen=True, eq=False)
class TreeStructure:
    """The trees a batch of rollouts was sampled as: what TreePO's advantage needs beyond rewards and group ids
    (the ``tree`` input of the advantage kinds of `xrpo.algo.advantages`). Arrays are checked where they are used
    (`tree_advantages`, `global_whiten`)."""

    ancestor_ids: np.ndarray
    """(N, D) int: each rollout's ancestor node ids, root first, -1 padded (the input of `tree_advantages`)."""
    lengths: np.ndarray
    """(N,) completion tokens of each rollout: the token weights of `global_whiten`."""


def _int(x, name: str, minimum: int = 0) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {x!r}")
    return int(x)


def branch_budget(width: int, finished: int, finished_now: int, active: int, branch: int) -> int:
    """How many paths a tree runs in its next segment: TreePO's "Branching Budget Transfer" (§2.2).

    Every live path may fork into ``branch`` children, and the paths that finished in the step just done hand their
    forks over to the live ones; the total never exceeds what is left of the tree's width, and never falls below one
    child per live path (a live path is never dropped). The authors' code: ``divergence_budget_control="by_fixed_div"``.

    Args:
        width: w, the leaves the tree must end with (its rollout budget), >= 1.
        finished: leaves the tree has so far, this step's included, >= 0.
        finished_now: leaves that finished in the step just done, 0 <= finished_now <= finished.
        active: live paths to continue, >= 1.
        branch: b, the forks per live path per segment (TreePO: 2), >= 1.

    Returns:
        The number of paths of the next segment, >= ``active``; <= ``width - finished`` whenever
        ``active <= width - finished`` (which the sampler keeps true, so a tree never exceeds its width).
    """
    w = _int(width, "width", 1)
    f = _int(finished, "finished")
    f_now = _int(finished_now, "finished_now")
    n = _int(active, "active", 1)
    b = _int(branch, "branch", 1)
    if f_now > f:
        raise ValueError(f"finished_now ({f_now}) cannot exceed finished ({f})")
    # total = max(min(max(w - finished, 0), b * finished_now + b * active), active)
    return max(min(max(w - f, 0), b * f_now + b * n), n)


def divergence_weights(segment_logprob, policy: str = "uniform", temperature: float = 2.0) -> np.ndarray:
    """Weights of the live paths of one tree for splitting its branching budget (TreePO §4.4).

    ``"uniform"``: equal weights (TreePO's default, "fixed_avg"). ``"low_logprob"``: softmax(-x / T), more forks for
    paths whose last segment was unlikely (the paper's "Low Prob Encourage"); ``"high_logprob"``: softmax(x / T)
    ("High Prob Encourage"). x is the mean token log-prob of each path's last segment (§4.4: "conditioned on the log
    probabilities of their last segment"; the authors' ``node_logprob_weighted_div``), T = 2.0 in the paper.

    Args:
        segment_logprob: x, shape (N,), finite, N >= 1.
        policy: one of DIVERGENCE_POLICIES.
        temperature: T > 0.

    Returns:
        float64 array of shape (N,), positive, summing to 1.
    """
    if policy not in DIVERGENCE_POLICIES:
        raise ValueError(f"policy must be one of {DIVERGENCE_POLICIES}, got {policy!r}")
    x = np.asarray(segment_logprob, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"segment_logprob must be a non-empty 1-D array, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("segment_logprob must be finite")
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not temperature > 0:
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
    if policy == "uniform":
        return np.full(x.size, 1.0 / x.size)
    z = (-x if policy == "low_logprob" else x) / float(temperature)
    # w = softmax(±x / T), shifted by the max for stability
    e = np.exp(z - z.max())
    return e / e.sum()


def divide_width(total: int, weights) -> np.ndarray:
    """Split a tree's branching budget over its live paths: one child each, the rest in proportion to ``weights``.

    The floor of one child keeps every live path going (the paper: "all the active search paths are guaranteed with at
    least one branching budget", §4.4); the remaining ``total - N`` forks are split by largest remainder
    (`xrpo.algo.allocation.split_budget`), ties to the earlier path. Uniform weights therefore give an even split whose
    counts differ by at most one (the authors' ``fixed_avg`` gives the whole remainder to the last path instead).

    Args:
        total: the budget, an int >= N.
        weights: shape (N,), >= 0, N >= 1 (e.g. `divergence_weights`).

    Returns:
        int64 array of shape (N,), entries >= 1, summing exactly to ``total``.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"weights must be a non-empty 1-D array (one per live path), got shape {w.shape}")
    t = _int(total, "total", 1)
    if t < w.size:
        raise ValueError(f"total ({t}) must be >= the number of live paths ({w.size}): each keeps one child")
    # n_k = 1 + split(total - N, w)_k
    return 1 + split_budget(w, t - w.size)


def tree_advantages(rewards, ancestor_ids, *, weighting: str = "mean") -> tuple[np.ndarray, dict[str, float]]:
    """TreePO's tree-based advantage (§2.3, Eq. (5) without its denominator; Eq. (6) with ``weighting="size"``).

    Every node of a tree defines a sub-group: the leaves below it (the root's sub-group is GRPO's group). For leaf i
    and each of its ancestors at depth j (the root, then the node ending each of its segments but the last), the
    sub-group advantage is A_ij = R_i - mean(R over the sub-group G_j); the leaf's advantage aggregates them:

        mean   (Eq. 5, the paper's choice, "Average Weighted"):  A_i = (1/|J_i|) sum_j A_ij
        size   (Eq. 6, "Subgroup-size Weighted"):                 A_i = sum_j |G_j| A_ij / sum_j |G_j|

    over the depths J_i whose sub-group has at least two leaves (a single-leaf sub-group has no relative signal; the
    authors' code skips those below the root too). A leaf with no such ancestor gets 0. Eq. (5)'s division by a
    batch-wide standard deviation is `global_whiten`, applied after.

    Args:
        rewards: R, shape (N,), finite.
        ancestor_ids: int array of shape (N, D): row i holds the ids of leaf i's ancestors, root first, one per
            depth, padded with -1 after the last one. Ids are arbitrary non-negative ints, unique over the batch (a
            node of another tree must have another id); the same id in column j of two rows means the same node.
            Column 0 (the root) must be set for every row. A row whose ancestors are only its root gives GRPO's
            mean-centred advantage R_i - mean(group).
        weighting: "mean" or "size".

    Returns:
        (A, metrics): A of shape (N,) float64; metrics ``adv/tree_subgroups_mean`` (mean over leaves of |J_i|) and
        ``adv/tree_zero_frac`` (leaves whose advantage is exactly 0).
    """
    if weighting not in TREE_WEIGHTINGS:
        raise ValueError(f"weighting must be one of {TREE_WEIGHTINGS}, got {weighting!r}")
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"rewards must be 1-D, got shape {r.shape}")
    if not np.all(np.isfinite(r)):
        raise ValueError("rewards must be finite")
    a = np.asarray(ancestor_ids)
    if a.ndim != 2 or a.shape[0] != r.shape[0] or a.shape[1] == 0:
        raise ValueError(f"ancestor_ids must have shape (N, D) with N = {r.shape[0]} rewards and D >= 1, got {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"ancestor_ids must be integers, got dtype {a.dtype}")
    if np.any(a[:, 0] < 0):
        raise ValueError(
            f"ancestor_ids: every leaf needs a root in column 0; row {int(np.flatnonzero(a[:, 0] < 0)[0])} has none"
        )
    valid = a >= 0
    if np.any(valid[:, 1:] & ~valid[:, :-1]):
        raise ValueError("ancestor_ids: each row must be its ancestors followed only by -1 padding")
    N = r.shape[0]
    num = np.zeros(N)
    den = np.zeros(N)
    terms = np.zeros(N)
    for j in range(a.shape[1]):
        rows = np.flatnonzero(valid[:, j])
        if rows.size == 0:
            break
        _, inv, size = np.unique(a[rows, j], return_inverse=True, return_counts=True)
        # mean(R over G_j): per-node sums / counts, looked up for each leaf
        mean = np.bincount(inv, weights=r[rows], minlength=size.size) / size
        shared = size[inv] >= 2
        rows, inv = rows[shared], inv[shared]
        # A_ij = R_i - mean(R_k : k in G_j)
        a_ij = r[rows] - mean[inv]
        wgt = 1.0 if weighting == "mean" else size[inv].astype(np.float64)
        num[rows] += wgt * a_ij
        den[rows] += wgt
        terms[rows] += 1
    adv = np.divide(num, den, out=np.zeros(N), where=den > 0)
    metrics = {
        "adv/tree_subgroups_mean": float(terms.mean()) if N else 0.0,
        "adv/tree_zero_frac": float(np.mean(adv == 0.0)) if N else 0.0,
    }
    return adv, metrics


def global_whiten(advantages, lengths, eps: float = 1e-8) -> np.ndarray:
    """Batch-wide normalisation of per-sequence advantages, token-weighted: REINFORCE++'s global normalisation.

    TreePO §2.3: "we incorporate the global variance normalization strategy as in REINFORCE++" (Eq. 5's denominator).
    The authors broadcast each sequence's advantage to its tokens and whiten over every valid token of the batch
    (verl ``masked_whiten``: mean subtracted, unbiased variance); with one value per sequence that is

        mu = sum_i L_i A_i / sum_i L_i,   var = sum_i L_i (A_i - mu)^2 / (sum_i L_i - 1),
        A_i' = (A_i - mu) / sqrt(var + eps)

    Args:
        advantages: A, shape (N,), finite.
        lengths: L, shape (N,), completion tokens per sequence, >= 0 (a sequence with L = 0 has no weight).
        eps: added to the variance.

    Returns:
        float64 array of shape (N,). All zeros if fewer than two tokens carry weight.
    """
    a = np.asarray(advantages, dtype=np.float64)
    L = np.asarray(lengths, dtype=np.float64)
    if a.ndim != 1 or L.shape != a.shape:
        raise ValueError(f"advantages and lengths must be 1-D of the same shape, got {a.shape} and {L.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError("advantages must be finite")
    if np.any(L < 0) or not np.all(np.isfinite(L)):
        raise ValueError("lengths must be finite and >= 0")
    T = L.sum()
    if T < 2:
        return np.zeros_like(a)
    mu = float((L * a).sum() / T)
    var = float((L * (a - mu) ** 2).sum() / (T - 1))
    # A' = (A - mu) / sqrt(var + eps)
    return (a - mu) / np.sqrt(var + eps)
