"""verl reward function backed by xrpo's verifiers (`xrpo.rewards`).

verl calls a custom reward function once per rollout, in its reward-loop workers, as
``compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs)``; configure it
with::

    reward.custom_reward_function.path=pkg://xrpo.integrations.verl.reward
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.verifier=math     # (xrpo_base.yaml sets all three)

The verifier is any name `xrpo.rewards.get_verifier` accepts (``math``, or a dotted path ``pkg.mod:obj``); extra
keyword arguments for it go under ``reward_kwargs.verifier_kwargs``. One verifier is built per process and reused.
The result is a dict: ``score`` (the reward), ``acc`` (the same value: verl's validation reports mean@k / best@k of
it) and ``pred`` (the normalised extracted answer, "" if none: verl's maj@k votes on it, i.e. cons@k).
"""

from __future__ import annotations

import json
import math
import threading
from typing import Any

from xrpo.rewards import get_verifier

__all__ = ["compute_score", "reference_answer"]

# keyword arguments verl itself may add when a reward model is configured; anything else unknown is a config typo
_VERL_KWARGS = frozenset({"reward_router_address", "reward_model_tokenizer"})

_LOCK = threading.Lock()
_CACHE: dict[str, Any] = {}


def _get(name: str, kwargs: dict):
    key = name + json.dumps(kwargs, sort_keys=True, default=str)
    with _LOCK:  # verl grades rollouts from several threads at once
        if key not in _CACHE:
            _CACHE[key] = get_verifier(name, **kwargs)
        return _CACHE[key]


def reference_answer(ground_truth: Any, data_source: Any, extra_info: Any) -> str:
    """A row's reference answer as xrpo's verifiers take it (a string), from verl's ``ground_truth``; a ValueError
    names the row (data_source, extra_info.index) when it has none."""
    where = f"data_source={data_source!r}"
    if isinstance(extra_info, dict) and "index" in extra_info:
        where += f", extra_info.index={extra_info['index']!r}"
    if isinstance(ground_truth, bool) or ground_truth is None:
        raise ValueError(f"reward: row ({where}) has ground_truth={ground_truth!r}; expected a reference answer")
    if isinstance(ground_truth, (int, float)):
        if not math.isfinite(ground_truth):
            raise ValueError(f"reward: row ({where}) has ground_truth={ground_truth!r}; expected a finite number")
        return str(int(ground_truth)) if float(ground_truth).is_integer() else repr(ground_truth)
    if not isinstance(ground_truth, str) or not ground_truth.strip():
        raise ValueError(
            f"reward: row ({where}) has ground_truth={ground_truth!r} ({type(ground_truth).__name__}); expected a "
            "non-empty string (reward_model.ground_truth of verl's parquet)"
        )
    return ground_truth


def compute_score(
    data_source: Any = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: Any = None,
    verifier: str = "math",
    verifier_kwargs: dict | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Grade one completion with xrpo's verifier ``verifier``; see the module docstring for the result."""
    unknown = set(kwargs) - _VERL_KWARGS
    if unknown:
        raise ValueError(
            f"reward: unknown reward_kwargs {sorted(unknown)}; xrpo's reward function takes 'verifier' and "
            "'verifier_kwargs'"
        )
    if not isinstance(solution_str, str):
        raise ValueError(f"reward: solution_str must be a str, got {type(solution_str).__name__}")
    reference = reference_answer(ground_truth, data_source, extra_info)
    result = _get(verifier, dict(verifier_kwargs or {})).verify_batch([solution_str], [reference])[0]
    score = float(result.score)
    return {"score": score, "acc": score, "pred": result.answer or ""}
