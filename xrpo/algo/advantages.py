"""Group-relative advantages, novelty-guided advantage sharpening, and the registry of advantage kinds.

XRPO paper, Section 2.1 (GRPO's group-normalised advantage) and Section 3.3 "XRPO Exploitation of the Sampling
Trajectories", Eqs. (4)-(6); Algorithm 1 line 14 (A+ <- AdvSharp(Eval, Y_comp, pi_theta)).

Pure numpy. Inputs are anything ``numpy.asarray`` accepts (numpy arrays, lists, CPU torch tensors that do not require
grad, which verl's integration passes); outputs are numpy arrays of the input's float dtype (float64 for integer
input). Group statistics use a 1-D integer ``group_ids`` vector, one id per rollout: ids are arbitrary integers, need
not be contiguous or sorted, and groups may have different sizes (XRPO gives each prompt its own number of rollouts),
so nothing is ever reshaped to (-1, G). Statistics are computed in float64 and cast back.

Group means are computed after subtracting one member of the group (the "shifted data" algorithm): a group whose
values are all equal then has a mean equal to that value bit for bit, so its advantages are exactly 0 and its
novelties exactly 1, not 1e-17 away.

Advantage kinds (the per-rollout advantage before sharpening) are registered by name, like the policy losses of
`xrpo.algo.losses`; every kind has one signature::

    fn(rewards, group_ids, *, scale="std", tree=None) -> (advantages, metrics)

``rewards`` and ``group_ids`` of shape (N,); ``scale`` "std" or "none" (``ADV_SCALES``); ``tree`` a
`xrpo.algo.tree.TreeStructure` for the kinds that need the rollouts' trees (ignored by the others); ``advantages``
float64 of shape (N,); ``metrics`` ``adv/*`` floats, always with ``adv/mean`` and ``adv/abs_mean``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from xrpo.algo.tree import TreeStructure, global_whiten, tree_advantages

__all__ = [
    "ADVANTAGES",
    "ADV_SCALES",
    "get_advantage",
    "group_advantages",
    "length_normalized_loglik",
    "novelty",
    "register_advantage",
    "sharpen_advantages",
]

ADV_SCALES = ("std", "none")

Advantage = Callable[..., tuple[np.ndarray, dict[str, float]]]
ADVANTAGES: dict[str, Advantage] = {}


# ---------------------------------------------------------------------------------------------------------------
# input checks and group statistics
# ---------------------------------------------------------------------------------------------------------------


def _out_dtype(x: np.ndarray):
    return x.dtype if np.issubdtype(x.dtype, np.floating) else np.dtype(np.float64)


def _as_array(x, name: str) -> np.ndarray:
    try:
        return np.asarray(x)
    except (TypeError, ValueError, RuntimeError) as e:  # ragged lists, tensors that require grad, bfloat16 ...
        raise ValueError(f"{name} must be a numeric array (numpy array, list, CPU tensor without grad): {e}") from None


def _np_1d(x, name: str, n: int | None = None) -> np.ndarray:
    a = _as_array(x, name)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per rollout), got shape {a.shape}")
    if n is not None and a.shape[0] != n:
        raise ValueError(f"{name} has {a.shape[0]} entries, expected {n} (one per rollout)")
    if not (np.issubdtype(a.dtype, np.number) and not np.issubdtype(a.dtype, np.complexfloating)):
        raise ValueError(f"{name} must hold real numbers, got dtype {a.dtype}")
    return a


def _check_finite(x: np.ndarray, name: str) -> None:
    if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
        i = int(np.flatnonzero(~np.isfinite(x))[0])
        raise ValueError(f"{name} must be finite; found {x[i]} at index {i}")


class _Groups:
    """inverse index (N,), first member of each group (G,), group sizes (G,)."""

    def __init__(self, group_ids, n: int):
        g = _np_1d(group_ids, "group_ids", n)
        if not np.issubdtype(g.dtype, np.integer):
            raise ValueError(f"group_ids must be integers (one group id per rollout), got dtype {g.dtype}")
        lo = int(g.min()) if n else 0
        if n and int(g.max()) - lo < 2 * n + 65536:
            # ids in a compact range (the usual case): a bincount over the range replaces np.unique's sort, ~10x faster
            # (unsigned: g - min cannot wrap; signed: widen first so that, e.g., int8 127 - (-128) does not wrap)
            wide = g if np.issubdtype(g.dtype, np.unsignedinteger) else g.astype(np.int64, copy=False)
            off = (wide - wide.dtype.type(lo)).astype(np.intp, copy=False)
            present = np.bincount(off) > 0
            self.inv = (np.cumsum(present) - 1).take(off)
        else:
            self.inv = np.unique(g, return_inverse=True)[1].reshape(-1)
        self.counts = np.bincount(self.inv)
        self.size = self.counts.shape[0]
        # first member of each group: the shift of deviation()
        self.first = np.full(self.size, n, dtype=np.intp)
        np.minimum.at(self.first, self.inv, np.arange(n))

    def spread(self, v: np.ndarray) -> np.ndarray:
        """(G,) per-group values -> (N,) per-rollout values."""
        return v.take(self.inv)

    def sum(self, x: np.ndarray) -> np.ndarray:
        return np.bincount(self.inv, weights=x, minlength=self.size)

    def deviation(self, x: np.ndarray) -> np.ndarray:
        """x_i - mean of x over i's group, (N,) float64, shifted by the group's first member (exact 0 if constant)."""
        d = x - self.spread(x.take(self.first))
        d -= self.spread(self.sum(d) / self.counts)
        return d


# ---------------------------------------------------------------------------------------------------------------
# GRPO advantage (Section 2.1)
# ---------------------------------------------------------------------------------------------------------------


def group_advantages(rewards, group_ids, *, scale: str = "std", eps: float = 1e-6) -> np.ndarray:
    """Group-relative advantage of GRPO (and Dr. GRPO with ``scale="none"``).

    XRPO paper, Section 2.1: A_i = (R_i - mu_g) / sigma_g over the rollouts of the same prompt; here
    A_i = (R_i - mu_g) / (sigma_g + eps) with sigma_g the sample std (ddof=1, as verl and TRL use).
    A group whose rewards are all equal (sigma_g = 0, including a group of one rollout) gets A_i = 0 exactly, even
    with eps = 0: it carries no signal.

    Args:
        rewards: R, shape (N,), finite; any array-like.
        group_ids: shape (N,), integer group (prompt) id of each rollout; any ints, any order.
        scale: "std" (GRPO: divide by sigma_g + eps) or "none" (Dr. GRPO: R_i - mu_g).
        eps: >= 0, added to sigma_g.

    Returns:
        A, shape (N,), a numpy array of the dtype of ``rewards`` (float64 for integer rewards).
    """
    if scale not in ADV_SCALES:
        raise ValueError(f"scale must be one of {list(ADV_SCALES)}, got {scale!r}")
    eps = float(eps)
    if not np.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    r = _np_1d(rewards, "rewards")
    _check_finite(r, "rewards")
    groups = _Groups(group_ids, r.shape[0])
    x = r.astype(np.float64)
    dev = groups.deviation(x)
    if scale == "none":
        adv = dev
    else:
        std = np.sqrt(groups.sum(dev * dev) / np.maximum(groups.counts - 1, 1))
        # sigma_g = 0 -> divide the (exactly 0) deviations by inf: A = 0 even with eps = 0
        denom = np.where(std > 0, std + eps, np.inf)
        # A_i = (R_i - mu_g) / (sigma_g + eps)
        adv = np.divide(dev, groups.spread(denom), out=dev)
    return adv.astype(_out_dtype(r), copy=False)


# ---------------------------------------------------------------------------------------------------------------
# Eq. (4)
# ---------------------------------------------------------------------------------------------------------------


def length_normalized_loglik(token_logprobs, mask) -> np.ndarray:
    """Length-normalised log-likelihood of each completion.

    XRPO paper, Section 3.3, Eq. (4): s(y) = (1/|y|) sum_{t=1}^{|y|} log pi_theta(y_t | x, y_<t).

    |y| counts the completion's tokens including the EOS token the model emitted (it is a sampled token with a
    log-prob like any other), so a completion that stopped at once still has |y| = 1. Positions where ``mask`` is
    0 are ignored entirely (they may hold any value, even NaN). A row with no unmasked token has no s(y) and raises.

    Args:
        token_logprobs: shape (B, T), log pi_theta of each sampled token; finite where ``mask`` is 1.
        mask: shape (B, T), bool or 0/1, 1 on the completion's tokens. bool is fastest.

    Returns:
        s, shape (B,), a numpy array of the dtype of ``token_logprobs``. Sums accumulate in float64
        for float64 input, else in float32.
    """
    try:
        lp, m = np.asarray(token_logprobs), np.asarray(mask)
    except (TypeError, ValueError, RuntimeError) as e:  # ragged lists, tensors that require grad, bfloat16 ...
        raise ValueError(f"token_logprobs and mask must be rectangular (B, T) numeric arrays: {e}") from None
    _check_ll_shapes(lp.shape, m.shape)
    if not np.issubdtype(lp.dtype, np.floating):
        if not np.issubdtype(lp.dtype, np.integer):
            raise ValueError(f"token_logprobs must hold real numbers, got dtype {lp.dtype}")
        lp = lp.astype(np.float64)
    if m.dtype != np.bool_:
        if not np.issubdtype(m.dtype, np.number) or not np.all((m == 0) | (m == 1)):
            raise ValueError(f"mask must be bool or hold only 0 and 1, got dtype {m.dtype} with other values")
        m = m != 0
    # counting bytes of the bool mask is ~2x faster than np.count_nonzero along an axis
    counts = np.add.reduce(m.view(np.uint8), axis=1, dtype=np.int32)
    if not counts.all():
        row = int(np.flatnonzero(counts == 0)[0])
        raise ValueError(
            f"mask row {row} has no token: s(y) of Eq. (4) is undefined for an empty completion "
            "(the EOS token counts as a token)"
        )
    # Eq. (4): s(y) = (1/|y|) * sum_t log pi_theta(y_t | x, y_<t)
    if lp.dtype in (np.float32, np.float64):
        # sum_t lp * mask as one fused multiply-add pass: ~1.6x faster than a where= reduction on this memory-bound
        # (B, T) scan; accumulates in the input's precision (~6e-7 relative for float32 at T = 2048)
        sums = np.einsum("ij,ij->i", lp, m)
        bad = ~np.isfinite(sums)
        if bad.any():  # NaN/inf under the mask poisons a product; redo those rows skipping masked-out tokens
            sums[bad] = np.add.reduce(lp[bad], axis=1, where=m[bad], dtype=lp.dtype)
    else:
        sums = np.add.reduce(lp, axis=1, where=m, dtype=np.float32)
    if not np.isfinite(sums).all():
        _raise_bad_token(np.isfinite(lp), m)
    return (sums / counts).astype(lp.dtype, copy=False)


def _check_ll_shapes(lp_shape, m_shape) -> None:
    if len(lp_shape) != 2:
        raise ValueError(f"token_logprobs must be 2-D (B, T), got shape {tuple(lp_shape)}")
    if tuple(m_shape) != tuple(lp_shape):
        raise ValueError(f"mask must have the shape of token_logprobs {tuple(lp_shape)}, got {tuple(m_shape)}")


def _raise_bad_token(finite: np.ndarray, m: np.ndarray):
    bad = np.argwhere(m & ~finite)
    if bad.shape[0]:
        row, col = (int(v) for v in bad[0])
        raise ValueError(f"token_logprobs must be finite on unmasked tokens; row {row}, token {col} is not")
    raise ValueError("token_logprobs: the sum of a row overflowed")


# ---------------------------------------------------------------------------------------------------------------
# Eqs. (5)-(6)
# ---------------------------------------------------------------------------------------------------------------


def novelty(scores, group_ids) -> np.ndarray:
    """Novelty of each rollout relative to its own group.

    XRPO paper, Section 3.3, Eq. (5): eta_i = exp(s(y_i) - s_bar_g), s_bar_g the mean score over the rollouts of
    y_i's group (prompt). eta_i < 1 marks a rollout less likely than its group's average (novel). A group of one
    rollout, or whose scores are all equal, has eta = 1 exactly.

    Args:
        scores: s(y), shape (N,), finite (from :func:`length_normalized_loglik`).
        group_ids: shape (N,), integer group id per rollout.

    Returns:
        eta, shape (N,), a numpy array of the dtype of ``scores`` (float64 for integer scores).
    """
    s = _np_1d(scores, "scores")
    _check_finite(s, "scores")
    groups = _Groups(group_ids, s.shape[0])
    x = s.astype(np.float64)
    # Eq. (5): eta_i = exp(s(y_i) - s_bar)
    return np.exp(groups.deviation(x)).astype(_out_dtype(s), copy=False)


def _check_sharpen_knobs(lam_nov, kappa_clip, full_reward) -> tuple[float, float, float]:
    out = []
    for name, v, lo in (("lam_nov", lam_nov, 0.0), ("kappa_clip", kappa_clip, 0.0), ("full_reward", full_reward, None)):
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a finite number, got {v!r}") from None
        if not np.isfinite(f) or (lo is not None and f < lo):
            raise ValueError(f"{name} must be a finite number{' >= 0' if lo is not None else ''}, got {v!r}")
        out.append(f)
    return out[0], out[1], out[2]


def sharpen_advantages(
    advantages, rewards, scores, group_ids, *, lam_nov: float = 2.5, kappa_clip: float = 0.5, full_reward: float = 1.0
) -> tuple[np.ndarray, dict[str, float]]:
    """Novelty-guided advantage sharpening of correct rollouts.

    XRPO paper, Section 3.3, Eq. (6): for a rollout with reward >= ``full_reward``,
        A_i^+ = A_i + min{ max{lam_nov * (1 - eta_i), 0}, kappa_clip * A_i },
    with eta_i from Eq. (5); every other rollout keeps A_i. The formula is applied literally, with two consequences:
      * A_i = 0 (e.g. every rollout of the group is correct, so GRPO gives 0) caps the bonus at kappa * 0 = 0:
        all-correct groups get no bonus, however novel a rollout is.
      * A_i < 0 for a correct rollout (only possible if some reward exceeds ``full_reward`` or ``advantages`` are
        not GRPO advantages of these rewards) gives min{.., kappa A_i} = kappa A_i < 0, i.e. A_i^+ = (1 + kappa) A_i,
        a larger penalty whatever eta_i is. It is counted in ``adv/negative_bonus_count``.
    With rewards <= full_reward and GRPO advantages, a correct rollout has A_i >= 0 and the bonus lies in
    [0, kappa A_i].

    Args:
        advantages: A, shape (N,), finite (e.g. from :func:`group_advantages`).
        rewards: R, shape (N,), finite.
        scores: s(y), shape (N,), finite (from :func:`length_normalized_loglik`).
        group_ids: shape (N,), integer group id per rollout (the groups of Eq. 5's mean).
        lam_nov: lambda_nov >= 0, strength of the novelty bonus.
        kappa_clip: kappa_clip >= 0, the bonus is at most kappa_clip * A_i.
        full_reward: rewards >= this count as full reward.

    Returns:
        (A_plus, metrics): A_plus of shape (N,) and the dtype of ``advantages`` (a numpy array); metrics, floats:
        ``adv/sharpen_eligible`` (rollouts with full reward), ``adv/sharpened_count`` (bonus > 0),
        ``adv/negative_bonus_count`` (bonus < 0), ``adv/mean_bonus`` (mean over bonus > 0; 0 if none),
        ``adv/max_bonus`` (max over eligible; 0 if none), ``adv/mean_novelty`` (mean eta over eligible; 1 if none).
    """
    lam, kappa, full = _check_sharpen_knobs(lam_nov, kappa_clip, full_reward)
    a = _np_1d(advantages, "advantages")
    n = a.shape[0]
    r = _np_1d(rewards, "rewards", n)
    s = _np_1d(scores, "scores", n)
    for x, name in ((a, "advantages"), (r, "rewards"), (s, "scores")):
        _check_finite(x, name)
    groups = _Groups(group_ids, n)
    a64 = a.astype(np.float64, copy=False)
    # Eq. (5): eta_i = exp(s(y_i) - s_bar)
    eta = groups.deviation(s.astype(np.float64, copy=False))
    np.exp(eta, out=eta)
    eligible = r >= full
    # Eq. (6): A_i^+ = A_i + min{max{lam_nov (1 - eta_i), 0}, kappa_clip A_i}   (full-reward rollouts only)
    # (lam * max(1 - eta, 0) equals max(lam (1 - eta), 0) for lam >= 0, and stays 0, not NaN, if lam = 0, eta = inf;
    # computed in place: fresh (N,) temporaries cost more than the arithmetic here)
    bonus = np.subtract(1.0, eta)
    np.maximum(bonus, 0.0, out=bonus)
    bonus *= lam
    kappa_a = np.multiply(a64, kappa)
    np.minimum(bonus, kappa_a, out=bonus)
    bonus *= eligible  # no bonus (exactly +0.0, so A_i + 0 = A_i) below full reward
    out = np.add(a64, bonus, out=kappa_a).astype(_out_dtype(a), copy=False)
    # metrics without masked reductions (where= / boolean indexing are ~20x slower than these on random masks)
    n_elig = int(np.count_nonzero(eligible))
    n_pos = int(np.count_nonzero(bonus > 0))
    n_neg = int(np.count_nonzero(bonus < 0))
    max_bonus = 0.0
    if n_elig:
        # ineligible rollouts hold bonus 0, so the overall max is the eligible max unless every eligible one is < 0
        max_bonus = float(bonus.max()) if n_neg < n_elig else float(bonus[eligible].max())
    metrics = {
        "adv/sharpen_eligible": float(n_elig),
        "adv/sharpened_count": float(n_pos),
        "adv/negative_bonus_count": float(n_neg),
        "adv/mean_bonus": float(np.maximum(bonus, 0.0).sum() / n_pos) if n_pos else 0.0,
        "adv/max_bonus": max_bonus,
        # (not np.dot: a threaded BLAS call stalls for milliseconds when another process holds a core)
        "adv/mean_novelty": float(np.sum(eta * eligible) / n_elig) if n_elig else 1.0,
    }
    return out, metrics


# ---------------------------------------------------------------------------------------------------------------
# Registry of advantage kinds
# ---------------------------------------------------------------------------------------------------------------


def register_advantage(name: str) -> Callable[[Advantage], Advantage]:
    """Decorator registering an advantage kind under ``name``; registering a name twice raises ``ValueError``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_advantage: name must be a non-empty string, got {name!r}")

    def decorator(fn: Advantage) -> Advantage:
        if name in ADVANTAGES:
            raise ValueError(f"register_advantage: an advantage kind named {name!r} is already registered")
        ADVANTAGES[name] = fn
        return fn

    return decorator


def get_advantage(name: str) -> Advantage:
    """The advantage kind registered as ``name``; an unknown name raises ``ValueError`` listing the valid ones."""
    try:
        return ADVANTAGES[name]
    except (KeyError, TypeError):
        valid = ", ".join(sorted(ADVANTAGES))
        raise ValueError(f"unknown advantage kind {name!r}; valid names: {valid}") from None


def _with_summary(adv: np.ndarray, metrics: dict[str, float]) -> tuple[np.ndarray, dict[str, float]]:
    metrics.update({"adv/mean": float(np.mean(adv)), "adv/abs_mean": float(np.mean(np.abs(adv)))})
    return adv, metrics


@register_advantage("group")
def group_advantage_kind(rewards, group_ids, *, scale: str = "std", tree: TreeStructure | None = None):
    """GRPO's advantage by group id (Dr. GRPO with ``scale="none"``): `group_advantages`, float64. ``tree`` is
    ignored (a tree's leaves are one group of its prompt)."""
    adv = np.asarray(group_advantages(rewards, group_ids, scale=scale), dtype=np.float64)
    return _with_summary(adv, {})


@register_advantage("tree")
def tree_advantage_kind(rewards, group_ids, *, scale: str = "std", tree: TreeStructure | None = None):
    """TreePO's tree advantage (`xrpo.algo.tree.tree_advantages` over ``tree.ancestor_ids``), then with
    ``scale="std"`` TreePO's batch-wide, token-weighted normalisation (`global_whiten` by ``tree.lengths``) in place of
    GRPO's per-group std. ``group_ids`` is checked against the rewards; the trees' roots are the groups."""
    if scale not in ADV_SCALES:
        raise ValueError(f"scale must be one of {list(ADV_SCALES)}, got {scale!r}")
    if not isinstance(tree, TreeStructure):
        raise ValueError(f"advantage kind 'tree' needs tree=TreeStructure(ancestor_ids, lengths), got {tree!r}")
    r = _np_1d(rewards, "rewards")
    _np_1d(group_ids, "group_ids", r.shape[0])
    adv, metrics = tree_advantages(r, tree.ancestor_ids)
    if scale == "std":
        adv = global_whiten(adv, tree.lengths)
    return _with_summary(adv, metrics)
