"""pass@k and cons@k (majority vote): pure Python/numpy.

XRPO §4.1 Evaluation Metrics: "we generate n=32 candidate solutions per problem ... and measure performance with
pass@k (probability that at least one of the top-k samples is correct) and cons@32 (fraction of problems with correct
majority-vote accuracy aggregated using 32 sampled solutions per problem)."
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from numbers import Integral

import numpy as np

__all__ = ["majority_vote", "mean_majority_vote", "mean_pass_at_k", "pass_at_k"]


def _check_int(name: str, x: object) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, Integral):
        raise ValueError(f"{name}: expected an integer, got {x!r}")
    return int(x)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator of Chen et al. 2021 (arXiv 2107.03374, §2.1), in its numerically stable form.

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i): the probability that a random size-k
    subset of the n samples contains at least one of the c correct ones.

    Args:
        n: number of samples drawn for the problem (>= 1).
        c: number of correct samples, 0 <= c <= n.
        k: subset size, 1 <= k <= n.

    Returns:
        A float in [0, 1].
    """
    n, c, k = _check_int("n", n), _check_int("c", c), _check_int("k", k)
    if n < 1:
        raise ValueError(f"n: expected at least 1 sample, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c: expected 0 <= c <= n = {n}, got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k: expected 1 <= k <= n = {n}, got {k}")
    if n - c < k:
        # every size-k subset holds a correct sample
        return 1.0
    i = np.arange(n - c + 1, n + 1, dtype=np.float64)
    # pass@k = 1 - prod_{i=n-c+1}^{n} (1 - k/i)
    return float(1.0 - np.prod(1.0 - k / i))


def majority_vote(answers: Sequence[Hashable | None], correct: Sequence[bool]) -> bool:
    """cons@k for one problem: is the plurality answer correct?

    The vote counts the parsed answers; ``None`` (unparseable) never wins. Ties between equally frequent answers go to
    the answer that occurs first. The result is ``correct[i]`` for the first occurrence ``i`` of the winning answer
    (the verifier's verdict on that rollout). If no answer parsed (all ``None``, or no rollouts) the vote is ``False``.
    Answers are compared with ``==`` as given: canonicalise equivalent forms ("1/2", "0.5") before voting.

    Args:
        answers: parsed final answer of each rollout (hashable, e.g. str), or None.
        correct: verdict of each rollout, parallel to ``answers``.

    Returns:
        Whether the majority answer is correct.
    """
    if len(answers) != len(correct):
        raise ValueError(
            f"correct: expected one verdict per answer ({len(answers)} answers), got {len(correct)} verdicts"
        )
    counts: dict[Hashable, int] = {}
    first: dict[Hashable, int] = {}
    for i, (a, ok) in enumerate(zip(answers, correct)):
        if not isinstance(ok, (bool, np.bool_)):
            raise ValueError(f"correct[{i}]: expected a bool, got {ok!r}")
        if a is None:
            continue
        try:
            counts[a] = counts.get(a, 0) + 1
        except TypeError:
            raise ValueError(f"answers[{i}]: expected a hashable answer (e.g. str) or None, got {a!r}") from None
        first.setdefault(a, i)
    if not counts:
        return False
    # the plurality answer; among equal counts, the earliest first occurrence
    winner = min(counts, key=lambda a: (-counts[a], first[a]))
    return bool(correct[first[winner]])


def mean_pass_at_k(ns: Sequence[int], cs: Sequence[int], k: int) -> float:
    """Mean of :func:`pass_at_k` over problems: ``ns[j]`` samples of which ``cs[j]`` correct for problem ``j``."""
    if len(ns) != len(cs):
        raise ValueError(f"cs: expected one count per problem ({len(ns)} in ns), got {len(cs)}")
    if len(ns) == 0:
        raise ValueError("ns: expected at least one problem, got none")
    total = 0.0
    for j, (n, c) in enumerate(zip(ns, cs)):
        try:
            total += pass_at_k(n, c, k)
        except ValueError as exc:
            raise ValueError(f"problem {j}: {exc}") from None
    return total / len(ns)


def mean_majority_vote(
    answers_per_problem: Sequence[Sequence[Hashable | None]], correct_per_problem: Sequence[Sequence[bool]]
) -> float:
    """cons@k over problems: the fraction of problems whose :func:`majority_vote` is correct."""
    if len(answers_per_problem) != len(correct_per_problem):
        raise ValueError(
            f"correct_per_problem: expected one list per problem ({len(answers_per_problem)} problems), "
            f"got {len(correct_per_problem)}"
        )
    if len(answers_per_problem) == 0:
        raise ValueError("answers_per_problem: expected at least one problem, got none")
    hits = 0
    for j, (answers, correct) in enumerate(zip(answers_per_problem, correct_per_problem)):
        try:
            hits += majority_vote(answers, correct)
        except ValueError as exc:
            raise ValueError(f"problem {j}: {exc}") from None
    return hits / len(answers_per_problem)
