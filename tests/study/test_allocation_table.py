"""study/allocation_table.py (the allocation table): the grid keeps exactly share_feasibility's criteria distributions,
each row's ratios are the simulator's own for it, the measured part reads the fits the study reports recorded, and the
Markdown counts what it says it counts."""

from __future__ import annotations

import json
import sys

import pytest

from tests.study.conftest import STUDY
from xrpo.sim.model import mixture_moment, mixture_zero_variance_share
from xrpo.sim.runner import SimConfig, parse_mixture, simulate


@pytest.fixture(scope="module")
def table():
    sys.path.insert(0, str(STUDY))
    import allocation_table

    return allocation_table


def test_grid_rows_are_the_criteria_distributions_with_the_simulators_ratios(table, tmp_path):
    w0s, w1s, abs_ = [0, 0.4], [0, 0.2], [1.5, 3]
    methods = ["uniform", "hrp", "knapsack", "xrpo-plus", "oracle"]
    argv = ["--grid-w0", *map(str, w0s), "--grid-w1", *map(str, w1s), "--grid-ab", *map(str, abs_)]
    argv += ["--grid-methods", *methods, "--steps", "6", "--parts", "grid", "--output", str(tmp_path)]
    assert table.main(argv) == 0
    out = json.loads((tmp_path / "grid.json").read_text())
    kept = {r["dist"]: r for r in out["rows"]}
    n_in = 0
    for spec in {table.sf.mixture_spec(w0, w1, a, b) for w0 in w0s for w1 in w1s for a in abs_ for b in abs_}:
        w, comps = parse_mixture(spec)
        ok = 0.25 <= mixture_moment(w, comps, 1) <= 0.5 and mixture_zero_variance_share(w, comps, 8) <= 0.5
        assert (spec in kept) == ok, spec
        n_in += ok
    spec = "0.4*0 + 0.6*beta(3,3)"
    res = simulate(SimConfig(dist=spec, methods=methods, steps=6), latency=False)
    for m in methods:
        r = res["methods"][m]["vs_uniform"]["informative_share"]
        assert kept[spec]["methods"][m]["rollouts"] == pytest.approx([r["ratio"], r["ci"]], abs=1e-12)
    # "within 10% of hindsight" counts the rows where xrpo-plus's ratio is at least 0.9 x the oracle's
    within = sum(
        r["methods"]["xrpo-plus"]["rollouts"][0] >= 0.9 * r["methods"]["oracle"]["rollouts"][0] for r in out["rows"]
    )
    text = (tmp_path / "allocation_table.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith("| **xrpo-plus** |"))
    assert line.split(" | ")[5] == str(within)
    assert f"**The {n_in} criteria distributions**" in text


def test_measured_part_reads_the_recorded_fits(table, tmp_path):
    argv = ["--parts", "measured", "--measured-steps", "3", "--output", str(tmp_path)]
    assert table.main(argv) == 0
    out = json.loads((tmp_path / "measured.json").read_text())["sets"]
    study = json.loads((table.ROOT / "docs/results/results.json").read_text())["simulated"]["fits"]
    assert out["study"]["fits"] == study and (out["study"]["prompts"], out["study"]["rollouts"]) == (16, 128)
    assert (out["smollm2"]["prompts"], out["smollm2"]["rollouts"]) == (4, 32)
    # uniform against itself: exactly 1 on every fit
    assert out["study"]["methods"]["uniform"]["rollouts"] == [1.0, 0.0]
    assert set(out["study"]["methods"]) == set(table.METHODS)
