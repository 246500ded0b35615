"""The evolving ICL corpus of verified successes (paper §3.2 "Breaking Symmetry via ICL Seeding", Appendix of the same
name, Algorithm 1 lines 10 and 15).

"The corpus is initialized as empty and is incrementally populated with successful rollouts collected during
training." Prompts whose rollouts all failed retrieve "up to K similar training questions with verified reward
solutions"; "if no suitable solved examples exist, the prompt falls back to its zero-shot form."

Layout: one row per distinct problem. The problem TEXT is embedded once, when the problem first enters the corpus
(retrieval compares problems, not solutions), and the row's vector goes into a vector index (`xrpo.icl.index`). Each
problem keeps at most ``max_per_problem`` verified solutions:

    retention policy, applied after every add to a problem
      1. an identical solution (exact string equality) is not stored twice: re-adding it only refreshes its step
         (to the newer of the two steps: it counts as a recent success again);
      2. the SHORTEST solution (fewest characters; on a tie the one that arrived first) is always kept: it is the
         one retrieval shows, and the cheapest in context length (the paper notes correct solutions are short);
      3. the remaining ``max_per_problem - 1`` slots hold the MOST RECENT other solutions, by step, then by order of
         first arrival, so the corpus follows the policy as it evolves ("corpus freshness is maintained implicitly").
      With ``max_per_problem=1`` only the shortest is kept.

Retrieval never returns the query's own problem (its stored solution would leak the answer), nor any stored problem
whose text is identical to the query's (the same problem under another id would leak it too).

Persistence (`save` / `load`): ``entries.jsonl`` (one problem per line, in row order), ``embeddings.npy`` (float32,
row i = line i), ``meta.json`` (format version, embedder name and dim, ``max_per_problem``) and, once the index is an
HNSW graph, ``index.hnsw``; all written into a temporary sibling directory which then replaces the target with
``os.replace``: a reader sees the old corpus or the new one, never a mix. On load the saved graph is reused when the
requested index would be HNSW at that size, else the index is rebuilt from the stored embeddings (same vectors in the
same order, and single-threaded HNSW insertion, give the same graph and the same results). Seed solutions (Alg. 1's
C_init) come from a JSONL file via `ICLCorpus.from_jsonl`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .embedders import Embedder
from .index import DEFAULT_HNSW_THRESHOLD, INDEX_KINDS, AutoIndex, HNSWIndex, make_index

__all__ = ["CORPUS_FORMAT_VERSION", "Example", "ICLCorpus", "StoredSolution"]

CORPUS_FORMAT_VERSION = 1


@dataclass(frozen=True)
class Example:
    """A retrieved demonstration: a solved problem similar to the query, with one verified solution."""

    problem_id: str
    problem: str
    solution: str
    similarity: float


@dataclass(frozen=True)
class StoredSolution:
    solution: str
    step: int
    seq: int
    """Global arrival counter: breaks ties between solutions of the same step (later arrival = more recent)."""


@dataclass
class _Entry:
    problem_id: str
    problem: str
    row: int
    solutions: list[StoredSolution]


def _shortest_key(s: StoredSolution) -> tuple[int, int]:
    # fewest characters; on a tie the one that arrived first
    return len(s.solution), s.seq


def _check_str(value, arg: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{arg} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{arg} must be a non-empty string")
    return value


def _check_step(value, arg: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{arg} must be an int, got {type(value).__name__}")
    return int(value)


class ICLCorpus:
    """Verified solutions indexed by problem embedding; see the module docstring for the policies.

    Args:
        embedder: an `xrpo.icl.Embedder` (``get_embedder("wordllama")`` by default elsewhere).
        max_per_problem: solutions kept per problem (>= 1): the shortest, plus the most recent others.
        index: ``"auto"`` (exact, HNSW from 10k problems), ``"exact"`` or ``"hnsw"``; see `xrpo.icl.index`.
        index_kwargs: forwarded to `xrpo.icl.index.make_index`.
    """

    def __init__(
        self, embedder: Embedder, *, max_per_problem: int = 2, index: str = "auto", index_kwargs: dict | None = None
    ):
        if isinstance(max_per_problem, bool) or not isinstance(max_per_problem, int) or max_per_problem < 1:
            raise ValueError(f"max_per_problem must be an int >= 1, got {max_per_problem!r}")
        if index not in INDEX_KINDS:
            raise ValueError(f"index must be one of {INDEX_KINDS}, got {index!r}")
        for attr in ("name", "dim", "encode"):
            if not hasattr(embedder, attr):
                raise ValueError(f"embedder must have .name, .dim and .encode (the Embedder protocol); missing .{attr}")
        self.embedder = embedder
        self.max_per_problem = max_per_problem
        self.index_kind = index
        self._index_kwargs = dict(index_kwargs or {})
        self._entries: list[_Entry] = []
        self._by_id: dict[str, _Entry] = {}
        self._emb = np.zeros((0, embedder.dim), dtype=np.float32)  # capacity doubles, rows [: len(self)] are live
        self._index = make_index(embedder.dim, index, **self._index_kwargs)
        self._seq = 0

    # -- size ------------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Number of distinct problems."""
        return len(self._entries)

    @property
    def num_solutions(self) -> int:
        return sum(len(e.solutions) for e in self._entries)

    def stats(self) -> dict[str, float]:
        """Metrics for the training log (namespace ``icl/``)."""
        return {"icl/corpus_problems": float(len(self)), "icl/corpus_solutions": float(self.num_solutions)}

    @property
    def embeddings(self) -> np.ndarray:
        """(len(self), dim) float32 problem embeddings, row i belonging to ``problem_ids()[i]`` (a read-only view)."""
        view = self._emb[: len(self)]
        view.flags.writeable = False
        return view

    def problem_ids(self) -> list[str]:
        return [e.problem_id for e in self._entries]

    def __contains__(self, problem_id: str) -> bool:
        return problem_id in self._by_id

    def entry(self, problem_id: str) -> tuple[str, list[StoredSolution]]:
        """(problem text, stored solutions in storage order) of a problem in the corpus."""
        if problem_id not in self._by_id:
            raise KeyError(f"problem_id {problem_id!r} is not in the corpus")
        e = self._by_id[problem_id]
        return e.problem, list(e.solutions)

    # -- updates ---------------------------------------------------------------------------------------------------
    def add(self, problem_id: str, problem_text: str, solution: str, step: int) -> None:
        """Store a verified solution of ``problem_id`` from training step ``step`` (retention policy: module doc)."""
        self.add_many([problem_id], [problem_text], [solution], [step])

    def add_many(
        self, problem_ids: Sequence[str], problem_texts: Sequence[str], solutions: Sequence[str], steps: Sequence[int]
    ) -> None:
        """`add` for a batch; the problems new to the corpus are embedded in one `encode` call."""
        n = len(problem_ids)
        for arg, seq in (("problem_texts", problem_texts), ("solutions", solutions), ("steps", steps)):
            if len(seq) != n:
                raise ValueError(f"{arg} has length {len(seq)}, expected {n} (the length of problem_ids)")
        rows = []
        for i in range(n):
            pid = _check_str(problem_ids[i], f"problem_ids[{i}]")
            text = _check_str(problem_texts[i], f"problem_texts[{i}]")
            sol = _check_str(solutions[i], f"solutions[{i}]")
            step = _check_step(steps[i], f"steps[{i}]")
            rows.append((pid, text, sol, step))
        # validate every row before mutating anything, so that a bad batch leaves the corpus unchanged
        new_texts: dict[str, str] = {}
        for i, (pid, text, _, _) in enumerate(rows):
            known = self._by_id[pid].problem if pid in self._by_id else new_texts.setdefault(pid, text)
            if known != text:
                raise ValueError(
                    f"problem_ids[{i}] = {pid!r} was given a different problem text than the one stored for it; "
                    "a problem id must always name the same problem"
                )
        if new_texts:
            vecs = np.asarray(self.embedder.encode(list(new_texts.values())), dtype=np.float32)
            if vecs.shape != (len(new_texts), self.embedder.dim):
                raise ValueError(
                    f"embedder {self.embedder.name!r} returned shape {vecs.shape}, "
                    f"expected {(len(new_texts), self.embedder.dim)}"
                )
            self._append_rows(list(new_texts.items()), vecs)
        for pid, _, sol, step in rows:
            self._store_solution(self._by_id[pid], sol, step)

    def _hnsw(self) -> HNSWIndex | None:
        if isinstance(self._index, HNSWIndex):
            return self._index
        if isinstance(self._index, AutoIndex) and isinstance(self._index.inner, HNSWIndex):
            return self._index.inner
        return None

    def _append_rows(self, items: list[tuple[str, str]], vecs: np.ndarray, *, to_index: bool = True) -> None:
        start = len(self)
        stop = start + len(items)
        if stop > self._emb.shape[0]:
            grown = np.zeros((max(stop, 2 * self._emb.shape[0], 64), self.embedder.dim), dtype=np.float32)
            grown[:start] = self._emb[:start]
            self._emb = grown
        self._emb[start:stop] = vecs
        for row, (pid, text) in enumerate(items, start):
            e = _Entry(pid, text, row, [])
            self._entries.append(e)
            self._by_id[pid] = e
        if to_index:
            self._index.add(vecs, np.arange(start, stop, dtype=np.int64))

    def _store_solution(self, e: _Entry, solution: str, step: int) -> None:
        for j, s in enumerate(e.solutions):
            if s.solution == solution:
                if step > s.step:
                    e.solutions[j] = StoredSolution(solution, step, s.seq)
                return
        self._seq += 1
        e.solutions.append(StoredSolution(solution, step, self._seq))
        self._enforce_bound(e)

    def _enforce_bound(self, e: _Entry) -> None:
        if len(e.solutions) > self.max_per_problem:
            shortest = min(e.solutions, key=_shortest_key)
            others = sorted((s for s in e.solutions if s is not shortest), key=lambda s: (s.step, s.seq), reverse=True)
            keep = {id(shortest)} | {id(s) for s in others[: self.max_per_problem - 1]}
            e.solutions = [s for s in e.solutions if id(s) in keep]

    # -- retrieval -------------------------------------------------------------------------------------------------
    def retrieve(self, problem_id: str, problem_text: str, k: int = 2, min_similarity: float = 0.0) -> list[Example]:
        """Up to ``k`` OTHER solved problems most similar to ``problem_text`` (most similar first), each with its
        shortest stored solution, dropping those with cosine similarity below ``min_similarity``. An empty list means:
        fall back to the zero-shot prompt."""
        return self.retrieve_many([problem_id], [problem_text], k=k, min_similarity=min_similarity)[0]

    def retrieve_many(
        self, problem_ids: Sequence[str], problem_texts: Sequence[str], k: int = 2, min_similarity: float = 0.0
    ) -> list[list[Example]]:
        """`retrieve` for a batch of queries, embedded in one `encode` call and searched in one index call."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        min_similarity = float(min_similarity)
        if np.isnan(min_similarity):
            raise ValueError("min_similarity must be a number, got nan")
        if len(problem_texts) != len(problem_ids):
            raise ValueError(
                f"problem_texts has length {len(problem_texts)}, expected {len(problem_ids)} "
                "(the length of problem_ids)"
            )
        ids = [_check_str(p, f"problem_ids[{i}]") for i, p in enumerate(problem_ids)]
        texts = [_check_str(t, f"problem_texts[{i}]") for i, t in enumerate(problem_texts)]
        if not ids or len(self) == 0:
            return [[] for _ in ids]
        queries = np.asarray(self.embedder.encode(texts), dtype=np.float32)
        return self._retrieve_vectors(ids, texts, queries, int(k), min_similarity)

    def _retrieve_vectors(
        self, ids: list[str], texts: list[str], queries: np.ndarray, k: int, min_similarity: float
    ) -> list[list[Example]]:
        out: list[list[Example] | None] = [None] * len(ids)
        pending = list(range(len(ids)))
        # one excluded row (the query's own problem) is the common case, so k + 1 usually suffices; duplicate
        # problem texts under other ids can exclude more, so widen the search for the queries that came up short
        width = min(k + 1, len(self))
        while pending:
            scores, rows = self._index.search(queries[pending], width)
            still = []
            for qi, s_row, r_row in zip(pending, scores, rows):
                picked = []
                for s, r in zip(s_row, r_row):
                    if r < 0:
                        break
                    e = self._entries[r]
                    if e.problem_id == ids[qi] or e.problem == texts[qi]:
                        continue
                    picked.append((float(s), e))
                    if len(picked) == k:
                        break
                if len(picked) < k and width < len(self) and not (picked and picked[-1][0] < min_similarity):
                    still.append(qi)
                    continue
                out[qi] = [
                    Example(e.problem_id, e.problem, min(e.solutions, key=_shortest_key).solution, s)
                    for s, e in picked
                    if s >= min_similarity
                ]
            pending = still
            width = min(2 * width, len(self))
        return out  # type: ignore[return-value]

    # -- persistence -----------------------------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> Path:
        """Write the corpus to ``directory`` atomically (replacing an existing one). Returns the path."""
        target = Path(directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            with open(tmp / "entries.jsonl", "w", encoding="utf-8") as f:
                for e in self._entries:
                    rec = {
                        "problem_id": e.problem_id,
                        "problem": e.problem,
                        "solutions": [{"solution": s.solution, "step": s.step, "seq": s.seq} for s in e.solutions],
                    }
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            np.save(tmp / "embeddings.npy", np.ascontiguousarray(self._emb[: len(self)]))
            graph = self._hnsw()
            if graph is not None:
                graph.save(tmp / "index.hnsw")
            meta = {
                "format_version": CORPUS_FORMAT_VERSION,
                "embedder": self.embedder.name,
                "dim": int(self.embedder.dim),
                "max_per_problem": self.max_per_problem,
                "num_problems": len(self),
                "num_solutions": self.num_solutions,
                "seq": self._seq,
                "index_file": "index.hnsw" if graph is not None else None,
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            for p in tmp.iterdir():
                with open(p, "rb") as fh:
                    os.fsync(fh.fileno())
            # rename() cannot replace a non-empty directory: move the old one aside first, then swap in the new one
            old = None
            if target.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
                os.replace(target, old / "corpus")
            os.replace(tmp, target)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return target

    @classmethod
    def load(
        cls,
        directory: str | os.PathLike,
        embedder: Embedder,
        *,
        max_per_problem: int | None = None,
        index: str = "auto",
        index_kwargs: dict | None = None,
    ) -> ICLCorpus:
        """Reload a corpus written by `save`; ``embedder`` must be the one it was built with (same name and dim).
        ``max_per_problem`` defaults to the saved value."""
        d = Path(directory)
        for name in ("meta.json", "entries.jsonl", "embeddings.npy"):
            if not (d / name).is_file():
                raise FileNotFoundError(f"{d / name} not found: {d} is not a saved ICL corpus")
        try:
            meta = json.loads((d / "meta.json").read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{d / 'meta.json'}: invalid JSON ({e})") from e
        for key in ("format_version", "embedder", "dim", "max_per_problem", "seq"):
            if key not in meta:
                raise ValueError(f"{d / 'meta.json'}: missing field {key!r}")
        if meta["format_version"] != CORPUS_FORMAT_VERSION:
            raise ValueError(
                f"{d / 'meta.json'}: format_version {meta['format_version']} is not supported "
                f"(expected {CORPUS_FORMAT_VERSION})"
            )
        if meta["embedder"] != embedder.name or int(meta["dim"]) != int(embedder.dim):
            raise ValueError(
                f"{d}: the corpus was embedded with {meta['embedder']!r} (dim {meta['dim']}) but the given embedder is "
                f"{embedder.name!r} (dim {embedder.dim}); load it with the same embedder, or rebuild the corpus"
            )
        emb = np.load(d / "embeddings.npy", allow_pickle=False)
        if emb.dtype != np.float32 or emb.ndim != 2 or emb.shape[1] != embedder.dim:
            raise ValueError(
                f"{d / 'embeddings.npy'}: expected float32 (n, {embedder.dim}), got {emb.dtype} {emb.shape}"
            )
        corpus = cls(
            embedder,
            max_per_problem=int(meta["max_per_problem"]) if max_per_problem is None else max_per_problem,
            index=index,
            index_kwargs=index_kwargs,
        )
        items, sols, seen = [], [], set()
        path = d / "entries.jsonl"
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                try:
                    rec = json.loads(line)
                    pid = _check_str(rec["problem_id"], "problem_id")
                    text = _check_str(rec["problem"], "problem")
                    stored = [
                        StoredSolution(
                            _check_str(s["solution"], "solution"),
                            _check_step(s["step"], "step"),
                            _check_step(s["seq"], "seq"),
                        )
                        for s in rec["solutions"]
                    ]
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                    raise ValueError(f"{path}, line {lineno}: malformed corpus entry ({type(e).__name__}: {e})") from e
                if pid in seen:
                    raise ValueError(f"{path}, line {lineno}: duplicate problem_id {pid!r}")
                seen.add(pid)
                items.append((pid, text))
                sols.append(stored)
        if len(items) != emb.shape[0]:
            raise ValueError(f"{d}: {len(items)} entries but {emb.shape[0]} embedding rows")
        prebuilt = corpus._load_graph(d / "index.hnsw", len(items)) if meta.get("index_file") else None
        if items:
            corpus._append_rows(items, emb, to_index=prebuilt is None)
        for e, stored in zip(corpus._entries, sols):
            e.solutions = stored
            corpus._enforce_bound(e)  # a smaller max_per_problem than the saved one applies the policy at once
        corpus._seq = int(meta["seq"])
        return corpus

    def _load_graph(self, path: Path, n: int) -> HNSWIndex | None:
        """Install the saved HNSW graph when this corpus's index would be HNSW at size n; None = rebuild instead."""
        kw = self._index_kwargs
        if not n or self.index_kind == "exact" or not path.is_file():
            return None
        if self.index_kind == "auto" and n < kw.get("threshold", DEFAULT_HNSW_THRESHOLD):
            return None
        try:
            graph = HNSWIndex.load(
                path, self.embedder.dim, ef_search=kw.get("ef_search", 128), num_threads=kw.get("num_threads", 1)
            )
        except Exception as e:  # noqa: BLE001 - a damaged graph file is recoverable: the embeddings are the truth
            warnings.warn(
                f"{path}: could not load the saved HNSW graph ({e}); rebuilding it from the embeddings", stacklevel=3
            )
            return None
        if len(graph) != n or not np.array_equal(graph.ids, np.arange(n)):
            warnings.warn(f"{path}: the saved HNSW graph does not match the {n} entries; rebuilding it", stacklevel=3)
            return None
        if isinstance(self._index, AutoIndex):
            self._index.adopt(graph)
        else:
            self._index = graph
        return graph

    @classmethod
    def from_jsonl(
        cls,
        path: str | os.PathLike,
        embedder: Embedder,
        *,
        step: int = -1,
        max_per_problem: int = 2,
        index: str = "auto",
        index_kwargs: dict | None = None,
    ) -> ICLCorpus:
        """A corpus seeded from a JSONL file of verified solutions (Alg. 1's C_init), one object per line with the
        string fields ``problem_id``, ``problem``, ``solution`` and an optional int ``step`` (default ``step``, -1:
        before training). Blank lines are skipped; a malformed row raises naming the file, the line and the field."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"seed solution file {path} not found")
        ids, texts, solutions, steps = [], [], [], []
        first_text: dict[str, tuple[str, int]] = {}
        with open(path, encoding="utf-8") as f:
            try:
                lines = list(enumerate(f, 1))
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}: not valid UTF-8 (byte 0x{e.object[e.start]:02x}: {e.reason}); expected UTF-8 JSON lines"
                ) from None
            for lineno, line in lines:
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError as e:  # JSONDecodeError, or an integer beyond Python's digit limit for int()
                    raise ValueError(f"{path}, line {lineno}: invalid JSON ({e})") from e
                if not isinstance(rec, dict):
                    raise ValueError(f"{path}, line {lineno}: expected a JSON object, got {type(rec).__name__}")
                for field in ("problem_id", "problem", "solution"):
                    if field not in rec:
                        raise ValueError(f"{path}, line {lineno}: missing field {field!r}")
                    if not isinstance(rec[field], str) or not rec[field].strip():
                        raise ValueError(f"{path}, line {lineno}: field {field!r} must be a non-empty string")
                s = rec.get("step", step)
                if isinstance(s, bool) or not isinstance(s, int):
                    raise ValueError(f"{path}, line {lineno}: field 'step' must be an int, got {s!r}")
                known, known_line = first_text.setdefault(rec["problem_id"], (rec["problem"], lineno))
                if known != rec["problem"]:
                    raise ValueError(
                        f"{path}, line {lineno}: problem_id {rec['problem_id']!r} has a different 'problem' text than "
                        f"on line {known_line}"
                    )
                ids.append(rec["problem_id"])
                texts.append(rec["problem"])
                solutions.append(rec["solution"])
                steps.append(s)
        corpus = cls(embedder, max_per_problem=max_per_problem, index=index, index_kwargs=index_kwargs)
        corpus.add_many(ids, texts, solutions, steps)
        return corpus

    def __repr__(self) -> str:
        return (
            f"ICLCorpus(problems={len(self)}, solutions={self.num_solutions}, embedder={self.embedder.name!r}, "
            f"max_per_problem={self.max_per_problem})"
        )
