"""TreePO sampling: each prompt's rollouts grown as a tree of fixed-length segments (Li et al. 2025, "TreePO",
arXiv 2508.17445, §2.2 and its Algorithm 1 "Tree-based Sampling").

One call samples, verifies and returns every rollout of a step, like the XRPO planner (`generate_rollouts`), with
the same `PlanResult`, so the trainer's later steps do not change::

    widths        each prompt's tree gets w = an even split of rollouts_per_step leaves (the same budget as GRPO)
    root          the prompt forks into init_branch paths                                      (Alg. 1 line 2)
    segment       every live path generates up to segment_len tokens from its prefix, all
                  paths of all trees in one engine call (token-id prompts: exact continuation)   (line 4)
    retire        a path that ends (EOS, stop string), reaches max_new_tokens or max_depth
                  segments becomes a leaf                                                         (lines 7-9)
    branch        the tree's branching budget (each live path forks in `branch`, finished
                  paths hand theirs over, capped by the width left; `xrpo.algo.tree.branch_budget`)
                  is split over its live paths, uniformly or by last-segment log-prob            (line 14)
    fallback      a tree with no live path and fewer leaves than w re-expands a random finished
                  (EOS / stop) leaf, truncated at a random segment boundary; with no such leaf
                  (every path truncated) it restarts `branch` paths from the root, as the
                  authors' code does (the paper leaves this case open; docs/methods.md)           (line 15)

The engine must take token-id prompts (`TokenPromptEngine.generate_ids`): a continuation is then exactly the
concatenation of its path's segments, and each token's log-prob is the policy's under exactly that prefix. An engine
with `reuse_prefixes()` (`HFEngine`) keeps the KV cache of the paths it will continue for the duration of the call;
vLLM reuses shared prefixes through its own prefix cache.

Each leaf becomes a `RolloutRecord` whose `tree_path` names the nodes on its path (ids unique within its tree) and
`segment_ends` where each segment ends; `xrpo.rollout.advantages.compute_advantages` with `advantage="tree"` turns these
into TreePO's tree advantage. TreePO's defaults and where xrpo departs from the authors' code are in docs/methods.md
("treepo"); in short: no repetition-based early stop (a heuristic for base models' babbling), stop strings and EOS both
end a path and count as "finished" for fallback, the branching budget's remainder is spread evenly rather than given to
the last path, and a path cut by max_depth is reported with finish_reason "length".
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from xrpo.algo.allocation import split_budget
from xrpo.algo.config import TreePOConfig, check_knobs
from xrpo.algo.signal import check_count
from xrpo.algo.tree import branch_budget, divergence_weights, divide_width
from xrpo.data import Problem
from xrpo.rollout.engine import Rollout, SamplingParams, cut_at_stop
from xrpo.rollout.prompts import PromptRenderer
from xrpo.rollout.records import PlanResult, RolloutRecord
from xrpo.rollout.step import rollout_metrics

__all__ = ["TreeConfig", "TreeNode", "SampledTree", "generate_tree_rollouts", "merge_tree_metrics"]


@dataclass
class TreeConfig(TreePOConfig):
    """How TreePO grows its trees: the TreePO section of `xrpo.algo.config` (the trainer's ``method.tree_*``
    knobs) and the step's number of leaves."""

    rollouts_per_step: int = 128
    """Leaves over all prompts of the step; each prompt's tree gets an even split (its width w)."""

    def __post_init__(self):
        check_knobs(self)
        check_count(self.rollouts_per_step, "config field rollouts_per_step", 1)


@dataclass
class TreeNode:
    """One segment of a tree (node 0 is the root: the prompt, no tokens)."""

    id: int
    parent: int
    depth: int
    """Segments from the root to this node's end (root: 0)."""
    start: int
    """Completion offset of this segment's first token."""
    completion: list[int]
    """The path's tokens from the root up to the end of this segment."""
    logprobs: list[float]
    step: int = 0
    """The sampling step (engine round, from 1) that generated this segment (root: 0)."""
    children: list[int] = field(default_factory=list)
    fallback: bool = False
    """This node's path was started by the fallback (from an ancestor of a finished leaf)."""

    @property
    def end(self) -> int:
        return len(self.completion)


@dataclass
class SampledTree:
    """One prompt's tree after sampling (returned through `trees_out` for tests and analysis)."""

    problem_index: int
    prompt_ids: list[int]
    width: int
    nodes: list[TreeNode]
    leaves: list[tuple[int, str, str]] = field(default_factory=list)
    """(node id, finish_reason, text) of every leaf, in the order they finished."""
    fallback_paths: int = 0
    """Paths started by the fallback."""

    def path(self, node: int) -> list[int]:
        """Node ids from depth 1 down to `node`."""
        out = []
        while node != 0:
            out.append(node)
            node = self.nodes[node].parent
        return out[::-1]


def _call_seed(seed: int | None, call: int) -> int | None:
    # every engine call of the tree gets its own stream; reusing one seed would correlate the segments' samples
    return None if seed is None else random.Random(f"treepo:{seed}:{call}").getrandbits(31)


def generate_tree_rollouts(
    problems: Sequence[Problem],
    engine,
    verifier,
    renderer: PromptRenderer,
    cfg: TreeConfig,
    sampling: SamplingParams,
    *,
    trees_out: list | None = None,
) -> PlanResult:
    """TreePO's Algorithm 1 for a batch of problems: trees of segments, verified leaves. Rewards, no advantages yet.

    Args:
        problems: the step's problems (one tree each).
        engine: a `TokenPromptEngine` (HFEngine, VLLMEngine).
        verifier: scores leaf texts against the problems' answers (`verify_batch`).
        renderer: renders each problem's prompt; its tokenizer encodes it (no special tokens added, as the engines).
        cfg: tree shape and budget.
        sampling: temperature, top-p, stop strings, the completion limit max_new_tokens and the seed of the step.
        trees_out: if a list, each problem's `SampledTree` is appended to it.
    """
    P = len(problems)
    if P == 0:
        raise ValueError("problems is empty")
    if not callable(getattr(engine, "generate_ids", None)):
        raise TypeError(
            f"the tree sampler needs an engine with generate_ids (token-id prompts); {type(engine).__name__} has none"
        )
    timings = {"time/generate": 0.0, "time/verify": 0.0}
    seg = cfg.segment_tokens(sampling.max_new_tokens)
    max_new = sampling.max_new_tokens
    tok = renderer.tokenizer

    def decode(ids) -> str:
        return tok.decode(list(ids), skip_special_tokens=True)

    widths = split_budget(np.zeros(P), cfg.rollouts_per_step)
    prompts = [renderer.render(p) for p in problems]
    encoded = tok(prompts, add_special_tokens=False)["input_ids"]
    trees = []
    for q in range(P):
        if len(encoded[q]) == 0:
            raise ValueError(f"problem {problems[q].id}: its prompt encodes to no tokens")
        root = TreeNode(id=0, parent=-1, depth=0, start=0, completion=[], logprobs=[])
        trees.append(SampledTree(problem_index=q, prompt_ids=list(encoded[q]), width=int(widths[q]), nodes=[root]))
    rng = np.random.default_rng(None if sampling.seed is None else [sampling.seed, 0x7EE])
    counts_before = dict(getattr(engine, "token_counts", {}) or {})

    # requests: (tree, node to continue, number of children, started by the fallback)
    requests = [(t, 0, min(cfg.tree_init_branch, t.width), False) for t in trees if t.width > 0]
    calls = step = 0
    reuse = getattr(engine, "reuse_prefixes", None)
    with reuse() if callable(reuse) else contextlib.nullcontext():
        while requests:
            step += 1
            # one engine call per remaining budget: only a path's last segment can be shorter than `seg`
            by_budget: dict[int, list] = {}
            for req in requests:
                t, n = req[0], req[1]
                by_budget.setdefault(min(seg, max_new - t.nodes[n].end), []).append(req)
            results: list[tuple[tuple, list[Rollout]]] = []
            t0 = time.perf_counter()
            for budget, reqs in by_budget.items():
                params = replace(sampling, max_new_tokens=budget, seed=_call_seed(sampling.seed, calls))
                calls += 1
                outs = engine.generate_ids(
                    [t.prompt_ids + t.nodes[n].completion for t, n, _, _ in reqs], [c for _, _, c, _ in reqs], params
                )
                results.extend(zip(reqs, outs))
            timings["time/generate"] += time.perf_counter() - t0

            finished_now = {id(t): 0 for t in trees}
            live: dict[int, list[int]] = {id(t): [] for t in trees}
            for (t, n, _, by_fallback), rollouts in results:
                for r in rollouts:
                    child, reason, text = _attach(
                        t, n, r, sampling.stop, decode, max_new, cfg.tree_max_depth, by_fallback, step
                    )
                    if reason is None:
                        live[id(t)].append(child)
                    else:
                        t.leaves.append((child, reason, text))
                        finished_now[id(t)] += 1

            requests = []
            for t in trees:
                paths = live[id(t)]
                if paths:
                    # Alg. 1 line 14: the branching budget, split over the live paths
                    total = branch_budget(t.width, len(t.leaves), finished_now[id(t)], len(paths), cfg.tree_branch)
                    last = [np.mean(t.nodes[p].logprobs[t.nodes[p].start :]) for p in paths]
                    weights = divergence_weights(last, cfg.tree_divergence, cfg.tree_divergence_temp)
                    counts = divide_width(total, weights)
                    requests.extend((t, p, int(c), False) for p, c in zip(paths, counts))
                elif cfg.tree_fallback and len(t.leaves) < t.width:
                    requests.extend(_fallback(t, rng, cfg))

    records: list[RolloutRecord] = []
    for t in trees:
        for node_id, reason, text in t.leaves:
            node = t.nodes[node_id]
            path = t.path(node_id)
            records.append(
                RolloutRecord(
                    problem_index=t.problem_index,
                    group_id=t.problem_index,
                    round=0,
                    seeded=False,
                    gen_prompt_ids=list(t.prompt_ids),
                    train_prompt_ids=list(t.prompt_ids),
                    completion_ids=list(node.completion),
                    logprobs=list(node.logprobs),
                    finish_reason=reason,
                    text=text,
                    tree_path=tuple(path),
                    segment_ends=tuple(t.nodes[p].end for p in path),
                )
            )
    t0 = time.perf_counter()
    refs = [problems[x.problem_index].answer for x in records]
    for x, res in zip(records, verifier.verify_batch([x.text for x in records], refs)):
        x.reward, x.answer, x.verify_reason = float(res.score), res.answer, res.reason
    timings["time/verify"] += time.perf_counter() - t0

    rewards = np.array([x.reward for x in records], dtype=np.float64)
    group_ids = np.array([x.group_id for x in records], dtype=np.int64)
    # correct leaves per tree (reward >= 1.0, the planner's default full_reward), as the planner records its rounds
    successes = np.bincount(group_ids[rewards >= 1.0], minlength=P) if records else np.zeros(P, dtype=np.int64)
    result = PlanResult(
        records=records,
        rewards=rewards,
        group_ids=group_ids,
        rounds=[
            {
                "round": 0,
                "alloc": [int(w) for w in widths],
                "seeded": [],
                "flips": 0,
                "truncated": 0,
                "problems": [p.id for p in problems],
                "successes": [int(c) for c in successes],
            }
        ],
    )
    result.metrics.update(timings)
    result.metrics.update(rollout_metrics(result, P))
    result.metrics.update(_tree_metrics(trees, calls, seg))
    counts_after = getattr(engine, "token_counts", None)
    if counts_after:
        for k in ("prefill", "cached", "decode"):
            if k in counts_after:
                result.metrics[f"tree/engine_{k}_tokens"] = float(counts_after[k] - counts_before.get(k, 0))
    if trees_out is not None:
        trees_out.extend(trees)
    return result


def _attach(
    t: SampledTree, parent: int, r: Rollout, stop, decode, max_new: int, max_depth: int, by_fallback: bool, step: int
):
    """Add a generated segment under `parent`; returns (node id, finish reason or None if the path goes on, text)."""
    p = t.nodes[parent]
    ids, lps = p.completion + list(r.completion_ids), p.logprobs + list(r.logprobs)
    reason = r.finish_reason if r.finish_reason in ("eos", "stop") else None
    text = None
    if stop and reason != "eos":
        # a stop string may straddle a segment boundary: check the whole completion, not the segment alone
        cut = cut_at_stop(ids, stop, decode)
        if cut is not None:
            k, text = cut
            # the parent's text had no stop string (else it would have ended there), so the cut is in this segment
            k = max(k, p.end + 1)
            ids, lps, reason = ids[:k], lps[:k], "stop"
    node = TreeNode(
        id=len(t.nodes),
        parent=parent,
        depth=p.depth + 1,
        start=p.end,
        completion=ids,
        logprobs=lps,
        step=step,
        fallback=by_fallback or p.fallback,
    )
    t.nodes.append(node)
    p.children.append(node.id)
    if reason is None and (len(ids) >= max_new or node.depth >= max_depth):
        reason = "length"
    if reason is None:
        return node.id, None, None
    return node.id, reason, text if text is not None else decode(ids)


def _fallback(t: SampledTree, rng: np.random.Generator, cfg: TreeConfig) -> list[tuple]:
    """TreePO's fallback: new paths from random segment boundaries of finished (EOS / stop) leaves, `branch` each,
    until the tree's width is taken up; with no such leaf, from the root. The authors' code
    (``tree_fallback_traj_policy="soft_boxed_and_eos"``, ``tree_fallback_policy="random"``): keep k of the leaf's
    segments, k uniform in 0 .. depth-1 and below max_depth."""
    done = [n for n, reason, _ in t.leaves if reason in ("eos", "stop")]
    order = [done[i] for i in rng.permutation(len(done))] if done else [None]
    remaining = t.width - len(t.leaves)
    out = []
    for leaf in order:
        if remaining <= 0:
            break
        if leaf is None:
            ancestor = 0
        else:
            path = t.path(leaf)
            keep = min(int(rng.integers(0, len(path))), cfg.tree_max_depth - 1)
            ancestor = path[keep - 1] if keep > 0 else 0
        c = min(cfg.tree_branch, remaining)
        out.append((t, ancestor, c, True))
        remaining -= c
        t.fallback_paths += c
    return out


def _tree_metrics(trees: list[SampledTree], calls: int, seg: int) -> dict[str, float]:
    """tree/* figures of a step (docs/metrics.md)."""
    depths = [t.nodes[n].depth for t in trees for n, _, _ in t.leaves]
    generated = sum(len(node.completion) - node.start for t in trees for node in t.nodes[1:])
    independent = sum(t.nodes[n].end for t in trees for n, _, _ in t.leaves)
    return {
        "tree/leaves": float(sum(len(t.leaves) for t in trees)),
        "tree/underfilled": float(sum(len(t.leaves) < t.width for t in trees)),
        "tree/depth_mean": float(np.mean(depths)) if depths else 0.0,
        "tree/depth_max": float(max(depths, default=0)),
        "tree/nodes": float(sum(len(t.nodes) - 1 for t in trees)),
        "tree/fallback_expansions": float(sum(t.fallback_paths for t in trees)),
        "tree/fallback_trees": float(sum(t.fallback_paths > 0 for t in trees)),
        "tree/steps": float(max((n.step for t in trees for n in t.nodes), default=0)),
        "tree/engine_calls": float(calls),
        "tree/segment_len": float(seg),
        "tree/tokens_generated": float(generated),
        "tree/tokens_independent": float(independent),
        "tree/tokens_saved_frac": float(1.0 - generated / independent) if independent else 0.0,
    }


def merge_tree_metrics(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """The tree/* figures of several generation batches of one step (DAPO's refill): counts add up, the depth mean
    is weighted by leaves, the largest depth is the largest, the saved share is recomputed from the token counts."""
    parts = [m for m in parts if "tree/leaves" in m]
    if not parts:
        return {}
    out: dict[str, float] = {}
    for k in parts[0]:
        if k.startswith("tree/") and k not in (
            "tree/depth_mean",
            "tree/depth_max",
            "tree/segment_len",
            "tree/tokens_saved_frac",
            "tree/steps",
        ):
            out[k] = float(sum(m.get(k, 0.0) for m in parts))
    leaves = out["tree/leaves"]
    out["tree/depth_mean"] = (
        float(sum(m["tree/depth_mean"] * m["tree/leaves"] for m in parts) / leaves) if leaves else 0.0
    )
    out["tree/depth_max"] = max(m["tree/depth_max"] for m in parts)
    out["tree/steps"] = float(sum(m["tree/steps"] for m in parts))
    out["tree/segment_len"] = parts[0]["tree/segment_len"]
    ind = out["tree/tokens_independent"]
    out["tree/tokens_saved_frac"] = float(1.0 - out["tree/tokens_generated"] / ind) if ind else 0.0
    return out
