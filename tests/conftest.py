"""Shared fixtures: a tiny tokenizer and a tiny random Qwen2 model, built once per test session.

Both are shared by every test that asks for them: do not modify them in place (deep-copy the model first).
"""

from __future__ import annotations

import pytest


def tiny_training_texts() -> list[str]:
    """Texts in the default task's format, enough for the tokenizer to learn the common merges."""
    texts = [f"Q: {a}+{b}\nA: \\boxed{{{a + b}}}" for a in range(0, 40, 3) for b in range(0, 40, 7)]
    texts += [f"Q: What is {a} * {b} - {c}?\nA: \\boxed{{{a * b - c}}}" for a, b, c in [(3, 4, 5), (12, 7, 30)]]
    texts += ["Find the greatest common divisor of 12 and 18. The answer is \\boxed{6}."]
    return texts


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from xrpo.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer(tiny_training_texts())


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    from xrpo.models.tiny import build_tiny_model

    return build_tiny_model(tiny_tokenizer, seed=0)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """Run torch single-threaded: the tiny models' matrices are too small to gain from intra-op threads, and on a
    busy 2-core machine two OpenMP threads made generation up to 8x slower (measured: 16 prompts x 8 samples x 24
    tokens took 1.15 s with 1 thread and 9.7-43 s with 2 while other processes ran)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
