"""The study's statistics: a mean over seeds with its 95% Student-t interval (`Stat`, `mean_ci`, through
`xrpo.algo.stats`), paired differences, steps to a target accuracy and seed-mean curves (study_report.py's docstring
states them)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xrpo.algo.stats import mean_ci as algo_mean_ci

TARGET_TOL = 1e-9


@dataclass(frozen=True)
class Stat:
    mean: float
    half: float  # half-width of the 95% interval; nan with fewer than 2 values
    n: int
    values: tuple = ()

    def fmt(self, scale: float = 100.0, digits: int = 2) -> str:
        if self.n == 0 or not math.isfinite(self.mean):
            return "—"
        m = f"{self.mean * scale:.{digits}f}"
        return m if not math.isfinite(self.half) else f"{m} ± {self.half * scale:.{digits}f}"

    def as_dict(self) -> dict:
        return {"mean": num(self.mean), "ci95": num(self.half), "n": self.n, "values": [num(v) for v in self.values]}


def num(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(x)


def mean_ci(values: Sequence[float], alpha: float = 0.05) -> Stat:
    """Mean and the half-width of its (1 - alpha) Student-t interval, t_{1-alpha/2, n-1} · s / √n (s with ddof=1):
    `xrpo.algo.stats.mean_ci`, the simulator's, as a `Stat`. No interval (nan) with one value, "—" with none;
    non-finite values are refused."""
    v = np.asarray([float(x) for x in values], dtype=np.float64)
    if v.size == 0:
        return Stat(float("nan"), float("nan"), 0, ())
    if not np.all(np.isfinite(v)):
        raise ValueError(f"mean_ci: values must be finite, got {v.tolist()}")
    if v.size == 1:
        return Stat(float(v[0]), float("nan"), 1, tuple(v.tolist()))
    mean, half = algo_mean_ci(v, confidence=1.0 - alpha)
    return Stat(mean, half, int(v.size), tuple(v.tolist()))


def paired_difference(a: dict[int, float], b: dict[int, float], alpha: float = 0.05) -> Stat:
    """mean_ci of a[seed] - b[seed] over the seeds both have."""
    seeds = sorted(set(a) & set(b))
    return mean_ci([a[s] - b[s] for s in seeds], alpha)


def steps_to_target(steps: Sequence[float], values: Sequence[float], target: float) -> float | None:
    """First step at which ``values`` reaches ``target``: 0-based on the validation steps, linearly interpolated
    between the last validation below the target and the first at or above it; None when it is never reached."""
    if len(steps) != len(values):
        raise ValueError(f"steps_to_target: {len(steps)} steps but {len(values)} values")
    pts = sorted(zip((float(s) for s in steps), (float(v) for v in values)))
    for i, (s, v) in enumerate(pts):
        # accuracies are ratios of counts: a value equal to the target up to float rounding reaches it
        if v >= target - TARGET_TOL:
            if i == 0:
                return s
            s0, v0 = pts[i - 1]
            # v0 < target - tol <= v, so v > v0 and the division is safe
            return min(s, s0 + (target - v0) / (v - v0) * (s - s0))
    return None


def mean_curve(histories: Sequence[dict[float, float]]) -> tuple[list[float], list[Stat]]:
    """Seed-mean curve over the steps every history has (a history maps validation step -> value)."""
    if not histories:
        return [], []
    common = sorted(set.intersection(*(set(h) for h in histories)))
    return common, [mean_ci([h[s] for h in histories]) for s in common]
