"""Rollouts with transformers `generate`: the CPU backend (tests, the offline default run) and a simple GPU one.

Batching: the rollouts of all prompts are laid out as rows (prompt i repeated counts[i] times), sorted by prompt
length so that a chunk pads little, and generated in chunks of `max_batch_size` rows. Prompts are left-padded by hand
with an attention mask; transformers (checked on 5.23) derives position ids from that mask
(`attention_mask.cumsum(-1) - 1`) in `_prepare_position_ids_for_generation` and extends them by one per step, so a
padded row sees exactly the positions it would see alone. `tests/rollout/test_hf_engine.py` proves it: log-probs of a
left-padded batch equal an unpadded forward pass, and batched greedy equals unbatched greedy.

Log-probs: `generate(..., output_logits=True)` returns the model's raw next-token logits (before temperature, top-p or
any other processor), and `Rollout.logprobs[t] = log_softmax(raw_logits_t)[y_t]`, the temperature-1 log-prob the
engine contract asks for. Memory: transformers keeps those logits for the whole generation, rows x steps x vocab
float32 per chunk; for long completions with a large vocabulary lower `max_batch_size` (or use `VLLMEngine`).

Prefix reuse (`with engine.reuse_prefixes():`, used by the TreePO sampler): inside the block the engine keeps the KV
cache of every row that ran to `max_new_tokens` (a path to be continued), keyed by the row's token ids (prompt +
completion). A later `generate_ids` prompt equal to such a key continues from that row's cache: its rows are gathered
from the cache (a node's children repeat the same row) and batched with the other rows of the same source chunk, whose
padded layout they share, so only the one uncomputed token and the new ones run through the model. Other prompts are
generated as usual. A key is dropped once used (the tree never continues the same node twice) and everything is freed
when the block ends; the cache is only valid for the weights it was computed with, hence the explicit block, which a
caller must not span an optimiser step with. Only plain `DynamicCache`s of full-attention layers are reused (others:
no reuse, same results). `token_counts` counts the real (non-padding) positions the model computed ("prefill": prompt
tokens not taken from a cache, "decode": generated tokens fed back) and those taken from a cache ("cached").
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
from transformers.cache_utils import DynamicCache, DynamicLayer

from xrpo.rollout.engine import (
    GeneratesFromIds,
    Rollout,
    SamplingParams,
    find_stop,
    finish_rollout,
    resolve_eos_token_ids,
)

__all__ = ["HFEngine"]


class _StopStringCriteria(StoppingCriteria):
    """Stops a row once the text it generated contains a stop string; remembers at which step each row stopped.

    Only the last few tokens of each row are decoded per step: a stop string of L bytes spans at most L tokens (every
    non-special token decodes to at least one byte), so a window of L + 1 tokens holds any occurrence that the newest
    token completes, with one token to spare before it.
    """

    def __init__(self, tokenizer, stop: Sequence[str], prompt_len: int, batch_size: int):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.prompt_len = prompt_len
        self.window = max(len(s.encode("utf-8")) for s in self.stop) + 1
        self.stopped_at = [None] * batch_size  # number of generated tokens when the row's stop string appeared

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        num_generated = input_ids.shape[1] - self.prompt_len
        start = input_ids.shape[1] - min(num_generated, self.window)
        tails = self.tokenizer.batch_decode(input_ids[:, start:].tolist(), skip_special_tokens=True)
        hits = []
        for b, tail in enumerate(tails):
            hit = find_stop(tail, self.stop) is not None
            if hit and self.stopped_at[b] is None:
                self.stopped_at[b] = num_generated
            hits.append(hit)
        return torch.tensor(hits, dtype=torch.bool, device=input_ids.device)


@dataclass
class _Prefix:
    """A generated chunk kept for continuation: its rows' tokens and mask (left-padded layout) and their KV cache."""

    sequences: torch.Tensor  # (rows, T): padding + prompt + generated tokens
    mask: torch.Tensor  # (rows, T)
    cache: DynamicCache  # T - 1 positions: the last generated token has not been fed yet


def _reusable(cache) -> bool:
    return (
        isinstance(cache, DynamicCache)
        and len(cache.layers) > 0
        and all(type(layer) is DynamicLayer for layer in cache.layers)
        and cache.get_seq_length() > 0
    )


def _select_cache_rows(cache: DynamicCache, rows: torch.Tensor) -> DynamicCache:
    """A new cache holding `rows` (repeats allowed) of `cache`, which is left unchanged (its layers are copied
    shallowly, and reorder_cache rebinds each copy's tensors to freshly indexed ones)."""
    new = copy.copy(cache)
    new.layers = [copy.copy(layer) for layer in cache.layers]
    new.reorder_cache(rows)
    return new


class HFEngine(GeneratesFromIds):
    """A `RolloutEngine` (and `TokenPromptEngine`) over a transformers causal LM, sampling with `model.generate`.

    The engine holds a reference to `model`, normally the training model itself: generation sees the weights as they
    are at call time, so `sync_weights(model)` with that same object does nothing. The model is put in eval mode for
    generation (no dropout) and restored to its previous mode afterwards; no gradients are recorded.

    Args:
        model: a transformers causal LM (`PreTrainedModel` with `generate`).
        tokenizer: its tokenizer; prompts are tokenised with `add_special_tokens` (default False, as a rendered chat
            template already carries whatever BOS the model needs).
        max_batch_size: most rows (rollouts) per `generate` call.
        device: where generation runs; the model is moved there if it is elsewhere. None: the model's device.
        eos_token_ids: token ids that end a completion. None: the tokenizer's EOS plus the model's
            `generation_config.eos_token_id` (chat models often have several, e.g. `<|im_end|>` and `<|endoftext|>`).
        add_special_tokens: passed to the tokenizer when encoding prompts.
        autocast_dtype: None, or the dtype generation computes in under `torch.autocast` (mixed precision: float32
            weights, bfloat16 compute), as the trainer's forward passes do.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_batch_size: int = 64,
        device: str | torch.device | None = None,
        eos_token_ids: Sequence[int] | None = None,
        add_special_tokens: bool = False,
        autocast_dtype: torch.dtype | None = None,
    ):
        if not hasattr(model, "generate"):
            raise ValueError(f"model: expected a transformers model with .generate, got {type(model).__name__}")
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size: expected an int >= 1, got {max_batch_size!r}")
        self.model = model
        self.tokenizer = tokenizer
        # mixed precision: the trainer keeps float32 master weights and computes in bfloat16 under autocast; sampling
        # under the same autocast keeps the engine's log-probs those of the distribution the trainer computes
        self.autocast_dtype = autocast_dtype
        self.max_batch_size = max_batch_size
        self.add_special_tokens = bool(add_special_tokens)
        self.progress = None  # called with (rows done, rows) after each chunk (`xrpo.rollout.engine.RolloutEngine`)

        model_device = next(model.parameters()).device
        self.device = torch.device(device) if device is not None else model_device
        if self.device != model_device:
            model.to(self.device)

        eos_token_ids = resolve_eos_token_ids(
            eos_token_ids,
            (getattr(tokenizer, "eos_token_id", None), getattr(model.generation_config, "eos_token_id", None)),
            "neither the tokenizer nor the model",
        )
        self.eos_token_ids = eos_token_ids
        pad = getattr(tokenizer, "pad_token_id", None)
        # Without a pad token, padding with EOS is safe: padded positions are masked out, and a row is cut at its first
        # *generated* EOS, never at padding (padding sits left of the prompt).
        self.pad_token_id = int(pad) if pad is not None else eos_token_ids[0]
        self.vocab_size = getattr(model.config, "vocab_size", None)  # prompt ids are checked against it
        self._prefixes: dict[tuple[int, ...], tuple[_Prefix, int]] | None = None  # set inside reuse_prefixes()
        self.token_counts = {"prefill": 0, "decode": 0, "cached": 0}

    # ------------------------------------------------------------------------------------------------------------
    # generate / generate_ids: `GeneratesFromIds`, which calls `_generate`
    @contextlib.contextmanager
    def reuse_prefixes(self) -> Iterator[HFEngine]:
        """Within the block, continuations of rows generated in it reuse their KV cache (module docstring)."""
        if self._prefixes is not None:
            raise RuntimeError("reuse_prefixes() blocks cannot be nested")
        self._prefixes = {}
        try:
            yield self
        finally:
            self._prefixes = None

    def _generate(self, prompt_ids: list[list[int]], counts: list[int], params: SamplingParams, what: str):
        results: list[list[Rollout]] = [[] for _ in prompt_ids]
        needed = [i for i, c in enumerate(counts) if c > 0]
        if not needed:
            return results
        max_positions = getattr(self.model.config, "max_position_embeddings", None)
        for i in needed:
            if max_positions is not None and len(prompt_ids[i]) + params.max_new_tokens > max_positions:
                raise ValueError(
                    f"{what}[{i}]: {len(prompt_ids[i])} prompt tokens + max_new_tokens={params.max_new_tokens} exceed "
                    f"the model's context of {max_positions} positions"
                )

        rows = [i for i in needed for _ in range(counts[i])]
        store = self._prefixes
        hits: dict[int, tuple[_Prefix, int]] = {}
        if store is not None:
            for r, i in enumerate(rows):
                found = store.get(tuple(prompt_ids[i]))
                if found is not None:
                    hits[r] = found
        misses = sorted((r for r in range(len(rows)) if r not in hits), key=lambda r: len(prompt_ids[rows[r]]))
        batches: list[tuple[list[int], _Prefix | None]] = [
            (misses[s : s + self.max_batch_size], None) for s in range(0, len(misses), self.max_batch_size)
        ]
        by_source: dict[int, list[int]] = {}
        for r, (prefix, _) in hits.items():
            by_source.setdefault(id(prefix), []).append(r)
        for group in by_source.values():
            for s in range(0, len(group), self.max_batch_size):
                batches.append((group[s : s + self.max_batch_size], hits[group[0]][0]))

        row_rollouts: list[Rollout | None] = [None] * len(rows)
        kept: dict[tuple[int, ...], tuple[_Prefix, int]] = {}
        with self._seeded(params.seed), self._eval_mode(), torch.no_grad(), self._autocast():
            for chunk, prefix in batches:
                source = (prefix, [hits[r][1] for r in chunk]) if prefix is not None else None
                rollouts, state = self._generate_chunk(
                    [prompt_ids[rows[r]] for r in chunk], params, source=source, keep=store is not None
                )
                for b, (r, rollout) in enumerate(zip(chunk, rollouts)):
                    row_rollouts[r] = rollout
                    if state is not None and rollout.finish_reason == "length":
                        kept[tuple(rollout.prompt_ids + rollout.completion_ids)] = (state, b)
                if self.progress is not None:
                    self.progress(sum(x is not None for x in row_rollouts), len(rows))
        if store is not None:
            for r in hits:
                store.pop(tuple(prompt_ids[rows[r]]), None)
            store.update(kept)
        for r, i in enumerate(rows):
            results[i].append(row_rollouts[r])
        return results

    def sync_weights(self, model) -> None:
        """No-op when `model` is the engine's own model (the usual case: the HF engine shares the training model).

        Another model of the same architecture (e.g. a separate inference copy) has its weights copied in.
        """
        if model is self.model:
            return
        try:
            self.model.load_state_dict(model.state_dict())
        except (RuntimeError, AttributeError) as e:
            raise ValueError(f"model: cannot copy its weights into the engine's model: {e}") from e

    # ------------------------------------------------------------------------------------------------------------
    def _generate_chunk(
        self, prompt_ids: list[list[int]], params: SamplingParams, *, source=None, keep: bool = False
    ) -> tuple[list[Rollout], _Prefix | None]:
        """One `model.generate` call. `source` = (prefix, rows): continue those rows of a kept chunk (each prompt is
        that row's tokens). `keep`: return the chunk's state for continuation when its rows ran to max_new_tokens."""
        batch = len(prompt_ids)
        cache = None
        if source is None:
            width = max(len(p) for p in prompt_ids)
            input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
            attention_mask = torch.zeros((batch, width), dtype=torch.long)
            for b, ids in enumerate(prompt_ids):
                input_ids[b, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                attention_mask[b, width - len(ids) :] = 1
        else:
            prefix, rows = source
            index = torch.tensor(rows, dtype=torch.long, device=prefix.sequences.device)
            input_ids, attention_mask = prefix.sequences[index], prefix.mask[index]
            width = input_ids.shape[1]
            cache = _select_cache_rows(prefix.cache, index.to(self.device))
            # every prompt is its source row's real tokens: the cache holds all of them but the last
            for b, ids in enumerate(prompt_ids):
                if int(attention_mask[b].sum()) != len(ids) or input_ids[b, width - len(ids) :].tolist() != ids:
                    raise RuntimeError("reuse_prefixes: a cached row does not match its prompt (engine bug)")

        gen_kwargs = dict(
            max_new_tokens=params.max_new_tokens,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            bos_token_id=None,
            num_beams=1,
            use_cache=True,
            output_logits=True,
            return_dict_in_generate=True,
            # a diverged policy (inf/NaN logits) must not crash inside torch.multinomial: sampling goes on from
            # cleaned scores, while the raw logits (and so the returned log-probs) keep the NaN for the caller to see
            remove_invalid_values=True,
        )
        if params.greedy:
            gen_kwargs["do_sample"] = False
        else:
            # top_k=0 disables the top-k=50 filter transformers would otherwise apply by default.
            gen_kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0)
        stop_criteria = _StopStringCriteria(self.tokenizer, params.stop, width, batch) if params.stop else None
        # generate() fills every field we leave unset from model.generation_config (a checkpoint's may carry top_k,
        # repetition_penalty, min_p, suppress_tokens...), which would change the sampling distribution: swap in a bare
        # config for the call so that only SamplingParams decide.
        saved_config = self.model.generation_config
        self.model.generation_config = GenerationConfig()
        try:
            out = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                generation_config=GenerationConfig(**gen_kwargs),
                stopping_criteria=StoppingCriteriaList([stop_criteria]) if stop_criteria is not None else None,
                **({"past_key_values": cache} if cache is not None else {}),
            )
        finally:
            self.model.generation_config = saved_config

        generated = out.sequences[:, width:]
        steps = generated.shape[1]
        logprobs = torch.empty((batch, steps), dtype=torch.float32)
        for t, step_logits in enumerate(out.logits):
            step_lp = torch.log_softmax(step_logits.float(), dim=-1)
            logprobs[:, t] = step_lp.gather(1, generated[:, t : t + 1]).squeeze(1).cpu()
        generated_rows = generated.cpu().tolist()
        logprob_rows = logprobs.tolist()

        eos = set(self.eos_token_ids)
        rollouts = []
        for b in range(batch):
            n = steps
            if stop_criteria is not None and stop_criteria.stopped_at[b] is not None:
                n = min(n, stop_criteria.stopped_at[b])  # later positions hold padding, not generated tokens
            ids, lps = generated_rows[b][:n], logprob_rows[b][:n]
            reason = "length"
            eos_at = next((k for k, tok in enumerate(ids) if tok in eos), None)
            if eos_at is not None:
                ids, lps, reason = ids[: eos_at + 1], lps[: eos_at + 1], "eos"
            # a row the criteria stopped early at a stop string ends "stop" (finish_rollout)
            rollouts.append(finish_rollout(prompt_ids[b], ids, lps, reason, params, self._decode))
            ids = rollouts[-1].completion_ids
            from_cache = len(prompt_ids[b]) - 1 if cache is not None else 0  # all of a continued row but its last
            self.token_counts["prefill"] += len(prompt_ids[b]) - from_cache
            self.token_counts["cached"] += from_cache
            self.token_counts["decode"] += max(len(ids) - 1, 0)

        state = None
        if keep and steps == params.max_new_tokens and _reusable(getattr(out, "past_key_values", None)):
            state = _Prefix(
                sequences=out.sequences,
                mask=torch.cat(
                    [attention_mask.to(self.device), torch.ones((batch, steps), dtype=torch.long, device=self.device)],
                    dim=1,
                ),
                cache=out.past_key_values,
            )
        return rollouts, state

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    @contextlib.contextmanager
    def _seeded(self, seed: int | None) -> Iterator[None]:
        """Seed the sampler for one call without disturbing the caller's global RNG state."""
        if seed is None:
            yield
            return
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=self.device.type if devices else "cuda"):
            torch.manual_seed(seed)
            yield

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    @contextlib.contextmanager
    def _eval_mode(self) -> Iterator[None]:
        was_training = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(was_training)
