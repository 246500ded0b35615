"""`xrpo eval`: n samples per problem, verified, reported as pass@k, cons@n, response length and truncation per
dataset and on average (the layout of the paper's tables, §4.1: n = 32, temperature 1.0, top-p 0.95).

    evaluate(EvalConfig(model="runs/x", data=["aime24.parquet", "champ"]))  # = xrpo eval runs/x aime24.parquet champ

The driver, top to bottom (docs/eval.md has the user's view):
    1. model     `xrpo.eval.model`: the weights, and the run whose config.yaml supplies the defaults
                 (`xrpo.eval.settings`)
    2. data      `xrpo.eval.spec`: the data-spec language and the datasets it names
    3. resume    `xrpo.eval.store`: settings.json and the per-problem files of the output directory, which this
                 process holds (`xrpo.rundir.lock`: a second evaluation into it is refused)
    4. sampling  `xrpo.rollout.validate.sample_and_score` in chunks of problems, each chunk with its own seed, through
                 the engine and renderer of `xrpo.eval.build` (test-time ICL prompts: `xrpo.eval.icl`); each
                 verified chunk is appended to per_problem/<dataset>.jsonl and flushed before the next one starts.
    5. outputs   `xrpo.eval.results`: results.json, results.md, pass_at_k.png, lengths.png
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from xrpo.data import Problem
from xrpo.eval import store
from xrpo.eval.build import build, context_length
from xrpo.eval.config import EvalConfig, default_ks
from xrpo.eval.icl import icl_prompts
from xrpo.eval.model import resolve_model
from xrpo.eval.results import make_results, write_results
from xrpo.eval.settings import resolve_settings
from xrpo.eval.spec import DataSpec, dataset_name, describe, load_dataset, parse_data_spec, slug
from xrpo.rundir.lock import RunLock

__all__ = ["evaluate"]


def evaluate(
    cfg: EvalConfig, *, log: Callable[[str], None] = print, on_chunk: Callable[[str, list[dict]], None] | None = None
) -> dict:
    """Run an evaluation (see the module docstring and docs/eval.md); returns what results.json holds.

    ``on_chunk(dataset_name, records)`` is called after each chunk is appended (tests use it to interrupt a run).
    """
    cfg.validate()
    t_start = time.perf_counter()
    n = cfg.resolved_n()
    ks = sorted(set(cfg.k)) if cfg.k else ([1] if cfg.greedy else default_ks(n))

    # -------- 1. model spec and defaults from the run
    rm = resolve_model(cfg.model)
    settings = resolve_settings(cfg, rm, n)

    # -------- 2. data (all of it first: a malformed row fails before any model is loaded)
    specs = [parse_data_spec(s, cfg.column_map) for s in cfg.data]
    datasets: list[tuple[str, DataSpec, list[Problem], dict]] = []
    for spec in specs:
        problems, info = load_dataset(spec, rm.run, cfg.limit)
        name = dataset_name(spec)
        if any(name == d[0] for d in datasets) or any(slug(name) == slug(d[0]) for d in datasets):
            raise ValueError(f"two datasets are named {name!r}; name one with {spec.source}:name=OTHER")
        datasets.append((name, spec, problems, info))
        log(f"data {name}: {len(problems)} problems from {spec.source} ({describe(info)})")

    # -------- 3. output directory, settings, finished problems
    out = Path(cfg.output or Path("evals") / datetime.now().strftime("%Y%m%d-%H%M%S"))
    store.check_settings(out / "settings.json", settings)
    from xrpo.rewards import get_verifier, raise_reference_errors

    # a reference the verifier cannot grade (e.g. code tests that do not parse) would score every sample 0
    verifier = get_verifier(settings["verifier"], **settings.get("verifier_args", {}))
    for name, spec, problems, _ in datasets:
        raise_reference_errors(verifier, problems, f"data {name} ({spec.source})")
    # one process writes an output directory at a time (held from before the finished problems are read)
    with RunLock(out, "xrpo eval", log=log) as lock:
        lock.claim()
        return _score(cfg, rm, settings, datasets, verifier, out, n, ks, t_start, log, on_chunk)


def _score(cfg, rm, settings, datasets, verifier, out, n, ks, t_start, log, on_chunk) -> dict:
    """Steps 3 (finished problems), 4 and 5 in the output directory ``out``, which this process holds."""
    done: dict[str, dict[int, dict]] = {}
    prompt_shas: dict[str, dict[str, str]] = {}
    for name, spec, problems, _ in datasets:
        shas = prompt_shas[name] = {p.id: store.prompt_sha(p) for p in problems}
        done[name] = store.saved_records(out, name, spec.source, problems, shas, n, log)
    todo = sum(len(p) - len(done[name]) for name, _, p, _ in datasets)
    resumed = sum(len(d) for d in done.values())
    if resumed:
        log(f"resuming {out}: {resumed} problems already scored, {todo} to go")

    # -------- 4. sampling
    records_by_ds: dict[str, list[dict]] = {}
    if todo:
        engine, renderer, corpus = build(cfg, rm, settings, log)
        stop = tuple(settings["stop"])
        # written once everything loaded: a typo in a model path or verifier name leaves no settings behind
        store.save_settings(out, settings)
        chunk = settings["chunk_size"]
        for name, _, problems, _ in datasets:
            if len(done[name]) == len(problems):
                continue
            prompts, extra = None, {pid: {"prompt_sha": sha} for pid, sha in prompt_shas[name].items()}
            if corpus is not None:
                prompts, shown = icl_prompts(problems, renderer, corpus, cfg.icl_k)
                for pid, fields in shown.items():
                    extra[pid].update(fields)
            over = _over_context(problems, prompts, renderer, engine, settings["max_new_tokens"], done[name], n)
            if over:
                # the model cannot read these: every sample counts as wrong, so the denominator stays the benchmark's
                ids = [r["id"] for r in over.values()]
                log(
                    f"[{name}] {len(over)} prompts do not fit the model's context with max_new_tokens="
                    f"{settings['max_new_tokens']}: counted as unsolved ({', '.join(ids[:5])}"
                    f"{', ...' if len(over) > 5 else ''})"
                )
                store.Appender(store.per_problem_path(out, name), extra)(list(over.values()))
                done[name].update(over)
            sampling = _sampling(settings, stop, ds_seed=_dataset_seed(cfg.seed, name))
            appender = store.Appender(store.per_problem_path(out, name), extra)
            count = [len(done[name])]
            t0 = time.perf_counter()

            def chunk_done(recs, name=name, problems=problems, appender=appender, count=count, t0=t0):
                appender(recs)
                count[0] += len(recs)
                log(f"[{name}] {count[0]}/{len(problems)} problems, {time.perf_counter() - t0:.1f}s")
                if on_chunk is not None:
                    on_chunk(name, recs)

            _, recs = _sample(
                problems,
                engine,
                verifier,
                renderer,
                n,
                sampling,
                ks,
                prompts,
                chunk,
                done[name],
                chunk_done,
                cfg.save_completions,
            )
            records_by_ds[name] = recs
    else:
        store.save_settings(out, settings)
    for name, _, problems, _ in datasets:
        if name not in records_by_ds:
            records_by_ds[name] = [done[name][i] for i in range(len(problems))]

    # -------- 5. figures and files
    results = make_results(cfg, settings, datasets, records_by_ds, n, ks)
    results["wall_time_s"] = time.perf_counter() - t_start
    results["sampled_problems_this_run"] = todo
    results["output"] = str(out)
    write_results(out, results, log)
    return results


def _sample(problems, engine, verifier, renderer, n, sampling, ks, prompts, chunk, done, on_chunk, keep_text):
    from xrpo.rollout.validate import sample_and_score

    return sample_and_score(
        problems,
        engine,
        verifier,
        renderer,
        n=n,
        sampling=sampling,
        ks=ks,
        prefix="",
        prompts=prompts,
        chunk_size=chunk,
        done=done,
        on_chunk=on_chunk,
        keep_text=keep_text,
    )


def _dataset_seed(seed: int, name: str) -> int:
    """Each dataset its own seed stream, so that adding a dataset to a run does not change another's samples."""
    import zlib

    return (seed * 1_000_003 + zlib.crc32(name.encode("utf-8"))) % (2**31)


def _sampling(settings: dict, stop: tuple, ds_seed: int):
    from xrpo.rollout.engine import SamplingParams

    if settings["greedy"]:
        return SamplingParams(
            temperature=0.0, top_p=1.0, max_new_tokens=settings["max_new_tokens"], stop=stop, seed=ds_seed
        )
    return SamplingParams(
        temperature=settings["temperature"],
        top_p=settings["top_p"],
        max_new_tokens=settings["max_new_tokens"],
        stop=stop,
        seed=ds_seed,
    )


def _over_context(problems, prompts, renderer, engine, max_new_tokens: int, done: dict, n: int) -> dict[int, dict]:
    """Records for the problems whose prompt + max_new_tokens exceed the model's context (never sampled)."""
    from xrpo.rollout.validate import unscored_record

    context = context_length(engine)
    if context is None:
        return {}
    todo = [i for i in range(len(problems)) if i not in done]
    texts = [prompts[i] if prompts is not None else renderer.render(problems[i]) for i in todo]
    lengths = [len(ids) for ids in renderer.tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
    out = {}
    for i, length in zip(todo, lengths):
        if length + max_new_tokens > context:
            out[i] = unscored_record(
                problems[i],
                n,
                f"prompt of {length} tokens + max_new_tokens={max_new_tokens} exceeds the model's context of {context}",
            )
    return out
