"""`xrpo simulate`: the allocation simulator (issue #19): how each allocation rule turns a step's rollout budget into
GRPO signal, from success-rate distributions alone (no model). The math is in `xrpo.algo.simulate`; this package
holds the options, the distributions, the reader of a run's rounds.jsonl, the tables and the plots."""

from xrpo.sim.runner import (
    DEFAULT_DIST,
    SIM_METHODS,
    SimConfig,
    markdown_table,
    parse_mixture,
    read_rounds_rates,
    register_sim_method,
    run_cli,
    simulate,
    sweep,
)

__all__ = [
    "DEFAULT_DIST",
    "SIM_METHODS",
    "SimConfig",
    "markdown_table",
    "parse_mixture",
    "read_rounds_rates",
    "register_sim_method",
    "run_cli",
    "simulate",
    "sweep",
]
