"""Final-answer extraction and answer-string normalisation for the `math` verifier.

Precedence (the first kind present wins; within a kind the LAST occurrence counts):

1. the last `\\boxed{...}` or `\\fbox{...}` (braces matched, `\\{` / `\\}` are literal and not counted; the brace-less
   `\\boxed 5` form is accepted too). If that last box is not closed, the completion has no answer: no fallback to an
   earlier box or to the other kinds, since a truncated final box says nothing about what the model meant.
2. the last `#### X` (GSM8K style): X is the rest of that line.
3. the last "answer is X" / "Answer: X" (case-insensitive, markdown `**` allowed): X is the first `$...$`, `\\(...\\)`
   or `\\[...\\]` right after, or else the rest of that line.

Only the last box counts, so a completion that boxes many different values is graded on its final one (this is the
reward-hacking guard: spraying candidates does not help). A completion longer than `max_chars` is searched only in its
last `max_chars` characters. A box longer than `max_answer_chars` is not graded (reason "answer_too_long").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "Extraction",
    "extract_answer",
    "last_boxed",
    "normalize_answer",
    "reference_answer",
    "strip_math_delimiters",
]

_BOX_COMMANDS = ("\\boxed", "\\fbox")
# A backslash escape (so that `\{` and `\\` are skipped as units) or a brace.
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.S)
_ANSWER_IS = re.compile(r"\banswer\**(?:\s+is\b\s*:?|\s*:)[ \t*]*", re.I)
_DELIMITED = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))


@dataclass(frozen=True)
class Extraction:
    """Where the final answer was found.

    Attributes:
        answer: the answer's LaTeX source with math delimiters removed; None when none was found.
        source: "boxed", "####" or "answer_is"; None when none was found.
        detail: why there is no answer ("no_marker", "unbalanced", "empty", "answer_too_long"); None when found.
    """

    answer: str | None
    source: str | None
    detail: str | None = None


def last_boxed(text: str, *, max_answer_chars: int = 10_000) -> tuple[str | None, str | None]:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` in `text`.

    Returns `(content, None)`, or `(None, detail)` with detail "no_marker" (no box), "unbalanced" (the last box is
    never closed), "empty" or "answer_too_long" (the box is still open after `max_answer_chars` characters).
    """
    start = -1
    for cmd in _BOX_COMMANDS:
        pos = len(text)
        while True:
            pos = text.rfind(cmd, 0, pos)
            # `\boxedfoo` is another command, not a box.
            if pos < 0 or not text[pos + len(cmd) : pos + len(cmd) + 1].isalpha():
                break
        if pos > start:
            start, end_of_cmd = pos, pos + len(cmd)
    if start < 0:
        return None, "no_marker"
    i = end_of_cmd
    while i < len(text) and text[i] in " \t":
        i += 1
    if i >= len(text):
        return None, "unbalanced"
    if text[i] != "{":
        if i == end_of_cmd:  # `\boxed\frac...` and the like: not a form we read
            return None, "unbalanced"
        m = re.compile(r"[^\s$]+").match(text, i)  # `\boxed 5`
        return (m.group(0), None) if m else (None, "empty")
    depth = 0
    limit = min(len(text), i + max_answer_chars + 2)
    for m in _BRACE_TOKEN.finditer(text, i, limit):
        tok = m.group(0)
        if tok == "{":
            depth += 1
        elif tok == "}":
            depth -= 1
            if depth == 0:
                content = text[i + 1 : m.start()].strip()
                return (content, None) if content else (None, "empty")
    return None, ("unbalanced" if limit == len(text) else "answer_too_long")


def _balanced(s: str) -> bool:
    depth = 0
    for m in _BRACE_TOKEN.finditer(s):
        depth += 1 if m.group(0) == "{" else -1 if m.group(0) == "}" else 0
        if depth < 0:
            return False
    return depth == 0


def _leading_math(s: str) -> str | None:
    for left, right in _DELIMITED:
        if s.startswith(left):
            end = s.find(right, len(left))
            if end > len(left):
                return s[len(left) : end]
            return None
    return None


def _line_answer(rest: str) -> str:
    math_part = _leading_math(rest)
    if math_part is not None:
        return math_part
    # markdown bold around the answer ("**Answer: 5**") is not part of it
    line = _strip_trailing_period(rest.split("\n", 1)[0].strip().strip("*"))
    return line.strip("*").strip()


def strip_math_delimiters(s: str) -> str:
    """Remove surrounding `$...$`, `$$...$$`, `\\(...\\)`, `\\[...\\]`, stray `$`, and trailing periods."""
    s = s.strip()
    changed = True
    while changed and s:
        changed = False
        for left, right in _DELIMITED:
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left) : len(s) - len(right)].strip()
                changed = True
                break
    # Unescaped `$` left over (an inline formula inside a longer answer line) is markup, not content.
    s = re.sub(r"(?<!\\)\$", "", s)
    return _strip_trailing_period(s)


def _strip_trailing_period(s: str) -> str:
    s = s.strip()
    # `\.` and `\right.` are LaTeX, not punctuation.
    while s.endswith(".") and not s.endswith(("\\.", "\\right.")):
        s = s[:-1].rstrip()
    return s


def extract_answer(completion: str, *, max_chars: int = 1_000_000, max_answer_chars: int = 10_000) -> Extraction:
    """Find the final answer in `completion` (precedence in the module docstring)."""
    text = completion[-max_chars:] if len(completion) > max_chars else completion
    content, detail = last_boxed(text, max_answer_chars=max_answer_chars)
    if detail != "no_marker":
        if content is None:
            return Extraction(None, None, detail)
        return _finish(content, "boxed", max_answer_chars)
    pos = text.rfind("####")
    if pos >= 0:
        line = text[pos:].lstrip("#").split("\n", 1)[0]
        return _finish(line, "####", max_answer_chars)
    matches = list(_ANSWER_IS.finditer(text))
    last = matches[-1] if matches else None
    if last is not None:
        return _finish(_line_answer(text[last.end() :]), "answer_is", max_answer_chars)
    return Extraction(None, None, "no_marker")


def _finish(raw: str, source: str, max_answer_chars: int) -> Extraction:
    if len(raw) > max_answer_chars:
        return Extraction(None, None, "answer_too_long")
    answer = strip_math_delimiters(raw)
    if not answer:
        return Extraction(None, None, "empty")
    if not _balanced(answer):
        return Extraction(None, None, "unbalanced")
    return Extraction(answer, source)


def reference_answer(reference: str) -> str:
    """The answer part of a reference: the last box if it has one, else the text after `####`, else all of it."""
    content, _ = last_boxed(reference, max_answer_chars=len(reference))
    if content is None and "####" in reference:
        content = reference[reference.rfind("####") :].lstrip("#").split("\n", 1)[0]
    return strip_math_delimiters(reference if content is None else content)


_TEXT_COMMAND = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mbox|mathrm)\s*\{")
_SIMPLE_SUBS = [
    (re.compile(r"\\[dt]frac(?![A-Za-z])"), r"\\frac"),
    (re.compile(r"\\(?:left|right)\."), ""),
    (re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])"), ""),
    (re.compile(r"\\(?:q?quad)(?![A-Za-z])|\\[,;:! ]|~"), " "),
    (re.compile(r"\{,\}"), ","),
    (re.compile(r"\\%"), "%"),
    (re.compile(r"\\?\$"), ""),
    (re.compile(r"\s+"), " "),
    # A space survives only between two word characters ("5 cm", "\cdot x"); "x + 1" becomes "x+1".
    (re.compile(r" (?![A-Za-z0-9])|(?<![A-Za-z0-9]) "), ""),
]


def _unwrap_text_commands(s: str) -> str:
    """`\\text{abc}` -> `abc` (nested braces handled) in one left-to-right pass."""
    if "\\" not in s:
        return s
    out: list[str] = []
    # For each open brace: True when it opened a text command whose closing brace is to be dropped.
    stack: list[bool] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            m = _TEXT_COMMAND.match(s, i)
            if m:
                stack.append(True)
                i = m.end()
                continue
            out.append(s[i : i + 2])
            i += 2
            continue
        if c == "{":
            stack.append(False)
        elif c == "}" and stack and stack.pop():
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def normalize_answer(answer: str) -> str:
    """Formatting-only normalisation of an answer string, for votes and for the exact-match fast path.

    Removes math delimiters and `$`, unwraps `\\text{}`-like commands, maps `\\dfrac`/`\\tfrac` to `\\frac`, drops
    `\\left`/`\\right` and spacing commands, maps `{,}` to `,` and `\\%` to `%`, collapses whitespace (kept only
    between two word characters) and strips trailing periods. It never changes the value: "1/2" and "0.5" stay
    different strings (two cons@k votes); `VerifyResult.metadata["canonical"]` carries a value-level form when it was
    computed.
    """
    s = strip_math_delimiters(answer)
    s = _unwrap_text_commands(s)
    for pattern, repl in _SIMPLE_SUBS:
        s = pattern.sub(repl, s)
    return _strip_trailing_period(s)
