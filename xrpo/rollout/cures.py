"""CurES's state across steps: the Beta posterior of every training problem's accuracy, prompt selection from it,
per-prompt rollout counts, the posterior update after verification, and the warm-up ("precomputing prompt
difficulty") before training. The math is in `xrpo.algo.cures`; docs/methods.md (CurES) says where each rule comes
from and what differs from the authors' code.

The state is two integer arrays indexed by training-problem position (successes and rollouts so far): the posterior
follows from them and the prior, which the run's config holds. With ``keep="last"`` each visit of a problem replaces
its counts instead of adding to them: the last-visit history that the knapsack and xrpo-plus allocators read
(`xrpo.algo.rounds`): `last_visit_state`, `visit_history` and `observe_visit` are its one rule, kept by the
trainer's planner source and the verl driver alike. ``state_dict`` / ``load_state_dict`` turn it into
JSON-able lists for the checkpoint's state.json. It keeps no random state: the trainer draws each step's prompts with
a generator seeded from (seed, step), so a resumed run draws what the uninterrupted run drew.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from xrpo.algo.cures import beta_posterior, normalized_entropy, posterior_mean
from xrpo.algo.rounds import PromptHistory, cures_select
from xrpo.data import Problem
from xrpo.rollout.engine import RolloutEngine, SamplingParams
from xrpo.rollout.planner import generate_rollouts
from xrpo.rollout.prompts import PromptRenderer
from xrpo.rollout.records import PlanConfig, PlanResult


@dataclass
class CuresState:
    """Posterior counts of every training problem plus the knobs that turn them into prompts and counts."""

    successes: np.ndarray
    """s_i: rollouts of problem i with reward > ``success_threshold`` so far, int64 (N,)."""
    trials: np.ndarray
    """n_i: rollouts of problem i so far, int64 (N,)."""
    prior_alpha: float = 1.0
    prior_beta: float = 1.0
    temp_scale: float = 100.0
    min_count: int = 2
    success_threshold: float = 0.5
    warmup_rollouts: int = 0
    """Rollouts the warm-up spent (0 until it ran); reported so that budgets can be compared."""
    keep: str = "all"
    """"all": counts add up over every visit (CurES's posterior); "last": a visit replaces the problem's counts."""

    def __post_init__(self):
        if self.keep not in ("all", "last"):
            raise ValueError(f"keep must be 'all' or 'last', got {self.keep!r}")

    @classmethod
    def new(cls, num_problems: int, **knobs) -> CuresState:
        if num_problems < 1:
            raise ValueError(f"CurES needs at least one training problem, got {num_problems}")
        z = np.zeros(num_problems, dtype=np.int64)
        return cls(successes=z.copy(), trials=z.copy(), **knobs)

    @property
    def num_problems(self) -> int:
        return int(self.trials.shape[0])

    def posterior(self) -> tuple[np.ndarray, np.ndarray]:
        return beta_posterior(self.successes, self.trials, self.prior_alpha, self.prior_beta)

    # ------------------------------------------------------------------------------------------------ selection
    def select(self, k: int, budget: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, dict]:
        """Draw ``k`` distinct problems from the CurES distribution and their rollout counts (summing to ``budget``).

        Returns (problem indices in draw order, counts, cures/* metrics of the selection).
        """
        if k > self.num_problems:
            raise ValueError(
                f"CurES draws {k} distinct prompts per step without replacement, but the training set "
                f"has only {self.num_problems} problems (lower rollout.prompts_per_step)"
            )
        c = cures_select(
            self.successes,
            self.trials,
            k,
            budget,
            rng,
            prior_alpha=self.prior_alpha,
            prior_beta=self.prior_beta,
            temp_scale=self.temp_scale,
            min_count=self.min_count,
        )
        idx, counts, p, probs, sigma = c.idx, c.counts, c.p, c.probs, c.sigma
        metrics = {
            "cures/p_mean": float(p[idx].mean()),
            "cures/p_mean_all": float(p.mean()),
            "cures/seen_frac": float(np.mean(self.trials > 0)),
            "cures/entropy": normalized_entropy(probs),
            "cures/prob_max_rel": float(probs.max() * probs.shape[0]),
            "cures/sigma_mean": float(sigma.mean()),
            "cures/count_min": float(counts.min()),
            "cures/count_max": float(counts.max()),
        }
        return idx, counts, metrics

    # ------------------------------------------------------------------------------------------------ update
    def observe(self, problem_indices: Sequence[int], rewards, group_ids, mask=None) -> dict:
        """Add a step's verified rollouts to the posterior: rollout j belongs to problem problem_indices[group_ids[j]]
        and is a success when its reward exceeds ``success_threshold``; ``mask`` (bool, one per rollout; None: all)
        says which rollouts count. With ``keep="last"`` the counts of every problem with a counted rollout are
        replaced by this visit's. Returns cures/* metrics of the update."""
        idx = np.asarray(problem_indices, dtype=np.int64)
        r = np.asarray(rewards, dtype=np.float64)
        g = np.asarray(group_ids, dtype=np.int64)
        if r.shape != g.shape or r.ndim != 1:
            raise ValueError(f"rewards and group_ids must be 1-D of equal length, got {r.shape} and {g.shape}")
        if mask is not None:
            mk = np.asarray(mask)
            if mk.shape != r.shape or mk.dtype != bool:
                raise ValueError(
                    f"mask must be a bool array of the rewards' shape {r.shape}, got {mk.dtype} {mk.shape}"
                )
            r, g = r[mk], g[mk]
        if g.size and (g.min() < 0 or g.max() >= idx.shape[0]):
            raise ValueError(
                f"group_ids must index the {idx.shape[0]} problems of the step, got ids in [{g.min()}, {g.max()}]"
            )
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_problems):
            raise ValueError(f"problem indices must be in [0, {self.num_problems}), got [{idx.min()}, {idx.max()}]")
        if not np.all(np.isfinite(r)):
            raise ValueError("rewards must be finite")
        ok = (r > self.success_threshold).astype(np.int64)
        if self.keep == "last":
            seen = np.unique(idx[g])
            self.successes[seen] = 0
            self.trials[seen] = 0
        # per rollout: s_i += 1{r > threshold}, n_i += 1 (np.add.at: a problem may recur across generation calls)
        np.add.at(self.successes, idx[g], ok)
        np.add.at(self.trials, idx[g], 1)
        return {"cures/successes": float(ok.sum()), "cures/trials": float(r.size)}

    # ------------------------------------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        return {
            "successes": self.successes.tolist(),
            "trials": self.trials.tolist(),
            "warmup_rollouts": int(self.warmup_rollouts),
        }

    def load_state_dict(self, d: dict) -> None:
        try:
            s = np.asarray(d["successes"], dtype=np.int64)
            n = np.asarray(d["trials"], dtype=np.int64)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"checkpoint CurES state is malformed ({e}); expected lists 'successes' and 'trials'"
            ) from None
        if s.shape != (self.num_problems,) or n.shape != (self.num_problems,):
            raise ValueError(
                f"checkpoint CurES state covers {s.shape[0]} problems, the training set has "
                f"{self.num_problems}: was the run resumed with other training data?"
            )
        if np.any(s < 0) or np.any(s > n):
            raise ValueError("checkpoint CurES state is malformed: need 0 <= successes <= trials")
        self.successes, self.trials = s, n
        self.warmup_rollouts = int(d.get("warmup_rollouts", 0))


# ---------------------------------------------------------------------------------------------------- last visits
def last_visit_state(num_problems: int) -> CuresState:
    """Each training problem's last visit, for an allocator that reads history (``uses_history``: knapsack,
    xrpo-plus): a `CuresState` with keep="last" over ``num_problems`` problems, none visited yet."""
    return CuresState.new(num_problems, keep="last")


def visit_history(state: CuresState, idx) -> tuple[PromptHistory, dict]:
    """The planner's ``history`` for a step over the problems ``idx`` (positions in ``state``), and
    ``alloc/history_frac``: the share of them with a last visit (0 through the first epoch, where the allocators
    plan as for new prompts)."""
    idx = np.asarray(idx, dtype=np.int64)
    trials = state.trials[idx]
    return PromptHistory(state.successes[idx], trials), {"alloc/history_frac": float(np.mean(trials > 0))}


def observe_visit(state: CuresState, idx, plan: PlanResult, full_reward: float) -> None:
    """A step's visit of the problems ``idx`` (``plan.group_ids`` index into it) becomes their last visit: the
    successes (reward >= ``full_reward``) and rollouts of the step, ICL-seeded rollouts left out (they measure the
    ICL prompt, not the problem); a problem whose rollouts were all seeded keeps its earlier visit."""
    # 0/1 rewards against the state's threshold 0.5: a success is reward >= full_reward, whatever the threshold
    solved = (np.asarray(plan.rewards) >= full_reward).astype(np.float64)
    plain = np.array([not x.seeded for x in plan.records], dtype=bool)
    state.observe(idx, solved, plan.group_ids, mask=plain)


def warmup(
    state: CuresState,
    problems: Sequence[Problem],
    engine: RolloutEngine,
    verifier,
    renderer: PromptRenderer,
    n: int,
    sampling_for: Callable[[int], SamplingParams],
    prompts_per_call: int,
) -> dict:
    """CurES's precompute stage: ``n`` rollouts of every training problem with the initial model, verified and added
    to the posterior (CurES code, epic/stage_0_init_difficulty_sample_size.py ``init_difficulty``: "Initialize the
    difficulty distribution with `num_rollout_min` rollouts per prompt for all prompts in the dataset").

    Generated through the planner's caller-counted path (allocation="cures"), ``prompts_per_call`` problems per engine
    call; ``sampling_for(call)`` gives each call its sampling parameters (seed). Returns cures/* warm-up metrics.
    """
    if n < 1:
        raise ValueError(f"warm-up rollouts per problem must be >= 1, got {n}")
    t0 = time.perf_counter()
    spent = 0
    for call, start in enumerate(range(0, len(problems), prompts_per_call)):
        chunk = list(range(start, min(start + prompts_per_call, len(problems))))
        cfg = PlanConfig(rollouts_per_step=n * len(chunk), allocation="cures", icl=False, sharpen=False)
        res = generate_rollouts(
            [problems[i] for i in chunk], engine, verifier, renderer, cfg, sampling_for(call), counts=[n] * len(chunk)
        )
        state.observe(chunk, res.rewards, res.group_ids)
        spent += len(res.records)
    state.warmup_rollouts += spent
    alpha, beta = state.posterior()
    return {
        "cures/warmup_rollouts": float(spent),
        "cures/warmup_time_s": time.perf_counter() - t0,
        "cures/warmup_p_mean": float(posterior_mean(alpha, beta).mean()),
        "cures/warmup_solved_frac": float(np.mean(state.successes > 0)),
    }
