"""Knapsack RL as its authors' code implements it: the estimate of each prompt's success rate, the rollouts a mixed
prompt is worth, the exploration fallback, and the knapsack over the mixed prompts.

Li et al., "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation" (arXiv 2509.25849); their
public code, github.com/liziniu/KnapsackRL at commit ca5d5f5b7e933378d916d05d1aeb4ae9de929ee5:
``verl/trainer/ppo/exploration_utils.py`` (``sampling_budget_by_knapsack``, ``solve_by_dp``), the estimate in
``verl/utils/dataset/rl_dataset.py`` (``update_sample_state``, ``get_sample_state``) and the numbers of their recipe
``examples/knapsack_trainer/run_knapsack_grpo_7b.sh`` (MIN_N = NEGATIVE_N = POSITIVE_N = 2, MAX_N = 128,
REWARD_BUFFER_LENGTH = 16, MIN_BUFFER_LENGTH = 8). Written from that code, not copied; checked against it on a
committed table of random cases (tests/algo/data/knapsack_rl_cases.json, tests/algo/test_knapsack_rl.py).

One step over P prompts with a budget of B rollouts (their B = P x rollout.n), n = B // P::

    estimate   valid_i = the prompt has >= min_rewards rewards over all its visits               (`recent_rate`)
               p_i = the mean of its last visit if that visit had >= window rollouts, else the mean of its latest
               `window` rewards across visits
    floors     invalid (never or barely seen): n, outside the knapsack; valid: n_min (mixed, 0 < p < 1; never
               solved, p = 0; always solved, p = 1)
    cost       c_i = min(n_max, floor(log(1 - confidence) / log(max(p_i, 1 - p_i))))   (`visit_cost`; mixed only)
               the rollouts after which the rarer outcome has shown up with probability ``confidence`` (0.9)
    fallback   R = B - the floors. If sum c_i < R, the knapsack gets sum c_i and the surplus R - sum c_i is split
               evenly over the prompts at p = 0 (never solved, and the invalid ones, whose rate their code leaves
               at 0), else over every prompt that is not mixed; with no mixed prompt, the whole R goes that way
    knapsack   x_i = argmax sum_i g_i(x_i), sum x_i = the knapsack's budget, 0 <= x_i <= n_max - n_min, over the
               mixed prompts in order, exact (`xrpo.algo.knapsack.knapsack_dp`)
               g_i(x) = v(n_min + x) for x >= 1, v(n) = (1 - p^n - (1 - p)^n) p (1 - p)^2, and g_i(0) = 0
               what the knapsack cannot place (x_i at their cap) is split evenly over the mixed prompts

Points a reader of their code should know, and what xrpo does with them:

- **g_i(0) = 0** (``zero_at_floor``): their solver values a mixed prompt it gives no rollout beyond the floor at 0,
  not at v(n_min), so it spreads the budget over more mixed prompts than the value formula would (a prompt's first
  extra rollout is worth v(n_min + 1), not v(n_min + 1) - v(n_min)). Their code does it, so the default does too;
  ``zero_at_floor=False`` gives the formula's value.
- **Their crash.** When every prompt is mixed and the costs add up to less than R, the surplus has nowhere to go and
  their function fails its own budget assertion. Here the knapsack then gets the whole of R (what their code does
  with the fallback off).
- **Arithmetic.** Prompts of equal rate tie in the knapsack, and which of them gets a rollout is decided by the last
  bits of the DP's sums. Their code computes each value from the rate rounded to float32 (their array's type), in
  float64 (numpy < 2, their pin) with the C library's ``pow``: `knapsack_values_exact` does the same scalar
  arithmetic in the same order, so the ties fall as theirs. numpy's vectorised ``power`` is not used: on AVX-512
  machines it rounds differently from ``pow`` (their own code, on such a machine or with numba installed, breaks
  a few of these ties otherwise, at equal value: the test table records where).
- The invalid prompts' rate is 0 in their arrays, so the fallback counts them among the never-solved prompts; the
  ``n`` they get is B // P here (their B is P x n exactly; the remainder of another B goes to the knapsack).
- n_min is the smaller of 2 and B // P (their code fails its assertion when B < 2P).

Everything is numpy on the host: a few numbers per prompt.
"""

from __future__ import annotations

import math

import numpy as np

from xrpo.algo.allocation import split_budget
from xrpo.algo.knapsack import knapsack_dp
from xrpo.algo.signal import finite_array

__all__ = [
    "CONFIDENCE",
    "authors_allocation",
    "knapsack_values_exact",
    "recent_rate",
    "visit_cost",
]

CONFIDENCE = 0.9
"""``sampling_budget_by_knapsack``'s ``alpha``: the probability with which a mixed prompt's cost shows its rarer
outcome (their default; their recipe does not set it)."""


def _counts(x, name: str) -> np.ndarray:
    a = finite_array(x, name)
    if a.ndim != 1 or a.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array (one entry per prompt), got shape {a.shape}")
    if np.any(a < 0) or not np.all(a == np.round(a)):
        i = int(np.flatnonzero((a < 0) | (a != np.round(a)))[0])
        raise ValueError(f"{name} must hold whole numbers >= 0; found {a[i]} at index {i}")
    return a.astype(np.int64)


def _int(value, name: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


# ---------------------------------------------------------------------------------------------------------------
# the estimate
# ---------------------------------------------------------------------------------------------------------------


def recent_rate(
    last_successes,
    last_trials,
    recent_successes,
    recent_trials,
    observed,
    *,
    window: int = 16,
    min_rewards: int = 8,
) -> tuple[np.ndarray, np.ndarray]:
    """Knapsack RL's success-rate estimate of each prompt from its rewards over earlier visits (their
    ``update_sample_state`` with epoch and robust estimation on, the recipe's settings, and ``get_sample_state``).

        valid_i = observed_i >= min_rewards
        p_i     = last_successes_i / last_trials_i        if last_trials_i >= window (the last visit alone)
                = recent_successes_i / recent_trials_i    otherwise (its latest `window` rewards across visits)

    Args:
        last_successes, last_trials: (P,) successes and rollouts of each prompt's last visit.
        recent_successes, recent_trials: (P,) successes among, and number of, its latest min(observed, window)
            rewards across visits.
        observed: (P,) its rewards over every visit (0: never seen).
        window: their REWARD_BUFFER_LENGTH (16), integer >= 1.
        min_rewards: their MIN_BUFFER_LENGTH (8), integer >= 0.

    Returns:
        (p float64 (P,) in [0, 1], 0 where no reward was seen; valid bool (P,)).
    """
    ls, lt = _counts(last_successes, "last_successes"), _counts(last_trials, "last_trials")
    rs, rt = _counts(recent_successes, "recent_successes"), _counts(recent_trials, "recent_trials")
    obs = _counts(observed, "observed")
    W = _int(window, "window", 1)
    m = _int(min_rewards, "min_rewards", 0)
    for name, a in (("last_trials", lt), ("recent_successes", rs), ("recent_trials", rt), ("observed", obs)):
        if a.shape != ls.shape:
            raise ValueError(f"{name} must have shape {ls.shape} (one entry per prompt), got {a.shape}")
    for bad, what in (
        (ls > lt, "last_successes must not exceed last_trials"),
        (rs > rt, "recent_successes must not exceed recent_trials"),
        (rt != np.minimum(obs, W), f"recent_trials must be min(observed, window={W})"),
        (lt > obs, "last_trials must not exceed observed"),
    ):
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{what}; not so at index {i}")
    p = np.zeros(ls.shape, dtype=np.float64)
    whole = lt >= W
    p[whole] = ls[whole] / lt[whole]
    part = ~whole & (rt > 0)
    p[part] = rs[part] / rt[part]
    return p, obs >= m


# ---------------------------------------------------------------------------------------------------------------
# the cost and the value
# ---------------------------------------------------------------------------------------------------------------


def visit_cost(p, n_max: int = 128, confidence: float = CONFIDENCE) -> np.ndarray:
    """The rollouts a mixed prompt is given in the knapsack's budget: c = min(n_max, floor(log(1 - confidence) /
    log(max(p, 1 - p)))), the count after which its rarer outcome has appeared with probability ``confidence``
    (max(p, 1 - p)^c = 1 - confidence), truncated after rounding to float32 as their cost array does.

    Args:
        p: (P,) success rates in (0, 1).
        n_max: cap, integer >= 0 (their MAX_N).
        confidence: in (0, 1) (their ``alpha``, 0.9).

    Returns:
        int64 (P,).
    """
    pp = finite_array(p, "p")
    if pp.ndim != 1 or np.any((pp <= 0) | (pp >= 1)):
        raise ValueError(f"p must be a 1-D array of rates in (0, 1) (mixed prompts), got {p!r}")
    cap = _int(n_max, "n_max", 0)
    if not (isinstance(confidence, (int, float)) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    # scalar math.log, as their scalar np.log: a vectorised log may round differently, and the float32 truncation
    # below can turn one ulp into one rollout
    # c = log(1 - confidence) / log(max(p, 1 - p))
    c = [float(np.float32(math.log(1 - confidence) / math.log(max(x, 1 - x)))) for x in pp.tolist()]
    return np.array([int(min(cap, x)) for x in c], dtype=np.int64)


def knapsack_values_exact(p, n_min: int, extra: int, zero_at_floor: bool = True) -> np.ndarray:
    """The value table of the authors' knapsack: g[i, x] for x = 0..extra extra rollouts beyond the floor n_min,

        g[i, x] = v_i(n_min + x) = (1 - p_i^(n_min + x) - (1 - p_i)^(n_min + x)) p_i (1 - p_i)^2    (x >= 1)
        g[i, 0] = 0 with ``zero_at_floor`` (their solver's), else v_i(n_min)

    computed from p_i rounded to float32, in float64 scalar arithmetic with the C library's pow, in their order (the
    module docstring: ties between prompts of equal rate fall on these bits).

    Args:
        p: (Q,) rates in (0, 1).
        n_min: the floor, integer >= 0.
        extra: the most extra rollouts, integer >= 0.
        zero_at_floor: value a prompt left at the floor at 0 (their code) or at v(n_min).

    Returns:
        float64 (Q, extra + 1).
    """
    pp = finite_array(p, "p")
    if pp.ndim != 1 or np.any((pp <= 0) | (pp >= 1)):
        raise ValueError(f"p must be a 1-D array of rates in (0, 1) (mixed prompts), got {p!r}")
    lo = _int(n_min, "n_min", 0)
    K = _int(extra, "extra", 0)
    rows: dict[float, list[float]] = {}
    out = np.empty((pp.shape[0], K + 1), dtype=np.float64)
    for i, x in enumerate(np.asarray(pp, dtype=np.float32).tolist()):  # float(float32): their success_rates array
        if x not in rows:
            q = 1.0 - x
            # v(n) = (1 - p^n - (1 - p)^n) * p * (1 - p)^2, left to right as their expression
            row = [(1 - x ** (k + lo) - q ** (k + lo)) * x * q**2 for k in range(K + 1)]
            if zero_at_floor:
                row[0] = 0.0
            rows[x] = row
        out[i] = rows[x]
    return out


# ---------------------------------------------------------------------------------------------------------------
# the allocation
# ---------------------------------------------------------------------------------------------------------------


def _even(total: int, k: int) -> np.ndarray:
    """``total`` split evenly over ``k`` prompts, the first ones one more (their remainder rule)."""
    return split_budget(np.zeros(k), total)


def authors_allocation(
    rate,
    valid,
    budget: int,
    *,
    n_min: int = 2,
    n_max: int = 128,
    zero_at_floor: bool = True,
    confidence: float = CONFIDENCE,
) -> np.ndarray:
    """Knapsack RL's rollout counts for a step, as their ``sampling_budget_by_knapsack`` computes them (the module
    docstring's rule: floors, costs, the fallback to never-solved prompts, the knapsack over the mixed ones).

    Args:
        rate: (P,) each prompt's estimated success rate (`recent_rate`), in [0, 1].
        valid: (P,) bool: the estimate counts (enough rewards seen); the others get the even share B // P.
        budget: B, rollouts of the step, integer >= 0.
        n_min: the floor of every valid prompt (their MIN_N = NEGATIVE_N = POSITIVE_N), integer >= 0; lowered to
            B // P when the budget cannot give every prompt that many.
        n_max: the most rollouts the knapsack gives a mixed prompt (their MAX_N), integer >= n_min; the fallback's
            surplus is not bound by it (nor in their code).
        zero_at_floor: their solver's value 0 for a mixed prompt left at the floor (module docstring).
        confidence: the probability behind each mixed prompt's cost (`visit_cost`).

    Returns:
        int64 (P,) summing to ``budget``.
    """
    p = finite_array(rate, "rate")
    if p.ndim != 1 or p.shape[0] == 0:
        raise ValueError(f"rate must be a non-empty 1-D array (one rate per prompt), got shape {p.shape}")
    if np.any((p < 0) | (p > 1)):
        i = int(np.flatnonzero((p < 0) | (p > 1))[0])
        raise ValueError(f"rate must lie in [0, 1]; found {p[i]} at index {i}")
    ok = np.asarray(valid)
    if ok.shape != p.shape or ok.dtype != bool:
        raise ValueError(f"valid must be a bool array of the rates' shape {p.shape}, got {ok.dtype} {ok.shape}")
    B = _int(budget, "budget", 0)
    P = p.shape[0]
    n = B // P
    lo = min(_int(n_min, "n_min", 0), n)
    hi = _int(n_max, "n_max", 0)
    if hi < _int(n_min, "n_min", 0):
        raise ValueError(f"n_max must be >= n_min, got n_max={n_max!r} < n_min={n_min!r}")
    mixed = ok & (p > 0) & (p < 1)
    # their rate array holds 0 for an invalid prompt, so the fallback counts it as never solved
    zero = ~ok | (p == 0)
    counts = np.where(ok, lo, n).astype(np.int64)
    left = B - int(counts.sum())
    if not mixed.any():
        if left > 0:
            if zero.any():
                counts[zero] += _even(left, int(zero.sum()))
            else:  # every prompt always solved: their code gives each the even share
                counts = _even(B, P)
        return counts
    idx = np.flatnonzero(mixed)
    cost = int(visit_cost(p[idx], hi, confidence).sum())
    to_knapsack = left
    if cost < left:
        # the fallback: the mixed prompts' knapsack gets what their costs add up to, the rest explores
        takers = np.flatnonzero(zero) if zero.any() else np.flatnonzero(~mixed)
        if takers.shape[0]:  # none when every prompt is mixed: their code fails there; the knapsack takes it all
            counts[takers] += _even(left - cost, takers.shape[0])
            to_knapsack = cost
    cap = hi - lo
    placed = min(to_knapsack, cap * idx.shape[0])
    if placed:
        values = knapsack_values_exact(p[idx], lo, cap, zero_at_floor)
        counts[idx] += knapsack_dp(values, placed, 0, cap)
    # what the knapsack cannot place (every mixed prompt at its cap) is split evenly over them, as their solver does
    counts[idx] += _even(to_knapsack - placed, idx.shape[0])
    return counts
