"""Fakes the planner's tests share: a character tokenizer, a scripted policy with known success rates, and rollout
records built by hand."""

from __future__ import annotations

import numpy as np

from xrpo.data import Problem
from xrpo.rollout.engine import Rollout, SamplingParams
from xrpo.rollout.prompts import PromptRenderer


def char_rollout(prompt: str, text: str, logprobs) -> Rollout:
    """A finished rollout of ``text`` from ``prompt``, one token id per character (as `CharTokenizer`)."""
    return Rollout(
        prompt_ids=[ord(c) for c in prompt],
        completion_ids=[ord(c) for c in text],
        logprobs=list(logprobs),
        finish_reason="eos",
        text=text,
    )


class CharTokenizer:
    """Enough of a tokenizer for the renderer: one id per character."""

    chat_template = None
    pad_token_id = 0
    eos_token_id = 1

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


class ScriptedPolicy:
    """Answers problem q correctly with probability p_plain[q] (p_icl[q] from an ICL prompt)."""

    def __init__(self, problems, p_plain, p_icl, seed=0):
        self.by_prompt = {f"Q: {p.prompt}\nA:": i for i, p in enumerate(problems)}
        self.problems, self.p_plain, self.p_icl = problems, p_plain, p_icl
        self.rng = np.random.default_rng(seed)
        self.calls: list[tuple[list[str], list[int]]] = []

    def _problem(self, prompt: str) -> tuple[int, bool]:
        if prompt in self.by_prompt:
            return self.by_prompt[prompt], False
        # an ICL (fewshot) prompt ends with the plain prompt
        for text, i in self.by_prompt.items():
            if prompt.endswith(text):
                return i, True
        raise AssertionError(f"unknown prompt {prompt!r}")

    def generate(self, prompts, counts, params):
        self.calls.append((list(prompts), list(counts)))
        out = []
        for prompt, n in zip(prompts, counts):
            q, icl = self._problem(prompt)
            p = (self.p_icl if icl else self.p_plain)[q]
            rs = []
            for _ in range(n):
                ok = self.rng.random() < p
                ans = self.problems[q].answer if ok else "-1"
                text = f" \\boxed{{{ans}}}"
                rs.append(char_rollout(prompt, text, -0.1 - self.rng.random(len(text))))
            out.append(rs)
        return out

    def sync_weights(self, model):
        pass


def problems_and_rates():
    probs = [Problem(id=f"p{i}", prompt=f"{i} + {i} = ?", answer=str(2 * i)) for i in range(16)]
    # 4 always solved, 4 never solved (but solvable from an ICL prompt), 8 in between
    p_plain = [1.0] * 4 + [0.0] * 4 + [0.5] * 8
    p_icl = [1.0] * 4 + [0.6] * 4 + [0.5] * 8
    return probs, p_plain, p_icl


def renderer():
    return PromptRenderer(
        CharTokenizer(),
        use_chat_template=False,
        icl_style="fewshot",
        prompt_template="Q: {prompt}\nA:",
        fewshot_example="Q: {problem}\nA:{solution}",
    )


SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=8)


def record(q: int, reward: float, text: str, seeded: bool = False, lps=(-0.5,), gen=(1,), train=(1,)):
    from xrpo.rollout.records import RolloutRecord

    return RolloutRecord(
        problem_index=q,
        group_id=q,
        round=int(seeded),
        seeded=seeded,
        gen_prompt_ids=list(gen),
        train_prompt_ids=list(train),
        completion_ids=[7] * len(lps),
        logprobs=list(lps),
        finish_reason="eos",
        text=text,
        reward=reward,
    )


def result(records):
    from xrpo.rollout.records import PlanResult

    return PlanResult(
        records=records,
        rewards=np.array([x.reward for x in records]),
        group_ids=np.array([x.group_id for x in records]),
    )


def plan_rollouts(problems, engine, verifier, renderer, cfg, sampling, *, corpus=None, step: int = 0):
    """Algorithm 1 in full, as the trainer runs it with the engine's log-probs for s(y): rollouts, advantages (set on
    the result, their metrics added), corpus update."""
    from xrpo.rollout.advantages import compute_advantages
    from xrpo.rollout.corpus import update_corpus
    from xrpo.rollout.planner import generate_rollouts

    result = generate_rollouts(problems, engine, verifier, renderer, cfg, sampling, corpus=corpus)
    result.advantages, metrics = compute_advantages(result, cfg)
    result.metrics.update(metrics)
    if cfg.icl and corpus is not None:
        result.metrics.update(update_corpus(result, problems, corpus, cfg, step))
        result.metrics["icl/corpus_problems"] = float(len(corpus))
    return result
