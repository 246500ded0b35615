"""Hierarchical Rollout Planning (HRP): how many extra rollouts each prompt gets.

XRPO paper, Section 3.2 "XRPO Exploration on Valuable Prompts", Eqs. (1)-(3), and Algorithm 1 lines 2-13.

Every prompt first receives ``n_base`` rollouts (:func:`plan_phases`); then, for each of ``N_plan`` planning
rounds, the round's budget is handed out in proportion to the priority

    Pi_q = Delta_q(n_q) + phi_q(T, n_q)                                   (Eq. 3)

(:func:`allocate_round`), where ``Delta_q`` is the expected shrinkage of the Student-t confidence interval of the
prompt's mean reward from one more rollout (Eqs. 1-2) and ``phi_q`` a UCB-style bonus for sparsely sampled prompts.

Degenerate case the paper leaves open: a prompt whose rewards are all equal (all wrong, or all right) has
``s_q = 0``, hence ``h_q = Delta_q = 0``, and only the exploration bonus ``phi_q`` gives it rollouts. That is
intended: it is how zero-success prompts still receive rollouts in later rounds, which Algorithm 1 (line 10) turns
into ICL-seeded rollouts. With ``lam = 0`` such prompts get nothing while any other prompt has ``s_q > 0``.

Everything here is numpy/scipy on the host: the inputs are a few numbers per prompt.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from scipy import special

__all__ = [
    "PhasePlan",
    "allocate_round",
    "allocation_priority",
    "check_significance",
    "exploration_bonus",
    "plan_phases",
    "split_budget",
    "t_ci_half_width",
    "uncertainty_reduction",
]

ALLOC_MODES = ("proportional", "greedy")


# ---------------------------------------------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------------------------------------------


def _check_alpha(alpha: float) -> float:
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"alpha must be a number in (0, 1), got {alpha!r}") from None
    if not (0.0 < a < 1.0):
        raise ValueError(f"alpha must lie in the open interval (0, 1), got {alpha!r}")
    return a


def check_significance(alpha: float, name: str = "alpha") -> float:
    """A configured alpha of Eq. (1), checked as a significance level: a number in (0, 0.5).

    The interval of Eq. (1) has confidence 1 - alpha, so the paper's default 95% interval is alpha = 0.05. The
    paper's sensitivity table (§4.3, Table "Hyperparameter sensitivity analysis" (b)) writes the confidence level
    under the name alpha (alpha = 0.95); a value >= 0.5 is almost certainly that confidence level given by mistake
    (it would ask for an interval of 50% confidence or less), so configurations refuse it. The equation functions
    below accept any alpha in (0, 1).
    """
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        a = float("nan")
    if not 0.0 < a < 0.5:
        raise ValueError(
            f"{name}={alpha!r}: alpha is the significance level of Eq. (1)'s Student-t interval, whose confidence is "
            f"1 - alpha (0.05 for the paper's 95% interval), so it must lie in (0, 0.5). The paper's sensitivity "
            f"table writes the confidence level as alpha (alpha = 0.95 there is alpha = 0.05 here)."
        )
    return a


def _check_nonneg_scalar(value: float, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return v


def _check_nonneg_int(value: int, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


def _as_float_array(x, name: str) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, possibly on an accelerator
        x = x.detach().cpu().numpy()
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be numeric, got {type(x).__name__}") from None
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise ValueError(f"{name} must be finite; found {arr[tuple(bad)]} at index {tuple(int(i) for i in bad)}")
    return arr


def _as_count_array(n, name: str, minimum: int) -> np.ndarray:
    arr = _as_float_array(n, name)
    if not np.all(arr == np.round(arr)):
        raise ValueError(f"{name} must hold whole numbers (rollout counts), got {n!r}")
    if np.any(arr < minimum):
        bad = np.argwhere(arr < minimum)[0]
        why = " (a t quantile needs n - 1 >= 1 degrees of freedom)" if minimum == 2 else ""
        raise ValueError(
            f"{name} must be >= {minimum}{why}; found {arr[tuple(bad)]:g} at index {tuple(int(i) for i in bad)}"
        )
    return arr


def _scalar_or_array(x: np.ndarray):
    # 0-d results come back as numpy scalars (a float subclass), arrays as arrays.
    return x[()] if x.ndim == 0 else x


# ---------------------------------------------------------------------------------------------------------------
# Eqs. (1)-(3)
# ---------------------------------------------------------------------------------------------------------------


def _t_quantile(p: float, df: np.ndarray) -> np.ndarray:
    """Student-t quantile t_{p, df}: scipy.stats.t.ppf(p, df).

    Calls scipy.special.stdtrit, the routine t.ppf evaluates, directly: same values bit for bit (tested), without
    t.ppf's per-call argument handling, which was most of a planning round's cost.
    """
    return special.stdtrit(df, p)


def _t_over_sqrt(n: np.ndarray, alpha: float) -> np.ndarray:
    """t_{1-alpha/2, n-1} / sqrt(n) for counts n >= 2 (the shared factor of Eqs. 1 and 2)."""
    if n.size > 8:
        # The quantile is an iterative solve (~1 us each) and a batch has few distinct counts: solve once per count.
        uniq, inv = np.unique(n, return_inverse=True)
        return (_t_quantile(1.0 - alpha / 2.0, uniq - 1.0) / np.sqrt(uniq))[inv.reshape(n.shape)]
    return _t_quantile(1.0 - alpha / 2.0, n - 1.0) / np.sqrt(n)


def t_ci_half_width(std, n, alpha: float):
    """Half-width of the Student-t confidence interval of a prompt's mean reward.

    XRPO paper, Section 3.2 (Hierarchical Rollout Planning), Eq. (1). Vectorised over prompts; ``std`` and ``n``
    broadcast against each other.

    Args:
        std: s_q, sample standard deviation (ddof=1) of the prompt's rewards; scalar or array, finite, >= 0.
        n: n_q, number of rollouts the std was computed from; scalar or array of whole numbers >= 2 (n = 1 has
            zero degrees of freedom and no t quantile).
        alpha: significance level in (0, 1); the interval has confidence 1 - alpha.

    Returns:
        h_q(n_q), float64, of the broadcast shape of ``std`` and ``n`` (a numpy scalar for scalar inputs).
    """
    a = _check_alpha(alpha)
    s = _as_float_array(std, "std")
    if np.any(s < 0):
        raise ValueError(f"std must be >= 0, got {std!r}")
    nn = _as_count_array(n, "n", 2)
    # Eq. (1): h_q(n_q) = t_{1-alpha/2, n_q-1} * s_q / sqrt(n_q)
    h = s * _t_over_sqrt(nn, a)
    return _scalar_or_array(np.asarray(h, dtype=np.float64))


def uncertainty_reduction(std, n, alpha: float):
    """Expected shrinkage of the t-interval half-width from one more rollout.

    XRPO paper, Section 3.2, Eq. (2): Delta_q(n_q) = h_q(n_q) - h_q(n_q + 1), approximated by holding s_q fixed
    (the std after the extra rollout is unknown before it is drawn). Always >= 0, and 0 when s_q = 0.

    Args:
        std: s_q, sample std (ddof=1), scalar or array, finite, >= 0.
        n: n_q, current rollout count, whole numbers >= 2; broadcasts with ``std``.
        alpha: significance level in (0, 1).

    Returns:
        Delta_q(n_q), float64, broadcast shape (numpy scalar for scalar inputs).
    """
    a = _check_alpha(alpha)
    s = _as_float_array(std, "std")
    if np.any(s < 0):
        raise ValueError(f"std must be >= 0, got {std!r}")
    nn = _as_count_array(n, "n", 2)
    # Eq. (2): Delta_q(n_q) ~= s_q * (t_{1-alpha/2, n_q-1} / sqrt(n_q) - t_{1-alpha/2, n_q} / sqrt(n_q + 1))
    delta = s * (_t_over_sqrt(nn, a) - _t_over_sqrt(nn + 1.0, a))
    return _scalar_or_array(np.asarray(delta, dtype=np.float64))


def exploration_bonus(n, T, lam: float):
    """Exploration bonus for sparsely sampled prompts.

    XRPO paper, Section 3.2, the bonus phi_q(T, n_q) defined just before Eq. (3).

    Args:
        n: n_q, current rollout count of each prompt; scalar or array of whole numbers >= 1.
        T: the total number of rollouts allocated in the current round; number >= 0.
        lam: lambda >= 0, weight of the bonus (the paper requires lambda > 0; 0 switches the bonus off).

    Returns:
        phi_q(T, n_q), float64, shape of ``n`` (numpy scalar for scalar inputs).
    """
    t = _check_nonneg_scalar(T, "T")
    la = _check_nonneg_scalar(lam, "lam")
    nn = _as_count_array(n, "n", 1)
    # phi_q(T, n_q) = lambda * sqrt(log(1 + T) / n_q)
    phi = la * np.sqrt(math.log1p(t) / nn)
    return _scalar_or_array(np.asarray(phi, dtype=np.float64))


def _prompt_stats(rewards_by_prompt: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """(s_q with ddof=1, n_q) for every prompt; validates each prompt's rewards."""
    if isinstance(rewards_by_prompt, (str, bytes)) or not hasattr(rewards_by_prompt, "__len__"):
        raise ValueError(
            f"rewards_by_prompt must be a sequence of 1-D reward arrays, got {type(rewards_by_prompt).__name__}"
        )
    if len(rewards_by_prompt) == 0:
        raise ValueError("rewards_by_prompt must hold at least one prompt, got an empty sequence")
    arrays = []
    lengths = []
    for q, r in enumerate(rewards_by_prompt):
        if type(r) is np.ndarray and r.dtype == np.float64:  # the common case, ~2x faster per prompt
            a = r
        else:
            if hasattr(r, "detach"):
                r = r.detach().cpu().numpy()
            try:
                a = np.asarray(r, dtype=np.float64)
            except (TypeError, ValueError):
                raise ValueError(
                    f"rewards_by_prompt[{q}] must be a 1-D numeric array, got {type(r).__name__}"
                ) from None
        if a.ndim != 1:
            raise ValueError(f"rewards_by_prompt[{q}] must be 1-D, got shape {a.shape}")
        lengths.append(a.shape[0])
        if a.shape[0] < 2:
            raise ValueError(
                f"rewards_by_prompt[{q}] has {a.shape[0]} reward(s); the t quantile of Eq. (1) needs n_q >= 2 "
                "(give every prompt n_base >= 2 rollouts first)"
            )
        arrays.append(a)
    n = np.array(lengths, dtype=np.int64)
    flat = np.concatenate(arrays)
    starts = np.concatenate(([0], np.cumsum(n[:-1])))
    if not np.isfinite(flat).all():  # one check for all prompts; locate the culprit only on failure
        j = int(np.flatnonzero(~np.isfinite(flat))[0])
        q = int(np.searchsorted(starts, j, side="right")) - 1
        raise ValueError(f"rewards_by_prompt[{q}] must be finite; found {flat[j]} at position {j - starts[q]}")
    # Shift by each prompt's first reward before summing: a constant prompt then gets s_q == 0 exactly
    # (not 1e-17), and the two-pass variance stays accurate for large reward offsets.
    # In-place: fresh N-sized temporaries cost page faults that dominate at this size.
    d = np.repeat(flat[starts], n)
    np.subtract(flat, d, out=d)
    mean_d = np.add.reduceat(d, starts) / n
    d -= np.repeat(mean_d, n)
    np.multiply(d, d, out=d)
    var = np.add.reduceat(d, starts) / (n - 1)
    return np.sqrt(var), n


def allocation_priority(rewards_by_prompt: Sequence, T, *, alpha: float = 0.05, lam: float = 0.1) -> np.ndarray:
    """Priority of each prompt for the next rollouts of a planning round.

    XRPO paper, Section 3.2, Eq. (3): Pi_q = Delta_q(n_q) + phi_q(T, n_q), with s_q the sample std (ddof=1) and n_q
    the number of rewards seen so far for prompt q. A prompt with all-equal rewards has s_q = 0 and is driven by
    phi_q alone (see the module docstring).

    Args:
        rewards_by_prompt: sequence of Q 1-D reward arrays (numpy, lists or CPU/GPU tensors), one per prompt,
            lengths may differ; every prompt needs n_q >= 2 rewards; all finite.
        T: number of rollouts allocated in the current round (>= 0).
        alpha: significance level of the t-interval, in (0, 1).
        lam: exploration weight lambda >= 0.

    Returns:
        Pi, float64 array of shape (Q,).
    """
    a = _check_alpha(alpha)
    t = _check_nonneg_scalar(T, "T")
    la = _check_nonneg_scalar(lam, "lam")
    s, n = _prompt_stats(rewards_by_prompt)
    return _priority_from_stats(s, n.astype(np.float64), t, a, la)


def _priority_from_stats(s: np.ndarray, n: np.ndarray, T: float, alpha: float, lam: float) -> np.ndarray:
    # Eq. (2): Delta_q(n_q) ~= s_q * (t_{1-alpha/2, n_q-1} / sqrt(n_q) - t_{1-alpha/2, n_q} / sqrt(n_q + 1))
    delta = s * (_t_over_sqrt(n, alpha) - _t_over_sqrt(n + 1.0, alpha))
    # phi_q(T, n_q) = lambda * sqrt(log(1 + T) / n_q)
    phi = lam * np.sqrt(math.log1p(T) / n)
    # Eq. (3): Pi_q = Delta_q(n_q) + phi_q(T, n_q)
    return delta + phi


# ---------------------------------------------------------------------------------------------------------------
# integer budgets
# ---------------------------------------------------------------------------------------------------------------


def _caps(max_per_prompt, num_prompts: int, budget: int) -> np.ndarray:
    if max_per_prompt is None:
        return np.full(num_prompts, budget, dtype=np.int64)
    if np.ndim(max_per_prompt) == 0:
        cap = _check_nonneg_int(max_per_prompt, "max_per_prompt")
        caps = np.full(num_prompts, cap, dtype=np.int64)
    else:
        arr = _as_float_array(max_per_prompt, "max_per_prompt")
        if arr.shape != (num_prompts,):
            raise ValueError(
                f"max_per_prompt must be an integer or an array of shape ({num_prompts},) (one cap per prompt), "
                f"got shape {arr.shape}"
            )
        if np.any(arr < 0) or not np.all(arr == np.round(arr)):
            raise ValueError(f"max_per_prompt must hold whole numbers >= 0, got {max_per_prompt!r}")
        caps = arr.astype(np.int64)
    if int(caps.sum()) < budget:
        raise ValueError(
            f"budget={budget} cannot be placed: max_per_prompt allows at most {int(caps.sum())} rollouts over "
            f"{num_prompts} prompts"
        )
    return np.minimum(caps, budget)


def split_budget(priority, budget: int, *, max_per_prompt=None) -> np.ndarray:
    """Split an integer rollout budget over prompts in proportion to their priority.

    XRPO paper, Section 3.2 (phased allocation: "each prompt receives rollouts in proportion to its current priority
    score Pi_q"). Each prompt's quota is budget * Pi_q / sum(Pi); quotas are floored and the leftover rollouts go,
    one each, to the largest fractional remainders (largest-remainder / Hamilton method). Equal remainders go to
    the earlier prompt; only prompts whose quotas are equal to the last bit although their priorities differ (float
    rounding) are ordered by priority among themselves, so the split is always monotone in priority.

    Caps: a prompt whose quota exceeds its cap gets exactly the cap and the budget it cannot take is re-split over
    the remaining prompts by the same rule (repeated until no quota exceeds its cap). If the prompts still open all
    have priority 0 (in particular, if every priority is 0), they share what is left uniformly.

    Args:
        priority: Pi, shape (Q,), finite and >= 0, Q >= 1.
        budget: number of rollouts to hand out, integer >= 0.
        max_per_prompt: None (no cap), an integer cap for every prompt, or an integer array of shape (Q,): the most
            rollouts a prompt may receive in this call (on top of what it already has).

    Returns:
        int64 array of shape (Q,), entries >= 0 and <= the cap, summing exactly to ``budget``.

    Raises:
        ValueError: bad priority / budget / cap, or caps that sum to less than ``budget``.
    """
    b = _check_nonneg_int(budget, "budget")
    p = _as_float_array(priority, "priority")
    if p.ndim != 1 or p.shape[0] == 0:
        raise ValueError(f"priority must be a non-empty 1-D array (one value per prompt), got shape {p.shape}")
    if np.any(p < 0):
        q = int(np.flatnonzero(p < 0)[0])
        raise ValueError(f"priority must be >= 0; found {p[q]} for prompt {q}")
    caps = _caps(max_per_prompt, p.shape[0], b)
    return _split_checked(p, b, caps)


def _split_checked(p: np.ndarray, budget: int, caps: np.ndarray) -> np.ndarray:
    Q = p.shape[0]
    alloc = np.zeros(Q, dtype=np.int64)
    if budget == 0:
        return alloc
    # Normalising by the max keeps sum(w) finite for huge priorities.
    pmax = p.max()
    w_all = p / pmax if pmax > 0 else np.zeros_like(p)
    open_ = caps > 0
    remaining = budget
    while True:
        idx = np.flatnonzero(open_)
        if idx.shape[0] == 0:  # unreachable when sum(caps) >= budget, which _caps checked
            raise RuntimeError(f"split_budget: {remaining} rollouts left with every prompt at its cap")
        w = w_all[idx]
        total = w.sum()
        if total <= 0:  # every open prompt has priority 0: share uniformly
            w = np.ones_like(w)
            total = float(idx.shape[0])
        # budget * Pi_q / sum(Pi) over the prompts still open (division first: monotone in w under IEEE rounding)
        quota = (w / total) * remaining
        over = quota > caps[idx]
        if not over.any():
            break
        sat = idx[over]
        alloc[sat] = caps[sat]
        open_[sat] = False
        remaining -= int(caps[sat].sum())
        if remaining == 0:
            return alloc
    base = np.floor(quota).astype(np.int64)
    rem = quota - base
    leftover = remaining - int(base.sum())
    if leftover < 0:  # cannot happen in exact arithmetic; guards against a float quota just above an integer
        order = np.lexsort((-idx, p[idx], rem))
        take = order[base[order] > 0][:-leftover]
        base[take] -= 1
        leftover = 0
    if leftover > 0:
        # Largest remainder first; equal remainders -> earlier prompt.
        order = np.lexsort((idx, -rem))
        # Prompts whose quotas are equal to the last bit although their priorities differ (the float division
        # collapsed them) swap slots so that the higher priority comes first: keeps the split monotone in priority.
        _, same = np.unique(quota, return_inverse=True)
        if same.max() + 1 < idx.shape[0]:
            slot = np.empty_like(order)
            slot[order] = np.arange(order.shape[0])
            by_slot = np.lexsort((slot, same))  # members of each quota group, slots ascending
            by_prio = np.lexsort((idx, -p[idx], same))  # the same groups, higher priority first
            slot[by_prio] = slot[by_slot]
            order = np.argsort(slot)
        order = order[base[order] < caps[idx][order]]
        base[order[:leftover]] += 1
    alloc[idx] = base
    if int(alloc.sum()) != budget:  # unreachable; a wrong total would silently change the batch size
        raise RuntimeError(f"split_budget: allocated {int(alloc.sum())} rollouts instead of {budget}")
    return alloc


def _greedy_split(
    s: np.ndarray, n: np.ndarray, budget: int, T: float, alpha: float, lam: float, caps: np.ndarray
) -> np.ndarray:
    Q = s.shape[0]
    alloc = np.zeros(Q, dtype=np.int64)
    if budget == 0:
        return alloc
    # g(m) = t_{1-alpha/2, m-1} / sqrt(m) for every count a prompt can reach in this round, in one scipy call.
    n_int = n.astype(np.int64)
    m_lo, m_hi = int(n_int.min()), int(n_int.max()) + budget + 1
    g = _t_over_sqrt(np.arange(m_lo, m_hi + 1, dtype=np.float64), alpha)
    log_t = math.log1p(T)

    def prio(q: int, m: int) -> float:
        # Eq. (3) with Eq. (2) and phi at the prompt's count m, s_q held at its observed value
        return s[q] * (g[m - m_lo] - g[m + 1 - m_lo]) + lam * math.sqrt(log_t / m)

    # heap key (-Pi, n_q, q): argmax of Pi; ties -> fewer rollouts so far, then earlier prompt
    heap = [(-prio(q, int(n_int[q])), int(n_int[q]), q) for q in range(Q) if caps[q] > 0]
    heapq.heapify(heap)
    for _ in range(budget):
        _, m, q = heapq.heappop(heap)
        alloc[q] += 1
        if alloc[q] < caps[q]:
            heapq.heappush(heap, (-prio(q, m + 1), m + 1, q))
    return alloc


def allocate_round(
    rewards_by_prompt: Sequence,
    budget: int,
    *,
    alpha: float = 0.05,
    lam: float = 0.1,
    max_per_prompt=None,
    mode: str = "proportional",
) -> np.ndarray:
    """One planning round of Hierarchical Rollout Planning (Algorithm 1, line 7: Alloc <- StatAlloc(S_Q, n_r)).

    XRPO paper, Section 3.2, Eqs. (1)-(3). T in the exploration bonus is ``budget``, the number of rollouts allocated
    in this round ("the total number of rollouts allocated in the current round").

    Modes:
        "proportional" (default, the paper's phased design): ``split_budget(allocation_priority(rewards_by_prompt,
        T=budget), budget)``.
        "greedy": hands the round's rollouts out one at a time, each to the current argmax of Pi_q (ties: fewer
        rollouts so far, then earlier prompt), recomputing n_q after each. s_q is NOT updated between picks: the
        reward of a rollout is unknown until it is drawn, so within a round s_q stays at its observed value and only
        n_q (in Delta_q and phi_q) moves.

    Args:
        rewards_by_prompt: Q 1-D reward arrays, one per prompt (n_q >= 2 each), as in :func:`allocation_priority`.
        budget: rollouts to allocate in this round (n_r), integer >= 0.
        alpha: significance level in (0, 1).
        lam: exploration weight >= 0.
        max_per_prompt: None, an integer, or an integer array (Q,): the most extra rollouts a prompt may receive in
            this call (not a cap on its total count).
        mode: "proportional" or "greedy".

    Returns:
        int64 array of shape (Q,): extra rollouts per prompt, summing exactly to ``budget``.
    """
    if mode not in ALLOC_MODES:
        raise ValueError(f"mode must be one of {list(ALLOC_MODES)}, got {mode!r}")
    b = _check_nonneg_int(budget, "budget")
    a = _check_alpha(alpha)
    la = _check_nonneg_scalar(lam, "lam")
    s, n = _prompt_stats(rewards_by_prompt)
    caps = _caps(max_per_prompt, s.shape[0], b)
    if mode == "greedy":
        return _greedy_split(s, n.astype(np.float64), b, float(b), a, la, caps)
    prio = _priority_from_stats(s, n.astype(np.float64), float(b), a, la)
    return _split_checked(prio, b, caps)


class PhasePlan(NamedTuple):
    """Per-step rollout schedule of Algorithm 1: ``base_per_prompt`` rollouts for every prompt (lines 2-4), then
    ``round_budgets[t]`` rollouts shared by all prompts in planning round t (lines 5-13). Unpacks as a tuple."""

    base_per_prompt: int
    round_budgets: tuple[int, ...]


def plan_phases(num_prompts: int, total_budget: int, n_base: int, rounds: int) -> PhasePlan:
    """Split a step's rollout budget into the base phase and the planning rounds.

    XRPO paper, Section 3.2 ("we adopt a phased rollout allocation strategy ... the first 64 are uniformly distributed
    across prompts, while the remaining 64 are divided across the second and third phases") and Algorithm 1.
    The remainder ``total_budget - n_base * num_prompts`` is split as evenly as possible over ``rounds``; when it
    does not divide, the earlier rounds get one more. Example: plan_phases(16, 128, 4, 2) -> PhasePlan(4, (32, 32)).

    Args:
        num_prompts: prompts in the batch, >= 1.
        total_budget: rollouts for the whole step, >= n_base * num_prompts.
        n_base: base rollouts per prompt, >= 2 (Eq. 1 needs n_q >= 2 for its t quantile).
        rounds: number of planning rounds N_plan, >= 0 (0 only when nothing remains after the base phase).

    Returns:
        PhasePlan(base_per_prompt=n_base, round_budgets=tuple of ``rounds`` ints summing to the remainder).
    """
    q = _check_nonneg_int(num_prompts, "num_prompts")
    if q < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts!r}")
    total = _check_nonneg_int(total_budget, "total_budget")
    nb = _check_nonneg_int(n_base, "n_base")
    if nb < 2:
        raise ValueError(f"n_base must be >= 2 (the t quantile of Eq. (1) needs n_q >= 2), got {n_base!r}")
    r = _check_nonneg_int(rounds, "rounds")
    base_total = nb * q
    if total < base_total:
        raise ValueError(
            f"total_budget={total} is smaller than the base phase n_base * num_prompts = {nb} * {q} = {base_total}"
        )
    remainder = total - base_total
    if r == 0:
        if remainder:
            raise ValueError(
                f"rounds=0 leaves {remainder} of total_budget={total} unallocated after the base phase ({base_total})"
            )
        return PhasePlan(nb, ())
    per, extra = divmod(remainder, r)
    return PhasePlan(nb, tuple(per + (1 if i < extra else 0) for i in range(r)))
