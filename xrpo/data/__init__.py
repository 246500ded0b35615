"""Problem records, dataset loaders and the built-in default task.

`Problem` is what every other module consumes; `load_problems` reads JSONL / JSON / parquet (verl's layout included)
and `datasets` directories; `make_default_task` draws the offline arithmetic task that `xrpo train` uses by default.
reasoning-gym and datasets are imported only when a function needs them.
"""

from xrpo.data.loaders import (
    FORMATS,
    LAYOUTS,
    NamedLayout,
    load_problems,
    load_problems_with_layout,
    register_layout,
)
from xrpo.data.problem import DataError, Problem
from xrpo.data.tasks import (
    DEFAULT_FAMILIES,
    FAMILIES,
    TaskFamily,
    format_prompt,
    make_default_task,
    warmup_texts,
)
from xrpo.data.writers import save_problems_jsonl, save_problems_verl_parquet

__all__ = [
    "DEFAULT_FAMILIES",
    "FAMILIES",
    "FORMATS",
    "LAYOUTS",
    "DataError",
    "NamedLayout",
    "Problem",
    "TaskFamily",
    "format_prompt",
    "load_problems",
    "load_problems_with_layout",
    "make_default_task",
    "register_layout",
    "save_problems_jsonl",
    "save_problems_verl_parquet",
    "warmup_texts",
]
