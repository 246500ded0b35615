"""Models: the ones the project builds itself (a tiny tokenizer and a tiny random Qwen2, `xrpo.models.tiny`; the
built-in default model warm-started on the default task, `xrpo.models.default`) and loading any model by name
(`xrpo.models.loading`: "default", "package:NAME", GGUF, a local directory, a hub id).

Import-light: transformers and tokenizers load only when a builder is first used.
"""

from __future__ import annotations

import importlib

__all__ = ["build_tiny_tokenizer", "build_tiny_model", "TINY_CHARSET", "TINY_CHARSET_TEXTS"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("xrpo.models.tiny"), name)
    raise AttributeError(f"module 'xrpo.models' has no attribute {name!r}")
