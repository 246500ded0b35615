"""The rollout-engine contract: sampling parameters in, rollouts (token ids + per-token log-probs) out.

Engines know nothing of training. A caller renders its prompts (chat template already applied), says how many rollouts
each prompt gets (XRPO gives each prompt its own number, so `counts` is per prompt), and receives, per prompt, that many
`Rollout`s. Backends: `xrpo.rollout.hf_engine.HFEngine` (transformers `generate`, CPU or GPU; the one tests use) and
`xrpo.rollout.vllm_engine.VLLMEngine` (vLLM, GPU, imported lazily).

Conventions every backend follows, so that the trainer can treat them alike:
- `Rollout.logprobs[t]` is log pi_theta(y_t | x, y_<t) under the model's raw logits, i.e. at temperature 1 and without
  top-p truncation, whatever temperature / top-p the tokens were sampled with. That is what vLLM returns by default,
  what a fresh forward pass reproduces, and what the paper's length-normalised log-likelihood (Eq. 4) uses.
- The EOS token, when generated, is the last completion token (it is an action of the policy, with its log-prob);
  nothing after it is part of the completion. `text` never shows special tokens.
- A stop string ends the completion at the token that completes its first occurrence; `text` ends right after the
  stop string (it is included, like vLLM's `include_stop_str_in_output=True`), `finish_reason` is "stop".
- `finish_reason` is "length" when `max_new_tokens` tokens were generated without EOS or stop string.

Token-id prompts (`TokenPromptEngine.generate_ids`): a sampler that continues completions segment by segment (TreePO,
`xrpo.rollout.treepo`) passes prompt + tokens so far as token ids. Decoding them to text and re-encoding would not
give the same ids back (byte-level BPE merges across the boundary), so neither the completion nor its log-probs would
be the ones the policy produced; with ids, a continuation is exactly the concatenation of its segments. Both backends
implement it; an engine may reuse the computation of prompts it has seen (vLLM's prefix cache,
`HFEngine.reuse_prefixes`), never changing what is sampled.

Streaming (`StreamingEngine`, used by the streaming planner, `xrpo.rollout.streaming`): ``submit`` queues one request
of ``n`` completions while others decode, ``wait`` returns the requests that completed since the last call. What a
request draws depends on its prompt, ``n``, ``params`` and ``index`` only (the position the prompt would have in a
`generate` call with the same params), never on what else is in flight or on the order requests complete in; and
completion is counted in engine steps, not wall-clock time, so the same submits and waits on a deterministic engine
return the same groups at the same waits. vLLM implements it on its engine loop (`VLLMEngine`); `BatchStream` gives
any other engine the interface, generating everything submitted at the next ``wait`` (one batch, no overlap).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "FINISH_REASONS",
    "FinishReason",
    "SamplingParams",
    "Rollout",
    "BatchStream",
    "GeneratesFromIds",
    "RolloutEngine",
    "StreamingEngine",
    "TokenPromptEngine",
    "as_stream",
    "encode_prompts",
    "validate_generate_args",
    "validate_submit_args",
    "validate_generate_ids_args",
    "find_stop",
    "cut_at_stop",
    "finish_rollout",
    "resolve_eos_token_ids",
]

FinishReason = Literal["eos", "length", "stop"]
FINISH_REASONS: tuple[str, ...] = ("eos", "length", "stop")


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_temperature(value, name: str = "temperature", *, greedy: bool = True, why: str = "") -> None:
    """The sampling temperature: a finite number >= 0, 0 being greedy decoding; with ``greedy=False`` (a caller
    that samples, e.g. the trainer: greedy rollouts of a prompt would all be the same) > 0. ``why`` is appended to
    the error, which names ``name``. Every sampling temperature xrpo reads is checked here (`SamplingParams`, the
    trainer's ``rollout.temperature``, ``xrpo eval --temperature``)."""
    low = "> 0" if not greedy else ">= 0 (0: greedy decoding)"
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not (value > 0 or (greedy and value == 0))
        or value == float("inf")
    ):
        raise ValueError(f"{name} must be a finite number {low}{why}, got {value!r}")


def check_seed(value, name: str = "seed") -> None:
    """A run's base seed: an int in [0, 2**32), the range numpy's and torch's generators take (every seed a run
    derives from it, e.g. base seed + step, is reduced into that range by its user). Shared by `xrpo train`'s
    ``seed`` and ``xrpo eval --seed``."""
    if not _is_int(value) or not 0 <= value < 2**32:
        raise ValueError(f"{name} must be an int in [0, 2**32) (numpy's and torch's seeds), got {value!r}")


def check_top_p(value, name: str = "top_p") -> None:
    """Nucleus sampling's probability mass: a number in (0, 1] (1 disables it)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= 1:
        raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions; the same object drives every backend."""

    temperature: float = 1.0
    """Softmax temperature of the sampling distribution; 0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling: sample from the smallest set of tokens whose probability reaches top_p; 1 disables it."""
    max_new_tokens: int = 256
    """Most tokens generated per completion (EOS included)."""
    stop: tuple[str, ...] = ()
    """Stop strings: the completion ends at the first occurrence of any of them (included in the text)."""
    seed: int | None = None
    """Seed for one `generate` call: the same seed, prompts, counts and model give the same rollouts. None draws from
    the backend's running random state. A trainer should pass a different seed every step (e.g. base seed + step)."""

    def __post_init__(self) -> None:
        check_temperature(self.temperature, "SamplingParams.temperature")
        check_top_p(self.top_p, "SamplingParams.top_p")
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens: expected an int >= 1, got {self.max_new_tokens!r}")
        if isinstance(self.stop, str):
            raise ValueError(
                f"SamplingParams.stop: expected a sequence of strings, got the single string {self.stop!r} "
                f"(write stop=({self.stop!r},))"
            )
        try:
            stop = tuple(self.stop)
        except TypeError:
            raise ValueError(f"SamplingParams.stop: expected a sequence of strings, got {self.stop!r}") from None
        for i, s in enumerate(stop):
            if not isinstance(s, str) or not s:
                raise ValueError(f"SamplingParams.stop[{i}]: expected a non-empty string, got {s!r}")
        object.__setattr__(self, "stop", stop)
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise ValueError(f"SamplingParams.seed: expected None or an int >= 0, got {self.seed!r}")
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Rollout:
    """One sampled completion of one prompt."""

    prompt_ids: list[int]
    """Token ids of the prompt as the engine tokenised it (no padding)."""
    completion_ids: list[int]
    """Generated token ids, EOS included when generated; never padding."""
    logprobs: list[float]
    """logprobs[t] = log pi_theta(completion_ids[t] | prompt, completion_ids[:t]) at temperature 1 (raw logits)."""
    finish_reason: FinishReason
    """"eos" (EOS generated), "length" (max_new_tokens reached) or "stop" (a stop string was generated)."""
    text: str
    """The completion decoded without special tokens, ending right after the stop string when finish_reason is
    "stop"."""
    metadata: dict = field(default_factory=dict, compare=False)
    """Free-form extras a caller may attach (e.g. the planner's round number); engines leave it empty."""

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.completion_ids):
            raise ValueError(
                f"Rollout.logprobs: expected one log-prob per completion token ({len(self.completion_ids)}), "
                f"got {len(self.logprobs)}"
            )
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"Rollout.finish_reason: expected one of {FINISH_REASONS}, got {self.finish_reason!r}")

    @property
    def num_tokens(self) -> int:
        return len(self.completion_ids)


@runtime_checkable
class RolloutEngine(Protocol):
    """What the planner and the trainer call. See the module docstring for the conventions.

    Progress (optional): an engine with a ``progress`` attribute calls it, when it is set, with (rows done, rows in
    the call) as a `generate` call's rows finish (a row is one completion); a long validation shows its progress
    through it (`xrpo.rollout.validate.sample_and_score`). It never changes what is sampled."""

    def generate(self, prompts: list[str], counts: list[int], params: SamplingParams) -> list[list[Rollout]]:
        """Sample `counts[i]` completions of `prompts[i]` for every i; returns one list per prompt, in order."""
        ...

    def sync_weights(self, model) -> None:
        """Make the engine sample from `model`'s current weights (call after every optimiser step)."""
        ...


@runtime_checkable
class TokenPromptEngine(RolloutEngine, Protocol):
    """A `RolloutEngine` that also takes prompts as token ids (needed by the tree sampler)."""

    def generate_ids(
        self, prompt_ids: list[list[int]], counts: list[int], params: SamplingParams
    ) -> list[list[Rollout]]:
        """As `generate`, with each prompt given as its token ids (used as they are: no special tokens added).
        `Rollout.prompt_ids` is the given list."""
        ...


@runtime_checkable
class StreamingEngine(RolloutEngine, Protocol):
    """A `RolloutEngine` that admits requests while others decode (see the module docstring, "Streaming")."""

    def submit(self, key: Hashable, prompt: str, n: int, params: SamplingParams, *, index: int = 0) -> None:
        """Queue ``n`` completions of ``prompt`` under ``key`` (unique among the requests in flight). They are the
        completions `generate` would draw for ``prompts[index]`` with the same ``params`` (with a seed, the same
        per-request seed), whatever else is in flight."""
        ...

    def wait(self) -> list[tuple[Hashable, list[Rollout]]]:
        """Run the engine until at least one request in flight has all its completions; return every request that
        completed since the last call as ``(key, rollouts)``, in the order they were submitted. ``[]`` when nothing
        is in flight."""
        ...


class BatchStream:
    """The streaming interface over an engine that cannot stream: everything submitted is generated at the next
    `wait`, one `generate` call per distinct `SamplingParams` (prompts at their ``index``, count 0 elsewhere, in
    order of first submission), so every request completes at once. Two requests of the same params and index go
    to separate calls, in submission order."""

    def __init__(self, engine: RolloutEngine):
        self.engine = engine
        self._pending: list[tuple[Hashable, str, int, SamplingParams, int]] = []

    def submit(self, key: Hashable, prompt: str, n: int, params: SamplingParams, *, index: int = 0) -> None:
        validate_submit_args(key, n, index, [k for k, *_ in self._pending])
        self._pending.append((key, prompt, int(n), params, int(index)))

    def wait(self) -> list[tuple[Hashable, list[Rollout]]]:
        pending, self._pending = self._pending, []
        got: dict[int, list[Rollout]] = {}
        calls: list[tuple[SamplingParams, dict[int, int]]] = []  # (params, index -> position in pending)
        for pos, (_, _, _, params, index) in enumerate(pending):
            call = next((c for c in calls if c[0] == params and index not in c[1]), None)
            if call is None:
                call = (params, {})
                calls.append(call)
            call[1][index] = pos
        for params, slots in calls:
            size = max(slots) + 1
            prompts, counts = [""] * size, [0] * size
            for index, pos in slots.items():
                prompts[index], counts[index] = pending[pos][1], pending[pos][2]
            outs = self.engine.generate(prompts, counts, params)
            for index, pos in slots.items():
                got[pos] = outs[index]
        return [(pending[pos][0], got[pos]) for pos in range(len(pending))]

    def sync_weights(self, model) -> None:
        self.engine.sync_weights(model)


class GeneratesFromIds:
    """`generate` and `generate_ids` of an engine that generates from token ids (`TokenPromptEngine`): both check
    their arguments and call the engine's ``_generate(prompt_ids, counts, params, what)``, ``what`` ("prompts" or
    "prompt_ids") naming the argument in its errors. The engine has a ``tokenizer`` and may set
    ``add_special_tokens`` (how prompts are encoded) and ``vocab_size`` (None: prompt ids are not checked against
    it)."""

    add_special_tokens: bool = False
    vocab_size: int | None = None

    def generate(self, prompts: list[str], counts: list[int], params: SamplingParams) -> list[list[Rollout]]:
        """Sample `counts[i]` completions of `prompts[i]`; see `xrpo.rollout.engine` for the conventions."""
        prompts, counts = validate_generate_args(prompts, counts, params)
        prompt_ids = encode_prompts(self.tokenizer, prompts, counts, add_special_tokens=self.add_special_tokens)
        return self._generate(prompt_ids, counts, params, "prompts")

    def generate_ids(
        self, prompt_ids: list[list[int]], counts: list[int], params: SamplingParams
    ) -> list[list[Rollout]]:
        """As `generate`, with token-id prompts (see `TokenPromptEngine`)."""
        prompt_ids, counts = validate_generate_ids_args(prompt_ids, counts, params, self.vocab_size)
        return self._generate(prompt_ids, counts, params, "prompt_ids")


def validate_submit_args(key: Hashable, n, index, in_flight) -> None:
    """Check `StreamingEngine.submit`'s ``n`` (an int >= 1), ``index`` (an int >= 0) and ``key`` (not among the keys
    ``in_flight``); raises ValueError naming the bad argument."""
    if not _is_int(n) or n < 1:
        raise ValueError(f"n: expected an int >= 1, got {n!r}")
    if not _is_int(index) or index < 0:
        raise ValueError(f"index: expected an int >= 0, got {index!r}")
    if any(k == key for k in in_flight):
        raise ValueError(f"key {key!r} is already in flight")


def as_stream(engine: RolloutEngine):
    """``engine`` itself where it streams (`StreamingEngine`), else a `BatchStream` over it."""
    return engine if isinstance(engine, StreamingEngine) else BatchStream(engine)


def validate_generate_ids_args(
    prompt_ids, counts, params, vocab_size: int | None = None
) -> tuple[list[list[int]], list[int]]:
    """Check `generate_ids`'s arguments (with ``vocab_size``: every token id of a prompt that gets rollouts lies in
    the model's vocabulary); returns them as plain lists. Raises ValueError naming the bad argument."""
    if isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, Sequence):
        raise ValueError(f"prompt_ids: expected a list of token-id lists, got {type(prompt_ids).__name__}")
    out = []
    for i, ids in enumerate(prompt_ids):
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            raise ValueError(f"prompt_ids[{i}]: expected a list of token ids, got {type(ids).__name__}")
        if len(ids) == 0:
            raise ValueError(f"prompt_ids[{i}]: expected a non-empty prompt, got no tokens")
        for t, tok in enumerate(ids):
            if not _is_int(tok) or tok < 0:
                raise ValueError(f"prompt_ids[{i}][{t}]: expected a token id (int >= 0), got {tok!r}")
        out.append([int(t) for t in ids])
    _, counts = validate_generate_args([""] * len(out), counts, params)
    for i, ids in enumerate(out):
        if vocab_size is not None and counts[i] > 0 and max(ids) >= vocab_size:
            raise ValueError(f"prompt_ids[{i}]: token id {max(ids)} is outside the model's vocabulary of {vocab_size}")
    return out, counts


def encode_prompts(tokenizer, prompts: list[str], counts: list[int], *, add_special_tokens: bool) -> list[list[int]]:
    """Token ids of each prompt that gets rollouts (count > 0; the others: []), in one tokenizer call, for an engine
    that generates from ids. Raises ValueError naming a prompt that encodes to no tokens."""
    needed = [i for i, c in enumerate(counts) if c > 0]
    prompt_ids: list[list[int]] = [[] for _ in prompts]
    if needed:
        encoded = tokenizer([prompts[i] for i in needed], add_special_tokens=add_special_tokens)["input_ids"]
        for i, ids in zip(needed, encoded):
            if len(ids) == 0:
                raise ValueError(f"prompts[{i}]: encodes to no tokens; expected a non-empty prompt")
            prompt_ids[i] = list(ids)
    return prompt_ids


def validate_generate_args(prompts, counts, params) -> tuple[list[str], list[int]]:
    """Check `generate`'s arguments; returns them as plain lists. Raises ValueError naming the bad argument."""
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise ValueError(f"prompts: expected a list of strings, got {type(prompts).__name__}")
    if isinstance(counts, str) or not isinstance(counts, Sequence):
        raise ValueError(f"counts: expected a list of ints, got {type(counts).__name__}")
    prompts, counts = list(prompts), list(counts)
    if len(prompts) != len(counts):
        raise ValueError(f"counts: expected one count per prompt ({len(prompts)}), got {len(counts)}")
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise ValueError(f"prompts[{i}]: expected a rendered prompt string, got {type(p).__name__}")
    for i, c in enumerate(counts):
        if not _is_int(c) or c < 0:
            raise ValueError(f"counts[{i}]: expected an int >= 0, got {c!r}")
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params: expected xrpo.rollout.engine.SamplingParams, got {type(params).__name__}")
    return prompts, [int(c) for c in counts]


def resolve_eos_token_ids(given: Sequence[int] | None, sources: Sequence, owner: str) -> list[int]:
    """The token ids that end a completion, as every engine takes them: ``given`` when it is not None, else every id
    that ``sources`` name (each an int, a list of ints or None: the tokenizer's ``eos_token_id``, the model's
    generation config's), in order, without repeats. Raises ValueError when there is none; ``owner`` says who was
    asked (e.g. "neither the tokenizer nor the model")."""
    if given is None:
        ids: list[int] = []
        for source in sources:
            for i in source if isinstance(source, (list, tuple)) else [source]:
                if i is not None and int(i) not in ids:
                    ids.append(int(i))
        if not ids:
            raise ValueError(f"eos_token_ids: {owner} sets an EOS token; pass eos_token_ids")
        return ids
    ids = [int(i) for i in given]
    if not ids:
        raise ValueError("eos_token_ids: expected at least one token id")
    return ids


def finish_rollout(
    prompt_ids: Sequence[int],
    ids: Sequence[int],
    logprobs: Sequence[float],
    reason: FinishReason,
    params: SamplingParams,
    decode: Callable[[Sequence[int]], str],
) -> Rollout:
    """The `Rollout` of a completion that ended for ``reason`` ("eos" or "length", as the engine saw it), cut at its
    first stop string (finish_reason "stop"). A completion that ended early with neither EOS nor a stop string in its
    decoding is "stop" too: the engine stopped it at a stop string its full decoding no longer shows."""
    text = None
    cut = cut_at_stop(ids, params.stop, decode) if params.stop else None
    if cut is not None:
        k, text = cut
        ids, logprobs, reason = ids[:k], logprobs[:k], "stop"
    elif reason == "length" and len(ids) < params.max_new_tokens:
        reason = "stop"
    if text is None:
        text = decode(ids)
    return Rollout(
        prompt_ids=list(prompt_ids), completion_ids=list(ids), logprobs=list(logprobs), finish_reason=reason, text=text
    )


def find_stop(text: str, stop: Sequence[str]) -> int | None:
    """End offset (exclusive) of the earliest-ending occurrence of any stop string in `text`, or None."""
    ends = [i + len(s) for s in stop if (i := text.find(s)) >= 0]
    return min(ends) if ends else None


def cut_at_stop(token_ids: Sequence[int], stop: Sequence[str], decode: Callable[[Sequence[int]], str]):
    """Cut a completion at its first stop string.

    Args:
        token_ids: the completion's token ids.
        stop: stop strings.
        decode: ids -> text (without special tokens), e.g. `lambda ids: tok.decode(ids, skip_special_tokens=True)`.

    Returns:
        None when no stop string occurs; else `(k, text)`: keep the first `k` tokens (the `k`-th is the one that
        completes the stop string) and `text`, their decoding cut right after the stop string.
    """
    if not stop or not token_ids:
        return None
    if find_stop(decode(token_ids), stop) is None:
        return None
    # The shortest prefix whose decoding contains a stop string: "contains a stop string" only turns on as the prefix
    # grows (the decoding of a prefix is a prefix of the decoding), so binary search.
    lo, hi = 1, len(token_ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if find_stop(decode(token_ids[:mid]), stop) is not None:
            hi = mid
        else:
            lo = mid + 1
    text = decode(token_ids[:lo])
    end = find_stop(text, stop)
    if end is None:  # decoding was not prefix-monotone (cannot happen for byte-level BPE); keep everything
        return len(token_ids), decode(token_ids)[: find_stop(decode(token_ids), stop)]
    return lo, text[:end]
