"""The paper's latency model of phased generation (XRPO appendix "Latency Analysis") and an engine-step model of one
step under one batch, rounds and streaming planning: the simulator's latency table (`xrpo.sim.runner.latency_rows`)
and the benchmarks' bound (`benchmarks/bench_step.py`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from xrpo.algo.signal import check_count

__all__ = ["latency_ratio", "phase_latency", "round_latency", "step_latency", "stream_latency"]


def round_latency(total: int, concurrency: int, rounds: int, t0: float = 1.0, dt: float = 0.0) -> tuple[float, float]:
    """Step time of one batch (T1) and of ``rounds`` equal generation rounds (T2), paper appendix "Latency Analysis".

    An engine runs ``concurrency`` (m_p) rollouts at once, each taking t0; planning costs dt per round.

        T1 = ceil(N / m_p) t0
        T2 = n (ceil((N / n) / m_p) t0 + dt)

    Args:
        total: N, rollouts of the step, >= 1; ``rounds`` must divide it (the paper's assumption).
        concurrency: m_p >= 1.
        rounds: n >= 1 generation rounds.
        t0: time per rollout, > 0.
        dt: planning time per round, >= 0.

    Returns:
        (T1, T2).
    """
    N, m, n = (
        check_count(total, "total", 1),
        check_count(concurrency, "concurrency", 1),
        check_count(rounds, "rounds", 1),
    )
    if N % n:
        raise ValueError(f"rounds={n} must divide total={N} (the paper's model has equal rounds); use phase_latency")
    _check_times(t0, dt)
    # T1 = ceil(N / m_p) t0
    t1 = math.ceil(N / m) * t0
    # T2 = n (ceil((N / n) / m_p) t0 + dt)
    t2 = n * (math.ceil((N // n) / m) * t0 + dt)
    return float(t1), float(t2)


def latency_ratio(total, concurrency, rounds, dt_over_t0: float = 0.0):
    """The paper's closed form of T2 / T1 (appendix "Latency Analysis"), ceilings replaced by their upper bound
    ceil(x / m_p) <= (x + m_p - 1) / m_p as the paper does:

        T2 / T1 = (N + n m_p - n + n m_p dt / t0) / (N + m_p - 1)
                = n - (n - 1) / (1 + (m_p - 1) / N)                        (dt = 0)

    which tends to 1 when m_p / N -> 0 and to n when m_p / N -> inf. Vectorised over the arguments (broadcast).

    Args:
        total: N > 0; concurrency: m_p >= 1; rounds: n >= 1; dt_over_t0: planning time per round in units of t0.
    """
    N = np.asarray(total, dtype=np.float64)
    m = np.asarray(concurrency, dtype=np.float64)
    n = np.asarray(rounds, dtype=np.float64)
    if np.any(N <= 0) or np.any(m < 1) or np.any(n < 1):
        raise ValueError("latency_ratio needs total > 0, concurrency >= 1 and rounds >= 1")
    if not (math.isfinite(dt_over_t0) and dt_over_t0 >= 0):
        raise ValueError(f"dt_over_t0 must be a finite number >= 0, got {dt_over_t0!r}")
    # T2 / T1 = ((N + n m_p - n) / m_p + n dt / t0) / ((N + m_p - 1) / m_p)
    r = (N + n * m - n + n * m * dt_over_t0) / (N + m - 1.0)
    return r[()] if r.ndim == 0 else r


def phase_latency(phase_sizes: Sequence[int], concurrency: int, t0: float = 1.0, dt: float = 0.0) -> float:
    """Step time of generation rounds of the given sizes, each ceil(size / m_p) t0 + dt (the paper's per-round cost,
    for rounds of unequal size such as XRPO's base round and planning rounds; a round of size 0 is not run)."""
    m = check_count(concurrency, "concurrency", 1)
    _check_times(t0, dt)
    sizes = _phase_sizes(phase_sizes)
    # sum over rounds of ceil(size / m_p) t0 + dt
    return float(sum(math.ceil(int(b) / m) * t0 + dt for b in sizes if b > 0))


def stream_latency(phase_sizes: Sequence[int], concurrency: int, t0: float = 1.0) -> float:
    """Step time of streaming planning (``rollout.planner=streaming``) in the paper's latency model: the ideal
    schedule's lower bound.

    Without a barrier between rounds, a free slot of the engine takes any prompt's next rollout, so the slots stay
    full (ceil(N / m_p) t0 in all) and planning happens while other rollouts decode (no dt); but each prompt's
    rounds still follow one another, each taking t0, so the step takes at least n t0 for n non-empty rounds:

        T3 = max(ceil(N / m_p), n) t0

    T3 = T1 when N / m_p >= n (a large batch on a small engine: the barrier's whole cost is saved) and T3 = T2 - n dt
    when m_p >= N (everything decodes at once: only the planning time is saved), the regime of a small model on a
    CPU. Rollouts of unequal length are `step_latency`'s case."""
    m = check_count(concurrency, "concurrency", 1)
    _check_times(t0, 0.0)
    sizes = _phase_sizes(phase_sizes)
    # T3 = max(ceil(N / m_p), n) t0
    return float(max(math.ceil(int(sizes.sum()) / m), int(np.count_nonzero(sizes))) * t0)


def _phase_sizes(phase_sizes: Sequence[int]) -> np.ndarray:
    sizes = np.asarray(phase_sizes, dtype=np.float64)
    if sizes.ndim != 1 or np.any(sizes < 0) or not np.all(sizes == np.round(sizes)):
        raise ValueError(f"phase_sizes must be whole numbers >= 0, got {phase_sizes!r}")
    return sizes


def _check_times(t0: float, dt: float) -> None:
    if not (math.isfinite(t0) and t0 > 0):
        raise ValueError(f"t0 must be a finite number > 0, got {t0!r}")
    if not (math.isfinite(dt) and dt >= 0):
        raise ValueError(f"dt must be a finite number >= 0, got {dt!r}")


def step_latency(group_lengths, step_cost: float = 1.0, token_cost: float = 0.0) -> dict[str, float]:
    """Generation time of one step under an engine-step model, for one batch (GRPO), rounds (Algorithm 1) and
    streaming planning, from the lengths of the step's rollouts.

    An engine decodes every admitted sequence one token per engine step, and a step costs ``step_cost`` plus
    ``token_cost`` per sequence in it (concurrency unbounded: the regime of a small model, where the paper's m_p
    does not bind). A group completes at its longest rollout. Then, with L[t][q] the lengths of prompt q's rollouts
    in round t (round 0: base) and M[t][q] = max L[t][q] (0 for an empty group):

        one batch   steps = max over every rollout of L
        rounds      steps = sum_t max_q M[t][q]            (each round waits for its slowest group)
        streaming   steps = max_q sum_t M[t][q]            (each prompt waits for its own groups only; the ideal
                                                            streaming schedule: no quorum, planning takes no time)
        time = step_cost * steps + token_cost * sum of every L      (the token work is the same for all three)

    Streaming's steps lie between the two bounds max(one batch, max_q sum_t M) and rounds'; the chain of 1 + rounds
    dependent groups per prompt stays. Vectorised over nothing: the inputs are one step's lengths.

    Args:
        group_lengths: ``group_lengths[t][q]``: sequence of the lengths (engine steps, >= 0 whole numbers) of prompt
            q's rollouts in round t; every round lists the same prompts.
        step_cost: cost of one engine step, >= 0.
        token_cost: cost of one sequence in one engine step, >= 0.

    Returns:
        {"steps_batch", "steps_rounds", "steps_streaming", "time_batch", "time_rounds", "time_streaming"}.
    """
    if not (math.isfinite(step_cost) and step_cost >= 0 and math.isfinite(token_cost) and token_cost >= 0):
        raise ValueError(f"step_cost and token_cost must be finite numbers >= 0, got {step_cost!r}, {token_cost!r}")
    rounds = [[np.asarray(g, dtype=np.float64).reshape(-1) for g in r] for r in group_lengths]
    if not rounds or any(len(r) != len(rounds[0]) for r in rounds) or not rounds[0]:
        raise ValueError("group_lengths must list the same prompts (at least one) in every round")
    for r in rounds:
        for g in r:
            if np.any(g < 0) or not np.all(g == np.round(g)):
                raise ValueError(f"lengths must be whole numbers >= 0, got {g.tolist()!r}")
    # M[t][q] = max L[t][q], 0 for an empty group
    M = np.array([[g.max() if g.size else 0.0 for g in r] for r in rounds])
    tokens = float(sum(g.sum() for r in rounds for g in r))
    steps = {
        "batch": float(M.max()),  # max over every rollout
        "rounds": float(M.max(axis=1).sum()),  # sum_t max_q M[t][q]
        "streaming": float(M.sum(axis=0).max()),  # max_q sum_t M[t][q]
    }
    out = {f"steps_{k}": v for k, v in steps.items()}
    out.update({f"time_{k}": step_cost * v + token_cost * tokens for k, v in steps.items()})
    return out
