"""The `Problem` record every other module consumes, and the error type of bad data.

A problem is one prompt with a verifiable reference answer. The prompt is either plain text (fed to the model as is,
which is what the built-in tiny model expects) or a list of chat messages (rendered with the tokenizer's chat template
by whoever builds the model input). `Problem.text` gives the user-facing question as plain text in both cases: it is
what retrieval embeds and what the ICL template quotes (paper §3.2), so it must never contain a system prompt or
earlier turns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DataError", "Problem"]


class DataError(ValueError):
    """A dataset file or row is malformed. The message names the file, the row and the field."""


def _check_messages(prompt: Sequence[Any]) -> list[dict]:
    """Validate chat messages and return them as a list of plain dicts (shallow copies)."""
    if len(prompt) == 0:
        raise ValueError("prompt: expected a non-empty list of chat messages, got an empty list")
    messages = []
    for i, msg in enumerate(prompt):
        if not isinstance(msg, Mapping):
            raise ValueError(
                f"prompt[{i}]: expected a chat message {{'role': str, 'content': str}}, got {type(msg).__name__}"
            )
        for key in ("role", "content"):
            if key not in msg:
                raise ValueError(f"prompt[{i}]: chat message has no '{key}' (keys: {sorted(msg)})")
            if not isinstance(msg[key], str):
                raise ValueError(f"prompt[{i}].{key}: expected a string, got {type(msg[key]).__name__}")
        messages.append(dict(msg))
    if not any(m["role"] == "user" for m in messages):
        roles = [m["role"] for m in messages]
        raise ValueError(f"prompt: chat messages have no 'user' message (roles: {roles})")
    return messages


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer.

    Attributes:
        id: unique, non-empty identifier; groups, the ICL corpus and checkpoints key on it.
        prompt: plain text, or chat messages ``[{"role": ..., "content": ...}, ...]`` (at least one ``user`` message;
            extra keys in a message are kept). A tuple of messages is stored as a list of dict copies.
        answer: the reference answer as a non-empty string (what the verifier compares against).
        data_source: where the problem comes from (verl uses it to pick a reward function); free text.
        metadata: anything else about the problem (difficulty, family, original fields); a dict.
    """

    id: str
    prompt: str | list[dict]
    answer: str
    data_source: str = ""
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"id: expected a non-empty string, got {self.id!r}")
        if isinstance(self.prompt, str):
            if not self.prompt.strip():
                raise ValueError(f"prompt of problem {self.id!r}: expected non-empty text, got {self.prompt!r}")
        elif isinstance(self.prompt, (list, tuple)):
            try:
                messages = _check_messages(self.prompt)
            except ValueError as e:
                raise ValueError(f"problem {self.id!r}: {e}") from None
            # frozen dataclass: normalising a field needs object.__setattr__
            object.__setattr__(self, "prompt", messages)
        else:
            raise ValueError(
                f"prompt of problem {self.id!r}: expected a string or a list of chat messages, "
                f"got {type(self.prompt).__name__}"
            )
        if not isinstance(self.answer, str):
            raise ValueError(
                f"answer of problem {self.id!r}: expected a string, got {type(self.answer).__name__} ({self.answer!r})"
            )
        if not self.answer.strip():
            # An empty reference would make every completion wrong (or, with a lenient verifier, right).
            raise ValueError(f"answer of problem {self.id!r}: expected a non-empty string, got {self.answer!r}")
        if not isinstance(self.data_source, str):
            raise ValueError(
                f"data_source of problem {self.id!r}: expected a string, got {type(self.data_source).__name__}"
            )
        if not isinstance(self.metadata, dict):
            raise ValueError(f"metadata of problem {self.id!r}: expected a dict, got {type(self.metadata).__name__}")

    @property
    def is_chat(self) -> bool:
        """True when the prompt is a list of chat messages."""
        return isinstance(self.prompt, list)

    @property
    def text(self) -> str:
        """The user-facing problem as plain text.

        For a text prompt, the prompt itself. For a chat prompt, the content of the LAST ``user`` message: system
        prompts and earlier turns (often a fixed instruction or few-shot examples shared by every problem) are left
        out, so that similarity search and the ICL template see the question alone.
        """
        if isinstance(self.prompt, str):
            return self.prompt
        for msg in reversed(self.prompt):
            if msg["role"] == "user":
                return msg["content"]
        raise AssertionError("unreachable: __post_init__ requires a user message")  # pragma: no cover
