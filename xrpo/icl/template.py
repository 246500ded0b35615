"""The ICL prompt of the paper's Appendix "Breaking Symmetry via ICL Seeding", with truncation to a budget
(Appendix "Impact of Truncation on ICL Seeding").

The template has three parts: a ``<task>`` with general instructions, an ``<examples>`` block with up to two
``<example id="i">`` blocks each holding a ``<problem>`` and a verified ``<solution>``, and the ``<new_problem>``.
Layout, indentation and tags follow the appendix's verbatim block; the instruction is the appendix's sentence plus
one sentence on the answer format, which the appendix text says the model is told ("finally output the answer in a
standardized format (e.g., \\boxed{} for mathematics or fenced code blocks for programming)") but which the printed
template leaves out. `PAPER_INSTRUCTION` is the printed sentence alone.

Budget: "overly long example solutions are truncated as needed". When the prompt exceeds ``max_chars`` and/or
``max_tokens`` (counted with the caller's ``count_tokens``, e.g. the policy tokenizer's), the example SOLUTIONS are
cut, longest first: all solutions are capped at a common length L (so the longest is cut first, then the two longest
together, ...), with L the largest that fits, found by a safeguarded interpolation search (exact for a char budget,
where the prompt length never decreases as L grows; a token count is monotone in L in practice, and the result always
fits). The search interpolates before it bisects, so a token budget costs about half the ``count_tokens`` calls of
bisection. A cut solution keeps its first L characters (trailing whitespace removed) followed by ``marker``; a
solution no longer than L + len(marker) is left whole. If even ``min_solution_chars`` per solution does not fit, the
last (least similar) example is dropped and the whole procedure restarts with the remaining ones; with none left the
plain problem text is returned, the zero-shot fallback. ``ICLPrompt.truncated`` counts the solutions cut in the
returned prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_INSTRUCTION", "ICLPrompt", "PAPER_INSTRUCTION", "build_icl_prompt", "render_icl_template"]

PAPER_INSTRUCTION = (
    "You are given several worked examples, each with a <problem> and a <solution>. "
    "Extract a general strategy, then think through the new problem, and finally provide the detailed solution."
)
DEFAULT_INSTRUCTION = (
    PAPER_INSTRUCTION
    + " Give the final answer in the format the new problem requires (e.g. \\boxed{} for math, a fenced code block"
    " for code)."
)


@dataclass(frozen=True)
class ICLPrompt:
    text: str
    """The prompt (user content; the chat template is applied by the caller)."""
    truncated: int
    """Number of example solutions cut to fit the budget."""
    num_examples: int
    """Examples in ``text`` (0 = zero-shot fallback: ``text`` is the problem itself)."""
    dropped: int = 0
    """Examples left out because even cut solutions did not fit."""


def _pair(ex, i: int) -> tuple[str, str]:
    if isinstance(ex, tuple) and len(ex) == 2:
        problem, solution = ex
    elif hasattr(ex, "problem") and hasattr(ex, "solution"):
        problem, solution = ex.problem, ex.solution
    else:
        raise ValueError(
            f"examples[{i}] must be an Example (with .problem and .solution) or a (problem, solution) pair"
        )
    if not isinstance(problem, str) or not isinstance(solution, str):
        raise ValueError(f"examples[{i}]: problem and solution must be str")
    return problem, solution


def render_icl_template(
    problem_text: str, examples: Sequence[tuple[str, str]], instruction: str = DEFAULT_INSTRUCTION
) -> str:
    """The appendix template filled in, without any budget. ``examples`` are (problem, solution) pairs."""
    parts = [f"<task>\n {instruction}\n</task>\n\n<examples>\n"]
    for i, (p, s) in enumerate(examples, 1):
        parts.append(f' <example id="{i}">\n  <problem>{p}</problem>\n  <solution>{s}</solution>\n </example>\n')
    parts.append(f"</examples>\n\n<new_problem>{problem_text}</new_problem>")
    return "".join(parts)


def _cap(solution: str, limit: int, marker: str) -> str:
    # a solution is cut only when the cut, marker included, is shorter than the original: this keeps the prompt's
    # length non-decreasing in ``limit``, which the bisection relies on
    if len(solution) <= limit + len(marker):
        return solution
    return solution[:limit].rstrip() + marker


def build_icl_prompt(
    problem_text: str,
    examples: Sequence,
    *,
    max_chars: int | None = None,
    count_tokens: Callable[[str], int] | None = None,
    max_tokens: int | None = None,
    instruction: str = DEFAULT_INSTRUCTION,
    marker: str = " ...",
    min_solution_chars: int = 64,
) -> ICLPrompt:
    """The paper's ICL prompt for ``problem_text`` with ``examples`` (most similar first), fitted to the budget.

    Args:
        problem_text: the new problem.
        examples: `xrpo.icl.Example` objects or (problem, solution) pairs, most similar first (dropped from the end).
        max_chars: budget on ``len(text)``.
        count_tokens: counts the tokens of a string; required with ``max_tokens``.
        max_tokens: budget on ``count_tokens(text)``; leave room for the chat template the caller adds.
        instruction: the ``<task>`` text.
        marker: appended where a solution was cut.
        min_solution_chars: a solution is never cut shorter than this; below it the example is dropped instead.

    Returns:
        `ICLPrompt`. With no examples (or none fitting) the text is ``problem_text`` unchanged, even if it alone exceeds
        the budget (cutting the problem itself is the caller's decision).
    """
    if not isinstance(problem_text, str):
        raise ValueError(f"problem_text must be a str, got {type(problem_text).__name__}")
    if (max_tokens is None) != (count_tokens is None):
        raise ValueError("max_tokens and count_tokens must be given together (count_tokens measures the token budget)")
    for arg, v in (("max_chars", max_chars), ("max_tokens", max_tokens)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{arg} must be a positive int or None, got {v!r}")
    if isinstance(min_solution_chars, bool) or not isinstance(min_solution_chars, int) or min_solution_chars < 0:
        raise ValueError(f"min_solution_chars must be an int >= 0, got {min_solution_chars!r}")
    for arg, v in (("instruction", instruction), ("marker", marker)):
        if not isinstance(v, str):
            raise ValueError(f"{arg} must be a str, got {type(v).__name__}")
    if isinstance(examples, (str, bytes)) or not isinstance(examples, Sequence):
        raise ValueError(f"examples must be a sequence of examples, got {type(examples).__name__}")
    pairs = [_pair(ex, i) for i, ex in enumerate(examples)]

    n_total = len(pairs)
    while pairs:
        longest = max(len(s) for _, s in pairs)
        cache: dict[int, tuple[bool, float, str]] = {}

        def measure(limit: int, pairs=pairs, cache=cache) -> tuple[bool, float]:
            """Whether the prompt with solutions capped at ``limit`` fits, and its load (size / budget, the larger of
            chars and tokens); render(longest) is the uncut prompt."""
            if limit not in cache:
                text = render_icl_template(problem_text, [(p, _cap(s, limit, marker)) for p, s in pairs], instruction)
                ok, load = True, 0.0
                if max_chars is not None:
                    ok, load = len(text) <= max_chars, len(text) / max_chars
                if max_tokens is not None:
                    n = count_tokens(text)
                    ok, load = ok and n <= max_tokens, max(load, n / max_tokens)
                cache[limit] = (ok, load, text)
            return cache[limit][:2]

        if measure(longest)[0]:
            return ICLPrompt(cache[longest][2], 0, len(pairs), n_total - len(pairs))
        lo, hi = min(min_solution_chars, longest), longest
        if lo < hi and measure(lo)[0]:
            # invariant: cap lo fits, cap hi does not. The load is close to linear in the solutions' total capped
            # length C(L) = sum_i min(len_i, L + len(marker)) (piecewise linear in L, with a kink at each solution's
            # length), so each probe interpolates the load linearly in C between lo and hi and inverts C. A token
            # count costs a tokenizer call: on 300 random cases this took 7 calls on average (4 with a char budget)
            # where plain bisection over a few thousand characters takes ~14. Two probes in a row that fail to halve
            # the interval trigger a bisection step, which bounds the worst case.
            lens = [len(s) for _, s in pairs]

            def capped(limit: int, lens=lens) -> int:
                return sum(min(n, limit + len(marker)) for n in lens)

            stalls = 0
            while hi - lo > 1:
                width = hi - lo
                if stalls >= 2:
                    probe, stalls = (lo + hi) // 2, 0
                else:
                    l_lo, l_hi = cache[lo][1], cache[hi][1]
                    c_lo, c_hi = capped(lo), capped(hi)
                    target = c_lo + (1.0 - l_lo) * (c_hi - c_lo) / (l_hi - l_lo) if l_hi > l_lo else (c_lo + c_hi) / 2
                    # the largest cap in (lo, hi) whose C does not exceed the target (C is monotone: bisect on it)
                    a, b = lo + 1, hi - 1
                    if capped(a) > target:
                        probe = a
                    else:
                        while a < b:
                            mid = (a + b + 1) // 2
                            if capped(mid) <= target:
                                a = mid
                            else:
                                b = mid - 1
                        probe = a
                if measure(probe)[0]:
                    lo = probe
                else:
                    hi = probe
                stalls = stalls + 1 if hi - lo > width / 2 else 0
            cut = sum(len(s) > lo + len(marker) for _, s in pairs)
            return ICLPrompt(cache[lo][2], cut, len(pairs), n_total - len(pairs))
        pairs = pairs[:-1]
    return ICLPrompt(problem_text, 0, 0, n_total)
