"""`xrpo simulate`: the allocation simulator: how each allocation rule turns a step's rollout budget into
GRPO signal, from success-rate distributions alone (no model). The rules are the round planner's
(`xrpo.algo.rounds`); this package holds what a simulator owns: the model of a step (`model`: success-rate
distributions, reward draws, outcomes), the latency models (`latency`), the --dist language and the rates measured in
a run (`rates`), the options and the run (`runner`), the methods compared (`methods`), the tables and `xrpo simulate`'s
outputs (`tables`) and the plots (`plots`)."""

from xrpo.sim.rates import parse_mixture, read_rounds_rates
from xrpo.sim.runner import (
    DEFAULT_DIST,
    SIM_METHODS,
    SimConfig,
    register_sim_method,
    simulate,
    sweep,
)
from xrpo.sim.tables import markdown_table, run_cli

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
