"""Vector indexes for ICL retrieval: exact (numpy) for small corpora, HNSW (hnswlib) for large ones.

Vectors are L2-normalised, so the inner product is the cosine similarity and a higher score is a closer neighbour.
Every index takes integer ids chosen by the caller (the corpus uses its row numbers) and grows by incremental `add`.
`search` returns ``(scores, ids)`` of shape (q, k), best first; when the index holds fewer than k vectors the missing
slots are padded with score ``-inf`` and id ``-1``.

`make_index(dim, kind="auto")` starts exact and moves to HNSW once the index holds ``threshold`` vectors (default
10,000): an exact query streams the whole matrix (its cost grows linearly with the corpus), while an HNSW query
stays nearly flat on text embeddings; below the threshold exact search is exact, fast enough, and skips the graph
build. Figures and the command: `benchmarks/bench_icl.py`, docs/benchmarks.md and docs/icl.md.

HNSW defaults (M=32, ef_construction=200, ef_search=128): recall@2 1.0 on text embeddings up to 100k (ties counted),
and >= 0.95 on 3,000 random 256-d vectors (tests/icl/test_index.py); random vectors have no neighbourhood structure
and are the hardest case (0.44 at 100k).
"""

from __future__ import annotations

import struct
import warnings
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = [
    "DEFAULT_HNSW_THRESHOLD",
    "INDEX_KINDS",
    "AutoIndex",
    "ExactIndex",
    "HNSWIndex",
    "VectorIndex",
    "make_index",
]

DEFAULT_HNSW_THRESHOLD = 10_000
INDEX_KINDS = ("auto", "exact", "hnsw")


@runtime_checkable
class VectorIndex(Protocol):
    dim: int

    def __len__(self) -> int: ...

    def add(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        """Append (n, dim) vectors under n distinct integer ids not already in the index."""
        ...

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product: float32 scores and int64 ids, each (q, k), best first."""
        ...


def _check_add(dim: int, vectors, ids) -> tuple[np.ndarray, np.ndarray]:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise ValueError(f"vectors must have shape (n, {dim}), got {vectors.shape}")
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.shape[0] != vectors.shape[0]:
        raise ValueError(f"ids must have shape ({vectors.shape[0]},), got {ids.shape}")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be integers, got dtype {ids.dtype}")
    ids = ids.astype(np.int64)
    if ids.size and ids.min() < 0:
        raise ValueError("ids must be >= 0 (-1 marks an empty result slot)")
    if np.unique(ids).size != ids.size:
        raise ValueError("ids must be distinct")
    if not np.isfinite(vectors).all():
        raise ValueError("vectors must be finite")
    return vectors, ids


def _check_search(dim: int, queries, k) -> np.ndarray:
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    queries = np.asarray(queries, dtype=np.float32)
    if queries.ndim != 2 or queries.shape[1] != dim:
        raise ValueError(f"queries must have shape (q, {dim}), got {queries.shape}")
    return queries


def _empty_result(q: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((q, k), -np.inf, dtype=np.float32), np.full((q, k), -1, dtype=np.int64)


def _sort_desc(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: best k by score, ties broken by smaller id so that results do not depend on chunking."""
    order = np.lexsort((ids, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(ids, order, axis=1)


class ExactIndex:
    """Brute-force inner product: chunked matmul + argpartition. Exact; cost linear in the number of vectors.

    Args:
        dim: vector width.
        chunk_rows: index rows scored per matmul, bounding the (q, chunk_rows) score buffer.
    """

    def __init__(self, dim: int, *, chunk_rows: int = 32_768):
        if not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ValueError(f"dim must be an int >= 1, got {dim!r}")
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.dim = int(dim)
        self.chunk_rows = int(chunk_rows)
        # capacity doubles on growth so that n single-row adds cost O(n) copies in total, not O(n^2)
        self._vecs = np.zeros((0, self.dim), dtype=np.float32)
        self._ids = np.zeros(0, dtype=np.int64)
        self._n = 0
        self._id_set: set[int] = set()

    def __len__(self) -> int:
        return self._n

    @property
    def vectors(self) -> np.ndarray:
        return self._vecs[: self._n]

    @property
    def ids(self) -> np.ndarray:
        return self._ids[: self._n]

    def add(self, vectors, ids) -> None:
        vectors, ids = _check_add(self.dim, vectors, ids)
        dup = self._id_set.intersection(ids.tolist())
        if dup:
            raise ValueError(f"ids already in the index: {sorted(dup)[:5]}")
        n_new = self._n + vectors.shape[0]
        if n_new > self._vecs.shape[0]:
            cap = max(n_new, 2 * self._vecs.shape[0], 64)
            vecs = np.zeros((cap, self.dim), dtype=np.float32)
            vecs[: self._n] = self._vecs[: self._n]
            idarr = np.zeros(cap, dtype=np.int64)
            idarr[: self._n] = self._ids[: self._n]
            self._vecs, self._ids = vecs, idarr
        self._vecs[self._n : n_new] = vectors
        self._ids[self._n : n_new] = ids
        self._n = n_new
        self._id_set.update(ids.tolist())

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        queries = _check_search(self.dim, queries, k)
        q = queries.shape[0]
        if q == 0 or self._n == 0:
            return _empty_result(q, k)
        kk = min(k, self._n)
        cand_s, cand_i, ragged = [], [], False
        for start in range(0, self._n, self.chunk_rows):
            stop = min(start + self.chunk_rows, self._n)
            # float64 accumulation, rounded to float32: BLAS kernels sum a row differently depending on where it
            # falls in the block (OpenBLAS 0.3.31 gave duplicate vectors scores 1 ulp apart), which broke the exact
            # id tie-break between duplicate problems; in float64 those differences vanish in the rounding
            scores = (queries.astype(np.float64) @ self._vecs[start:stop].T.astype(np.float64)).astype(np.float32)
            ids = self._ids[start:stop]
            kc = min(kk, stop - start)
            if kc == stop - start:
                cand_s.append(scores)
                cand_i.append(np.broadcast_to(ids, scores.shape))
                continue
            part = np.argpartition(-scores, kc - 1, axis=1)[:, :kc]
            top = np.take_along_axis(scores, part, axis=1)
            # argpartition picks arbitrarily among vectors tied with the k-th score (duplicate problems embed to
            # identical vectors); keep every tied one so that the final id tie-break is exact
            thr = top.min(axis=1, keepdims=True)
            if (np.count_nonzero(scores >= thr, axis=1) > kc).any():
                ragged = True
                rows = [np.flatnonzero(scores[r] >= thr[r, 0]) for r in range(q)]
                cand_s.append([scores[r, c] for r, c in enumerate(rows)])
                cand_i.append([ids[c] for c in rows])
            else:
                cand_s.append(top)
                cand_i.append(ids[part])
        if not ragged:
            s, i = _sort_desc(np.concatenate(cand_s, axis=1), np.concatenate(cand_i, axis=1), kk)
        else:
            s, i = _empty_result(q, kk)
            for r in range(q):
                rs = np.concatenate([np.asarray(c[r]) for c in cand_s])
                ri = np.concatenate([np.asarray(c[r]) for c in cand_i])
                order = np.lexsort((ri, -rs))[:kk]
                s[r], i[r] = rs[order], ri[order]
        if kk < k:
            out_s, out_i = _empty_result(q, k)
            out_s[:, :kk], out_i[:, :kk] = s, i
            return out_s, out_i
        return s.astype(np.float32, copy=False), i


class HNSWIndex:
    """Approximate inner-product search on an HNSW graph (hnswlib; the ``hnsw`` extra), grown incrementally.

    Args:
        dim: vector width.
        M: graph degree (hnswlib's M, >= 2); higher = better recall, more memory.
        ef_construction: candidate list size while inserting.
        ef_search: candidate list size while searching (raised to k when k is larger).
        initial_capacity: preallocated slots; capacity doubles when full.
        seed: hnswlib's random seed (level assignment).
        num_threads: insertion threads; 1 (the default) makes the graph, hence every search result, reproducible
            from the same vectors added in the same order, which a reloaded corpus relies on.
    """

    def __init__(
        self,
        dim: int,
        *,
        M: int = 32,
        ef_construction: int = 200,
        ef_search: int = 128,
        initial_capacity: int = 1024,
        seed: int = 0,
        num_threads: int = 1,
    ):
        try:
            import hnswlib
        except ImportError as e:
            raise ImportError("index kind 'hnsw' needs hnswlib: pip install 'xrpo[hnsw]'") from e
        if not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ValueError(f"dim must be an int >= 1, got {dim!r}")
        if M < 2:  # hnswlib's level factor is 1 / ln M: M = 1 builds no graph (its first add fails)
            raise ValueError(f"M must be >= 2, got {M}")
        for arg, v in (
            ("ef_construction", ef_construction),
            ("ef_search", ef_search),
            ("initial_capacity", initial_capacity),
            ("num_threads", num_threads),
        ):
            if v < 1:
                raise ValueError(f"{arg} must be >= 1, got {v}")
        self.dim = int(dim)
        self.ef_search = int(ef_search)
        self.num_threads = int(num_threads)
        self._index = hnswlib.Index(space="ip", dim=self.dim)
        self._index.init_index(
            max_elements=int(initial_capacity), M=int(M), ef_construction=int(ef_construction), random_seed=int(seed)
        )
        self._index.set_ef(self.ef_search)
        self._id_set: set[int] = set()

    def __len__(self) -> int:
        return len(self._id_set)

    @property
    def ids(self) -> np.ndarray:
        return np.sort(np.fromiter(self._id_set, dtype=np.int64, count=len(self._id_set)))

    def save(self, path) -> None:
        """Write the graph (hnswlib's own format) so that a reload skips the build."""
        self._index.save_index(str(path))

    @classmethod
    def load(cls, path, dim: int, *, ef_search: int = 128, num_threads: int = 1) -> HNSWIndex:
        """Read a graph written by `save`; M and ef_construction come from the file."""
        self = cls.__new__(cls)
        try:
            import hnswlib
        except ImportError as e:
            raise ImportError("index kind 'hnsw' needs hnswlib: pip install 'xrpo[hnsw]'") from e
        self.dim = int(dim)
        saved = _saved_dim(path)
        if saved != self.dim:  # hnswlib would load it and read each vector with the wrong length
            raise ValueError(f"{path}: holds a graph of {saved}-dimensional vectors, not dim={self.dim}")
        self.ef_search = int(ef_search)
        self.num_threads = int(num_threads)
        self._index = hnswlib.Index(space="ip", dim=self.dim)
        self._index.load_index(str(path))
        self._index.set_ef(self.ef_search)
        self._id_set = set(int(i) for i in self._index.get_ids_list())
        return self

    def add(self, vectors, ids) -> None:
        vectors, ids = _check_add(self.dim, vectors, ids)
        if ids.size == 0:
            return
        dup = self._id_set.intersection(ids.tolist())
        if dup:
            # hnswlib would silently overwrite an existing label
            raise ValueError(f"ids already in the index: {sorted(dup)[:5]}")
        need = len(self) + ids.size
        cap = self._index.get_max_elements()
        if need > cap:
            self._index.resize_index(max(need, 2 * cap))
        self._index.add_items(vectors, ids.astype(np.uint64), num_threads=self.num_threads)
        self._id_set.update(ids.tolist())

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        queries = _check_search(self.dim, queries, k)
        q, n = queries.shape[0], len(self)
        if q == 0 or n == 0:
            return _empty_result(q, k)
        kk = min(k, n)
        self._index.set_ef(max(self.ef_search, kk))
        labels, dists = self._index.knn_query(queries, k=kk, num_threads=self.num_threads)
        # hnswlib's "ip" space returns 1 - <x, y>
        s, i = _sort_desc(1.0 - dists.astype(np.float32), labels.astype(np.int64), kk)
        if kk < k:
            out_s, out_i = _empty_result(q, k)
            out_s[:, :kk], out_i[:, :kk] = s, i
            return out_s, out_i
        return s, i


def _saved_dim(path) -> int:
    """The vector dimension of a graph hnswlib saved: its header starts with six size_t fields (offsetLevel0,
    max_elements, cur_element_count, size_data_per_element, label_offset, offsetData), and a vector of float32 takes
    label_offset - offsetData bytes."""
    with open(path, "rb") as f:
        head = f.read(48)
    if len(head) < 48:
        raise ValueError(f"{path}: not a graph saved by HNSWIndex.save (file too short)")
    label_offset, offset_data = struct.unpack("<6Q", head)[4:6]
    return (label_offset - offset_data) // 4


class AutoIndex:
    """Exact until ``threshold`` vectors, then an HNSW graph built from the stored vectors and grown from there.

    If hnswlib is not installed it stays exact (with one warning) instead of failing: slower, never wrong.
    """

    def __init__(self, dim: int, *, threshold: int = DEFAULT_HNSW_THRESHOLD, **hnsw_kwargs):
        if threshold < 1:
            raise ValueError(f"threshold must be >= 1, got {threshold}")
        self.dim = int(dim)
        self.threshold = int(threshold)
        self._hnsw_kwargs = hnsw_kwargs
        self._index: ExactIndex | HNSWIndex = ExactIndex(dim)
        self._hnsw_unavailable = False

    @property
    def kind(self) -> str:
        return "hnsw" if isinstance(self._index, HNSWIndex) else "exact"

    @property
    def inner(self) -> ExactIndex | HNSWIndex:
        """The index currently answering searches."""
        return self._index

    def adopt(self, index: HNSWIndex) -> None:
        """Continue from a prebuilt graph (a reloaded corpus) instead of the exact index; only while empty."""
        if len(self._index):
            raise ValueError("adopt() needs an empty AutoIndex")
        if index.dim != self.dim:
            raise ValueError(f"the adopted index has dim {index.dim}, expected {self.dim}")
        self._index = index

    def __len__(self) -> int:
        return len(self._index)

    def add(self, vectors, ids) -> None:
        self._index.add(vectors, ids)
        if isinstance(self._index, ExactIndex) and len(self._index) >= self.threshold and not self._hnsw_unavailable:
            try:
                hnsw = HNSWIndex(self.dim, initial_capacity=2 * len(self._index), **self._hnsw_kwargs)
            except ImportError as e:
                self._hnsw_unavailable = True
                warnings.warn(f"{e}; staying with exact search above {self.threshold} vectors", stacklevel=2)
                return
            hnsw.add(self._index.vectors, self._index.ids)
            self._index = hnsw

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self._index.search(queries, k)


def make_index(dim: int, kind: str = "auto", **kwargs) -> VectorIndex:
    """``"exact"`` -> `ExactIndex`, ``"hnsw"`` -> `HNSWIndex`, ``"auto"`` -> `AutoIndex` (exact, HNSW from
    ``threshold`` = 10,000 vectors on). ``kwargs`` go to the chosen class."""
    if kind == "exact":
        return ExactIndex(dim, **kwargs)
    if kind == "hnsw":
        return HNSWIndex(dim, **kwargs)
    if kind == "auto":
        return AutoIndex(dim, **kwargs)
    raise ValueError(f"index kind must be one of {INDEX_KINDS}, got {kind!r}")
