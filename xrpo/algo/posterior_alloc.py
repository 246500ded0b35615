"""xrpo-plus: a planning round placed where a Beta posterior expects the most rollouts with a non-zero advantage.

xrpo's own planner beyond the paper's HRP (Section 3.2). It replaces Eq. (3)'s priority in a
planning round of Algorithm 1 (lines 5-13: same base round of ``n_base`` rollouts per prompt, same rounds, same ICL
seeding of prompts with no success yet); only the split of each round's budget changes. The rule:

1. **Posterior.** Prompt i's success rate p_i gets a Beta posterior from what the step knows:

       alpha_i = alpha0_i + k_i + w hk_i,     beta_i = beta0_i + (m_i - k_i) + w (hn_i - hk_i)

   with k_i of m_i the prompt's successes / rollouts so far in this step, hk_i of hn_i those of its earlier visits
   (optional; ``history_weight`` w in [0, 1] discounts them for a policy that moved since), and (alpha0_i, beta0_i)
   a prior: Beta(1, 1) by default; or fitted to the batch by the method of moments (:func:`fit_beta_prior`,
   ``prior="batch"`` / ``"batch-variance"``); or given (a fit to the run so far); or centred on a per-prompt
   ``prior_mean`` (e.g. the success rate of the prompt's nearest solved neighbours in the ICL index) with the
   prior's strength. Why Beta(1, 1) and not a prior fitted to the batch: measured in the simulator on the
   68 criteria distributions (docs/results.md, "Allocation beyond the paper"), the fitted prior loses to Beta(1, 1)
   with and without history. A batch is a mixture of never-solved, always-solved and graded prompts that no single
   Beta holds; a Beta fitted to it misplaces the tails (the chance that a prompt at 0 of 4 or 4 of 4 is at exactly
   0 or 1), which is exactly what this objective's bets on flat prompts depend on (step 3).

2. **Value.** The step trains on each prompt's group: all its rollouts of every round. A group gives every rollout
   a non-zero GRPO advantage exactly when its 0/1 rewards are not all equal. The value of x more rollouts is the
   posterior-predictive expected number of such rollouts,

       G_i(x) = (m_i + x) P(group of m_i + x not all equal | posterior)
              = m_i + x                            if 0 < k_i < m_i   (already mixed: every rollout counts)
              = (m_i + x) (1 - E[(1 - p)^x])       if k_i = 0 < m_i   (mixed iff one of the x succeeds)
              = (m_i + x) (1 - E[p^x])             if k_i = m_i > 0
              = x (1 - E[p^x] - E[(1 - p)^x])      if m_i = 0

   with E[p^x] = B(alpha + x, beta) / B(alpha, beta) under Beta(alpha, beta). It is the share target's quantity
   (the informative-rollout share) in expectation, with the uncertainty about p integrated out rather than plugged
   in. Rounds are planned one at a time (myopic), as HRP plans them.

3. **Allocation.** maximise sum_i G_i(x_i) subject to sum_i x_i = B and 0 <= x_i <= cap_i. G_i is linear for a
   mixed prompt but not concave for an all-equal one: its increments grow with x (one success turns all m_i + x
   rollouts informative), so greedy marginal gains are not exact. It is solved exactly by dynamic programming
   (:func:`xrpo.algo.knapsack.knapsack_dp`), with one reduction that makes it cheap: every mixed prompt gains
   exactly 1 per rollout, so they form one item of value y for y rollouts (any split among them is worth the same;
   they share y evenly, ``split_budget``'s rule) and the DP runs over the all-equal prompts plus that pooled item,
   on the values G_i(x) - x (the gain over giving those rollouts to the pool); ties go to the pool, and when the
   pool can take the whole budget a prompt whose net gain is never positive is left out of the DP. Budgets above
   ``max_units`` are planned in steps of u = ceil(B / max_units) rollouts for the all-equal prompts (the pool still
   takes any number; what units cannot place goes one rollout at a time to the largest marginal gain); at and below
   ``max_units`` (every round of the study and the SmolLM2 slice) the allocation is exact. A consequence of the
   objective: a flat prompt whose posterior says one success is likely may receive a whole round (all its m_i base
   rollouts become informative if it mixes); ``max_per_prompt`` bounds such bets.

4. **The size of a group's value** (``size_power`` gamma in [0, 1]). Step 2 values a mixed group by its rollouts,
   which is what the informative share counts, and it is not what the update learns from: a mixed group's rollouts
   estimate one prompt's gradient, so its 37th rollout sharpens an estimate the update already has, where a prompt
   left flat contributes nothing at all. Measured in training (docs/results.md, "Learning speed"), step 2's rule
   gives a gradient to fewer prompts than GRPO's even split (it pools the rounds on the prompts the base round
   left mixed) and learns no faster. The general value is

       V_i(x) = (m_i + x)^gamma P(group of m_i + x not all equal | posterior)

   gamma = 1 is step 2's G_i (informative rollouts); gamma = 0 counts the prompts that carry a gradient (a flat
   prompt's chance to mix, whatever its size); in between, a mixed group's worth grows as n^gamma, with diminishing
   returns: gamma = 1/2 is the growth of the signal-to-noise ratio of a mean of n independent per-rollout gradient
   terms (signal fixed, noise ~ 1/sqrt(n)). With gamma < 1 a mixed prompt's value is concave in x, no longer
   linear, so the pooled item of step 3 does not apply: the DP runs over every prompt on V_i(x) itself (same units
   above ``max_units``; what units leave goes one rollout at a time to the largest marginal gain).

What this rule knows that HRP's Eqs. (1)-(3) do not: the base round of the other prompts (through the prior), the
prompt's earlier visits, and what a success would buy (all m_i + x rollouts, not one). What it does not do: look
beyond the current round.

Everything is numpy/scipy on the host: a few numbers per prompt.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from xrpo.algo.allocation import split_budget
from xrpo.algo.knapsack import knapsack_dp
from xrpo.algo.signal import finite_array

__all__ = [
    "expected_informative",
    "fit_beta_prior",
    "group_mixed_prob",
    "group_value",
    "posterior_allocation",
    "posterior_params",
]


def _counts(successes, trials, name: str, whole: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(successes, trials) as float64 (Q,) arrays, checked: >= 0, successes <= trials, whole numbers if ``whole``."""
    k = finite_array(successes, f"{name} successes")
    n = finite_array(trials, f"{name} trials")
    if k.ndim != 1 or k.shape[0] == 0 or k.shape != n.shape:
        raise ValueError(
            f"{name} successes and trials must be non-empty 1-D arrays of one shape, got {k.shape} and {n.shape}"
        )
    for a, what in ((k, "successes"), (n, "trials")):
        bad = (a < 0) | ((a != np.round(a)) if whole else False)
        if np.any(bad):
            i = int(np.flatnonzero(bad)[0])
            kind = "whole numbers >= 0" if whole else "numbers >= 0"
            raise ValueError(f"{name} {what} must hold {kind}; found {a[i]:g} at index {i}")
    if np.any(k > n):
        i = int(np.flatnonzero(k > n)[0])
        raise ValueError(f"{name} successes must not exceed trials; found {k[i]:g} > {n[i]:g} at index {i}")
    return k, n


# ---------------------------------------------------------------------------------------------------------------
# the posterior
# ---------------------------------------------------------------------------------------------------------------


def _all_equal_prob(mu: float, s: float, n: np.ndarray) -> np.ndarray:
    """E[p^n + (1 - p)^n] under Beta(mu s, (1 - mu) s), per n (real n >= 0): the chance that a group of n is flat."""
    a, b = mu * s, (1.0 - mu) * s
    gl = special.gammaln
    # E[p^n] = B(a + n, b) / B(a, b) = G(a + n) G(a + b) / (G(a + b + n) G(a)); E[(1 - p)^n] likewise with b
    common = gl(a + b) - gl(a + b + n)
    return np.exp(gl(a + n) - gl(a) + common) + np.exp(gl(b + n) - gl(b) + common)


def fit_beta_prior(
    successes, trials, *, moment: str = "flat", min_strength: float = 0.05, max_strength: float = 1000.0
) -> tuple[float, float]:
    """Empirical-Bayes Beta(alpha0, beta0) prior of the batch's success rates, by the method of moments.

    Each prompt's count k_i of n_i is Beta-binomial: p_i ~ Beta(mu s, (1 - mu) s), k_i ~ Binomial(n_i, p_i). The
    mean is matched in both variants, mu^ = mean(k_i / n_i) (kept in [e, 1 - e], e = 1 / (2 (sum n_i + 1)): half a
    success over the batch, so that a batch with no success still leaves every prompt a chance). The strength s =
    alpha0 + beta0 is matched on one more moment:

    - ``moment="flat"`` (default): the share of the batch's groups whose rewards are all equal, the quantity this
      planner bets on. s solves  mean_i E[p^n_i + (1 - p)^n_i] = mean_i 1{k_i in {0, n_i}}  over the prompts with
      n_i >= 2 (the left side decreases in s, from 1 at s -> 0 to mean_i mu^n_i + (1 - mu)^n_i at s -> inf:
      bisection on log s, 30 halvings).
    - ``moment="variance"``: the spread of the raw rates r_i = k_i / n_i, the textbook moment. With rho =
      1 / (s + 1), E[r_i] = mu and Var(r_i) = mu (1 - mu) (rho + (1 - rho) / n_i), so with c = mean(1 / n_i) and S^2
      the sample variance of the r_i: rho^ = (S^2 / (mu^ (1 - mu^)) - c) / (1 - c), s = 1 / rho^ - 1.

    Why "flat" is the default (measured, docs/results.md "Allocation beyond the paper"): a batch is typically a
    mixture of never-solved prompts and graded ones, which one Beta cannot hold. The variance fit spreads the
    never-solved mass into a Beta of moderate strength, which gives a prompt at 0 of 4 a posterior mean near the
    graded prompts' (about 0.2 on the study's rates instead of the 0.06 the true mixture gives), so the planner
    bets rollouts on prompts that will not be solved. Matching the flat share puts the prior's mass where the flat
    groups are. Why moments at all: closed form or a 1-D bisection (microseconds to a fraction of a millisecond,
    inside a planning round); a maximum-likelihood mixture fit (``xrpo.sim.model.fit_success_rate_mixture``)
    needs an iterative solver from several starts.

    s is kept in [min_strength, max_strength]. Fewer than two prompts with n_i >= 2 (variance: with n_i >= 1), or
    every n_i = 1: s = 2, the strength of Beta(1, 1), at mu^. No prompt seen: Beta(1, 1).

    Args:
        successes, trials: (Q,) counts per prompt (numbers >= 0, successes <= trials; discounted histories make
            them fractional; trials 0: not seen, ignored).
        moment: "flat" or "variance".
        min_strength, max_strength: bounds on s, 0 < min_strength <= max_strength.

    Returns:
        (alpha0, beta0), two floats > 0.
    """
    k, n = _counts(successes, trials, "prior", whole=False)
    lo, hi = float(min_strength), float(max_strength)
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
        raise ValueError(f"need 0 < min_strength <= max_strength, got {min_strength!r}, {max_strength!r}")
    if moment not in ("flat", "variance"):
        raise ValueError(f"moment must be 'flat' or 'variance', got {moment!r}")
    seen = n > 0
    if not seen.any():
        return 1.0, 1.0
    r = k[seen] / n[seen]
    eps = 0.5 / (n[seen].sum() + 1.0)
    mu = min(max(float(r.mean()), eps), 1.0 - eps)
    s = 2.0
    if moment == "flat":
        big = n >= 2
        if int(big.sum()) >= 2:
            nb = n[big]
            # observed share of flat groups (0 or n_i successes)
            z = float(np.mean((k[big] == 0) | (k[big] == nb)))
            if z >= float(_all_equal_prob(mu, lo, nb).mean()):
                s = lo
            elif z <= float(_all_equal_prob(mu, hi, nb).mean()):
                s = hi
            else:
                # mean_i E[p^n_i + (1 - p)^n_i] = z, decreasing in s: bisection on log s
                a, b = math.log(lo), math.log(hi)
                for _ in range(30):
                    c = 0.5 * (a + b)
                    if float(_all_equal_prob(mu, math.exp(c), nb).mean()) > z:
                        a = c
                    else:
                        b = c
                s = math.exp(0.5 * (a + b))
    else:
        c = float(np.mean(1.0 / n[seen]))
        if r.shape[0] >= 2 and c < 1.0:
            # rho^ = (S^2 / (mu (1 - mu)) - c) / (1 - c)
            rho = (float(r.var(ddof=1)) / (mu * (1.0 - mu)) - c) / (1.0 - c)
            # s = 1 / rho - 1, bounded (rho <= 0: no spread beyond binomial noise -> the strongest prior)
            s = hi if rho <= 1.0 / (1.0 + hi) else min(max(1.0 / rho - 1.0, lo), hi)
    return mu * s, (1.0 - mu) * s


def posterior_params(
    successes,
    trials,
    *,
    history_successes=None,
    history_trials=None,
    history_weight: float = 1.0,
    prior="flat",
    prior_mean=None,
):
    """Each prompt's Beta(alpha_i, beta_i) posterior (step 1 of the module docstring).

    Args:
        successes, trials: (Q,) this step's successes and rollouts so far per prompt.
        history_successes, history_trials: (Q,) earlier visits (both or neither; trials 0: never seen).
        history_weight: w in [0, 1], the weight of an earlier rollout relative to one of this step.
        prior: "flat" (Beta(1, 1), the default: see the module docstring), "batch" (:func:`fit_beta_prior` on this
            step's and the weighted earlier counts, matching the share of flat groups), "batch-variance" (the same,
            matching the variance of the rates), or a pair (alpha0, beta0) > 0 (e.g. fitted to the run so far).
        prior_mean: optional (Q,) prior means in [0, 1], NaN where unknown (e.g. neighbours' success rate): such a
            prompt's prior is Beta(s m, s (1 - m)) with s = alpha0 + beta0 and m clipped to [0.01, 0.99].

    Returns:
        (alpha, beta): two float64 (Q,) arrays, > 0.
    """
    k, m = _counts(successes, trials, "step")
    if (history_successes is None) != (history_trials is None):
        raise ValueError("give history_successes and history_trials together (or neither)")
    w = float(history_weight)
    if not (math.isfinite(w) and 0.0 <= w <= 1.0):
        raise ValueError(f"history_weight must lie in [0, 1], got {history_weight!r}")
    if history_successes is None:
        hk = hn = np.zeros_like(k)
    else:
        hk, hn = _counts(history_successes, history_trials, "history")
        if hk.shape != k.shape:
            raise ValueError(f"history arrays must have shape {k.shape} (one entry per prompt), got {hk.shape}")
    K, N = k + w * hk, m + w * hn
    if isinstance(prior, str):
        if prior == "batch":
            a0, b0 = fit_beta_prior(K, N)
        elif prior == "batch-variance":
            a0, b0 = fit_beta_prior(K, N, moment="variance")
        elif prior == "flat":
            a0, b0 = 1.0, 1.0
        else:
            raise ValueError(
                f"prior must be 'batch', 'batch-variance', 'flat' or a pair (alpha0, beta0), got {prior!r}"
            )
    else:
        try:
            a0, b0 = (float(x) for x in prior)
        except (TypeError, ValueError):
            raise ValueError(
                f"prior must be 'batch', 'batch-variance', 'flat' or a pair (alpha0, beta0), got {prior!r}"
            ) from None
        if not (a0 > 0 and b0 > 0 and math.isfinite(a0) and math.isfinite(b0)):
            raise ValueError(f"prior (alpha0, beta0) must be finite and > 0, got {prior!r}")
    a = np.full(k.shape, a0)
    b = np.full(k.shape, b0)
    if prior_mean is not None:
        pm = np.asarray(prior_mean, dtype=np.float64)
        if pm.shape != k.shape:
            raise ValueError(f"prior_mean must have shape {k.shape} (one entry per prompt, NaN: none), got {pm.shape}")
        known = ~np.isnan(pm)
        if np.any(~np.isfinite(pm[known])) or np.any((pm[known] < 0) | (pm[known] > 1)):
            raise ValueError(f"prior_mean must hold rates in [0, 1] or NaN, got {prior_mean!r}")
        mm = np.clip(pm[known], 0.01, 0.99)
        a[known], b[known] = (a0 + b0) * mm, (a0 + b0) * (1.0 - mm)
    # conjugate update: alpha_i = alpha0_i + k_i + w hk_i,  beta_i = beta0_i + (m_i - k_i) + w (hn_i - hk_i)
    return a + K, b + (N - K)


# ---------------------------------------------------------------------------------------------------------------
# the value of more rollouts
# ---------------------------------------------------------------------------------------------------------------


def group_mixed_prob(alpha, beta, successes, trials, extra) -> np.ndarray:
    """P(a prompt's group of m + x rollouts has rewards not all equal | its k of m so far and Beta(alpha, beta)).

    Posterior predictive (step 2 of the module docstring): 1 if already mixed (0 < k < m), 1 - E[(1 - p)^x] after
    k = 0 < m, 1 - E[p^x] after k = m > 0, 1 - E[p^x] - E[(1 - p)^x] for m = 0 and x >= 2 (0 for x <= 1), with
    E[p^x] = B(alpha + x, beta) / B(alpha, beta).

    Args:
        alpha, beta: (Q,) posterior parameters > 0 (given k of m: :func:`posterior_params`).
        successes, trials: (Q,) k and m, whole numbers, 0 <= k <= m.
        extra: (X,) numbers of further rollouts x >= 0 (whole numbers), the same for every prompt, or (Q, X), a row
            per prompt.

    Returns:
        float64 (Q, X) in [0, 1].
    """
    a, b = finite_array(alpha, "alpha"), finite_array(beta, "beta")
    k, m = _counts(successes, trials, "step")
    if a.shape != k.shape or b.shape != k.shape or np.any(a <= 0) or np.any(b <= 0):
        raise ValueError(f"alpha and beta must be > 0 with shape {k.shape}")
    x = finite_array(extra, "extra")
    if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != k.shape[0]) or np.any(x < 0):
        raise ValueError(f"extra must be (X,) or ({k.shape[0]}, X) numbers of rollouts >= 0, got shape {x.shape}")
    if not np.all(x == np.round(x)):
        raise ValueError(f"extra must hold whole numbers, got {extra!r}")
    xx = x[None, :] if x.ndim == 1 else x
    kk, mm = k[:, None], m[:, None]
    # k = m > 0: E[p^x] under Beta(alpha, beta) is E[(1 - p)^x] under Beta(beta, alpha); one formula for both cases
    swap = (k == m) & (m > 0)
    a1, b1 = np.where(swap, b, a)[:, None], np.where(swap, a, b)[:, None]
    # E[(1 - p)^x] = B(alpha, beta + x) / B(alpha, beta) = G(beta + x) G(alpha + beta) / (G(alpha + beta + x) G(beta))
    gl = special.gammaln
    e1 = np.exp(gl(b1 + xx) - gl(a1 + b1 + xx) + (gl(a1 + b1) - gl(b1)))
    out = np.where((kk > 0) & (kk < mm), 1.0, 1.0 - e1)  # one different reward mixes an all-equal group
    if np.any(m == 0):  # a prompt with no rollout yet: the group of x is mixed unless all right or all wrong
        e2 = np.exp(gl(a1 + xx) - gl(a1 + b1 + xx) + (gl(a1 + b1) - gl(a1)))
        fresh = np.where(xx >= 2, np.maximum(1.0 - e1 - e2, 0.0), 0.0)
        out = np.where(mm == 0, fresh, out)
    return out


def expected_informative(alpha, beta, successes, trials, extra) -> np.ndarray:
    """G_i(x) = (m_i + x) x :func:`group_mixed_prob`: the expected rollouts with a non-zero advantage in prompt i's
    group after x more rollouts (step 2 of the module docstring). Same arguments; float64 (Q, X)."""
    return group_value(alpha, beta, successes, trials, extra, 1.0)


def check_size_power(power) -> float:
    """``size_power`` as a float in [0, 1], or a ValueError naming it."""
    if isinstance(power, bool) or not isinstance(power, (int, float, np.integer, np.floating)):
        raise ValueError(f"size_power must be a number in [0, 1], got {power!r}")
    if not (math.isfinite(float(power)) and 0.0 <= float(power) <= 1.0):
        raise ValueError(f"size_power must lie in [0, 1], got {power!r}")
    return float(power)


def group_value(alpha, beta, successes, trials, extra, power: float) -> np.ndarray:
    """V_i(x) = (m_i + x)^power x :func:`group_mixed_prob` (step 4 of the module docstring): power 1 is
    :func:`expected_informative`, power 0 the chance that the prompt carries a gradient. Same arguments as
    :func:`group_mixed_prob`, ``power`` in [0, 1]; float64 (Q, X)."""
    g = check_size_power(power)
    mixed = group_mixed_prob(alpha, beta, successes, trials, extra)  # checks every argument, names the bad one
    m, x = finite_array(trials, "trials"), finite_array(extra, "extra")
    # V_i(x) = (m_i + x)^gamma P(group of m_i + x not all equal | posterior); 0^0 = 1 is harmless: P(mixed) = 0 there
    return (m[:, None] + (x[None, :] if x.ndim == 1 else x)) ** g * mixed


# ---------------------------------------------------------------------------------------------------------------
# the round's allocation
# ---------------------------------------------------------------------------------------------------------------


def _caps(max_per_prompt, Q: int, budget: int) -> np.ndarray:
    if max_per_prompt is None:
        return np.full(Q, budget, dtype=np.int64)
    c = finite_array(max_per_prompt, "max_per_prompt")
    c = np.broadcast_to(c, (Q,)) if c.ndim == 0 else c
    if c.shape != (Q,) or np.any(c < 0) or not np.all(c == np.round(c)):
        raise ValueError(
            f"max_per_prompt must be None, an integer >= 0 or ({Q},) integers >= 0, got {max_per_prompt!r}"
        )
    caps = np.minimum(c.astype(np.int64), budget)
    if int(caps.sum()) < budget:
        raise ValueError(f"budget={budget} cannot be placed: max_per_prompt allows at most {int(caps.sum())} rollouts")
    return caps


def _solve(gain_fn, caps_flat: np.ndarray, pool_cap: int, budget: int, unit: int) -> tuple[np.ndarray, int]:
    """Step 3 for the all-equal prompts (caps ``caps_flat``) and the pooled mixed ones (``pool_cap``): the DP in
    units of ``unit`` rollouts on the net gains G_i(x) - x, the pooled item (net gain 0) as row 0 so that ties leave
    rollouts with the mixed prompts. What the units leave (budget not a multiple of ``unit``, or caps that are not)
    goes to the pool while it has room, then one rollout at a time to the all-equal prompt of largest marginal
    G_i(x + 1) - G_i(x) (none with unit = 1 and feasible caps: then the allocation is exact). Returns (extra rollouts
    of the all-equal prompts, rollouts of the pool)."""
    J = caps_flat // unit
    pool_units = pool_cap // unit
    B_units = min(budget // unit, int(J.sum()) + pool_units)
    W = int(min(B_units, max(int(J.max()), pool_units)))
    x = unit * np.arange(W + 1, dtype=np.float64)
    values = np.zeros((caps_flat.shape[0] + 1, W + 1))
    # net gain of x rollouts to an all-equal prompt over giving them to the pool: G_i(x) - x
    values[1:] = gain_fn(x) - x[None, :]
    hi = np.concatenate([[min(pool_units, W)], np.minimum(J, W)])
    keep = np.ones(hi.shape[0], dtype=bool)
    if pool_units >= B_units:
        # the pool can take the whole budget: a prompt with G_i(x) - x <= 0 at every allowed x is left out of the DP
        # (moving its rollouts to the pool never lowers the total), which leaves it few rows, usually none
        allowed = np.arange(W + 1)[None, :] <= hi[1:, None]
        keep[1:] = np.where(allowed, values[1:], -np.inf)[:, 1:].max(axis=1, initial=-np.inf) > 0
    j = np.zeros(hi.shape[0], dtype=np.int64)
    if keep[1:].any():
        j[keep] = knapsack_dp(values[keep], B_units, 0, hi[keep])
    else:  # no flat prompt is worth a rollout: the pool takes the budget (the DP's answer, without the DP)
        j[0] = B_units
    extra, pool = unit * j[1:], unit * int(j[0])
    left = budget - int(extra.sum()) - pool
    to_pool = min(left, pool_cap - pool)
    pool, left = pool + to_pool, left - to_pool
    while left > 0:
        g = gain_fn(extra[:, None] + np.array([0.0, 1.0])[None, :])  # (Q_e, 2): G_i(x_i), G_i(x_i + 1)
        step = np.where(extra < caps_flat, g[:, 1] - g[:, 0], -np.inf)
        extra[int(np.argmax(step))] += 1
        left -= 1
    return extra, pool


def _solve_all(value_fn, caps: np.ndarray, budget: int, unit: int) -> np.ndarray:
    """Step 4's allocation (gamma < 1): the DP over every prompt in units of ``unit`` rollouts on V_i(x); what the
    units leave goes one rollout at a time to the prompt of largest marginal V_i(x + 1) - V_i(x) under its cap
    (none with unit = 1: then the allocation is exact)."""
    J = caps // unit
    B_units = min(budget // unit, int(J.sum()))
    W = int(min(B_units, int(J.max())))
    x = unit * np.arange(W + 1, dtype=np.float64)
    extra = unit * knapsack_dp(value_fn(x), B_units, 0, np.minimum(J, W))
    left = budget - int(extra.sum())
    while left > 0:
        g = value_fn(extra[:, None] + np.array([0.0, 1.0])[None, :])  # (Q, 2): V_i(x_i), V_i(x_i + 1)
        step = np.where(extra < caps, g[:, 1] - g[:, 0], -np.inf)
        extra[int(np.argmax(step))] += 1
        left -= 1
    return extra


def posterior_allocation(
    successes,
    trials,
    budget: int,
    *,
    history_successes=None,
    history_trials=None,
    history_weight: float = 1.0,
    prior="flat",
    prior_mean=None,
    max_per_prompt=None,
    max_units: int = 128,
    size_power: float = 1.0,
) -> np.ndarray:
    """xrpo-plus: the extra rollouts of one planning round (the module docstring's rule).

    Args:
        successes, trials: (Q,) this step's successes and rollouts so far per prompt (after the base round: k of
            n_base), whole numbers, 0 <= k <= m.
        budget: the round's rollouts B, integer >= 0.
        history_successes, history_trials, history_weight, prior, prior_mean: as :func:`posterior_params`.
        max_per_prompt: None, an integer, or (Q,) integers: the most extra rollouts a prompt may get this round.
        max_units: budgets up to this many rollouts are solved exactly; above, the all-equal prompts (every prompt,
            with size_power < 1) receive multiples of ceil(B / max_units) (integer >= 1).
        size_power: gamma of step 4, in [0, 1]: a group of n rollouts whose rewards are not all equal is worth
            n^gamma (1: informative rollouts, the pooled fast path; < 1: the DP over every prompt).

    Returns:
        int64 (Q,) extra rollouts, >= 0, within the caps, summing to ``budget``.
    """
    k, m = _counts(successes, trials, "step")
    B = int(budget) if isinstance(budget, (int, np.integer)) and not isinstance(budget, bool) else -1
    if B < 0:
        raise ValueError(f"budget must be an integer >= 0, got {budget!r}")
    if isinstance(max_units, bool) or not isinstance(max_units, (int, np.integer)) or max_units < 1:
        raise ValueError(f"max_units must be an integer >= 1, got {max_units!r}")
    gamma = check_size_power(size_power)
    Q = k.shape[0]
    caps = _caps(max_per_prompt, Q, B)
    out = np.zeros(Q, dtype=np.int64)
    if B == 0:
        return out
    a, b = posterior_params(
        k,
        m,
        history_successes=history_successes,
        history_trials=history_trials,
        history_weight=history_weight,
        prior=prior,
        prior_mean=prior_mean,
    )
    unit = max(1, -(-B // max_units))
    if gamma < 1.0:
        return _solve_all(lambda x: group_value(a, b, k, m, x, gamma), caps, B, unit)
    mixed = (k > 0) & (k < m)
    flat = np.flatnonzero(~mixed)
    pooled = np.flatnonzero(mixed)
    pool_cap = int(caps[pooled].sum())
    if flat.shape[0] == 0:
        y = B
    else:

        def gain(x: np.ndarray) -> np.ndarray:
            return expected_informative(a[flat], b[flat], k[flat], m[flat], x)

        out[flat], y = _solve(gain, caps[flat], pool_cap, B, unit)
    if y:
        # every mixed prompt gains 1 per rollout: they share the pool's rollouts evenly (split_budget's rule)
        out[pooled] = split_budget(np.zeros(pooled.shape[0]), y, max_per_prompt=caps[pooled])
    if int(out.sum()) != B:  # unreachable; a wrong total would change the batch size
        raise RuntimeError(f"posterior_allocation: allocated {int(out.sum())} rollouts instead of {B}")
    return out
