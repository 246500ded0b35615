"""Tests of xrpo.sim.runner (`xrpo simulate` below the command line): mixture specs, the reader of rounds.jsonl,
config validation, determinism, the per-method figures against their expectations, tables, sweeps and plots."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xrpo.algo.rounds import one_batch_counts as uniform_counts
from xrpo.algo.signal import expected_informative_rollouts, nonzero_variance_prob
from xrpo.sim.model import mixture_zero_variance_share
from xrpo.sim.runner import (
    SIM_METHODS,
    SimConfig,
    _prompt_source,
    parse_mixture,
    parse_sweep,
    read_rounds_rates,
    register_sim_method,
    simulate,
    sweep,
)
from xrpo.sim.tables import markdown_table, sweep_table

PNG = b"\x89PNG\r\n\x1a\n"


def test_parse_mixture():
    assert parse_mixture("beta(0.5,2)") == ([1.0], [(0.5, 2.0)])
    assert parse_mixture("0.3*0 + 0.5 * beta(0.7, 1.5) + 0.2*1") == ([0.3, 0.5, 0.2], [0.0, (0.7, 1.5), 1.0])
    assert parse_mixture("0.25") == ([1.0], [0.25])


@pytest.mark.parametrize(
    "spec,match",
    [
        ("beta(1,2) + 0.5*0", "component 1 'beta\\(1,2\\)' needs a weight"),
        ("0.5*0 + 0.4*1", "weights must sum to 1, got 0.5 \\+ 0.4 = 0.9"),
        ("0.5*0 + 0.5*gamma(1,2)", "component 2 '0.5\\*gamma\\(1,2\\)' is not"),
        ("0.5*1.5 + 0.5*0", "component 1 '0.5\\*1.5': a fixed success rate must lie in \\[0, 1\\]"),
        ("beta(0,1)", "Beta parameters must be > 0"),
        ("", "dist must be a mixture"),
    ],
)
def test_parse_mixture_errors_name_the_option_and_component(spec, match):
    with pytest.raises(ValueError, match="dist" if match.startswith("dist") else match):
        parse_mixture(spec)
    with pytest.raises(ValueError, match=match):
        SimConfig(dist=spec)


def write_rounds(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def row(step, rnd, problems, alloc, successes):
    return {
        "step": step,
        "round": rnd,
        "alloc": alloc,
        "problems": problems,
        "successes": successes,
        "seeded": [],
        "flips": 0,
        "truncated": 0,
    }


def test_read_rounds_rates_pools_per_problem(tmp_path):
    f = write_rounds(
        tmp_path / "rounds.jsonl",
        [
            row(1, 0, ["a", "b"], [2, 2], [1, 0]),
            row(1, 1, ["a", "b"], [3, 1], [3, 0]),
            row(2, 0, ["c", "a"], [4, 4], [4, 1]),
            # step 3 logged, then redone after a resume (exact: the same rows again), then steps 2..3 redone once more
            row(3, 0, ["b", "c"], [4, 4], [2, 0]),
            row(3, 1, ["b", "c"], [1, 1], [0, 0]),
            row(3, 0, ["b", "c"], [4, 4], [2, 0]),
            row(3, 1, ["b", "c"], [1, 1], [0, 0]),
            row(2, 0, ["c", "a"], [4, 4], [4, 1]),
            row(3, 0, ["b", "c"], [4, 4], [2, 0]),
            row(3, 1, ["b", "c"], [1, 1], [0, 0]),
            row(4, 0, ["d", "b"], [0, 4], [0, 1]),  # d got no rollout: not a prompt
            # DAPO: two generation batches of one step, both round 0, then the same step redone
            row(5, 0, ["e", "f"], [2, 2], [1, 1]),
            row(5, 0, ["g", "e"], [2, 2], [0, 1]),
            row(5, 0, ["e", "f"], [2, 2], [1, 1]),
            row(5, 0, ["g", "e"], [2, 2], [0, 1]),
        ],
    )
    # a run killed mid-write: a partial line, glued to the next row a resumed run appended, and a partial last line
    text = f.read_text().splitlines()
    f.write_text("\n".join(text[:-1] + ['{"step": 5, "rou' + text[-1], '{"step": 6, "round"']) + "\n")
    rates, info = read_rounds_rates(f)
    # a: (1 + 3 + 1) / (2 + 3 + 4) = 5/9; b: (0 + 0 + 2 + 0 + 1) / (2 + 1 + 4 + 1 + 4) = 3/12;
    # c: (4 + 0 + 0) / (4 + 4 + 1) = 4/9; e: (1 + 1) / 4; f: 1/2; g: 0/2
    np.testing.assert_allclose(rates, [5 / 9, 3 / 12, 4 / 9, 0.5, 0.5, 0.0], rtol=0, atol=1e-15)
    assert info["problems"] == 6 and info["steps"] == 5 and info["rollouts"] == 9 + 12 + 9 + 8
    assert info["unreadable_lines"] == 2
    # the run's own figures per step, over every group of the step (informative rollouts, groups, rollouts):
    # step 1 a 4/5, b 0/3 -> 5, 1, 8; step 2 c 4/4, a 1/4 -> 4, 1, 8; step 3 b 2/5, c 0/5 -> 5, 1, 10;
    # step 4 d 0/0, b 1/4 -> 4, 1, 4; step 5 e 2/4, f 1/2, g 0/2 -> 6, 2, 8
    ms = info["measured_per_step"]
    assert ms["informative_rollouts"]["mean"] == (5 + 4 + 5 + 4 + 6) / 5
    assert ms["informative_groups"]["mean"] == 6 / 5 and ms["rollouts"]["mean"] == (8 + 8 + 10 + 4 + 8) / 5
    # steps 2..3 only: a 1/4, b 2/5, c 4/9; the run directory works as well as the file
    rates, info = read_rounds_rates(tmp_path, "2:3")
    np.testing.assert_allclose(rates, [0.25, 0.4, 4 / 9], rtol=0, atol=1e-15)
    assert info["steps"] == 2
    rates, _ = read_rounds_rates(f, ":1")
    np.testing.assert_allclose(rates, [4 / 5, 0.0], rtol=0, atol=1e-15)
    # ICL-seeded rollouts do not count: b was seeded in step 1's round 1 (1 rollout, 0 successes), a was not
    seeded = write_rounds(
        tmp_path / "seeded.jsonl",
        [row(1, 0, ["a", "b"], [2, 2], [1, 0]), {**row(1, 1, ["a", "b"], [3, 1], [3, 1]), "seeded": [1]}],
    )
    rates, info = read_rounds_rates(seeded)
    np.testing.assert_allclose(rates, [4 / 5, 0.0], rtol=0, atol=1e-15)
    assert info["seeded_rollouts_excluded"] == 1


def test_read_rounds_rates_refuses_files_without_per_prompt_successes(tmp_path):
    legacy = write_rounds(
        tmp_path / "old.jsonl", [{"step": 1, "round": 0, "alloc": [4, 4], "seeded": [], "flips": 0, "truncated": 0}]
    )
    with pytest.raises(ValueError, match="old.jsonl line 1 has no 'problems' / 'successes' field.*cannot be recovered"):
        read_rounds_rates(legacy)
    bad = tmp_path / "bad.jsonl"
    ok = json.dumps(row(1, 0, ["a"], [2], [1]))
    bad.write_text(ok + "\n{not json\n" + ok + "\n")  # a broken line inside the file is an error, not a kill
    with pytest.raises(ValueError, match="bad.jsonl line 2: not valid JSON"):
        read_rounds_rates(bad)
    over = write_rounds(tmp_path / "over.jsonl", [row(1, 0, ["a", "b"], [2, 2], [1, 3])])
    with pytest.raises(ValueError, match="over.jsonl line 1: prompt 1 has successes=3 of alloc=2"):
        read_rounds_rates(over)
    short = write_rounds(tmp_path / "short.jsonl", [row(1, 0, ["a", "b"], [2, 2], [1])])
    with pytest.raises(
        ValueError,
        match=r"short.jsonl line 1: 'alloc' / 'problems' / 'successes' must be lists of one length \(one entry per "
        r"prompt\); got alloc 2, problems 2, successes 1",
    ):
        read_rounds_rates(short)
    with pytest.raises(ValueError, match="no rollouts in steps 5:9"):
        read_rounds_rates(write_rounds(tmp_path / "one.jsonl", [row(1, 0, ["a"], [2], [1])]), "5:9")
    with pytest.raises(FileNotFoundError, match="rounds_file: .*missing.jsonl does not exist"):
        read_rounds_rates(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="rounds_steps must be 'A:B'"):
        read_rounds_rates(over, "3")


def test_rounds_file_rates_raw_or_fitted(tmp_path):
    rng = np.random.default_rng(0)
    p = np.r_[np.zeros(300), rng.beta(1.0, 3.0, 700)]
    rows, pos = [], 0
    for step in range(1, 64):  # 16 problems x 8 rollouts per step, each problem once (the last step: 8)
        ids = list(range(pos, min(pos + 16, 1000)))
        pos += 16
        if not ids:
            break
        k = rng.binomial(8, p[ids])
        rows.append(row(step, 0, [f"q{i:04d}" for i in ids], [8] * len(ids), [int(x) for x in k]))
    f = write_rounds(tmp_path / "rounds.jsonl", rows)
    raw = simulate(SimConfig(rounds_file=str(f), rounds_fit="empirical", steps=10, methods=["uniform"]))
    fit = simulate(SimConfig(rounds_file=str(f), steps=10, methods=["uniform"]))
    d = fit["distribution"]
    assert raw["distribution"]["fit"] == "empirical" and "fitted_dist" not in raw["distribution"]
    w, comps = parse_mixture(d["fitted_dist"])
    # 30% of the problems have p = 0; the raw rates put every 0-of-8 problem there (about 30% + 70% E[(1-p)^8])
    assert abs(w[0] - 0.3) < 0.08 and d["measured"]["zero_share"] > 0.4
    assert raw["distribution"]["p0_share"] > 0.4 and abs(d["p0_share"] - w[0]) < 0.05
    assert "a fit to the rates of 1000 problems" in markdown_table(fit)
    # expected all-equal groups at n_base (4) and the even split (8): exact from the fitted mixture; from the drawn
    # rates (160 = 10 steps x 16) for the empirical draw
    for n in (4, 8):
        assert d["zero_variance_groups"][str(n)] == pytest.approx(mixture_zero_variance_share(w, comps, n), abs=1e-15)
    source, _ = _prompt_source(SimConfig(rounds_file=str(f), rounds_fit="empirical"))
    drawn = np.concatenate([source(np.random.default_rng([0, s, 0]), 16) for s in range(10)])  # as simulate draws
    assert raw["distribution"]["mean"] == pytest.approx(float(drawn.mean()), abs=1e-15)
    emp = raw["distribution"]["zero_variance_groups"]["8"]
    assert emp == pytest.approx(float(np.mean(drawn**8 + (1 - drawn) ** 8)), abs=1e-12)
    assert "expected groups with all rewards equal: " in markdown_table(fit)
    assert f"{d['zero_variance_groups']['8']:.1%} at 8 rollouts (n_base 4; the even split gives 8)" in markdown_table(
        fit
    )
    with pytest.raises(ValueError, match="rounds_fit must be 'beta' or 'empirical'"):
        SimConfig(rounds_file=str(f), rounds_fit="raw")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"rollouts": 40}, "config field rollouts must be >= 64 \\(n_base \\* prompts = 4 \\* 16\\), got 40"),
        # the knob checker's rules (xrpo.algo.config.check_int / check_number), as train and verl have them
        ({"prompts": True}, "config field prompts must be an int >= 1, got True"),
        ({"steps": 2.0}, "config field steps must be an int >= 2 \\(an interval needs two steps\\), got 2.0"),
        ({"t0": float("inf")}, "config field t0 must be a finite number > 0, got inf"),
        ({"icl_mult": float("nan")}, "config field icl_mult must be a finite number >= 0, got nan"),
        ({"n_base": 1}, "n_base must be >= 2"),
        ({"rounds": 0}, "rounds=0 cannot split rollouts=128: rounds=0 leaves 64 of total_budget=128 unallocated"),
        ({"methods": ["uniform", "grpo"]}, "methods: unknown method 'grpo'; valid: cures, dapo, hrp"),
        ({"methods": ["hrp", "hrp"]}, "lists a method twice"),
        ({"steps": 1}, "steps must be >= 2"),
        ({"alpha": 1.0}, "alpha: config field alpha=1.0: .* must lie in \\(0, 0.5\\)"),
        ({"icl_add": 2.0}, "icl_add must be a finite number >= -1 and <= 1, got 2.0"),
        ({"dist": "beta(1,1)", "rounds_file": "x"}, "give dist or rounds_file, not both"),
        ({"rounds_steps": "1:2"}, "rounds_steps selects steps of rounds_file, which is not given"),
        ({"concurrency": [8, 0]}, "concurrency must be a non-empty list of integers >= 1"),
        ({"cures_pool": 4}, "config field cures_pool must be >= 16 \\(prompts\\) or None, got 4"),
        ({"cures_pool": 16.0}, "config field cures_pool must be an int >= 16 \\(prompts\\) or None, got 16.0"),
        # a bool is no count, though True == 1 would pass the range
        ({"prompts": 1, "rollouts": 8, "cures_pool": True}, "cures_pool must be an int >= 1 \\(prompts\\) or None"),
        ({"oracle_min": True}, "config field oracle_min must be an int >= 0 or None, got True"),
        ({"oracle_min": -1}, "config field oracle_min must be >= 0 or None, got -1"),
        ({"oracle_min": 9}, "oracle_min must be None or <= rollouts / prompts = 8, got 9"),
        ({"degenerate_eps": 0.5}, "degenerate_eps must be < 0.5, got 0.5"),
        ({"degenerate_eps": float("nan")}, "config field degenerate_eps must be a finite number >= 0, got nan"),
        ({"degenerate_eps": True}, "config field degenerate_eps must be a finite number >= 0, got True"),
    ],
)
def test_config_errors_name_the_option(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SimConfig(**kwargs)


def test_registry_refuses_a_duplicate_name():
    with pytest.raises(ValueError, match="'hrp' is already registered"):
        register_sim_method("hrp")(lambda ctx, p, rng: None)
    assert {"uniform", "hrp", "hrp-greedy", "no-hrp", "cures", "dapo", "oracle", "oracle-groups"} <= set(SIM_METHODS)


def test_simulate_is_deterministic_and_methods_do_not_disturb_each_other():
    cfg = SimConfig(steps=30, methods=["uniform", "hrp", "dapo"], seed=3)
    a, b = simulate(cfg), simulate(cfg)
    assert a == b
    # a method's figures depend on its name and the seed, not on which other methods run
    only = simulate(SimConfig(steps=30, methods=["hrp"], seed=3))
    assert only["methods"]["hrp"]["informative_rollouts"] == a["methods"]["hrp"]["informative_rollouts"]
    other = simulate(SimConfig(steps=30, methods=["uniform", "hrp", "dapo"], seed=4))
    assert other["methods"]["hrp"] != a["methods"]["hrp"]
    # against uniform: ratios of the per-rollout means (uniform against itself: exactly 1, no spread)
    m = a["methods"]
    assert m["uniform"]["vs_uniform"]["informative_share"] == {"ratio": 1.0, "ci": 0.0}
    for name in ("hrp", "dapo"):
        for k in ("informative_share", "groups_per_rollout"):
            assert m[name]["vs_uniform"][k]["ratio"] == pytest.approx(
                m[name][k]["mean"] / m["uniform"][k]["mean"], rel=1e-12
            )
    # DAPO generates more than one batch per step: per rollout generated it is compared at equal budget
    assert m["dapo"]["rollouts_generated"]["mean"] > 128 and m["hrp"]["rollouts_generated"]["mean"] == 128


def test_fixed_rate_prompts_match_their_expectation():
    # every prompt at p = 0.3, 16 x 8 rollouts: uniform's expected informative groups 16 (1 - 0.3^8 - 0.7^8) and
    # rollouts 8 times that; the oracle with n_min = n_base = 4 has the same expectation or more
    cfg = SimConfig(dist="0.3", steps=400, methods=["uniform", "oracle", "oracle-groups"], seed=1)
    r = simulate(cfg, latency=False)["methods"]
    g = 16 * float(nonzero_variance_prob(0.3, 8))
    u = r["uniform"]
    assert abs(u["informative_groups"]["mean"] - g) < 2.5 * u["informative_groups"]["ci"] + 1e-9
    assert abs(u["informative_rollouts"]["mean"] - 8 * g) < 2.5 * u["informative_rollouts"]["ci"] + 1e-9
    # squared error of k/n: E = p (1 - p) / n = 0.21 / 8
    assert abs(u["sq_error"]["mean"] - 0.21 / 8) < 2.5 * u["sq_error"]["ci"]
    assert r["uniform"]["rollouts_generated"]["mean"] == 128 and r["uniform"]["rollouts_p01"]["mean"] == 0
    # at equal p the even split is already the best fixed allocation for both objectives
    best = expected_informative_rollouts(0.3, uniform_counts(16, 128)).sum()
    assert abs(r["oracle"]["informative_rollouts"]["mean"] - best) < 2.5 * r["oracle"]["informative_rollouts"]["ci"]


def test_markdown_table_and_latency_rows():
    res = simulate(SimConfig(steps=20, methods=["uniform", "hrp", "dapo"], concurrency=[1, 64, 4096]))
    md = markdown_table(res)
    assert "| uniform | " in md and "| hrp | " in md and "| dapo | " in md
    assert "non-uniform allocation in" in md and "dropped by the filter" in md
    lat = res["latency"]
    # N = 128 in rounds 64 + 32 + 32: m_p = 1 -> 128 waves either way; m_p = 64 -> 2 vs 1 + 1 + 1; m_p = 4096 -> 1 vs 3
    assert [(r["T1"], r["T2"]) for r in lat] == [(128.0, 128.0), (2.0, 3.0), (1.0, 3.0)]
    # the paper's closed form for n = 3 rounds: (128 + 3 m - 3) / (128 + m - 1)
    for r in lat:
        m = r["concurrency"]
        assert abs(r["paper_ratio"] - (128 + 3 * m - 3) / (128 + m - 1)) < 1e-12
    assert "| 4096 | 1 | 3 | 3.000 |" in md
    # streaming: max(ceil(128 / m_p), 3): 128 at m_p = 1, 3 at 64 (chain-bound) and at 4096
    assert [(r["T3"], r["stream_ratio"]) for r in lat] == [(128.0, 1.0), (3.0, 1.5), (3.0, 3.0)]
    assert "| 64 | 2 | 3 | 1.500 | " in md and "| 3 | 1.500 |" in md


def test_sweep_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    from xrpo.sim.plots import plot_latency, plot_methods, plot_sweep

    name, values = parse_sweep("lam=0,1")
    assert (name, values) == ("lam", [0.0, 1.0])
    assert parse_sweep("dist=beta(1,2);0.5*0 + 0.5*1") == ("dist", ["beta(1,2)", "0.5*0 + 0.5*1"])
    assert parse_sweep("max_extra=None,2") == ("max_extra", [None, 2])
    with pytest.raises(ValueError, match="cannot sweep 'steps'"):
        parse_sweep("steps=1,2")
    with pytest.raises(ValueError, match="'x' is not a valid value for n_base"):
        parse_sweep("n_base=2,x")
    cfg = SimConfig(steps=10, methods=["uniform", "hrp"])
    sw = sweep(cfg, name, values)
    assert [r["config"]["lam"] for r in sw["runs"]] == [0.0, 1.0]
    table = sweep_table(sw)
    assert table.count("\n") == 4 and "| 0.0 | " in table and "hrp × uniform: rollouts / groups" in table
    with pytest.raises(
        ValueError,
        match=r"sweep n_base=40: config field rollouts must be >= 640 \(n_base \* prompts = 40 \* 16\), got 128",
    ):
        sweep(cfg, "n_base", [2, 40])
    res = simulate(cfg)
    for path in (
        plot_methods(res, tmp_path / "m.png"),
        plot_latency(cfg, tmp_path / "l.png"),
        plot_sweep(sw, tmp_path / "s.png"),
    ):
        assert path.read_bytes()[:8] == PNG


def test_a_cap_too_small_for_the_step_is_refused_by_name():
    # the trainer's rule (xrpo.algo.rounds.cap_error): 16 prompts x 1 < 32, the planning rounds' budget; knapsack
    # places the whole step (128) in one batch, so it needs a cap of 8
    with pytest.raises(ValueError, match=r"max_extra caps 16 prompts at 1 rollouts each .* give at least 2 or null"):
        SimConfig(max_extra=1)
    SimConfig(max_extra=2)
    with pytest.raises(ValueError, match=r"max_extra caps 16 prompts at 7 .* fewer than 128, .*allocation=knapsack"):
        SimConfig(max_extra=7, methods=["uniform", "knapsack"])
    SimConfig(max_extra=8, methods=["uniform", "knapsack"])


def test_a_negative_seed_is_refused_by_name():
    # numpy's default_rng refused it inside the first step
    with pytest.raises(ValueError, match=r"seed must be >= 0 \(numpy's seeds\), got -1"):
        SimConfig(seed=-1)
