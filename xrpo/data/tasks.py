"""The built-in default task: short-answer arithmetic problems from `reasoning-gym`, with graded difficulty.

Details and the reasons for them: docs/data.md, section "The built-in task (`xrpo.data.tasks`)".
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xrpo.data.problem import Problem

__all__ = [
    "DEFAULT_FAMILIES",
    "FAMILIES",
    "TaskFamily",
    "format_prompt",
    "make_default_task",
    "warmup_texts",
]


@dataclass(frozen=True)
class TaskFamily:
    """A reasoning-gym dataset with its difficulty levels and its compact question.

    Attributes:
        name: the reasoning-gym dataset name (``reasoning_gym.create_dataset(name, ...)``).
        levels: reasoning-gym config keyword arguments, one dict per difficulty level, easiest first.
        question: builds the compact question from a reasoning-gym item ``{question, answer, metadata}``.
        note: why this family and these levels.
    """

    name: str
    levels: tuple[Mapping[str, Any], ...]
    question: Callable[[dict], str]
    note: str


def _expression_question(item: dict) -> str:
    return f"{item['metadata']['expression']} = ?"


def _function_question(fn: str) -> Callable[[dict], str]:
    def question(item: dict) -> str:
        return f"{fn}({', '.join(str(n) for n in item['metadata']['numbers'])}) = ?"

    return question


def _equation_question(item: dict) -> str:
    md = item["metadata"]
    return f"Solve for {md['variable']}: {md['equation']}"


FAMILIES: dict[str, TaskFamily] = {
    f.name: f
    for f in (
        TaskFamily(
            name="chain_sum",
            levels=(
                dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1),  # 200 questions
                dict(min_terms=3, max_terms=3, min_digits=1, max_digits=1),  # 4,000
                dict(min_terms=2, max_terms=2, min_digits=2, max_digits=2),  # 16,200
            ),
            question=_expression_question,
            note="+/- chains: the carry and the number of terms grade the difficulty of one skill.",
        ),
        TaskFamily(
            name="products",
            levels=(
                dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1),  # 100 questions
                dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1, allow_negation=True),  # 361
                dict(min_terms=3, max_terms=3, min_digits=1, max_digits=1),  # 1,000
            ),
            question=_expression_question,
            note="Multiplication: the table, then signs, then a third factor (2-digit x 2-digit is left out).",
        ),
        TaskFamily(
            name="gcd",
            levels=(
                dict(min_numbers=2, max_numbers=2, min_value=1, max_value=20),  # 400 pairs
                dict(min_numbers=2, max_numbers=2, min_value=1, max_value=50),  # 2,500
            ),
            question=_function_question("gcd"),
            note="Small answers (often 1-10) make partial success likely even when the model cannot compute them.",
        ),
        TaskFamily(
            name="lcm",
            levels=(
                dict(min_numbers=2, max_numbers=2, min_value=1, max_value=10),  # 100 pairs
                dict(min_numbers=2, max_numbers=2, min_value=1, max_value=20),  # 400
            ),
            question=_function_question("lcm"),
            note="Shares its numbers with gcd and products, so solved neighbours are informative for ICL.",
        ),
        TaskFamily(
            name="simple_equations",
            levels=(
                # the solution lies in [min_value, max_value]: a smaller range is the easier level, even with a*x
                dict(
                    min_terms=2,
                    max_terms=2,
                    min_value=1,
                    max_value=10,
                    operators=("+", "-", "*"),
                    operators_weights=[0.4, 0.4, 0.2],
                ),  # a*x + c = r, ...
                dict(
                    min_terms=2,
                    max_terms=2,
                    min_value=1,
                    max_value=20,
                    operators=("+", "-"),
                    operators_weights=[0.5, 0.5],
                ),  # x + c = r, c - x = r, ...
                dict(
                    min_terms=2,
                    max_terms=2,
                    min_value=1,
                    max_value=50,
                    operators=("+", "-"),
                    operators_weights=[0.5, 0.5],
                ),
            ),
            question=_equation_question,
            note="One-variable linear equations: inverts the skills of chain_sum and products.",
        ),
        TaskFamily(
            name="basic_arithmetic",
            levels=(
                # allow_parentheses=True on purpose: without it reasoning-gym evaluates left to right, ignoring
                # operator precedence, and its answer to "2 + 3 * 4" would be 20.
                dict(
                    min_terms=2,
                    max_terms=2,
                    min_digits=1,
                    max_digits=1,
                    operators=("+", "-", "*"),
                    allow_parentheses=True,
                    allow_negation=False,
                ),
                dict(
                    min_terms=3,
                    max_terms=3,
                    min_digits=1,
                    max_digits=1,
                    operators=("+", "-", "*"),
                    allow_parentheses=True,
                    allow_negation=False,
                ),
                dict(
                    min_terms=2,
                    max_terms=2,
                    min_digits=2,
                    max_digits=2,
                    operators=("+", "-", "*"),
                    allow_parentheses=True,
                    allow_negation=False,
                ),
            ),
            question=_expression_question,
            note="Mixed +, -, * with parentheses; overlaps chain_sum and products, so not in the default set.",
        ),
    )
}

#: Families of the default task. basic_arithmetic is left out: it mixes the skills of chain_sum and products and
#: adds little but prompt length for a ~1M-parameter model.
DEFAULT_FAMILIES: tuple[str, ...] = ("chain_sum", "products", "gcd", "lcm", "simple_equations")

# A cell (family, level) whose generator returns this many already-seen questions in a row is taken as exhausted.
_MAX_MISSES = 200


def _cell_seed(seed: int, split: str, family: str, level: int) -> int:
    """A 32-bit seed per (split, family, level).

    reasoning-gym seeds item ``i`` with ``Random(seed + i)``, so nearby seeds give shifted copies of the same stream;
    hashing spreads the cells' seeds over 2**32 so that their index ranges do not overlap in practice (duplicates
    that slip through are removed by question text anyway).
    """
    digest = hashlib.sha256(f"xrpo-default-task|{seed}|{split}|{family}|{level}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


class _Cell:
    """An endless stream of problems of one (family, level), for one split."""

    def __init__(self, family: TaskFamily, level: int, split: str, seed: int) -> None:
        import reasoning_gym

        self.family, self.level, self.split = family, level, split
        self.seed = _cell_seed(seed, split, family.name, level)
        self.config = dict(family.levels[level])
        self.dataset = reasoning_gym.create_dataset(family.name, seed=self.seed, size=1, **self.config)
        self.next_index = 0
        self.exhausted = False

    def draw(self, seen: set[str]) -> Problem | None:
        """The next problem whose question is not in `seen` (and add it), or None once the cell is exhausted."""
        misses = 0
        while misses < _MAX_MISSES:
            idx = self.next_index
            self.next_index += 1
            # ProceduralDataset.__getitem__ works for any index: `size` only bounds iteration.
            item = self.dataset[idx]
            question = self.family.question(item)
            if question in seen:
                misses += 1
                continue
            seen.add(question)
            return Problem(
                id=f"{self.family.name}-L{self.level}-{self.split}-{idx}",
                prompt=question,
                answer=item["answer"],
                data_source=f"reasoning_gym/{self.family.name}",
                metadata={
                    "family": self.family.name,
                    "difficulty": self.level,
                    "config": {k: list(v) if isinstance(v, tuple) else v for k, v in self.config.items()},
                    "source_seed": self.seed,
                    "source_index": idx,
                    "source_question": item["question"],
                },
            )
        self.exhausted = True
        return None


def _draw_split(
    n: int, split: str, seed: int, families: Sequence[str], levels: Mapping[str, Sequence[int]], seen: set[str]
) -> list[Problem]:
    """`n` distinct problems, families in turn and, within a family, its levels in turn."""
    if n == 0:
        return []
    cells = {f: [_Cell(FAMILIES[f], lv, split, seed) for lv in levels[f]] for f in families}
    turn = dict.fromkeys(families, 0)
    out: list[Problem] = []
    while len(out) < n:
        progressed = False
        for f in families:
            if len(out) == n:
                break
            live = [c for c in cells[f] if not c.exhausted]
            while live:
                cell = live[turn[f] % len(live)]
                turn[f] += 1
                problem = cell.draw(seen)
                if problem is not None:
                    out.append(problem)
                    progressed = True
                    break
                live = [c for c in cells[f] if not c.exhausted]
        if not progressed:
            raise ValueError(
                f"make_default_task: families {list(families)} have only {len(out)} distinct {split} questions "
                f"left at these levels, fewer than the {n} asked for; ask for fewer or add families/levels"
            )
    return out


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: expected a non-negative integer, got {value!r}")
    return value


def make_default_task(
    *,
    n_train: int,
    n_heldout: int,
    seed: int = 0,
    families: Iterable[str] | None = None,
    levels: Mapping[str, Sequence[int]] | None = None,
) -> tuple[list[Problem], list[Problem]]:
    """Draw the default task's train and held-out problems.

    Problems alternate between families and, within a family, between its difficulty levels, so any prefix of
    either list is balanced. Held-out problems are drawn first, from their own seeds; train problems come from
    different seeds and skip every question already drawn, so the two lists are disjoint by question text and
    neither list repeats a question (a repeated question under another id would let ICL retrieval leak its answer).
    The result depends only on the arguments.

    Args:
        n_train, n_heldout: how many problems of each split (non-negative).
        seed: base seed; train and held-out seeds are derived from it and differ.
        families: names from `FAMILIES`; `DEFAULT_FAMILIES` when None.
        levels: optional ``{family: [level indices]}`` restricting a family's difficulty levels (all when absent).

    Returns:
        ``(train, heldout)``. Each Problem has a text prompt (the compact question), ``answer`` = reasoning-gym's
        answer string, ``data_source = "reasoning_gym/<family>"`` and metadata ``family``, ``difficulty`` (level
        index, 0 = easiest), ``config`` (the reasoning-gym config), ``source_seed``, ``source_index`` and
        ``source_question``.

    Raises:
        ValueError: a bad argument, or fewer distinct questions than asked for at the chosen levels.
    """
    n_train = _check_count("n_train", n_train)
    n_heldout = _check_count("n_heldout", n_heldout)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: expected an integer, got {seed!r}")
    families = list(DEFAULT_FAMILIES if families is None else families)
    if not families:
        raise ValueError("families: expected at least one family name")
    for f in families:
        if f not in FAMILIES:
            raise ValueError(f"families: unknown family {f!r}; valid families: {sorted(FAMILIES)}")
    if len(set(families)) != len(families):
        raise ValueError(f"families: duplicate names in {families}")
    chosen: dict[str, list[int]] = {f: list(range(len(FAMILIES[f].levels))) for f in families}
    for f, lvs in (levels or {}).items():
        if f not in chosen:
            raise ValueError(f"levels: family {f!r} is not among the chosen families {families}")
        lvs = list(lvs)
        n_levels = len(FAMILIES[f].levels)
        bad = [lv for lv in lvs if isinstance(lv, bool) or not isinstance(lv, int) or not 0 <= lv < n_levels]
        if not lvs or bad or len(set(lvs)) != len(lvs):
            raise ValueError(f"levels[{f!r}]: expected distinct level indices in 0..{n_levels - 1}, got {lvs}")
        chosen[f] = lvs

    seen: set[str] = set()
    heldout = _draw_split(n_heldout, "heldout", seed, families, chosen, seen)
    train = _draw_split(n_train, "train", seed, families, chosen, seen)
    return train, heldout


def format_prompt(problem: Problem) -> str:
    """The default tiny model's prompt: ``"Q: <question>\\nA:"``.

    The default model is warm-started (see `warmup_texts`) to continue this with `` \\boxed{<answer>}<eos>``; the
    math verifier reads the box. It has no chat template, so the question is ``problem.text``.
    """
    if not isinstance(problem, Problem):
        raise ValueError(f"format_prompt: expected a Problem, got {type(problem).__name__}")
    return f"Q: {problem.text}\nA:"


def warmup_texts(problems: Iterable[Problem]) -> list[str]:
    """Supervised warm-start strings ``"Q: <question>\\nA: \\boxed{<answer>}"``, one per problem.

    The caller appends its tokenizer's eos token, so that the model learns to stop after the box.
    """
    return [f"{format_prompt(p)} \\boxed{{{p.answer}}}" for p in problems]
