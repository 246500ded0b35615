"""Mutation testing: each mutant of `mutants.py` must be killed by a failing assertion of the tests it names.

    python tests/mutants/run_mutants.py                 # every mutant, 2 at a time
    python tests/mutants/run_mutants.py --only kl-sign  # some of them
    python tests/mutants/run_mutants.py --list

For each mutant the runner forks a child that imports the mutated source instead of the file on disk (an import hook
serves the mutated text for that one path, to imports and to the sandbox's boot, which reads its source the same way:
the working tree is never modified, so an interrupted run leaves nothing behind) and runs ``pytest -x`` on the
mutant's tests. The outcome is the first failure:

    killed     a test failed on an assertion (``assert``, ``pytest.fail``, ``pytest.raises`` that did not raise)
    crashed    it failed on another exception (an import error, a TypeError deep in the code ...): the mutant broke
               the code so badly that no test had to look at a value, which says nothing about the tests
    survived   every test passed
    timeout    it ran longer than --timeout seconds

The run fails (exit 1) unless every mutant is killed, and refuses to start (exit 2) when a mutant's original text no
longer occurs exactly once in its file. The parent imports the third-party libraries (torch, transformers ...) and
pytest's plugins once and freezes them out of the garbage collector's sight; each child starts from that state (fork),
so a mutant costs its tests' run time, not a fresh interpreter's imports (CONTRIBUTING.md has the figures).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load_list():
    # by path: a "tests" package installed by some library would shadow this directory's
    spec = importlib.util.spec_from_file_location("xrpo_mutant_list", Path(__file__).with_name("mutants.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # NamedTuple needs its module importable
    spec.loader.exec_module(mod)
    return mod.MUTANTS, mod.Mutant


MUTANTS, Mutant = _load_list()


class StaleMutant(Exception):
    pass


def mutated_source(m: Mutant) -> str:
    """The file's text with the mutant applied; StaleMutant unless the original occurs exactly once."""
    path = ROOT / m.path
    if not path.is_file():
        raise StaleMutant(f"mutant {m.name}: {m.path} does not exist")
    text = path.read_text()
    n = text.count(m.original)
    if n != 1:
        raise StaleMutant(
            f"mutant {m.name}: its original text occurs {n} times in {m.path} (expected exactly once); "
            f"the code changed: update the mutant in tests/mutants/mutants.py\n  original: {m.original!r}"
        )
    return text.replace(m.original, m.mutated)


def _preload() -> None:
    """Import what the tests will import (xrpo's dependencies) once, in the parent, then forget xrpo itself: each
    child imports xrpo afresh, with its mutant."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import pytest  # noqa: F401
    import torch

    torch.set_num_threads(1)
    for name in (
        "xrpo.trainer.loop",
        "xrpo.models.tiny",
        "xrpo.rollout.hf_engine",
        "xrpo.icl",
        "xrpo.rewards",
        "xrpo.rollout.treepo",
        "xrpo.eval.evaluate",
        "transformers.models.qwen2.modeling_qwen2",
    ):
        importlib.import_module(name)
    # pytest's plugins (entry points) and what they import (hypothesis: 2.5 s): imported in a child after pytest
    # marked their packages for assertion rewriting, every child rewrote and compiled some 170 modules of them
    from importlib.metadata import entry_points

    for ep in entry_points(group="pytest11"):
        importlib.import_module(ep.value.split(":")[0])
    if importlib.util.find_spec("hypothesis") is not None:
        importlib.import_module("hypothesis.strategies")

    for name in [n for n in sys.modules if n == "xrpo" or n.startswith("xrpo.")]:
        del sys.modules[name]
    # what is loaded now lives as long as the children: out of the collector's sight, each child's gc.collect (pytest
    # calls it five times on exit) scans only its own objects instead of torch's and transformers' (1 s a child)
    gc.collect()
    gc.freeze()


class _Recorder:
    """pytest plugin: the first failure's test and whether it was an assertion."""

    def __init__(self):
        self.first: dict | None = None

    def _note(self, nodeid: str, when: str, excinfo) -> None:
        import pytest

        if self.first is not None:
            return
        assertion = excinfo is not None and (
            excinfo.errisinstance(AssertionError) or excinfo.errisinstance(pytest.fail.Exception)
        )
        self.first = {
            "test": nodeid,
            "when": when,
            "assertion": bool(assertion),
            "error": (excinfo.exconly().splitlines() or [""])[0][:300] if excinfo is not None else "",
        }

    def pytest_runtest_makereport(self, item, call):
        import pytest

        if call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception):
            self._note(item.nodeid, call.when, call.excinfo)

    def pytest_collectreport(self, report):
        if report.failed:
            self.first = self.first or {
                "test": report.nodeid,
                "when": "collect",
                "assertion": False,
                "error": str(report.longrepr).strip().splitlines()[-1][:300],
            }


def _child(m: Mutant, source: str, out: str) -> None:
    """In the forked child: serve the mutated source for the mutant's file, run its tests, write the outcome."""
    import pytest

    target = str((ROOT / m.path).resolve())
    data = source.encode()
    loader = importlib.machinery.SourceFileLoader
    get_data, path_stats = loader.get_data, loader.path_stats

    served = []

    def mutated_get_data(self, path):
        # every read of the file's source through the import system: imports, and the sandbox's boot, which is read
        # this way and run in another process (xrpo/sandbox/programs.py)
        if os.path.abspath(path) == target:
            served.append(path)
            return data
        return get_data(self, path)

    def mutated_path_stats(self, path):
        # a stale .pyc of the original must not be used: report a source the cache does not match
        return {"mtime": 0, "size": len(data)} if os.path.abspath(path) == target else path_stats(self, path)

    loader.get_data, loader.path_stats = mutated_get_data, mutated_path_stats
    sys.dont_write_bytecode = True
    os.chdir(ROOT)
    rec = _Recorder()
    t0 = time.perf_counter()
    code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-W", "ignore", *m.tests], plugins=[rec])
    applied = bool(served)
    Path(out).write_text(
        json.dumps({"code": int(code), "first": rec.first, "seconds": time.perf_counter() - t0, "applied": applied})
    )


def _outcome(res: dict | None) -> str:
    if res is None:
        return "crashed"
    if not res["applied"]:
        return "not-imported"
    if res["first"] is None:
        return "survived" if res["code"] == 0 else "crashed"
    return "killed" if res["first"]["assertion"] else "crashed"


def run(mutants: list[Mutant], jobs: int, timeout: float, log=print) -> list[dict]:
    sources = {m.name: mutated_source(m) for m in mutants}  # every mutant applies, or nothing runs
    _preload()
    results: list[dict] = []
    pending = list(mutants)
    running: dict[int, tuple[Mutant, str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="xrpo-mutants-") as tmp:
        while pending or running:
            while pending and len(running) < jobs:
                m = pending.pop(0)
                out = os.path.join(tmp, f"{m.name}.json")
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:  # child
                    try:
                        devnull = os.open(os.devnull, os.O_WRONLY)
                        os.dup2(devnull, 1)
                        os.dup2(devnull, 2)
                        _child(m, sources[m.name], out)
                    finally:
                        os._exit(0)
                running[pid] = (m, out, time.perf_counter())
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                for p, (_m, _, t0) in list(running.items()):
                    if time.perf_counter() - t0 > timeout:
                        os.kill(p, 9)
                time.sleep(0.05)
                continue
            m, out, t0 = running.pop(pid)
            res = json.loads(Path(out).read_text()) if os.path.exists(out) else None
            outcome = _outcome(res) if time.perf_counter() - t0 <= timeout else "timeout"
            row = {
                "mutant": m.name,
                "path": m.path,
                "outcome": outcome,
                "seconds": time.perf_counter() - t0,
                "test": (res or {}).get("first", None) and res["first"]["test"],
                "error": (res or {}).get("first", None) and res["first"]["error"],
            }
            results.append(row)
            log(
                f"{outcome:9s} {row['seconds']:6.1f}s  {m.name:42s} {row['test'] or ''}"
                + ("" if outcome == "killed" else f"\n          {row['error'] or m.why}")
            )
    gc.unfreeze()  # (frozen objects outlive the interpreter's last collection: nanobind then reports leaks)
    order = {m.name: i for i, m in enumerate(mutants)}
    return sorted(results, key=lambda r: order[r["mutant"]])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run these mutants only")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="mutants run at once (default 2)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one mutant's tests may take")
    ap.add_argument("--json", metavar="FILE", help="also write the results here")
    args = ap.parse_args(argv)
    chosen = list(MUTANTS)
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in MUTANTS})
        if unknown:
            print(f"unknown mutant(s) {', '.join(unknown)}; see --list", file=sys.stderr)
            return 2
        chosen = [m for m in MUTANTS if m.name in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.name:42s} {m.path:28s} {' '.join(m.tests)}\n    {m.why}")
        return 0
    t0 = time.perf_counter()
    try:
        results = run(chosen, args.jobs, args.timeout)
    except StaleMutant as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    killed = sum(r["outcome"] == "killed" for r in results)
    print(
        f"\nkill rate: {killed}/{len(results)} mutants killed by a failing assertion "
        f"({time.perf_counter() - t0:.0f}s, {args.jobs} at a time)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
