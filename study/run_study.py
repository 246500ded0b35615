"""The comparative study: every method on the same task, model, seeds and budget; results in docs/results.md.

Trains each (method, seed) in its own `xrpo train` process (a crash ends that run only) into OUT/<method>/seed<k>/,
with the trainer's held-out validation every --eval-every steps and at the end (pass@k and cons@n over --eval-samples
samples per problem), then writes docs/results.md (tables in the layout of the paper's), figures and a JSON of every
number to docs/results/. Resumable: a run with a summary.json is done and skipped, a run with a checkpoint continues
from it (`xrpo train --resume`), so the same command finishes an interrupted study.

    python study/run_study.py                           # the default study (docs/results.md gives its wall time)
    python study/run_study.py --plan                    # what would run, and what is already done
    python study/run_study.py --report-only             # rebuild docs/results.md from the finished runs
    python study/run_study.py --methods grpo xrpo --seeds 0 --steps 3 --out /tmp/s --doc /tmp/s/results.md

Every method gets the same overrides (budget, steps, seeds, evaluation, model, lr): only `method.name` differs, so
each method runs with its preset's knobs (xrpo/algo/presets.py, docs/methods.md). --config (a YAML of the trainer's
config) and --config-overrides apply to every method alike; docs/results.md lists them. Neither may set a key the
study owns (OWNED); a --config's base file may, and the study's flag wins (it says so). The statistics are described
in study/study_report.py and docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import study_report as report  # noqa: E402

import xrpo  # noqa: E402
from xrpo.algo.presets import list_presets  # noqa: E402
from xrpo.trainer.config_loader import build_config, from_dict, load_config_file, to_dict  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# treepo-sampling is the paper's TPO-S baseline (the sampler alone); treepo adds TreePO's own tree advantage
DEFAULT_METHODS = (
    "grpo",
    "dapo",
    "gspo",
    "treepo-sampling",
    "treepo",
    "cures",
    "xrpo",
    "xrpo-no-icl",
    "xrpo-no-as",
    "xrpo-no-as-icl",
    "xrpo-no-hrp",
    "xrpo-gspo",
)
# keys the study sets itself (one flag each); a --config-overrides entry for them would split the budget
OWNED = {
    "method.name": "--methods",
    "seed": "--seeds",
    "steps": "--steps",
    "output": "--out",
    "eval_samples": "--eval-samples",
    "eval_k": "--eval-k",
    "eval_every": "--eval-every",
    "threads": "--threads",
}


class StudyError(ValueError):
    pass


@dataclass
class Spec:
    method: str
    seed: int
    path: Path
    overrides: list[str]


# ================================================================================================ planning
def check_methods(methods: list[str]) -> None:
    """Every name must be a preset; the error lists the unknown ones and the valid ones."""
    valid = list_presets()
    unknown = [m for m in methods if m not in valid]
    if unknown:
        raise StudyError(
            f"unknown method(s) {', '.join(unknown)}: not presets of xrpo.algo.presets "
            f"(valid: {', '.join(valid)}); pass --methods with the ones to run"
        )
    dup = sorted({m for m in methods if methods.count(m) > 1})
    if dup:
        raise StudyError(f"method(s) listed twice: {', '.join(dup)}")


def check_overrides(items: list[str], config: str | None) -> list[str]:
    """Refuses a --config-overrides entry or a --config that sets a key the study owns. A key the --config's base
    file sets (`xrpo.trainer.config.load_config_file`) is the study's to override: returned, for a notice."""
    for item in items:
        if "=" not in item:
            raise StudyError(f"--config-overrides: {item!r} is not of the form key=value")
        key = item.split("=", 1)[0].strip()
        if key in OWNED:
            raise StudyError(f"--config-overrides: {key} is set by the study for every run; use {OWNED[key]}")
    if config:
        if not Path(config).is_file():
            raise StudyError(f"--config {config} does not exist")
        values, own = load_config_file(config)
        clash = sorted(k for k in own if k in OWNED)
        if clash:
            raise StudyError(
                f"--config {config} sets {', '.join(clash)}: the study sets these for every run; use "
                + ", ".join(OWNED[k] for k in clash)
            )
        return sorted(k for k in values if k in OWNED)
    return []


def eval_ks(args) -> list[int]:
    return [k for k in args.eval_k if k <= args.eval_samples]


def run_overrides(args, method: str, seed: int, path: Path) -> list[str]:
    # the study's own keys come last, so that they are what the run uses
    return list(args.config_overrides) + [
        f"method.name={method}",
        f"seed={seed}",
        f"steps={args.steps}",
        f"output={path}",
        f"eval_samples={args.eval_samples}",
        f"eval_k=[{', '.join(str(k) for k in eval_ks(args))}]",
        f"eval_every={args.eval_every}",
        f"threads={args.threads}",
        "keep_last=1",
        "progress=false",
        "tensorboard=false",
    ]


def plan(args) -> list[Spec]:
    """Runs in seed-major order (every method of seed 0 first), so a partial study already compares all methods."""
    out = Path(args.out).resolve()
    return [
        Spec(m, s, out / m / f"seed{s}", run_overrides(args, m, s, out / m / f"seed{s}"))
        for s in args.seeds
        for m in args.methods
    ]


def run_state(spec: Spec) -> str:
    """done (summary.json), resume (a complete checkpoint), or new."""
    from xrpo.rundir.checkpoints import list_checkpoints

    if report.load_run(spec.path) is not None:
        return "done"
    if spec.path.exists() and list_checkpoints(spec.path):
        return "resume"
    return "new"


def check_same_config(spec: Spec, wanted: dict) -> None:
    """A run found on disk must have been made with the configuration this study asks for (else its budget would
    silently differ from the others'). Its config.yaml is read as `xrpo train --resume` reads it (`from_dict`): a
    knob added to xrpo after the run was made takes its default there, as it would in the resumed run."""
    saved_file = spec.path / "config.yaml"
    if not saved_file.exists():
        return
    try:
        saved = to_dict(from_dict(yaml.safe_load(saved_file.read_text()) or {}))
    except (ValueError, TypeError) as e:
        raise StudyError(
            f"{saved_file} cannot be read as a trainer config ({e}); use another --out or remove that run directory"
        ) from None
    diffs = []
    for sec, val in wanted.items():
        if isinstance(val, dict):
            diffs += [
                f"{sec}.{k}: saved {saved.get(sec, {}).get(k)!r}, asked {v!r}"
                for k, v in val.items()
                if saved.get(sec, {}).get(k) != v
            ]
        elif saved.get(sec) != val:
            diffs.append(f"{sec}: saved {saved.get(sec)!r}, asked {val!r}")
    if diffs:
        raise StudyError(
            f"{spec.path} was made with another configuration ({'; '.join(diffs[:6])}"
            f"{' ...' if len(diffs) > 6 else ''}); use another --out or remove that run directory"
        )


# ================================================================================================ running
def child_env() -> dict[str, str]:
    # the child imports the same xrpo as this process (a worktree on PYTHONPATH, or the installed one)
    env = dict(os.environ)
    src = str(Path(xrpo.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def command(spec: Spec, state: str, config: str | None) -> list[str]:
    base = [sys.executable, "-m", "xrpo.cli", "train"]
    if state == "resume":
        return base + ["--resume", str(spec.path)]
    return base + (["--config", config] if config else []) + spec.overrides


def execute(spec: Spec, state: str, config: str | None) -> dict:
    """One `xrpo train` process; its output goes to study.log and its timing to study_run.json in the run dir."""
    spec.path.mkdir(parents=True, exist_ok=True)
    cmd = command(spec, state, config)
    start = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(spec.path / "study.log", "a") as log:
        log.write(f"\n=== {start} {state}: {shlex.join(cmd)}\n")
        log.flush()
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env(), cwd=os.getcwd()).returncode
    seg = {
        "start": start,
        "mode": state,
        "rc": rc,
        "wall_s": time.perf_counter() - t0,
        "load1_start": load0,
        "load1_end": os.getloadavg()[0],
        "machine": machine(),
        "command": cmd,
    }
    record = spec.path / "study_run.json"
    segs = json.loads(record.read_text())["segments"] if record.exists() else []
    report.write_atomic(record, json.dumps({"segments": segs + [seg]}, indent=1))
    return seg


def machine() -> str:
    """Where the run ran, for the report: architecture, CPU count, GPU when torch sees one."""
    import torch

    text = f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
    if torch.cuda.is_available():
        text += ", " + torch.cuda.get_device_name(0)
    return text


def prebuild_default_model(cfg) -> None:
    """Build the cached default model here, once, rather than in two workers at the same time."""
    if cfg.model.path != "default":
        return
    from xrpo.models.default import ensure_default_model
    from xrpo.trainer.setup import cache_root

    ensure_default_model(cache_root(cfg), warmup_steps=cfg.model.warmup_steps)


def run_all(args, specs: list[Spec], states: dict[str, str], log=print) -> list[tuple[Spec, dict]]:
    todo = [s for s in specs if states[str(s.path)] != "done"]
    failed: list[tuple[Spec, dict]] = []
    if not todo:
        return failed
    t0 = time.perf_counter()
    lock = threading.Lock()
    finished = [0]

    def one(spec: Spec) -> tuple[Spec, dict]:
        state = states[str(spec.path)]
        with lock:
            log(f"[{time.perf_counter() - t0:7.0f}s] start  {spec.method} seed{spec.seed} ({state})")
        try:
            seg = execute(spec, state, args.config)
            run = report.load_run(spec.path) if seg["rc"] == 0 else None
        except (OSError, ValueError) as e:  # this run only: the others go on
            seg, run = {"rc": -1, "wall_s": 0.0, "error": f"{type(e).__name__}: {e}"}, None
        with lock:
            finished[0] += 1
            if run is not None:
                s = run.summary
                what = f"pass@1 {s['pass@1_before']:.3f} -> {s['pass@1_after']:.3f}"
            else:
                what = f"FAILED (exit {seg['rc']}), see {spec.path / 'study.log'}"
            log(
                f"[{time.perf_counter() - t0:7.0f}s] {finished[0]}/{len(todo)} {spec.method} seed{spec.seed}: "
                f"{seg['wall_s']:.0f}s, {what}"
            )
        return spec, seg

    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        for fut in as_completed([pool.submit(one, s) for s in todo]):
            spec, seg = fut.result()
            if seg["rc"] != 0 or not (spec.path / "summary.json").exists():
                failed.append((spec, seg))
    return failed


def prepare(args) -> tuple[list[Spec], dict[str, str], dict]:
    """The study's runs (`plan`), each one's state on disk (`run_state`) and its trainer config, every config built
    (and validated) and checked against a run already on disk (`check_same_config`) before anything trains."""
    specs = plan(args)
    states, configs = {}, {}
    for s in specs:
        cfg = build_config(args.config, s.overrides)
        configs[str(s.path)] = cfg
        check_same_config(s, to_dict(cfg))
        states[str(s.path)] = run_state(s)
    return specs, states, configs


def show_plan(args, specs: list[Spec], states: dict[str, str], log=print, *, each: bool = True) -> None:
    """One line of counts (done / to resume / to start), then each run's state when ``each``."""
    counts = {k: sum(1 for v in states.values() if v == k) for k in ("done", "resume", "new")}
    log(
        f"{len(specs)} runs ({len(args.methods)} methods x {len(args.seeds)} seeds) in {Path(args.out).resolve()}: "
        f"{counts['done']} done, {counts['resume']} to resume, {counts['new']} to start; {args.workers} at a time"
    )
    if each:
        for s in specs:
            log(f"  {states[str(s.path)]:6s} {s.method} seed{s.seed}  {s.path}")


def train(args, specs: list[Spec], states: dict[str, str], configs: dict, log=print) -> list[tuple[Spec, dict]]:
    """Trains every run not done (`run_all`), the default model built once first; returns the failed runs."""
    show_plan(args, specs, states, log, each=False)
    if any(v != "done" for v in states.values()):
        prebuild_default_model(configs[str(specs[0].path)])
    return run_all(args, specs, states, log)


# ================================================================================================ report
def setup_lines(args, runs: dict) -> list[str]:
    lines = []
    any_run = next((r for rs in runs.values() for r in rs), None)
    if any_run is not None:
        c = any_run.config
        lines.append(
            f"Task and model: `data.train={c['data']['train']}` ({c['data']['n_train']} training / "
            f"{c['data']['n_heldout']} held-out problems when default), `model.path={c['model']['path']}`."
        )
        lines.append(
            f"Budget, every method: {c['steps']} steps of {c['rollout']['prompts_per_step']} prompts and "
            f"{c['rollout']['rollouts_per_step']} rollouts a step, ≤ {c['rollout']['max_new_tokens']} new tokens, "
            f"temperature {c['rollout']['temperature']}, lr {c['optim']['lr']}, seeds "
            f"{sorted({r.seed for rs in runs.values() for r in rs})}."
        )
        lines.append(
            f"Evaluation: {c['eval_samples']} samples per held-out problem at temperature "
            f"{c['eval_temperature']}, pass@k for k = {c['eval_k']}, cons@{c['eval_samples']}; validation "
            f"every {c['eval_every']} steps and at the end."
        )
        segs = [s for rs in runs.values() for r in rs for s in r.segments]
        if segs:
            loads = [x for s in segs for x in (s.get("load1_start"), s.get("load1_end")) if x is not None]
            where = sorted({s["machine"] for s in segs if s.get("machine")}) or ["not recorded"]
            lines.append(
                f"Machine: {'; '.join(where)}; {args.workers} runs at a time, torch threads "
                f"{c.get('threads')}; 1-minute load average at run start/end "
                f"{min(loads):.1f}–{max(loads):.1f}."
            )
    extra = list(args.config_overrides) + ([f"--config {args.config}"] if args.config else [])
    lines.append(
        f"Applied to every method besides the study's own settings: "
        f"{', '.join(f'`{x}`' for x in extra) if extra else 'nothing'}."
    )
    lines.append(f"Command: `{args.command_line}`.")
    return lines


def make_report(args, log=print) -> Path:
    runs = report.load_runs(Path(args.out), args.methods, args.seeds)
    if not runs:
        raise StudyError(f"no finished runs under {args.out} for methods {', '.join(args.methods)}")
    agg = report.aggregate(runs, target=args.target, seeds=args.seeds)
    agg["simulated"] = report.simulator_prediction(runs)
    meta = {
        "methods": list(args.methods),
        "setup_lines": setup_lines(args, runs),
        "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "out": str(args.out),
    }
    report.write_report(Path(args.doc), agg, meta)
    log(f"wrote {args.doc} and {Path(args.doc).parent / Path(args.doc).stem}/")
    return Path(args.doc)


# ================================================================================================ CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Defaults are the CPU study of docs/results.md; the GPU one: configs/study_gpu.yaml.",
    )
    ap.add_argument(
        "--methods", nargs="+", default=list(DEFAULT_METHODS), help="presets to train (default: %(default)s)"
    )
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds, each run once per method")
    ap.add_argument("--steps", type=int, default=120, help="training steps per run (default: %(default)s)")
    ap.add_argument("--eval-every", type=int, default=20, help="validation cadence for the curves and steps-to-target")
    ap.add_argument("--eval-samples", type=int, default=16, help="samples per held-out problem (cons@n uses all n)")
    ap.add_argument(
        "--eval-k",
        nargs="+",
        type=int,
        default=[1, 4, 8, 16],
        help="k of pass@k (those above --eval-samples are dropped)",
    )
    ap.add_argument(
        "--target",
        type=float,
        default=None,
        help="held-out pass@1 target for steps-to-target, a fraction (default: GRPO's final mean pass@1)",
    )
    ap.add_argument("--workers", type=int, default=2, help="training processes at a time (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per training process")
    ap.add_argument("--out", default="runs/study", help="run directories OUT/<method>/seed<k> (default: %(default)s)")
    ap.add_argument("--doc", default=str(ROOT / "docs" / "results.md"), help="the results document to write")
    ap.add_argument("--config", help="trainer YAML applied to every method (model, data, rollout, optim sections)")
    ap.add_argument(
        "--config-overrides",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="trainer overrides applied to every method, e.g. data.n_heldout=100",
    )
    ap.add_argument("--report-only", action="store_true", help="train nothing; rebuild the document from OUT")
    ap.add_argument("--plan", action="store_true", help="print each run's state (done / resume / new) and exit")
    args = ap.parse_args(argv)
    args.command_line = shlex.join(["python", "study/run_study.py", *(sys.argv[1:] if argv is None else argv)])
    for name in ("steps", "eval_samples", "workers", "threads"):
        if getattr(args, name) < 1:
            raise StudyError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.eval_every < 0:
        raise StudyError(f"--eval-every must be >= 0, got {args.eval_every}")
    if not eval_ks(args):
        raise StudyError(f"--eval-k {args.eval_k}: no k <= --eval-samples {args.eval_samples}")
    if args.target is not None and not 0 < args.target <= 1:
        raise StudyError(f"--target is a pass@1 fraction in (0, 1], got {args.target}")
    if len(set(args.seeds)) != len(args.seeds):
        raise StudyError(f"--seeds lists a seed twice: {args.seeds}")
    return args


def main(argv: list[str] | None = None, log=print) -> int:
    try:
        args = parse_args(argv)
        check_methods(args.methods)
        if args.report_only:
            make_report(args, log)
            return 0
        for key in check_overrides(args.config_overrides, args.config):
            log(f"note: {key} from the base of --config {args.config} is overridden by the study's {OWNED[key]}")
        specs, states, configs = prepare(args)
    except (StudyError, report.StudyDataError, ValueError, FileNotFoundError) as e:
        print(f"study: error: {e}", file=sys.stderr)
        return 2
    if args.plan:
        show_plan(args, specs, states, log)
        return 0
    failed = train(args, specs, states, configs, log)
    rc = 0
    try:
        make_report(args, log)
    except (StudyError, report.StudyDataError) as e:
        print(f"study: error: {e}", file=sys.stderr)
        rc = 2
    report_failures(failed, "study")
    return 1 if failed else rc


def report_failures(failed: list[tuple[Spec, dict]], prog: str) -> None:
    """One line on stderr per failed run: why, its log, and that the same command retries it."""
    for spec, seg in failed:
        why = seg.get("error") or f"exit {seg['rc']}"
        print(
            f"{prog}: {spec.method} seed{spec.seed} failed ({why}); log: {spec.path / 'study.log'}; run the same "
            f"command again to retry it",
            file=sys.stderr,
        )


if __name__ == "__main__":
    sys.exit(main())
