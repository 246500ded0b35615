"""ICL seeding benchmark: embedder quality and speed, top-2 retrieval latency, ICL prompt construction time.

    python benchmarks/bench_icl.py --ef-search 128 64   # everything (minutes; docs/benchmarks.md)
    python benchmarks/bench_icl.py --sections quality embed
    python benchmarks/bench_icl.py --sizes 1000 10000 --quick

Sections (each prints a Markdown table):
  quality    neighbour quality of each embedder on two labelled sets (the basis of the default-embedder choice):
             * reasoning-gym: problems of 30 reasoning-gym families; score = fraction of each problem's top-2
               neighbours (itself excluded) from the same family. Each family is one template, so this is easy.
             * topics: hand-written math word problems, 8 topics (probability, counting, number theory, ...) x 5
               templates of different wording per topic x 12 instances. "same topic" = top-2 neighbours of the same
               topic; "other template" = the same, with the query's own template siblings removed from the candidates,
               so only a semantic match (same kind of maths, different words) scores.
  embed      load time, sentences/s (batched), single-text query embedding latency p50.
  retrieval  top-2 search latency per query over corpora of random unit vectors at the default embedder's dim, exact
             and HNSW: p50/p95 of single-query calls (query embedding EXCLUDED), per-query cost in batches of 64,
             HNSW build time and recall@2 against exact (by id, and counting any result tied with the exact 2nd
             score as correct, since duplicate problems have identical vectors). Also on text embeddings
             (wordllama vectors of generated problems), where neighbours have structure: random vectors in 256-d are
             HNSW's worst case.
  template   time to build one ICL prompt (two ~3.6k-character solutions): no budget, a char budget that forces
             truncation, a token budget with a counting callable; plus the end-to-end planner path
             (embed 16 queries + retrieve_many + build prompts) per prompt.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time
import warnings

import numpy as np

from xrpo.icl import (
    ExactIndex,
    HNSWIndex,
    ICLCorpus,
    build_icl_prompt,
    get_embedder,
)
from xrpo.icl.embedders import DEFAULT_EMBEDDER

# -- labelled data ------------------------------------------------------------------------------------------------

RG_FAMILIES = [
    "gsm_symbolic",
    "simple_equations",
    "gcd",
    "lcm",
    "prime_factorization",
    "fraction_simplification",
    "basic_arithmetic",
    "simple_geometry",
    "calendar_arithmetic",
    "time_intervals",
    "leg_counting",
    "family_relationships",
    "knights_knaves",
    "syllogism",
    "number_sequence",
    "dice",
    "coin_flip",
    "count_primes",
    "base_conversion",
    "complex_arithmetic",
    "power_function",
    "decimal_arithmetic",
    "letter_counting",
    "caesar_cipher",
    "bitwise_arithmetic",
    "chain_sum",
    "products",
    "number_sorting",
    "cryptarithm",
    "aiw",
]

NAMES = ["Ava", "Ben", "Carla", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kofi", "Lena"]
WORDS = ["BANANA", "LETTER", "PEPPER", "COMMITTEE", "BALLOON", "MISSISSIPPI", "STATISTICS", "ELEVEN"]

# topic -> templates; every template is a function of a numpy Generator returning one problem text.
# The wording differs between templates of a topic, and some vocabulary (marbles, boxes, trains, names) is shared
# across topics on purpose, so that lexical overlap alone does not find the right topic.
TOPICS = {
    "probability": [
        lambda r: (
            f"A bag contains {r.integers(2, 9)} red marbles and {r.integers(2, 9)} blue marbles. If "
            f"{r.choice(NAMES)} draws one marble at random, what is the probability that it is red?"
        ),
        lambda r: (
            f"{r.choice(NAMES)} rolls two fair six-sided dice. What is the probability that the sum of the "
            f"numbers shown is {r.integers(3, 12)}?"
        ),
        lambda r: (
            f"{r.choice(NAMES)} flips a fair coin {r.integers(4, 10)} times. What are the chances of getting "
            f"exactly {r.integers(1, 4)} heads?"
        ),
        lambda r: (
            f"{r.choice(NAMES)} draws a card from a standard 52-card deck. How likely is it that the card is a "
            f"{r.choice(['king', 'queen', 'seven', 'two', 'jack'])} or a heart?"
        ),
        lambda r: (
            f"In a class of {r.integers(20, 35)} students, {r.integers(5, 15)} play chess. Two students are "
            f"picked at random. Find the chance that both of them play chess."
        ),
    ],
    "counting": [
        lambda r: (
            f"In how many ways can {r.integers(4, 16)} different books be arranged on a shelf of "
            f"{r.choice(NAMES)}'s bookcase?"
        ),
        lambda r: (
            f"A committee of {r.integers(2, 5)} people is to be chosen from {r.integers(8, 15)} volunteers. "
            f"How many different committees are possible?"
        ),
        lambda r: (
            f"{r.choice(NAMES)} asks: how many distinct arrangements of the letters of the word "
            f"{r.choice(WORDS)} are there?"
        ),
        lambda r: (
            f"{r.choice(NAMES)} has {r.integers(3, 8)} shirts, {r.integers(2, 6)} pairs of trousers and "
            f"{r.integers(2, 5)} hats. How many different outfits made of one of each can be put together?"
        ),
        lambda r: (
            f"A box holds {r.integers(6, 12)} marbles, all of different colours. In how many ways can "
            f"{r.integers(2, 5)} of them be picked?"
        ),
    ],
    "number_theory": [
        lambda r: (
            f"What is the remainder when {r.integers(2, 13)}^{r.integers(20, 200)} is divided by {r.integers(5, 13)}?"
        ),
        lambda r: f"Find the greatest common divisor of {r.integers(100, 999)} and {r.integers(100, 999)}.",
        lambda r: f"How many positive divisors does {r.integers(60, 2000)} have?",
        lambda r: (
            f"What is the smallest positive integer that leaves a remainder of {r.integers(1, 4)} when divided "
            f"by {r.integers(5, 8)} and a remainder of {r.integers(1, 4)} when divided by {r.integers(9, 12)}?"
        ),
        lambda r: (
            f"{r.choice(NAMES)} wants to split {r.integers(60, 400)} marbles into bags holding equal numbers "
            f"with none left over. How many bag sizes larger than one are possible?"
        ),
    ],
    "geometry": [
        lambda r: (
            f"A rectangle has a length of {r.integers(3, 30)} cm and a width of {r.integers(2, 20)} cm. "
            f"What is its area?"
        ),
        lambda r: f"What is the area of a circle whose radius is {r.integers(2, 40)} meters?",
        lambda r: (
            f"A right triangle has legs of length {r.integers(3, 20)} and {r.integers(3, 20)}. How long is "
            f"its hypotenuse?"
        ),
        lambda r: (
            f"The perimeter of a square garden is {4 * r.integers(5, 40)} feet. How many square feet does "
            f"the garden cover?"
        ),
        lambda r: (
            f"A cylindrical tank has radius {r.integers(1, 6)} m and height {r.integers(2, 10)} m. What "
            f"volume of water can it hold?"
        ),
    ],
    "rates": [
        lambda r: (
            f"A train travels {r.integers(100, 600)} kilometers in {r.integers(2, 8)} hours. What is its average speed?"
        ),
        lambda r: (
            f"{r.choice(NAMES)} can paint a fence in {r.integers(2, 9)} hours and a friend can paint it in "
            f"{r.integers(2, 9)} hours. How long does the job take if they work together?"
        ),
        lambda r: (
            f"A pipe fills a tank in {r.integers(10, 30)} minutes while a drain empties it in "
            f"{r.integers(31, 60)} minutes. With both open, how long until the empty tank is full?"
        ),
        lambda r: (
            f"Two cars leave the same town at the same time, driving in opposite directions at "
            f"{r.integers(40, 70)} mph and {r.integers(40, 70)} mph. After how many hours are they "
            f"{r.integers(200, 500)} miles apart?"
        ),
        lambda r: (
            f"{r.choice(NAMES)} walks to school at {r.integers(3, 6)} km/h and rides a bike back home at "
            f"{r.integers(12, 20)} km/h. What is the average speed for the round trip?"
        ),
    ],
    "percent": [
        lambda r: (
            f"A jacket costs ${r.integers(40, 200)}. It is on sale for {r.integers(10, 50)}% off. What is the "
            f"sale price?"
        ),
        lambda r: (
            f"{r.choice(NAMES)} deposits ${r.integers(500, 5000)} in a savings account paying "
            f"{r.integers(2, 8)}% interest compounded annually. How much is in the account after "
            f"{r.integers(2, 10)} years?"
        ),
        lambda r: (
            f"The population of a town grew from {r.integers(1000, 5000)} to {r.integers(5001, 9000)}. By "
            f"what percent did it increase?"
        ),
        lambda r: (
            f"A store marks up the wholesale price of a lamp by {r.integers(20, 80)}% and sells it for "
            f"${r.integers(30, 150)}. What was the wholesale price?"
        ),
        lambda r: (
            f"After a {r.integers(3, 15)}% raise, {r.choice(NAMES)} earns ${r.integers(2000, 6000)} a month. "
            f"What was the monthly salary before the raise?"
        ),
    ],
    "algebra": [
        lambda r: f"Solve for x: {r.integers(2, 12)}x + {r.integers(1, 30)} = {r.integers(31, 120)}.",
        lambda r: f"Find all real solutions of x^2 - {r.integers(2, 15)}x + {r.integers(1, 30)} = 0.",
        lambda r: (
            f"The sum of two numbers is {r.integers(20, 90)} and their difference is {r.integers(2, 19)}. "
            f"What are the two numbers?"
        ),
        lambda r: (
            f"{r.choice(NAMES)} is {r.integers(3, 6)} times as old as her daughter. In {r.integers(5, 15)} "
            f"years she will be twice as old as the daughter. How old is the daughter now?"
        ),
        lambda r: (
            f"Three apples and two pears cost ${r.integers(5, 12)}, while two apples and five pears cost "
            f"${r.integers(13, 20)}. How much does one pear cost?"
        ),
    ],
    "sequences": [
        lambda r: (
            lambda a, d: (
                f"What is the {r.integers(20, 90)}th term of the arithmetic sequence {a}, {a + d}, {a + 2 * d}, ...?"
            )
        )(int(r.integers(1, 20)), int(r.integers(2, 9))),
        lambda r: f"Compute the sum 1 + 2 + 3 + ... + {r.integers(50, 500)}.",
        lambda r: (
            f"A geometric sequence starts with {r.integers(1, 9)} and each term is {r.integers(2, 5)} times the "
            f"previous one. What is the sum of its first {r.integers(5, 12)} terms?"
        ),
        lambda r: (
            f"{r.choice(NAMES)} saves ${r.integers(5, 20)} in the first week and each week saves "
            f"${r.integers(1, 6)} more than the week before. How much has been saved after {r.integers(10, 52)} "
            f"weeks?"
        ),
        lambda r: (
            f"A list of numbers starts 1, {r.integers(2, 6)}, and every later entry is the sum of the two "
            f"entries before it. What is entry number {r.integers(8, 15)}?"
        ),
    ],
}


def topic_problems(per_template: int = 8, seed: int = 0) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Texts, topic labels and template labels (template id unique across topics)."""
    rng = np.random.default_rng(seed)
    texts, topics, templates = [], [], []
    tid = 0
    for ti, (_, temps) in enumerate(TOPICS.items()):
        for t in temps:
            seen = set()
            for _ in range(100 * per_template):
                seen.add(t(rng))
                if len(seen) == per_template:
                    break
            else:
                raise RuntimeError(f"a template of topic {ti} cannot produce {per_template} distinct problems")
            for s in sorted(seen):
                texts.append(s)
                topics.append(ti)
                templates.append(tid)
            tid += 1
    return texts, np.array(topics), np.array(templates)


def rg_problems(per_family: int = 20, seed: int = 0) -> tuple[list[str], np.ndarray]:
    import reasoning_gym

    texts, labels = [], []
    for fi, fam in enumerate(RG_FAMILIES):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = reasoning_gym.create_dataset(fam, seed=seed, size=per_family)
        for i in range(per_family):
            texts.append(ds[i]["question"])
            labels.append(fi)
    return texts, np.array(labels)


def top2_same_label(emb: np.ndarray, labels: np.ndarray, exclude: np.ndarray | None = None) -> float:
    """Mean fraction of each item's top-2 neighbours (itself excluded, and items with exclude[j] == exclude[i]
    excluded when given) that share its label."""
    sim = emb @ emb.T
    np.fill_diagonal(sim, -np.inf)
    if exclude is not None:
        sim[exclude[:, None] == exclude[None, :]] = -np.inf
    top = np.argsort(-sim, axis=1, kind="stable")[:, :2]
    return float((labels[top] == labels[:, None]).mean())


# -- timing helpers -----------------------------------------------------------------------------------------------


def pcts(samples: list[float]) -> tuple[float, float]:
    """p50 and p95 in milliseconds."""
    a = np.asarray(samples) * 1e3
    return float(np.percentile(a, 50)), float(np.percentile(a, 95))


def unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def single_query_times(index, queries: np.ndarray, k: int = 2) -> list[float]:
    index.search(queries[:5], k)  # warm-up
    out = []
    for q in queries:
        t0 = time.perf_counter()
        index.search(q[None], k)
        out.append(time.perf_counter() - t0)
    return out


def batch_query_time(index, queries: np.ndarray, k: int = 2, batch: int = 64) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(queries), batch):
        index.search(queries[i : i + batch], k)
    return (time.perf_counter() - t0) / len(queries)


def recall_at(exact_ids: np.ndarray, approx_ids: np.ndarray) -> float:
    k = exact_ids.shape[1]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(exact_ids, approx_ids)]))


# -- sections -----------------------------------------------------------------------------------------------------


def load_embedders(names: list[str]) -> dict:
    out = {}
    for name in names:
        t0 = time.perf_counter()
        try:
            emb = get_embedder(name)
        except (ImportError, FileNotFoundError) as e:
            print(f"(skipping {name}: {e})")
            continue
        out[name] = (emb, time.perf_counter() - t0)
    return out


def section_quality(embedders: dict, args) -> None:
    rg_texts, rg_labels = rg_problems(per_family=20, seed=args.seed)
    tp_texts, tp_topics, tp_templates = topic_problems(per_template=12, seed=args.seed)
    print(
        f"\n### Neighbour quality (top-2 same-label rate; reasoning-gym: {len(RG_FAMILIES)} families x 20 = "
        f"{len(rg_texts)} problems; topics: {len(TOPICS)} topics x 5 templates x 12 = {len(tp_texts)} problems)\n"
    )
    print("| embedder | dim | reasoning-gym same family | topics same topic | topics same topic, other template |")
    print("|---|---|---|---|---|")
    for name, (emb, _) in embedders.items():
        e_rg = emb.encode(rg_texts)
        e_tp = emb.encode(tp_texts)
        a = top2_same_label(e_rg, rg_labels)
        b = top2_same_label(e_tp, tp_topics)
        c = top2_same_label(e_tp, tp_topics, exclude=tp_templates)
        print(f"| {name} ({emb.name}) | {emb.dim} | {a:.3f} | {b:.3f} | {c:.3f} |")
    print(
        f"\nchance level: reasoning-gym {1 / len(RG_FAMILIES):.3f}, topics {1 / len(TOPICS):.3f}, "
        f"other-template {4 / 39:.3f}"
    )


def section_embed(embedders: dict, args) -> None:
    tp_texts, _, _ = topic_problems(per_template=12, seed=args.seed)
    rg_texts, _ = rg_problems(per_family=20, seed=args.seed)
    pool = tp_texts + rg_texts
    mean_chars = statistics.mean(len(t) for t in pool)
    print(
        f"\n### Embedding speed ({len(pool)} problem texts, mean {mean_chars:.0f} characters; torch threads: "
        f"{_torch_threads()})\n"
    )
    print("| embedder | load s | sentences/s (batched) | single-text encode p50 ms | p95 ms |")
    print("|---|---|---|---|---|")
    for name, (emb, load_s) in embedders.items():
        texts = pool * (4 if name != "minilm" else 1)
        emb.encode(texts[:64])  # warm-up
        best = math.inf
        for _ in range(3):  # best of 3: the CI machine is shared, the minimum is the least disturbed run
            t0 = time.perf_counter()
            emb.encode(texts)
            best = min(best, time.perf_counter() - t0)
        rate = len(texts) / best
        n_single = 200 if name != "minilm" else 60
        times = []
        for t in pool[:n_single]:
            t0 = time.perf_counter()
            emb.encode([t])
            times.append(time.perf_counter() - t0)
        p50, p95 = pcts(times)
        print(f"| {name} | {load_s:.2f} | {rate:,.0f} | {p50:.3f} | {p95:.3f} |")


def _torch_threads() -> str:
    try:
        import torch

        return str(torch.get_num_threads())
    except ImportError:
        return "n/a"


def _text_vectors(n: int, emb, seed: int) -> np.ndarray:
    """n wordllama vectors of generated problems (the topic templates with fresh numbers, plus reasoning-gym)."""
    rng = np.random.default_rng(seed)
    temps = [t for ts in TOPICS.values() for t in ts]
    rg_texts, _ = rg_problems(per_family=20, seed=seed + 1)
    texts = []
    while len(texts) < n:
        if rng.random() < 0.3:
            texts.append(rg_texts[int(rng.integers(len(rg_texts)))] + f" (variant {int(rng.integers(10**6))})")
        else:
            texts.append(temps[int(rng.integers(len(temps)))](rng))
    return emb.encode(texts)


def section_retrieval(embedders: dict, args) -> None:
    default = embedders.get(DEFAULT_EMBEDDER, (get_embedder(DEFAULT_EMBEDDER), 0.0))[0]
    d = default.dim
    rng = np.random.default_rng(args.seed)
    probe = HNSWIndex(d)
    efs = args.ef_search or [probe.ef_search]
    print(
        f"\n### Top-2 retrieval latency per query, query embedding excluded (dim {d} = {default.name}; "
        f"{args.queries} single-query calls; batch = 64 queries per call; HNSW M={probe._index.M}, "
        f"ef_construction={probe._index.ef_construction}, built with {args.build_threads} threads, "
        "searched with 1)\n"
    )
    print(
        "| vectors | N | exact p50 ms | exact p95 ms | exact batched ms/query | HNSW build s | ef_search | "
        "HNSW p50 ms | HNSW p95 ms | HNSW batched ms/query | HNSW recall@2 | recall@2, ties counted |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    kinds = ["random", "text"] if not args.quick else ["random"]
    for kind in kinds:
        for n in args.sizes:
            if kind == "random":
                data = unit(rng, n, d)
                queries = unit(rng, args.queries, d)
            else:
                both = _text_vectors(n + args.queries, default, args.seed)
                data, queries = both[:n], both[n:]
            ex = ExactIndex(d)
            ex.add(data, np.arange(n))
            e50, e95 = pcts(single_query_times(ex, queries))
            eb = batch_query_time(ex, queries) * 1e3
            ex_s, ex_i = ex.search(queries, 2)
            t0 = time.perf_counter()
            hn = HNSWIndex(d, initial_capacity=n, num_threads=args.build_threads)
            hn.add(data, np.arange(n))
            build = time.perf_counter() - t0
            hn.num_threads = 1
            for j, ef in enumerate(efs):
                hn.ef_search = ef
                h50, h95 = pcts(single_query_times(hn, queries))
                hb = batch_query_time(hn, queries) * 1e3
                h_s, h_i = hn.search(queries, 2)
                rec = recall_at(ex_i, h_i)
                # duplicate problems embed to identical vectors: any of them is a correct answer
                rec_ties = float((h_s >= ex_s[:, -1:] - 1e-6).mean())
                first = (
                    f"| {kind} | {n:,} | {e50:.3f} | {e95:.3f} | {eb:.3f} | {build:.1f}" if j == 0 else "| | | | | |"
                )
                print(f"{first} | {ef} | {h50:.3f} | {h95:.3f} | {hb:.3f} | {rec:.3f} | {rec_ties:.3f} |")
    print(
        "\nThe query's embedding is not included: add the embedder's cost per query from the embed section "
        "(single text: its p50; a batch of queries: 1 / sentences/s each)."
    )


def section_template(embedders: dict, args) -> None:
    rng = np.random.default_rng(args.seed)
    words = ["Let", "x", "=", "the", "number", "so", "we", "get", "\\frac{3}{4}", "therefore", "sum", "of", "is"]

    def text(n_chars: int) -> str:
        out, size = [], 0
        while size < n_chars:
            w = words[int(rng.integers(len(words)))]
            out.append(w)
            size += len(w) + 1
        return " ".join(out)

    # the paper's corpus: mean correct solution ~900 tokens (about 3.6k characters), problems ~300 characters
    exs = [(text(300), text(3600)), (text(300), text(3600))]
    problem = text(300)

    def count_tokens(s: str) -> int:  # ~4 characters per token, the usual rough rule
        return (len(s) + 3) // 4

    cases = [
        ("no budget", {}),
        ("max_chars=5000 (truncates)", {"max_chars": 5000}),
        ("max_tokens=1250, count_tokens=len/4 (truncates)", {"max_tokens": 1250, "count_tokens": count_tokens}),
    ]
    print("\n### ICL prompt construction (template only; 2 examples, solutions of 3,600 characters)\n")
    print("| case | p50 ms | p95 ms | truncated solutions | prompt chars |")
    print("|---|---|---|---|---|")
    for label, kw in cases:
        times = []
        for _ in range(300):
            t0 = time.perf_counter()
            p = build_icl_prompt(problem, exs, **kw)
            times.append(time.perf_counter() - t0)
        p50, p95 = pcts(times)
        print(f"| {label} | {p50:.4f} | {p95:.4f} | {p.truncated} | {len(p.text):,} |")

    try:
        from transformers import AutoTokenizer  # noqa: F401

        from xrpo.models.tiny import build_tiny_tokenizer
    except Exception:  # noqa: BLE001 - the tiny tokenizer is another module's; skip the row if it is not there yet
        build_tiny_tokenizer = None
    if build_tiny_tokenizer is not None:
        try:
            tok = build_tiny_tokenizer([problem] + [s for _, s in exs])
            calls = [0]

            def count(s: str) -> int:
                calls[0] += 1
                return len(tok(s, add_special_tokens=False)["input_ids"])

            full = build_icl_prompt(problem, exs).text
            t0 = time.perf_counter()
            for _ in range(20):
                count(full)
            one_call = (time.perf_counter() - t0) / 20
            for label, budget in (("fits", count(full)), ("truncates", count(full) * 3 // 4)):
                times, calls[0] = [], 0
                for _ in range(50):
                    t0 = time.perf_counter()
                    p = build_icl_prompt(problem, exs, count_tokens=count, max_tokens=budget)
                    times.append(time.perf_counter() - t0)
                p50, p95 = pcts(times)
                print(
                    f"| max_tokens={budget}, tiny BPE tokenizer ({label}; {calls[0] / 50:.0f} count_tokens calls of "
                    f"{one_call * 1e3:.2f} ms) | {p50:.4f} | {p95:.4f} | {p.truncated} | {len(p.text):,} |"
                )
        except Exception as e:  # noqa: BLE001
            print(f"(tiny-tokenizer row skipped: {type(e).__name__}: {e})")

    # end to end, as the planner calls it: one retrieve_many for 16 unsolved prompts, then 16 prompts built
    emb = embedders.get(DEFAULT_EMBEDDER, (get_embedder(DEFAULT_EMBEDDER), 0.0))[0]
    n = 10_000
    temps = [t for ts in TOPICS.values() for t in ts]
    probs = [temps[int(rng.integers(len(temps)))](rng) + f" [{i}]" for i in range(n + 16)]
    corpus = ICLCorpus(emb)
    corpus.add_many(
        [f"p{i}" for i in range(n)], probs[:n], [text(int(rng.integers(500, 3000))) for _ in range(n)], [0] * n
    )
    qids, qtexts = [f"q{i}" for i in range(16)], probs[n:]
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        found = corpus.retrieve_many(qids, qtexts, k=2)
        prompts = [build_icl_prompt(t, ex, max_chars=8000) for t, ex in zip(qtexts, found)]
        times.append((time.perf_counter() - t0) / len(qids))
    p50, p95 = pcts(times)
    print(
        f"\nEnd to end with {emb.name} over a {n:,}-problem corpus (exact index), 16 queries per call: "
        f"embed + retrieve + build = {p50:.3f} ms per prompt (p50 over 30 calls; p95 {p95:.3f}); "
        f"{sum(p.num_examples for p in prompts)} examples placed."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--sections",
        nargs="+",
        default=["quality", "embed", "retrieval", "template"],
        choices=["quality", "embed", "retrieval", "template"],
    )
    ap.add_argument("--embedders", nargs="+", default=["wordllama", "minilm", "hash"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[1_000, 10_000, 100_000])
    ap.add_argument("--queries", type=int, default=300, help="single-query calls per size")
    ap.add_argument("--build-threads", type=int, default=2, help="HNSW insertion threads for the benchmark build")
    ap.add_argument(
        "--ef-search",
        type=int,
        nargs="+",
        default=None,
        help="HNSW ef_search values to time on each graph (default: the index default)",
    )
    ap.add_argument("--quick", action="store_true", help="random vectors only in the retrieval section")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch.set_num_threads before loading minilm (1 can be faster on few, shared cores)",
    )
    args = ap.parse_args()
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)

    import os

    print(
        f"# bench_icl on {platform.processor() or platform.machine()} ({os.cpu_count()} CPUs, load average "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}), python {platform.python_version()}, numpy "
        f"{np.__version__}, OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}"
    )
    need = [e for e in args.embedders] if {"quality", "embed"} & set(args.sections) else [DEFAULT_EMBEDDER]
    embedders = load_embedders(need)
    for s in args.sections:
        {
            "quality": section_quality,
            "embed": section_embed,
            "retrieval": section_retrieval,
            "template": section_template,
        }[s](embedders, args)


if __name__ == "__main__":
    main()
