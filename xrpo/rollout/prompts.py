"""Rendering problems into the exact strings a rollout engine receives.

A `PromptRenderer` turns a `Problem` (plain text or chat messages) into the model's input, applying the tokenizer's chat
template when asked to, and builds the ICL-seeded variant of a prompt (paper, appendix "Breaking Symmetry via ICL
Seeding"). Two ICL styles:

- ``"paper"``: the paper's template (``<task>`` / ``<examples>`` / ``<new_problem>``) from `xrpo.icl.build_icl_prompt`,
  placed as the user message (wrapped in the chat template where there is one). This is the default for real models.
- ``"fewshot"``: the examples written in the task's own prompt format, each followed by its verified solution, then the
  new prompt. A model that was never instruction-tuned (the built-in tiny model) cannot read the XML template, but it
  can continue a few-shot pattern; the default run uses this.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xrpo.data import Problem
from xrpo.icl import build_icl_prompt

ICL_STYLES = ("paper", "fewshot")
FEWSHOT_POSITIONS = ("start", "question")


@dataclass
class RenderedICL:
    text: str
    truncated: int
    """Example solutions cut to fit ``max_prompt_tokens`` (the paper style cuts solutions; fewshot never does)."""
    num_examples: int
    dropped: int = 0
    """Retrieved examples left out to fit ``max_prompt_tokens`` (both styles drop the least similar first)."""


class PromptRenderer:
    """Renders problems for a given tokenizer.

    Args:
        tokenizer: a transformers tokenizer (used for the chat template and token counting).
        use_chat_template: wrap user content in ``tokenizer.apply_chat_template``. ``None`` = use it when the tokenizer
            has a chat template.
        icl_style: ``"paper"`` or ``"fewshot"`` (see the module docstring).
        prompt_template: a format string with ``{prompt}`` applied to the problem's user text before any chat template
            (e.g. ``"{prompt}\nPut your final answer within \\boxed{{}}."``; the default task uses
            ``"Q: {prompt}\nA:"``).
        max_prompt_tokens: budget for an ICL prompt; example solutions are truncated to fit (counted in ``truncated``).
        system_prompt: optional system message for chat models.
        fewshot_example: for ``"fewshot"``, a format string with ``{problem}`` (the example's problem text) and
            ``{solution}`` (its verified completion) that writes one solved example in the task's own prompt format;
            the default task uses ``"Q: {problem}\nA:{solution}"``.
        fewshot_position: for ``"fewshot"``, where the examples go: ``"start"`` (before the whole prompt, most
            similar first) or ``"question"`` (at the start of ``prompt_template``'s line holding ``{prompt}``, after
            any fixed shots the template holds, most similar last: next to the question). Needs a text prompt
            without a chat template.
    """

    def __init__(
        self,
        tokenizer,
        *,
        use_chat_template: bool | None = None,
        icl_style: str = "paper",
        prompt_template: str = "{prompt}",
        max_prompt_tokens: int | None = None,
        system_prompt: str | None = None,
        fewshot_example: str = "{problem}\n{solution}",
        fewshot_separator: str = "\n",
        fewshot_position: str = "start",
    ):
        if icl_style not in ICL_STYLES:
            raise ValueError(f"icl_style must be one of {ICL_STYLES}, got {icl_style!r}")
        if fewshot_position not in FEWSHOT_POSITIONS:
            raise ValueError(f"fewshot_position must be one of {FEWSHOT_POSITIONS}, got {fewshot_position!r}")
        self.tokenizer = tokenizer
        has_template = bool(getattr(tokenizer, "chat_template", None))
        self.use_chat_template = has_template if use_chat_template is None else bool(use_chat_template)
        if self.use_chat_template and not has_template:
            raise ValueError("use_chat_template=True but the tokenizer has no chat_template")
        self.icl_style = icl_style
        if "{prompt}" not in prompt_template:
            raise ValueError(f"prompt_template must contain {{prompt}}, got {prompt_template!r}")
        self.prompt_template = prompt_template
        self.max_prompt_tokens = max_prompt_tokens
        self.system_prompt = system_prompt
        self.fewshot_example = fewshot_example
        self.fewshot_separator = fewshot_separator
        self.fewshot_position = fewshot_position
        if icl_style == "fewshot" and fewshot_position == "question" and self.use_chat_template:
            raise ValueError(
                "fewshot_position='question' places the examples inside the prompt template's text, which a chat "
                "template would wrap as one user message; use 'start' or the 'paper' style with a chat template"
            )

    # -- plain prompts -------------------------------------------------------------------------------------------
    def _apply_template(self, text: str) -> str:
        return self.prompt_template.replace("{prompt}", text)

    def _messages(self, problem: Problem, user_text: str | None = None) -> list[dict]:
        if isinstance(problem.prompt, list) and user_text is None:
            msgs = [dict(m) for m in problem.prompt]
            last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
            msgs[last_user]["content"] = self._apply_template(msgs[last_user]["content"])
        else:
            msgs = [
                {
                    "role": "user",
                    "content": user_text if user_text is not None else self._apply_template(problem.prompt),
                }
            ]
        if self.system_prompt and not any(m["role"] == "system" for m in msgs):
            msgs = [{"role": "system", "content": self.system_prompt}] + msgs
        return msgs

    def _wrap(self, problem: Problem, user_text: str | None = None) -> str:
        if self.use_chat_template:
            return self.tokenizer.apply_chat_template(
                self._messages(problem, user_text), add_generation_prompt=True, tokenize=False
            )
        if user_text is not None:
            return user_text
        if isinstance(problem.prompt, list):
            # no chat template: concatenate message contents (system first), the documented fallback
            return "\n".join(m["content"] for m in self._messages(problem))
        return self._apply_template(problem.prompt)

    def render(self, problem: Problem) -> str:
        """The plain (zero-shot) prompt string for ``problem``."""
        return self._wrap(problem)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- ICL prompts ---------------------------------------------------------------------------------------------
    def render_icl(self, problem: Problem, examples: Sequence) -> RenderedICL:
        """The ICL-seeded prompt: ``examples`` are `xrpo.icl.Example` (problem, solution) pairs.

        With no examples it returns the plain prompt (the paper's zero-shot fallback).
        """
        if not examples:
            return RenderedICL(self.render(problem), 0, 0)
        if self.icl_style == "paper":
            budget = self.max_prompt_tokens
            # the chat template adds tokens around the user text; measure them once per call
            overhead = self.count_tokens(self._wrap(problem, "")) if (budget and self.use_chat_template) else 0
            icl = build_icl_prompt(
                problem.text,
                list(examples),
                count_tokens=self.count_tokens if budget else None,
                max_tokens=(budget - overhead) if budget else None,
            )
            return RenderedICL(self._wrap(problem, icl.text), icl.truncated, icl.num_examples, icl.dropped)
        return self._render_fewshot(problem, examples)

    def _render_fewshot(self, problem: Problem, examples: Sequence) -> RenderedICL:
        plain = self.render(problem)
        head, tail = "", plain
        if self.fewshot_position == "question":
            if not isinstance(problem.prompt, str):
                raise ValueError(
                    f"problem {problem.id}: fewshot_position='question' needs a text prompt, got chat messages"
                )
            # the template's text before the line holding {prompt} (its fixed shots) stays first; without a chat
            # template the plain prompt is the template applied, identical to the template up to that line
            cut = self.prompt_template.rfind("\n", 0, self.prompt_template.index("{prompt}")) + 1
            head, tail = plain[:cut], plain[cut:]
        sep = self.fewshot_separator
        shots = [self.fewshot_example.format(problem=ex.problem, solution=ex.solution) for ex in examples]

        def compose(shots: list[str]) -> str:
            ordered = shots[::-1] if self.fewshot_position == "question" else shots
            return head + sep.join(ordered) + sep + tail

        dropped = 0
        if self.max_prompt_tokens:
            # drop the least similar examples first (examples arrive most similar first) until the prompt fits;
            # a cut-off few-shot solution would teach a truncated answer, so fewshot never cuts inside one
            while shots and self.count_tokens(compose(shots)) > self.max_prompt_tokens:
                shots.pop()
                dropped += 1
        if not shots:
            return RenderedICL(plain, 0, 0, dropped)
        return RenderedICL(compose(shots), 0, len(shots), dropped)
