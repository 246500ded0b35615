"""Rollouts with vLLM's offline API (`vllm.LLM`): same contract as `HFEngine`, on a GPU or on a CPU.

Details and the reasons for them: docs/vllm.md,
section "How the engine maps onto vLLM (`xrpo.rollout.vllm_engine`)".
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import random
import warnings
from collections.abc import Sequence

from xrpo.models.lora import inference_state_dict
from xrpo.rollout.engine import (
    GeneratesFromIds,
    Rollout,
    SamplingParams,
    cut_at_stop,
    resolve_eos_token_ids,
    validate_generate_args,
    validate_submit_args,
)
from xrpo.rollout.vllm_support import (
    INSTALL_HINT,
    MAX_TESTED_VLLM_VERSION,
    check_gpu_memory_utilization,
    check_image_utils,
    check_kv_cache_gib,
    check_max_model_len,
    import_vllm,
    vllm_support,
)

__all__ = ["VLLMEngine"]


def _request_seed(seed: int, index: int) -> int:
    # Distinct, well-spread seeds per request: vLLM gives child j of a request seed + j, so plain seed + index would
    # make prompt i's child 1 and prompt i+1's child 0 draw the same random stream.
    return random.Random(f"xrpo:{seed}:{index}").getrandbits(31)


_RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class _RotaryReloadFilter(logging.Filter):
    """Drops vLLM's "RotaryEmbedding: Failed to load weights" after a weight sync: the layer's only tensor is its
    cos / sin cache, computed from the config and never in a checkpoint, which the reload puts back as it was
    (docs/vllm.md, "Weight sync"). The same warning for any other layer passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args == ("RotaryEmbedding",))


def _quiet_rotary_reload_warning() -> None:
    """Install `_RotaryReloadFilter` on vLLM's reload logger once (in this process: a worker in a process of its
    own keeps the message)."""
    logger = logging.getLogger(_RELOAD_LOGGER)
    if not any(isinstance(f, _RotaryReloadFilter) for f in logger.filters):
        logger.addFilter(_RotaryReloadFilter())


class _ProgressBar:
    """What `vllm.LLM.generate(use_tqdm=...)` calls on its progress bar, counting the completions of finished requests
    into ``report(rows done, rows)``. vLLM makes it with ``total=`` its request count and updates it by the number of
    completions of each finished request; older versions may update it by 1 per request, which then shows less done
    than is (the trainer's progress line only), never more: the count is capped at ``rows``."""

    def __init__(self, report, rows: int):
        import time

        self.report, self.rows, self.n, self.postfix = report, rows, 0, ""
        self._clock = time.perf_counter
        self._start = self._clock()

    def __call__(self, iterable=None, *args, **kwargs):
        # vLLM calls use_tqdm(total=..., desc=...) for the bar it updates, and use_tqdm(prompts, desc=...) to wrap
        # what it iterates over (rendering the prompts): that is passed through, uncounted
        if iterable is not None:
            return iterable
        self.n = 0
        return self

    @property
    def format_dict(self) -> dict:
        return {"elapsed": max(self._clock() - self._start, 1e-9)}

    def update(self, n: int = 1) -> None:
        self.n += n
        self.report(min(self.n, self.rows), self.rows)

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


class _ProcessState:
    """The process-wide state vLLM's in-process CPU worker changes: torch's set_num_threads function (replaced by a
    no-op), the torch thread count, and the python / numpy / torch RNG states (reseeded)."""

    def __init__(self):
        import numpy as np
        import torch

        self.set_num_threads = torch.set_num_threads
        self.threads = torch.get_num_threads()
        self.rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())

    def restore(self) -> None:
        import numpy as np
        import torch

        torch.set_num_threads = self.set_num_threads
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        random.setstate(self.rng[0])
        np.random.set_state(self.rng[1])
        torch.set_rng_state(self.rng[2])


class VLLMEngine(GeneratesFromIds):
    """A `RolloutEngine` (and `TokenPromptEngine`) over vLLM's offline `LLM`.

    Args:
        model_path: a model directory (or a hub id, where the machine can reach a hub) that vLLM can load: resolve
            "default", "package:NAME" and GGUF files first (`xrpo.models.loading.resolve_model_dir`).
        tokenizer: a tokenizer object, a path, or None to load the one at `model_path` (transformers `AutoTokenizer`).
            It encodes prompts and decodes completions; vLLM is given the same path.
        dtype: vLLM's `dtype` ("auto", "bfloat16", "float16", "float32"); match the training model's for parity.
        seed: vLLM's engine seed (used for requests without a per-call seed).
        gpu_memory_utilization: GPU only: share of the GPU vLLM may take (weights + KV cache); leave room for the
            training model.
        kv_cache_gib: CPU only: KV cache size in GiB (vLLM's default is half the machine's memory). vLLM >= 0.20 takes
            it as `kv_cache_memory_bytes`; older versions read whole GiB from `VLLM_CPU_KVCACHE_SPACE` (rounded up).
        max_model_len: longest prompt + completion vLLM schedules (None: the model's context).
        enforce_eager: skip torch.compile / CUDA graphs (None: True on CPU, where compiling costs minutes and gains
            little for small batches; vLLM's default on GPU).
        eos_token_ids: token ids that end a completion (None: the tokenizer's EOS plus the model's
            generation_config.json `eos_token_id`, as `HFEngine` does).
        **llm_kwargs: passed to `vllm.LLM` (e.g. `tensor_parallel_size`).
    """

    def __init__(
        self,
        model_path: str,
        *,
        tokenizer=None,
        dtype: str = "auto",
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        kv_cache_gib: float | None = None,
        max_model_len: int | None = None,
        enforce_eager: bool | None = None,
        eos_token_ids: Sequence[int] | None = None,
        **llm_kwargs,
    ):
        model_path = os.fspath(model_path)
        if (os.path.isabs(model_path) or model_path.startswith((".", "~"))) and not os.path.exists(
            os.path.expanduser(model_path)
        ):
            raise FileNotFoundError(f"model_path: no such model directory: {model_path}")
        check_gpu_memory_utilization(gpu_memory_utilization)
        check_kv_cache_gib(kv_cache_gib)
        check_max_model_len(max_model_len)
        vllm = import_vllm()
        self._check_version(vllm)
        _quiet_rotary_reload_warning()

        from transformers import AutoTokenizer

        tokenizer_path = tokenizer if isinstance(tokenizer, (str, os.PathLike)) else None
        if tokenizer is None or tokenizer_path is not None:
            tokenizer = AutoTokenizer.from_pretrained(os.fspath(tokenizer_path or model_path))
        self.tokenizer = tokenizer
        self.model_path = model_path

        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        env_set = self._llm_options(llm_kwargs, kv_cache_gib, max_model_len, enforce_eager)
        self.kv_cache_gib = kv_cache_gib
        self.llm = self._start_llm(
            vllm,
            env_set,
            model=model_path,
            tokenizer=os.fspath(tokenizer_path) if tokenizer_path is not None else model_path,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            seed=seed,
            **llm_kwargs,
        )
        self._SamplingParams = vllm.SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self._final_only = RequestOutputKind.FINAL_ONLY
        self._stream: dict[str, tuple] = {}
        self._stream_counter = 0
        self.progress = None  # called with (rows done, rows) as requests finish (`xrpo.rollout.engine.RolloutEngine`)

        sources = [getattr(tokenizer, "eos_token_id", None)]
        if eos_token_ids is None:
            try:
                from transformers import GenerationConfig

                sources.append(GenerationConfig.from_pretrained(model_path).eos_token_id)
            except (OSError, ValueError):
                pass  # no generation_config.json: the tokenizer's EOS alone
        self.eos_token_ids = resolve_eos_token_ids(
            eos_token_ids, sources, f"neither the tokenizer nor the generation config of {model_path}"
        )
        self._read_model_config(tokenizer)
        self._warm_up()

    def _check_version(self, vllm) -> None:
        """The device vLLM runs on and what its version can do there (`vllm_support`); warns past the tested
        versions."""
        from vllm.platforms import current_platform

        self.on_cpu = bool(current_platform.is_cpu())
        self.support = vllm_support(vllm.__version__, on_cpu=self.on_cpu)
        self.vllm_version = vllm.__version__
        if not self.support.tested:
            warnings.warn(
                f"vLLM {vllm.__version__} is newer than the versions VLLMEngine was checked against (up to "
                f"{'.'.join(map(str, MAX_TESTED_VLLM_VERSION))}); weight sync uses the in-place reload of vLLM 0.16+",
                stacklevel=3,
            )
        if self.on_cpu:
            check_image_utils()

    def _llm_options(
        self, llm_kwargs: dict, kv_cache_gib: float | None, max_model_len: int | None, enforce_eager: bool | None
    ) -> dict[str, str]:
        """Fill ``llm_kwargs`` (in place) with the engine's own `vllm.LLM` options; returns the environment variables
        the start needs (set only while vLLM starts)."""
        llm_kwargs.setdefault("logprobs_mode", "raw_logprobs")
        if max_model_len is not None:
            llm_kwargs["max_model_len"] = max_model_len
        if enforce_eager is None:
            enforce_eager = True if self.on_cpu else None
        if enforce_eager is not None:
            llm_kwargs["enforce_eager"] = bool(enforce_eager)
        if self.on_cpu:
            # A seeded request whose prompt is split over two scheduler steps (chunked prefill, when a call's prompts
            # exceed the step's token budget) makes vLLM's CPU runner rewind its generator with set_offset, which CPU
            # generators do not have ("CPU Generator does not use offset", vLLM 0.31): whole prompts only.
            llm_kwargs.setdefault("enable_chunked_prefill", False)
        env_set: dict[str, str] = {}
        if self.on_cpu and kv_cache_gib is not None:
            if self.support.cpu_kv_cache == "engine_arg":
                llm_kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * (1 << 30))
            else:
                env_set["VLLM_CPU_KVCACHE_SPACE"] = str(math.ceil(kv_cache_gib))
        return env_set

    def _start_llm(self, vllm, env_set: dict[str, str], **kwargs):
        """`vllm.LLM(**kwargs)` with ``env_set`` in the environment meanwhile, and the process state its CPU worker
        changes restored after; a KV cache too small for one sequence is named by the options that size it."""
        saved = _ProcessState()
        previous_env = {k: os.environ.get(k) for k in env_set}
        os.environ.update(env_set)
        try:
            return vllm.LLM(**kwargs)
        except ValueError as e:
            if "max seq len" in str(e) or "KV cache" in str(e):
                knob = (
                    "kv_cache_gib (rollout.vllm_kv_cache_gib)"
                    if self.on_cpu
                    else "gpu_memory_utilization (rollout.vllm_gpu_memory_utilization)"
                )
                raise ValueError(
                    f"vLLM's KV cache cannot hold one sequence of max_model_len tokens for {kwargs['model']}: raise "
                    f"{knob} or lower max_model_len (rollout.vllm_max_model_len). vLLM said: {e}"
                ) from e
            raise
        finally:
            for k, v in previous_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            saved.restore()

    def _read_model_config(self, tokenizer) -> None:
        """What the started engine says of the model: its context, quantization and vocabulary size, and whether its
        worker shares this process."""
        engine = self.llm.llm_engine
        config = getattr(engine, "vllm_config", None)
        model_config = getattr(config, "model_config", None) or getattr(engine, "model_config", None)
        self.max_model_len = int(model_config.max_model_len) if model_config is not None else None
        self.quantization = getattr(model_config, "quantization", None)
        self.vocab_size = len(tokenizer)
        if model_config is not None:
            try:
                self.vocab_size = int(model_config.get_vocab_size())
            except (AttributeError, TypeError):
                pass
        backend = getattr(getattr(config, "parallel_config", None), "distributed_executor_backend", None)
        # the worker shares this process (tensors can be handed over by reference) only with the in-process engine
        # core and the single-process executor
        self.worker_in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0" and backend == "uni"

    def _warm_up(self) -> None:
        """One one-token request at start: what the device's kernels cannot run (e.g. a head size vLLM's CPU
        attention has no kernel for) fails here, named, rather than in the middle of the first training step."""
        first = next(iter(self.eos_token_ids))
        saved = _ProcessState()
        try:
            # greedy: an unseeded sampled request would draw from the caller's global torch RNG
            self.llm.generate(
                [{"prompt_token_ids": [first]}], self._SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False
            )
        except RuntimeError as e:
            raise RuntimeError(
                f"vLLM {self.vllm_version} cannot run {self.model_path} on this "
                f"{'CPU' if self.on_cpu else 'device'}: {e}"
                + (
                    " (vLLM's CPU attention has kernels for some head sizes only; vLLM 0.31 lists 32, 64, 80, 96, "
                    "112, 128, 160, 192, 224, 256 and 512)"
                    if "head_dim" in str(e)
                    else ""
                )
            ) from e
        finally:
            saved.restore()

    # ------------------------------------------------------------------------------------------------------------
    # generate / generate_ids: `GeneratesFromIds` (prompts encoded without special tokens), which calls `_generate`
    def _generate(self, prompt_ids: list[list[int]], counts: list[int], params: SamplingParams, what: str):
        results: list[list[Rollout]] = [[] for _ in prompt_ids]
        needed = [i for i, c in enumerate(counts) if c > 0]
        if not needed:
            return results
        if self._stream:
            raise RuntimeError(f"{len(self._stream)} streamed requests are in flight; wait() for them first")
        requests, sampling = [], []
        for i in needed:
            requests.append(self._request(prompt_ids[i], what, i, params))
            sampling.append(self._vllm_params(params, counts[i], i))
        with self._seeded_call(params.seed):
            bar = False if self.progress is None else _ProgressBar(self.progress, sum(counts[i] for i in needed))
            outputs = self.llm.generate(requests, sampling, use_tqdm=bar)
        if len(outputs) != len(needed):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(needed)} requests")
        for i, out in zip(needed, outputs):
            results[i] = self._rollouts(list(prompt_ids[i]), out, counts[i], params, f"{what}[{i}]")
        return results

    def _request(self, ids: list[int], what: str, i: int, params: SamplingParams) -> dict:
        if self.max_model_len is not None and len(ids) + params.max_new_tokens > self.max_model_len:
            raise ValueError(
                f"{what}[{i}]: {len(ids)} prompt tokens + max_new_tokens={params.max_new_tokens} exceed vLLM's "
                f"max_model_len of {self.max_model_len}"
            )
        # a TokensPrompt is a TypedDict; a plain dict avoids its import path, which moved between versions
        return {"prompt_token_ids": list(ids)}

    def _vllm_params(self, params: SamplingParams, count: int, index: int):
        """vLLM's sampling parameters for ``count`` completions of the prompt at position ``index`` of a call."""
        return self._SamplingParams(
            # vLLM refuses n > 1 with greedy decoding: one request, its rollout repeated by `_rollouts`
            n=1 if params.greedy else count,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            stop_token_ids=self.eos_token_ids,
            include_stop_str_in_output=True,
            seed=None if params.seed is None else _request_seed(params.seed, index),
            logprobs=0,
            skip_special_tokens=True,
        )

    def _rollouts(self, prompt_ids: list[int], out, count: int, params: SamplingParams, what: str) -> list[Rollout]:
        got = [self._to_rollout(prompt_ids, c, params) for c in sorted(out.outputs, key=lambda c: c.index)]
        if params.greedy and len(got) == 1:
            got = [got[0]] + [dataclasses.replace(got[0]) for _ in range(count - 1)]
        if len(got) != count:
            raise RuntimeError(f"vLLM returned {len(got)} completions for {what}, expected {count}")
        return got

    # ------------------------------------------------------------------------------------------------------------
    def submit(self, key, prompt: str, n: int, params: SamplingParams, *, index: int = 0) -> None:
        """Queue ``n`` completions of ``prompt`` on vLLM's engine loop while other requests decode
        (`xrpo.rollout.engine.StreamingEngine`): the request `generate` would make for ``prompts[index]``."""
        prompts, counts = validate_generate_args([prompt], [n], params)
        validate_submit_args(key, counts[0], index, [entry[0] for entry in self._stream.values()])
        ids = list(self.tokenizer(prompts[0], add_special_tokens=False)["input_ids"])
        if not ids:
            raise ValueError("prompt: encodes to no tokens; expected a non-empty prompt")
        request = self._request(ids, "prompt", index, params)
        sampling = self._vllm_params(params, counts[0], index)
        # the engine reports a request once, when all its completions are done (what LLM.generate asks for too)
        sampling.output_kind = self._final_only
        # the request id orders the requests: vLLM appends a random suffix internally, the outputs carry this one
        request_id = f"xrpo-stream-{self._stream_counter}"
        self._stream_counter += 1
        self.llm.llm_engine.add_request(request_id, request, sampling)
        self._stream[request_id] = (key, ids, counts[0], params)

    def wait(self) -> list:
        """Step vLLM's engine until a streamed request completes; every request completed since the last call, as
        ``(key, rollouts)`` in submission order (`xrpo.rollout.engine.StreamingEngine`)."""
        if not self._stream:
            return []
        engine = self.llm.llm_engine
        finished = []
        seeds = {entry[3].seed for entry in self._stream.values()}
        with self._seeded_call(next(iter(seeds)) if None not in seeds else None):
            while not finished:
                if not engine.has_unfinished_requests():
                    raise RuntimeError(f"vLLM has no unfinished requests, but {len(self._stream)} are in flight")
                finished.extend(o for o in engine.step() if o.finished and o.request_id in self._stream)
        done = []
        for out in sorted(finished, key=lambda o: int(o.request_id.rsplit("-", 1)[1])):
            key, ids, count, params = self._stream.pop(out.request_id)
            done.append((key, self._rollouts(ids, out, count, params, f"request {key!r}")))
        return done

    @contextlib.contextmanager
    def _seeded_call(self, seed: int | None):
        """A seeded call leaves the caller's global torch RNG as it was (vLLM's sampler draws from it even when
        every request has its own seed); an unseeded one draws from it, as `HFEngine` does."""
        if seed is None:
            yield
            return
        import torch

        devices = [torch.cuda.current_device()] if not self.on_cpu and torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=devices):
            yield

    def sync_weights(self, model) -> None:
        """Load `model`'s current weights (a transformers model of the served architecture) into vLLM.

        Raises RuntimeError where the installed vLLM cannot take new weights on this device (`vllm_support`)."""
        support = self.support
        if support.sync is None:
            raise RuntimeError(support.sync_error)
        if support.sync == "load_weights" and self.quantization:
            raise RuntimeError(
                f"vLLM {self.vllm_version} cannot sync weights into a {self.quantization}-quantised model: its "
                f"load_weights skips the post-load processing that quantisation needs, and an in-place reload with "
                f"new weights arrived in vLLM 0.16. Upgrade vLLM ({INSTALL_HINT}) or serve unquantised weights."
            )
        # a LoRA model (peft) is loaded as the merged weights, under the base model's names
        state = inference_state_dict(model)
        if self.worker_in_process:
            weights = [(name, tensor.detach()) for name, tensor in state.items()]
        else:
            weights = [(name, tensor.detach().cpu().contiguous()) for name, tensor in state.items()]
        if support.sync == "reload":
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
            )
        else:

            def load(vllm_model):
                vllm_model.load_weights(weights=weights)

            self.llm.apply_model(load)
        self.llm.reset_prefix_cache()

    # ------------------------------------------------------------------------------------------------------------
    def _to_rollout(self, prompt_ids: list[int], completion, params: SamplingParams) -> Rollout:
        ids = list(completion.token_ids)
        if completion.logprobs is None or len(completion.logprobs) != len(ids):
            raise RuntimeError("vLLM returned no per-token log-probs; expected SamplingParams(logprobs=0) to give them")
        lps = [float(completion.logprobs[t][tok].logprob) for t, tok in enumerate(ids)]
        if completion.finish_reason == "length":
            reason = "length"
        elif completion.finish_reason == "stop":
            reason = "stop" if isinstance(completion.stop_reason, str) else "eos"
        else:
            raise RuntimeError(f"vLLM finished a request with reason {completion.finish_reason!r}")
        text = None
        if reason == "stop":
            cut = cut_at_stop(ids, params.stop, self._decode)
            if cut is not None:
                k, text = cut
                ids, lps = ids[:k], lps[:k]
        if text is None:
            text = self._decode(ids)
        return Rollout(prompt_ids=prompt_ids, completion_ids=ids, logprobs=lps, finish_reason=reason, text=text)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)
