"""Rollouts with transformers' continuous batching (`model.init_continuous_batching()`): a `StreamingEngine` without
vLLM, on one GPU or on a CPU.

transformers brings the paged KV cache and the scheduler that admits requests into the running batch between decoding
steps (`ContinuousBatchingManager`). The engine adds what the rollout contract (`xrpo.rollout.engine`) needs:

- **Engine steps in the caller's thread.** The manager normally decodes in a background thread; the engine instead
  runs its batch processor one step (one forward pass) at a time itself, as `VLLMEngine` steps vLLM's engine loop. So
  `wait` counts completion in engine steps, not wall-clock time (the same submits and waits give the same groups), the
  caller's autocast applies, and nothing decodes while the trainer trains.
- **A key per rollout.** transformers samples a step's rows with one `torch.multinomial` over the batch and returns
  the log-probs of the processed (temperature, top-p) distribution. The engine puts its own logits processor in the
  manager's place (`_KeyedSampler`): each row is drawn with its rollout's key (`xrpo.rollout.keyed_sampling`; the key
  of rollout j of the prompt at position i of a call seeded s), so a rollout's tokens depend on its prompt, the
  model, s, i and j only, whatever else decodes beside it; the processor records the raw (temperature-1) log-prob of
  the drawn token and hands transformers scores whose argmax is that token (greedy decoding, as configured).
- **Stop strings** (transformers' continuous batching has none): checked on each request's tokens after every step;
  a request that has generated one is cancelled and cut as `xrpo.rollout.engine.cut_at_stop` says. EOS and
  `max_new_tokens` are transformers' own per-request limits.
- **A shared model.** The engine samples with the model it is given (normally the training model: weights are always
  current, `sync_weights` with it is a no-op). The manager switches the model to a paged attention implementation and
  eval mode; the engine does so only while it steps, and restores both after.
- **The cache is allocated once**, at construction, for `max_batch_size` sequences of `max_seq_len` tokens (the
  scheduler keeps ~20% of it free for running requests, hence the 1.25 factor); it lives as long as the engine, across
  weight updates. Prefix sharing between requests is off: its cached blocks would outlive a weight update.
- **Mixed precision**: with ``autocast_dtype`` the engine steps under `torch.autocast` and keeps the KV cache in that
  dtype (transformers allocates it in the model's dtype and writes states of one dtype only; `_cache_in`).
- **Attention**: a model on sdpa (transformers' default) attends through `xrpo.rollout.paged_attention` (each
  request to its own keys), not transformers' `paged|sdpa`, whose cost and mask grow with the batch times the
  batch's cached tokens; a model loaded with flash attention keeps transformers' paged flash path, one on eager
  transformers' `paged|eager`. ``attention`` names the one in use.

Versions: written against transformers 5.10.4 and 5.17.0, whose batch processors differ in how logits reach the
processor (5.10: one row per query token; 5.17: one row per request of the step, those that draw a token first);
`_logits_per_token` tells which, and the processor refuses a shape it does not expect. CUDA graphs, torch.compile
and asynchronous batching are off (the processor reads Python state of the step it is called in).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import queue
from collections.abc import Hashable, Iterator, Sequence

import torch

from xrpo.rollout import paged_attention
from xrpo.rollout.engine import (
    GeneratesFromIds,
    Rollout,
    SamplingParams,
    encode_prompts,
    find_stop,
    finish_rollout,
    resolve_eos_token_ids,
    validate_generate_args,
    validate_submit_args,
)
from xrpo.rollout.keyed_sampling import keyed_sample, request_key

__all__ = ["HFCBEngine"]

_USE_HF = "use rollout.engine=hf (transformers generate) instead"
_FREE_SHARE = 0.8  # transformers' schedulers stop admitting requests when fewer than 15-20% of the blocks are free


def _cb_classes():
    """transformers' continuous-batching pieces the engine uses, or a ValueError naming the engine to use instead."""
    import transformers

    try:
        from transformers import GenerationConfig, LogitsProcessorList
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
        from transformers.generation.continuous_batching.cb_logits_processors import (
            ContinuousBatchingLogitsProcessorList,
        )
    except ImportError as e:
        raise ValueError(
            f"rollout.engine=hf-cb needs transformers' continuous batching (ContinuousBatchingConfig and its logits "
            f"processors, checked on transformers 5.10.4 and 5.17.0); transformers {transformers.__version__} has "
            f"not ({e}): {_USE_HF}"
        ) from e
    return GenerationConfig, LogitsProcessorList, ContinuousBatchingConfig, ContinuousBatchingLogitsProcessorList


@dataclasses.dataclass
class _Row:
    """One completion in flight: transformers' request ``rid``, and what it has drawn so far."""

    rid: str
    group: _Group
    key: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    rollout: Rollout | None = None


@dataclasses.dataclass
class _Group:
    """The completions of one prompt: one `submit`, or one prompt of a `generate` call."""

    key: Hashable
    prompt_ids: list[int]
    params: SamplingParams
    rows: list[_Row] = dataclasses.field(default_factory=list)

    @property
    def complete(self) -> bool:
        return all(r.rollout is not None for r in self.rows)


def _logits_per_token() -> bool:
    """Whether transformers hands the logits processor one row per query token of the step (5.10; the model runner
    picks each request's row after sampling, so its `_sample` takes the `logits_indices`) rather than one row per
    request of the step, the requests that draw a token first, in batch order (5.17: sliced before processing)."""
    import inspect

    from transformers.generation.continuous_batching.model_runner import ModelRunner

    return "logits_indices" in inspect.signature(ModelRunner._sample).parameters


def _sampler_class(base):
    """`_KeyedSampler` over transformers' `ContinuousBatchingLogitsProcessorList` (imported lazily)."""

    class _KeyedSampler(base):
        """The manager's logits processor, replaced: draws each row with its rollout's key (module docstring).

        ``prepare_tensor_args`` (called as a step's batch is laid out) records, in batch order, the requests that draw a
        token this step and where their rows are; ``__call__`` (inside the step's forward) draws them, stores the
        tokens and raw log-probs for the engine, and returns scores whose argmax is the drawn token."""

        def __init__(self, LogitsProcessorList, lookup, per_token: bool):
            super().__init__(LogitsProcessorList())
            self.do_processing = True  # transformers calls a list only when it holds a processor
            self.lookup = lookup  # request id -> (key, position, temperature, top_p)
            self.per_token = per_token  # `_logits_per_token`
            self.drawn: list[str] = []  # the requests drawing this step, in batch order
            self._rows: list[int] = []  # their rows in the logits
            self._expected_rows = 0
            self.result: tuple[torch.Tensor, torch.Tensor] | None = None

        def fill_defaults(self, int32_tensor) -> None:
            pass  # no argument rows in transformers' storage: the step's arguments are built here

        def check_kwargs(self, kwargs) -> None:
            if kwargs:
                raise ValueError(f"per-request logits-processor arguments are not used here, got {sorted(kwargs)}")

        def prepare_tensor_args(self, requests_in_batch, arg_storage):
            self.drawn, self._rows, offset = [], [], 0
            for future in requests_in_batch:
                offset += future.query_length
                if future.has_new_token:
                    self.drawn.append(future.state.request_id)
                    self._rows.append(offset - 1 if self.per_token else len(self._rows))
            self._expected_rows = offset if self.per_token else len(requests_in_batch)
            self.result = None
            return arg_storage

        def __call__(self, input_ids, scores, logits_processor_args):
            if scores.shape[0] != self._expected_rows:
                raise RuntimeError(
                    f"transformers passed {scores.shape[0]} logit rows where the engine expected "
                    f"{self._expected_rows}: this version's continuous batching is not one the engine knows; {_USE_HF}"
                )
            if not self.drawn:
                return scores
            params = [self.lookup(rid) for rid in self.drawn]
            device = scores.device
            at = torch.tensor(self._rows, dtype=torch.int64, device=device)
            tokens, logprobs = keyed_sample(
                scores.index_select(0, at),
                torch.tensor([p[0] for p in params], dtype=torch.int64, device=device),
                torch.tensor([p[1] for p in params], dtype=torch.int64, device=device),
                torch.tensor([p[2] for p in params], dtype=torch.float32, device=device),
                torch.tensor([p[3] for p in params], dtype=torch.float32, device=device),
            )
            self.result = (tokens, logprobs)
            # transformers takes the argmax of what is returned (greedy): make it the drawn token
            scores.index_fill_(0, at, float("-inf"))
            scores[at, tokens] = 0.0
            return scores

    return _KeyedSampler


class HFCBEngine(GeneratesFromIds):
    """A `StreamingEngine` (and `TokenPromptEngine`) over transformers' continuous batching; see the module docstring.

    Args:
        model: a transformers causal LM whose transformers has continuous batching (a peft LoRA model samples with
            its adapters, unmerged).
        tokenizer: its tokenizer; prompts are tokenised with ``add_special_tokens`` (default False, as `HFEngine`).
        max_batch_size: sequences the KV cache holds at full length: the most that decode at once.
        max_seq_len: the longest prompt + completion (tokens) a request may need, at most the model's context (a
            larger value is lowered to it); the cache is sized for ``max_batch_size`` of them. A request beyond it is
            refused, naming it.
        block_size: tokens per KV-cache block.
        eos_token_ids: token ids that end a completion (None: the tokenizer's EOS plus the model's
            ``generation_config.eos_token_id``, as `HFEngine`).
        add_special_tokens: passed to the tokenizer when encoding prompts.
        autocast_dtype: None, or the dtype the engine computes in under `torch.autocast` (mixed precision), as
            `HFEngine` takes it.

    Attributes: ``attention`` (the paged attention implementation in use, e.g. "paged|xrpo_sdpa"),
    ``steps`` (engine steps so far: one forward pass each), ``token_counts`` ("prefill": prompt tokens submitted,
    "decode": generated tokens fed back).
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_batch_size: int = 64,
        max_seq_len: int = 512,
        block_size: int = 32,
        eos_token_ids: Sequence[int] | None = None,
        add_special_tokens: bool = False,
        autocast_dtype: torch.dtype | None = None,
    ):
        for name, value in (("max_batch_size", max_batch_size), ("max_seq_len", max_seq_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 4:
            raise ValueError(f"block_size: expected an int >= 4, got {block_size!r}")
        GenerationConfig, LogitsProcessorList, ContinuousBatchingConfig, ListBase = _cb_classes()
        # a peft model wraps the transformers model, whose LoRA layers then run inside its forward
        lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        if not hasattr(lm, "init_continuous_batching"):
            raise ValueError(
                f"model: {type(lm).__name__} has no continuous batching (init_continuous_batching): {_USE_HF}"
            )
        self.model, self.lm, self.tokenizer = model, lm, tokenizer
        self.autocast_dtype = autocast_dtype
        self.add_special_tokens = bool(add_special_tokens)
        self.device = next(lm.parameters()).device
        self.eos_token_ids = resolve_eos_token_ids(
            eos_token_ids,
            (getattr(tokenizer, "eos_token_id", None), getattr(lm.generation_config, "eos_token_id", None)),
            "neither the tokenizer nor the model",
        )
        self.vocab_size = getattr(lm.config.get_text_config(), "vocab_size", None)
        max_positions = getattr(lm.config.get_text_config(), "max_position_embeddings", None)
        if max_positions is not None:
            max_seq_len = min(max_seq_len, int(max_positions))  # no request can be longer than the model's context

        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        self._rows: dict[str, _Row] = {}  # transformers request id -> row, while in flight
        self._groups: list[_Group] = []  # in flight, in submission order
        self._serial = 0
        self.steps = 0  # engine steps (forward passes) so far
        self.token_counts = {"prefill": 0, "decode": 0}

        blocks = math.ceil(max_batch_size * math.ceil(max_seq_len / block_size) / _FREE_SHARE) + 1
        cb_fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
        extra = {"max_requests_per_batch": max_batch_size} if "max_requests_per_batch" in cb_fields else {}
        cb_config = ContinuousBatchingConfig(
            block_size=block_size,
            num_blocks=blocks,
            # a step holds every decoding row and the prefill of ~15 admitted prompts of ~max_batch_size tokens (a
            # step whose prefill does not fit is split over several); on eager, transformers' attention mask is this
            # many rows by the cache's tokens
            max_batch_tokens=min(max(16 * max_batch_size, 256), 8192),
            allow_block_sharing=False,
            use_cuda_graph=False,
            use_async_batching=False,
            return_logprobs=False,
            scheduler_type="fifo",
            **extra,
        )
        gen_config = GenerationConfig(
            do_sample=False, eos_token_id=list(self.eos_token_ids), max_new_tokens=max_seq_len, bos_token_id=None
        )
        impl, training = lm.config._attn_implementation, lm.training
        self._attn_impl = impl
        try:
            if impl == "sdpa":  # transformers' paged sdpa would mask the whole batch: `xrpo.rollout.paged_attention`
                paged_attention.register()
                lm.set_attn_implementation(paged_attention.ATTENTION)
            self._manager = lm.init_continuous_batching(
                generation_config=gen_config, continuous_batching_config=cb_config
            )
            self.attention = lm.config._attn_implementation
            if not self.attention.startswith("paged|"):
                raise ValueError(f"its attention stays {self.attention!r}: it cannot switch to a paged one")
            self._sampler = _sampler_class(ListBase)(LogitsProcessorList, self._lookup, _logits_per_token())
            self._manager.logit_processor = self._sampler
            with self._running():
                self._manager.warmup()  # creates the batch processor and its cache (no CUDA graph to capture)
        except Exception as e:  # noqa: BLE001 - whatever transformers raises for a model it cannot batch
            raise ValueError(
                f"model: transformers' continuous batching cannot serve {type(lm).__name__} "
                f"({type(e).__name__}: {e}): {_USE_HF}"
            ) from e
        finally:
            if lm.config._attn_implementation != impl:
                lm.set_attn_implementation(impl)
            lm.train(training)
        self._processor = self._manager.batch_processor
        self._check_serves()  # in the parameters' dtype, before the cache takes the autocast dtype
        if autocast_dtype is not None:
            self._cache_in(autocast_dtype)

    # ------------------------------------------------------------------------------------------------------------
    # generate / generate_ids: `GeneratesFromIds`, which calls `_generate`
    def _generate(self, prompt_ids: list[list[int]], counts: list[int], params: SamplingParams, what: str):
        if self._groups:
            raise RuntimeError(f"{len(self._groups)} streamed requests are in flight; wait() for them first")
        needed = [i for i, c in enumerate(counts) if c > 0]
        for i in needed:
            self._check_length(prompt_ids[i], params, f"{what}[{i}]")
        base = self._base_seed(params)
        groups = {i: self._add(i, prompt_ids[i], counts[i], params, i, base) for i in needed}
        try:
            with self._running():
                while self._groups:
                    self._step()
                    self._groups = [g for g in self._groups if not g.complete]
        except BaseException:
            self._abort()
            raise
        return [[r.rollout for r in groups[i].rows] if i in groups else [] for i in range(len(prompt_ids))]

    # ------------------------------------------------------------------------------------------------------------
    def submit(self, key: Hashable, prompt: str, n: int, params: SamplingParams, *, index: int = 0) -> None:
        """Queue ``n`` completions of ``prompt`` while others decode (`xrpo.rollout.engine.StreamingEngine`): the
        completions `generate` would draw for ``prompts[index]`` with the same ``params``."""
        prompts, counts = validate_generate_args([prompt], [n], params)
        validate_submit_args(key, counts[0], index, [g.key for g in self._groups])
        ids = encode_prompts(self.tokenizer, prompts, counts, add_special_tokens=self.add_special_tokens)[0]
        self._check_length(ids, params, "prompt")
        self._add(key, ids, counts[0], params, index, self._base_seed(params))

    def wait(self) -> list[tuple[Hashable, list[Rollout]]]:
        """Step the engine until a submitted request has all its completions; every request completed since the last
        call, as ``(key, rollouts)`` in submission order (`xrpo.rollout.engine.StreamingEngine`)."""
        if not self._groups:
            return []
        try:
            with self._running():
                while not any(g.complete for g in self._groups):
                    self._step()
        except BaseException:
            self._abort()
            raise
        done = [g for g in self._groups if g.complete]
        self._groups = [g for g in self._groups if not g.complete]
        return [(g.key, [r.rollout for r in g.rows]) for g in done]

    def sync_weights(self, model) -> None:
        """No-op when ``model`` is the engine's own model (the usual case: it samples with the training model, whose
        weights are always current). Another model of the same architecture (a separate inference copy) has its
        weights copied in, a LoRA model's merged (`xrpo.models.lora.inference_state_dict`). The KV cache and the
        manager stay as they are: no cached state outlives a call."""
        if model is self.model:
            return
        from xrpo.models.lora import inference_state_dict

        try:
            self.lm.load_state_dict(inference_state_dict(model))
        except (RuntimeError, AttributeError) as e:
            raise ValueError(f"model: cannot copy its weights into the engine's model: {e}") from e

    # ------------------------------------------------------------------------------------------------------------
    def _base_seed(self, params: SamplingParams) -> int:
        """The call's seed: ``params.seed``, or (None) one drawn from torch's global generator, as `HFEngine`'s
        unseeded calls draw from it."""
        if params.seed is not None:
            return int(params.seed)
        return int(torch.randint(0, 2**62, (1,)).item())

    def _check_length(self, ids: list[int], params: SamplingParams, what: str) -> None:
        if len(ids) + params.max_new_tokens > self.max_seq_len:
            raise ValueError(
                f"{what}: {len(ids)} prompt tokens + max_new_tokens={params.max_new_tokens} exceed the engine's "
                f"max_seq_len of {self.max_seq_len} (the KV cache is sized by it; rollout.engine=hf-cb sets it to "
                f"data.max_prompt_tokens + rollout.max_new_tokens)"
            )

    def _add(self, key, ids: list[int], n: int, params: SamplingParams, index: int, base: int) -> _Group:
        group = _Group(key=key, prompt_ids=list(ids), params=params)
        for j in range(n):
            rid = f"xrpo-{self._serial}"
            self._serial += 1
            row = _Row(rid=rid, group=group, key=request_key(base, index, j))
            group.rows.append(row)
            self._rows[rid] = row
            self._manager.add_request(
                list(ids), request_id=rid, max_new_tokens=params.max_new_tokens, eos_token_id=list(self.eos_token_ids)
            )
            self.token_counts["prefill"] += len(ids)
        self._groups.append(group)
        return group

    def _lookup(self, rid: str) -> tuple[int, int, float, float]:
        row = self._rows[rid]
        return row.key, len(row.tokens), row.group.params.temperature, row.group.params.top_p

    def _step(self) -> None:
        """One engine step: schedule, forward, draw; then the tokens drawn go to their rows, and rows that ended (EOS,
        length: transformers' verdict; a stop string: ours) become rollouts."""
        processor = self._processor
        if not processor.prepare_next_batch():
            if not processor.has_pending_requests():
                raise RuntimeError(f"transformers has no request to run, but {len(self._rows)} are in flight")
            return  # the step evicted a request to make room (transformers 5.10); it is scheduled again later
        paged_attention.begin_step()
        self._manager._generation_step()
        processor.update_batch()
        self.steps += 1
        if self._sampler.result is None:
            drawn = []
        else:
            tokens, logprobs = self._sampler.result
            drawn = zip(self._sampler.drawn, tokens.tolist(), logprobs.tolist())
        active = []
        for rid, token, logprob in drawn:
            row = self._rows.get(rid)
            if row is None or row.rollout is not None:
                continue
            row.tokens.append(token)
            row.logprobs.append(logprob)
            if len(row.tokens) > 1:
                self.token_counts["decode"] += 1
            active.append(row)
        finished = set()
        for out in self._drain():
            row = self._rows.pop(out.request_id, None)
            if row is None:
                continue
            if getattr(out, "error", None):
                raise RuntimeError(f"transformers failed request {out.request_id}: {out.error}")
            got = list(out.generated_tokens)
            if row.tokens[: len(got)] != got:
                raise RuntimeError(
                    f"request {out.request_id}: transformers kept tokens {got[:8]}... but the engine drew "
                    f"{row.tokens[:8]}... (engine bug)"
                )
            row.tokens, row.logprobs = row.tokens[: len(got)], row.logprobs[: len(got)]
            row.rollout = self._rollout(row)
            finished.add(out.request_id)
        for row in active:
            stop = row.group.params.stop
            if row.rid in finished or not stop or row.rollout is not None:
                continue
            window = max(len(s.encode("utf-8")) for s in stop) + 1
            if find_stop(self._decode(row.tokens[-window:]), stop) is not None:
                self._manager.cancel_request(row.rid)
                self._rows.pop(row.rid, None)
                row.rollout = self._rollout(row)

    def _drain(self) -> list:
        out = []
        q = self._manager.output_router.output_queue
        while True:
            try:
                out.append(q.get_nowait())
            except queue.Empty:
                return out

    def _rollout(self, row: _Row) -> Rollout:
        ids = row.tokens
        reason = "eos" if ids and ids[-1] in self.eos_token_ids else "length"
        return finish_rollout(row.group.prompt_ids, ids, row.logprobs, reason, row.group.params, self._decode)

    def _abort(self) -> None:
        """Cancel everything in flight (a call raised): the engine is usable again."""
        for rid in list(self._rows):
            self._manager.cancel_request(rid)
        self._rows.clear()
        self._groups = []
        with contextlib.suppress(Exception), self._running():
            self._processor.prepare_next_batch()  # applies the cancellations
        self._drain()

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        """While the engine steps: paged attention, eval mode, no gradients, the autocast dtype."""
        lm = self.lm
        training = lm.training
        lm.eval()
        lm.set_attn_implementation(self.attention)
        autocast = (
            torch.autocast(self.device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype is not None
            else contextlib.nullcontext()
        )
        try:
            with torch.no_grad(), autocast:
                yield
        finally:
            lm.set_attn_implementation(self._attn_impl)
            lm.train(training)

    def _cache_in(self, dtype: torch.dtype) -> None:
        """Keep the KV cache in ``dtype`` and cast what attention writes into it: under autocast the value states
        arrive in ``dtype`` but the key states in float32 (the rotary embedding computes in float32), and transformers'
        cache takes one dtype. Attention under autocast reads both back as ``dtype`` anyway, so the numbers are those
        of `HFEngine`'s cache, which holds them as they come."""
        cache = self._processor.cache
        for caches in (cache.key_cache, cache.value_cache):
            for i, t in enumerate(caches):
                caches[i] = torch.zeros(t.shape, dtype=dtype, device=t.device)
        cache.dtype = dtype
        update = cache.update

        def update_in_dtype(key_states, value_states, *args, **kwargs):
            return update(key_states.to(dtype), value_states.to(dtype), *args, **kwargs)

        cache.update = update_in_dtype

    def _check_serves(self) -> None:
        """Refuse a model that transformers' continuous batching runs but computes differently: two sampled probe
        requests (12 and 5 prompt tokens, 16 new ones, in one batch) whose log-probs must equal a plain forward pass
        of the same tokens, in eval mode, in the parameters' dtype and without autocast. A model that transformers'
        continuous batching runs differently (one that takes positions from its input's length; under transformers
        5.10, a sliding window: Mistral's was measured 0.04-0.08 off on random models, not under 5.17) fails here,
        named, rather than train on wrong log-probs. Bounds: 1e-3 for float32 parameters (the
        tiny models' envelope is 1e-5, CONTRIBUTING "Tolerances"; room for larger models' longer sums), 0.25 for
        16-bit ones (their unit roundoff 2**-8 on logits of size up to ~30): a guard against broken attention, not
        a proof of parity."""
        vocab = self.vocab_size or len(self.tokenizer)
        eos = set(self.eos_token_ids)
        probe = [k for k in range(3, vocab) if k not in eos][:12]
        tol = 1e-3 if next(self.lm.parameters()).dtype == torch.float32 else 0.25
        autocast, self.autocast_dtype = self.autocast_dtype, None
        training = self.lm.training
        try:
            params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=0)
            out = self._generate([probe, probe[7:]], [1, 1], params, "probe")
            worst = 0.0
            for (r,) in out:
                ids = torch.tensor([r.prompt_ids + r.completion_ids], device=self.device)
                with torch.no_grad():
                    logits = self.lm.eval()(ids).logits[0].float()
                p = len(r.prompt_ids)
                ref = torch.log_softmax(logits[p - 1 : p - 1 + r.num_tokens], -1)
                ref = ref.gather(1, torch.tensor(r.completion_ids, device=self.device)[:, None])[:, 0].cpu()
                worst = max(worst, (ref - torch.tensor(r.logprobs)).abs().max().item())
        except Exception as e:  # noqa: BLE001 - whatever the model raises under paged attention
            raise ValueError(
                f"model: transformers' continuous batching cannot run {type(self.lm).__name__} "
                f"({type(e).__name__}: {e}): {_USE_HF}"
            ) from e
        finally:
            self.autocast_dtype = autocast
            self.lm.train(training)
        if not worst <= tol:
            raise ValueError(
                f"model: transformers' continuous batching computes other log-probs than a plain forward pass for "
                f"{type(self.lm).__name__} (largest difference {worst:.3g} on a probe, more than {tol:g}): its "
                f"attention or positions do not work under paged attention; {_USE_HF}"
            )
        self.steps = 0
        self.token_counts = {"prefill": 0, "decode": 0}
