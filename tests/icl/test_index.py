"""Vector indexes: exact search against a loop-based brute-force twin; HNSW recall; incremental adds; auto switch."""

import importlib.util
import sys
import warnings

import numpy as np
import pytest

from xrpo.icl.index import AutoIndex, ExactIndex, HNSWIndex, make_index

needs_hnswlib = pytest.mark.skipif(
    importlib.util.find_spec("hnswlib") is None, reason="hnswlib (the 'hnsw' extra) is not installed"
)


def unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_force(vectors, ids, queries, k):
    """Reference twin: one query and one vector at a time, best score first, ties to the smaller id."""
    out_s, out_i = [], []
    for q in queries:
        scored = []
        for v, i in zip(vectors, ids):
            scored.append((float(np.dot(q.astype(np.float64), v.astype(np.float64))), int(i)))
        scored.sort(key=lambda t: (-t[0], t[1]))
        scored = scored[:k] + [(-np.inf, -1)] * max(0, k - len(scored))
        out_s.append([s for s, _ in scored])
        out_i.append([i for _, i in scored])
    return np.array(out_s), np.array(out_i)


@pytest.mark.parametrize("seed", range(6))
def test_exact_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(2, 40))
    n = int(rng.integers(1, 300))
    k = int(rng.integers(1, 8))
    vecs = unit(rng, n, d)
    ids = rng.permutation(10 * n)[:n]  # arbitrary, non-contiguous ids
    queries = unit(rng, int(rng.integers(1, 20)), d)
    # small chunks so that the chunk-merge path is exercised
    index = ExactIndex(d, chunk_rows=int(rng.integers(1, 64)))
    # added in a few incremental pieces
    cuts = np.sort(rng.integers(0, n, size=3))
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, n]):
        index.add(vecs[a:b], ids[a:b])
    assert len(index) == n
    s, i = index.search(queries, k)
    ref_s, ref_i = brute_force(vecs, ids, queries, k)
    assert s.dtype == np.float32 and i.dtype == np.int64 and s.shape == (len(queries), k)
    np.testing.assert_array_equal(i, ref_i)
    # float32 inner products of unit vectors against the float64 twin: a float32 dot product of length d is off by at
    # most d * u * sum |q_i v_i| <= d * u (u = 2^-24; sum |q_i v_i| <= |q| |v| = 1), plus one rounding of the result,
    # whatever order the BLAS sums in (the worst case, not what this machine happens to do)
    np.testing.assert_allclose(s, ref_s, rtol=0, atol=(d + 1) * 2**-24)


def test_exact_ties_break_to_smaller_id_across_chunks():
    # duplicate problems embed to identical vectors: the k-th slot must not depend on argpartition's whim
    rng = np.random.default_rng(0)
    v = unit(rng, 1, 8)
    others = unit(rng, 50, 8) * 0.0 + unit(rng, 1, 8)  # 50 copies of another vector
    vecs = np.concatenate([others, np.repeat(v, 7, axis=0)])
    ids = np.arange(len(vecs))[::-1].copy()  # the copies of v have ids 6..0
    for chunk in (3, 5, 1000):
        index = ExactIndex(8, chunk_rows=chunk)
        index.add(vecs, ids)
        s, i = index.search(v, 3)
        np.testing.assert_array_equal(i[0], [0, 1, 2])
        ref_s, ref_i = brute_force(vecs, ids, v, 3)
        np.testing.assert_array_equal(i, ref_i)


def test_fewer_vectors_than_k_are_padded():
    index = ExactIndex(3)
    s, i = index.search(np.ones((2, 3), np.float32) / np.sqrt(3), 2)
    assert (i == -1).all() and np.isneginf(s).all()
    index.add(np.eye(3, dtype=np.float32)[:1], [7])
    s, i = index.search(np.eye(3, dtype=np.float32)[:1], 3)
    np.testing.assert_array_equal(i, [[7, -1, -1]])
    np.testing.assert_allclose(s[0, 0], 1.0)
    assert np.isneginf(s[0, 1:]).all()


@needs_hnswlib
def test_hnsw_recall_vs_exact_on_random_data():
    # default parameters, at the default embedder's width (256): random vectors are HNSW's hardest case
    rng = np.random.default_rng(1)
    d, n = 256, 3000
    vecs = unit(rng, n, d)
    queries = unit(rng, 300, d)
    exact = ExactIndex(d)
    exact.add(vecs, np.arange(n))
    hnsw = HNSWIndex(d)
    # incremental: the graph is grown in pieces past its initial capacity (1024), exercising resize
    for a in range(0, n, 700):
        hnsw.add(vecs[a : a + 700], np.arange(a, min(a + 700, n)))
    assert hnsw._index.get_max_elements() >= n
    assert len(hnsw) == n
    _, ex_ids = exact.search(queries, 2)
    h_s, h_ids = hnsw.search(queries, 2)
    recall = np.mean([len(set(a) & set(b)) / 2 for a, b in zip(ex_ids, h_ids)])
    assert recall >= 0.95, recall
    # the scores it reports are the true inner products of the ids it returns
    # both sides are float32 dot products of unit vectors, summed in their own orders: each within (d + 1) u of the
    # exact value (u = 2^-24), and hnswlib's distance 1 - ip turned back into ip costs two more roundings
    np.testing.assert_allclose(
        h_s, np.einsum("qd,qkd->qk", queries, vecs[h_ids]), rtol=0, atol=(2 * (d + 1) + 2) * 2**-24
    )


@needs_hnswlib
def test_hnsw_small_and_padded():
    index = HNSWIndex(4)
    v = np.eye(4, dtype=np.float32)
    index.add(v[:2], [10, 11])
    s, i = index.search(v[:1], 3)
    np.testing.assert_array_equal(i, [[10, 11, -1]])
    np.testing.assert_allclose(s[0, :2], [1.0, 0.0], atol=1e-6)
    with pytest.raises(ValueError, match="already in the index"):
        index.add(v[2:3], [11])


@needs_hnswlib
def test_hnsw_is_reproducible_from_the_same_adds():
    rng = np.random.default_rng(2)
    vecs, queries = unit(rng, 1500, 32), unit(rng, 50, 32)
    results = []
    for _ in range(2):
        index = HNSWIndex(32)
        index.add(vecs[:900], np.arange(900))
        index.add(vecs[900:], np.arange(900, 1500))
        results.append(index.search(queries, 5))
    np.testing.assert_array_equal(results[0][1], results[1][1])
    np.testing.assert_array_equal(results[0][0], results[1][0])


@needs_hnswlib
def test_auto_switches_to_hnsw_at_threshold_and_keeps_adding():
    rng = np.random.default_rng(3)
    vecs = unit(rng, 600, 16)
    index = make_index(16, "auto", threshold=250)
    assert isinstance(index, AutoIndex)
    index.add(vecs[:200], np.arange(200))
    assert index.kind == "exact"
    index.add(vecs[200:300], np.arange(200, 300))
    assert index.kind == "hnsw" and len(index) == 300
    index.add(vecs[300:], np.arange(300, 600))
    assert len(index) == 600
    # every stored vector is its own nearest neighbour, including those added before the switch
    _, ids = index.search(vecs, 1)
    assert (ids[:, 0] == np.arange(600)).mean() >= 0.99


def test_bad_input():
    index = ExactIndex(4)
    with pytest.raises(ValueError, match=r"shape \(n, 4\)"):
        index.add(np.zeros((2, 3), np.float32), [0, 1])
    with pytest.raises(ValueError, match="ids must have shape"):
        index.add(np.zeros((2, 4), np.float32), [0])
    with pytest.raises(ValueError, match="distinct"):
        index.add(np.ones((2, 4), np.float32), [3, 3])
    with pytest.raises(ValueError, match=">= 0"):
        index.add(np.ones((1, 4), np.float32), [-1])
    with pytest.raises(ValueError, match="finite"):
        index.add(np.full((1, 4), np.nan, np.float32), [0])
    index.add(np.ones((1, 4), np.float32), [0])
    with pytest.raises(ValueError, match="already in the index"):
        index.add(np.ones((1, 4), np.float32), [0])
    with pytest.raises(ValueError, match="k must be"):
        index.search(np.ones((1, 4), np.float32), 0)
    with pytest.raises(ValueError, match=r"shape \(q, 4\)"):
        index.search(np.ones(4, np.float32), 1)
    with pytest.raises(ValueError, match="index kind must be one of"):
        make_index(4, "faiss")


def test_auto_stays_exact_without_hnswlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "hnswlib", None)  # makes `import hnswlib` raise ImportError
    with pytest.raises(ImportError, match=r"pip install 'xrpo\[hnsw\]'"):
        make_index(8, "hnsw")
    rng = np.random.default_rng(4)
    vecs = unit(rng, 50, 8)
    index = make_index(8, "auto", threshold=20)
    with pytest.warns(UserWarning, match="staying with exact search"):
        index.add(vecs[:30], np.arange(30))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, not on every add
        index.add(vecs[30:], np.arange(30, 50))
    assert index.kind == "exact" and len(index) == 50
    s, i = index.search(vecs[:5], 1)
    np.testing.assert_array_equal(i[:, 0], np.arange(5))
