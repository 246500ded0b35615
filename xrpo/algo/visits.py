"""Each training problem's outcomes across steps, as counts: the one state behind CurES's posterior, the last visit
that the knapsack and xrpo-plus allocators read, and Knapsack RL's window of latest rewards
(`xrpo.algo.knapsack_rl.recent_rate`; the window an allocator reads is `xrpo.algo.rounds.history_window`).

The state is two integer arrays indexed by training-problem position (successes and rollouts so far): CurES's
posterior follows from them and the prior (`xrpo.algo.cures`). With ``keep="last"`` each visit of a problem replaces
its counts instead of adding to them: `last_visit_state` and `visit_history` are the last-visit history's one rule,
kept by the trainer's planner source (`xrpo.rollout.sources`), the verl driver and the simulator alike; what counts as
a problem's visit in training (ICL-seeded rollouts left out) is `xrpo.rollout.cures.observe_visit`. With a ``window``
it also keeps each problem's latest ``window`` outcomes across visits and how many it has had in all.
``state_dict`` / ``load_state_dict`` turn it into JSON-able lists for a checkpoint's state.json. It keeps no random
state: the trainer draws each step's prompts with a generator seeded from (seed, step), so a resumed run draws what
the uninterrupted run drew. Pure: numpy arrays in and out, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xrpo.algo.cures import beta_posterior, normalized_entropy
from xrpo.algo.rounds import PromptHistory, cures_select


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
    window: int = 0
    """Latest outcomes (0/1) of each problem kept across visits, newest last (0: none; Knapsack RL's estimate)."""
    recent: np.ndarray | None = None
    """(N, window) int8: each problem's latest min(observed, window) outcomes, right-aligned (None without a window)."""
    observed: np.ndarray | None = None
    """(N,) int64: each problem's counted rollouts over every visit (None without a window)."""

    def __post_init__(self):
        if self.keep not in ("all", "last"):
            raise ValueError(f"keep must be 'all' or 'last', got {self.keep!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, (int, np.integer)) or self.window < 0:
            raise ValueError(f"window must be an integer >= 0, got {self.window!r}")
        if self.window and self.recent is None:
            self.recent = np.zeros((self.num_problems, self.window), dtype=np.int8)
            self.observed = np.zeros(self.num_problems, dtype=np.int64)

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
        if self.window:
            self._slide(idx[g], ok)
        return {"cures/successes": float(ok.sum()), "cures/trials": float(r.size)}

    def _slide(self, problem_of: np.ndarray, ok: np.ndarray) -> None:
        """Append each problem's outcomes ``ok`` (in the order given: the rollouts' order) to its window."""
        W = self.window
        for i in np.unique(problem_of):
            new = ok[problem_of == i].astype(np.int8)
            row = np.concatenate([self.recent[i], new])[-W:]
            self.recent[i] = row
            self.observed[i] += new.shape[0]

    def recent_counts(self, idx) -> tuple[np.ndarray, np.ndarray]:
        """(successes among, number of) the latest min(observed, window) outcomes of the problems ``idx``."""
        idx = np.asarray(idx, dtype=np.int64)
        held = np.minimum(self.observed[idx], self.window)
        cols = np.arange(self.window)[None, :] >= (self.window - held)[:, None]  # the right-aligned filled cells
        return (self.recent[idx] * cols).sum(axis=1).astype(np.int64), held

    # ------------------------------------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        out = {
            "successes": self.successes.tolist(),
            "trials": self.trials.tolist(),
            "warmup_rollouts": int(self.warmup_rollouts),
        }
        if self.window:
            # each problem's window as a string of 0/1, oldest first, min(observed, window) long
            held = np.minimum(self.observed, self.window)
            out["window"] = int(self.window)
            out["observed"] = self.observed.tolist()
            out["recent"] = ["".join(map(str, row[self.window - h :].tolist())) for row, h in zip(self.recent, held)]
        return out

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
        recent = self._load_window(d, n) if self.window else None
        self.successes, self.trials = s, n
        if recent is not None:
            self.recent, self.observed = recent
        self.warmup_rollouts = int(d.get("warmup_rollouts", 0))

    def _load_window(self, d: dict, trials: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The window of a state dict, checked against this state's ``window`` and the problems' last visits."""
        W = self.window
        if "recent" not in d or "observed" not in d:
            raise ValueError(
                f"checkpoint history keeps no latest rewards per problem ('recent', 'observed'), which this run "
                f"reads (the latest {W}): it was written by a run whose allocation reads only the last visit"
            )
        if d.get("window") != W:
            raise ValueError(
                f"checkpoint history keeps each problem's latest {d.get('window')!r} rewards, this run reads the "
                f"latest {W}: resume with the window the run was started with"
            )
        try:
            obs = np.asarray(d["observed"], dtype=np.int64)
            rows = [str(x) for x in d["recent"]] if isinstance(d["recent"], list) else None
        except (TypeError, ValueError):
            obs, rows = None, None
        if obs is None or rows is None or obs.shape != (self.num_problems,) or len(rows) != self.num_problems:
            raise ValueError(
                f"checkpoint history is malformed: expected 'observed' and 'recent', one entry per problem "
                f"({self.num_problems})"
            )
        recent = np.zeros((self.num_problems, W), dtype=np.int8)
        for i, (row, o) in enumerate(zip(rows, obs.tolist())):
            if len(row) != min(o, W) or set(row) - {"0", "1"} or o < trials[i]:
                raise ValueError(
                    f"checkpoint history is malformed at problem {i}: 'recent' must be min(observed, {W}) 0/1 "
                    f"outcomes and 'observed' at least the last visit's rollouts, got {row!r} and {o}"
                )
            if row:
                recent[i, W - len(row) :] = [int(c) for c in row]
        return recent, obs


# ---------------------------------------------------------------------------------------------------- last visits
def last_visit_state(num_problems: int, window: int = 0) -> CuresState:
    """Each training problem's last visit, for an allocator that reads history (``uses_history``: knapsack,
    xrpo-plus): a `CuresState` with keep="last" over ``num_problems`` problems, none visited yet; with ``window``
    (`xrpo.algo.rounds.history_window` of the method's knobs), also each problem's latest ``window`` outcomes."""
    return CuresState.new(num_problems, keep="last", window=window)


def visit_history(state: CuresState, idx) -> tuple[PromptHistory, dict]:
    """The planner's ``history`` for a step over the problems ``idx`` (positions in ``state``), and
    ``alloc/history_frac``: the share of them with a last visit (0 through the first epoch, where the allocators
    plan as for new prompts)."""
    idx = np.asarray(idx, dtype=np.int64)
    trials = state.trials[idx]
    recent = {}
    if state.window:
        rs, rt = state.recent_counts(idx)
        recent = {"recent_successes": rs, "recent_trials": rt, "observed": state.observed[idx].copy()}
    return PromptHistory(state.successes[idx], trials, **recent), {"alloc/history_frac": float(np.mean(trials > 0))}
