"""Models the project builds itself: a tiny tokenizer and a tiny random Qwen2 (`xrpo.models.tiny`).

Import-light: transformers and tokenizers load only when a builder is first used.
"""

from __future__ import annotations

import importlib

__all__ = ["build_tiny_tokenizer", "build_tiny_model", "TINY_CHARSET", "TINY_CHARSET_TEXTS"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("xrpo.models.tiny"), name)
    raise AttributeError(f"module 'xrpo.models' has no attribute {name!r}")
