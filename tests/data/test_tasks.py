import ast
import math
import operator
import re
from collections import Counter

import pytest

from xrpo.data import (
    DEFAULT_FAMILIES,
    FAMILIES,
    Problem,
    format_prompt,
    make_default_task,
    warmup_texts,
)

ALL = sorted(FAMILIES)


@pytest.fixture(scope="module")
def task():
    # every family, every level: 6 families x 3 problems per level on average
    return make_default_task(n_train=120, n_heldout=60, seed=0, families=ALL)


# -------------------------------------------------------------------------------------------------------------------
# Independent checks of the reference answers (not reasoning-gym's code)
# -------------------------------------------------------------------------------------------------------------------

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _eval_int(node):
    """Integer arithmetic with +, -, *, unary minus and parentheses, with the usual precedence."""
    if isinstance(node, ast.Expression):
        return _eval_int(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval_int(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval_int(node.left), _eval_int(node.right))
    raise AssertionError(f"unexpected syntax {ast.dump(node)}")


def _solve_linear(equation: str, var: str) -> int:
    """Solve lhs = rhs, linear in `var`, by evaluating both sides at var = 0 and var = 1."""
    lhs, rhs = (s.strip() for s in equation.split("="))

    def side(text, x):
        return _eval_int(ast.parse(re.sub(rf"\b{var}\b", f"({x})", text), mode="eval"))

    f0 = side(lhs, 0) - side(rhs, 0)
    f1 = side(lhs, 1) - side(rhs, 1)
    slope = f1 - f0
    assert slope != 0 and f0 % slope == 0, equation
    return -f0 // slope


def reference_value(p: Problem) -> int:
    family, q = p.metadata["family"], p.text
    if family in ("chain_sum", "products", "basic_arithmetic"):
        expr = q.removesuffix(" = ?")
        return _eval_int(ast.parse(expr, mode="eval"))
    if family in ("gcd", "lcm"):
        m = re.fullmatch(rf"{family}\((\d+), (\d+)\) = \?", q)
        assert m, q
        a, b = int(m[1]), int(m[2])
        return math.gcd(a, b) if family == "gcd" else math.lcm(a, b)
    if family == "simple_equations":
        m = re.fullmatch(r"Solve for ([a-z]): (.+)", q)
        assert m, q
        return _solve_linear(m[2], m[1])
    raise AssertionError(family)


def test_reference_answers_are_plain_integers_and_correct(task):
    train, heldout = task
    for p in train + heldout:
        assert isinstance(p.answer, str)
        assert re.fullmatch(r"-?\d+", p.answer), (p.id, p.answer)
        assert int(p.answer) == reference_value(p), (p.id, p.text, p.answer)


def test_every_family_and_level_is_drawn(task):
    train, heldout = task
    cells = Counter((p.metadata["family"], p.metadata["difficulty"]) for p in train)
    expected = {(f, lv) for f in ALL for lv in range(len(FAMILIES[f].levels))}
    assert set(cells) == expected
    assert {p.metadata["family"] for p in heldout} == set(ALL)


def test_fields(task):
    train, heldout = task
    for p in train + heldout:
        family = p.metadata["family"]
        assert p.data_source == f"reasoning_gym/{family}"
        assert isinstance(p.prompt, str) and "\n" not in p.prompt
        level = p.metadata["difficulty"]
        assert p.metadata["config"] == {
            k: list(v) if isinstance(v, tuple) else v for k, v in FAMILIES[family].levels[level].items()
        }
        assert p.metadata["source_question"]
        assert p.id.startswith(f"{family}-L{level}-")
    ids = [p.id for p in train + heldout]
    assert len(set(ids)) == len(ids)


def test_questions_are_short(task):
    # the default tiny model has a ~128-token context; its tokenizer splits digits, so chars bound tokens
    train, heldout = task
    assert max(len(t) for t in warmup_texts(train + heldout)) <= 64


def test_determinism_and_seed():
    a = make_default_task(n_train=40, n_heldout=20, seed=3)
    b = make_default_task(n_train=40, n_heldout=20, seed=3)
    c = make_default_task(n_train=40, n_heldout=20, seed=4)
    assert a == b
    assert [p.text for p in a[0]] != [p.text for p in c[0]]


def test_train_and_heldout_are_disjoint_and_unrepeated():
    # products level 0 has only 100 distinct questions: the splits must share none of them
    train, heldout = make_default_task(
        n_train=60, n_heldout=30, seed=0, families=["products"], levels={"products": [0]}
    )
    tr, ho = [p.text for p in train], [p.text for p in heldout]
    assert len(set(tr)) == 60 and len(set(ho)) == 30
    assert not set(tr) & set(ho)
    # train and held-out come from different reasoning-gym seeds
    assert {p.metadata["source_seed"] for p in train}.isdisjoint({p.metadata["source_seed"] for p in heldout})


def test_exhausted_cell_is_reported():
    with pytest.raises(ValueError, match=r"only \d+ distinct train questions .* fewer than the 100 asked for"):
        make_default_task(n_train=100, n_heldout=20, seed=0, families=["products"], levels={"products": [0]})


def test_balanced_prefix_and_default_families():
    train, heldout = make_default_task(n_train=10, n_heldout=5, seed=1)
    assert [p.metadata["family"] for p in heldout] == list(DEFAULT_FAMILIES)
    assert [p.metadata["family"] for p in train] == list(DEFAULT_FAMILIES) * 2
    # within a family the levels alternate
    assert [p.metadata["difficulty"] for p in train if p.metadata["family"] == "chain_sum"] == [0, 1]


def test_zero_sizes():
    train, heldout = make_default_task(n_train=0, n_heldout=3, seed=0)
    assert train == [] and len(heldout) == 3


def test_format_prompt_and_warmup_texts():
    p = Problem(id="x", prompt="12 + 7 = ?", answer="19")
    assert format_prompt(p) == "Q: 12 + 7 = ?\nA:"
    assert warmup_texts([p]) == ["Q: 12 + 7 = ?\nA: \\boxed{19}"]
    chat = Problem(
        id="y", prompt=[{"role": "system", "content": "s"}, {"role": "user", "content": "gcd(4, 6) = ?"}], answer="2"
    )
    assert format_prompt(chat) == "Q: gcd(4, 6) = ?\nA:"
    with pytest.raises(ValueError, match="format_prompt: expected a Problem"):
        format_prompt("12 + 7")


def test_math_verifier_grades_references_exactly(task):
    # xrpo grades with math-verify, never with reasoning-gym's score_answer, which gives partial credit
    # (0.67 for "-41" against "-4"): the boxed reference verifies, a longer number containing it does not.
    from math_verify import parse, verify

    train, _ = task
    by_family = {}
    for p in train:
        by_family.setdefault(p.metadata["family"], p)
    for p in by_family.values():
        gold = parse(p.answer)
        assert gold and gold[0] == int(p.answer)
        assert verify(gold, parse(f"\\boxed{{{p.answer}}}"))
        assert not verify(gold, parse(f"\\boxed{{{p.answer}1}}"))
    assert not verify(parse("-4"), parse("\\boxed{-41}"))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_train=-1, n_heldout=1), "n_train: expected a non-negative integer"),
        (dict(n_train=1, n_heldout=1.5), "n_heldout: expected a non-negative integer"),
        (dict(n_train=1, n_heldout=1, seed="0"), "seed: expected an integer"),
        (dict(n_train=1, n_heldout=1, families=["chain_sum", "nope"]), r"unknown family 'nope'; valid families: \["),
        (dict(n_train=1, n_heldout=1, families=[]), "at least one family"),
        (dict(n_train=1, n_heldout=1, families=["gcd", "gcd"]), "duplicate names"),
        (dict(n_train=1, n_heldout=1, families=["gcd"], levels={"lcm": [0]}), "levels: family 'lcm' is not among"),
        (dict(n_train=1, n_heldout=1, families=["gcd"], levels={"gcd": [5]}), r"levels\['gcd'\]: expected distinct"),
        (dict(n_train=1, n_heldout=1, families=["gcd"], levels={"gcd": []}), r"levels\['gcd'\]: expected distinct"),
    ],
)
def test_argument_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_default_task(**kwargs)
