"""Benchmarks that ship inside Python packages, loaded by name: CHAMP (the `champ-dataset` package, MIT).

CHAMP (Mao et al. 2024, "CHAMP: A Competition-level Dataset for Fine-Grained Analyses of LLMs' Mathematical Reasoning
Capabilities") has 270 competition problems in five categories, each with a final answer written for a human judge:
"C(10, 5), or equivalently 252", "0 is the only possible value", "The limit exists and is equal to 3", "No",
"x=6, y=5". `load_champ` turns those into references an automatic math verifier can grade, by an ordered list of
rules (`CHAMP_RULES`, each a name and a regular expression on the whole answer, applied again to their own result):

    equivalently      "A, or equivalently B" / "A, or an equivalent form such as B" -> B (the evaluated form)
    approximately     "A, or approximately B" -> A (the exact form)
    i.e.              "A (i.e., ...)" / "A (none ...)" / "A (no ...)" -> A
    only value        "A is the only possible value", "The only possible value for the limit is A" -> A
    limit             "The limit exists and is equal to A" -> A
    function          "f(x)=A" -> A (one polynomial)
    count             "[At most | At least | Exactly] A <words>" where A is a number, a one-letter variable, a
                      variable minus/plus a number, or "one" -> A ("98 values", "n times", "At most 0 values")

then keeps the result only if it is a single mathematical expression: digits, one- or two-letter products of
variables, + - * / ^ ! ( ), an interval [a, b], and the functions sqrt, floor, C(a, b) (binomial) and
sum_(i=a)^b (the last three rewritten in LaTeX: math-verify reads those, not the plain text). Everything else is
excluded, with the reason recorded:

    yes/no            "Yes" / "No" answers: a coin flip solves them half of the time, which would inflate pass@k
    text              statements ("No integer solutions", "The limit does not exist", "Monotonically increasing",
                      "x(n)<y(n-1) for all n>=3")
    several values    "376 and 625", "x=6, y=5", "x=+-1", "1, 4 and 9": a set or tuple of values whose written
                      form (order, variable names) a verifier cannot match reliably
    equation          "x=y=0"
    not a closed form "x(x-1)(x-2)...(x-2022)"

Of the 270 problems, 190 load (`champ_summary()`; docs/eval.md has the breakdown). Tests check that every kept
reference parses and grades equal to itself with the `math` verifier, and spot-check converted ones against a
model-style LaTeX answer.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from xrpo.data.problem import DataError, Problem

__all__ = ["CHAMP_RULES", "ChampExclusion", "champ_summary", "load_champ"]

# (rule name, pattern on the whole answer); the kept part is the pattern's first matching group. Rules are applied
# again to their own result ("At most 0 zeros (i.e., none)" -> "At most 0 zeros" -> "0").
CHAMP_RULES: tuple[tuple[str, re.Pattern], ...] = (
    ("equivalently", re.compile(r"^.+?, or (?:equivalently|an equivalent form such as) (.+)$")),
    ("approximately", re.compile(r"^(.+?), or approximately .+$")),
    ("i.e.", re.compile(r"^(.+?) \((?:i\.e\.,|none |no ).*\)$")),
    ("only value", re.compile(r"^(?:(.+?) is the only possible value|The only possible value for the limit is (.+))$")),
    ("limit", re.compile(r"^The limit exists and is equal to (.+)$")),
    ("function", re.compile(r"^f\(x\)=([^=]+)$")),
    (
        "count",
        re.compile(
            r"^(?:(?:At most |At least |Exactly )(\d+|[a-z](?:[-+]\d+)?|one)(?: [A-Za-z][A-Za-z -]*)?|"
            r"(\d+|[a-z](?:[-+]\d+)?) [A-Za-z][A-Za-z -]*)$"
        ),
    ),
)
_WORD_NUMBERS = {"one": "1"}
_YES_NO = re.compile(r"^(yes|no)(,|\.|$)", re.IGNORECASE)
_CHARS = re.compile(r"^[0-9A-Za-z+\-*/^!()\[\]., _=]+$")
# function calls the verifier reads once rewritten in LaTeX; masked out before looking for words and separators
_CALLS = re.compile(r"C\([^()]+\)|floor\([^()]+\)|sqrt\([^()]+\)|sum_\(\w=\w+\)\^\w+")


@dataclass(frozen=True)
class ChampExclusion:
    id: str
    answer: str
    reason: str


def _to_latex(expr: str) -> str:
    """Rewrite the plain-text functions math-verify does not read (binomials, floors, sums) in LaTeX."""
    # C(a, b) -> \binom{a}{b}
    expr = re.sub(r"C\(([^(),]+), ([^(),]+)\)", r"\\binom{\1}{\2}", expr)
    # floor(x) -> {\lfloor x \rfloor}; the braces keep an exponent such as 2^floor(n/2) whole
    expr = re.sub(r"floor\(([^()]+)\)", r"{\\lfloor \1 \\rfloor}", expr)
    # sum_(i=a)^b body -> \sum_{i=a}^{b} body
    expr = re.sub(r"sum_\((\w)=(\w+)\)\^(\w+) ", r"\\sum_{\1=\2}^{\3} ", expr)
    return expr


def convert_champ_answer(answer: str) -> tuple[str | None, str]:
    """A CHAMP answer text -> (reference for the math verifier, or None if excluded; the rule or exclusion reason)."""
    text = " ".join(answer.replace("\u2212", "-").split())
    if _YES_NO.match(text):
        return None, "yes/no"
    rule = "as written"
    for _ in range(len(CHAMP_RULES)):
        hit = next(((name, m) for name, pattern in CHAMP_RULES if (m := pattern.match(text))), None)
        if hit is None:
            break
        rule = hit[0]
        text = next(g for g in hit[1].groups() if g is not None).strip()
        text = _WORD_NUMBERS.get(text, text)
    masked = _CALLS.sub("F", text)
    interval = re.fullmatch(r"\[([^,\[\]]+), ([^,\[\]]+)\]", masked)
    if interval:
        masked = interval.group(1) + "+" + interval.group(2)
    # words (three letters or more, bar "and"/"or") are prose; one- and two-letter runs are products of variables
    if not _CHARS.match(text.replace("\u00b1", "")) or re.search(r"[A-Za-z]{3,}", re.sub(r" (and|or) ", " ", masked)):
        return None, "text"
    if " and " in masked or " or " in masked or "," in masked or "\u00b1" in masked:
        return None, "several values"
    if "..." in masked:
        return None, "not a closed form"
    if "=" in masked:
        return None, "equation"
    return _to_latex(text), rule


@lru_cache(maxsize=1)
def _champ_raw() -> dict:
    try:
        from importlib import resources

        ref = resources.files("champ_dataset") / "dataset_files" / "v0.json"
        with ref.open("r", encoding="utf-8") as f:
            return json.load(f)
    except ModuleNotFoundError:
        raise ImportError("the `champ` benchmark needs the champ-dataset package: pip install 'xrpo[champ]'") from None
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"champ-dataset: cannot read its dataset_files/v0.json ({e})") from None


def load_champ() -> tuple[list[Problem], list[ChampExclusion]]:
    """CHAMP's problems whose answer converts to a gradeable reference, in the package's order, and the excluded ones.

    Each Problem: id = CHAMP's identifier ("P_Combinatorics_1"), prompt = the problem text, answer = the converted
    reference, data_source = "champ", metadata = {category, champ_answer (the original text), answer_rule}.
    """
    raw = _champ_raw()
    problems_raw = raw.get("problems") if isinstance(raw, dict) else None
    if not isinstance(problems_raw, dict):
        raise DataError("champ-dataset: dataset_files/v0.json has no 'problems' object")
    problems, excluded = [], []
    for key, rec in problems_raw.items():
        where = f"champ-dataset problem {key}"
        text, answer = rec.get("_text"), rec.get("_answer")
        if not isinstance(text, str) or not text.strip() or not isinstance(answer, str) or not answer.strip():
            raise DataError(f"{where}: expected text fields '_text' and '_answer'")
        reference, rule = convert_champ_answer(answer)
        if reference is None:
            excluded.append(ChampExclusion(key, answer, rule))
            continue
        problems.append(
            Problem(
                id=key,
                prompt=text,
                answer=reference,
                data_source="champ",
                metadata={"category": rec.get("category", ""), "champ_answer": answer, "answer_rule": rule},
            )
        )
    return problems, excluded


def champ_summary() -> dict:
    """Counts of kept problems per rule and category and of excluded ones per reason."""
    problems, excluded = load_champ()
    return {
        "total": len(problems) + len(excluded),
        "kept": len(problems),
        "kept_by_rule": dict(Counter(p.metadata["answer_rule"] for p in problems)),
        "kept_by_category": dict(Counter(p.metadata["category"] for p in problems)),
        "excluded": len(excluded),
        "excluded_by_reason": dict(Counter(e.reason for e in excluded)),
    }
