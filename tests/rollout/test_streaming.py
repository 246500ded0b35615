"""The streaming planner (`xrpo.rollout.streaming`) on scripted engines whose requests complete in chosen,
adversarial orders: the budget is spent exactly, a seed gives the same result, every prompt passes every round once,
and where every request completes at once (or stream_quorum=1) the result is rounds' own, record for record.

The scripted policy draws each completion from (seed, prompt index, prompt, completion number) alone, as vLLM's
per-request seeds do, so what a request draws does not depend on when it completes."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from xrpo.rollout.engine import BatchStream, Rollout, SamplingParams, StreamingEngine, as_stream
from xrpo.rollout.planner import generate_rollouts
from xrpo.rollout.records import PlanConfig
from xrpo.rollout.streaming import quorum_size

from ._fakes import ScriptedPolicy, char_rollout, problems_and_rates, renderer
from .test_planner import seeded_corpus

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=8, seed=7)


class SeededPolicy(ScriptedPolicy):
    """A batch engine (``generate`` only): prompt q is answered right with probability p_plain[q] (p_icl[q] from an
    ICL prompt); completion j of the prompt at ``index`` draws from (seed, index, prompt, j)."""

    def __init__(self, problems, p_plain, p_icl):
        super().__init__(problems, p_plain, p_icl)
        self.requests: list[tuple[int, int, bool]] = []  # (prompt index, n, icl) of every request made

    def draw(self, prompt: str, n: int, params: SamplingParams, index: int) -> list[Rollout]:
        q, icl = self._problem(prompt)
        self.requests.append((q, n, icl))
        p = (self.p_icl if icl else self.p_plain)[q]
        out = []
        for j in range(n):
            digest = hashlib.sha256(f"{params.seed}:{index}:{prompt}:{j}".encode()).digest()
            rng = np.random.default_rng(list(digest[:8]))
            ans = self.problems[q].answer if rng.random() < p else "-1"
            text = f" \\boxed{{{ans}}}"
            out.append(char_rollout(prompt, text, -0.1 - rng.random(len(text))))
        return out

    def generate(self, prompts, counts, params):
        return [self.draw(p, n, params, i) if n > 0 else [] for i, (p, n) in enumerate(zip(prompts, counts))]


class ScriptedStream(SeededPolicy):
    """A streaming engine whose requests complete in the order ``script`` chooses: given the keys in flight (in
    submission order) and the number of the wait, it returns the keys that complete at this wait (at least one)."""

    def __init__(self, problems, p_plain, p_icl, script):
        super().__init__(problems, p_plain, p_icl)
        self.script, self.pending, self.waits, self.log = script, [], 0, []

    def submit(self, key, prompt, n, params, *, index=0):
        assert all(k != key for k, *_ in self.pending)
        self.pending.append((key, prompt, n, params, index))

    def wait(self):
        if not self.pending:
            return []
        keys = [k for k, *_ in self.pending]
        chosen = set(self.script(keys, self.waits))
        self.waits += 1
        assert chosen and chosen <= set(keys)
        done = [entry for entry in self.pending if entry[0] in chosen]
        self.pending = [entry for entry in self.pending if entry[0] not in chosen]
        self.log.append([entry[0] for entry in done])
        return [(key, self.draw(prompt, n, params, index)) for key, prompt, n, params, index in done]


def newest_first(keys, _):
    return [keys[-1]]


def oldest_first(keys, _):
    return [keys[0]]


def random_subsets(keys, w):
    rng = np.random.default_rng(w)
    pick = [k for k in keys if rng.random() < 0.3]
    return pick or [keys[int(rng.integers(len(keys)))]]


def prompt_zero_last(keys, _):
    # prompt 0 straggles: its requests complete only when nothing else is in flight; the others two at a time
    others = [k for k in keys if k[0] != 0]
    return others[:2] or keys


def ends_first(keys, w):
    # alternately the last and the first request in flight, one at a time
    return [keys[-1] if w % 2 == 0 else keys[0]]


SCRIPTS = [newest_first, oldest_first, random_subsets, prompt_zero_last, ends_first]


def config(**kw):
    base = dict(rollouts_per_step=128, n_base=4, plan_rounds=2, sharpen=False, planner="streaming")
    return PlanConfig(**{**base, **kw})


def run(engine, cfg, verifier, icl=True, sampling=SAMPLING):
    probs, _, _ = problems_and_rates()
    corpus = seeded_corpus(probs) if icl else None
    return generate_rollouts(probs, engine, verifier, renderer(), cfg, sampling, corpus=corpus)


def signature(res):
    return [(x.problem_index, x.round, x.seeded, x.text, x.reward, tuple(x.logprobs)) for x in res.records]


def test_the_scripted_engines_stream():
    probs, pp, pi = problems_and_rates()
    assert isinstance(ScriptedStream(probs, pp, pi, oldest_first), StreamingEngine)
    assert not isinstance(SeededPolicy(probs, pp, pi), StreamingEngine)
    assert isinstance(as_stream(SeededPolicy(probs, pp, pi)), BatchStream)


def test_quorum_size():
    assert [quorum_size(f, 16) for f in (0.01, 0.25, 0.5, 0.3, 1.0)] == [1, 4, 8, 5, 16]
    assert quorum_size(0.5, 1) == 1


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("quorum", [0.25, 0.5])
def test_budget_spent_exactly_in_any_completion_order(script, quorum, verifier):
    probs, pp, pi = problems_and_rates()
    engine = ScriptedStream(probs, pp, pi, script)
    res = run(engine, config(stream_quorum=quorum), verifier)
    P = len(probs)
    assert len(res.records) == 128 and sum(n for _, n, _ in engine.requests) == 128
    sizes = np.bincount(res.group_ids, minlength=P)
    assert sizes.min() >= 4
    base, waves = res.rounds[0], res.rounds[1:]
    assert base["alloc"] == [4] * P and sum(base["successes"]) == sum(
        x.reward >= 1 for x in res.records if x.round == 0
    )
    # round t's budget (32 + 32 of plan_phases) is split evenly, 2 per prompt; every prompt is planned for each round
    # exactly once, and a wave spends exactly its members' shares
    for t in (1, 2):
        members = sorted(q for w in waves if w["stage"] == t for q in w["members"])
        assert members == list(range(P))
    for w in waves:
        assert sum(w["alloc"]) == 2 * len(w["members"])
        assert all(w["alloc"][q] == 0 for q in range(P) if q not in w["members"])
    # records carry their wave; a wave's rollouts are what it allocated
    for i, w in enumerate(res.rounds):
        recs = [x for x in res.records if x.round == i]
        assert len(recs) == sum(w["alloc"])
        assert [sum(1 for x in recs if x.problem_index == q) for q in range(P)] == w["alloc"]
        assert w["successes"] == [sum(x.reward >= 1 for x in recs if x.problem_index == q) for q in range(P)]
    assert [x.round for x in res.records] == sorted(x.round for x in res.records)
    assert res.metrics["rollout/count"] == 128.0
    # every rollout verified (the last round's in one batch at the end)
    for x in res.records:
        assert x.reward == (1.0 if x.text == f" \\boxed{{{probs[x.problem_index].answer}}}" else 0.0)
        assert (x.answer, x.verify_reason) != (None, None)


@pytest.mark.parametrize("script", SCRIPTS)
def test_waves_below_the_quorum_only_for_a_rounds_last_prompts(script, verifier):
    probs, pp, pi = problems_and_rates()
    engine = ScriptedStream(probs, pp, pi, script)
    res = run(engine, config(stream_quorum=0.5), verifier)
    quorum = quorum_size(0.5, len(probs))
    for i, w in enumerate(res.rounds[1:], start=1):
        if len(w["members"]) < quorum:
            # below the quorum only for the round's last prompts, or when nothing else decodes
            so_far = sum(len(v["members"]) for v in res.rounds[1 : i + 1] if v["stage"] == w["stage"])
            assert so_far == len(probs) or w["in_flight"] == 0
    # and waves overlap decoding: some wave went in while other requests were in flight
    assert any(w["in_flight"] > 0 for w in res.rounds[1:])
    # in flight at a wave = requests submitted before it minus those completed by its wait
    for i, w in enumerate(res.rounds[1:], start=1):
        submitted = 16 + sum(sum(1 for a in v["alloc"] if a > 0) for v in res.rounds[1:i])
        assert w["in_flight"] == submitted - sum(len(x) for x in engine.log[: w["wait"]])


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_seed_gives_the_same_result(script, verifier):
    probs, pp, pi = problems_and_rates()
    a = run(ScriptedStream(probs, pp, pi, script), config(), verifier)
    b = run(ScriptedStream(probs, pp, pi, script), config(), verifier)
    assert signature(a) == signature(b) and a.rounds == b.rounds
    other = run(ScriptedStream(probs, pp, pi, script), config(), verifier, sampling=SamplingParams(seed=8))
    assert signature(other) != signature(a)


def test_seeds_do_not_depend_on_completion_order(verifier):
    # one round, no quorum games: with stream_quorum=1 every order gives rounds' allocation, so the same requests
    # (prompt, round, count) are made in every order, and each must draw the same completions
    probs, pp, pi = problems_and_rates()
    results = [run(ScriptedStream(probs, pp, pi, s), config(stream_quorum=1.0), verifier) for s in SCRIPTS]
    for res in results[1:]:
        assert sorted(signature(res)) == sorted(signature(results[0]))


@pytest.mark.parametrize("quorum", [0.1, 0.5, 1.0])
@pytest.mark.parametrize("icl", [True, False])
@pytest.mark.parametrize("allocation", ["hrp", "uniform"])
def test_equals_rounds_when_every_request_completes_at_once(quorum, icl, allocation, verifier):
    # a batch engine (BatchStream: everything submitted completes at the next wait): every wave holds all prompts,
    # so waves are rounds: same allocations, ICL prompts, seeds and records
    probs, pp, pi = problems_and_rates()
    cfg = config(stream_quorum=quorum, icl=icl, allocation=allocation, rollouts_per_step=100)
    streamed = run(SeededPolicy(probs, pp, pi), cfg, verifier, icl=icl)
    rounds = run(
        SeededPolicy(probs, pp, pi),
        config(planner="rounds", icl=icl, allocation=allocation, rollouts_per_step=100),
        verifier,
        icl=icl,
    )
    assert signature(streamed) == signature(rounds)
    for s, r in zip(streamed.rounds, rounds.rounds, strict=True):
        assert {k: v for k, v in s.items() if k not in ("members", "stage", "wait", "in_flight")} == r
    assert streamed.metrics.keys() == rounds.metrics.keys()
    for k, v in rounds.metrics.items():
        if not k.startswith("time/"):
            assert streamed.metrics[k] == v, k
    if icl:
        assert streamed.metrics["icl/seeded_prompts"] > 0


@pytest.mark.parametrize("script", SCRIPTS)
def test_quorum_one_is_rounds_in_any_completion_order(script, verifier):
    probs, pp, pi = problems_and_rates()
    streamed = run(ScriptedStream(probs, pp, pi, script), config(stream_quorum=1.0), verifier)
    rounds = run(SeededPolicy(probs, pp, pi), config(planner="rounds"), verifier)
    assert signature(streamed) == signature(rounds)
    assert [r["alloc"] for r in streamed.rounds] == [r["alloc"] for r in rounds.rounds]


def test_unsolved_prompts_are_icl_seeded_when_their_base_group_completes(verifier):
    # prompts 4-7 never succeed plainly; their first wave draws from their ICL prompt, submitted in the wave that
    # follows their base group, while other base groups are still in flight
    probs, pp, pi = problems_and_rates()
    engine = ScriptedStream(probs, pp, pi, oldest_first)
    res = run(engine, config(stream_quorum=0.25), verifier)
    first = {}
    for w in res.rounds[1:]:
        for q in w["members"]:
            first.setdefault(q, w)
    for q in range(4, 8):
        w = first[q]
        assert w["stage"] == 1 and (q in w["seeded"]) == (w["alloc"][q] > 0)
    early = [w for w in res.rounds[1:] if w["stage"] == 1][0]
    assert early["wait"] < 16  # planned before the last base group completed
    assert res.metrics["icl/seeded_prompts"] > 0
    stage1 = {i for i, w in enumerate(res.rounds) if i > 0 and w["stage"] == 1}
    assert all(x.seeded for x in res.records if x.round in stage1 and 4 <= x.problem_index < 8)


def test_caps_are_honoured(verifier):
    probs, pp, pi = problems_and_rates()
    res = run(ScriptedStream(probs, pp, pi, random_subsets), config(max_extra_per_prompt=3), verifier)
    assert max(max(w["alloc"]) for w in res.rounds[1:]) <= 3
    assert len(res.records) == 128


def test_uneven_round_budgets_and_more_rounds(verifier):
    # 16 prompts, 4 base each, 37 extra over 3 rounds (13, 12, 12): shares of 0 or 1 per prompt
    probs, pp, pi = problems_and_rates()
    for script in SCRIPTS:
        res = run(ScriptedStream(probs, pp, pi, script), config(rollouts_per_step=101, plan_rounds=3), verifier)
        assert len(res.records) == 101
        for t, budget in zip((1, 2, 3), (13, 12, 12)):
            assert sum(sum(w["alloc"]) for w in res.rounds[1:] if w["stage"] == t) == budget


def test_batch_stream_generates_at_the_next_wait():
    probs, pp, pi = problems_and_rates()
    policy = SeededPolicy(probs, pp, pi)
    stream = BatchStream(policy)
    assert stream.wait() == []
    p0, p3 = f"Q: {probs[0].prompt}\nA:", f"Q: {probs[3].prompt}\nA:"
    stream.submit("a", p3, 2, SAMPLING, index=3)
    stream.submit("b", p0, 1, SAMPLING, index=0)
    stream.submit("c", p3, 1, SamplingParams(seed=9), index=3)
    with pytest.raises(ValueError, match="in flight"):
        stream.submit("a", p0, 1, SAMPLING)
    got = stream.wait()
    assert [k for k, _ in got] == ["a", "b", "c"]
    # each request draws what generate draws for its index and params
    assert [r.text for r in got[0][1]] == [r.text for r in policy.generate(["", "", "", p3], [0, 0, 0, 2], SAMPLING)[3]]
    assert stream.wait() == []


@pytest.mark.parametrize(
    "key,n,index,match",
    [
        (("a", 0), 1, 0, r"key \('a', 0\) is already in flight"),
        (("b", 0), 0, 0, r"n: expected an int >= 1, got 0"),
        (("b", 0), 2.0, 0, r"n: expected an int >= 1, got 2.0"),
        (("b", 0), 1, -1, r"index: expected an int >= 0, got -1"),
        (("b", 0), 1, True, r"index: expected an int >= 0, got True"),
    ],
)
def test_batch_stream_refuses_bad_submits(key, n, index, match):
    probs, pp, pi = problems_and_rates()
    stream = BatchStream(ScriptedPolicy(probs, pp, pi))
    stream.submit(("a", 0), renderer().render(probs[0]), 1, SamplingParams(max_new_tokens=8), index=0)
    with pytest.raises(ValueError, match=match):
        stream.submit(key, renderer().render(probs[1]), n, SamplingParams(max_new_tokens=8), index=index)
    assert [k for k, _ in stream.wait()] == [("a", 0)]  # the refused request was not queued
