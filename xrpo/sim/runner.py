"""`xrpo simulate`: the allocation simulator (no model, seconds). docs/simulate.md explains the model and its results.

    simulate(SimConfig(dist="0.6*0 + 0.4*beta(1,3)", methods=["uniform", "hrp"]))   # = xrpo simulate --dist ...

Top to bottom:
    1. rates     each step draws ``prompts`` success probabilities from ``dist`` (a mixture of Beta distributions and
                 fixed rates, :func:`parse_mixture`) or, with ``rounds_file``, from the per-problem success counts
                 measured in a training run's rounds.jsonl (:func:`read_rounds_counts`): a mixture fitted to them
                 by maximum likelihood, or their raw rates.
    2. methods   every method allocates the same step (same prompts; its own reward draws) through the library's
                 own rules (the round planner ``xrpo.algo.rounds``, stepped by ``xrpo.sim.model``); a small
                 registry maps names to them (:data:`SIM_METHODS`).
    3. figures   per step ``xrpo.sim.model.step_metrics``; over ``steps`` steps the mean and its 95% interval,
                 and each method against uniform as a ratio of means with a paired (delta-method) interval.
    4. latency   the paper's latency model of rounds (appendix "Latency Analysis") for each engine concurrency.
    5. outputs   a Markdown table (printed; simulate.md), simulate.json, and with matplotlib (the `plot` extra)
                 simulate.png and latency.png; ``sweep`` re-runs the simulator over values of one option (sweep.md,
                 sweep.json, sweep_<name>.png).

Random streams: step s draws its prompts from ``default_rng([seed, s, 0])`` and method m its rewards (and DAPO its
refill prompts, CurES its pool and history) from ``default_rng([seed, s, 1, crc32(m)])``: a method's figures do not
depend on which other methods run, and the methods of one step are paired on the same prompts.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from xrpo.algo.allocation import plan_phases
from xrpo.algo.config import AllocationConfig, BatchConfig, CuresConfig, check_knob_fields, knob
from xrpo.algo.presets import preset_changes
from xrpo.algo.rounds import cures_select, one_batch_counts
from xrpo.algo.signal import nonzero_variance_prob, oracle_allocation
from xrpo.algo.stats import mean_ci, ratio_ci
from xrpo.sim.alloc_sim import knapsack_step, posterior_step
from xrpo.sim.latency import latency_ratio, phase_latency, round_latency, stream_latency
from xrpo.sim.model import (
    StepOutcome,
    bernoulli_draw,
    dapo_step,
    fit_success_rate_mixture,
    fixed_outcome,
    icl_success_prob,
    mixture_zero_variance_share,
    outcome_from_phased,
    phased_step,
    sample_mixture,
    step_metrics,
)
from xrpo.sim.rates import parse_mixture, parse_steps, read_rounds_counts, read_rounds_rates

__all__ = [
    "DEFAULT_DIST",
    "METRICS",
    "SIM_METHODS",
    "SimConfig",
    "latency_rows",
    "markdown_table",
    "parse_mixture",
    "read_rounds_counts",
    "read_rounds_rates",
    "register_sim_method",
    "run_cli",
    "simulate",
    "sweep",
]

DEFAULT_DIST = "0.3*0 + 0.5*beta(0.7,1.5) + 0.2*1"
"""The default success-rate distribution: 30% of prompts never solved, 20% always solved, the rest Beta(0.7, 1.5)
(mean 0.32): a batch where HRP has something to reallocate and something to waste."""

# (key, column title, format) of the reported figures, in table order; docs/simulate.md defines each
METRICS = [
    ("informative_rollouts", "informative rollouts / step", "{:.1f}"),
    ("informative_share", "share of generated", "{:.3f}"),
    ("informative_groups", "non-zero-gradient groups / step", "{:.2f}"),
    ("sq_error", "sq. error of p̂", "{:.4f}"),
    ("rollouts_p01", "rollouts on p ∈ {0,1}", "{:.1f}"),
    ("rollouts_all_equal", "rollouts in all-equal groups", "{:.1f}"),
    ("rollouts_generated", "rollouts generated", "{:.1f}"),
    ("prompts", "prompts consumed", "{:.2f}"),
]


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
    beyond the paper (issue #33, docs/methods.md): knapsack (Knapsack RL from each prompt's last visit;
    knapsack-jeffreys: never-solved prompts valued at a Jeffreys estimate instead of 0), xrpo-plus
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
    steps: int = 1000
    """Simulated steps (independent batches); intervals shrink as 1/sqrt(steps)."""
    seed: int = 0
    """Seed of every random stream (prompts, rewards)."""
    icl: bool = False
    """Model ICL seeding in hrp, hrp-greedy and no-hrp: a prompt with no success so far draws a planning round's
    rollouts at success rate p_icl = clip(icl_mult * p + icl_add, 0, 1)."""
    icl_mult: float = 1.0
    """p_icl = clip(icl_mult * p + icl_add, 0, 1): how much more (> 1) or less (< 1) often a seeded rollout succeeds.
    Issue #19's audit of the default task: about 0.5."""
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
        for name in ("prompts", "rollouts", "steps", "seed", "last_visit"):
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool), name, "an integer")
        need(self.prompts >= 1, "prompts", ">= 1")
        need(self.steps >= 2, "steps", ">= 2 (an interval needs two steps)")
        need(
            self.rollouts >= self.n_base * self.prompts,
            "rollouts",
            f">= n_base * prompts = {self.n_base} * {self.prompts} = {self.n_base * self.prompts}",
        )
        if self.rounds == 0 and self.rollouts != self.n_base * self.prompts:
            raise ValueError(
                f"rounds=0 leaves {self.rollouts - self.n_base * self.prompts} of rollouts={self.rollouts}"
                " unallocated after the base round: give rounds >= 1 or rollouts = n_base * prompts"
            )
        need(math.isfinite(self.icl_mult) and self.icl_mult >= 0, "icl_mult", "a number >= 0")
        need(math.isfinite(self.icl_add) and -1 <= self.icl_add <= 1, "icl_add", "in [-1, 1]")
        need(self.last_visit >= 0, "last_visit", ">= 0")
        need(
            self.rollouts >= self.cures_min_count * self.prompts or "cures" not in self.methods,
            "rollouts",
            f">= cures_min_count * prompts = {self.cures_min_count * self.prompts} for cures",
        )
        need(
            self.cures_pool is None or (isinstance(self.cures_pool, int) and self.cures_pool >= self.prompts),
            "cures_pool",
            f"None or an integer >= prompts ({self.prompts})",
        )
        need(
            self.oracle_min is None
            or (
                isinstance(self.oracle_min, int)
                and 0 <= self.oracle_min
                and self.oracle_min * self.prompts <= self.rollouts
            ),
            "oracle_min",
            f"None or an integer in [0, rollouts / prompts = {self.rollouts // self.prompts}]",
        )
        need(0.0 <= self.degenerate_eps < 0.5, "degenerate_eps", "in [0, 0.5)")
        need(
            isinstance(self.concurrency, list)
            and len(self.concurrency) > 0
            and all(isinstance(m, int) and not isinstance(m, bool) and m >= 1 for m in self.concurrency),
            "concurrency",
            "a non-empty list of integers >= 1",
        )
        need(math.isfinite(self.t0) and self.t0 > 0, "t0", "a number > 0")
        need(math.isfinite(self.dt) and self.dt >= 0, "dt", "a number >= 0")
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
# methods
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class StepContext:
    cfg: SimConfig
    source: Callable[[np.random.Generator, int], np.ndarray]


SimMethod = Callable[[StepContext, np.ndarray, np.random.Generator], StepOutcome]
SIM_METHODS: dict[str, SimMethod] = {}
"""Name -> fn(context, p of the step's prompts, generator) -> StepOutcome."""


def register_sim_method(name: str) -> Callable[[SimMethod], SimMethod]:
    def deco(fn: SimMethod) -> SimMethod:
        if name in SIM_METHODS:
            raise ValueError(f"simulator method {name!r} is already registered")
        SIM_METHODS[name] = fn
        return fn

    return deco


@register_sim_method("uniform")
def _uniform(ctx: StepContext, p: np.ndarray, rng: np.random.Generator) -> StepOutcome:
    return fixed_outcome(p, one_batch_counts(ctx.cfg.prompts, ctx.cfg.rollouts), rng)


def _phased(ctx: StepContext, p: np.ndarray, rng: np.random.Generator, allocation: str, mode: str) -> StepOutcome:
    c = ctx.cfg
    p_icl = icl_success_prob(p, c.icl_mult, c.icl_add) if c.icl else p
    res = phased_step(
        c.prompts,
        c.rollouts,
        bernoulli_draw(p, p_icl, rng),
        n_base=c.n_base,
        rounds=c.rounds,
        allocation=allocation,
        mode=mode,
        alpha=c.alpha,
        lam=c.lam,
        max_per_prompt=c.max_extra,
        icl=c.icl,
    )
    return outcome_from_phased(p, res)


@register_sim_method("hrp")
def _hrp(ctx, p, rng):
    return _phased(ctx, p, rng, "hrp", "proportional")


@register_sim_method("hrp-greedy")
def _hrp_greedy(ctx, p, rng):
    return _phased(ctx, p, rng, "hrp", "greedy")


@register_sim_method("no-hrp")
def _no_hrp(ctx, p, rng):
    return _phased(ctx, p, rng, "uniform", "proportional")


@register_sim_method("cures")
def _cures(ctx, p, rng):
    c = ctx.cfg
    pool = (
        p
        if c.cures_pool is None or c.cures_pool == c.prompts
        else np.concatenate([p, ctx.source(rng, c.cures_pool - c.prompts)])
    )
    trials = np.full(pool.shape[0], c.cures_history, dtype=np.int64)
    succ = rng.binomial(trials, pool)
    pick = cures_select(
        succ, trials, c.prompts, c.rollouts, rng, temp_scale=c.cures_temp_scale, min_count=c.cures_min_count
    )
    return fixed_outcome(pool[pick.idx], pick.counts, rng)


@register_sim_method("dapo")
def _dapo(ctx, p, rng):
    c = ctx.cfg
    return dapo_step(p, lambda k: ctx.source(rng, k), c.prompts, c.rollouts, c.max_gen_batches, rng)


@register_sim_method("oracle")
def _oracle(ctx, p, rng):
    c = ctx.cfg
    n_min = c.n_base if c.oracle_min is None else c.oracle_min
    return fixed_outcome(p, oracle_allocation(p, c.rollouts, n_min, "rollouts"), rng)


@register_sim_method("oracle-groups")
def _oracle_groups(ctx, p, rng):
    c = ctx.cfg
    n_min = c.n_base if c.oracle_min is None else c.oracle_min
    return fixed_outcome(p, oracle_allocation(p, c.rollouts, n_min, "groups"), rng)


# beyond the paper (issue #33): thin wrappers over xrpo.sim.alloc_sim, which holds the steps


@register_sim_method("knapsack")
def _knapsack(ctx, p, rng):
    return knapsack_step(p, ctx.cfg.rollouts, rng, last_visit=ctx.cfg.last_visit)


@register_sim_method("knapsack-jeffreys")
def _knapsack_jeffreys(ctx, p, rng):
    return knapsack_step(p, ctx.cfg.rollouts, rng, last_visit=ctx.cfg.last_visit, fallback="jeffreys")


def _xrpo_plus(ctx, p, rng, history: bool = True, prior: str = "flat", neighbors: bool = False):
    c = ctx.cfg
    return posterior_step(
        p,
        c.rollouts,
        rng,
        n_base=c.n_base,
        rounds=c.rounds,
        last_visit=c.last_visit if history else 0,
        prior=prior,
        neighbors=neighbors,
        max_per_prompt=c.max_extra,
        icl=c.icl,
        p_icl=icl_success_prob(p, c.icl_mult, c.icl_add) if c.icl else None,
    )


for _name, _kw in {
    "xrpo-plus": {},
    "xrpo-plus-no-history": {"history": False},
    "xrpo-plus-batch-prior": {"prior": "batch"},
    "xrpo-plus-variance-prior": {"prior": "batch-variance"},
    "xrpo-plus-batch-prior-no-history": {"prior": "batch", "history": False},
    "xrpo-plus-neighbors": {"neighbors": True},
}.items():
    register_sim_method(_name)(lambda ctx, p, rng, _kw=_kw: _xrpo_plus(ctx, p, rng, **_kw))


# ---------------------------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------------------------


def _method_stream(seed: int, step: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, step, 1, zlib.crc32(name.encode())])


def simulate(cfg: SimConfig, *, latency: bool = True) -> dict:
    """Run every method of ``cfg`` on ``cfg.steps`` simulated steps. Returns a JSON-able dict: "config",
    "distribution", "methods" (per method and figure: mean, ci (95% half-width); per method "vs_uniform": ratio of
    means and its half-width for informative rollouts and groups), and "latency" (:func:`latency_rows`)."""
    source, dist_info = _prompt_source(cfg)
    ctx = StepContext(cfg, source)
    per: dict[str, dict[str, list[float]]] = {m: {} for m in cfg.methods}
    drawn = []
    for s in range(cfg.steps):
        p = np.asarray(source(np.random.default_rng([cfg.seed, s, 0]), cfg.prompts), dtype=np.float64)
        drawn.append(p)
        for name in cfg.methods:
            out = SIM_METHODS[name](ctx, p, _method_stream(cfg.seed, s, name))
            for k, v in step_metrics(out, cfg.degenerate_eps).items():
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
            for k in ("informative_share", "groups_per_rollout"):
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
            # streaming planning (issue #20): no barrier, slots kept full, each prompt's rounds still in sequence
            "T3": stream_latency(sizes, m, cfg.t0),
            "stream_ratio": stream_latency(sizes, m, cfg.t0) / t1,
            "rounds": n,
        }
        if N % n == 0:
            a, b = round_latency(N, m, n, cfg.t0, cfg.dt)
            row["equal_rounds_ratio"] = b / a
        rows.append(row)
    return rows


def _fmt(fig: dict, fmt: str) -> str:
    return f"{fmt.format(fig['mean'])} ± {fmt.format(fig['ci'])}"


def markdown_table(result: dict) -> str:
    """The simulator's results as Markdown: the setting, one row per method, and the latency table."""
    c, d = result["config"], result["distribution"]
    if d["source"] == "rounds_file":
        src = (
            f"{'a fit to the ' if d['fit'] == 'beta' else ''}rates of {d['problems']} problems from "
            f"`{d['file']}` ({d['steps']} steps, median {d['rollouts_per_problem_median']:g} rollouts each"
            + (
                f", {d['seeded_rollouts_excluded']} ICL-seeded rollouts left out"
                if d["seeded_rollouts_excluded"]
                else ""
            )
            + (f", {d['unreadable_lines']} partial lines skipped" if d["unreadable_lines"] else "")
            + ")"
            + (f": `{d['fitted_dist']}`" if d["fit"] == "beta" else "")
            + f". Measured: mean rate {d['measured']['mean_rate']:.3f}, no success for "
            f"{d['measured']['zero_share']:.1%}, all successes for {d['measured']['full_share']:.1%} of problems"
        )
        ms = d["measured_per_step"]
        measured_line = (
            f"Measured in the run itself (every rollout, ICL-seeded ones included): "
            f"{_fmt(ms['informative_rollouts'], '{:.1f}')} informative rollouts and "
            f"{_fmt(ms['informative_groups'], '{:.2f}')} non-zero-gradient groups per step of "
            f"{ms['rollouts']['mean']:.1f} rollouts."
        )
    else:
        src = f"`{d['dist']}`"
        measured_line = None
    lines = [
        f"Success rates: {src}; mean p {d['mean']:.3f}, p = 0 for {d['p0_share']:.1%}, p = 1 for "
        f"{d['p1_share']:.1%} of prompts; expected groups with all rewards equal: "
        + ", ".join(f"{v:.1%} at {n} rollouts" for n, v in d["zero_variance_groups"].items())
        + f" (n_base {c['n_base']}; the even split gives {c['rollouts'] // c['prompts']}).",
        f"Step: {c['prompts']} prompts, {c['rollouts']} rollouts, n_base {c['n_base']}, {c['rounds']} planning "
        f"rounds, alpha {c['alpha']:g}, lambda {c['lam']:g}"
        + (f", ICL p_icl = clip({c['icl_mult']:g} p + {c['icl_add']:g}, 0, 1)" if c["icl"] else ", no ICL")
        + f"; DAPO max_gen_batches {c['max_gen_batches']}. Mean ± 95% interval over {c['steps']} steps "
        f"(seed {c['seed']}).",
        "",
    ]
    if measured_line:
        lines[-1:-1] = [measured_line]
    has_u = any("vs_uniform" in r for r in result["methods"].values())
    head = ["method"] + [t for _, t, _ in METRICS[:3]]
    if has_u:
        head += ["× uniform per rollout generated: informative rollouts", "× uniform per rollout generated: groups"]
    head += [t for _, t, _ in METRICS[3:]]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in result["methods"].items():
        cells = [name] + [_fmt(r[k], f) for k, _, f in METRICS[:3]]
        if has_u:
            for k in ("informative_share", "groups_per_rollout"):
                v = r.get("vs_uniform", {}).get(k)
                cells.append("–" if v is None or not math.isfinite(v["ratio"]) else f"{v['ratio']:.3f} ± {v['ci']:.3f}")
        cells += [_fmt(r[k], f) for k, _, f in METRICS[3:]]
        lines.append("| " + " | ".join(cells) + " |")
    extra = []
    for name, r in result["methods"].items():
        bits = []
        if "nonuniform_round_share" in r:
            bits.append(f"non-uniform allocation in {r['nonuniform_round_share']:.1%} of planning rounds")
        if "flip_rate" in r:
            bits.append(f"ICL seeded {r['seeded_prompts']['mean']:.2f} prompts / step, flip rate {r['flip_rate']:.3f}")
        if r["rollouts_dropped"]["mean"] > 0:
            bits.append(f"{r['rollouts_dropped']['mean']:.1f} generated rollouts / step dropped by the filter")
        if bits:
            extra.append(f"- {name}: " + "; ".join(bits))
    if extra:
        lines += [""] + extra
    if result.get("latency"):
        lat = result["latency"]
        lines += [
            "",
            f'Latency model (paper appendix "Latency Analysis"): N = {c["rollouts"]} rollouts, '
            f"{lat[0]['rounds']} generation rounds, t0 = {c['t0']:g}, dt = {c['dt']:g} per round.",
            "",
            "| concurrency m_p | T1 (one batch) | T2 (rounds) | T2 / T1 | paper closed form | T3 (streaming) "
            "| T3 / T1 |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in lat:
            lines.append(
                f"| {row['concurrency']} | {row['T1']:g} | {row['T2']:g} | {row['ratio']:.3f} | "
                f"{row['paper_ratio']:.3f} | {row['T3']:g} | {row['stream_ratio']:.3f} |"
            )
        lines += [
            "",
            "T3: streaming planning (rollout.planner=streaming) with ideal packing, max(ceil(N / m_p), rounds) t0: "
            "no barrier and no planning time, but each prompt's rounds in sequence (docs/methods.md).",
        ]
    return "\n".join(lines) + "\n"


def _coerce(name: str, text: str) -> Any:
    """A sweep value for field ``name`` from its text, converted as the command line converts it
    (`xrpo.trainer.fields.coerce`); "none" is None for an optional field."""
    import typing

    from xrpo.trainer.fields import coerce, strip_optional, type_name

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


def sweep_table(sw: dict) -> str:
    """Markdown: one row per swept value; uniform's informative rollouts and non-zero-gradient groups per step, and
    each other method's ratios to uniform per rollout generated ("rollouts / groups", 95% intervals; at equal budget
    the per-step ratios, for every method but DAPO)."""
    methods = list(sw["runs"][0]["methods"])
    others = [m for m in methods if m != "uniform"]
    head = [sw["name"]]
    if "uniform" in methods:
        head += ["uniform: informative rollouts / step", "uniform: groups / step"]
    head += [f"{m} × uniform: rollouts / groups" for m in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v, run in zip(sw["values"], sw["runs"]):
        cells = [f"`{v}`" if sw["name"] == "dist" else f"{v}"]
        if "uniform" in methods:
            u = run["methods"]["uniform"]
            cells += [_fmt(u["informative_rollouts"], "{:.1f}"), _fmt(u["informative_groups"], "{:.2f}")]
        for m in others:
            vs = run["methods"][m].get("vs_uniform", {})
            parts = []
            for k in ("informative_share", "groups_per_rollout"):
                r = vs.get(k)
                parts.append("–" if r is None or not math.isfinite(r["ratio"]) else f"{r['ratio']:.2f} ± {r['ci']:.2f}")
            cells.append(" / ".join(parts))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def run_cli(
    cfg: SimConfig, *, output: str | None = None, sweep_spec: str | None = None, plots: bool = True, log=print
) -> dict:
    """What `xrpo simulate` does: simulate (or sweep), print the Markdown table, and with ``output`` write the
    Markdown, the JSON and (matplotlib installed and ``plots``) the PNGs there."""
    out = Path(output) if output else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    if sweep_spec:
        name, values = parse_sweep(sweep_spec)
        sw = sweep(cfg, name, values)
        table = sweep_table(sw)
        log(table)
        if out is not None:
            _write(out / "sweep.md", table)
            _write(out / "sweep.json", json.dumps(sw, indent=1, default=str))
            if plots:
                from xrpo.sim.plots import plot_sweep

                log(f"wrote {plot_sweep(sw, out / f'sweep_{name}.png')}")
        return sw
    result = simulate(cfg)
    table = markdown_table(result)
    log(table)
    if out is not None:
        _write(out / "simulate.md", table)
        _write(out / "simulate.json", json.dumps(result, indent=1))
        if plots:
            from xrpo.sim.plots import plot_latency, plot_methods

            log(f"wrote {plot_methods(result, out / 'simulate.png')}")
            log(f"wrote {plot_latency(cfg, out / 'latency.png')}")
        log(f"outputs in {out}: simulate.md, simulate.json" + (", simulate.png, latency.png" if plots else ""))
    return result
