"""CHAMP loaded by name from the champ-dataset package: counts, known answers, every kept reference gradeable."""

from __future__ import annotations

import pytest

pytest.importorskip("champ_dataset")

from xrpo.data.benchmarks import champ_summary, convert_champ_answer, load_champ  # noqa: E402


def test_counts_and_breakdown():
    problems, excluded = load_champ()
    assert len(problems) + len(excluded) == 270
    s = champ_summary()
    assert s["kept"] == len(problems) == 190
    assert s["excluded_by_reason"] == {
        "yes/no": 34,
        "text": 25,
        "several values": 19,
        "equation": 1,
        "not a closed form": 1,
    }
    assert sum(s["kept_by_category"].values()) == 190 and set(s["kept_by_category"]) == {
        "Combinatorics",
        "Inequality",
        "Number-Theory",
        "Polynomial",
        "Sequence",
    }
    assert len({p.id for p in problems}) == 190


def test_known_problems():
    problems = {p.id: p for p in load_champ()[0]}
    p = problems["P_Combinatorics_1"]
    assert p.prompt.startswith("Let a string consist of digit 1, 2, 3. How many such strings of length 6")
    assert p.answer == "239" and p.data_source == "champ"
    assert p.metadata == {"category": "Combinatorics", "champ_answer": "239", "answer_rule": "as written"}
    assert problems["P_Combinatorics_2"].answer == "252"  # "C(10, 5), or equivalently 252"
    assert problems["P_Combinatorics_14"].answer == "5/14"  # "5/14, or approximately 35.7%"
    assert problems["P_Sequence_7"].answer == "3"  # "The limit exists and is equal to 3"
    assert problems["P_Number-Theory_19"].answer == "0"  # "0 is the only possible value"
    assert problems["P_Polynomial_3"].answer == "0"  # "At most 0 integer-valued zeros (i.e., ...)"
    assert problems["P_Combinatorics_16"].answer == "\\binom{n+1}{2m+1}"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("No", (None, "yes/no")),
        ("Yes, and the sequence is 1/2^3, 1/2^6, ...", (None, "yes/no")),
        ("376 and 625", (None, "several values")),
        ("x=6, y=5", (None, "several values")),
        ("x=y=0", (None, "equation")),
        ("No integer solutions", (None, "text")),
        ("The limit does not exist", (None, "text")),
        ("x(x-1)(x-2)...(x-2022)", (None, "not a closed form")),
        ("98 values", ("98", "count")),
        ("n times", ("n", "count")),
        ("Exactly one", ("1", "count")),
        ("f(x)=0", ("0", "function")),
        ("[-1, 1]", ("[-1, 1]", "as written")),
        ("2^floor(n/2)*floor(n/2)!", ("2^{\\lfloor n/2 \\rfloor}*{\\lfloor n/2 \\rfloor}!", "as written")),
        ("sum_(k=1)^n 1/k", ("\\sum_{k=1}^{n} 1/k", "as written")),
        ("(x+y+z)(x^2+y^2+z^2-xy-yz-xz)", ("(x+y+z)(x^2+y^2+z^2-xy-yz-xz)", "as written")),
    ],
)
def test_conversion_rules(text, expected):
    assert convert_champ_answer(text) == expected


def test_every_kept_reference_grades_equal_to_itself():
    from xrpo.rewards.math import grade_answer

    bad = [p.id for p in load_champ()[0] if not grade_answer(p.answer, p.answer, want_canonical=False)[0]]
    assert bad == []


@pytest.mark.parametrize(
    "pid, model_answer",
    [
        ("P_Combinatorics_2", "\\binom{10}{5}"),
        ("P_Combinatorics_3", "2^{\\lfloor n/2\\rfloor} \\cdot \\lfloor n/2 \\rfloor !"),
        ("P_Combinatorics_16", "\\frac{(n+1)!}{(2m+1)!(n-2m)!}"),
        ("P_Combinatorics_29", "\\binom{n}{4}"),
        ("P_Inequality_12", "\\sum_{k=1}^{n} \\frac{1}{k}"),
        ("P_Inequality_18", "\\frac{\\sqrt{3}}{3}"),
        ("P_Inequality_1", "[-1,1]"),
        ("P_Polynomial_19", "x^3+y^3+z^3-3xyz"),
        ("P_Sequence_41", "\\frac{1+\\sqrt{4a+1}}{2}"),
    ],
)
def test_converted_references_accept_a_model_style_answer(pid, model_answer):
    from xrpo.rewards.math import grade_answer

    ref = {p.id: p for p in load_champ()[0]}[pid].answer
    assert grade_answer(model_answer, ref, want_canonical=False)[0], (pid, ref)
    assert not grade_answer("7", ref, want_canonical=False)[0]
