"""xrpo.algo.stats: the intervals of a mean and of a ratio of means, by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from xrpo.algo.stats import mean_ci, ratio_ci


def test_mean_and_ratio_intervals_hand():
    # [1, 2, 3]: mean 2, s = 1, t_{0.975, 2} = 4.3027 -> half-width 4.3027 / sqrt 3 = 2.4841
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and math.isclose(h, 4.302652729749462 / math.sqrt(3), rel_tol=1e-12)
    # x = 2 y on every step: the ratio is exactly 2 and the delta-method variance
    # V/my^2 * (4 - 8 + 4) vanishes
    y = np.array([1.0, 3.0, 2.0, 5.0])
    r, h = ratio_ci(2 * y, y)
    assert r == 2.0 and h < 1e-12
    # independent noise: the interval is positive and covers the true ratio of means
    rng = np.random.default_rng(0)
    x, y = rng.normal(3, 1, 5000), rng.normal(2, 1, 5000)
    r, h = ratio_ci(x, y)
    assert h > 0 and abs(r - 1.5) < h


def test_mean_ci_one_value_and_bad_shapes():
    # one value: the mean itself and no width (the simulator's convention for a single step)
    assert mean_ci([0.25]) == (0.25, 0.0)
    with pytest.raises(ValueError, match="non-empty 1-D"):
        mean_ci([])
    with pytest.raises(ValueError, match="paired 1-D"):
        ratio_ci([1.0, 2.0], [1.0])
    # mean(y) == 0: no ratio
    r, h = ratio_ci([1.0, 2.0], [1.0, -1.0])
    assert math.isnan(r) and math.isnan(h)


# t quantiles from the tables: t_{0.975, 3}, t_{0.95, 3}, t_{0.95, 2}
T975_3, T95_3, T95_2 = 3.1824463052837078, 2.3533634348018233, 2.9199855803537242


def test_ratio_interval_is_the_delta_method_by_hand():
    # x = [2, 1, 4, 5], y = [1, 2, 3, 2]: mx = 3, my = 2, R = 3 / 2. The delta-method variance equals
    # Var(x - R y) / (n my^2): d = x - 1.5 y = [0.5, -2, -0.5, 2] has mean 0 and s^2 = 8.5 / 3, so
    # Var(R) = (8.5 / 3) / (4 * 4) = 8.5 / 48 and the half-width is t_{(1+c)/2, 3} * sqrt(8.5 / 48).
    # Tolerance: two evaluations of the same quantity by a few dozen float64 operations each (~1e-15 apart).
    x, y = [2.0, 1.0, 4.0, 5.0], [1.0, 2.0, 3.0, 2.0]
    r, h = ratio_ci(x, y)
    assert r == 1.5 and math.isclose(h, T975_3 * math.sqrt(8.5 / 48), rel_tol=1e-12)
    r, h = ratio_ci(x, y, confidence=0.9)
    assert r == 1.5 and math.isclose(h, T95_3 * math.sqrt(8.5 / 48), rel_tol=1e-12)
    # x and y swapped: R = 2 / 3, d = y - (2/3) x = [-1/3, 4/3, 1/3, -4/3], s^2 = (34 / 9) / 3, my = 3
    r, h = ratio_ci(y, x)
    assert math.isclose(r, 2 / 3, rel_tol=1e-15)
    assert math.isclose(h, T975_3 * math.sqrt(34 / 27 / (4 * 9)), rel_tol=1e-12)


def test_mean_interval_of_two_values():
    # the smallest sample with a width: [1, 3] has mean 2, s = sqrt 2, so s / sqrt n = 1 and the half-width is
    # t_{0.975, 1} = 12.7062... itself
    m, h = mean_ci([1.0, 3.0])
    assert m == 2.0 and math.isclose(h, 12.706204736174694, rel_tol=1e-12)


def test_mean_interval_at_another_confidence():
    # [1, 2, 3] at 90%: t_{0.95, 2} * 1 / sqrt 3
    m, h = mean_ci([1.0, 2.0, 3.0], confidence=0.9)
    assert m == 2.0 and math.isclose(h, T95_2 / math.sqrt(3), rel_tol=1e-12)
