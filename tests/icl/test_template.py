"""The appendix ICL template: exact text, zero-shot fallback, truncation to a char / token budget."""

import numpy as np
import pytest

from xrpo.icl import DEFAULT_INSTRUCTION, PAPER_INSTRUCTION, Example, build_icl_prompt

EXPECTED_TWO = (
    "<task>\n"
    " You are given several worked examples, each with a <problem> and a <solution>. Extract a general strategy, "
    "then think through the new problem, and finally provide the detailed solution. Give the final answer in the "
    "format the new problem requires (e.g. \\boxed{} for math, a fenced code block for code).\n"
    "</task>\n"
    "\n"
    "<examples>\n"
    ' <example id="1">\n'
    "  <problem>What is 2 + 3?</problem>\n"
    "  <solution>2 + 3 = 5, so the answer is \\boxed{5}.</solution>\n"
    " </example>\n"
    ' <example id="2">\n'
    "  <problem>What is 4 * 6?</problem>\n"
    "  <solution>4 * 6 = 24. \\boxed{24}</solution>\n"
    " </example>\n"
    "</examples>\n"
    "\n"
    "<new_problem>What is 7 - 2?</new_problem>"
)

EXAMPLES = [
    Example("a", "What is 2 + 3?", "2 + 3 = 5, so the answer is \\boxed{5}.", 0.9),
    Example("b", "What is 4 * 6?", "4 * 6 = 24. \\boxed{24}", 0.8),
]


def test_two_example_exact_text():
    p = build_icl_prompt("What is 7 - 2?", EXAMPLES)
    assert p.text == EXPECTED_TWO
    assert (p.truncated, p.num_examples, p.dropped) == (0, 2, 0)
    # (problem, solution) pairs are accepted as well
    assert build_icl_prompt("What is 7 - 2?", [(e.problem, e.solution) for e in EXAMPLES]).text == EXPECTED_TWO


def test_paper_instruction_and_custom_instruction():
    assert PAPER_INSTRUCTION in DEFAULT_INSTRUCTION and "\\boxed{}" in DEFAULT_INSTRUCTION
    p = build_icl_prompt("Q?", EXAMPLES[:1], instruction=PAPER_INSTRUCTION)
    assert p.text.startswith("<task>\n " + PAPER_INSTRUCTION + "\n</task>\n\n<examples>\n")
    p = build_icl_prompt("Q?", EXAMPLES[:1], instruction="Write Python; answer in a ```python block.")
    assert p.text.startswith("<task>\n Write Python; answer in a ```python block.\n</task>")


def test_zero_examples_is_the_plain_problem():
    p = build_icl_prompt("What is 7 - 2?", [])
    assert (p.text, p.truncated, p.num_examples) == ("What is 7 - 2?", 0, 0)


def test_char_budget_truncates_longest_solution_first():
    long_sol = "L" * 400
    short_sol = "S" * 100
    exs = [("P1?", long_sol), ("P2?", short_sol)]
    full = build_icl_prompt("Q?", exs).text
    # 150 characters over budget: the longest solution alone is cut, from 400 to 400 - 150 - len(" ...") = 246
    p = build_icl_prompt("Q?", exs, max_chars=len(full) - 150)
    assert len(p.text) == len(full) - 150
    assert (p.truncated, p.num_examples) == (1, 2)
    assert "<solution>" + "L" * 246 + " ...</solution>" in p.text
    assert "<solution>" + short_sol + "</solution>" in p.text
    # 350 over budget: both are capped at a common length L with (L + 4) + (L + 4) = 500 - 350 -> L = 71
    p = build_icl_prompt("Q?", exs, max_chars=len(full) - 350)
    assert (p.truncated, p.num_examples) == (2, 2)
    assert "<solution>" + "L" * 71 + " ...</solution>" in p.text
    assert "<solution>" + "S" * 71 + " ...</solution>" in p.text
    assert len(p.text) == len(full) - 350
    # one character over: the cut must remove len(" ...") + 1 characters, 100 -> 95 + " ..."
    p = build_icl_prompt("Q?", [("P?", "L" * 100)], max_chars=len(build_icl_prompt("Q?", [("P?", "L" * 100)]).text) - 1)
    assert p.truncated == 1 and "L" * 95 + " ...</solution>" in p.text


def test_cut_keeps_the_beginning_and_strips_trailing_space():
    sol = "first step. second step. third step. " * 10
    full = build_icl_prompt("Q?", [("P?", sol)]).text
    p = build_icl_prompt("Q?", [("P?", sol)], max_chars=len(full) - 100, marker="[...]")
    kept = p.text.split("  <solution>")[1].split("</solution>")[0]  # the instruction mentions <solution> too
    assert kept.endswith("[...]") and sol.startswith(kept[: -len("[...]")])
    assert not kept[: -len("[...]")].endswith(" ")
    assert len(p.text) <= len(full) - 100


def test_drops_least_similar_examples_when_cutting_is_not_enough():
    exs = [("P1?" * 30, "a" * 300), ("P2?" * 30, "b" * 300)]
    one = build_icl_prompt("Q?", exs[:1]).text
    # room for example 1 with its solution cut, but not for both even at min_solution_chars
    p = build_icl_prompt("Q?", exs, max_chars=len(one) - 50)
    assert (p.num_examples, p.dropped, p.truncated) == (1, 1, 1)
    assert "P1?" in p.text and "P2?" not in p.text and '<example id="1">' in p.text
    # nothing fits: zero-shot fallback, the problem unchanged
    p = build_icl_prompt("Q?", exs, max_chars=60)
    assert (p.text, p.num_examples, p.dropped, p.truncated) == ("Q?", 0, 2, 0)


def test_min_solution_chars_floor():
    exs = [("P?", "x" * 300)]
    full = build_icl_prompt("Q?", exs).text
    # cutting to 100 characters would fit, but the floor is 200: the example is dropped instead
    p = build_icl_prompt("Q?", exs, max_chars=len(full) - 200 + 4, min_solution_chars=200)
    assert p.num_examples == 0 and p.text == "Q?"
    p = build_icl_prompt("Q?", exs, max_chars=len(full) - 200 + 4, min_solution_chars=50)
    assert (p.num_examples, p.truncated) == (1, 1)
    assert "x" * 100 + " ...</solution>" in p.text


def reference_fit(problem, pairs, fits, marker=" ...", floor=64):
    """Slow twin: try every cap L from the largest down, dropping trailing examples when none fits."""
    from xrpo.icl.template import render_icl_template

    pairs = list(pairs)
    while pairs:
        longest = max(len(s) for _, s in pairs)
        for cap in range(longest, min(floor, longest) - 1, -1):
            sols = [s if len(s) <= cap + len(marker) else s[:cap].rstrip() + marker for _, s in pairs]
            text = render_icl_template(problem, [(p, s) for (p, _), s in zip(pairs, sols)])
            if fits(text):
                return text, sum(a != b for (_, a), b in zip(pairs, sols)), len(pairs)
        pairs = pairs[:-1]
    return problem, 0, 0


def random_case(seed):
    rng = np.random.default_rng(seed)
    vocab = ["alpha", "beta", "x", "=", "12", "so", "then", "\\frac{1}{2}", " ", "\n"]

    def words(n):
        return " ".join(rng.choice(vocab, size=n))

    n_ex = int(rng.integers(1, 3))
    pairs = [(words(int(rng.integers(3, 20))), words(int(rng.integers(5, 120)))) for _ in range(n_ex)]
    return words(10), pairs


@pytest.mark.parametrize("seed", range(6))
def test_char_budget_matches_reference_twin(seed):
    problem, pairs = random_case(seed)
    full = build_icl_prompt(problem, pairs).text
    for budget in sorted({max(1, len(full) - d) for d in (0, 1, 7, 50, 200, 400, 900)}):
        p = build_icl_prompt(problem, pairs, max_chars=budget)
        # the prompt length never decreases with the cap, so bisection finds the same largest cap as the linear scan
        assert (p.text, p.truncated, p.num_examples) == reference_fit(problem, pairs, lambda t, b=budget: len(t) <= b)
        assert p.num_examples == 0 or len(p.text) <= budget


@pytest.mark.parametrize("seed", range(6))
def test_token_budget_is_respected(seed):
    problem, pairs = random_case(seed)

    def count_tokens(s):  # a whitespace "tokenizer": the budget is in words
        return len(s.split())

    full = build_icl_prompt(problem, pairs).text
    for budget in sorted({max(1, count_tokens(full) - d) for d in (0, 5, 30, 80, 200)}):
        p = build_icl_prompt(problem, pairs, count_tokens=count_tokens, max_tokens=budget)
        ref_text, ref_cut, ref_n = reference_fit(problem, pairs, lambda t, b=budget: count_tokens(t) <= b)
        assert p.num_examples == ref_n
        if p.num_examples:
            assert count_tokens(p.text) <= budget
            # at most one word-sized step short of the largest cap: the marker adds a token, so the word count is
            # not exactly monotone in the cap, and bisection may stop just below the linear scan's answer
            assert count_tokens(p.text) >= count_tokens(ref_text) - 2
            assert p.truncated == sum(s not in p.text for _, s in pairs[: p.num_examples])
        else:
            assert p.text == problem


def test_both_budgets_apply():
    exs = [("P?", "word " * 200)]
    full = build_icl_prompt("Q?", exs).text
    p = build_icl_prompt("Q?", exs, max_chars=len(full), count_tokens=lambda s: len(s.split()), max_tokens=100)
    assert len(p.text.split()) <= 100 and p.truncated == 1


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_tokens and count_tokens must be given together"):
        build_icl_prompt("Q?", EXAMPLES, max_tokens=10)
    with pytest.raises(ValueError, match="max_tokens and count_tokens must be given together"):
        build_icl_prompt("Q?", EXAMPLES, count_tokens=len)
    with pytest.raises(ValueError, match="max_chars must be a positive int"):
        build_icl_prompt("Q?", EXAMPLES, max_chars=0)
    with pytest.raises(ValueError, match=r"examples\[1\] must be an Example"):
        build_icl_prompt("Q?", [EXAMPLES[0], "just a string"])
    with pytest.raises(ValueError, match="problem_text must be a str"):
        build_icl_prompt(None, EXAMPLES)
