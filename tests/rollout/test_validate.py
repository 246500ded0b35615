"""Tests for xrpo.rollout.validate: the figures of per-problem records against a hand table, and sample_and_score's
chunking, resume (`done`) and per-chunk callback on a real tiny model."""

from __future__ import annotations

import pytest

from xrpo.data import Problem
from xrpo.rewards import VerifyResult
from xrpo.rewards.registry import FunctionVerifier
from xrpo.rollout.engine import SamplingParams
from xrpo.rollout.validate import chunk_seed, sample_and_score, score_records, unscored_record


def rec(answers, correct, lengths=None, truncated=0):
    return {
        "id": "x",
        "n": len(answers),
        "c": sum(correct),
        "answers": answers,
        "correct": correct,
        "lengths": lengths or [1] * len(answers),
        "truncated": truncated,
    }


# n = 4 samples per problem; five problems covering c = 0, c = n, a tie, unparseable answers
HAND = [
    rec([None, "3", "3", "5"], [False] * 4, [2, 4, 6, 8], truncated=1),  # c=0; "3" wins the vote, wrong
    rec(["7"] * 4, [True] * 4, [1, 1, 1, 1]),  # c=n; everything 1
    rec(["2", "9", "9", "2"], [True, False, False, True], [3, 3, 3, 3]),  # c=2; tie 2-2 -> "2" (first), right
    rec([None] * 4, [False] * 4, [24, 24, 24, 24], truncated=4),  # nothing parsed: the vote is wrong
    rec(["5", None, None, None], [True, False, False, False]),  # None never wins: "5" wins, right
]


def test_score_records_hand_table():
    m = score_records(HAND, 4, ks=(1, 2, 4), prefix="")
    # pass@1 = c/n per problem: (0 + 1 + 2/4 + 0 + 1/4) / 5 = 1.75 / 5
    assert m["pass@1"] == pytest.approx(0.35, abs=1e-15)
    # pass@2 = 1 - C(n-c, 2)/C(4, 2): 0, 1, 1 - 1/6 = 5/6, 0, 1 - 3/6 = 1/2 -> (1 + 5/6 + 1/2) / 5 = 7/15
    assert m["pass@2"] == pytest.approx(7 / 15, abs=1e-15)
    # pass@4 = k = n: 1 when any sample is right: (0 + 1 + 1 + 0 + 1) / 5
    assert m["pass@4"] == pytest.approx(0.6, abs=1e-15)
    # cons@4: wrong, right, right (tie to first), wrong (no answer), right -> 3/5
    assert m["cons@4"] == pytest.approx(0.6, abs=1e-15)
    # lengths: (20 + 4 + 12 + 96 + 4) / 20 samples = 136 / 20
    assert m["response_length_mean"] == pytest.approx(6.8, abs=1e-12)
    # truncated: (1 + 4) / 20; no answer: (1 + 0 + 0 + 4 + 3) / 20
    assert m["truncation_rate"] == pytest.approx(0.25, abs=1e-15)
    assert m["no_answer_rate"] == pytest.approx(0.4, abs=1e-15)
    assert "unsampled_problems" not in m


def test_score_records_unsampled_problem_counts_as_unsolved():
    p = Problem(id="long", prompt="q", answer="1")
    r = unscored_record(p, 4, "too long")
    assert r["reasons"] == ["not_sampled"] * 4 and r["skipped"] == "too long"
    m = score_records([HAND[1], r], 4, ks=(1, 4), prefix="e/")
    # (1 + 0) / 2 for every k, and the vote
    assert m["e/pass@1"] == m["e/pass@4"] == m["e/cons@4"] == 0.5
    # lengths and truncation from the sampled problem only; no answer: 4 of 8 samples
    assert m["e/response_length_mean"] == 1.0 and m["e/truncation_rate"] == 0.0
    assert m["e/no_answer_rate"] == 0.5 and m["e/unsampled_problems"] == 1.0


def test_score_records_defaults_to_pass_at_1_under_eval():
    # the trainer's call: ks and prefix left out -> pass@1 only, named eval/...; (0 + 1 + 2/4 + 0 + 1/4) / 5
    m = score_records(HAND, 4)
    assert sorted(k for k in m if "pass@" in k) == ["eval/pass@1"]
    assert m["eval/pass@1"] == pytest.approx(0.35, abs=1e-15)


def test_score_records_every_problem_unsampled_gives_zero_rates():
    # nothing was drawn: no length to average (0, not an invented figure), nothing truncated, every answer missing
    recs = [unscored_record(Problem(id=i, prompt="q", answer="1"), 2, "too long") for i in ("a", "b")]
    m = score_records(recs, 2, ks=(1, 2), prefix="")
    assert m["response_length_mean"] == 0.0 and m["truncation_rate"] == 0.0
    assert m["pass@1"] == m["pass@2"] == m["cons@2"] == 0.0
    assert m["no_answer_rate"] == 1.0 and m["unsampled_problems"] == 2.0


def test_score_records_one_sample():
    # one problem, one sample without an answer: every rate is over that one sample
    m = score_records([rec([None], [False], [5], truncated=1)], 1, prefix="")
    assert m["no_answer_rate"] == 1.0 and m["truncation_rate"] == 1.0 and m["response_length_mean"] == 5.0
    assert m["pass@1"] == 0.0 and m["cons@1"] == 0.0


def test_score_records_rejects_empty_and_bad_k():
    with pytest.raises(ValueError, match="no problems"):
        score_records([], 4)
    with pytest.raises(ValueError, match="k"):
        score_records(HAND, 4, ks=(5,))


def test_chunk_seed():
    assert chunk_seed(None, 3) is None
    seeds = {chunk_seed(7, c) for c in range(100)} | {chunk_seed(8, c) for c in range(100)}
    assert len(seeds) == 200 and all(0 <= s < 2**31 for s in seeds)
    assert chunk_seed(7, 3) == chunk_seed(7, 3)


# ------------------------------------------------------------------------------------------------ sampling
def parity(completion, reference):
    even = len(completion) % 2 == 0
    return VerifyResult(score=float(even), answer=str(len(completion) % 2), reason=None if even else "odd_length")


@pytest.fixture(scope="module")
def parts(tiny_model, tiny_tokenizer):
    import copy

    from xrpo.rollout.hf_engine import HFEngine
    from xrpo.rollout.prompts import PromptRenderer

    model = copy.deepcopy(tiny_model)
    engine = HFEngine(model, tiny_tokenizer, max_batch_size=64)
    renderer = PromptRenderer(tiny_tokenizer, use_chat_template=False, prompt_template="Q: {prompt}\nA:")
    problems = [Problem(id=f"p{i}", prompt=f"{i} + {i} = ?", answer=str(2 * i)) for i in range(5)]
    return engine, FunctionVerifier(parity), renderer, problems


SAMPLING = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=8, seed=11)


def test_one_call_without_chunks_is_the_engine_call(parts):
    engine, verifier, renderer, problems = parts
    m, recs = sample_and_score(problems, engine, verifier, renderer, n=3, sampling=SAMPLING, ks=(1, 3))
    outs = engine.generate([renderer.render(p) for p in problems], [3] * 5, SAMPLING)
    for r, rollouts, p in zip(recs, outs, problems):
        assert r["id"] == p.id and r["reference"] == p.answer and r["n"] == 3
        assert r["lengths"] == [len(x.completion_ids) for x in rollouts]
        assert r["correct"] == [len(x.text) % 2 == 0 for x in rollouts]
        assert r["c"] == sum(r["correct"]) and r["answers"] == [str(len(x.text) % 2) for x in rollouts]
        # the verifier's reason of each sample, None for a correct one
        assert r["reasons"] == [None if len(x.text) % 2 == 0 else "odd_length" for x in rollouts]
    assert m == score_records(recs, 3, (1, 3))


def test_chunks_resume_and_callback(parts):
    engine, verifier, renderer, problems = parts
    seen = []
    m_all, full = sample_and_score(
        problems,
        engine,
        verifier,
        renderer,
        n=3,
        sampling=SAMPLING,
        ks=(1, 2),
        chunk_size=2,
        on_chunk=lambda rs: seen.append([r["id"] for r in rs]),
    )
    assert seen == [["p0", "p1"], ["p2", "p3"], ["p4"]]
    # resume: chunk 0 and half of chunk 1 done; chunk 0 is skipped, chunk 1 samples p3 alone, chunk 2 as before
    done = {0: full[0], 1: full[1], 2: full[2]}
    seen = []
    m_res, resumed = sample_and_score(
        problems,
        engine,
        verifier,
        renderer,
        n=3,
        sampling=SAMPLING,
        ks=(1, 2),
        chunk_size=2,
        done=done,
        on_chunk=lambda rs: seen.append([r["id"] for r in rs]),
    )
    assert seen == [["p3"], ["p4"]]
    assert resumed[:3] == full[:3]
    # chunk 2 is sampled with the same seed and the same rows: identical to the uninterrupted run
    assert resumed[4] == full[4]
    # all done: nothing sampled, same figures
    m_done, again = sample_and_score(
        problems,
        engine,
        verifier,
        renderer,
        n=3,
        sampling=SAMPLING,
        ks=(1, 2),
        chunk_size=2,
        done=dict(enumerate(full)),
        on_chunk=lambda rs: pytest.fail("sampled a finished problem"),
    )
    assert again == full and m_done == m_all


def test_prompts_override_and_keep_text(parts):
    engine, verifier, renderer, problems = parts
    prompts = ["Q: 1 + 1 = ?\nA: 2\n" + renderer.render(p) for p in problems[:2]]
    _, recs = sample_and_score(
        problems[:2], engine, verifier, renderer, n=2, sampling=SAMPLING, prompts=prompts, keep_text=True
    )
    outs = engine.generate(prompts, [2, 2], SAMPLING)
    assert [r["completions"] for r in recs] == [[x.text for x in o] for o in outs]


def test_argument_errors(parts):
    engine, verifier, renderer, problems = parts
    with pytest.raises(ValueError, match="prompts"):
        sample_and_score(problems, engine, verifier, renderer, n=2, sampling=SAMPLING, prompts=["x"])
    with pytest.raises(ValueError, match="chunk_size"):
        sample_and_score(problems, engine, verifier, renderer, n=2, sampling=SAMPLING, chunk_size=0)
    with pytest.raises(ValueError, match=r"done\[1\]"):
        sample_and_score(problems, engine, verifier, renderer, n=2, sampling=SAMPLING, done={1: {"id": "p0"}})
    with pytest.raises(ValueError, match="k must be in"):
        sample_and_score(problems, engine, verifier, renderer, n=2, sampling=SAMPLING, ks=(4,))
