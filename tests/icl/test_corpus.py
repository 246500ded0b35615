"""ICLCorpus: add / dedupe / bounded solutions / persistence round trip / retrieval rules."""

import importlib.util
import json
import os

import numpy as np
import pytest

from xrpo.icl import Example, HashEmbedder, ICLCorpus, get_embedder
from xrpo.icl.index import ExactIndex, HNSWIndex


class CountingEmbedder:
    """The real hash embedder, counting how many texts it was asked to embed (to check embed-once and batching)."""

    def __init__(self):
        self._inner = HashEmbedder(dim=64)
        self.name, self.dim = self._inner.name, self._inner.dim
        self.calls: list[list[str]] = []

    def encode(self, texts):
        self.calls.append(list(texts))
        return self._inner.encode(texts)


PROBLEMS = {
    "add1": "What is 12 + 35?",
    "add2": "What is 14 + 31?",
    "add3": "What is 17 + 38?",
    "circle": "Find the area of a circle of radius 3.",
    "square": "Find the area of a square of side 3.",
    "train": "A train travels 300 km in 4 hours. What is its average speed?",
}


def filled(embedder=None, **kw):
    c = ICLCorpus(embedder or HashEmbedder(dim=64), **kw)
    for i, (pid, text) in enumerate(PROBLEMS.items()):
        c.add(pid, text, f"solution of {pid}", step=i)
    return c


def test_add_counts_and_stats():
    c = filled()
    assert len(c) == 6 and c.num_solutions == 6
    c.add("add1", PROBLEMS["add1"], "another solution", 10)
    assert len(c) == 6 and c.num_solutions == 7
    assert c.stats() == {"icl/corpus_problems": 6.0, "icl/corpus_solutions": 7.0}
    assert "add1" in c and "nope" not in c
    assert c.embeddings.shape == (6, 64) and c.embeddings.dtype == np.float32


def test_problem_embedded_once_and_add_many_batches():
    emb = CountingEmbedder()
    c = ICLCorpus(emb)
    c.add_many(["a", "b", "a", "c"], ["A?", "B?", "A?", "C?"], ["s1", "s2", "s3", "s4"], [0, 0, 0, 0])
    # one encode call with each NEW problem once, in first-seen order; solutions are never embedded
    assert emb.calls == [["A?", "B?", "C?"]]
    c.add("a", "A?", "s5", 1)
    c.add_many(["b", "d"], ["B?", "D?"], ["s6", "s7"], [1, 1])
    assert emb.calls == [["A?", "B?", "C?"], ["D?"]]
    np.testing.assert_array_equal(c.embeddings, HashEmbedder(dim=64).encode(["A?", "B?", "C?", "D?"]))


def test_identical_solution_is_deduplicated_and_refreshed():
    c = ICLCorpus(HashEmbedder(dim=32), max_per_problem=3)
    c.add("p", "P?", "same", 1)
    c.add("p", "P?", "same", 5)
    c.add("p", "P?", "same", 2)  # an older step does not move it back
    _, sols = c.entry("p")
    assert [(s.solution, s.step) for s in sols] == [("same", 5)]
    assert c.num_solutions == 1


def test_retention_shortest_plus_most_recent():
    c = ICLCorpus(HashEmbedder(dim=32), max_per_problem=2)
    c.add("p", "P?", "medium solution", 1)
    c.add("p", "P?", "short", 2)
    c.add("p", "P?", "a long solution indeed", 3)
    # kept: the shortest ("short") and the most recent other ("a long solution indeed", step 3)
    _, sols = c.entry("p")
    assert sorted(s.solution for s in sols) == ["a long solution indeed", "short"]
    c.add("p", "P?", "an old one", 0)  # older than what is kept and not shortest: dropped at once
    assert sorted(s.solution for s in c.entry("p")[1]) == ["a long solution indeed", "short"]
    c.add("p", "P?", "tiny", 4)  # new shortest; "short" is now neither shortest nor most recent
    assert sorted(s.solution for s in c.entry("p")[1]) == ["a long solution indeed", "tiny"]
    c.add("p", "P?", "four", 4)  # ties "tiny" in length: the earlier arrival stays the shortest; "four" is recent
    assert sorted(s.solution for s in c.entry("p")[1]) == ["four", "tiny"]
    assert c.retrieve("q", "P?", k=1, min_similarity=-1.0) == []  # same text as the query: never returned
    ex = c.retrieve("q", "Something else entirely?", k=1, min_similarity=-1.0)
    assert [e.solution for e in ex] == ["tiny"]  # retrieval shows the shortest


def test_retention_invariants_random():
    # the policy's guarantees after every add of a random stream: at most m solutions; the shortest ever offered
    # (first arrival among equal lengths) is kept; with m >= 2 the most recent other solution is kept. A re-add of a
    # kept solution refreshes its step; a re-add of an evicted one is a new arrival.
    rng = np.random.default_rng(0)
    for m in (1, 2, 3):
        c = ICLCorpus(HashEmbedder(dim=16), max_per_problem=m)
        history = []  # [solution, step, arrival]
        latest = {}  # solution -> index in history of its latest arrival
        for t in range(80):
            sol = "x" * int(rng.integers(1, 12)) + str(int(rng.integers(0, 4)))
            step = int(rng.integers(0, 20))
            kept_before = {s.solution for s in c.entry("p")[1]} if "p" in c else set()
            c.add("p", "P?", sol, step)
            if sol in kept_before:
                history[latest[sol]][1] = max(history[latest[sol]][1], step)
            else:
                history.append([sol, step, t])
                latest[sol] = len(history) - 1
            kept = {s.solution for s in c.entry("p")[1]}
            assert len(kept) == min(m, len({h[0] for h in history}))
            shortest = min(history, key=lambda h: (len(h[0]), h[2]))
            assert shortest[0] in kept
            if m >= 2:
                others = [h for h in history if h[0] != shortest[0]]
                if others:
                    assert max(others, key=lambda h: (h[1], h[2]))[0] in kept


def test_retrieval_never_returns_query_problem():
    c = filled()
    for pid, text in PROBLEMS.items():
        for k in (1, 2, 5, 10):
            got = c.retrieve(pid, text, k=k, min_similarity=-1.0)
            assert pid not in [e.problem_id for e in got]
            assert len(got) == min(k, len(PROBLEMS) - 1)
            sims = [e.similarity for e in got]
            assert sims == sorted(sims, reverse=True)


def test_retrieval_skips_identical_problem_text_under_another_id():
    c = filled()
    c.add("add1-copy", PROBLEMS["add1"], "leaked answer 47", 9)
    got = c.retrieve("add1", PROBLEMS["add1"], k=2, min_similarity=-1.0)
    assert sorted(e.problem_id for e in got) == ["add2", "add3"]  # hash neighbours: the other additions
    assert all("47" not in e.solution for e in got)


def test_retrieval_widens_when_many_rows_are_excluded():
    c = ICLCorpus(HashEmbedder(dim=64))
    for i in range(8):
        c.add(f"dup{i}", "Same problem text?", f"s{i}", 0)
    c.add("other", "A different question about trains?", "t", 0)
    got = c.retrieve("dup0", "Same problem text?", k=1, min_similarity=-1.0)
    assert [e.problem_id for e in got] == ["other"]


def test_retrieved_example_content_and_similarity():
    emb = HashEmbedder(dim=64)
    c = filled(emb)
    query = "What is 13 + 34?"
    got = c.retrieve("new", query, k=2)
    q = emb.encode([query])[0]
    for e in got:
        assert isinstance(e, Example)
        assert e.problem == PROBLEMS[e.problem_id]
        assert e.solution == f"solution of {e.problem_id}"
        # the index's float32 matrix product and this float32 dot product of unit vectors of width d = 64: each
        # within (d + 1) u of the exact inner product (u = 2^-24), whatever order each sums in
        np.testing.assert_allclose(e.similarity, q @ emb.encode([e.problem])[0], rtol=0, atol=2 * 65 * 2**-24)
    # brute force over the corpus: the two best other problems
    sims = {pid: float(q @ emb.encode([t])[0]) for pid, t in PROBLEMS.items()}
    assert [e.problem_id for e in got] == sorted(sims, key=lambda p: -sims[p])[:2]


def test_min_similarity_fallback():
    c = filled()
    everything = c.retrieve("new", "What is 13 + 34?", k=5, min_similarity=-1.0)
    floor = (everything[0].similarity + everything[1].similarity) / 2
    got = c.retrieve("new", "What is 13 + 34?", k=5, min_similarity=floor)
    assert [e.problem_id for e in got] == [everything[0].problem_id]
    assert c.retrieve("new", "What is 13 + 34?", k=5, min_similarity=1.01) == []  # zero-shot fallback
    assert ICLCorpus(HashEmbedder()).retrieve("x", "anything?") == []  # empty corpus


def test_retrieve_many_equals_retrieve():
    c = filled()
    ids = list(PROBLEMS) + ["new1", "new2"]
    texts = list(PROBLEMS.values()) + ["What is 13 + 34?", "Area of a circle with radius 5?"]
    for k, floor in ((1, 0.0), (2, 0.0), (3, -1.0), (2, 0.3)):
        many = c.retrieve_many(ids, texts, k=k, min_similarity=floor)
        single = [c.retrieve(i, t, k=k, min_similarity=floor) for i, t in zip(ids, texts)]
        assert [[e.problem_id for e in r] for r in many] == [[e.problem_id for e in r] for r in single]
        for a, b in zip(many, single):
            # one query or many: other matrix shapes, other summation orders; unit vectors of width 64, each side
            # within (64 + 1) u of the exact inner product (u = 2^-24)
            np.testing.assert_allclose(
                [e.similarity for e in a], [e.similarity for e in b], rtol=0, atol=2 * 65 * 2**-24
            )
    assert c.retrieve_many([], [], k=2) == []


def test_retrieve_many_embeds_queries_in_one_batch():
    emb = CountingEmbedder()
    c = filled(emb)
    emb.calls.clear()
    c.retrieve_many(["q1", "q2", "q3"], ["A?", "B?", "C?"], k=2)
    assert emb.calls == [["A?", "B?", "C?"]]


def _snapshot(c):
    return [(pid, *c.entry(pid)) for pid in c.problem_ids()], c.embeddings.copy(), c._seq


def test_save_load_round_trip_exact(tmp_path):
    c = filled(max_per_problem=3)
    c.add("add1", PROBLEMS["add1"], "alt ü solution", 7)
    c.add("add1", PROBLEMS["add1"], "x", 8)
    path = c.save(tmp_path / "corpus")
    assert sorted(os.listdir(path)) == ["embeddings.npy", "entries.jsonl", "meta.json"]
    d = ICLCorpus.load(path, HashEmbedder(dim=64))
    (e1, m1, s1), (e2, m2, s2) = _snapshot(c), _snapshot(d)
    assert e1 == e2 and s1 == s2
    np.testing.assert_array_equal(m1, m2)
    assert d.max_per_problem == 3 and len(d) == len(c) and d.num_solutions == c.num_solutions
    q = ["What is 13 + 34?", "Area of a circle?"]
    assert c.retrieve_many(["a", "b"], q, k=3) == d.retrieve_many(["a", "b"], q, k=3)
    # it keeps evolving exactly like the original
    for corpus in (c, d):
        corpus.add("add2", PROBLEMS["add2"], "newest", 20)
        corpus.add("brand-new", "How many primes are below 20?", "8", 20)
    assert _snapshot(c)[0] == _snapshot(d)[0]


def test_load_with_smaller_bound_applies_the_policy(tmp_path):
    c = ICLCorpus(HashEmbedder(dim=32), max_per_problem=3)
    for step, sol in enumerate(["a medium one", "short", "the newest solution"]):
        c.add("p", "P?", sol, step)
    d = ICLCorpus.load(c.save(tmp_path / "c"), HashEmbedder(dim=32), max_per_problem=2)
    assert d.max_per_problem == 2
    assert sorted(s.solution for s in d.entry("p")[1]) == ["short", "the newest solution"]


def test_save_replaces_existing_directory_atomically(tmp_path):
    c = filled()
    target = tmp_path / "corpus"
    c.save(target)
    c.add("extra", "An extra problem?", "yes", 30)
    c.save(target)
    assert len(ICLCorpus.load(target, HashEmbedder(dim=64))) == 7
    leftovers = [p for p in os.listdir(tmp_path) if p != "corpus"]
    assert leftovers == []  # no temporary or old directories left behind


@pytest.mark.skipif(importlib.util.find_spec("hnswlib") is None, reason="hnswlib (the 'hnsw' extra) is not installed")
def test_save_load_hnsw_graph_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    words = ["apple", "train", "circle", "prime", "sum", "angle", "coin", "dice", "speed", "area", "ratio", "mean"]
    texts = [" ".join(rng.choice(words, size=6)) + f" {i}?" for i in range(300)]
    kw = {"threshold": 100}
    c = ICLCorpus(HashEmbedder(dim=64), index="auto", index_kwargs=kw)
    c.add_many([f"p{i}" for i in range(300)], texts, [f"s{i}" for i in range(300)], [0] * 300)
    assert isinstance(c._index.inner, HNSWIndex)
    path = c.save(tmp_path / "corpus")
    assert (path / "index.hnsw").is_file()
    queries = [" ".join(rng.choice(words, size=6)) + "?" for _ in range(40)]
    qids = [f"q{i}" for i in range(40)]
    expected = c.retrieve_many(qids, queries, k=2)
    # reuse of the saved graph, and a rebuild from the embeddings, both give the same results
    loaded = ICLCorpus.load(path, HashEmbedder(dim=64), index_kwargs=kw)
    assert isinstance(loaded._index.inner, HNSWIndex)
    assert loaded.retrieve_many(qids, queries, k=2) == expected
    os.remove(path / "index.hnsw")
    meta = json.loads((path / "meta.json").read_text())
    assert meta["index_file"] == "index.hnsw"
    rebuilt = ICLCorpus.load(path, HashEmbedder(dim=64), index_kwargs=kw)
    assert rebuilt.retrieve_many(qids, queries, k=2) == expected
    exact = ICLCorpus.load(path, HashEmbedder(dim=64), index="exact")
    assert isinstance(exact._index, ExactIndex) and len(exact._index) == 300


def test_load_rejects_other_embedder_and_bad_files(tmp_path):
    c = filled()
    path = c.save(tmp_path / "corpus")
    with pytest.raises(ValueError, match="embedded with 'hash-d64-n3.4.5'.*given embedder is 'hash-d32"):
        ICLCorpus.load(path, HashEmbedder(dim=32))
    with pytest.raises(ValueError, match="embedded with"):
        ICLCorpus.load(path, HashEmbedder(dim=64, ngrams=(2, 3)))
    with pytest.raises(FileNotFoundError, match="not a saved ICL corpus"):
        ICLCorpus.load(tmp_path / "missing", HashEmbedder(dim=64))
    lines = (path / "entries.jsonl").read_text().splitlines()
    lines[2] = lines[2].replace('"problem"', '"problme"')
    (path / "entries.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"entries.jsonl, line 3: malformed corpus entry.*'problem'"):
        ICLCorpus.load(path, HashEmbedder(dim=64))


def test_from_jsonl_seed_file(tmp_path):
    rows = [
        {"problem_id": "a", "problem": "What is 1 + 1?", "solution": "2"},
        {"problem_id": "b", "problem": "What is 2 + 2?", "solution": "4", "step": 3},
        {"problem_id": "a", "problem": "What is 1 + 1?", "solution": "two"},
    ]
    f = tmp_path / "seed.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n\n" + json.dumps(rows[2]) + "\n")
    c = ICLCorpus.from_jsonl(f, HashEmbedder(dim=32))
    assert len(c) == 2 and c.num_solutions == 3
    assert [(s.solution, s.step) for s in c.entry("a")[1]] == [("2", -1), ("two", -1)]
    assert [(s.solution, s.step) for s in c.entry("b")[1]] == [("4", 3)]


@pytest.mark.parametrize(
    "line, match",
    [
        ('{"problem_id": "x", "problem": "P?"}', r"line 2: missing field 'solution'"),
        ('{"problem_id": 5, "problem": "P?", "solution": "s"}', r"line 2: field 'problem_id' must be a non-empty"),
        ('{"problem_id": "x", "problem": "", "solution": "s"}', r"line 2: field 'problem' must be a non-empty"),
        ('{"problem_id": "x", "problem": "P?", "solution": "s", "step": "3"}', r"line 2: field 'step' must be an int"),
        ('{"problem_id": "x", "problem": "P?", "solution": "s"', r"line 2: invalid JSON"),
        ('["x", "P?", "s"]', r"line 2: expected a JSON object"),
        ('{"problem_id": "a", "problem": "Other?", "solution": "s"}', r"line 2: problem_id 'a' has a different"),
    ],
)
def test_from_jsonl_malformed_row_names_the_row(tmp_path, line, match):
    f = tmp_path / "seed.jsonl"
    f.write_text(json.dumps({"problem_id": "a", "problem": "A?", "solution": "s"}) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=match):
        ICLCorpus.from_jsonl(f, HashEmbedder(dim=32))
    with pytest.raises(FileNotFoundError, match="seed solution file"):
        ICLCorpus.from_jsonl(tmp_path / "nope.jsonl", HashEmbedder(dim=32))


def test_from_jsonl_bytes_json_cannot_read_name_the_file(tmp_path):
    f = tmp_path / "seed.jsonl"
    f.write_bytes(b'{"problem_id": "a", "problem": "caf\xe9?", "solution": "s"}\n')
    with pytest.raises(ValueError, match=r"seed\.jsonl: not valid UTF-8 \(byte 0xe9"):
        ICLCorpus.from_jsonl(f, HashEmbedder(dim=32))
    f.write_text('{"problem_id": "a", "problem": "A?", "solution": "s", "step": ' + "9" * 5000 + "}\n")
    with pytest.raises(ValueError, match=r"seed\.jsonl, line 1: invalid JSON \(Exceeds the limit"):
        ICLCorpus.from_jsonl(f, HashEmbedder(dim=32))


def test_bad_arguments():
    c = filled()
    with pytest.raises(ValueError, match="max_per_problem"):
        ICLCorpus(HashEmbedder(), max_per_problem=0)
    with pytest.raises(ValueError, match="index must be one of"):
        ICLCorpus(HashEmbedder(), index="faiss")
    with pytest.raises(ValueError, match="problem_ids\\[0\\] must be a str"):
        c.add(3, "P?", "s", 0)
    with pytest.raises(ValueError, match="solutions\\[0\\] must be a non-empty"):
        c.add("p", "P?", "  ", 0)
    with pytest.raises(ValueError, match="steps\\[0\\] must be an int"):
        c.add("p", "P?", "s", 1.5)
    with pytest.raises(ValueError, match="different problem text"):
        c.add("add1", "Another text?", "s", 0)
    with pytest.raises(ValueError, match="solutions has length 1, expected 2"):
        c.add_many(["a", "b"], ["A?", "B?"], ["s"], [0, 0])
    n_before = (len(c), c.num_solutions)
    with pytest.raises(ValueError):
        c.add_many(["ok", "add1"], ["Fine?", "Changed?"], ["s", "s"], [0, 0])
    assert (len(c), c.num_solutions) == n_before  # a bad batch changes nothing
    with pytest.raises(ValueError, match="k must be"):
        c.retrieve("x", "X?", k=0)


def test_default_embedder_corpus_smoke():
    # the default (wordllama) end to end on a handful of problems: semantic neighbours
    c = ICLCorpus(get_embedder())
    c.add("geo", "Find the area of a rectangle with sides 4 and 7.", "28", 0)
    c.add("prob", "A fair coin is tossed three times. What is the probability of three heads?", "1/8", 0)
    c.add("alg", "Solve for x: 5x - 3 = 12.", "3", 0)
    got = c.retrieve("new", "What is the chance of rolling a six with a fair die?", k=1)
    assert [e.problem_id for e in got] == ["prob"]
