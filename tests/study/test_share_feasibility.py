"""study/share_feasibility.py: the grid keeps exactly the distributions that meet the study's criteria, and each kept
distribution's ratios are the simulator's own for it."""

from __future__ import annotations

import itertools
import json
import sys

import pytest

from tests.study.conftest import STUDY
from xrpo.sim.model import mixture_moment, mixture_zero_variance_share
from xrpo.sim.runner import SimConfig, parse_mixture, simulate


@pytest.fixture(scope="module")
def feas():
    sys.path.insert(0, str(STUDY))
    import share_feasibility

    return share_feasibility


def test_mixture_spec_round_trips(feas):
    assert feas.mixture_spec(0, 0, 1.5, 3) == "beta(1.5,3)"
    assert feas.mixture_spec(0.3, 0.1, 0.7, 6) == "0.3*0 + 0.1*1 + 0.6*beta(0.7,6)"
    w, comps = parse_mixture(feas.mixture_spec(0.3, 0.1, 0.7, 6))
    assert w == pytest.approx([0.3, 0.1, 0.6], abs=1e-12) and comps == [0.0, 1.0, (0.7, 6.0)]


def test_grid_keeps_exactly_the_distributions_meeting_the_criteria(feas, tmp_path):
    w0s, w1s, abs_ = [0, 0.4], [0, 0.2], [1.5, 3]
    argv = ["--grid-w0", *map(str, w0s), "--grid-w1", *map(str, w1s), "--grid-ab", *map(str, abs_)]
    assert feas.main([*argv, "--steps", "30", "--icl-add", "0.1", "--measured", "", "--output", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "share_feasibility.json").read_text())
    kept = {r["dist"]: r for r in out["rows"]}
    n_in = 0
    for w0, w1, a, b in itertools.product(w0s, w1s, abs_, abs_):
        spec = feas.mixture_spec(w0, w1, a, b)
        w, comps = parse_mixture(spec)
        ok = 0.25 <= mixture_moment(w, comps, 1) <= 0.5 and mixture_zero_variance_share(w, comps, 8) <= 0.5
        assert (spec in kept) == ok, spec
        n_in += ok
    # the grid holds both kinds: mixtures with 40% never-solved prompts and a Beta part of mean 2/3 fail the mean
    assert 0 < n_in < 16 and "0.4*0 + 0.6*beta(3,1.5)" in kept and "0.4*0 + 0.2*1 + 0.4*beta(3,1.5)" not in kept
    spec = "0.4*0 + 0.6*beta(3,3)"
    row = kept[spec]
    assert row["mean"] == pytest.approx(0.3, abs=1e-12)
    res = simulate(SimConfig(dist=spec, methods=feas.BASE_METHODS, steps=30), latency=False)
    for m in feas.BASE_METHODS[1:]:
        r = res["methods"][m]["vs_uniform"]["informative_share"]
        assert row[m] == pytest.approx([r["ratio"], r["ci"]], abs=1e-12)
    res = simulate(SimConfig(dist=spec, methods=["uniform", "hrp"], steps=30, icl=True, icl_add=0.1), latency=False)
    r = res["methods"]["hrp"]["vs_uniform"]["informative_share"]
    assert row["icl"]["0.1"]["hrp"] == pytest.approx([r["ratio"], r["ci"]], abs=1e-12)
    text = (tmp_path / "share_feasibility.md").read_text()
    assert f"of which **{n_in}** meet both criteria" in text
