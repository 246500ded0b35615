"""xrpo: XRPO (eXplore-eXploit GRPO) and its baselines for RL from verifiable rewards.

Layout (dependencies point one way, top to bottom):
    xrpo.algo        pure math of the paper (allocation, advantages, losses, sampling, presets)
    xrpo.rundir      what reads and writes a run directory (atomic writes, JSONL records, lock, checkpoints, YAML)
    xrpo.data        Problem records and dataset loaders
    xrpo.sandbox     process machinery: the sandbox for untrusted programs, worker pools with a time limit
    xrpo.rewards     verifier registry (math, code, ...)
    xrpo.icl         evolving ICL corpus, embedders, vector index, prompt template
    xrpo.rollout     rollout engines and the XRPO planner (Algorithm 1)
    xrpo.trainer     the single-machine training loop
    xrpo.eval        pass@k / cons@k metrics and evaluation
    xrpo.sim         the allocation simulator (no model)
    xrpo.integrations  verl
    xrpo.cli         the `xrpo` command
"""

__version__ = "0.1.0"
