"""Group-relative advantages and novelty-guided advantage sharpening.

XRPO paper, Section 2.1 (GRPO's group-normalised advantage) and Section 3.3 "XRPO Exploitation of the Sampling
Trajectories", Eqs. (4)-(6); Algorithm 1 line 14 (A+ <- AdvSharp(Eval, Y_comp, pi_theta)).

Every function takes numpy arrays or torch tensors and returns the type it was given (torch keeps dtype and device;
integer inputs give float64 in numpy and torch's default float dtype in torch). Group statistics use a 1-D integer
``group_ids`` vector, one id per rollout: ids are arbitrary integers, need not be contiguous or sorted, and groups may
have different sizes (XRPO gives each prompt its own number of rollouts), so nothing is ever reshaped to (-1, G).
Statistics are computed in float64 (float32 on Apple MPS, which has no float64) and cast back.

Group means are computed after subtracting one member of the group (the "shifted data" algorithm): a group whose
values are all equal then has a mean equal to that value bit for bit, so its advantages are exactly 0 and its
novelties exactly 1, not 1e-17 away.
"""

from __future__ import annotations

import sys

import numpy as np

__all__ = ["group_advantages", "length_normalized_loglik", "novelty", "sharpen_advantages"]

ADV_SCALES = ("std", "none")


# ---------------------------------------------------------------------------------------------------------------
# backend helpers
# ---------------------------------------------------------------------------------------------------------------


def _is_tensor(x) -> bool:
    # torch is only looked up if already imported: a numpy-only caller never pays for importing it.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


# CPU tensors run through the numpy code on zero-copy views (results come back as tensors of the input's dtype):
# at these sizes torch's CPU kernels are 2-3x slower, and being OpenMP-parallel they stall for a scheduler quantum
# per op (measured: torch.exp on 16k floats, 0.02 ms -> 11 ms) when another process holds one of the cores.
# Accelerator tensors, tensors that require grad and bfloat16 use the torch code. Tests switch this off to run the
# torch code on CPU.
_CPU_TENSORS_VIA_NUMPY = True


def _numpy_view(t) -> np.ndarray | None:
    """A zero-copy numpy view of a tensor that the numpy code can serve, else None."""
    import torch

    if (
        not _CPU_TENSORS_VIA_NUMPY
        or t.device.type != "cpu"
        or t.requires_grad
        or t.dtype in (torch.bfloat16, torch.bool)
        or t.is_complex()
    ):
        return None
    try:
        return t.numpy()
    except (RuntimeError, TypeError):  # conjugate / negative views, exotic dtypes
        return None


def _compute_dtype_torch(device):
    import torch

    return torch.float32 if device.type == "mps" else torch.float64


def _out_dtype_np(x: np.ndarray):
    return x.dtype if np.issubdtype(x.dtype, np.floating) else np.dtype(np.float64)


def _out_dtype_torch(x):
    import torch

    return x.dtype if torch.is_floating_point(x) else torch.get_default_dtype()


def _np_1d(x, name: str, n: int | None = None) -> np.ndarray:
    if _is_tensor(x):
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a 1-D numeric array, got {type(x).__name__}") from None
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per rollout), got shape {a.shape}")
    if n is not None and a.shape[0] != n:
        raise ValueError(f"{name} has {a.shape[0]} entries, expected {n} (one per rollout)")
    if not (np.issubdtype(a.dtype, np.number) and not np.issubdtype(a.dtype, np.complexfloating)):
        raise ValueError(f"{name} must hold real numbers, got dtype {a.dtype}")
    return a


def _torch_1d(x, name: str, device, n: int | None = None):
    import torch

    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(_np_1d(x, name, n))
    if x.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per rollout), got shape {tuple(x.shape)}")
    if n is not None and x.shape[0] != n:
        raise ValueError(f"{name} has {x.shape[0]} entries, expected {n} (one per rollout)")
    if x.is_complex() or x.dtype == torch.bool:
        raise ValueError(f"{name} must hold real numbers, got dtype {x.dtype}")
    return x.detach().to(device)


def _check_finite_np(x: np.ndarray, name: str) -> None:
    if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
        i = int(np.flatnonzero(~np.isfinite(x))[0])
        raise ValueError(f"{name} must be finite; found {x[i]} at index {i}")


def _check_finite_torch(x, name: str) -> None:
    import torch

    if torch.is_floating_point(x) and not bool(torch.isfinite(x).all()):
        i = int(torch.nonzero(~torch.isfinite(x))[0, 0])
        raise ValueError(f"{name} must be finite; found {x[i].item()} at index {i}")


def _check_ids_dtype(is_integer: bool, dtype) -> None:
    if not is_integer:
        raise ValueError(f"group_ids must be integers (one group id per rollout), got dtype {dtype}")


class _GroupsNp:
    """inverse index (N,), first member of each group (G,), group sizes (G,)."""

    def __init__(self, group_ids, n: int):
        g = _np_1d(group_ids, "group_ids", n)
        _check_ids_dtype(np.issubdtype(g.dtype, np.integer), g.dtype)
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


class _GroupsTorch:
    # index_select, not x[idx]: advanced indexing runs an OpenMP kernel that is ~500x slower on a busy 2-core CPU
    def __init__(self, group_ids, n: int, device):
        import torch

        g = _torch_1d(group_ids, "group_ids", device, n)
        _check_ids_dtype(not torch.is_floating_point(g), g.dtype)
        lo, hi = (int(v) for v in torch.stack([g.min(), g.max()]).tolist()) if n else (0, 0)
        if n and hi - lo < 2 * n + 65536:
            # ids in a compact range (the usual case): bincount over the range, ~3x faster than torch.unique's sort
            off = g.to(torch.long) - lo
            present = torch.bincount(off) > 0
            self.inv = torch.index_select(torch.cumsum(present, 0) - 1, 0, off)
            self.counts = torch.bincount(self.inv)
        else:
            _, self.inv, self.counts = torch.unique(g, sorted=True, return_inverse=True, return_counts=True)
        self.size = self.counts.shape[0]
        # first member of each group (deterministic, unlike a plain scatter)
        self.first = torch.full((self.size,), n, dtype=torch.long, device=device).scatter_reduce_(
            0, self.inv, torch.arange(n, device=device), reduce="amin", include_self=True
        )

    def spread(self, v):
        import torch

        return torch.index_select(v, 0, self.inv)

    def sum(self, x):
        import torch

        return torch.zeros(self.size, dtype=x.dtype, device=x.device).index_add_(0, self.inv, x)

    def deviation(self, x):
        import torch

        d = x - self.spread(torch.index_select(x, 0, self.first))
        d -= self.spread(self.sum(d) / self.counts.to(x.dtype))
        return d


# ---------------------------------------------------------------------------------------------------------------
# GRPO advantage (Section 2.1)
# ---------------------------------------------------------------------------------------------------------------


def group_advantages(rewards, group_ids, *, scale: str = "std", eps: float = 1e-6):
    """Group-relative advantage of GRPO (and Dr. GRPO with ``scale="none"``).

    XRPO paper, Section 2.1: A_i = (R_i - mu_g) / sigma_g over the rollouts of the same prompt; here
    A_i = (R_i - mu_g) / (sigma_g + eps) with sigma_g the sample std (ddof=1, as verl and TRL use).
    A group whose rewards are all equal (sigma_g = 0, including a group of one rollout) gets A_i = 0 exactly, even
    with eps = 0: it carries no signal.

    Args:
        rewards: R, shape (N,), finite; numpy array or torch tensor.
        group_ids: shape (N,), integer group (prompt) id of each rollout; any ints, any order.
        scale: "std" (GRPO: divide by sigma_g + eps) or "none" (Dr. GRPO: R_i - mu_g).
        eps: >= 0, added to sigma_g.

    Returns:
        A, shape (N,), same array type as ``rewards`` (torch: same dtype/device).
    """
    if scale not in ADV_SCALES:
        raise ValueError(f"scale must be one of {list(ADV_SCALES)}, got {scale!r}")
    eps = float(eps)
    if not np.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    if _is_tensor(rewards):
        view = _numpy_view(rewards)
        if view is None:
            return _group_advantages_torch(rewards, group_ids, scale, eps)
        return _from_numpy_like(_group_advantages_np(view, group_ids, scale, eps), rewards)
    return _group_advantages_np(rewards, group_ids, scale, eps)


def _from_numpy_like(out: np.ndarray, like):
    import torch

    return torch.from_numpy(out).to(_out_dtype_torch(like))


def _group_advantages_np(rewards, group_ids, scale: str, eps: float) -> np.ndarray:
    r = _np_1d(rewards, "rewards")
    _check_finite_np(r, "rewards")
    groups = _GroupsNp(group_ids, r.shape[0])
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
    return adv.astype(_out_dtype_np(r), copy=False)


def _group_advantages_torch(rewards, group_ids, scale: str, eps: float):
    import torch

    r = _torch_1d(rewards, "rewards", rewards.device)
    _check_finite_torch(r, "rewards")
    groups = _GroupsTorch(group_ids, r.shape[0], r.device)
    x = r.to(_compute_dtype_torch(r.device))
    dev = groups.deviation(x)
    if scale == "none":
        adv = dev
    else:
        denom = (groups.counts - 1).clamp_min(1).to(x.dtype)
        std = torch.sqrt(groups.sum(dev * dev) / denom)
        # sigma_g = 0 -> divide the (exactly 0) deviations by inf: A = 0 even with eps = 0
        scale_g = torch.where(std > 0, std + eps, torch.inf)
        # A_i = (R_i - mu_g) / (sigma_g + eps)
        adv = dev / groups.spread(scale_g)
    return adv.to(_out_dtype_torch(rewards))


# ---------------------------------------------------------------------------------------------------------------
# Eq. (4)
# ---------------------------------------------------------------------------------------------------------------


def length_normalized_loglik(token_logprobs, mask):
    """Length-normalised log-likelihood of each completion.

    XRPO paper, Section 3.3, Eq. (4): s(y) = (1/|y|) sum_{t=1}^{|y|} log pi_theta(y_t | x, y_<t).

    |y| counts the completion's tokens including the EOS token the model emitted (it is a sampled token with a
    log-prob like any other), so a completion that stopped at once still has |y| = 1. Positions where ``mask`` is
    0 are ignored entirely (they may hold any value, even NaN). A row with no unmasked token has no s(y) and raises.

    Args:
        token_logprobs: shape (B, T), log pi_theta of each sampled token; finite where ``mask`` is 1.
        mask: shape (B, T), bool or 0/1, 1 on the completion's tokens. bool is fastest.

    Returns:
        s, shape (B,), same array type as ``token_logprobs`` (torch: same dtype/device). Sums accumulate in float64
        for float64 input, else in float32.
    """
    if _is_tensor(token_logprobs):
        return _length_normalized_loglik_torch(token_logprobs, mask)
    try:
        lp = np.asarray(token_logprobs)
        m = mask.detach().cpu().numpy() if _is_tensor(mask) else np.asarray(mask)
    except (TypeError, ValueError) as e:  # e.g. ragged nested lists
        raise ValueError(f"token_logprobs and mask must be rectangular (B, T) arrays: {e}") from None
    return _length_normalized_loglik_np(lp, m)


def _check_ll_shapes(lp_shape, m_shape) -> None:
    if len(lp_shape) != 2:
        raise ValueError(f"token_logprobs must be 2-D (B, T), got shape {tuple(lp_shape)}")
    if tuple(m_shape) != tuple(lp_shape):
        raise ValueError(f"mask must have the shape of token_logprobs {tuple(lp_shape)}, got {tuple(m_shape)}")


def _length_normalized_loglik_np(lp: np.ndarray, m: np.ndarray) -> np.ndarray:
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


def _raise_bad_token(finite: np.ndarray, m: np.ndarray):
    bad = np.argwhere(m & ~finite)
    if bad.shape[0]:
        row, col = (int(v) for v in bad[0])
        raise ValueError(f"token_logprobs must be finite on unmasked tokens; row {row}, token {col} is not")
    raise ValueError("token_logprobs: the sum of a row overflowed")


def _length_normalized_loglik_torch(token_logprobs, mask):
    import torch

    lp = token_logprobs
    m = mask if isinstance(mask, torch.Tensor) else torch.as_tensor(np.asarray(mask))
    _check_ll_shapes(lp.shape, m.shape)
    if not torch.is_floating_point(lp):
        raise ValueError(f"token_logprobs must be a floating tensor, got dtype {lp.dtype}")
    view = _numpy_view(lp) if m.device.type == "cpu" else None
    if view is not None:
        # torch's CPU masked reductions are 3-5x slower than numpy's fused scan on a zero-copy view
        return torch.from_numpy(_length_normalized_loglik_np(view, m.detach().numpy()))
    m = m.to(lp.device)
    if m.dtype != torch.bool:
        if m.is_complex() or not bool(((m == 0) | (m == 1)).all()):
            raise ValueError(f"mask must be bool or hold only 0 and 1, got dtype {m.dtype} with other values")
        m = m != 0
    counts = m.sum(dim=-1)
    if not bool(counts.all()):
        row = int(torch.nonzero(counts == 0)[0, 0])
        raise ValueError(
            f"mask row {row} has no token: s(y) of Eq. (4) is undefined for an empty completion "
            "(the EOS token counts as a token)"
        )
    acc = torch.float64 if lp.dtype == torch.float64 else torch.float32
    # Eq. (4): s(y) = (1/|y|) * sum_t log pi_theta(y_t | x, y_<t)
    sums = torch.where(m, lp, 0.0).sum(dim=-1, dtype=acc)
    if not bool(torch.isfinite(sums).all()):
        _raise_bad_token(torch.isfinite(lp).cpu().numpy(), m.cpu().numpy())
    return (sums / counts.to(acc)).to(lp.dtype)


# ---------------------------------------------------------------------------------------------------------------
# Eqs. (5)-(6)
# ---------------------------------------------------------------------------------------------------------------


def novelty(scores, group_ids):
    """Novelty of each rollout relative to its own group.

    XRPO paper, Section 3.3, Eq. (5): eta_i = exp(s(y_i) - s_bar_g), s_bar_g the mean score over the rollouts of
    y_i's group (prompt). eta_i < 1 marks a rollout less likely than its group's average (novel). A group of one
    rollout, or whose scores are all equal, has eta = 1 exactly.

    Args:
        scores: s(y), shape (N,), finite (from :func:`length_normalized_loglik`).
        group_ids: shape (N,), integer group id per rollout.

    Returns:
        eta, shape (N,), same array type as ``scores``.
    """
    if _is_tensor(scores):
        import torch

        view = _numpy_view(scores)
        if view is not None:
            return _from_numpy_like(_novelty_np(view, group_ids), scores)
        s = _torch_1d(scores, "scores", scores.device)
        _check_finite_torch(s, "scores")
        groups = _GroupsTorch(group_ids, s.shape[0], s.device)
        x = s.to(_compute_dtype_torch(s.device))
        # Eq. (5): eta_i = exp(s(y_i) - s_bar)
        return torch.exp(groups.deviation(x)).to(_out_dtype_torch(scores))
    return _novelty_np(scores, group_ids)


def _novelty_np(scores, group_ids) -> np.ndarray:
    s = _np_1d(scores, "scores")
    _check_finite_np(s, "scores")
    groups = _GroupsNp(group_ids, s.shape[0])
    x = s.astype(np.float64)
    # Eq. (5): eta_i = exp(s(y_i) - s_bar)
    return np.exp(groups.deviation(x)).astype(_out_dtype_np(s), copy=False)


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


def sharpen_advantages(advantages, rewards, scores, group_ids, *, lam_nov: float = 2.5, kappa_clip: float = 0.5,
                       full_reward: float = 1.0):
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
        (A_plus, metrics): A_plus of shape (N,) and the array type/dtype/device of ``advantages``; metrics, floats:
        ``adv/sharpen_eligible`` (rollouts with full reward), ``adv/sharpened_count`` (bonus > 0),
        ``adv/negative_bonus_count`` (bonus < 0), ``adv/mean_bonus`` (mean over bonus > 0; 0 if none),
        ``adv/max_bonus`` (max over eligible; 0 if none), ``adv/mean_novelty`` (mean eta over eligible; 1 if none).
    """
    lam, kappa, full = _check_sharpen_knobs(lam_nov, kappa_clip, full_reward)
    if _is_tensor(advantages):
        view = _numpy_view(advantages)
        if view is None:
            return _sharpen_torch(advantages, rewards, scores, group_ids, lam, kappa, full)
        out, metrics = _sharpen_np(view, rewards, scores, group_ids, lam, kappa, full)
        return _from_numpy_like(out, advantages), metrics
    return _sharpen_np(advantages, rewards, scores, group_ids, lam, kappa, full)


def _sharpen_np(advantages, rewards, scores, group_ids, lam: float, kappa: float, full: float):
    a = _np_1d(advantages, "advantages")
    n = a.shape[0]
    r = _np_1d(rewards, "rewards", n)
    s = _np_1d(scores, "scores", n)
    for x, name in ((a, "advantages"), (r, "rewards"), (s, "scores")):
        _check_finite_np(x, name)
    groups = _GroupsNp(group_ids, n)
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
    out = np.add(a64, bonus, out=kappa_a).astype(_out_dtype_np(a), copy=False)
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


def _sharpen_torch(advantages, rewards, scores, group_ids, lam: float, kappa: float, full: float):
    import torch

    dev_ = advantages.device
    a = _torch_1d(advantages, "advantages", dev_)
    n = a.shape[0]
    r = _torch_1d(rewards, "rewards", dev_, n)
    s = _torch_1d(scores, "scores", dev_, n)
    for x, name in ((a, "advantages"), (r, "rewards"), (s, "scores")):
        _check_finite_torch(x, name)
    groups = _GroupsTorch(group_ids, n, dev_)
    cd = _compute_dtype_torch(dev_)
    a64 = a.to(cd)
    x = s.to(cd)
    # Eq. (5): eta_i = exp(s(y_i) - s_bar)
    eta = torch.exp(groups.deviation(x))
    # Eq. (6): A_i^+ = A_i + min{max{lam_nov (1 - eta_i), 0}, kappa_clip A_i}   (full-reward rollouts only)
    # (lam * max(1 - eta, 0) equals max(lam (1 - eta), 0) for lam >= 0, and stays 0, not NaN, if lam = 0, eta = inf)
    bonus = torch.minimum(lam * (1.0 - eta).clamp_min(0.0), kappa * a64)
    eligible = r >= full
    bonus = torch.where(eligible, bonus, 0.0)  # no bonus (exactly +0.0, so A_i + 0 = A_i) below full reward
    out = (a64 + bonus).to(_out_dtype_torch(advantages))
    pos = bonus > 0
    # one device->host transfer for all metrics
    n_elig, n_pos, n_neg, sum_pos, max_b, sum_eta = torch.stack([
        eligible.sum().to(cd),
        pos.sum().to(cd),
        (bonus < 0).sum().to(cd),
        torch.where(pos, bonus, 0.0).sum(),
        torch.where(eligible, bonus, -torch.inf).max() if n else torch.tensor(-torch.inf, dtype=cd, device=dev_),
        torch.where(eligible, eta, 0.0).sum(),
    ]).tolist()
    metrics = {
        "adv/sharpen_eligible": n_elig,
        "adv/sharpened_count": n_pos,
        "adv/negative_bonus_count": n_neg,
        "adv/mean_bonus": sum_pos / n_pos if n_pos else 0.0,
        "adv/max_bonus": max_b if n_elig else 0.0,
        "adv/mean_novelty": sum_eta / n_elig if n_elig else 1.0,
    }
    return out, metrics
