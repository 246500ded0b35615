"""A run that cannot learn says so. GRPO's signal is the difference between a prompt's rollouts: when every prompt's
rollouts get the same reward (all wrong, or all right), every advantage is 0 and the step cannot move the policy by
its rewards. That is nearly always a setup problem, not bad luck: the model never writes its answer in the form the
verifier reads, the prompt template does not ask for it, the completions are cut before the answer, or the verifier
does not fit the data.

`ZeroSignalWatch` looks at each step's rollouts: after the first step without signal it prints what it saw and what
usually causes it, once; after ``stop_without_signal`` such steps in a row it raises `NoLearningSignal` with the same
account. (The update of such a step is left out when its gradient is exactly zero: `xrpo.trainer.update`.)
"""

from __future__ import annotations

from collections import Counter

from xrpo.trainer.config import TrainConfig

__all__ = ["NoLearningSignal", "ZeroSignalWatch", "without_signal"]


class NoLearningSignal(RuntimeError):
    """Raised after ``stop_without_signal`` steps in a row in which no prompt's rollouts differed in reward."""


def without_signal(metrics: dict) -> bool:
    """No prompt of the step had rollouts with different rewards: the step's ``rollout/zero_variance_group_frac`` is
    1, or (DAPO's dynamic sampling, which drops such groups) none was kept, so the batch holds no rollout."""
    return metrics.get("rollout/zero_variance_group_frac", 1.0) >= 1.0


class ZeroSignalWatch:
    """Counts the steps in a row without signal (`without_signal`); ``count`` is saved in checkpoints, so a resumed
    run stops where the uninterrupted one would."""

    def __init__(self, cfg: TrainConfig, count: int = 0, log=print):
        self.cfg, self.count, self.log = cfg, int(count), log
        self.said = False

    def observe(self, step: int, metrics: dict, records: list) -> None:
        """Account for step ``step`` (its logged metrics and its rollouts); raises `NoLearningSignal` at the limit."""
        if not without_signal(metrics):
            self.count = 0
            return
        self.count += 1
        limit = self.cfg.stop_without_signal
        if limit and self.count >= limit:
            first = step - self.count + 1
            raise NoLearningSignal(
                f"stopped after {self.count} steps in a row without a learning signal (steps {first}-{step}; "
                f"stop_without_signal={limit}): {self._account(step, metrics, records)}"
            )
        if not self.said:
            self.said = True
            stop = (
                f"The run stops after {limit} such steps in a row (stop_without_signal={limit}; 0: never)."
                if limit
                else "stop_without_signal=0: the run goes on."
            )
            self.log(f"warning: step {step}: no learning signal: {self._account(step, metrics, records)}\n  {stop}")

    def _account(self, step: int, metrics: dict, records: list) -> str:
        """What the step's rollouts showed, and the usual causes, each with the setting to look at."""
        cfg, d, r = self.cfg, self.cfg.data, self.cfg.rollout
        n = len(records)
        prompts = len({x.group_id for x in records})
        full = cfg.method.full_reward
        solved = sum(x.reward >= full for x in records)
        if not records:
            seen = "DAPO's dynamic sampling kept no prompt (every generated prompt's rollouts got the same reward)"
        elif solved == n:
            seen = f"all {n} rollouts of its {prompts} prompts were correct"
        elif solved == 0:
            seen = f"each of its {prompts} prompts got the same reward on all its rollouts ({n} rollouts, none correct)"
        else:
            seen = f"each of its {prompts} prompts was solved by all its rollouts or by none ({n} rollouts)"
        if not records:
            update = "nothing to update"
        elif metrics.get("loss/skipped_zero_advantage"):
            update = "the update was skipped: its gradient is exactly 0"
        elif cfg.method.kl_coef > 0:
            update = f"the update ran for its KL term alone, method.kl_coef={cfg.method.kl_coef}"
        else:
            update = f"the update ran for what method.policy_loss={cfg.method.policy_loss} adds to its advantages"
        lines = [f"{seen}, so every advantage is 0 ({update})."]
        if records and solved == n:
            lines.append(
                "  Every rollout was correct: the problems are too easy for this model, or the verifier "
                f"(data.verifier={d.verifier}) accepts anything."
            )
            return "\n".join(lines)
        reasons = Counter(x.verify_reason for x in records if x.reward < full and x.verify_reason)
        common = ", ".join(f"{k} {v}/{n}" for k, v in reasons.most_common(3))
        truncated = sum(x.finish_reason == "length" for x in records)
        if d.prompt_template is not None:
            template = f"data.prompt_template={d.prompt_template!r} does not ask for that format"
        elif d.train == "default":
            template = "the built-in task's template ('Q: {prompt}\\nA:') does not lead to that format"
        else:
            template = (
                "data.prompt_template is not set (each prompt is the problem's text alone): set one that asks for "
                "that format"
            )
        answered = sum(x.answer is not None and x.reward < full for x in records)
        if answered * 2 >= n:
            # most completions hold an answer the verifier read, and none is right: the format is not the problem
            lines.append(
                f"  The verifier read an answer in {answered} of {n} completions and none matched its reference: the "
                "problems may be too hard for this model, or the references are written otherwise than its answers."
            )
        lines += [
            "  What usually causes it:",
            f"  - answer format: the model does not write its answer the way data.verifier={d.verifier} reads it"
            + (f" (the verifier's reasons: {common})" if common else "")
            + "; compare the samples (samples.jsonl) with the references",
            f"  - prompt template: {template}",
            f"  - max_new_tokens: {truncated} of {n} completions were cut at rollout.max_new_tokens="
            f"{r.max_new_tokens} before they ended",
            f"  - verifier: data.verifier={d.verifier} does not fit these references",
        ]
        return "\n".join(lines)
