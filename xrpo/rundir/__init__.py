"""xrpo.rundir: what reads and writes a run directory, a floor below the trainer, the rollouts, eval and the
simulator, which all write or read the same files. It imports nothing of the package but `xrpo.algo` (number checks).

Submodules (import them directly):
    files        atomic writes: a reader, or a crash, sees a file's old content or its new one, never a part
    jsonl        the one reader of a run's JSONL records (metrics.jsonl, rounds.jsonl, eval.jsonl, ...)
    rounds       the rounds.jsonl row: `round_entry` writes it, `check_round_entry` checks it for its readers
    lock         one writer per output directory (``DIR/.xrpo.lock``) and the rule for making an output directory
    checkpoints  the checkpoints of a run: their layout and listing, which one a resume picks, their state.json
    yamlfile     a YAML file read with every error naming the file and line, a key given twice refused
    fields       what a config dataclass's fields tell the command line and the YAML loader: docstrings, types
"""
