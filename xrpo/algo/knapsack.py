"""Knapsack RL's rollout allocation: each prompt an item, its rollout count the weight, solved as a knapsack.

Li et al., "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation" (arXiv 2509.25849). The
value and the exact solvers here serve both rules: the authors' code's (`xrpo.algo.knapsack_rl`, the default
``knapsack_fallback=authors``) and the rule first read from the paper's description (its abstract and summaries),
kept for the ablation as ``knapsack_fallback=leftover`` / ``jeffreys`` (`knapsack_allocation`). That rule, and which
of its choices were ours:

    value_i(n)  = P(non-zero gradient | p_i, n) x InfoGain(p_i)                               (the paper's value)
    P(...)      = 1 - p^n - (1 - p)^n                  (a group of n 0/1 rewards is not all equal)
    InfoGain(p) = p (1 - p)^2
    counts      = argmax_{n_i} sum_i value_i(n_i)  s.t.  sum_i n_i = B,  n_min <= n_i <= n_max      (a knapsack)

- **InfoGain.** The issue quotes the paper's information gain as "roughly p(1-p)^2"; we use exactly that. Our reading
  of why: p (1 - p) is the variance of a 0/1 reward, the squared size of a GRPO group's signal, and the extra
  (1 - p) weights a success-rate gain by how much of the prompt is still unsolved, so that a prompt at p = 1/3
  (the maximum, 4/27) is worth more than one at p = 2/3 (2/27) although both have the same reward variance.
- **The estimate of p** is the prompt's success rate on its last visit (an earlier epoch), k / n of its last group
  (:func:`last_visit_rate`). Two cases the paper's description leaves to us:
    * **never seen** (n = 0): ``prior_rate`` if given, else the pooled rate sum k / sum n of the batch's prompts that
      were seen (the batch's best guess of an unseen prompt's rate), else 1/2;
    * **never solved** (0 of n) and **always solved** (n of n):
      the value formula gives them 0 at every n. ``fallback="leftover"`` (default) keeps that: they get ``n_min``,
      the knapsack places the rest over the other prompts, and only what those cannot take (their ``n_max``) goes
      to the never-solved prompts, evenly, then to the always-solved ones. ``fallback="jeffreys"`` values them
      instead at the Jeffreys posterior mean, (k + 1/2) / (n + 1) (1/18 after 0 of 8), so they compete in the
      knapsack. Measured in the simulator (docs/results.md, "Allocation beyond the paper"), "jeffreys" is much
      worse: a rate of 1/18 has increments that decay slowly ((17/18)^n), so once the mixed prompts' increments
      fall below them, the knapsack pours rollouts into prompts that are mostly at p = 0 (on
      ``0.4*0 + 0.6*beta(3,1.5)``: 0.77x uniform's informative rollouts against 1.68x with "leftover").
- **Bounds.** ``n_min`` (default 2, the least group that can have a reward variance; the paper keeps a lower bound
  so that every prompt of the batch stays in the update) and ``n_max`` (default: no bound but the budget).
- **Solver.** :func:`knapsack_dp` is the dynamic program over (prompt, budget) pairs, exact for any values. For
  n >= 1 the value is concave in n (its increment p^n q + q^n p = p q (p^(n-1) + q^(n-1)) decreases with n), so for
  ``n_min >= 1`` handing out the budget by largest marginal value (:func:`concave_allocation`) is also exact, in
  O(Q K) instead of O(Q B K); :func:`knapsack_allocation` uses it where every row is concave, else the DP. The two
  agree on random instances, and the DP agrees with brute force (tests/algo/test_knapsack.py).

Everything is numpy on the host: a few numbers per prompt.
"""

from __future__ import annotations

import math

import numpy as np

from xrpo.algo.allocation import split_budget
from xrpo.algo.signal import finite_array, nonzero_variance_prob

__all__ = [
    "concave_allocation",
    "info_gain",
    "knapsack_allocation",
    "knapsack_dp",
    "knapsack_values",
    "last_visit_rate",
]


def _counts(x, name: str, shape: tuple | None = None) -> np.ndarray:
    a = finite_array(x, name)
    if shape is not None and a.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {a.shape}")
    if np.any(a < 0) or not np.all(a == np.round(a)):
        bad = tuple(int(i) for i in np.argwhere((a < 0) | (a != np.round(a)))[0])
        raise ValueError(f"{name} must hold whole numbers >= 0; found {a[bad]} at index {bad}")
    return a


def _int(value, name: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _bounds(x, name: str, Q: int, default: int) -> np.ndarray:
    """A scalar or per-prompt integer bound as an int64 (Q,) array (None -> ``default``)."""
    if x is None:
        return np.full(Q, default, dtype=np.int64)
    if np.ndim(x) == 0:
        return np.full(Q, _int(x, name, 0), dtype=np.int64)
    return _counts(x, name, (Q,)).astype(np.int64)


# ---------------------------------------------------------------------------------------------------------------
# the value of an item
# ---------------------------------------------------------------------------------------------------------------


def info_gain(p):
    """Knapsack RL's information gain of a prompt solved with probability p: p (1 - p)^2 (see the module docstring).

    Args:
        p: success probabilities in [0, 1], any shape.

    Returns:
        float64 array of p's shape, in [0, 4/27]; 0 at p = 0 and p = 1, largest at p = 1/3.
    """
    pp = finite_array(p, "p")
    if np.any((pp < 0) | (pp > 1)):
        raise ValueError(f"p must lie in [0, 1], got {p!r}")
    # InfoGain(p) = p (1 - p)^2
    return pp * (1.0 - pp) ** 2


def knapsack_values(p, n_max: int) -> np.ndarray:
    """The value table of Knapsack RL: value[i, n] = (1 - p_i^n - (1 - p_i)^n) x p_i (1 - p_i)^2, n = 0..n_max.

    Args:
        p: (Q,) estimated success rates in [0, 1].
        n_max: largest rollout count tabulated, integer >= 0.

    Returns:
        float64 array of shape (Q, n_max + 1); 0 for n <= 1.
    """
    pp = finite_array(p, "p")
    if pp.ndim != 1 or pp.shape[0] == 0:
        raise ValueError(f"p must be a non-empty 1-D array (one rate per prompt), got shape {pp.shape}")
    W = _int(n_max, "n_max", 0)
    n = np.arange(W + 1, dtype=np.float64)[None, :]
    # value_i(n) = P(non-zero gradient | p_i, n) x InfoGain(p_i)
    return nonzero_variance_prob(pp[:, None], n) * info_gain(pp)[:, None]


def last_visit_rate(successes, trials, prior_rate: float | None = None) -> np.ndarray:
    """Knapsack RL's estimate of each prompt's success rate from its last visit.

    k / n for a mixed last visit (0 < k < n); the Jeffreys posterior mean (k + 1/2) / (n + 1) for 0 of n and n of n
    (never / always solved: the estimate ``fallback="jeffreys"`` values them at); ``prior_rate`` for a prompt
    never seen (n = 0), by default the pooled rate sum k / sum n of the seen prompts, 1/2 if none was seen (or if the
    pooled rate is 0 or 1, which would make every unseen prompt worthless).

    Args:
        successes: (Q,) correct rollouts of each prompt's last visit, whole numbers >= 0.
        trials: (Q,) rollouts of that visit, whole numbers >= successes (0: never seen).
        prior_rate: rate of an unseen prompt, in (0, 1), or None (pooled rate of the seen ones).

    Returns:
        float64 (Q,) in (0, 1).
    """
    k = _counts(successes, "successes")
    n = _counts(trials, "trials", k.shape)
    if k.ndim != 1 or k.shape[0] == 0:
        raise ValueError(f"successes must be a non-empty 1-D array (one count per prompt), got shape {k.shape}")
    if np.any(k > n):
        i = int(np.flatnonzero(k > n)[0])
        raise ValueError(f"successes must not exceed trials; found {k[i]:g} > {n[i]:g} at index {i}")
    seen = n > 0
    if prior_rate is None:
        pooled = k[seen].sum() / n[seen].sum() if seen.any() else 0.5
        prior = pooled if 0.0 < pooled < 1.0 else 0.5
    else:
        prior = float(prior_rate)
        if not (math.isfinite(prior) and 0.0 < prior < 1.0):
            raise ValueError(f"prior_rate must lie in (0, 1), got {prior_rate!r}")
    edge = seen & ((k == 0) | (k == n))
    p = np.full(k.shape, prior, dtype=np.float64)
    mixed = seen & ~edge
    p[mixed] = k[mixed] / n[mixed]
    # Jeffreys posterior mean (k + 1/2) / (n + 1) for 0 of n and n of n
    p[edge] = (k[edge] + 0.5) / (n[edge] + 1.0)
    return p


# ---------------------------------------------------------------------------------------------------------------
# solvers
# ---------------------------------------------------------------------------------------------------------------


def _check_problem(values, budget, n_min, n_max) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    v = finite_array(values, "values")
    if v.ndim != 2 or v.shape[0] == 0:
        raise ValueError(f"values must have shape (prompts, counts + 1), got {v.shape}")
    Q, W1 = v.shape
    B = _int(budget, "budget", 0)
    lo = _bounds(n_min, "n_min", Q, 0)
    hi = _bounds(n_max, "n_max", Q, min(B, W1 - 1))
    if np.any(hi > W1 - 1):
        i = int(np.flatnonzero(hi > W1 - 1)[0])
        raise ValueError(f"n_max[{i}] = {hi[i]} exceeds the values table, which stops at n = {W1 - 1}")
    if np.any(lo > hi):
        i = int(np.flatnonzero(lo > hi)[0])
        raise ValueError(f"n_min[{i}] = {lo[i]} exceeds n_max[{i}] = {hi[i]}")
    if not int(lo.sum()) <= B <= int(hi.sum()):
        raise ValueError(
            f"budget={B} cannot be placed: the bounds allow between sum(n_min) = {int(lo.sum())} and "
            f"sum(n_max) = {int(hi.sum())} rollouts"
        )
    return v, B, lo, hi


def knapsack_dp(values, budget: int, n_min=0, n_max=None) -> np.ndarray:
    """The exact allocation: maximise sum_i values[i, n_i] over integers n_min_i <= n_i <= n_max_i, sum n_i = B.

    Dynamic programming over (prompt, budget) pairs: best[b] is the largest total of the prompts so far with b
    rollouts among them, and prompt i adds best'[b] = max_{n_min_i <= k <= n_max_i} best[b - k] + values[i, k].
    Exact for any values (concave or not). Ties go to the fewest rollouts for the later prompts. Cost O(Q B K),
    K = the widest [n_min_i, n_max_i].

    Args:
        values: (Q, W + 1) finite float array: values[i, n] for n = 0..W.
        budget: B, integer with sum(n_min) <= B <= sum(n_max).
        n_min: integer or (Q,) integers >= 0 (default 0).
        n_max: integer, (Q,) integers <= W, or None (min(B, W)).

    Returns:
        int64 array (Q,) summing to B.
    """
    v, B, lo, hi = _check_problem(values, budget, n_min, n_max)
    Q = v.shape[0]
    hi = np.minimum(hi, B)
    b = np.arange(B + 1)
    K = int(hi.max())
    # best[b]: the largest total of the prompts so far with b rollouts among them; stored after K cells of -inf, so
    # that best[b - k] for b < k reads -inf without a mask
    padded = np.full(K + B + 1, -np.inf)
    padded[K] = 0.0
    choice = np.zeros((Q, B + 1), dtype=np.int64)
    for i in range(Q):
        ks = np.arange(lo[i], hi[i] + 1)
        # cand[b, j] = best[b - k_j] + values[i, k_j]
        cand = padded[(K + b)[:, None] - ks[None, :]] + v[i, ks][None, :]
        j = np.argmax(cand, axis=1)
        choice[i] = ks[j]
        padded[K:] = cand[b, j]
    best = padded[K:]
    counts = np.zeros(Q, dtype=np.int64)
    left = B
    for i in range(Q - 1, -1, -1):
        counts[i] = choice[i, left]
        left -= int(counts[i])
    if left != 0 or not np.isfinite(best[B]):  # unreachable: _check_problem made the budget feasible
        raise RuntimeError(f"knapsack_dp: no feasible allocation (left {left})")
    return counts


def _is_concave(v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> bool:
    """Every row's increments values[i, n + 1] - values[i, n], n in [lo_i, hi_i), are non-increasing (up to float
    round-off of the values' size: 1e-12 of the largest |value|)."""
    d = np.diff(v, axis=1)
    n = np.arange(d.shape[1])[None, :]
    inside = (n >= lo[:, None]) & (n < hi[:, None] - 1)  # pairs (d[n], d[n + 1]) both inside the bounds
    tol = 1e-12 * max(1.0, float(np.abs(v).max()))
    return bool(np.all(np.where(inside, np.diff(d, axis=1, append=0.0) <= tol, True)))


def concave_allocation(values, budget: int, n_min=0, n_max=None) -> np.ndarray:
    """:func:`knapsack_dp`'s problem for values concave in n on [n_min_i, n_max_i]: every prompt starts at n_min_i,
    and the B - sum n_min remaining rollouts go to the largest increments values[i, n + 1] - values[i, n].

    Exact for concave rows (each row's increments are non-increasing, so the largest increments overall are a
    prefix of each row, and taking the largest ones is optimal: the exchange argument of the fractional knapsack
    with unit weights). Implemented as a threshold: the R-th largest increment t, every increment > t, and as many
    increments == t as fill the budget, row by row. Cost O(Q K) (one partition). Raises if a row is not concave.

    Args: as :func:`knapsack_dp`.

    Returns:
        int64 array (Q,) summing to B.
    """
    v, B, lo, hi = _check_problem(values, budget, n_min, n_max)
    if not _is_concave(v, lo, hi):
        raise ValueError("concave_allocation needs values concave in n on [n_min, n_max] (use knapsack_dp)")
    return _largest_increments(v, B, lo, hi)


def _largest_increments(v: np.ndarray, B: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """:func:`concave_allocation` on a checked problem whose rows are known to be concave."""
    R = B - int(lo.sum())
    counts = lo.copy()
    if R == 0:
        return counts
    d = np.diff(v, axis=1)
    n = np.arange(d.shape[1])[None, :]
    inside = (n >= lo[:, None]) & (n < hi[:, None])
    flat = d[inside]
    # t = the R-th largest increment
    t = np.partition(flat, flat.shape[0] - R)[flat.shape[0] - R]
    above = np.where(inside, d > t, False).sum(axis=1)
    ties = np.where(inside, d == t, False).sum(axis=1)
    need = R - int(above.sum())
    # the increments equal to t follow each row's larger ones: hand them out row by row until the budget is full
    take = np.minimum(ties, np.maximum(need - (np.cumsum(ties) - ties), 0))
    counts += above + take
    if int(counts.sum()) != B:  # unreachable: exactly R increments are >= t when counted this way
        raise RuntimeError(f"concave_allocation: allocated {int(counts.sum())} rollouts instead of {B}")
    return counts


def knapsack_allocation(
    successes,
    trials,
    budget: int,
    *,
    n_min: int = 2,
    n_max: int | None = None,
    prior_rate: float | None = None,
    fallback: str = "leftover",
) -> np.ndarray:
    """Knapsack RL's rollout counts for a batch, from each prompt's last visit (the module docstring's rule).

    Estimates p_i with :func:`last_visit_rate`, tabulates :func:`knapsack_values` and solves the knapsack exactly:
    by the largest increments (:func:`concave_allocation`'s rule) when every row is concave on [n_min, n_max]
    (always for n_min >= 1), else with :func:`knapsack_dp`. With ``fallback="leftover"`` the prompts never or always
    solved on their last visit stay out of the knapsack at ``n_min`` and take only what the others cannot (never
    solved first, each share split evenly, ``split_budget``'s rule); with ``"jeffreys"`` they enter it at their
    Jeffreys estimate.

    Args:
        successes, trials: (Q,) the last visit's correct rollouts and rollouts (trials 0: never seen).
        budget: rollouts of the step, integer with n_min * Q <= budget <= n_max * Q.
        n_min: fewest rollouts per prompt, integer >= 0 (default 2).
        n_max: most rollouts per prompt, integer >= n_min, or None (the budget).
        prior_rate: p of a never-seen prompt (None: the seen prompts' pooled rate).
        fallback: "leftover" or "jeffreys" (the module docstring).

    Returns:
        int64 array (Q,) summing to ``budget``.
    """
    if fallback not in ("leftover", "jeffreys"):
        raise ValueError(f"fallback must be 'leftover' or 'jeffreys', got {fallback!r}")
    p = last_visit_rate(successes, trials, prior_rate)
    k, n = np.asarray(successes, dtype=np.float64), np.asarray(trials, dtype=np.float64)
    B = _int(budget, "budget", 0)
    lo = _int(n_min, "n_min", 0)
    hi = B if n_max is None else _int(n_max, "n_max", lo)
    Q = p.shape[0]
    if not lo * Q <= B <= hi * Q:
        raise ValueError(f"budget={B} must lie in [n_min * prompts, n_max * prompts] = [{lo * Q}, {hi * Q}]")
    hi = min(hi, B)
    never = (n > 0) & (k == 0)
    always = (n > 0) & (k == n)
    valued = ~(never | always) if fallback == "leftover" else np.ones(Q, dtype=bool)
    counts = np.full(Q, lo, dtype=np.int64)
    # the valued prompts take all they can: each increment of their value is > 0
    B_v = min(B - lo * int((~valued).sum()), hi * int(valued.sum()))
    if valued.any():
        v = knapsack_values(p[valued], hi)
        Qv = int(valued.sum())
        lo_a, hi_a = np.full(Qv, lo), np.full(Qv, hi)
        # concave in n for n >= 1 (the module docstring), so no check is needed then; with n_min = 0 it usually is not
        if lo >= 1 or _is_concave(v, lo_a, hi_a):
            counts[valued] = _largest_increments(v, B_v, lo_a, hi_a)
        else:
            counts[valued] = knapsack_dp(v, B_v, lo, hi)
    left = B - int(counts.sum())
    for group in (never, always):  # the fallback: what the valued prompts cannot take, never-solved prompts first
        idx = np.flatnonzero(group & ~valued)
        if left == 0 or idx.shape[0] == 0:
            continue
        take = min(left, (hi - lo) * idx.shape[0])
        counts[idx] += split_budget(np.zeros(idx.shape[0]), take, max_per_prompt=hi - lo)
        left -= take
    if left != 0:  # unreachable: lo * Q <= B <= hi * Q
        raise RuntimeError(f"knapsack_allocation: {left} rollouts left unplaced")
    return counts
