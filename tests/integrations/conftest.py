"""Fixtures for the verl integration tests (CPU): a tiny model verl can load, verl's agent loop run in-process.

verl's rollout servers (vLLM / SGLang) need a GPU. `TinyServer` takes their place: it answers verl's
``LLMServerClient.generate`` call with a tiny randomly initialised Llama (transformers, real sampling and real
log-probs), so everything around it is verl's own code: `AgentLoopWorker` (tokenisation through verl's
continuous-token builder, padding, the agent-loop registry, our ``xrpo_icl`` loop) and `RewardLoopWorker` (verl's
reward manager calling xrpo's reward function). Ray is not started: the workers run in this process and
`InProcessHandle` gives an object the ``handle.method.remote(...)`` calling convention of a Ray actor handle.

The model is the GPU smoke test's tiny Llama (examples/verl/make_tiny_model.py explains why not the tiny Qwen2).
"""

from __future__ import annotations

import asyncio
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from xrpo.rewards import VERIFIERS, register_verifier

# verl is imported inside the helpers: without the `verl` extra this directory's test modules skip themselves
# (pytest.importorskip), and this conftest must still import.

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "verl"
EVEN_VERIFIER = "xrpo_test_even_length"

if EVEN_VERIFIER not in VERIFIERS:

    @register_verifier(EVEN_VERIFIER)
    def _even_length(**_):
        """1 when the completion has an even number of characters: a verifiable reward that a random model passes
        about half the time, so groups get mixed rewards (the math verifier would give a random model all zeros)."""

        def verify(completion: str, reference: str) -> float:
            return float(len(completion) % 2 == 0)

        return verify


class TinyServer:
    """verl's ``LLMServerClient.generate`` served by a transformers model on CPU (sampling as configured)."""

    def __init__(self, model, tokenizer, max_new_tokens: int, seed: int = 0):
        self.model, self.tokenizer, self.max_new_tokens = model, tokenizer, max_new_tokens
        self.calls: list[list[int]] = []
        self.gen = torch.Generator().manual_seed(seed)

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append(list(prompt_ids))
        ids = torch.tensor([prompt_ids])
        temperature = sampling_params.get("temperature") or 1.0
        new: list[int] = []
        lps: list[float] = []
        with torch.no_grad():
            past = None
            inp = ids
            for _ in range(self.max_new_tokens):
                out = self.model(input_ids=inp, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logp = torch.log_softmax(out.logits[0, -1].float() / temperature, -1)
                tok = int(torch.multinomial(logp.exp(), 1, generator=self.gen))
                new.append(tok)
                lps.append(float(logp[tok]))
                if tok == self.tokenizer.eos_token_id:
                    break
                inp = torch.tensor([[tok]])
        return TokenOutput(
            token_ids=new, log_probs=lps if sampling_params.get("logprobs") else None, stop_reason="completed"
        )


class InProcessHandle:
    """The ``handle.method.remote(*args)`` calling convention of a Ray actor handle, for an object in this process."""

    def __init__(self, obj):
        self._obj = obj

    def __getattr__(self, name):
        return types.SimpleNamespace(remote=getattr(self._obj, name))


class InProcessRolloutManager:
    """verl's AgentLoopManager.generate_sequences over one in-process AgentLoopWorker."""

    def __init__(self, worker, num_workers: int = 1):
        self.worker, self.num_workers = worker, num_workers
        self.batches: list = []

    def generate_sequences(self, prompts):
        self.batches.append(prompts)
        if "priority" not in prompts.non_tensor_batch:
            prompts.non_tensor_batch["priority"] = np.arange(len(prompts), dtype=np.int64)
        loop = asyncio.get_event_loop()
        out = loop.run_until_complete(self.worker.generate_sequences(prompts))
        out.meta_info.pop("metrics", None)
        out.meta_info["timing"] = {}
        return out


def example(name: str):
    """A module of examples/verl/ (they are scripts, not a package)."""
    import importlib.util

    path = EXAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"xrpo_example_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_tokenizer, tmp_path_factory):
    """The GPU smoke test's tiny random Llama (examples/verl/make_tiny_model.py) with the tiny tokenizer, saved where
    verl's HFModelConfig can load them."""
    model = example("make_tiny_model").build_tiny_llama(tiny_tokenizer, seed=0)
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path, model
