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
