"""xrpo.rollout.engine: the contract shared by every rollout engine (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest

from xrpo.rollout.engine import (
    Rollout,
    RolloutEngine,
    SamplingParams,
    check_seed,
    cut_at_stop,
    encode_prompts,
    find_stop,
    validate_generate_args,
    validate_generate_ids_args,
)


# ---- SamplingParams ----------------------------------------------------------------------------------------------
def test_sampling_params_defaults_and_normalisation():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.max_new_tokens, p.stop, p.seed) == (1.0, 1.0, 256, (), None)
    assert not p.greedy and SamplingParams(temperature=0).greedy
    q = SamplingParams(temperature=1, top_p=np.float32(0.5), stop=["\n\n", "Q:"], seed=np.int64(3))
    assert q.stop == ("\n\n", "Q:") and isinstance(q.temperature, float) and q.top_p == 0.5 and q.seed == 3
    with pytest.raises(AttributeError):
        q.temperature = 2.0  # frozen: one object can be shared by the planner's rounds


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(temperature="1"), "temperature"),
        (dict(temperature=True), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=2.0), "max_new_tokens"),
        (dict(stop="\n"), r"single string"),
        (dict(stop=("ok", "")), r"stop\[1\]"),
        (dict(stop=(1,)), r"stop\[0\]"),
        (dict(stop=5), "stop"),
        (dict(seed=-1), "seed"),
        (dict(seed=1.5), "seed"),
    ],
)
def test_sampling_params_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


# ---- Rollout -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2**32 - 1, np.int64(7)])
def test_check_seed_accepts_numpy_and_torch_range(seed):
    check_seed(seed)


@pytest.mark.parametrize("seed", [-1, 2**32, 2**40, 1.0, True, None, "3"])
def test_check_seed_refuses_what_numpy_or_torch_cannot_take(seed):
    # np.random.seed refuses -1 and 2**32 ("Seed must be between 0 and 2**32 - 1"); a float, bool or None is a typo
    with pytest.raises(
        ValueError, match=r"^--seed must be an int in \[0, 2\*\*32\) \(numpy's and torch's seeds\), got "
    ):
        check_seed(seed, "--seed")


def test_rollout_fields_and_checks():
    r = Rollout(prompt_ids=[5, 6], completion_ids=[7, 1], logprobs=[-0.5, -0.25], finish_reason="eos", text="x")
    assert r.num_tokens == 2 and r.metadata == {}
    with pytest.raises(ValueError, match="one log-prob per completion token"):
        Rollout(prompt_ids=[5], completion_ids=[7, 1], logprobs=[-0.5], finish_reason="eos", text="x")
    with pytest.raises(ValueError, match="finish_reason"):
        Rollout(prompt_ids=[5], completion_ids=[7], logprobs=[-0.5], finish_reason="done", text="x")


def test_protocol_is_structural():
    class Fake:
        def generate(self, prompts, counts, params):
            return [[] for _ in prompts]

        def sync_weights(self, model):
            pass

    assert isinstance(Fake(), RolloutEngine)
    assert not isinstance(object(), RolloutEngine)


# ---- validate_generate_args --------------------------------------------------------------------------------------
def test_validate_generate_args_accepts_sequences():
    prompts, counts = validate_generate_args(("a", "b"), (np.int64(2), 0), SamplingParams())
    assert prompts == ["a", "b"] and counts == [2, 0] and all(type(c) is int for c in counts)


@pytest.mark.parametrize(
    "prompts, counts, params, match",
    [
        ("a prompt", [1], SamplingParams(), "prompts: expected a list"),
        (["a"], 1, SamplingParams(), "counts: expected a list"),
        (["a", "b"], [1], SamplingParams(), r"counts: expected one count per prompt \(2\), got 1"),
        (["a"], [-1], SamplingParams(), r"counts\[0\]"),
        (["a", "b"], [1, 1.0], SamplingParams(), r"counts\[1\]"),
        (["a"], [True], SamplingParams(), r"counts\[0\]"),
        (["a", None], [1, 1], SamplingParams(), r"prompts\[1\]"),
        (["a"], [1], {"temperature": 1.0}, "params"),
    ],
)
def test_validate_generate_args_errors(prompts, counts, params, match):
    with pytest.raises(ValueError, match=match):
        validate_generate_args(prompts, counts, params)


def test_validate_generate_ids_args_checks_the_vocabulary_of_prompts_with_rollouts():
    ids, counts = validate_generate_ids_args([[1, 9], (np.int64(3),)], [1, 2], SamplingParams(), vocab_size=10)
    assert ids == [[1, 9], [3]] and counts == [1, 2]
    # a prompt with no rollouts is not generated from: its ids are not looked up
    assert validate_generate_ids_args([[1], [10]], [1, 0], SamplingParams(), vocab_size=10)[0] == [[1], [10]]
    with pytest.raises(ValueError, match=r"prompt_ids\[1\]: token id 10 is outside the model's vocabulary of 10"):
        validate_generate_ids_args([[1], [4, 10]], [1, 1], SamplingParams(), vocab_size=10)
    assert validate_generate_ids_args([[10**9]], [1], SamplingParams())[0] == [[10**9]]  # vocabulary unknown


def test_encode_prompts_encodes_only_prompts_with_rollouts(tiny_tokenizer):
    ids = encode_prompts(tiny_tokenizer, ["Q: 1+1", "", "Q: 2+2"], [1, 0, 3], add_special_tokens=False)
    want = tiny_tokenizer(["Q: 1+1", "Q: 2+2"], add_special_tokens=False)["input_ids"]
    assert ids == [list(want[0]), [], list(want[1])] and len(ids[0]) > 0
    with pytest.raises(ValueError, match=r"prompts\[1\]: encodes to no tokens"):
        encode_prompts(tiny_tokenizer, ["Q: 1+1", ""], [1, 1], add_special_tokens=False)


# ---- stop strings ------------------------------------------------------------------------------------------------
# A toy tokenizer: each id decodes to a fixed string, so the expected cut can be worked out by hand.
VOCAB = {0: "ab", 1: "c\nQ", 2: "x", 3: "\n", 4: "Q:", 5: "", 6: "yz"}


def decode(ids):
    return "".join(VOCAB[i] for i in ids)


def slow_cut(ids, stop):
    """Reference twin: grow the prefix one token at a time."""
    for k in range(1, len(ids) + 1):
        text = decode(ids[:k])
        ends = [text.find(s) + len(s) for s in stop if s in text]
        if ends:
            return k, text[: min(ends)]
    return None


def test_find_stop_takes_the_earliest_ending_occurrence():
    assert find_stop("abc\nQ: d", ["Q:", "\n"]) == 4  # "\n" ends at 4, "Q:" at 6
    assert find_stop("abc", ["\n"]) is None
    assert find_stop("aXbXc", ["bX", "X"]) == 2
    assert find_stop("", ["x"]) is None


@pytest.mark.parametrize(
    "ids, stop, expected",
    [
        # "ab" + "c\nQ": "\nQ" is completed by token 1, text cut right after it (nothing follows inside the token)
        ([0, 1, 2], ("\nQ",), (2, "abc\nQ")),
        # "\n" is completed inside token 1; the token stays, the text is cut after the "\n"
        ([0, 1, 2], ("\n",), (2, "abc\n")),
        # the stop string spans two tokens: "\n" (id 3) + "Q:" (id 4)
        ([2, 3, 4, 6], ("\nQ:",), (3, "x\nQ:")),
        # two stop strings: the one that ends first wins
        ([2, 3, 4, 6], ("Q:y", "\nQ"), (3, "x\nQ")),
        # an empty-decoding token (special token) after the stop does not move the cut
        ([2, 5, 3, 5], ("\n",), (3, "x\n")),
        ([0, 2, 6], ("\n",), None),
        ([], ("\n",), None),
        ([0, 1], (), None),
    ],
)
def test_cut_at_stop_hand_cases(ids, stop, expected):
    assert cut_at_stop(ids, stop, decode) == expected


def test_cut_at_stop_matches_slow_reference_on_random_sequences():
    rng = np.random.default_rng(0)
    stops = [("\n",), ("Q:",), ("\nQ",), ("zab",), ("c\n", "x\n"), ("nothing",)]
    for _ in range(300):
        ids = rng.integers(0, len(VOCAB), size=rng.integers(0, 12)).tolist()
        stop = stops[rng.integers(len(stops))]
        assert cut_at_stop(ids, stop, decode) == slow_cut(ids, stop), (ids, stop)
