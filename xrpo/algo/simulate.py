"""Intervals of per-step figures, as the simulator and the study report them: :func:`mean_ci` (Student-t) and
:func:`ratio_ci` (delta method). The simulator itself lives in `xrpo.sim`; the expected signal of a group and the
best fixed allocation in `xrpo.algo.signal`.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

__all__ = ["mean_ci", "ratio_ci"]


def mean_ci(x, confidence: float = 0.95) -> tuple[float, float]:
    """Mean of i.i.d. per-step values and the half-width of its Student-t interval (0 for fewer than 2 values)."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.shape[0] == 0:
        raise ValueError(f"x must be a non-empty 1-D array, got shape {a.shape}")
    if a.shape[0] < 2:
        return float(a[0]), 0.0
    # half = t_{(1+c)/2, n-1} * s / sqrt(n)
    half = stats.t.ppf(0.5 + confidence / 2.0, a.shape[0] - 1) * a.std(ddof=1) / math.sqrt(a.shape[0])
    return float(a.mean()), float(half)


def ratio_ci(x, y, confidence: float = 0.95) -> tuple[float, float]:
    """mean(x) / mean(y) over paired per-step values, with a delta-method half-width (nan when mean(y) == 0).

    Var(R) ~ (Var x / my^2 - 2 mx Cov(x, y) / my^3 + mx^2 Var y / my^4) / n for R = mx / my.
    """
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.shape[0] < 2:
        raise ValueError(f"x and y must be paired 1-D arrays of >= 2 values, got {a.shape} and {b.shape}")
    mx, my = a.mean(), b.mean()
    if my == 0:
        return float("nan"), float("nan")
    cov = np.cov(a, b, ddof=1)
    var = (cov[0, 0] / my**2 - 2 * mx * cov[0, 1] / my**3 + mx**2 * cov[1, 1] / my**4) / a.shape[0]
    z = stats.t.ppf(0.5 + confidence / 2.0, a.shape[0] - 1)
    return float(mx / my), float(z * math.sqrt(max(var, 0.0)))
