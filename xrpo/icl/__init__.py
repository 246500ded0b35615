"""ICL seeding (paper §3.2 "Breaking Symmetry via ICL Seeding" and its appendix).

    embedders   `Embedder` protocol, `get_embedder` ("wordllama" default, "minilm", "hash", sentence-transformers)
    index       exact numpy and HNSW vector indexes, `make_index(dim, kind="auto")`
    corpus      `ICLCorpus`: the evolving corpus of verified solutions, retrieval of K similar OTHER problems
    template    `build_icl_prompt`: the appendix's <task>/<examples>/<new_problem> prompt, truncated to a budget

See docs/icl.md for the choice of the default embedder, with measurements.
"""

from .corpus import Example, ICLCorpus, StoredSolution
from .embedders import (
    DEFAULT_EMBEDDER,
    EMBEDDERS,
    Embedder,
    HashEmbedder,
    SentenceTransformerEmbedder,
    WordLlamaEmbedder,
    get_embedder,
    register_embedder,
)
from .index import DEFAULT_HNSW_THRESHOLD, AutoIndex, ExactIndex, HNSWIndex, VectorIndex, make_index
from .template import DEFAULT_INSTRUCTION, PAPER_INSTRUCTION, ICLPrompt, build_icl_prompt, render_icl_template

__all__ = [
    "DEFAULT_EMBEDDER",
    "DEFAULT_HNSW_THRESHOLD",
    "DEFAULT_INSTRUCTION",
    "EMBEDDERS",
    "PAPER_INSTRUCTION",
    "AutoIndex",
    "Embedder",
    "ExactIndex",
    "Example",
    "HNSWIndex",
    "HashEmbedder",
    "ICLCorpus",
    "ICLPrompt",
    "SentenceTransformerEmbedder",
    "StoredSolution",
    "VectorIndex",
    "WordLlamaEmbedder",
    "build_icl_prompt",
    "get_embedder",
    "make_index",
    "register_embedder",
    "render_icl_template",
]
