"""CurES: prompt sampling and rollout allocation from a Beta posterior of each prompt's accuracy.

Zeng et al. 2025, "CurES: From Gradient Analysis to Efficient Curriculum Learning for Reasoning LLMs" (arXiv
2510.01037, ICLR 2026); the XRPO paper compares against it in its appendix "Comparison with CurES". Abstract: "the
sampling distribution of prompts dictates the convergence rate of gradient descent, while the allocation of the
rollout quantity influences the consistency and stability of overall gradient updates".

What each function computes, and where the rule comes from. The paper's body could not be consulted while this was
written (only its abstract); every rule below is the one of the authors' code, github.com/ZexuSun/CurES, files named
in each docstring, and docs/methods.md lists what xrpo does differently and why.

    beta_posterior       alpha_i = alpha_0 + s_i,  beta_i = beta_0 + n_i - s_i     (Beta-Binomial update)
    posterior_mean       p_i = alpha_i / (alpha_i + beta_i)                          (the accuracy estimate)
    prompt_temperature   T_i = c * alpha_i                                            (per-prompt temperature)
    sampling_probs       P_i = exp(sqrt(p_i (1 - p_i)) / T_i) / sum_j exp(...)      (prompt distribution)
    sample_prompts       k distinct prompts drawn from P without replacement
    gradient_std         sigma_i^2 = Var_y[(r(y) - p_i) G(y)], G = ||grad log pi(y | x_i)||
    rollout_counts       n_i proportional to sigma_i, at least ``min_count``, summing exactly to the budget

Everything is numpy on the host: a few numbers per prompt.
"""

from __future__ import annotations

import math

import numpy as np

from xrpo.algo.allocation import split_budget
from xrpo.algo.signal import finite_array

__all__ = [
    "beta_posterior",
    "gradient_std",
    "normalized_entropy",
    "posterior_mean",
    "prompt_temperature",
    "rollout_counts",
    "sample_prompts",
    "sampling_probs",
]


def _positive(x: float, name: str) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number > 0, got {x!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {x!r}")
    return v


def _first_bad(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def beta_posterior(successes, trials, prior_alpha: float = 1.0, prior_beta: float = 1.0):
    """Beta posterior of each prompt's accuracy after ``successes`` correct rollouts out of ``trials``.

    CurES code, epic/epic_sampler.py ``update_difficulty`` (and stage_0_init_difficulty_sample_size.py):
    ``Beta(alpha + 1, beta + 1)`` with alpha the accepted and beta the rejected rollouts so far, i.e. the conjugate
    update of a uniform Beta(1, 1) prior. Counts accumulate over the whole run (no decay or forgetting: the code has
    none). A prompt never rolled out keeps the prior.

    Args:
        successes: s_i, correct rollouts per prompt so far; shape (N,), whole numbers >= 0.
        trials: n_i, rollouts per prompt so far; shape (N,), whole numbers >= successes.
        prior_alpha, prior_beta: alpha_0, beta_0 > 0 of the Beta prior (CurES: 1, 1).

    Returns:
        (alpha, beta), two float64 arrays of shape (N,).
    """
    s = finite_array(successes, "successes")
    n = finite_array(trials, "trials")
    if s.shape != n.shape:
        raise ValueError(f"successes and trials must have the same shape, got {s.shape} and {n.shape}")
    for a, name in ((s, "successes"), (n, "trials")):
        if np.any(a < 0) or not np.all(a == np.round(a)):
            bad = _first_bad((a < 0) | (a != np.round(a)))
            raise ValueError(f"{name} must hold whole numbers >= 0; found {a[bad]} at index {bad}")
    if np.any(s > n):
        bad = _first_bad(s > n)
        raise ValueError(f"successes must not exceed trials; found {s[bad]:g} > {n[bad]:g} at index {bad}")
    a0 = _positive(prior_alpha, "prior_alpha")
    b0 = _positive(prior_beta, "prior_beta")
    # alpha_i = alpha_0 + s_i,  beta_i = beta_0 + (n_i - s_i)
    return a0 + s, b0 + (n - s)


def posterior_mean(alpha, beta):
    """The accuracy estimate p_i: the mean of Beta(alpha_i, beta_i).

    CurES code, epic/epic_sampler.py: ``difficulty = beta_dist.mean``. Never exactly 0 or 1 under a prior > 0.

    Args:
        alpha, beta: posterior parameters, shape (N,), > 0.

    Returns:
        p, float64 array of shape (N,), in (0, 1).
    """
    a = finite_array(alpha, "alpha")
    b = finite_array(beta, "beta")
    if a.shape != b.shape:
        raise ValueError(f"alpha and beta must have the same shape, got {a.shape} and {b.shape}")
    if np.any(a <= 0) or np.any(b <= 0):
        raise ValueError("alpha and beta must be > 0 (a Beta distribution's parameters)")
    # p_i = E[Beta(alpha_i, beta_i)] = alpha_i / (alpha_i + beta_i)
    return a / (a + b)


def prompt_temperature(alpha, scale: float = 100.0):
    """Per-prompt sampling temperature T_i = c * alpha_i.

    CurES code, epic/epic_sampler.py ``__iter__``: ``t_vec = (self.alpha_vec + 1) / 1e-2`` with alpha_vec the accepted
    count, i.e. T_i = (1 + s_i) / 0.01 = 100 * alpha_i under the Beta(1, 1) prior. A prompt the model solves more
    often gets a higher temperature, so its score sqrt(p (1 - p)) matters less. With c = 100 every logit of
    :func:`sampling_probs` is below 0.5 / 100 = 0.005, so the distribution is within 0.5% of uniform; a smaller
    ``scale`` makes it sharper.

    Args:
        alpha: posterior alpha_i (alpha_0 + successes), shape (N,), > 0.
        scale: c > 0 (CurES: 100 = 1 / 1e-2).

    Returns:
        T, float64 array of shape (N,), > 0.
    """
    a = finite_array(alpha, "alpha")
    if np.any(a <= 0):
        raise ValueError(f"alpha must be > 0; found {a[_first_bad(a <= 0)]}")
    c = _positive(scale, "scale")
    # T_i = c * alpha_i
    return c * a


def _per_prompt(x, name: str, shape: tuple) -> np.ndarray:
    """``x`` (a scalar or one value per prompt) as an array of ``shape``; a ValueError naming ``name`` otherwise."""
    a = finite_array(x, name)
    if a.ndim != 0 and a.shape != shape:
        raise ValueError(f"{name} must be a scalar or one value per prompt, shape {shape}; got shape {a.shape}")
    return np.broadcast_to(a, shape)


def sampling_probs(p, temperature):
    """CurES's prompt-sampling distribution: P_i proportional to exp(sqrt(p_i (1 - p_i)) / T_i).

    CurES code, epic/epic_sampler.py ``__iter__``: ``np.exp(np.sqrt(w * (1 - w)) / t_vec)``, normalised over the
    dataset. sqrt(p (1 - p)) is the reward standard deviation of a prompt solved with probability p: largest at
    p = 1/2, zero for prompts always or never solved. The exponentials are computed after subtracting the largest
    logit, so huge logits (small temperatures) do not overflow; a temperature so small that a logit itself overflows
    float64 (T below ~1e-308) is refused.

    Args:
        p: accuracy estimates p_i in [0, 1], shape (N,), N >= 1.
        temperature: T_i > 0, shape (N,) or a scalar.

    Returns:
        P, float64 array of shape (N,), > 0 where representable, summing to 1.
    """
    pp = finite_array(p, "p")
    if pp.ndim != 1 or pp.shape[0] == 0:
        raise ValueError(f"p must be a non-empty 1-D array (one value per prompt), got shape {pp.shape}")
    if np.any((pp < 0) | (pp > 1)):
        bad = _first_bad((pp < 0) | (pp > 1))
        raise ValueError(f"p must lie in [0, 1]; found {pp[bad]} at index {bad}")
    t = _per_prompt(temperature, "temperature", pp.shape)
    if np.any(t <= 0):
        bad = _first_bad(t <= 0)
        raise ValueError(f"temperature must be > 0; found {t[bad]} at index {bad}")
    # logit_i = sqrt(p_i (1 - p_i)) / T_i
    with np.errstate(over="ignore"):
        logits = np.sqrt(pp * (1.0 - pp)) / t
    if not np.all(np.isfinite(logits)):  # T below ~1e-308: the logit overflows float64, and inf - inf is NaN
        bad = _first_bad(~np.isfinite(logits))
        raise ValueError(f"temperature {t[bad]} at index {bad} is too small: sqrt(p (1 - p)) / T overflows float64")
    # P_i = exp(logit_i) / sum_j exp(logit_j)   (shifted by max logit: same P, no overflow)
    w = np.exp(logits - logits.max())
    return w / w.sum()


def normalized_entropy(probs) -> float:
    """H(P) / log N: 1 for the uniform distribution over N >= 2 items, 0 for a point mass (1.0 when N = 1)."""
    pr = finite_array(probs, "probs")
    if pr.ndim != 1 or pr.shape[0] == 0:
        raise ValueError(f"probs must be a non-empty 1-D array, got shape {pr.shape}")
    if pr.shape[0] == 1:
        return 1.0
    nz = pr[pr > 0]
    # H(P) = -sum_i P_i log P_i, normalised by its maximum log N
    return float(-(nz * np.log(nz)).sum() / math.log(pr.shape[0]))


def sample_prompts(probs, k: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``k`` distinct prompts from ``probs`` without replacement (successive sampling).

    CurES code, epic/epic_sampler.py: ``np.random.choice(all_indices, size=batch_size, replace=False, p=probs)``: the
    first prompt is drawn from P, each next one from P renormalised over the prompts not yet drawn. Implemented with
    Gumbel top-k (Efraimidis & Spirakis 2006; Kool et al. 2019): the k largest keys log P_i + Gumbel_i are a sample
    of exactly that distribution, in draw order, from N uniforms in one vectorised call. ``_sample_prompts_reference``
    in the tests is the one-at-a-time loop; both match the exact enumeration of ordered draws.

    Args:
        probs: P, shape (N,), >= 0, summing to 1 (within 1e-9); at least ``k`` entries > 0.
        k: number of prompts, 0 <= k <= N.
        rng: numpy Generator; the same generator state gives the same prompts.

    Returns:
        int64 array of shape (k,): distinct prompt indices in draw order.
    """
    pr = finite_array(probs, "probs")
    if pr.ndim != 1 or pr.shape[0] == 0:
        raise ValueError(f"probs must be a non-empty 1-D array, got shape {pr.shape}")
    if np.any(pr < 0):
        raise ValueError(f"probs must be >= 0; found {pr[_first_bad(pr < 0)]}")
    if abs(pr.sum() - 1.0) > 1e-9:
        raise ValueError(f"probs must sum to 1, got {pr.sum()!r}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"k must be an integer >= 0, got {k!r}")
    if k > int((pr > 0).sum()):
        raise ValueError(
            f"cannot draw k={k} distinct prompts: only {int((pr > 0).sum())} of {pr.shape[0]} have probability > 0"
        )
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    u = rng.random(pr.shape[0])
    with np.errstate(divide="ignore"):
        # key_i = log P_i + Gumbel_i, Gumbel_i = -log(-log U_i); P_i = 0 gives -inf (never drawn)
        keys = np.log(pr) - np.log(-np.log(u))
    order = np.argsort(-keys, kind="stable")
    return order[:k].astype(np.int64)


def gradient_std(p, mean_norm_correct=1.0, sq_norm_correct=1.0, mean_norm_wrong=1.0, sq_norm_wrong=1.0):
    """Per-prompt standard deviation of the policy-gradient contribution of one rollout.

    CurES code, epic/stage_0_init_difficulty_sample_size.py ``init_sample_size`` ("the implementation according to
    eq. 127 in our paper"): with a = p_i, b = 1 - p_i and G = ||grad log pi(y | x_i)|| the gradient norm of a rollout,

        sigma_i^2 = a b^2 E_c[G^2] + a^2 b E_w[G^2] - a^2 b^2 (E_c[G] - E_w[G])^2

    where E_c / E_w average over correct / wrong rollouts. It is Var_y[(r(y) - p_i) G(y)] for a 0/1 reward r with
    P(r = 1) = p_i: the variance of the advantage-weighted gradient norm. With equal norms G = g for every rollout it
    reduces to g sqrt(p_i (1 - p_i)), the reward standard deviation times g; the defaults (all moments 1) give
    sqrt(p_i (1 - p_i)).

    Args:
        p: accuracy p_i in [0, 1], shape (N,).
        mean_norm_correct, sq_norm_correct: E_c[G] >= 0 and E_c[G^2] >= E_c[G]^2; scalars or shape (N,).
        mean_norm_wrong, sq_norm_wrong: E_w[G], E_w[G^2], likewise.

    Returns:
        sigma, float64 array of shape (N,), >= 0.
    """
    a = finite_array(p, "p")
    if np.any((a < 0) | (a > 1)):
        raise ValueError(f"p must lie in [0, 1]; found {a[_first_bad((a < 0) | (a > 1))]}")
    mc, sc, mw, sw = (
        _per_prompt(x, name, a.shape)
        for x, name in (
            (mean_norm_correct, "mean_norm_correct"),
            (sq_norm_correct, "sq_norm_correct"),
            (mean_norm_wrong, "mean_norm_wrong"),
            (sq_norm_wrong, "sq_norm_wrong"),
        )
    )
    for m, s, name in ((mc, sc, "correct"), (mw, sw, "wrong")):
        if np.any(m < 0):
            raise ValueError(f"mean_norm_{name} must be >= 0 (a mean of norms)")
        # E[G^2] >= E[G]^2 (Jensen); a small relative slack for moments accumulated in floating point
        if np.any(s < m * m * (1.0 - 1e-12)):
            bad = _first_bad(s < m * m * (1.0 - 1e-12))
            raise ValueError(
                f"sq_norm_{name} must be >= mean_norm_{name}^2 (E[G^2] >= E[G]^2); found "
                f"{s[bad]} < {m[bad]}^2 at index {bad}"
            )
    b = 1.0 - a
    # sigma_i^2 = a b^2 E_c[G^2] + a^2 b E_w[G^2] - a^2 b^2 (E_c[G] - E_w[G])^2
    var = a * b * b * sc + a * a * b * sw - a * a * b * b * (mc - mw) ** 2
    # consistent moments give var >= 0 exactly in real arithmetic; clip float round-off at 0
    return np.sqrt(np.maximum(var, 0.0))


def rollout_counts(sigma, budget: int, min_count: int = 2) -> np.ndarray:
    """Rollouts per drawn prompt: proportional to sigma_i, at least ``min_count``, summing exactly to ``budget``.

    CurES code, epic/stage_0_init_difficulty_sample_size.py ``init_sample_size``: ``weights = sigmas / sum(sigmas)``,
    ``round(rollout_budget * weights)`` (minimising the variance of the summed gradient under a fixed budget gives
    n_i proportional to sigma_i). Here, over the prompts of one step (xrpo's budget is per step):

        1. quota_i = R * sigma_i / sum_{j open} sigma_j over the prompts still open, R the budget left for them;
        2. a prompt whose quota is below ``min_count`` gets exactly ``min_count`` and leaves the open set; repeat;
        3. the open prompts split R by the largest-remainder rule (``xrpo.algo.allocation.split_budget``), so the
           total is exactly ``budget`` and every open prompt keeps floor(quota_i) >= ``min_count``.

    If every open sigma is 0 the open prompts share R evenly (split_budget's rule).

    Args:
        sigma: sigma_i >= 0, shape (P,), P >= 1.
        budget: rollouts of the step, integer >= min_count * P.
        min_count: the least rollouts of a drawn prompt, integer >= 1 (xrpo: 2, so a group has a reward variance).

    Returns:
        int64 array of shape (P,), entries >= min_count, summing to ``budget``.
    """
    s = finite_array(sigma, "sigma")
    if s.ndim != 1 or s.shape[0] == 0:
        raise ValueError(f"sigma must be a non-empty 1-D array (one value per prompt), got shape {s.shape}")
    if np.any(s < 0):
        raise ValueError(f"sigma must be >= 0; found {s[_first_bad(s < 0)]}")
    for v, name, lo in ((budget, "budget", 0), (min_count, "min_count", 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    P = s.shape[0]
    if budget < min_count * P:
        raise ValueError(f"budget={budget} is less than min_count * prompts = {min_count} * {P} = {min_count * P}")
    fixed = np.zeros(P, dtype=bool)
    counts = np.zeros(P, dtype=np.int64)
    while True:
        open_ = ~fixed
        rest = budget - min_count * int(fixed.sum())
        so = s[open_]
        total = so.sum()
        # quota_i = R * sigma_i / sum_{j open} sigma_j   (even split when every open sigma is 0)
        quota = rest * so / total if total > 0 else np.full(so.shape, rest / so.shape[0])
        low = quota < min_count
        if not low.any():
            split = split_budget(so, rest)
            # split_budget recomputes the quotas with its own float rounding; a quota within an ulp of min_count can
            # floor to min_count - 1: treat such a prompt as below the floor and repeat
            under = split < min_count
            if not under.any():
                counts[open_] = split
                break
            low = under
        fixed[np.flatnonzero(open_)[low]] = True
        if fixed.all():
            break
    counts[fixed] = min_count
    if int(counts.sum()) != budget:  # unreachable: the open prompts receive exactly what the fixed ones leave
        raise RuntimeError(f"rollout_counts: allocated {int(counts.sum())} rollouts instead of {budget}")
    return counts
