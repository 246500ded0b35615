"""Final-answer extraction and answer-string normalisation for the `math` verifier.

Where the answer is (the first kind present wins; within a kind the LAST occurrence counts):

1. the last `\\boxed{...}` or `\\fbox{...}` (braces matched, `\\{` / `\\}` are literal and not counted; the brace-less
   `\\boxed 5` form is accepted too). If that last box is not closed, the completion has no answer: no fallback to an
   earlier box or to the other kinds, since a truncated final box says nothing about what the model meant.
2. the last `#### X` (GSM8K style).
3. the last "answer is X" / "Answer: X" (case-insensitive, markdown `**` allowed; "The final answer is", "Final
   Answer:" alike). A marker followed by a confirmation ("... so the answer is correct", "this answer is right")
   is not an answer: the marker before it counts.
4. only with `last_number=True` (math-verify's and lighteval's anchorless fallback): the last number in the text,
   with its sign, thousands separators and percent sign.

What the answer is (the same rule in every form): the answer EXPRESSION, not the rest of a line. After a marker
(`####`, "answer is", "Answer:") the answer starts right after it, past markdown, a colon and a few words that
do not change a value ("therefore", "thus", "simply", "exactly", "equal to", ...), and is

- a formula in `$...$`, `$$...$$`, `\\(...\\)` or `\\[...\\]` (several joined by "and", "or" or commas, as in
  "$1$ and $2$", form one list, math-verify's convention), or
- a plain expression: numbers (thousands separators `1,234` or `1 234`, decimals, a currency sign before, `%`,
  "percent" after), LaTeX commands with their arguments, operators, brackets, and letters glued to the expression
  or after an operator ("2x", "x = 5"). It ends where prose begins: at a sentence's end (". ", "!", "?", ":"; in
  plain text "18!" is an exclamation, a factorial is written in a formula or a box), a newline, the end of a bold
  span, a comma or semicolon not followed by another item ("18, since ..." but "1, 2"), a dash before a word
  ("18 - the number of girls"), `°`, or a word after a space ("18 girls", "1/2 because ..."). Words that belong to
  the value stay: "percent", scale words ("2 million" stays as written and matches neither 2 nor 2000000), math
  words ("sqrt", "pi"), "or" with what follows it (a hedged "18 or 19" is a list of two values, never 18), and a
  second number after the units ("3 hours and 20 minutes", "5 feet 2 inches": one quantity in mixed units, read
  whole to the end of its sentence, so it matches no single number).
- text: an answer that starts with a word (not a single letter) is a text answer, read to the end of its sentence
  ("Monday", "not 18", "between 18 and 20"), so negations and ranges never grade as their number.

Inside a delimited answer (a box, a formula) everything is the answer except trailing units: when the expression
is followed only by words, `\\text{...}` units, `/`, `^2`, `°` or periods, those are dropped ("\\boxed{18 girls}"
-> "18", "\\boxed{5 \\text{ cm}^2}" -> "5"), unless the first is a single letter (a variable: "2 x"); anything
else after it (a number, a scale word, `!`, a connective) keeps the whole answer for math-verify to read.

Only the last box counts, so a completion that boxes many different values is graded on its final one (this is the
reward-hacking guard: spraying candidates does not help). A completion longer than `max_chars` is searched only in its
last `max_chars` characters. An answer longer than `max_answer_chars` is not graded (reason "answer_too_long").
Every step is a linear scan of at most `max_answer_chars` characters per marker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "Extraction",
    "drop_units",
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
        source: "boxed", "####", "answer_is" or "last_number"; None when none was found.
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


# ---------------------------------------------------------------------------------------------- the answer expression
# A number: thousands separators (`1,234`, `1{,}234`, `1\,234`, `1 234`), decimals, a bare `.5`.
_NUMBER = r"\d{1,3}(?:(?:,|\{,\}|\\,|[ \u00a0\u202f])\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+"
# Spaces between digit groups: math-verify's LaTeX parser reads "1 234" as 1 + 234, so they are removed.
_SPACED_THOUSANDS = re.compile(
    r"(?<![\d.])\d{1,3}(?:(?:\\,|[ \u00a0\u202f])\d{3})+(?=\.\d|(?![\d.]|[ \u00a0\u202f]\d))"
)
_TEXT_CMD = r"\\(?:text|textbf|textit|textrm|textnormal|mbox|mathrm)\s*\{"
_TOKEN = re.compile(
    r"(?P<ws>[ \t\u00a0~]+|\\(?:[,;:! ]|q?quad(?![A-Za-z])))"
    r"|(?P<nl>[\r\n]|\\\\)"
    rf"|(?P<num>{_NUMBER})"
    rf"|(?P<text>{_TEXT_CMD})"
    r"|(?P<cmd>\\(?:(?:left|right)\.|[A-Za-z]+|.))"
    r"|(?P<word>[^\W\d_]+)"
    r"|(?P<open>[(\[{])"
    r"|(?P<close>[)\]}])"
    r"|(?P<sep>[,;])"
    r"|(?P<end>\*\*|[.:!?\"'`\u2014\u2013])"
    r"|(?P<dollar>\$)"
    r"|(?P<op>.)",
    re.S,
)
# Words that are part of a value, wherever they stand.
_MATH_WORDS = frozenset(
    "sqrt cbrt pi infinity inf sin cos tan cot sec csc arcsin arccos arctan log ln exp mod gcd lcm max min".split()
)
_PERCENT_WORDS = frozenset(("percent", "percentage", "pct"))
# After a number they change its value: "2 million" is not 2, so the word stays in the answer (which then matches
# neither 2 nor 2000000: the verifier does not read number words).
_SCALE_WORDS = frozenset(
    "hundred thousand million billion trillion dozen hundreds thousands millions billions dozens".split()
)
# What may stand between a marker and its answer without changing it.
_LEAD = re.compile(
    r"(?:[ \t\r\n*:=\"'`]+|(?:therefore|thus|hence|then|so|indeed|clearly|simply|just|exactly|precisely|also|still|now"
    r"|definitely|certainly|actually|really|finally|equal\s+to|equals|given\s+by)\b,?)*",
    re.I,
)
# A marker followed by one of these confirms an earlier answer ("I think the answer is correct").
_VERDICT = re.compile(
    r"(?:correct|right|reasonable|valid|plausible|consistent|confirmed|verified|sensible|accurate)\b", re.I
)
# Another item of a list after a comma, "and" or "or": a number, a formula, a command, a bracket, or one letter that
# is not the start of prose ("x = 2" is an item, "I think" and "a day" are not).
_ITEM = re.compile(
    r"[ \t]*(?:(?:and|or)\b[ \t]*)?"
    r"(?:[-\u2212+]?\.?\d|\$|\\|[(\[{]|[^\W\d_](?![^\W\d_])(?![ \t]+[^\W\d_]{2}))",
    re.I,
)
# `$` before a number is a currency sign unless it opens a formula of math only (`$18$`, `$5 \times 3 = 15$`).
_CURRENCY = re.compile(r"\$[ \t]?(?=\.?\d)")
# What may follow the expression of a delimited answer and still be dropped as its unit.
_UNITS = re.compile(
    rf"(?!\s*[^\W\d_](?![^\W\d_]))"  # a single letter after the expression is a variable ("2 x"), not a unit
    rf"(?:\s|\\[,;:! ]|~|{_TEXT_CMD}[^{{}}]*\}}|[^\W\d_]+|[/.\u00b0]|\^\{{?[23]\}}?|[\u00b2\u00b3])*"
)
# A number with units followed by another number with units: one quantity in mixed units, not a single value.
_MIXED_UNITS = re.compile(rf"[^\W\d_]{{2,}}[ \t]+(?:and[ \t]+)?(?:{_NUMBER})[ \t]*[^\W\d_]{{2,}}", re.I)
_PROSE_WORD = re.compile(r"[ \t]+(?!(?:" + "|".join(sorted(_MATH_WORDS)) + r")\b)[^\W\d_]{2,}", re.I)
_CONNECTIVE_TEXT = re.compile(rf"{_TEXT_CMD}\s*(?:and|or|,)\s*\}}", re.I)
_LAST_NUMBER = re.compile(
    rf"(?:(?<![\w)\]}}])-)?(?<![\w.])(?<!\d,)(?:{_NUMBER})(?:[ \t]?(?:\\?%|percent\b))?",
    re.I,
)


def _scan(text: str, i: int, stop: int) -> tuple[int, str]:
    """Scan the plain answer expression that starts at `text[i]`, reading no further than `stop`.

    Returns `(end, how)`: the expression is `text[i:end]`; `how` is "expr" (it ended where prose or punctuation
    begins), "text" (it starts with a word: a text answer, `end` is then the end of its sentence), "open" (it ran
    into `stop`) or "unbalanced" (a `}` closes a group that was never opened).
    """
    depth, last, gap, end, pos = 0, None, False, i, i
    while pos < stop:
        m = _TOKEN.match(text, pos, stop)
        kind, tok = m.lastgroup, m.group()
        nxt = m.end()
        if kind == "ws":
            gap, pos = True, nxt
            continue
        if depth > 0:  # inside brackets everything belongs to the answer, up to the end of the line
            if kind == "nl":
                return end, "expr"
            if kind in ("open", "text"):
                depth += 1
            elif kind == "close":
                depth -= 1
            end, last, gap, pos = nxt, "operand", False, nxt
            continue
        role = None  # "operand" or "operator" when the token is taken; None ends the expression
        if kind == "num":
            role = None if last == "operand" and gap else "operand"  # "18 20": a second number is not the answer
        elif kind == "word":
            w = tok.lower()
            if last is None and len(tok) > 1 and w not in _MATH_WORDS:
                return _sentence_end(text, i, stop), "text"
            if w in _MATH_WORDS or last != "operand" or not gap:
                role = "operand"  # "sqrt", "x + y", "2x"
            elif w in _PERCENT_WORDS or w in _SCALE_WORDS:
                role = "operand"
            elif w == "or" or (w == "and" and _ITEM.match(text, nxt)):
                role = "operator"
            elif _MIXED_UNITS.match(text, pos):
                return _sentence_end(text, i, stop), "text"  # "3 hours and 20 minutes" is not 3
        elif kind == "text":
            close = _group_end(text, nxt - 1, stop)
            if close is None:
                return stop, "open"
            if _CONNECTIVE_TEXT.fullmatch(text, pos, close):
                role = "operator"
            elif last is None:
                return _sentence_end(text, i, stop), "text"
            elif last == "operator":
                role, nxt = "operand", close
        elif kind == "cmd":
            role = "operand" if tok == "\\%" else "operator"  # a command's arguments follow it, spaces or not
        elif kind == "open":
            if not (last == "operand" and gap):  # "18 (since ...)": a remark in brackets
                depth, role = 1, "operator"
        elif kind == "close":
            if tok == "}":
                return end, "unbalanced"
        elif kind == "sep":
            if last is not None and _ITEM.match(text, nxt):
                role = "operator"
        elif kind == "dollar":
            if _CURRENCY.match(text, pos):
                role = "operator"
        elif kind == "op":
            if tok == "%":
                role = "operand"
            elif tok != "\u00b0" and not (last == "operand" and gap and _PROSE_WORD.match(text, nxt)):
                role = "operator"  # but "18 - the number of boys": a dash between words is punctuation
        if role is None:
            return end, "expr"
        end, last, gap, pos = nxt, role, False, nxt
    return end, "open"


def _group_end(text: str, brace: int, stop: int) -> int | None:
    """Index just past the `}` matching the `{` at `text[brace]`, or None before `stop`."""
    depth = 0
    for m in _BRACE_TOKEN.finditer(text, brace, stop):
        depth += 1 if m.group() == "{" else -1 if m.group() == "}" else 0
        if depth == 0:
            return m.end()
    return None


_SENTENCE_END = re.compile(r"[\r\n]|[.!?;](?=\s|$)|\*\*")


def _sentence_end(text: str, i: int, stop: int) -> int:
    m = _SENTENCE_END.search(text, i, stop)
    return m.start() if m else stop


def drop_units(answer: str) -> str:
    """The answer without trailing units: an expression followed only by words (the first not a single letter: "2 x"
    is a product), `\\text{}` units, `/`, `^2`, `°` or periods loses them ("18 girls" -> "18", "5 \\text{ cm}^2" -> "5",
    "12 km/h" -> "12"). A text answer is returned whole; so is an expression followed by anything else (a number, a
    scale word, a connective), with its `\\text{}` words unwrapped: math-verify drops a trailing `\\text{...}` as a
    unit, which would read "2 \\text{ million}" as 2 and "3 \\text{ hours } 20 \\text{ minutes}" as 3."""
    end, how = _scan(answer, 0, len(answer))
    rest = answer[end:]
    if how != "expr" or not rest.strip() or end == 0:
        return answer
    words = {w.lower() for w in re.findall(r"[^\W\d_]+", _TEXT_COMMAND.sub("", rest))}
    if _UNITS.fullmatch(rest) and not words & (_SCALE_WORDS | _MATH_WORDS):
        return answer[:end].rstrip()
    return _unwrap_text_commands(answer)


def _formula_at(text: str, i: int, stop: int) -> tuple[int, int, int] | None:
    """`(content start, content end, end)` of the formula opening at `text[i]`, or None: no formula opens there,
    or `$` is a currency sign (`$18 and $20`)."""
    for left, right in _DELIMITED:
        if text.startswith(left, i):
            a = i + len(left)
            b = text.find(right, a, stop + len(right))
            if left == "$":
                if b < 0 or "\n" in text[a:b]:
                    return None  # not closed on its line: a currency sign
                if _CURRENCY.match(text, i) and re.search(r"(?<!\\)[^\W\d_]{2}", text[a:b]):
                    return None  # words inside: `$18 and $` is money, not a formula
            if b < 0:
                return (a, stop, stop)
            return (a, b, b + len(right))
    return None


_JOIN = re.compile(r"[ \t]*(?:,[ \t]*(?:(?:and|or)\b[ \t]*)?|(?:and|or)\b[ \t]*)", re.I)


def _answer_after(text: str, i: int, max_answer_chars: int) -> tuple[str | None, str | None]:
    """The answer that follows a marker ending at `text[i]`: `(answer, None)` or `(None, detail)`; the detail is
    "confirmation" when the marker is followed by a confirmation instead of an answer."""
    for _ in range(4):  # a few empty formulas (`$$$$`) are markup; a long run of them is not worth a scan
        i = _LEAD.match(text, i).end()
        f = _formula_at(text, i, min(len(text), i + max_answer_chars + 4))
        if f is None or f[1] > f[0] or f[2] == f[1]:
            break
        i = f[2]
    if _VERDICT.match(text, i):
        return None, "confirmation"
    # room past the cap to see where the expression ends (an answer ending at the cap may be followed by a unit)
    stop = min(len(text), i + max_answer_chars + 64)
    f = _formula_at(text, i, stop)
    if f is not None:
        parts = []
        while f is not None:
            if f[2] == stop and f[1] == stop:
                return None, ("answer_too_long" if stop < len(text) else "unbalanced")
            parts.append(text[f[0] : f[1]])
            j = _JOIN.match(text, f[2])
            f = _formula_at(text, j.end(), stop) if j and j.end() > f[2] else None
        answer = ", ".join(p.strip() for p in parts)
        return (None, "answer_too_long") if len(answer) > max_answer_chars else (drop_units(answer), None)
    if _CURRENCY.match(text, i):
        i = _CURRENCY.match(text, i).end()
    elif text.startswith("$", i):
        i += 1  # a formula never closed: read what follows
    end, how = _scan(text, i, stop)
    if how == "unbalanced":
        return None, "unbalanced"
    if (how == "open" and stop < len(text)) or end - i > max_answer_chars:
        return None, "answer_too_long"
    return text[i:end], None


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


def extract_answer(
    completion: str, *, max_chars: int = 1_000_000, max_answer_chars: int = 10_000, last_number: bool = False
) -> Extraction:
    """Find the final answer in `completion` (where and what: the module docstring). `last_number`: fall back to
    the last number in the text when no marker is found."""
    text = completion[-max_chars:] if len(completion) > max_chars else completion
    content, detail = last_boxed(text, max_answer_chars=max_answer_chars)
    if detail != "no_marker":
        if content is None:
            return Extraction(None, None, detail)
        return _finish(drop_units(content), "boxed")
    pos = text.rfind("####")
    if pos >= 0:
        answer, detail = _answer_after(text, pos + 4, max_answer_chars)
        if answer is None:
            return Extraction(None, None, "empty" if detail == "confirmation" else detail)
        return _finish(answer, "####")
    for m in reversed(list(_ANSWER_IS.finditer(text))):
        answer, detail = _answer_after(text, m.end(), max_answer_chars)
        if detail != "confirmation":  # after a confirmation the marker before it counts
            return _finish(answer, "answer_is") if answer is not None else Extraction(None, None, detail)
    if last_number:
        numbers = _LAST_NUMBER.findall(text)
        if numbers:
            return _finish(numbers[-1], "last_number")
    return Extraction(None, None, "no_marker")


def _finish(raw: str, source: str) -> Extraction:
    answer = _SPACED_THOUSANDS.sub(lambda m: re.sub(r"\\,|\s", "", m.group()), strip_math_delimiters(raw))
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
