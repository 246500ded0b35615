"""TreePO sampling (xrpo.rollout.treepo) on the tiny model with the real HFEngine: tree bookkeeping, exact
continuation, the width budget, segment boundaries, fallback, and the tree advantage wired through the planner; a
scripted engine whose paths never end forces the fallback's restart from the root."""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch

from xrpo.algo.tree import tree_advantages
from xrpo.data import Problem
from xrpo.rewards import get_verifier
from xrpo.rollout.advantages import compute_advantages, tree_ancestor_ids
from xrpo.rollout.engine import Rollout, SamplingParams
from xrpo.rollout.hf_engine import HFEngine
from xrpo.rollout.prompts import PromptRenderer
from xrpo.rollout.records import PlanConfig, RolloutRecord
from xrpo.rollout.treepo import TreeConfig, generate_tree_rollouts

PROBLEMS = [Problem(id=f"p{i}", prompt=f"{i} + {3 * i} = ?", answer=str(4 * i)) for i in range(5)]


def with_eos_logit(tok, model, logit: float):
    """A copy of `model` with its (tied) EOS row set along the mean final hidden state, so that EOS gets a logit of
    about `logit` in most contexts (the random model itself never samples EOS)."""
    model = copy.deepcopy(model)
    enc = tok(
        [f"Q: {i} + {i} = ?\nA: the answer {7 * i} is" for i in range(8)],
        add_special_tokens=False,
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        h = model(**enc, output_hidden_states=True).hidden_states[-1][enc["attention_mask"].bool()].mean(0)
        model.model.embed_tokens.weight[tok.eos_token_id] = logit * h / h.norm() ** 2
    return model


@pytest.fixture(scope="module")
def eos_prone_model(tiny_tokenizer, tiny_model):
    """Paths end at every length: measured, 22 of 64 completions of <= 16 tokens end by EOS, after 1-14 tokens."""
    return with_eos_logit(tiny_tokenizer, tiny_model, 3.0)


@pytest.fixture(scope="module")
def eos_early_model(tiny_tokenizer, tiny_model):
    """Most paths end within a few tokens (measured: 50 of 64, 10 of them after one token)."""
    return with_eos_logit(tiny_tokenizer, tiny_model, 4.0)


@pytest.fixture(scope="module")
def renderer(tiny_tokenizer):
    return PromptRenderer(tiny_tokenizer, prompt_template="Q: {prompt}\nA:")


@pytest.fixture(scope="module")
def verifier():
    return get_verifier("math")


def sample(model, tok, renderer, verifier, cfg, params, problems=PROBLEMS, engine=None):
    trees: list = []
    engine = engine or HFEngine(model, tok)
    res = generate_tree_rollouts(problems, engine, verifier, renderer, cfg, params, trees_out=trees)
    return res, trees


def forward_logprobs(model, prompt_ids, completion_ids):
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    p = len(prompt_ids)
    return logp[p - 1 : p - 1 + len(completion_ids)].gather(1, torch.tensor(completion_ids)[:, None])[:, 0]


def check_tree(t, seg, max_new, max_depth, eos_id, fallback=True):
    """Every invariant of one sampled tree; returns the leaves' finish reasons."""
    nodes = t.nodes
    leaf_ids = [n for n, _, _ in t.leaves]
    assert len(set(leaf_ids)) == len(leaf_ids)
    assert len(t.leaves) <= t.width
    if fallback:
        assert len(t.leaves) == t.width
    # the width budget at every sampling step: paths running in it + leaves finished before it <= width
    steps = max(n.step for n in nodes)
    for s in range(1, steps + 1):
        running = sum(n.step == s for n in nodes)
        done_before = sum(nodes[n].step < s for n in leaf_ids)
        assert 1 <= running and running + done_before <= t.width, (s, running, done_before)
    reasons = Counter()
    for n, reason, _text in t.leaves:
        path = t.path(n)
        assert nodes[path[0]].parent == 0 and not nodes[n].children  # a path to the root; leaves never branch
        for d, node_id in enumerate(path, start=1):
            node = nodes[node_id]
            assert node.depth == d
            parent = nodes[node.parent]
            # a child extends its parent's tokens exactly: the completion is the concatenation of the segments
            assert node.start == parent.end and node.completion[: parent.end] == parent.completion
            assert node.logprobs[: parent.end] == parent.logprobs
            # segment boundaries: every segment but a path's last is exactly seg tokens
            if node_id != n:
                assert node.end - node.start == seg and node.end == d * seg
        leaf = nodes[n]
        assert 1 <= leaf.end - leaf.start <= seg and leaf.depth <= max_depth
        if reason == "eos":
            assert leaf.completion[-1] == eos_id and eos_id not in leaf.completion[:-1]
        elif reason == "length":
            assert eos_id not in leaf.completion
            assert leaf.end == max_new or leaf.depth == max_depth
        reasons[reason] += 1
    return reasons


@pytest.mark.parametrize(
    "which, divergence",
    [
        ("tiny_model", "uniform"),
        ("eos_prone_model", "uniform"),
        ("eos_prone_model", "low_logprob"),
        ("eos_prone_model", "high_logprob"),
    ],
)
def test_tree_bookkeeping_on_the_real_engine(request, tiny_tokenizer, renderer, verifier, which, divergence):
    model = request.getfixturevalue(which)
    # widths 7,7,7,7,6
    cfg = TreeConfig(rollouts_per_step=34, tree_segment_len=3, tree_max_depth=5, tree_divergence=divergence)
    params = SamplingParams(temperature=1.0, max_new_tokens=14, seed=5)  # 5 x 3 > 14: the last segment has 2
    res, trees = sample(model, tiny_tokenizer, renderer, verifier, cfg, params)
    assert [t.width for t in trees] == [7, 7, 7, 7, 6] and len(res.records) == 34
    reasons = Counter()
    for t in trees:
        reasons += check_tree(t, 3, 14, 5, tiny_tokenizer.eos_token_id)
        # the root forks into init_branch = 2 paths at the first step
        assert sum(1 for n in t.nodes if n.step == 1) == 2
    if which == "eos_prone_model":
        assert reasons["eos"] >= 5 and reasons["length"] >= 2
    # records: the leaves, with their tree metadata and exact log-probs
    by_tree = {t.problem_index: t for t in trees}
    for x in res.records:
        t = by_tree[x.problem_index]
        leaf = t.nodes[x.tree_path[-1]]
        assert x.completion_ids == leaf.completion and x.gen_prompt_ids == t.prompt_ids == x.train_prompt_ids
        assert list(x.segment_ends) == [t.nodes[p].end for p in x.tree_path]
        assert x.text == tiny_tokenizer.decode(x.completion_ids, skip_special_tokens=True)
        torch.testing.assert_close(
            torch.tensor(x.logprobs), forward_logprobs(model, x.gen_prompt_ids, x.completion_ids), rtol=0, atol=1e-5
        )
    m = res.metrics
    assert m["tree/leaves"] == 34 and m["rollout/count"] == 34 and m["tree/underfilled"] == 0
    assert m["tree/tokens_generated"] == sum(len(n.completion) - n.start for t in trees for n in t.nodes[1:])
    assert 0 < m["tree/tokens_saved_frac"] < 1  # the paths share their first segments
    assert m["tree/engine_cached_tokens"] > 0  # HFEngine continued paths from their KV cache


def test_fallback_fills_trees_whose_paths_end_early(tiny_tokenizer, renderer, verifier, eos_early_model):
    eos = tiny_tokenizer.eos_token_id
    # a tree starts from one path; when every path of a tree has ended before it has its 8 leaves, fallback
    cfg = TreeConfig(rollouts_per_step=40, tree_segment_len=2, tree_max_depth=6, tree_branch=2, tree_init_branch=1)
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=0)
    res, trees = sample(eos_early_model, tiny_tokenizer, renderer, verifier, cfg, params)
    assert res.metrics["tree/fallback_expansions"] > 0 and res.metrics["tree/fallback_trees"] > 0
    for t in trees:
        check_tree(t, 2, 12, 6, eos)
        for node in t.nodes[1:]:
            if node.fallback and not t.nodes[node.parent].fallback:
                # a fallback path starts at a segment boundary of a path that finished: the root, or an ancestor
                # of an EOS leaf that was not itself re-expanded by the fallback
                parent = node.parent
                assert parent == 0 or any(parent in t.path(n) for n, reason, _ in t.leaves if reason == "eos")
                assert t.nodes[parent].end % 2 == 0
    assert sum(t.fallback_paths for t in trees) == res.metrics["tree/fallback_expansions"]
    # without fallback the same trees end with fewer leaves than their width
    res2, trees2 = sample(
        eos_early_model,
        tiny_tokenizer,
        renderer,
        verifier,
        TreeConfig(rollouts_per_step=40, tree_segment_len=2, tree_max_depth=6, tree_init_branch=1, tree_fallback=False),
        params,
    )
    assert res2.metrics["tree/underfilled"] > 0 and res2.metrics["tree/fallback_expansions"] == 0
    for t in trees2:
        check_tree(t, 2, 12, 6, eos, fallback=False)
    assert len(res2.records) < 40


class NeverEnds:
    """A scripted token-prompt engine whose paths never end by themselves: every rollout fills its whole segment
    budget with letters (never EOS, never a stop string), so a path only ends at max_new_tokens / max_depth. Each
    call's (prompts, counts) is recorded."""

    LETTERS = 34  # 'A' .. 'Z' are ids 34 .. 59 in the tiny tokenizer

    def __init__(self):
        self.calls: list[tuple[list[list[int]], list[int]]] = []
        self.made = 0

    def generate_ids(self, prompt_ids, counts, params):
        self.calls.append(([list(p) for p in prompt_ids], list(counts)))
        out = []
        for p, c in zip(prompt_ids, counts):
            rows = []
            for _ in range(c):
                ids = [self.LETTERS + (self.made + k) % 26 for k in range(params.max_new_tokens)]
                self.made += 1
                rows.append(
                    Rollout(
                        prompt_ids=list(p),
                        completion_ids=ids,
                        logprobs=[-1.0] * len(ids),
                        finish_reason="length",
                        text="",
                    )
                )
            out.append(rows)
        return out


def test_fallback_restarts_from_the_root_when_no_leaf_ended_naturally(tiny_tokenizer, renderer, verifier):
    # every path is cut by the depth limit (2 segments of 2 tokens = max_new_tokens 4): no leaf ends by EOS or a stop
    # string, so the fallback has no leaf to re-expand and restarts `branch` = 2 paths from the root
    # widths 7, 6
    cfg = TreeConfig(rollouts_per_step=13, tree_segment_len=2, tree_max_depth=2, tree_branch=2, tree_init_branch=1)
    params = SamplingParams(temperature=1.0, max_new_tokens=4, seed=3)
    engine = NeverEnds()
    res, trees = sample(None, tiny_tokenizer, renderer, verifier, cfg, params, problems=PROBLEMS[:2], engine=engine)
    assert [t.width for t in trees] == [7, 6]
    # paths per sampling step, by hand (branch_budget(w, leaves, finished_now, live, 2) = max(min(w - leaves,
    # 2 * finished_now + 2 * live), live)):
    #   step 1: the root forks into init_branch = 1 path                                            1 | 1
    #   step 2: budget min(w - 0, 2 * 1) = 2 children; both reach depth 2: 2 "length" leaves        2 | 2
    #   step 3: no live path, 2 < w leaves, none by EOS/stop: restart min(2, w - 2) = 2 from root   2 | 2
    #   step 4: budget min(w - 2, 2 * 2) = 4 (5 | 4 left): 4 leaves, 6 | 6                          4 | 4
    #   step 5: the width-7 tree lacks 1: restart min(2, 7 - 6) = 1 from the root                   1 | -
    #   step 6: budget min(7 - 6, 2 * 1) = 1 child: the 7th leaf                                     1 | -
    assert [sum(n.step == s for n in trees[0].nodes) for s in range(1, 7)] == [1, 2, 2, 4, 1, 1]
    assert [sum(n.step == s for n in trees[1].nodes) for s in range(1, 5)] == [1, 2, 2, 4]
    assert max(n.step for n in trees[1].nodes) == 4
    for t in trees:
        # exactly the width, never more at any step (check_tree), every leaf cut by the limit
        assert check_tree(t, 2, 4, 2, tiny_tokenizer.eos_token_id) == Counter(length=t.width)
    assert [t.fallback_paths for t in trees] == [3, 2]
    # the engine was asked for the restarts with the bare prompt (the root's prefix: no completion tokens)
    assert [c for _, c in engine.calls] == [[1, 1], [2, 2], [2, 2], [2, 2, 2, 2], [1], [1]]
    assert engine.calls[2][0] == [trees[0].prompt_ids, trees[1].prompt_ids]
    assert engine.calls[4][0] == [trees[0].prompt_ids]
    for t, restarted in zip(trees, (5, 4)):
        leaves = [n for n, _, _ in t.leaves]
        assert sum(t.nodes[n].fallback for n in leaves) == restarted
        for n in leaves:
            path = t.path(n)
            # a restarted leaf's chain starts at the root, and every node on it came from the restart (it shares no
            # segment with the truncated leaves before it)
            assert t.nodes[path[0]].parent == 0 and t.nodes[path[0]].start == 0
            assert [t.nodes[p].fallback for p in path] == [t.nodes[n].fallback] * len(path)
            if t.nodes[n].fallback:
                assert t.nodes[path[0]].step in (3, 5)
        # a fallback path never grows from a node of a non-fallback path: with no EOS/stop leaf only the root is used
        assert all(t.nodes[node.parent].fallback or node.parent == 0 for node in t.nodes[1:] if node.fallback)
    m = res.metrics
    assert len(res.records) == 13 and m["tree/leaves"] == 13 and m["tree/underfilled"] == 0
    assert m["tree/fallback_expansions"] == 5 and m["tree/fallback_trees"] == 2 and m["tree/steps"] == 6
    # without fallback the same trees stop at their first 2 leaves
    res2, trees2 = sample(
        None,
        tiny_tokenizer,
        renderer,
        verifier,
        replace(cfg, tree_fallback=False),
        params,
        problems=PROBLEMS[:2],
        engine=NeverEnds(),
    )
    assert [len(t.leaves) for t in trees2] == [2, 2] and res2.metrics["tree/underfilled"] == 2
    assert res2.metrics["tree/fallback_expansions"] == 0


def test_stop_string_across_a_segment_boundary(tiny_tokenizer, tiny_model, renderer, verifier):
    # a one-path tree; the stop string is the last character of its first 2-token segment + the first of the second:
    # the engine sees neither half alone, the sampler must find it in the whole completion
    cfg = TreeConfig(rollouts_per_step=1, tree_segment_len=2, tree_max_depth=6, tree_init_branch=1)
    for seed in range(20):
        params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=seed)
        (free,) = sample(tiny_model, tiny_tokenizer, renderer, verifier, cfg, params, problems=PROBLEMS[1:2])[0].records
        ids = free.completion_ids
        head = tiny_tokenizer.decode(ids[:2], skip_special_tokens=True)
        tail = tiny_tokenizer.decode(ids[2:], skip_special_tokens=True)
        if (
            head
            and tail
            and (head + tail).find(head[-1] + tail[0]) == len(head) - 1
            and tiny_tokenizer.decode(ids[2:3], skip_special_tokens=True)
        ):
            break
    else:
        pytest.fail("no seed gave a usable completion")
    stop = head[-1] + tail[0]
    with_stop = SamplingParams(temperature=1.0, max_new_tokens=12, seed=seed, stop=(stop,))
    res, trees = sample(tiny_model, tiny_tokenizer, renderer, verifier, cfg, with_stop, problems=PROBLEMS[1:2])
    (x,) = res.records
    # same seed, same segments: the path is cut at the third token, the one that completes the stop string
    assert x.finish_reason == "stop" and x.text == head + tail[0]
    assert x.completion_ids == ids[:3] and x.segment_ends == (2, 3)


class IdsOnly:
    """The engine protocol without prefix reuse (as a backend without it would be)."""

    def __init__(self, engine):
        self.engine = engine

    def generate_ids(self, prompt_ids, counts, params):
        return self.engine.generate_ids(prompt_ids, counts, params)

    def sync_weights(self, model):
        pass


def test_prefix_reuse_changes_nothing_but_the_work(tiny_tokenizer, tiny_model, renderer, verifier):
    cfg = TreeConfig(rollouts_per_step=12, tree_segment_len=2, tree_max_depth=8)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    with_reuse, _ = sample(tiny_model, tiny_tokenizer, renderer, verifier, cfg, greedy)
    without, _ = sample(
        tiny_model,
        tiny_tokenizer,
        renderer,
        verifier,
        cfg,
        greedy,
        engine=IdsOnly(HFEngine(tiny_model, tiny_tokenizer)),
    )
    assert [x.completion_ids for x in with_reuse.records] == [x.completion_ids for x in without.records]
    assert [x.tree_path for x in with_reuse.records] == [x.tree_path for x in without.records]
    assert with_reuse.metrics["tree/engine_cached_tokens"] > 0 and "tree/engine_cached_tokens" not in without.metrics


def test_same_seed_same_trees(tiny_tokenizer, eos_prone_model, renderer, verifier):
    cfg = TreeConfig(rollouts_per_step=16, tree_segment_len=2, tree_max_depth=6)
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=11)
    a, _ = sample(eos_prone_model, tiny_tokenizer, renderer, verifier, cfg, params)
    b, _ = sample(eos_prone_model, tiny_tokenizer, renderer, verifier, cfg, params)
    c, _ = sample(
        eos_prone_model,
        tiny_tokenizer,
        renderer,
        verifier,
        cfg,
        SamplingParams(temperature=1.0, max_new_tokens=10, seed=12),
    )
    assert [(x.completion_ids, x.tree_path) for x in a.records] == [(x.completion_ids, x.tree_path) for x in b.records]
    assert [x.completion_ids for x in a.records] != [x.completion_ids for x in c.records]


def test_tree_advantage_through_the_planner(tiny_tokenizer, eos_prone_model, renderer):
    # rewards that differ inside trees: 1 for an even completion length
    class Parity:
        def verify_batch(self, texts, refs):
            from xrpo.rewards import VerifyResult

            return [VerifyResult(score=float(len(t) % 2 == 0), answer=None) for t in texts]

    cfg = TreeConfig(rollouts_per_step=16, tree_segment_len=2, tree_max_depth=5)
    res, trees = sample(
        eos_prone_model,
        tiny_tokenizer,
        renderer,
        Parity(),
        cfg,
        SamplingParams(temperature=1.0, max_new_tokens=10, seed=2),
    )
    # the ancestors of each leaf as the planner builds them: the root, then its path's nodes above its own
    anc = tree_ancestor_ids(res.records)
    for x, row in zip(res.records, anc):
        assert (row >= 0).sum() == len(x.tree_path)
    # hand-built ids from the trees themselves give the same advantages
    ids = {}
    rows = []
    for x in res.records:
        keys = [(x.problem_index, 0)] + [(x.problem_index, n) for n in x.tree_path[:-1]]
        rows.append([ids.setdefault(k, len(ids)) for k in keys])
    mat = np.full((len(rows), max(map(len, rows))), -1)
    for i, r in enumerate(rows):
        mat[i, : len(r)] = r
    want, _ = tree_advantages(res.rewards, mat)
    adv, metrics = compute_advantages(res, PlanConfig(tree_advantage=True, adv_scale="none", sharpen=False, icl=False))
    np.testing.assert_allclose(adv, want, rtol=1e-12)
    assert np.any(adv != 0) and "adv/tree_subgroups_mean" in metrics
    with pytest.raises(ValueError, match="config field sharpen must be false with tree_advantage=true"):
        PlanConfig(tree_advantage=True, sharpen=True)


def test_tree_ancestor_ids_hand():
    def rec(g, path):
        return RolloutRecord(
            problem_index=g,
            group_id=g,
            round=0,
            seeded=False,
            gen_prompt_ids=[1],
            train_prompt_ids=[1],
            completion_ids=[2],
            logprobs=[0.0],
            finish_reason="eos",
            text="",
            tree_path=path,
        )

    # group 0: leaves under nodes (1) and (1, 3); group 1: a leaf under its root only; an independent rollout
    got = tree_ancestor_ids([rec(0, (1, 4)), rec(0, (1, 3, 5)), rec(1, (2,)), rec(0, (2,)), rec(2, ())])
    # ids in order of first sight: (0,root)=0, (0,1)=1, (0,3)=2, (1,root)=3, (2,root)=4
    np.testing.assert_array_equal(got, [[0, 1, -1], [0, 1, 2], [3, -1, -1], [0, -1, -1], [4, -1, -1]])


def test_bad_config_and_engine(tiny_tokenizer, tiny_model, renderer, verifier):
    assert TreeConfig().segment_tokens(24) == 2 and TreeConfig(tree_segment_len=5).segment_tokens(24) == 5
    for kwargs, match in [
        (dict(tree_branch=0), "tree_branch must be >= 1"),
        (dict(tree_segment_len=-1), "tree_segment_len must be >= 0"),
        (dict(tree_divergence="wide"), "tree_divergence must be one of"),
        (dict(tree_divergence_temp=0.0), "tree_divergence_temp must be a finite number > 0"),
        (dict(tree_max_depth=2.0), "tree_max_depth must be an int >= 1"),
        (dict(rollouts_per_step=0), "rollouts_per_step must be an integer >= 1"),
    ]:
        with pytest.raises(ValueError, match=match):
            TreeConfig(**kwargs)

    class TextOnly:
        def generate(self, prompts, counts, params):
            return [[] for _ in prompts]

    with pytest.raises(TypeError, match="needs an engine with generate_ids"):
        generate_tree_rollouts(PROBLEMS, TextOnly(), verifier, renderer, TreeConfig(), SamplingParams())
    with pytest.raises(ValueError, match="problems is empty"):
        generate_tree_rollouts(
            [], HFEngine(tiny_model, tiny_tokenizer), verifier, renderer, TreeConfig(), SamplingParams()
        )
