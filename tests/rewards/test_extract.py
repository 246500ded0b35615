"""Final-answer extraction and normalisation (xrpo/rewards/extract.py)."""

import pytest

from xrpo.rewards.extract import extract_answer, last_boxed, normalize_answer, reference_answer


@pytest.mark.parametrize(
    "text, answer, source",
    [
        # nested braces inside the box
        (r"so \boxed{\frac{1}{2}} done", r"\frac{1}{2}", "boxed"),
        (r"\boxed{\sqrt{\frac{a^{2}}{b_{1}}}}", r"\sqrt{\frac{a^{2}}{b_{1}}}", "boxed"),
        # escaped braces are literal set braces, not groups
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}", "boxed"),
        (r"\boxed{\left\{ x \right.}", r"\left\{ x \right.", "boxed"),
        # several boxes: only the last one counts
        (r"\boxed{1} then \boxed{2} finally \boxed{3}", "3", "boxed"),
        (r"\fbox{4} and later \boxed{5}", "5", "boxed"),
        (r"\boxed{5} and later \fbox{6}", "6", "boxed"),
        # `\boxed 5` without braces
        (r"hence $\boxed 42$.", "42", "boxed"),
        # box beats every fallback, wherever they are
        ("\\boxed{7}\n#### 8\nThe answer is 9.", "7", "boxed"),
        # GSM8K style
        ("Natalia sold 48/2 = 24 clips.\n#### 72", "72", "####"),
        ("#### 1\nsecond thoughts\n#### 1,234", "1,234", "####"),
        ("#### 3\nThe answer is 4", "3", "####"),
        # "answer is" / "Answer:"
        ("So the answer is 42.", "42", "answer_is"),
        ("Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct.", r"\frac{3}{4}", "answer_is"),
        ("**Answer:** 17", "17", "answer_is"),
        ("**Answer: 17**", "17", "answer_is"),
        ("The answer is: **-4**.", "-4", "answer_is"),
        ("#### $1,234.", "1,234", "####"),
        ("Answer: 3\nwait, no. Answer: 5", "5", "answer_is"),
        (r"The answer is \(x+1\) of course", "x+1", "answer_is"),
        ("THE ANSWER IS: -2", "-2", "answer_is"),
        # `$` and a trailing period are stripped
        (r"\boxed{$12$.}", "12", "boxed"),
    ],
)
def test_extract_answer(text, answer, source):
    ex = extract_answer(text)
    assert (ex.answer, ex.source, ex.detail) == (answer, source, None)


@pytest.mark.parametrize(
    "text, detail",
    [
        ("I think it is 42", "no_marker"),
        ("", "no_marker"),
        # the last box is never closed: no answer, and no fallback to the earlier box or to `####`
        (r"\boxed{1} ... \boxed{\frac{1}{2}", "unbalanced"),
        ("#### 5\n" + r"\boxed{3", "unbalanced"),
        (r"\boxed{}", "empty"),
        ("\\boxed", "unbalanced"),
        # unbalanced fallback answers
        ("#### \\frac{1}{2", "unbalanced"),
        ("The answer is {2}}", "unbalanced"),
        ("####   \n", "empty"),
    ],
)
def test_no_answer(text, detail):
    ex = extract_answer(text)
    assert (ex.answer, ex.source, ex.detail) == (None, None, detail)


def test_boxedlike_commands_are_not_boxes():
    assert extract_answer(r"\boxedsomething{3} Answer: 4").answer == "4"


def test_deeply_nested_braces_are_matched():
    depth = 3000
    ex = extract_answer(r"\boxed{" + "{" * depth + "1" + "}" * depth + "}")
    assert ex.answer == "{" * depth + "1" + "}" * depth


def test_long_box_is_not_graded():
    ex = extract_answer(r"\boxed{" + "1" * 20_000 + "}", max_answer_chars=10_000)
    assert (ex.answer, ex.detail) == (None, "answer_too_long")
    # an open box shorter than the cap that reaches the end of the text is merely unbalanced
    assert extract_answer(r"\boxed{" + "1" * 100, max_answer_chars=10_000).detail == "unbalanced"


def test_only_the_tail_of_a_huge_completion_is_searched():
    head = r"\boxed{1}" + "x" * 2000
    assert extract_answer(head, max_chars=10_000).answer == "1"
    ex = extract_answer(head, max_chars=1000)  # the box lies before the last 1000 characters
    assert (ex.answer, ex.detail) == (None, "no_marker")
    assert extract_answer(head + r"\boxed{2}", max_chars=1000).answer == "2"


def test_last_boxed_reports_detail():
    assert last_boxed(r"a \boxed{b} c") == ("b", None)
    assert last_boxed("none") == (None, "no_marker")
    assert last_boxed(r"\boxed{\\}") == ("\\\\", None)  # `\\` is one escaped unit, so the brace after closes


@pytest.mark.parametrize(
    "raw, norm",
    [
        ("  42  ", "42"),
        ("$42$", "42"),
        ("$$ x + 1 $$", "x+1"),
        (r"\(\frac{1}{2}\)", r"\frac{1}{2}"),
        (r"\dfrac{1}{2}", r"\frac{1}{2}"),
        (r"\tfrac12", r"\frac12"),
        (r"\text{Monday}.", "Monday"),
        (r"\textbf{\text{(B)}}", "(B)"),
        (r"5 \text{ cm}", "5 cm"),
        (r"\left( 1 , 2 \right]", "(1,2]"),
        (r"1{,}000", "1,000"),
        (r"\$18", "18"),
        (r"x \cdot y", r"x\cdot y"),
        (r"3\,\mathrm{m}", "3 m"),
        ("New   York", "New York"),
        ("0.5", "0.5"),  # the value is never changed: "0.5" and "1/2" stay different votes
        ("1/2", "1/2"),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_reference_answer():
    assert reference_answer("42") == "42"
    assert reference_answer(" $\\frac{1}{2}$ ") == r"\frac{1}{2}"
    assert reference_answer(r"The solution ... so \boxed{7}.") == "7"
    assert reference_answer("48/2 = 24\n#### 72") == "72"
