"""Policy losses over token log-probabilities: GRPO/DAPO's clipped surrogate, GSPO, loss aggregation, KL.

Every policy loss has one signature (docs/design.md)::

    fn(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, agg_mode,
       global_tokens=None, global_seqs=None, max_tokens=None) -> (loss, metrics)

with ``logprobs``, ``old_logprobs`` and ``mask`` of shape (B, T) and ``advantages`` of shape (B,) (one per
sequence, broadcast over its tokens). ``loss`` is a scalar tensor to minimise; ``metrics`` maps ``loss/*`` names to
Python floats:

- ``loss/clipfrac_low``: fraction of valid tokens where the lower clip binds (A < 0 and ratio < 1 - clip_low),
  i.e. where the token receives no gradient because the policy already moved far enough down.
- ``loss/clipfrac_high``: fraction of valid tokens where the upper clip binds (A > 0 and ratio > 1 + clip_high).
- ``loss/approx_kl``: mean over valid tokens of the k3 estimate of KL(pi_old || pi_theta) from the per-token
  log-ratio d = logp - old_logp: ``exp(d) - 1 - d`` (>= 0; Schulman's k3 with samples from pi_old). It is the
  token-level value for every loss, GSPO included, so runs with different losses log the same quantity.
- ``loss/ratio_mean``, ``loss/ratio_max``, ``loss/ratio_min``: statistics over valid tokens of the importance ratio the
  loss clips (the token ratio for "vanilla", the sequence ratio repeated on each of its tokens for GSPO). They are
  ``nan`` when the batch has no valid token.

Masked tokens never contribute: padded positions may hold any value, NaN included; they are replaced by 0 before any
arithmetic, so neither the loss nor its gradient sees them. Valid positions must be finite.

Extension beyond the contract: "vanilla" and "gspo_token" also accept per-token advantages of shape (B, T) (GSPO-token
exists for that case; with one advantage per sequence it equals GSPO exactly, value and gradient). "gspo" requires (B,).

Not included, on purpose: dual-clip PPO (verl's ``clip_ratio_c``) and clamping of log-ratios before ``exp``;
inputs are validated instead, and the losses compute exactly the equations below.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Real

import torch

from xrpo.algo.config import KL_ESTIMATORS
from xrpo.algo.config import LOSS_AGGS as AGG_MODES

__all__ = [
    "AGG_MODES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "aggregate_loss",
    "get_policy_loss",
    "is_advantage_weighted",
    "kl_penalty",
    "register_policy_loss",
]


PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]
POLICY_LOSSES: dict[str, PolicyLoss] = {}
_ADVANTAGE_WEIGHTED: set[str] = set()  # names registered with advantage_weighted=True


# --------------------------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------------------------


def register_policy_loss(name: str, *, advantage_weighted: bool = False) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator registering a policy loss under ``name``; registering a name twice raises ``ValueError``.

    ``advantage_weighted=True`` declares that every term of the loss is a multiple of an advantage, so that with every
    advantage 0 the loss and its gradient are exactly 0 (true of the clipped surrogates below: -min(r A, clip(r) A)).
    A trainer may then leave out the forward and backward passes of a step whose advantages are all 0
    (`xrpo.trainer.update.zero_gradient`); a loss with any other term (an entropy bonus, a penalty) must not declare
    it, and by default does not."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_policy_loss: name must be a non-empty string, got {name!r}")

    def decorator(fn: PolicyLoss) -> PolicyLoss:
        if name in POLICY_LOSSES:
            raise ValueError(f"register_policy_loss: a policy loss named {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        _ADVANTAGE_WEIGHTED.discard(name)  # a name removed from POLICY_LOSSES and registered again
        if advantage_weighted:
            _ADVANTAGE_WEIGHTED.add(name)
        return fn

    return decorator


def is_advantage_weighted(name: str) -> bool:
    """Whether the policy loss registered as ``name`` declared every term a multiple of an advantage
    (`register_policy_loss`); False for an unknown name."""
    return name in POLICY_LOSSES and name in _ADVANTAGE_WEIGHTED


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered as ``name``; an unknown name raises ``ValueError`` listing the valid ones."""
    try:
        return POLICY_LOSSES[name]
    except (KeyError, TypeError):
        valid = ", ".join(sorted(POLICY_LOSSES))
        raise ValueError(f"unknown policy loss {name!r}; valid names: {valid}") from None


# --------------------------------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------------------------------


def _check_float_2d(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor of shape (B, T), got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name}: expected shape (B, T), got {tuple(x.shape)}")
    if not torch.is_floating_point(x):
        raise ValueError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")
    return x


def _check_mask(mask: object, shape: torch.Size, what: str = "logprobs") -> torch.Tensor:
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"mask: expected a torch.Tensor of shape {tuple(shape)}, got {type(mask).__name__}")
    if mask.shape != shape:
        raise ValueError(f"mask: expected shape {tuple(shape)} (the shape of {what}), got {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask: expected only 0/1 (or bool) values")
    return mask.bool()


def _check_finite_where(name: str, x: torch.Tensor, valid: torch.Tensor) -> None:
    bad = valid & ~torch.isfinite(x.detach())
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name}: expected finite values at valid (mask=1) positions, got {x[idx].item()} at {idx}")


def _check_number(name: str, x: object, *, low: float, low_inclusive: bool, high: float | None = None) -> float:
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, Real):
        raise ValueError(f"{name}: expected a real number, got {x!r}")
    v = float(x)
    ok = math.isfinite(v) and (v >= low if low_inclusive else v > low) and (high is None or v < high)
    if not ok:
        lo = f"{'>=' if low_inclusive else '>'} {low}"
        hi = f" and < {high}" if high is not None else ""
        raise ValueError(f"{name}: expected a finite number {lo}{hi}, got {x!r}")
    return v


def _check_agg_mode(agg_mode: object) -> str:
    if agg_mode not in AGG_MODES:
        raise ValueError(f"agg_mode: unknown aggregation mode {agg_mode!r}; valid modes: {', '.join(AGG_MODES)}")
    return agg_mode  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------------------------------


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    agg_mode: str,
    *,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    max_tokens: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss matrix to a scalar.

    Args:
        loss_mat: (B, T) per-token losses; masked positions are ignored (may hold anything).
        mask: (B, T) bool or 0/1; 1 marks a valid response token.
        agg_mode: one of
            - ``"token-mean"`` (DAPO, Yu et al. 2025, "Token-Level Policy Gradient Loss"): sum of valid token losses
              divided by the number of valid tokens.
            - ``"seq-mean-token-mean"`` (GRPO, Shao et al. 2024, Eq. 3: (1/G) sum_i (1/|o_i|) sum_t): each sequence's
              token mean, then the mean over sequences.
            - ``"seq-mean-token-sum-norm"`` (Dr. GRPO, Liu et al. 2025): each sequence's token sum divided by the
              constant ``max_tokens`` (the generation budget), then the mean over sequences.
            Sequences without any valid token contribute nothing and are not counted.
        global_tokens: for ``token-mean``, the number of valid tokens in the whole batch this micro-batch belongs to;
            it replaces the local count as denominator.
        global_seqs: for the two ``seq-mean`` modes, the number of sequences with at least one valid token in the
            whole batch; it replaces the local count. With both given, summing the micro-batch losses gives exactly
            the full-batch loss (gradient accumulation without reweighting).
        max_tokens: the constant of ``seq-mean-token-sum-norm`` (required there, ignored elsewhere).

    Returns:
        A scalar tensor of ``loss_mat``'s dtype (0 when there is no valid token).
    """
    loss_mat = _check_float_2d("loss_mat", loss_mat)
    valid = _check_mask(mask, loss_mat.shape, what="loss_mat")
    _check_agg_mode(agg_mode)
    _check_finite_where("loss_mat", loss_mat, valid)
    # where (not multiply) so that NaN/inf at padded positions cannot leak into the sum or its gradient
    masked = torch.where(valid, loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device))

    if agg_mode == "token-mean":
        n_local = int(valid.sum())
        if global_tokens is None:
            denom = float(max(n_local, 1))
        else:
            denom = _check_number("global_tokens", global_tokens, low=0.0, low_inclusive=False)
            if denom < n_local:
                raise ValueError(
                    f"global_tokens: {denom:g} is smaller than the {n_local} valid tokens of this micro-batch"
                )
        # L = sum_{i,t} m_it l_it / N_tokens
        return masked.sum() / denom

    seq_len = valid.sum(dim=-1)  # (B,)
    n_local = int((seq_len > 0).sum())
    if global_seqs is None:
        denom = float(max(n_local, 1))
    else:
        denom = _check_number("global_seqs", global_seqs, low=0.0, low_inclusive=False)
        if denom < n_local:
            raise ValueError(
                f"global_seqs: {denom:g} is smaller than the {n_local} non-empty sequences of this micro-batch"
            )
    token_sum = masked.sum(dim=-1)  # (B,)
    if agg_mode == "seq-mean-token-mean":
        # L = (1/G) sum_i (1/|o_i|) sum_t l_it
        seq_loss = token_sum / seq_len.clamp(min=1).to(loss_mat.dtype)
    else:
        if max_tokens is None:
            raise ValueError("max_tokens: required for agg_mode 'seq-mean-token-sum-norm' (the generation budget)")
        m = _check_number("max_tokens", max_tokens, low=0.0, low_inclusive=False)
        # L = (1/G) sum_i (1/max_tokens) sum_t l_it
        seq_loss = token_sum / m
    return seq_loss.sum() / denom


# --------------------------------------------------------------------------------------------------------------------
# KL penalty
# --------------------------------------------------------------------------------------------------------------------


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    kind: str = "k3",
    *,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled from pi_theta (XRPO §2.1, the beta D_KL term).

    Args:
        logprobs: (B, T) log pi_theta(y_t | x, y_<t) (carries the gradient).
        ref_logprobs: (B, T) log pi_ref of the same tokens (treated as a constant).
        kind: ``"k1"``: logp - ref (unbiased, can be negative); ``"k3"``: exp(ref - logp) - (ref - logp) - 1
            (unbiased, >= 0, lower variance; GRPO's estimator, Shao et al. 2024 Eq. 4, verl's ``low_var_kl`` without
            its clamp).
        mask: optional (B, T); masked positions are set to 0 and are exempt from the finiteness check. Without it
            every position must be finite.

    Returns:
        (B, T) per-token KL estimates; aggregate them with :func:`aggregate_loss` and scale by beta (``kl_coef``).
    """
    logprobs = _check_float_2d("logprobs", logprobs)
    ref_logprobs = _check_float_2d("ref_logprobs", ref_logprobs)
    if ref_logprobs.shape != logprobs.shape:
        raise ValueError(
            f"ref_logprobs: expected shape {tuple(logprobs.shape)} (the shape of logprobs), "
            f"got {tuple(ref_logprobs.shape)}"
        )
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"kind: unknown KL estimator {kind!r}; valid: {', '.join(KL_ESTIMATORS)}")
    if mask is None:
        valid = torch.ones_like(logprobs, dtype=torch.bool)
    else:
        valid = _check_mask(mask, logprobs.shape)
    _check_finite_where("logprobs", logprobs, valid)
    _check_finite_where("ref_logprobs", ref_logprobs, valid)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    logp = torch.where(valid, logprobs, zero)
    ref = torch.where(valid, ref_logprobs.detach(), zero)
    if kind == "k1":
        # k1 = log pi_theta - log pi_ref
        kl = logp - ref
    else:
        d = ref - logp
        # k3 = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1
        kl = torch.exp(d) - d - 1.0
    return torch.where(valid, kl, zero)


# --------------------------------------------------------------------------------------------------------------------
# Policy losses
# --------------------------------------------------------------------------------------------------------------------


def _prepare(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    agg_mode: str,
    *,
    token_advantages: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float, float]:
    """Validate the common arguments; return (logp, old, adv (B, T), valid, clip_low, clip_high), padding zeroed."""
    logprobs = _check_float_2d("logprobs", logprobs)
    old_logprobs = _check_float_2d("old_logprobs", old_logprobs)
    if old_logprobs.shape != logprobs.shape:
        raise ValueError(
            f"old_logprobs: expected shape {tuple(logprobs.shape)} (the shape of logprobs), "
            f"got {tuple(old_logprobs.shape)}"
        )
    valid = _check_mask(mask, logprobs.shape)
    b, t = logprobs.shape
    if not isinstance(advantages, torch.Tensor) or not torch.is_floating_point(advantages):
        raise ValueError(f"advantages: expected a floating-point torch.Tensor of shape ({b},), got {advantages!r}")
    if advantages.shape == (b,):
        adv = advantages.detach()[:, None].expand(b, t)
    elif token_advantages and advantages.shape == (b, t):
        adv = advantages.detach()
    else:
        allowed = f"({b},) or ({b}, {t})" if token_advantages else f"({b},) (one advantage per sequence)"
        raise ValueError(f"advantages: expected shape {allowed}, got {tuple(advantages.shape)}")
    clip_low = _check_number("clip_low", clip_low, low=0.0, low_inclusive=True, high=1.0)
    clip_high = _check_number("clip_high", clip_high, low=0.0, low_inclusive=True)
    _check_agg_mode(agg_mode)
    _check_finite_where("logprobs", logprobs, valid)
    _check_finite_where("old_logprobs", old_logprobs, valid)
    _check_finite_where("advantages", adv, valid)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    logp = torch.where(valid, logprobs, zero)
    old = torch.where(valid, old_logprobs.detach(), zero)
    adv = torch.where(valid, adv.to(logprobs.dtype), zero)
    return logp, old, adv, valid, clip_low, clip_high


def _clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, valid: torch.Tensor, clip_low: float, clip_high: float
) -> torch.Tensor:
    bad = valid & ~torch.isfinite(ratio.detach())
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"logprobs: the importance ratio overflows at {idx} (logprobs - old_logprobs too large for "
            f"{ratio.dtype}); are logprobs and old_logprobs computed on the same tokens?"
        )
    # l = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
    return -torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv)


def _metrics(
    ratio: torch.Tensor,
    log_ratio: torch.Tensor,
    adv: torch.Tensor,
    valid: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> dict[str, float]:
    ratio, log_ratio = ratio.detach(), log_ratio.detach()
    n = int(valid.sum())
    if n == 0:
        nan = float("nan")
        return {
            "loss/clipfrac_low": 0.0,
            "loss/clipfrac_high": 0.0,
            "loss/approx_kl": 0.0,
            "loss/ratio_mean": nan,
            "loss/ratio_max": nan,
            "loss/ratio_min": nan,
        }
    low = valid & (adv < 0) & (ratio < 1.0 - clip_low)
    high = valid & (adv > 0) & (ratio > 1.0 + clip_high)
    # k3 of KL(pi_old || pi_theta) with samples from pi_old: r - 1 - log r
    k3 = torch.expm1(log_ratio) - log_ratio
    r = ratio[valid]
    return {
        "loss/clipfrac_low": float(low.sum()) / n,
        "loss/clipfrac_high": float(high.sum()) / n,
        "loss/approx_kl": float(k3[valid].sum()) / n,
        "loss/ratio_mean": float(r.mean()),
        "loss/ratio_max": float(r.max()),
        "loss/ratio_min": float(r.min()),
    }


@register_policy_loss("vanilla", advantage_weighted=True)
def vanilla_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    agg_mode: str,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    max_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped surrogate of GRPO (XRPO §2.1; Shao et al. 2024 Eq. 3) with DAPO's decoupled clip.

    r_t = pi_theta(y_t | x, y_<t) / pi_old(y_t | x, y_<t) and
    loss_t = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A), aggregated by ``agg_mode``.
    GRPO uses eps_low = eps_high = 0.2; DAPO's Clip-Higher 0.2 / 0.28.

    Args:
        logprobs: (B, T) current-policy token log-probs (carries the gradient).
        old_logprobs: (B, T) log-probs of the policy that sampled the tokens (constant).
        advantages: (B,) one per sequence, or (B, T) per token (constant).
        mask: (B, T) bool or 0/1.
        clip_low, clip_high: eps_low in [0, 1) and eps_high >= 0.
        agg_mode, global_tokens, global_seqs, max_tokens: see :func:`aggregate_loss`.

    Returns:
        (loss, metrics); see the module docstring for the metrics.
    """
    logp, old, adv, valid, clip_low, clip_high = _prepare(
        logprobs, old_logprobs, advantages, mask, clip_low, clip_high, agg_mode, token_advantages=True
    )
    log_ratio = logp - old
    # r_t = exp(log pi_theta - log pi_old)
    ratio = torch.exp(log_ratio)
    loss_mat = _clipped_surrogate(ratio, adv, valid, clip_low, clip_high)
    loss = aggregate_loss(
        loss_mat, valid, agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, max_tokens=max_tokens
    )
    return loss, _metrics(ratio, log_ratio, adv, valid, clip_low, clip_high)


def _sequence_log_ratio(log_ratio: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    # log s_i = (1/|y_i|) sum_t (log pi_theta(y_i,t) - log pi_old(y_i,t))
    return log_ratio.sum(dim=-1) / valid.sum(dim=-1).clamp(min=1).to(log_ratio.dtype)


@register_policy_loss("gspo", advantage_weighted=True)
def gspo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    agg_mode: str,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    max_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO's sequence-level clipped objective (Zheng et al. 2025, arXiv 2507.18071, §4.1, Eq. 5).

    s_i = (pi_theta(y_i | x) / pi_old(y_i | x))^(1/|y_i|) = exp(mean over valid tokens of (logp - old_logp)), and
    loss_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), written on each valid token of the sequence so
    that ``agg_mode`` applies; with ``seq-mean-token-mean`` (GSPO's own choice) this is exactly (1/G) sum_i loss_i.
    The gradient reaches every token of y_i through s_i with weight 1/|y_i|. The paper's clip range is 3e-4 / 4e-4.

    Args:
        logprobs, old_logprobs, mask: (B, T) as in :func:`vanilla_policy_loss`.
        advantages: (B,) one per sequence (a sequence-level ratio needs a sequence-level advantage).
        clip_low, clip_high, agg_mode, global_tokens, global_seqs, max_tokens: as in :func:`vanilla_policy_loss`.

    Returns:
        (loss, metrics); clip fractions and ratio statistics use s_i, counted once per valid token.
    """
    logp, old, adv, valid, clip_low, clip_high = _prepare(
        logprobs, old_logprobs, advantages, mask, clip_low, clip_high, agg_mode, token_advantages=False
    )
    log_ratio = logp - old
    # s_i = exp((1/|y_i|) sum_t log r_i,t), repeated on each token of y_i
    seq_ratio = torch.exp(_sequence_log_ratio(log_ratio, valid))[:, None].expand_as(log_ratio)
    loss_mat = _clipped_surrogate(seq_ratio, adv, valid, clip_low, clip_high)
    loss = aggregate_loss(
        loss_mat, valid, agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, max_tokens=max_tokens
    )
    return loss, _metrics(seq_ratio, log_ratio, adv, valid, clip_low, clip_high)


@register_policy_loss("gspo_token", advantage_weighted=True)
def gspo_token_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    agg_mode: str,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    max_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO-token (Zheng et al. 2025, arXiv 2507.18071, §4.3): per-token ratios with GSPO's value.

    s_i,t = sg[s_i] * pi_theta(y_i,t) / sg[pi_theta(y_i,t)]: numerically s_i on every token, but the gradient of token t
    flows only through its own log-prob, so a per-token advantage A_i,t weights it individually. With one advantage per
    sequence (shape (B,)) GSPO-token equals :func:`gspo_policy_loss` in value, clipping and gradient (the paper's
    remark in §4.3); it differs only with per-token advantages (shape (B, T)).

    Args:
        logprobs, old_logprobs, mask: (B, T) as in :func:`vanilla_policy_loss`.
        advantages: (B,) or (B, T).
        clip_low, clip_high, agg_mode, global_tokens, global_seqs, max_tokens: as in :func:`vanilla_policy_loss`.

    Returns:
        (loss, metrics) as for :func:`gspo_policy_loss`.
    """
    logp, old, adv, valid, clip_low, clip_high = _prepare(
        logprobs, old_logprobs, advantages, mask, clip_low, clip_high, agg_mode, token_advantages=True
    )
    log_ratio = logp - old
    log_seq = _sequence_log_ratio(log_ratio, valid).detach()
    # log s_i,t = sg[log s_i] + log pi_theta(y_i,t) - sg[log pi_theta(y_i,t)]
    token_ratio = torch.exp(log_seq[:, None] + logp - logp.detach())
    loss_mat = _clipped_surrogate(token_ratio, adv, valid, clip_low, clip_high)
    loss = aggregate_loss(
        loss_mat, valid, agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, max_tokens=max_tokens
    )
    return loss, _metrics(token_ratio, log_ratio, adv, valid, clip_low, clip_high)
