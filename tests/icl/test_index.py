"""Vector indexes: exact search against a loop-based brute-force twin; HNSW recall; incremental adds; auto switch."""

import importlib.util
import sys
import warnings

import numpy as np
import pytest

from xrpo.icl.index import DEFAULT_HNSW_THRESHOLD, AutoIndex, ExactIndex, HNSWIndex, make_index

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


def test_exact_matches_brute_force_over_every_small_chunking():
    # every (n, chunk_rows, k) up to a chunk one row longer than the index and k past n: chunks smaller than, equal to
    # and one row longer than k, the last chunk short, and padding
    rng = np.random.default_rng(10)
    d = 5
    for n in range(1, 10):
        vecs = unit(rng, n, d)
        ids = rng.permutation(3 * n)[:n]
        queries = unit(rng, 3, d)
        for chunk in range(1, n + 2):
            index = ExactIndex(d, chunk_rows=chunk)
            index.add(vecs, ids)
            for k in range(1, n + 3):
                s, i = index.search(queries, k)
                ref_s, ref_i = brute_force(vecs, ids, queries, k)
                assert s.dtype == np.float32 and i.dtype == np.int64 and s.shape == i.shape == (3, k)
                np.testing.assert_array_equal(i, ref_i, err_msg=f"n={n} chunk={chunk} k={k}")
                # float32 dot products of unit vectors against the float64 twin: within (d + 1) u (u = 2^-24), as in
                # test_exact_matches_brute_force; the padding is -inf on both sides
                np.testing.assert_allclose(s, ref_s, rtol=0, atol=(d + 1) * 2**-24)


def test_exact_ties_on_exact_integer_scores_over_every_chunking():
    # vectors and queries with entries in {-1, 0, 1}: every inner product is a small integer, exact in float32 and
    # float64, so many vectors tie, at the top and at the k-th slot alike, and differently for each query (some rows
    # of a chunk have more ties at their k-th score than others); ties go to the smaller id whatever the chunking
    rng = np.random.default_rng(11)
    d = 3
    for n in (4, 7, 12):
        for trial in range(3):
            vecs = rng.integers(-1, 2, size=(n, d)).astype(np.float32)
            ids = rng.permutation(5 * n)[:n]
            queries = rng.integers(-1, 2, size=(4, d)).astype(np.float32)
            for chunk in range(1, n + 2):
                index = ExactIndex(d, chunk_rows=chunk)
                index.add(vecs, ids)
                for k in range(1, n + 2):
                    s, i = index.search(queries, k)
                    ref_s, ref_i = brute_force(vecs, ids, queries, k)
                    msg = f"n={n} trial={trial} chunk={chunk} k={k}"
                    np.testing.assert_array_equal(i, ref_i, err_msg=msg)
                    np.testing.assert_array_equal(s, ref_s, err_msg=msg)  # integers: exact


def test_exact_grows_past_its_initial_buffer_one_row_at_a_time():
    # 150 single-row adds go past the first buffer and its doubling; then one bulk add larger than the buffer
    rng = np.random.default_rng(12)
    d = 6
    vecs = unit(rng, 450, d)
    ids = rng.permutation(1000)[:450]
    index = ExactIndex(d, chunk_rows=7)
    for r in range(150):
        index.add(vecs[r : r + 1], ids[r : r + 1])
        assert len(index) == r + 1
    index.add(vecs[150:], ids[150:])
    assert len(index) == 450
    # what was stored is what was added, in order
    np.testing.assert_array_equal(index.vectors, vecs)
    np.testing.assert_array_equal(index.ids, ids)
    queries = unit(rng, 4, d)
    s, i = index.search(queries, 5)
    ref_s, ref_i = brute_force(vecs, ids, queries, 5)
    np.testing.assert_array_equal(i, ref_i)
    # float32 dot products of unit vectors against the float64 twin: within (d + 1) u, as above
    np.testing.assert_allclose(s, ref_s, rtol=0, atol=(d + 1) * 2**-24)


def test_exact_empty_index_empty_add_and_no_queries():
    index = ExactIndex(2)
    index.add(np.zeros((0, 2), np.float32), np.zeros(0, np.int64))
    assert len(index) == 0 and index.ids.shape == (0,) and index.vectors.shape == (0, 2)
    s, i = index.search(np.eye(2, dtype=np.float32), 3)
    assert s.dtype == np.float32 and i.dtype == np.int64
    np.testing.assert_array_equal(i, np.full((2, 3), -1))
    np.testing.assert_array_equal(s, np.full((2, 3), -np.inf))
    index.add(np.eye(2, dtype=np.float32), [4, 9])
    s, i = index.search(np.zeros((0, 2), np.float32), 3)
    assert s.shape == i.shape == (0, 3) and s.dtype == np.float32 and i.dtype == np.int64


def test_exact_constructor_checks():
    for dim in (0, -3, 2.5):
        with pytest.raises(ValueError, match=rf"dim must be an int >= 1, got {dim!r}"):
            ExactIndex(dim)
    for chunk in (0, -1):
        with pytest.raises(ValueError, match=rf"chunk_rows must be >= 1, got {chunk}"):
            ExactIndex(4, chunk_rows=chunk)
    with pytest.raises(TypeError):
        ExactIndex(4, 8)  # chunk_rows is keyword-only
    # the smallest valid values work: one-wide vectors, one row per chunk
    index = ExactIndex(1, chunk_rows=1)
    index.add(np.array([[0.5], [2.0], [-1.0], [2.0]], np.float32), [3, 8, 5, 1])
    s, i = index.search(np.array([[1.0], [-1.0]], np.float32), 3)
    # scores are the values themselves (query 1) or their negatives (query -1), ties to the smaller id
    np.testing.assert_array_equal(i, [[1, 8, 3], [5, 3, 1]])
    np.testing.assert_array_equal(s, [[2.0, 2.0, 0.5], [1.0, -0.5, -2.0]])
    assert index.dim == 1 and index.chunk_rows == 1


def test_negative_id_anywhere_in_the_batch_is_refused():
    index = ExactIndex(2)
    with pytest.raises(ValueError, match=">= 0"):
        index.add(np.eye(2, dtype=np.float32), [3, -1])
    assert len(index) == 0


def test_default_hnsw_threshold_is_10000():
    # documented: make_index(dim, "auto") moves to HNSW at 10,000 vectors
    assert DEFAULT_HNSW_THRESHOLD == 10_000
    assert make_index(4).threshold == 10_000
    assert AutoIndex(4).threshold == 10_000


def test_auto_threshold_checks():
    for t in (0, -2):
        with pytest.raises(ValueError, match=rf"threshold must be >= 1, got {t}"):
            AutoIndex(4, threshold=t)
    with pytest.raises(TypeError):
        AutoIndex(4, 5)  # threshold is keyword-only
    assert AutoIndex(4, threshold=1).threshold == 1


def test_make_index_forwards_keyword_arguments():
    index = make_index(4, "exact", chunk_rows=3)
    assert isinstance(index, ExactIndex) and index.chunk_rows == 3


def test_auto_warning_points_at_the_caller(monkeypatch):
    # the one warning names the line that called add (stacklevel=2), not a line inside the index module
    monkeypatch.setitem(sys.modules, "hnswlib", None)
    index = AutoIndex(2, threshold=1)
    with pytest.warns(UserWarning, match="staying with exact search above 1 vectors") as record:
        index.add(np.eye(2, dtype=np.float32)[:1], [0])
    assert record[0].filename == __file__


@needs_hnswlib
def test_hnsw_documented_defaults():
    # M=32, ef_construction=200, ef_search=128 (module docstring, docs/icl.md), one insertion thread by default;
    # read back from hnswlib's own graph
    index = HNSWIndex(4)
    assert index._index.M == 32
    assert index._index.ef_construction == 200
    assert index.ef_search == 128 and index._index.ef == 128
    assert index.num_threads == 1
    assert make_index(4, "hnsw", ef_search=16, M=8).ef_search == 16


@needs_hnswlib
def test_hnsw_constructor_checks():
    for dim in (0, -3, 2.5):
        with pytest.raises(ValueError, match=rf"dim must be an int >= 1, got {dim!r}"):
            HNSWIndex(dim)
    for arg in ("ef_construction", "ef_search", "initial_capacity", "num_threads"):
        with pytest.raises(ValueError, match=rf"{arg} must be >= 1, got 0"):
            HNSWIndex(4, **{arg: 0})
    # M = 1 is refused up front (hnswlib's level factor 1/ln M is infinite: its first add used to fail with
    # "Not enough memory: addPoint failed to allocate linklist")
    for m in (0, 1):
        with pytest.raises(ValueError, match=rf"M must be >= 2, got {m}"):
            HNSWIndex(4, M=m)
    with pytest.raises(TypeError):
        HNSWIndex(4, 16)  # the graph parameters are keyword-only
    # the smallest valid values work (M=2: with M=1 hnswlib fails on add, its level factor 1/ln M being infinite)
    index = HNSWIndex(1, M=2, ef_construction=1, ef_search=1, initial_capacity=1, num_threads=1)
    index.add(np.array([[0.5], [2.0], [-1.0]], np.float32), [3, 8, 5])
    _, i = index.search(np.array([[1.0]], np.float32), 3)
    np.testing.assert_array_equal(i, [[8, 3, 5]])


@needs_hnswlib
def test_hnsw_empty_single_vector_and_no_queries():
    index = HNSWIndex(3)
    s, i = index.search(np.eye(3, dtype=np.float32)[:2], 2)
    assert s.dtype == np.float32 and i.dtype == np.int64
    np.testing.assert_array_equal(i, np.full((2, 2), -1))
    np.testing.assert_array_equal(s, np.full((2, 2), -np.inf))
    index.add(np.eye(3, dtype=np.float32)[1:2], [6])
    assert len(index) == 1
    s, i = index.search(np.eye(3, dtype=np.float32), 2)
    np.testing.assert_array_equal(i, [[6, -1], [6, -1], [6, -1]])
    # inner products with e_1 are exactly 0, 1, 0; hnswlib's 1 - ip and back is exact for these
    np.testing.assert_array_equal(s, [[0.0, -np.inf], [1.0, -np.inf], [0.0, -np.inf]])
    s, i = index.search(np.zeros((0, 3), np.float32), 2)
    assert s.shape == i.shape == (0, 2)


@needs_hnswlib
def test_hnsw_one_add_past_twice_its_capacity():
    # a single add of more than twice the preallocated slots must grow to fit all of them
    rng = np.random.default_rng(13)
    d = 8
    vecs = unit(rng, 40, d)
    ids = rng.permutation(100)[:40]
    index = HNSWIndex(d, initial_capacity=4)
    index.add(vecs[:3], ids[:3])
    index.add(vecs[3:], ids[3:])
    assert len(index) == 40
    np.testing.assert_array_equal(index.ids, np.sort(ids))
    # 40 vectors with ef_search=128 >= 40: the search visits the whole graph, so it is exact
    queries = unit(rng, 5, d)
    s, i = index.search(queries, 4)
    ref_s, ref_i = brute_force(vecs, ids, queries, 4)
    np.testing.assert_array_equal(i, ref_i)
    # float32 dot product (d u for unit vectors), hnswlib's 1 - ip rounded (|1 - ip| <= 2: 2u), turned back (u),
    # against the float64 twin
    np.testing.assert_allclose(s, ref_s, rtol=0, atol=(d + 3) * 2**-24)


@needs_hnswlib
def test_hnsw_save_and_load_give_the_same_results(tmp_path):
    rng = np.random.default_rng(14)
    d = 16
    vecs, queries = unit(rng, 300, d), unit(rng, 20, d)
    index = HNSWIndex(d)
    index.add(vecs, np.arange(300) * 2)
    path = tmp_path / "g.hnsw"
    index.save(path)
    loaded = HNSWIndex.load(path, d)
    assert len(loaded) == 300 and loaded.dim == d
    np.testing.assert_array_equal(loaded.ids, np.arange(300) * 2)
    # the documented defaults, as for a fresh index
    assert loaded.ef_search == 128 and loaded._index.ef == 128 and loaded.num_threads == 1
    for a, b in zip(loaded.search(queries, 5), index.search(queries, 5)):
        np.testing.assert_array_equal(a, b)  # the same graph searched the same way
    with pytest.raises(TypeError):
        HNSWIndex.load(path, d, 64)  # ef_search is keyword-only
    assert HNSWIndex.load(path, d, ef_search=16).ef_search == 16
    # and it keeps growing from there
    loaded.add(unit(rng, 1, d), [1])
    assert len(loaded) == 301
    # a graph loaded with another dim is refused (hnswlib would read each vector with the wrong length), as is a file
    # that is no saved graph
    for wrong in (8, 32):
        with pytest.raises(ValueError, match=rf"g\.hnsw: holds a graph of 16-dimensional vectors, not dim={wrong}"):
            HNSWIndex.load(path, wrong)
    (tmp_path / "short").write_bytes(b"\0" * 10)
    with pytest.raises(ValueError, match=r"short: not a graph saved by HNSWIndex.save"):
        HNSWIndex.load(tmp_path / "short", d)


@needs_hnswlib
def test_auto_switches_exactly_at_threshold_and_forwards_graph_arguments():
    rng = np.random.default_rng(15)
    d = 6
    vecs = unit(rng, 12, d)
    index = AutoIndex(d, threshold=5, M=8, ef_search=16)
    index.add(vecs[:4], np.arange(4))
    assert index.kind == "exact" and isinstance(index.inner, ExactIndex)
    index.add(vecs[4:5], [4])  # holds exactly `threshold` vectors now
    assert index.kind == "hnsw" and len(index) == 5
    assert index.inner.ef_search == 16 and index.inner._index.M == 8
    index.add(vecs[5:], np.arange(5, 12))
    # 12 vectors with ef >= 12: exact
    s, i = index.search(vecs, 3)
    ref_s, ref_i = brute_force(vecs, np.arange(12), vecs, 3)
    np.testing.assert_array_equal(i, ref_i)
    # float32 dot product, 1 - ip and back, against the float64 twin, as above
    np.testing.assert_allclose(s, ref_s, rtol=0, atol=(d + 3) * 2**-24)
    # threshold 1: the first add switches
    first = AutoIndex(d, threshold=1)
    first.add(vecs[:1], [0])
    assert first.kind == "hnsw"


@needs_hnswlib
def test_auto_adopts_a_prebuilt_graph_of_its_dim_only_while_empty():
    rng = np.random.default_rng(16)
    d = 4
    vecs = unit(rng, 10, d)
    graph = HNSWIndex(d)
    graph.add(vecs[:6], np.arange(6))
    index = AutoIndex(d)
    with pytest.raises(ValueError, match=r"dim 5, expected 4"):
        index.adopt(HNSWIndex(5))
    assert index.kind == "exact"
    index.adopt(graph)
    assert index.kind == "hnsw" and index.inner is graph and len(index) == 6
    index.add(vecs[6:], np.arange(6, 10))
    _, i = index.search(vecs, 1)
    np.testing.assert_array_equal(i[:, 0], np.arange(10))
    busy = AutoIndex(d)
    busy.add(vecs[:1], [0])
    with pytest.raises(ValueError, match="empty AutoIndex"):
        busy.adopt(HNSWIndex(d))
