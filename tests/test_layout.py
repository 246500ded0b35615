"""The tests mirror the package: ``xrpo/<pkg>/<module>.py`` is tested in ``tests/<pkg>/test_<module>*.py`` (a private
``_module.py`` in ``test_module*.py``; ``xrpo/cli.py`` in ``tests/test_cli*.py``). A module tested through another
entry point is listed in ELSEWHERE with the files that test it and why; an entry that is no longer needed, or that
names a file that does not exist, fails too, so the list cannot rot."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# module -> (the test files that test it, why not its own file)
ELSEWHERE: dict[str, tuple[tuple[str, ...], str]] = {
    "xrpo/trainer/loop.py": (
        ("tests/trainer/test_train.py", "tests/trainer/test_direction.py", "tests/trainer/test_resume.py"),
        "the loop is tested through train(cfg, on_step=...), its public entry point",
    ),
    "xrpo/trainer/setup.py": (
        ("tests/trainer/test_train.py", "tests/trainer/test_config.py"),
        "maps a TrainConfig onto the builders of xrpo.models.loading and xrpo.rollout.build, tested through train()",
    ),
    "xrpo/trainer/config_loader.py": (
        ("tests/trainer/test_config.py",),
        "building a TrainConfig (presets, YAML, overrides, to/from dict) is tested beside the schema it fills",
    ),
    "xrpo/rundir/fields.py": (
        ("tests/trainer/test_config.py", "tests/test_cli_simulate.py", "tests/test_cli_eval.py"),
        "field docstrings and type conversion, tested through the configs and command lines that use them",
    ),
    "xrpo/rundir/yamlfile.py": (
        ("tests/trainer/test_config.py", "tests/test_cli_simulate.py", "tests/eval/test_report.py"),
        "the YAML reader, tested through the files read with it: trainer configs, `xrpo simulate --config`, a "
        "run's config.yaml in `xrpo report`",
    ),
    "xrpo/eval/build.py": (
        ("tests/eval/test_evaluate.py",),
        "what evaluate() samples with, tested through evaluate()",
    ),
    "xrpo/eval/icl.py": (
        ("tests/eval/test_evaluate.py", "tests/eval/test_store.py"),
        "test-time ICL, tested through evaluate(--icl-corpus) and its resume store",
    ),
    "xrpo/eval/results.py": (
        ("tests/eval/test_evaluate.py",),
        "results.json / results.md, written and read back by evaluate()'s tests",
    ),
    "xrpo/eval/plots.py": (
        ("tests/eval/test_report.py",),
        "the PNGs are written by xrpo report / eval, whose tests open them",
    ),
    "xrpo/rollout/step.py": (
        ("tests/rollout/test_planner.py", "tests/rollout/test_streaming.py"),
        "a step's rollouts as they arrive: driven by the rounds and streaming schedules, tested through both",
    ),
    "xrpo/data/writers.py": (
        ("tests/data/test_loaders.py",),
        "saving problems (JSONL, verl parquet), tested by reading them back with the loaders",
    ),
    "xrpo/sim/methods.py": (
        ("tests/sim/test_runner.py", "tests/sim/test_alloc_sim.py"),
        "the registry of simulated methods, each a call of the library's rule: run by the runner's tests and, for the "
        "methods beyond the paper, test_alloc_sim",
    ),
    "xrpo/sim/tables.py": (
        ("tests/sim/test_runner.py", "tests/test_cli_simulate.py"),
        "the simulator's Markdown tables and run_cli's outputs, checked through the runner and the CLI",
    ),
    "xrpo/sim/model.py": (
        ("tests/algo/test_simulate.py", "tests/rollout/test_planner.py"),
        "the simulator's core, tested where it was written (before it moved out of xrpo.algo.simulate) and against "
        "the planner on the same rewards",
    ),
    "xrpo/sim/rates.py": (
        ("tests/sim/test_runner.py",),
        "the success rates of --dist and --rounds-file, tested through the runner that draws from them",
    ),
    "xrpo/sim/latency.py": (
        ("tests/algo/test_simulate.py",),
        "the latency models, tested with the rest of the simulator's core",
    ),
    "xrpo/algo/signal.py": (
        ("tests/algo/test_simulate.py", "tests/sim/test_runner.py"),
        "the expected signal and the best fixed allocation, tested with the simulator's oracles",
    ),
    "xrpo/sim/plots.py": (
        ("tests/sim/test_runner.py", "tests/test_cli_simulate.py"),
        "the simulator's PNGs, written by its runner and CLI",
    ),
    "xrpo/integrations/verl/agent_loop.py": (
        ("tests/integrations/verl/test_trainer.py", "tests/integrations/verl/test_plugin.py"),
        "verl's agent-loop worker runs it: tested inside verl's own AgentLoopWorker and through its registration",
    ),
    "xrpo/integrations/verl/main.py": (
        ("tests/integrations/verl/test_config.py",),
        "the launcher: its config checks and composition are tested; the Ray run itself needs GPUs",
    ),
    "xrpo/sandbox/_boot.py": (
        (
            "tests/sandbox/test_programs.py",
            "tests/sandbox/test_programs_kernel_memory.py",
            "tests/rewards/test_code_adversarial.py",
        ),
        "runs inside the sandboxed child; tested through run_program and attack programs",
    ),
    "xrpo/sandbox/stream.py": (
        ("tests/sandbox/test_programs_protocol.py", "tests/sandbox/test_programs.py"),
        "the caller's reader of the boot's stream: malformed streams directly, the rest through run_program",
    ),
    "xrpo/sandbox/_boot_isolation.py": (
        ("tests/sandbox/test_programs.py", "tests/sandbox/test_programs_kernel_memory.py"),
        "the boot's isolation layers, run inside the sandboxed child; tested through run_program's reported layers "
        "and attack programs",
    ),
    "xrpo/sandbox/_boot_harness.py": (
        (
            "tests/sandbox/test_programs.py",
            "tests/sandbox/test_programs_honest.py",
            "tests/rewards/test_code_adversarial.py",
        ),
        "the boot's test harness, run inside the sandboxed child; tested through run_program",
    ),
    "xrpo/sandbox/_boot_program.py": (
        ("tests/sandbox/test_programs_honest.py", "tests/rewards/test_code_differential.py"),
        "the program's process inside the sandboxed child (its interpreter, its end); tested through run_program and "
        "a corpus run both plainly and in the sandbox",
    ),
    "xrpo/sandbox/_boot_check.py": (
        ("tests/sandbox/test_programs_protocol.py", "tests/sandbox/test_programs.py"),
        "check mode inside the sandboxed child: its message framing directly, the rest through run_program",
    ),
    "xrpo/sandbox/_pool_worker.py": (
        ("tests/sandbox/test_pool.py",),
        "the worker pool's child process, tested through the pool",
    ),
}

# test directories that mirror no package directory, and why
NOT_A_PACKAGE = {
    "tests/mutants": "mutation testing of the whole tree",
}


def modules() -> list[Path]:
    return sorted(p for p in (ROOT / "xrpo").rglob("*.py") if p.name != "__init__.py")


def own_tests(module: Path) -> list[Path]:
    rel = module.relative_to(ROOT / "xrpo")
    where = ROOT / "tests" / rel.parent
    return sorted(where.glob(f"test_{module.stem.lstrip('_')}*.py"))


def test_every_module_has_its_test_file_or_says_where_it_is_tested():
    missing, stale = [], []
    for m in modules():
        key = m.relative_to(ROOT).as_posix()
        if own_tests(m):
            if key in ELSEWHERE:
                stale.append(f"{key} has its own test file now: drop it from ELSEWHERE")
        elif key not in ELSEWHERE:
            missing.append(f"{key}: add tests/{Path(key).parent.relative_to('xrpo')}/test_{m.stem.lstrip('_')}.py")
    for key, (files, why) in ELSEWHERE.items():
        if not (ROOT / key).is_file():
            stale.append(f"{key} is gone: drop it from ELSEWHERE")
        assert why, key
        stale += [f"{key}: {f} does not exist" for f in files if not (ROOT / f).is_file()]
    assert not missing and not stale, "\n".join(missing + stale)


def test_every_test_directory_mirrors_a_package_directory():
    strays = []
    for d in sorted(p for p in (ROOT / "tests").rglob("*") if p.is_dir() and p.name != "__pycache__"):
        rel = d.relative_to(ROOT / "tests")
        key = d.relative_to(ROOT).as_posix()
        if key in NOT_A_PACKAGE or any(key.startswith(k + "/") for k in NOT_A_PACKAGE):
            continue
        # tests/study and tests/benchmarks mirror the top-level study/ (the comparative study) and benchmarks/ (the
        # GPU check's CPU rehearsal) directories, the rest mirror xrpo/
        if not ((ROOT / "xrpo" / rel).is_dir() or (ROOT / rel).is_dir() and rel.parts[0] in ("study", "benchmarks")):
            strays.append(key)
    assert not strays, f"test directories with no package directory: {strays}"
