"""The appendix ICL template: exact text, zero-shot fallback, truncation to a char / token budget."""

import math
import re

import numpy as np
import pytest

from xrpo.icl import DEFAULT_INSTRUCTION, PAPER_INSTRUCTION, Example, ICLPrompt, build_icl_prompt

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


def test_icl_prompt_is_frozen_and_dropped_defaults_to_zero():
    import dataclasses

    p = ICLPrompt("Q?", 0, 0)
    assert p.dropped == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.text = "other"


def test_example_forms_and_non_str_fields_are_refused():
    class OnlyProblem:
        problem = "P?"

    class Both:
        problem = "What is 2 + 3?"
        solution = "2 + 3 = 5, so the answer is \\boxed{5}."

    # any object with .problem AND .solution is an example; one attribute alone is not
    assert build_icl_prompt("What is 7 - 2?", [Both(), EXAMPLES[1]]).text == EXPECTED_TWO
    with pytest.raises(ValueError, match=r"examples\[0\] must be an Example"):
        build_icl_prompt("Q?", [OnlyProblem()])
    with pytest.raises(ValueError, match=r"examples\[0\] must be an Example"):
        build_icl_prompt("Q?", [("P?", "S", "extra")])
    # a non-str problem OR a non-str solution is refused, whichever of the two it is
    with pytest.raises(ValueError, match=r"examples\[1\]: problem and solution must be str"):
        build_icl_prompt("Q?", [("P?", "S"), (5, "S")])
    with pytest.raises(ValueError, match=r"examples\[0\]: problem and solution must be str"):
        build_icl_prompt("Q?", [("P?", 5)])


def test_budget_arguments_are_keyword_only():
    with pytest.raises(TypeError):
        build_icl_prompt("Q?", EXAMPLES, 100)


@pytest.mark.parametrize("bad", [True, 10.0, "10", -3, 0])
def test_budgets_must_be_positive_ints(bad):
    with pytest.raises(ValueError, match=r"max_chars must be a positive int or None, got " + re.escape(repr(bad))):
        build_icl_prompt("Q?", EXAMPLES, max_chars=bad)
    with pytest.raises(ValueError, match=r"max_tokens must be a positive int or None, got " + re.escape(repr(bad))):
        build_icl_prompt("Q?", EXAMPLES, count_tokens=len, max_tokens=bad)
    # the smallest budget is allowed (nothing fits it: the zero-shot fallback)
    assert build_icl_prompt("Q?", EXAMPLES, max_chars=1) == ICLPrompt("Q?", 0, 0, 2)


def test_min_solution_chars_default_and_bounds():
    exs = [("P?", "x" * 300)]
    full = len(build_icl_prompt("Q?", exs).text)
    # a cap L cuts the 300 characters to L + len(" ...") = L + 4, so the prompt is full - 300 + L + 4 long.
    # max_chars = full - 232 fits L = 64 exactly: the default floor (64) keeps the example
    p = build_icl_prompt("Q?", exs, max_chars=full - 232)
    assert (p.truncated, p.num_examples, p.dropped) == (1, 1, 0)
    assert "<solution>" + "x" * 64 + " ...</solution>" in p.text and len(p.text) == full - 232
    # max_chars = full - 233 needs L = 63, below the default floor: dropped; with the floor at 63 it is kept
    assert build_icl_prompt("Q?", exs, max_chars=full - 233) == ICLPrompt("Q?", 0, 0, 1)
    p = build_icl_prompt("Q?", exs, max_chars=full - 233, min_solution_chars=63)
    assert "<solution>" + "x" * 63 + " ...</solution>" in p.text and p.truncated == 1
    # a floor of 0 is allowed: L = 0 leaves the marker alone, full - 300 + 4
    p = build_icl_prompt("Q?", exs, max_chars=full - 296, min_solution_chars=0)
    assert (p.truncated, p.num_examples) == (1, 1) and "<solution> ...</solution>" in p.text
    assert len(p.text) == full - 296
    with pytest.raises(ValueError, match="min_solution_chars must be an int >= 0, got -1"):
        build_icl_prompt("Q?", exs, min_solution_chars=-1)


def test_truncated_counts_only_solutions_actually_cut():
    exs = [("P1?", "L" * 400), ("P2?", "S" * 100)]
    full = len(build_icl_prompt("Q?", exs).text)
    # cap L = 96: the 400 becomes 96 + 4 = 100 characters; the 100 is not longer than L + len(" ...") = 100, so it
    # stays whole: prompt = full - 400 + 100 = full - 300. L = 97 would give 101 > 100 characters, so 96 is the answer
    # and exactly one solution is cut
    p = build_icl_prompt("Q?", exs, max_chars=full - 300)
    assert "<solution>" + "L" * 96 + " ...</solution>" in p.text and "<solution>" + "S" * 100 + "</solution>" in p.text
    assert (p.truncated, p.num_examples, p.dropped) == (1, 2, 0) and len(p.text) == full - 300


def reference_scan(problem, pairs, marker=" ...", floor=64):
    """Every prompt `reference_fit` tries, in its order, as (text, cut, num_examples): the answer for a budget is the
    first that fits. Built once, it answers a dense sweep of budgets without rendering again."""
    from xrpo.icl.template import render_icl_template

    pairs, out = list(pairs), []
    while pairs:
        longest = max(len(s) for _, s in pairs)
        for cap in range(longest, min(floor, longest) - 1, -1):
            sols = [s if len(s) <= cap + len(marker) else s[:cap].rstrip() + marker for _, s in pairs]
            text = render_icl_template(problem, [(p, s) for (p, _), s in zip(pairs, sols)])
            out.append((text, sum(a != b for (_, a), b in zip(pairs, sols)), len(pairs)))
        pairs = pairs[:-1]
    return out


def first_fit(scan, problem, fits):
    return next((entry for entry in scan if fits(entry[0])), (problem, 0, 0))


def worst_case_calls(pairs, floor=64):
    """The most budget measurements (count_tokens calls) a fit of all of ``pairs`` may take, from the search's comment:
    one for the uncut prompt, one for the floor, then the probes. Every probe lies strictly inside the interval
    (lo, hi) of width w (so each is a new cap, measured once), and either halves it (w' <= w/2), or is a bisection
    step (w' <= ceil(w/2)), or is one of at most two probes in a row that fail to halve it before a bisection step.
    A halving or bisection step lowers ceil(log2 w) by at least 1, the others never raise it, and the last probe
    (w -> 1) halves, so at most 3 * ceil(log2 w0) probes."""
    longest = max(len(s) for _, s in pairs)
    w0 = longest - min(floor, longest)
    return 2 + 3 * math.ceil(math.log2(w0)) if w0 > 1 else 2


class CountingTokens:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, s):
        self.calls += 1
        return self.fn(s)


@pytest.mark.parametrize("seed", range(4))
def test_every_budget_gets_the_largest_fitting_cap(seed):
    # "L the largest that fits": exact for a char budget (the prompt length never decreases as L grows) and for any
    # token count monotone in the length; checked at every budget of a range, so a search stopping one cap short at
    # any width shows
    problem, pairs = random_case(seed)
    scan = reference_scan(problem, pairs)
    full = len(build_icl_prompt(problem, pairs).text)
    for budget in range(full, max(0, full - 1000), -1):
        p = build_icl_prompt(problem, pairs, max_chars=budget)
        assert (p.text, p.truncated, p.num_examples) == first_fit(scan, problem, lambda t, b=budget: len(t) <= b)
        assert p.dropped == len(pairs) - p.num_examples

    def quarter(s):  # ceil(len / 4): monotone in the length, but flat over steps of 4 characters
        return (len(s) + 3) // 4

    for budget in range((full + 3) // 4, max(0, (full + 3) // 4 - 250), -1):
        count = CountingTokens(quarter)
        p = build_icl_prompt(problem, pairs, count_tokens=count, max_tokens=budget)
        assert (p.text, p.truncated, p.num_examples) == first_fit(scan, problem, lambda t, b=budget: quarter(t) <= b)
        if p.num_examples == len(pairs):
            assert count.calls <= worst_case_calls(pairs)


@pytest.mark.parametrize("high", [False, True])
@pytest.mark.parametrize("answer", [64, 65, 70, 100, 333, 600, 900, 990, 995])
def test_search_worst_case_with_a_step_tokenizer(answer, high):
    # a token count that is monotone in the length but nothing like linear in it: a step at the length of the prompt
    # whose solution is cut at ``answer`` (1000 - answer - 4 characters shorter than the uncut prompt). Below the step
    # the count is 1 (interpolation aims just below hi: every probe above the answer fails by one cap) or the length
    # itself with a huge count above (interpolation aims just above lo). The answer is still the largest fitting cap,
    # within the documented worst case
    sol = "x" * 1000
    full = len(build_icl_prompt("Q?", [("P?", sol)]).text)
    step = full - 1000 + answer + 4
    budget = step if high else 10**6
    count = CountingTokens(lambda s: (len(s) if high else 1) if len(s) <= step else 10**9 if high else budget + 1)
    p = build_icl_prompt("Q?", [("P?", sol)], count_tokens=count, max_tokens=budget)
    assert (p.truncated, p.num_examples) == (1, 1)
    assert "<solution>" + "x" * answer + " ...</solution>" in p.text and len(p.text) == step
    assert count.calls <= worst_case_calls([("P?", sol)])


@pytest.mark.parametrize("sols", [["x" * 1000], ["x" * 900, "y" * 500], ["x" * 700, "y" * 40, "z" * 650]])
@pytest.mark.parametrize("by_chars", [False, True])
def test_search_is_exact_in_one_step_when_the_load_is_linear(sols, by_chars):
    # without whitespace a cut solution is exactly L + len(marker) long, so the prompt length is const + C(L), with
    # C(L) = sum_i min(len_i, L + 4) the quantity the search interpolates in: the interpolated target is the exact C at
    # which the load reaches 1, the first probe the largest fitting cap, the second the cap above it, which fails.
    # Budgets of 1024 keep every load a dyadic fraction, so the target is computed without rounding. That is the
    # documented purpose (fewer measurements than bisection's ~10 over these ~1000 caps): 2 + 2 measurements
    pairs = [(f"P{i}?", s) for i, s in enumerate(sols)]
    count = CountingTokens(len)
    if by_chars:  # the char budget binds; the token load (len / 2**40) is measured too and counted
        p = build_icl_prompt("Q?", pairs, max_chars=1024, count_tokens=count, max_tokens=2**40)
    else:
        p = build_icl_prompt("Q?", pairs, count_tokens=count, max_tokens=1024)
    assert (p.text, p.truncated, p.num_examples) == first_fit(
        reference_scan("Q?", pairs), "Q?", lambda t: len(t) <= 1024
    )
    assert p.num_examples == len(pairs) and p.truncated >= 1
    assert count.calls <= 4


def test_argument_types_are_named():
    # each used to fail deep inside (a TypeError from a comparison, a slice or len) or, for instruction=None, put
    # the text "None" in the prompt
    exs = [("P?", "x" * 300)]
    for bad in ("a", None, 2.5, True, -1):
        with pytest.raises(ValueError, match=r"min_solution_chars must be an int >= 0, got"):
            build_icl_prompt("Q?", exs, max_chars=300, min_solution_chars=bad)
    for arg in ("marker", "instruction"):
        with pytest.raises(ValueError, match=rf"{arg} must be a str, got NoneType"):
            build_icl_prompt("Q?", exs, max_chars=300, **{arg: None})
    for bad in (None, "P? x"):
        with pytest.raises(ValueError, match=r"examples must be a sequence of examples, got"):
            build_icl_prompt("Q?", bad)
