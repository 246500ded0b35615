"""Final-answer extraction and normalisation (xrpo/rewards/extract.py)."""

import dataclasses

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


def test_extraction_is_immutable():
    ex = extract_answer(r"\boxed{1}")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ex.answer = "2"  # type: ignore[misc]


def test_box_command_followed_by_one_letter_is_another_command():
    # `\boxedx` is a different command (the letter after `\boxed` continues its name), so the fallback answers
    assert extract_answer(r"\boxedx{3} Answer: 4").answer == "4"
    assert extract_answer(r"\fboxs{3} Answer: 4").answer == "4"


def test_box_answer_window_is_exactly_max_answer_chars():
    # a box whose content has exactly max_answer_chars characters is read; one more and it is not graded
    # (text follows the box, so the window ends before the end of the text)
    assert last_boxed(r"\boxed{77777} more", max_answer_chars=5) == ("77777", None)
    assert last_boxed(r"\boxed{777777} more", max_answer_chars=5) == (None, "answer_too_long")
    ex = extract_answer(r"\boxed{77777} more", max_answer_chars=5)
    assert (ex.answer, ex.source, ex.detail) == ("77777", "boxed", None)
    ex = extract_answer(r"\boxed{777777} more", max_answer_chars=5)
    assert (ex.answer, ex.source, ex.detail) == (None, None, "answer_too_long")


def test_fallback_answer_longer_than_max_answer_chars_is_not_graded():
    for text in ("#### " + "1" * 11, "The answer is " + "1" * 11):
        ex = extract_answer(text, max_answer_chars=10)
        assert (ex.answer, ex.source, ex.detail) == (None, None, "answer_too_long")
    # the cap applies to the raw text after the marker (whitespace included, before any stripping)
    assert extract_answer("####" + "1" * 10, max_answer_chars=10).answer == "1" * 10
    assert extract_answer("#### " + "1" * 10, max_answer_chars=10).detail == "answer_too_long"


def test_default_limits():
    # max_answer_chars defaults to 10_000 (extract_answer and last_boxed): a 10_000-character box is read, 10_001 not
    box = r"\boxed{" + "1" * 10_000 + "} done"
    assert extract_answer(box).answer == "1" * 10_000
    assert last_boxed(box) == ("1" * 10_000, None)
    long_box = r"\boxed{" + "1" * 10_001 + "} done"
    assert extract_answer(long_box).detail == "answer_too_long"
    assert last_boxed(long_box) == (None, "answer_too_long")
    # max_chars defaults to 1_000_000: a completion of exactly that length is searched whole; one character more
    # and its first character (here the backslash of the box) falls outside the searched tail
    head = r"\boxed{7}"
    assert extract_answer(head + "x" * (1_000_000 - len(head))).answer == "7"
    assert extract_answer(head + "x" * (1_000_001 - len(head))).detail == "no_marker"


def test_tail_window_is_the_last_max_chars_characters():
    # 50 + 9 + 100 = 159 characters; the last 150 start at index 9 and contain the box (index 50)
    text = "x" * 50 + r"\boxed{1}" + "x" * 100
    assert extract_answer(text, max_chars=150).answer == "1"
    assert extract_answer(text, max_chars=100).detail == "no_marker"  # the last 100 are all x


@pytest.mark.parametrize(
    "text, answer",
    [
        # the "answer is" fallback reads only the rest of its line
        ("The answer is 5\nLet me double-check: 2 + 3 = 5.", "5"),
        # an empty formula right after the marker is not the answer: the rest of the line is, `$` removed
        ("The answer is $$$$ 7", "7"),
    ],
)
def test_answer_is_line(text, answer):
    ex = extract_answer(text)
    assert (ex.answer, ex.source, ex.detail) == (answer, "answer_is", None)


def test_empty_formula_in_a_box_is_empty():
    for text in (r"\boxed{\(\)}", r"\boxed{\[\]}", r"\boxed{$$}"):
        ex = extract_answer(text)
        assert (ex.answer, ex.source, ex.detail) == (None, None, "empty")


def test_normalize_answer_more():
    # nested delimiters are all removed
    assert normalize_answer(r"$\(x+1\)$") == "x+1"
    # the character right after a text command's closing brace is kept
    assert normalize_answer(r"3\,\mathrm{cm}^3") == "3 cm^3"
    assert normalize_answer(r"5\text{m}^2") == "5m^2"
    # a period that becomes trailing once the text command is unwrapped is stripped too
    assert normalize_answer(r"\text{Yes.}") == "Yes"


def test_reference_answer_gsm8k_line():
    # only the line of the last `####` is the answer
    assert reference_answer("#### 72\nSource: GSM8K") == "72"
    assert reference_answer("#### 1\n#### 2\nnote") == "2"
