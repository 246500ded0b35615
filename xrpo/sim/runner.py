"""`xrpo simulate`: the allocation simulator (no model, seconds). docs/simulate.md explains the model and its results.

    simulate(SimConfig(dist="0.6*0 + 0.4*beta(1,3)", methods=["uniform", "hrp"]))   # = xrpo simulate --dist ...

Top to bottom:
    1. rates     each step draws ``prompts`` success probabilities from ``dist`` (a mixture of Beta distributions and
                 fixed rates, :func:`parse_mixture`) or, with ``rounds_file``, from the per-problem success counts
                 measured in a training run's rounds.jsonl (:func:`read_rounds_counts`): a mixture fitted to them
                 by maximum likelihood, or their raw rates.
    2. methods   every method allocates the same step (same prompts; its own reward draws) through the library's
                 own rules (the round planner ``xrpo.algo.rounds``, stepped by ``xrpo.sim.model``); a small
                 registry (xrpo.sim.methods) maps names to them (:data:`SIM_METHODS`).
    3. figures   per step ``xrpo.sim.model.step_metrics``; over ``steps`` steps the mean and its 95% interval,
                 and each method against uniform as a ratio of means with a paired (delta-method) interval.
    4. latency   the paper's latency model of rounds (appendix "Latency Analysis") for each engine concurrency.
    5. outputs   ``sweep`` re-runs the simulator over values of one option; ``xrpo.sim.tables`` prints and
                 writes the Markdown tables (simulate.md, sweep.md), the JSON and, with matplotlib, the plots.

Random streams: step s draws its prompts from ``default_rng([seed, s, 0])`` and method m its rewards (and DAPO its
refill prompts, CurES its pool and history) from ``default_rng([seed, s, 1, crc32(m)])``: a method's figures do not
depend on which other methods run, and the methods of one step are paired on the same prompts.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from xrpo.algo.allocation import plan_phases
from xrpo.algo.config import (
    AllocationConfig,
    BatchConfig,
    CuresConfig,
    check_int,
    check_knob_fields,
    check_number,
    knob,
)
from xrpo.algo.presets import preset_changes
from xrpo.algo.rounds import cap_error
from xrpo.algo.signal import nonzero_variance_prob
from xrpo.algo.stats import mean_ci, ratio_ci
from xrpo.sim.latency import latency_ratio, phase_latency, round_latency, stream_latency
from xrpo.sim.methods import SIM_METHODS, StepContext, register_sim_method
from xrpo.sim.model import (
    fit_success_rate_mixture,
    mixture_zero_variance_share,
    sample_mixture,
    step_metrics,
)
from xrpo.sim.rates import parse_mixture, parse_steps, read_rounds_counts, read_rounds_rates

__all__ = [
    "DEFAULT_DIST",
    "SIM_METHODS",
    "SWEEPABLE",
    "SimConfig",
    "latency_rows",
    "parse_mixture",
    "parse_sweep",
    "read_rounds_counts",
    "read_rounds_rates",
    "register_sim_method",
    "simulate",
    "sweep",
]

DEFAULT_DIST = "0.3*0 + 0.5*beta(0.7,1.5) + 0.2*1"
"""The default success-rate distribution: 30% of prompts never solved, 20% always solved, the rest Beta(0.7, 1.5)
(mean 0.32): a batch where HRP has something to reallocate and something to waste."""

# ---------------------------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class SimConfig:
    """Options of `xrpo simulate` (each field is a command-line option; --help prints these docstrings)."""

    dist: str | None = None
    """Success-rate distribution of the prompts: '+'-separated components 'W*beta(a,b)' or 'W*x' (every prompt of
    that component has success rate x in [0, 1]), weights summing to 1; a single component needs no weight. Example:
    '0.3*0 + 0.5*beta(0.7,1.5) + 0.2*1' (the default). Not together with rounds_file."""
    rounds_file: str | None = None
    """A training run's rounds.jsonl (or its run directory): each problem's success rate, pooled over the rounds of
    rounds_steps, becomes a prompt the simulator draws from (with replacement)."""
    rounds_steps: str | None = None
    """Steps of rounds_file to pool, 'A:B' (inclusive; either side may be empty). Default: every step."""
    rounds_fit: str = "beta"
    """How rounds_file's counts become success rates: "beta" (fit w0 * 0 + w1 * 1 + wb * beta(a,b) to every
    problem's k of n by maximum likelihood, and draw from the fit: a 0-of-8 problem need not have p = 0) or
    "empirical" (draw the raw rates k / n)."""
    methods: list[str] = field(
        default_factory=lambda: ["uniform", "hrp", "hrp-greedy", "no-hrp", "cures", "dapo", "oracle", "oracle-groups"]
    )
    """Methods to simulate: uniform (GRPO, one batch), hrp (XRPO's proportional HRP), hrp-greedy, no-hrp (the same
    rounds split evenly: the w/o-HRP ablation), cures, dapo (dynamic sampling), oracle (best fixed allocation for
    informative rollouts, given the true rates), oracle-groups (best fixed allocation for non-zero-gradient groups);
    beyond the paper (docs/methods.md): knapsack (Knapsack RL as its authors' code implements it, from each
    prompt's latest rewards; knapsack-leftover: the rule read from the paper's description, from the last visit,
    never-solved prompts given only what the others cannot take; knapsack-jeffreys: those valued at a Jeffreys
    estimate instead of 0), xrpo-plus
    (phases split by the posterior planner: Beta(1, 1) prior, the last visit, the step's rewards) and its ablations
    xrpo-plus-no-history, xrpo-plus-batch-prior and xrpo-plus-variance-prior (prior fitted to the batch, matching
    its flat groups or its variance), xrpo-plus-batch-prior-no-history, xrpo-plus-neighbors (+ a neighbour's rate
    as prior mean)."""
    prompts: int = 16
    """Prompts per step (rollout.prompts_per_step)."""
    rollouts: int = 128
    """Rollouts per step over all prompts, the step budget (rollout.rollouts_per_step)."""
    # the method's knobs are their sections' (xrpo.algo.config): default, docstring and check
    n_base: int = knob(AllocationConfig, "n_base")
    rounds: int = knob(AllocationConfig, "plan_rounds")
    alpha: float = knob(AllocationConfig, "alpha")
    lam: float = knob(AllocationConfig, "lam")
    max_extra: int | None = knob(AllocationConfig, "max_extra_per_prompt")
    group_size_power: float = knob(AllocationConfig, "group_size_power")
    """xrpo-plus and its variants: a group of n rollouts whose rewards are not all equal is worth n^group_size_power
    in the planner's objective (method.group_size_power), in [0, 1]. Every method's "gradient value / step" figure
    is that objective, measured: the sum over its informative groups of n^group_size_power."""
    steps: int = 1000
    """Simulated steps (independent batches); intervals shrink as 1/sqrt(steps)."""
    seed: int = 0
    """Seed of every random stream (prompts, rewards)."""
    icl: bool = False
    """Model ICL seeding in hrp, hrp-greedy and no-hrp: a prompt with no success so far draws a planning round's
    rollouts at success rate p_icl = clip(icl_mult * p + icl_add, 0, 1)."""
    icl_mult: float = 1.0
    """p_icl = clip(icl_mult * p + icl_add, 0, 1): how much more (> 1) or less (< 1) often a seeded rollout succeeds.
    Measured on the default task: about 0.5 (docs/simulate.md)."""
    icl_add: float = 0.0
    """p_icl's additive term: lets a never-solved prompt (p = 0) be solved from its examples."""
    # the dapo method simulates the dapo preset: its max_gen_batches (BatchConfig's default, 1, draws no refill)
    max_gen_batches: int = knob(BatchConfig, "max_gen_batches", default=preset_changes("dapo")["max_gen_batches"])
    """DAPO: most generation batches per step (method.max_gen_batches; the dapo preset: 10)."""
    cures_history: int = knob(CuresConfig, "cures_warmup_rollouts")
    """CurES: earlier rollouts of each prompt in its Beta posterior (method.cures_warmup_rollouts: the state at a
    prompt's first visit); they are not charged to the step."""
    cures_pool: int | None = None
    """CurES: candidate prompts it draws the step's prompts from (None: the step's own prompts, so that CurES is paired
    with the other methods and differs only in its counts)."""
    cures_temp_scale: float = knob(CuresConfig, "cures_temp_scale")
    cures_min_count: int = knob(CuresConfig, "cures_min_count")
    last_visit: int = 8
    """knapsack, xrpo-plus: rollouts of each prompt's previous visit (an earlier epoch, at the same success rate),
    from which knapsack estimates p and which xrpo-plus adds to its posterior; 0: every prompt unseen."""
    oracle_min: int | None = None
    """Least rollouts per prompt of the oracles (None: n_base, the floor HRP has)."""
    degenerate_eps: float = 0.0
    """A prompt with p <= eps or p >= 1 - eps counts as never / always solved in 'rollouts on p in {0,1}'."""
    concurrency: list[int] = field(default_factory=lambda: [1, 8, 32, 128, 512, 2048])
    """Latency model: engine concurrency m_p values (rollouts generated at once)."""
    t0: float = 1.0
    """Latency model: time of one rollout (the unit of the latency table)."""
    dt: float = 0.0
    """Latency model: planning time per generation round, in the unit of t0."""

    def __post_init__(self):
        def need(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise ValueError(f"{name} must be {what}, got {getattr(self, name)!r}")

        check_knob_fields(self)
        # the knob checker's rules (xrpo.algo.config): ints that are not bools, finite numbers
        check_int(self, "", "prompts", 1)
        check_int(
            self, "", "rollouts", self.n_base * self.prompts, f" (n_base * prompts = {self.n_base} * {self.prompts})"
        )
        check_int(self, "", "steps", 2, " (an interval needs two steps)")
        check_int(self, "", "seed", 0, " (numpy's seeds)")
        check_int(self, "", "last_visit", 0)
        try:  # the planner's own rule for splitting the step
            plan_phases(self.prompts, self.rollouts, self.n_base, self.rounds)
        except ValueError as e:
            raise ValueError(f"rounds={self.rounds} cannot split rollouts={self.rollouts}: {e}") from None
        check_number(self, "", "icl_mult", 0)
        check_number(self, "", "icl_add", -1, most=1)
        need(
            self.rollouts >= self.cures_min_count * self.prompts or "cures" not in self.methods,
            "rollouts",
            f">= cures_min_count * prompts = {self.cures_min_count * self.prompts} for cures",
        )
        if self.cures_pool is not None:
            check_int(self, "", "cures_pool", self.prompts, " (prompts) or None")
        if self.oracle_min is not None:
            check_int(self, "", "oracle_min", 0, " or None")
            need(
                self.oracle_min * self.prompts <= self.rollouts,
                "oracle_min",
                f"None or <= rollouts / prompts = {self.rollouts // self.prompts}",
            )
        # the cap must hold every planning round, and knapsack's one batch (the simulator's knapsack has no ICL)
        alloc = "knapsack" if any(m.startswith("knapsack") for m in self.methods) else "hrp"
        # (max_extra caps the knapsack variants read from the paper's description; the authors' rule ignores it)
        knobs = AllocationConfig(
            alloc, self.n_base, self.rounds, max_extra_per_prompt=self.max_extra, knapsack_fallback="leftover"
        )
        err = cap_error(knobs, self.prompts, self.rollouts, icl=False)
        if err is not None:
            raise ValueError(f"max_extra {err}, got {self.max_extra!r}")
        check_number(self, "", "degenerate_eps", 0)
        need(self.degenerate_eps < 0.5, "degenerate_eps", "< 0.5")
        need(
            isinstance(self.concurrency, list)
            and len(self.concurrency) > 0
            and all(isinstance(m, int) and not isinstance(m, bool) and m >= 1 for m in self.concurrency),
            "concurrency",
            "a non-empty list of integers >= 1",
        )
        check_number(self, "", "t0", 0, strict=True)
        check_number(self, "", "dt", 0)
        if not isinstance(self.methods, list) or not self.methods:
            raise ValueError(
                f"methods must be a non-empty list of names from {sorted(SIM_METHODS)}, got {self.methods!r}"
            )
        for m in self.methods:
            if m not in SIM_METHODS:
                raise ValueError(f"methods: unknown method {m!r}; valid: {', '.join(sorted(SIM_METHODS))}")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods lists a method twice: {self.methods!r}")
        if self.dist is not None and self.rounds_file is not None:
            raise ValueError("give dist or rounds_file, not both (rounds_file supplies the success rates)")
        if self.rounds_fit not in ("beta", "empirical"):
            raise ValueError(f"rounds_fit must be 'beta' or 'empirical', got {self.rounds_fit!r}")
        if self.rounds_steps is not None and self.rounds_file is None:
            raise ValueError("rounds_steps selects steps of rounds_file, which is not given")
        parse_mixture(self.dist if self.dist is not None else DEFAULT_DIST)  # a bad spec fails here, named
        parse_steps(self.rounds_steps)


def _prompt_source(cfg: SimConfig) -> tuple[Callable[[np.random.Generator, int], np.ndarray], dict]:
    """(rng, k) -> k success probabilities, and a description of the distribution."""
    if cfg.rounds_file is not None:
        wins, trials, info = read_rounds_counts(cfg.rounds_file, cfg.rounds_steps)
        info = {
            "source": "rounds_file",
            "fit": cfg.rounds_fit,
            **info,
            "measured": {
                "mean_rate": float(np.mean(wins / trials)),
                "zero_share": float(np.mean(wins == 0)),
                "full_share": float(np.mean(wins == trials)),
            },
        }
        if cfg.rounds_fit == "empirical":
            rates = wins / trials
            return (lambda rng, k: rng.choice(rates, size=k, replace=True)), info
        w0, w1, _, a, b = fit_success_rate_mixture(wins, trials)
        w0, w1 = round(w0, 4), round(w1, 4)
        # printed so that it can be passed back as dist; the Beta weight takes the rounding
        spec = f"{w0:g}*0 + {w1:g}*1 + {round(1.0 - w0 - w1, 4):g}*beta({a:.4g},{b:.4g})"
        weights, comps = parse_mixture(spec)
        info["fitted_dist"] = spec
        return (lambda rng, k: sample_mixture(weights, comps, k, rng)), info
    spec = cfg.dist if cfg.dist is not None else DEFAULT_DIST
    w, comps = parse_mixture(spec)
    return (lambda rng, k: sample_mixture(w, comps, k, rng)), {"source": "dist", "dist": spec}


def _describe(p: np.ndarray, spec: str | None, sizes: Sequence[int]) -> dict:
    """The drawn rates' summary, and the expected share of groups whose rewards all agree for each group size in
    ``sizes`` (n_base and the even split): exact from the mixture ``spec`` when there is one (a --dist, or the beta
    fit of a rounds file), else the mean over the drawn rates of p^n + (1 - p)^n."""
    if spec is not None:
        w, comps = parse_mixture(spec)
        flat = {str(n): mixture_zero_variance_share(w, comps, n) for n in sizes}
    else:
        flat = {str(n): float(1.0 - nonzero_variance_prob(p, n).mean()) for n in sizes}
    return {
        "mean": float(p.mean()),
        "p0_share": float(np.mean(p == 0.0)),
        "p1_share": float(np.mean(p == 1.0)),
        "quantiles": {str(q): float(np.quantile(p, q)) for q in (0.1, 0.25, 0.5, 0.75, 0.9)},
        "zero_variance_groups": flat,
    }


# ---------------------------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------------------------


def _method_stream(seed: int, step: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, step, 1, zlib.crc32(name.encode())])


def simulate(cfg: SimConfig, *, latency: bool = True) -> dict:
    """Run every method of ``cfg`` on ``cfg.steps`` simulated steps. Returns a JSON-able dict: "config",
    "distribution", "methods" (per method and figure: mean, ci (95% half-width); per method "vs_uniform": ratio of
    means and its half-width, per rollout generated, for informative rollouts, groups and the planner's gradient
    value), and "latency" (:func:`latency_rows`)."""
    source, dist_info = _prompt_source(cfg)
    ctx = StepContext(cfg, source)
    per: dict[str, dict[str, list[float]]] = {m: {} for m in cfg.methods}
    drawn = []
    for s in range(cfg.steps):
        p = np.asarray(source(np.random.default_rng([cfg.seed, s, 0]), cfg.prompts), dtype=np.float64)
        drawn.append(p)
        for name in cfg.methods:
            out = SIM_METHODS[name](ctx, p, _method_stream(cfg.seed, s, name))
            for k, v in step_metrics(out, cfg.degenerate_eps, cfg.group_size_power).items():
                per[name].setdefault(k, []).append(v)
    methods: dict[str, Any] = {}
    for name, figs in per.items():
        row: dict[str, Any] = {}
        for k, vals in figs.items():
            mean, half = mean_ci(vals)
            row[k] = {"mean": mean, "ci": half}
        if "uniform" in per:
            row["vs_uniform"] = {}
            # per rollout generated: the comparison at equal budget (DAPO generates more than one batch)
            for k in ("informative_share", "groups_per_rollout", "group_value_per_rollout"):
                r, h = ratio_ci(figs[k], per["uniform"][k])
                row["vs_uniform"][k] = {"ratio": r, "ci": h}
        if figs["planned_rounds"] and sum(figs["planned_rounds"]):
            row["nonuniform_round_share"] = sum(figs["nonuniform_rounds"]) / sum(figs["planned_rounds"])
        if sum(figs["seeded_prompts"]):
            row["flip_rate"] = sum(figs["flips"]) / sum(figs["seeded_prompts"])
        methods[name] = row
    all_p = np.concatenate(drawn)
    spec = dist_info.get("fitted_dist", dist_info.get("dist"))
    sizes = sorted({cfg.n_base, cfg.rollouts // cfg.prompts})
    result = {"config": asdict(cfg), "distribution": {**dist_info, **_describe(all_p, spec, sizes)}, "methods": methods}
    if latency:
        result["latency"] = latency_rows(cfg)
    return result


def latency_rows(cfg: SimConfig) -> list[dict]:
    """Per engine concurrency m_p: GRPO's one batch (T1 = ceil(N / m_p) t0) against XRPO's rounds of this config's
    sizes (base round, then each planning round: sum of ceil(size / m_p) t0 + dt, :func:`phase_latency`), and the
    paper's closed form for n = rounds + 1 equal rounds (:func:`latency_ratio`; with :func:`round_latency`'s
    ceilings when n divides N), and streaming planning's ideal bound T3 (:func:`stream_latency`)."""
    phases = plan_phases(cfg.prompts, cfg.rollouts, cfg.n_base, cfg.rounds)
    sizes = [phases.base_per_prompt * cfg.prompts, *phases.round_budgets]
    N, n = cfg.rollouts, len([s for s in sizes if s > 0])
    rows = []
    for m in cfg.concurrency:
        t1 = phase_latency([N], m, cfg.t0, 0.0)
        t2 = phase_latency(sizes, m, cfg.t0, cfg.dt)
        row = {
            "concurrency": m,
            "T1": t1,
            "T2": t2,
            "ratio": t2 / t1,
            "paper_ratio": float(latency_ratio(N, m, n, cfg.dt / cfg.t0)),
            # streaming planning: no barrier, slots kept full, each prompt's rounds still in sequence
            "T3": stream_latency(sizes, m, cfg.t0),
            "stream_ratio": stream_latency(sizes, m, cfg.t0) / t1,
            "rounds": n,
        }
        if N % n == 0:
            a, b = round_latency(N, m, n, cfg.t0, cfg.dt)
            row["equal_rounds_ratio"] = b / a
        rows.append(row)
    return rows


def _coerce(name: str, text: str) -> Any:
    """A sweep value for field ``name`` from its text, converted as the command line converts it
    (`xrpo.rundir.fields.coerce`); "none" is None for an optional field."""
    import typing

    from xrpo.rundir.fields import coerce, strip_optional, type_name

    ftype = typing.get_type_hints(SimConfig)[name]
    if strip_optional(ftype)[1] and text.lower() == "none":
        return None
    try:
        return coerce(text, name, ftype)
    except ValueError:
        raise ValueError(f"sweep: {text!r} is not a valid value for {name} ({type_name(ftype)})") from None


SWEEPABLE = (
    "dist",
    "prompts",
    "rollouts",
    "n_base",
    "rounds",
    "alpha",
    "lam",
    "max_extra",
    "group_size_power",
    "icl_mult",
    "icl_add",
    "max_gen_batches",
    "cures_history",
)


def parse_sweep(spec: str) -> tuple[str, list]:
    """'NAME=V1,V2,...' (dist: 'dist=SPEC1;SPEC2;...', since a mixture spec has commas) -> (name, values)."""
    if "=" not in spec:
        raise ValueError(f"sweep must be NAME=V1,V2,... with NAME one of {', '.join(SWEEPABLE)}; got {spec!r}")
    name, rest = (s.strip() for s in spec.split("=", 1))
    if name not in SWEEPABLE:
        raise ValueError(f"sweep: cannot sweep {name!r}; sweepable: {', '.join(SWEEPABLE)}")
    vals = [v.strip() for v in rest.split(";" if name == "dist" else ",") if v.strip()]
    if len(vals) < 2:
        raise ValueError(f"sweep: give at least two values for {name}, got {rest!r}")
    return name, [_coerce(name, v) for v in vals]


def sweep(cfg: SimConfig, name: str, values: list) -> dict:
    """Run the simulator once per value of option ``name`` (other options from ``cfg``). Returns {"name", "values",
    "runs": [simulate() result per value, without latency]}; a value that makes the config invalid raises naming it."""
    runs = []
    for v in values:
        try:
            c = replace(cfg, **{name: v})
        except ValueError as e:
            raise ValueError(f"sweep {name}={v!r}: {e}") from None
        runs.append(simulate(c, latency=False))
    return {"name": name, "values": values, "runs": runs}
