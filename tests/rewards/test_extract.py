"""Final-answer extraction and normalisation (xrpo/rewards/extract.py)."""

import dataclasses

import pytest

from xrpo.rewards.extract import drop_units, extract_answer, last_boxed, normalize_answer, reference_answer


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
    # the cap applies to the answer expression (what lies between the marker and it does not count)
    assert extract_answer("####" + "1" * 10, max_answer_chars=10).answer == "1" * 10
    assert extract_answer("#### " + "1" * 10, max_answer_chars=10).answer == "1" * 10
    assert extract_answer("#### " + "1" * 10 + " girls", max_answer_chars=10).answer == "1" * 10
    assert extract_answer("The answer is $" + "1" * 11 + "$", max_answer_chars=10).detail == "answer_too_long"


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


@pytest.mark.parametrize(
    "text, answer",
    [
        # the answer is the expression after the marker, not the rest of its line
        ("The answer is 18. Good job!", "18"),
        ("Answer: 18. That's it.", "18"),
        ("The answer is 18, since 30 - 12 = 18.", "18"),
        ("So there are 18 girls. The answer is 18. Good job!", "18"),
        ("The answer is 1/2 because 2x=1.", "1/2"),
        ("The answer is 7, obviously", "7"),
        ("The answer is 42 (forty-two).", "42"),
        ("The answer is 18 - the number of girls.", "18"),  # a dash before prose is punctuation
        ("The answer is 18 - 2 = 16.", "18 - 2 = 16"),  # an operator before math is not
        ("The answer is x = 2.", "x = 2"),
        ("The answer is 2x + 1, which is odd.", "2x + 1"),
        (r"The answer is \frac{1}{2}.", r"\frac{1}{2}"),
        ("Answer: (1, 2) is the point.", "(1, 2)"),
        ("Answer: 1, 2 and 3", "1, 2 and 3"),  # a list goes on while items follow
        ("The answer is 18, I think.", "18"),  # "I" after a comma is prose, not an item
        ("Answer:\n\n18", "18"),
        ("The answer is therefore 18.", "18"),
        ("The answer is actually 18.", "18"),
        ("The answer is: **18** girls.", "18"),
        # a formula, or formulas joined by "and" / "or" / commas (one list, math-verify's convention)
        ("The answer is $\\frac{2}{3}$ because $\\frac{4}{6} = \\frac{2}{3}$.", r"\frac{2}{3}"),
        ("The answer is $1$ and $2$.", "1, 2"),
        ("The answer is $1$ or $2$.", "1, 2"),
        # `$` before a number: a currency sign, unless it closes a formula of math only
        ("The answer is $18.", "18"),
        ("The answer is $1,250.50.", "1,250.50"),
        ("The answer is $18 and she keeps $2.", "18"),
        ("The answer is $18$.", "18"),
        ("The answer is $5 \\times 3 = 15$.", "5 \\times 3 = 15"),
        # percent and thousands separators belong to the number; spaces between digit groups are removed
        ("The answer is 40% of the students.", "40%"),
        ("The answer is 40 percent of them.", "40 percent"),
        ("The answer is 1,000,000 dollars.", "1,000,000"),
        ("The answer is 12 500 000.", "12500000"),
        (r"The answer is 1\,234.", "1234"),
        ("The answer is −7.", "−7"),
    ],
)
def test_the_answer_is_the_expression_after_the_marker(text, answer):
    ex = extract_answer(text)
    assert (ex.answer, ex.detail) == (answer, None)


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 18 girls.",
        "Answer: 18 girls",
        "#### 18 girls",
        r"\boxed{18 girls}",
        r"\boxed{18 \text{ girls}}",
        r"The answer is $18 \text{ girls}$.",
        r"The answer is $18$ girls.",
        "The answer is 18° exactly.",
        r"\boxed{18°}",
    ],
)
def test_units_are_dropped_the_same_in_every_form(text):
    assert extract_answer(text).answer == "18"


@pytest.mark.parametrize(
    "text, answer",
    [
        # what changes the value is kept, so that the verifier does not read the bare number
        ("The answer is not 18.", "not 18"),
        ("The answer is approximately 18.", "approximately 18"),
        ("The answer is between 18 and 20.", "between 18 and 20"),
        ("The answer is 18 or 19.", "18 or 19"),
        ("The answer is 18 or more.", "18 or more"),
        ("The answer is 2 million.", "2 million"),
        (r"\boxed{2 \text{ million}}", "2  million"),  # unwrapped: math-verify drops a trailing \text as a unit
        ("The answer is 3 hours and 20 minutes.", "3 hours and 20 minutes"),
        (r"\boxed{3 \text{ hours } 20 \text{ minutes}}", "3  hours  20  minutes"),
        ("The answer is 5 feet 2 inches.", "5 feet 2 inches"),
        ("The answer is $18 and $20.", "18 and 20"),
        # a text answer is read to the end of its sentence
        ("The answer is Monday. Good luck!", "Monday"),
        (r"\boxed{\text{(C)}}", r"\text{(C)}"),
        (r"\boxed{5!}", "5!"),  # in a box `!` is a factorial, not punctuation
        (r"\boxed{2 \text{ and } 3}", r"2 \text{ and } 3"),  # math-verify reads it as the list {2, 3}
    ],
)
def test_words_that_change_the_value_stay_in_the_answer(text, answer):
    assert extract_answer(text).answer == answer


def test_a_confirmation_is_not_an_answer():
    # "the answer is correct" confirms the answer before it
    assert extract_answer("The answer is 18. I hope the answer is correct.").answer == "18"
    assert extract_answer("Answer: 18\nI verified: 30 - 12 = 18, so this answer is right.").answer == "18"
    # "wrong" is not a confirmation, and a retraction counts as the last answer
    assert extract_answer("The answer is 18. Wait, the answer is wrong.").answer == "wrong"
    assert extract_answer("The answer is 18.\nWait, the answer is not 18.").answer == "not 18"
    # nothing but confirmations: no answer
    assert extract_answer("I am sure the answer is correct.").detail == "no_marker"
    assert extract_answer("#### correct").detail == "empty"


def test_unbalanced_and_truncated_answers_after_a_marker():
    assert extract_answer("The answer is").detail == "empty"
    assert extract_answer("The answer is {2}}").detail == "unbalanced"
    assert extract_answer("The answer is $\\frac{1}{2").detail == "unbalanced"  # an unclosed formula
    ex = extract_answer("The answer is $" + "1" * 20 + "$ ok", max_answer_chars=10)
    assert ex.detail == "answer_too_long"
    # an expression, a bracket or a text answer that runs past the cap is not graded, however long the text
    for rest in ("1, " * 50_000, "(" * 100_000, "abc " * 50_000, "1 or " * 50_000):
        assert extract_answer("The answer is " + rest).detail == "answer_too_long", rest[:8]
    # a few empty formulas are markup; a long run of them leaves no answer
    assert extract_answer("The answer is $$$$ 7").answer == "7"
    assert extract_answer("The answer is " + "$$" * 100_000 + " 7").detail == "empty"


def test_the_last_number_is_read_only_when_asked():
    text = "There are 30 - 12 = 18 girls, so 18 / 2 = 9 play football."
    assert extract_answer(text).detail == "no_marker"
    ex = extract_answer(text, last_number=True)
    assert (ex.answer, ex.source, ex.detail) == ("9", "last_number", None)
    # its sign (not a subtraction), thousands separators and percent sign are part of it
    assert extract_answer("It is now 5 - 12 = -7 degrees.", last_number=True).answer == "-7"
    assert extract_answer("So 30-12 is the count.", last_number=True).answer == "12"
    assert extract_answer("They sold 1,250 + 1,375 = 2,625 books.", last_number=True).answer == "2,625"
    assert extract_answer("10 / 40 = 0.25, so 25% passed.", last_number=True).answer == "25%"
    assert extract_answer("Cells x3 and y4.", last_number=True).detail == "no_marker"  # digits glued to letters
    # a marker still wins
    assert extract_answer("The answer is 9. Check: 9 * 2 = 18.", last_number=True).answer == "9"


def test_drop_units():
    assert drop_units("18 girls") == "18"
    assert drop_units(r"5 \text{ cm}^2") == "5"
    assert drop_units("12 km/h") == "12"
    assert drop_units(r"2\sqrt{2} units") == r"2\sqrt{2}"
    # single letters are variables, not units; math words and scale words are part of the value
    assert drop_units("2 x") == "2 x"
    assert drop_units("2 pi") == "2 pi"
    assert drop_units("2 million") == "2 million"
    # text answers and answers without units are returned as they are
    assert drop_units("Monday") == "Monday"
    assert drop_units(r"\frac{1}{2}") == r"\frac{1}{2}"
