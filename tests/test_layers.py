"""Dependencies point one way (CONTRIBUTING.md): each floor of the package imports only the floors below it, and no
two modules import each other, directly or round a circle. Every ``import xrpo...`` in a module counts,
function-level (lazy) and ``TYPE_CHECKING`` imports included.

The floors, bottom up: algo and sandbox; rundir (what reads and writes a run directory), data and icl; rewards and
models; rollout; trainer; and on top eval, integrations (verl), sim and cli. The simulator needs no model: nothing
it reaches is of the trainer, the rollouts or the models. The floors on top take from the trainer only the names of
TRAINER_API; the rest of the trainer is its own, and a run directory is read and written through rundir."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import fresh_python

ROOT = Path(__file__).resolve().parents[1] / "xrpo"

BELOW = {
    "algo": set(),
    "sandbox": set(),
    "rundir": {"algo"},
    "data": {"algo"},
    "icl": {"algo"},
    "rewards": {"algo", "sandbox"},
    "models": {"algo", "data"},
}
BELOW["rollout"] = set().union(*BELOW.values(), BELOW) - {"rollout"}
BELOW["trainer"] = BELOW["rollout"] | {"rollout"}
# the floors on top
BELOW["eval"] = BELOW["trainer"] | {"trainer"}  # of the trainer, TRAINER_API["eval"] only
BELOW["integrations"] = set(BELOW["trainer"])
BELOW["sim"] = {"algo", "rundir", "eval"}  # of eval, its plotting helpers (test_the_simulator_needs_no_model)
BELOW["cli"] = set(BELOW)  # of the trainer, TRAINER_API["cli"] only
TOP = {"__init__"}  # the package's face: it imports nothing

# What the floors on top may import from the trainer, by name (``module.name``); nothing else of it.
TRAINER_API: dict[str, set[str]] = {
    # `xrpo train`: its config built from --config and key=value (and --help's text, --check's checks), the run, and
    # the stops it reports
    "cli": {
        "xrpo.trainer.config_loader.build_config",
        "xrpo.trainer.preflight.check_config",
        "xrpo.trainer.config_loader.help_text",
        "xrpo.trainer.loop.train",
        "xrpo.trainer.loop.TrainingStopped",
        "xrpo.trainer.loop.NoLearningSignal",
    },
    # `xrpo eval RUN`: the run's settings (its config.yaml as the trainer reads it back) and, for a model that is not
    # a run, the trainer's defaults; the run's checkpoints are found through rundir
    "eval": {"xrpo.trainer.config.TrainConfig", "xrpo.trainer.config_loader.load_run_config"},
    "integrations": set(),
    "sim": set(),
}


def imports(path: Path) -> set[str]:
    """The xrpo subpackages ``path`` imports."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        out |= {n.split(".")[1] for n in names if n.startswith("xrpo.")}
    return out


def floor_of(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else path.stem


def test_every_floor_imports_only_the_floors_below_it():
    floors = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    floors |= {p.stem for p in ROOT.glob("*.py")}
    assert floors <= set(BELOW) | TOP, f"a new subpackage needs its place in BELOW or TOP: {floors - set(BELOW) - TOP}"
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        floor = floor_of(path)
        allowed = set() if floor in TOP else BELOW[floor]
        for dst in sorted(imports(path) - {floor} - allowed):
            wrong.append(f"{path.relative_to(ROOT.parent)} ({floor}) imports xrpo.{dst}")
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_lazy_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from xrpo.trainer.loop import train\n    import xrpo.rollout.engine\n")
    assert imports(f) == {"trainer", "rollout"}


def trainer_names(path: Path) -> list[str]:
    """What ``path`` imports from the trainer: ``module.name`` for ``from xrpo.trainer.module import name`` (and
    ``xrpo.trainer.module`` for ``from xrpo.trainer import module``), the module for ``import xrpo.trainer.module``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[:2]
            == [
                "xrpo",
                "trainer",
            ]
        ):
            out += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[:2] == ["xrpo", "trainer"]]
    return out


def trainer_internals(root: Path = ROOT) -> list[str]:
    """Imports of the trainer from the floors on top that are not in their TRAINER_API."""
    wrong = []
    for path in sorted(root.rglob("*.py")):
        floor = floor_of(path, root)
        if floor in TRAINER_API:
            wrong += [
                f"{path.relative_to(root.parent)}: {name}"
                for name in trainer_names(path)
                if name not in TRAINER_API[floor]
            ]
    return wrong


def test_the_floors_on_top_take_only_the_trainers_api():
    wrong = trainer_internals()
    assert not wrong, "trainer internals imported from above it (read and write run files through xrpo.rundir): " + (
        "; ".join(wrong)
    )


def test_the_trainer_api_check_sees_internals(tmp_path):
    pkg = tmp_path / "xrpo"
    for floor in ("eval", "sim", "integrations"):
        (pkg / floor).mkdir(parents=True)
    (pkg / "cli.py").write_text(
        "from xrpo.trainer.loop import TrainingStopped, train\nfrom xrpo.trainer.checkpoint import save_checkpoint\n"
    )
    (pkg / "eval" / "m.py").write_text(
        "def f():\n    from xrpo.trainer.config import TrainConfig\n    from xrpo.trainer import checkpoint\n"
    )
    (pkg / "sim" / "m.py").write_text("import xrpo.trainer.records\n")
    (pkg / "integrations" / "m.py").write_text("from xrpo.trainer.config_loader import build_config\n")
    assert trainer_internals(pkg) == [
        "xrpo/cli.py: xrpo.trainer.checkpoint.save_checkpoint",
        "xrpo/eval/m.py: xrpo.trainer.checkpoint",
        "xrpo/integrations/m.py: xrpo.trainer.config_loader.build_config",
        "xrpo/sim/m.py: xrpo.trainer.records",
    ]


# ---------------------------------------------------------------------------------------------------------------
# no import circles between modules, inside a floor or across (a lazy or TYPE_CHECKING import counts too)
# ---------------------------------------------------------------------------------------------------------------


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports. ``from pkg import name`` imports module ``pkg.name`` when that
    is a module, else ``pkg`` (its ``__init__``)."""
    mods = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    top = root.name
    graph = {}
    for mod, path in mods.items():
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    out.add(full if full in mods else node.module)
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
        graph[mod] = {m for m in out if m in mods and m != mod and m.split(".")[0] == top}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    circles = import_circles(module_graph())
    assert not circles, "modules that import each other (directly or round a circle): " + "; ".join(
        " <-> ".join(c) for c in circles
    )


def reached(graph: dict[str, set[str]], start: set[str]) -> set[str]:
    """Every module importing ``start`` runs: what they import, directly or through others, and the packages
    (``__init__``) above each."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        parts = mod.split(".")
        todo += [m for m in graph.get(mod, ())] + [".".join(parts[:i]) for i in range(1, len(parts))]
    return seen


NO_MODEL = {"trainer", "rollout", "models"}  # the floors that sample from, train or load a model


def test_the_simulator_needs_no_model():
    graph = module_graph()
    sim = {m for m in graph if m.split(".")[:2] == ["xrpo", "sim"]}
    found = sorted(m for m in reached(graph, sim) if m.split(".")[1:2] and m.split(".")[1] in NO_MODEL)
    assert not found, f"xrpo.sim reaches {found}: it works from success rates alone"


def test_the_reach_check_follows_imports_through_other_modules():
    graph = {
        "xrpo.sim.a": {"xrpo.eval.plots"},
        "xrpo.eval.plots": {"xrpo.algo.x"},
        "xrpo.eval": {"xrpo.rollout.engine"},
        "xrpo.algo.x": set(),
    }
    assert reached(graph, {"xrpo.sim.a"}) == {
        "xrpo",
        "xrpo.sim",
        "xrpo.sim.a",
        "xrpo.eval",
        "xrpo.eval.plots",
        "xrpo.rollout",
        "xrpo.rollout.engine",
        "xrpo.algo",
        "xrpo.algo.x",
    }


def test_the_circle_check_sees_lazy_and_type_checking_imports(tmp_path):
    pkg = tmp_path / "xrpo"
    (pkg / "rollout").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "rollout" / "__init__.py").write_text("")
    (pkg / "rollout" / "a.py").write_text("from xrpo.rollout.b import f\n")
    (pkg / "rollout" / "b.py").write_text("def f():\n    from xrpo.rollout import c\n")
    (pkg / "rollout" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from xrpo.rollout.a import g\n"
    )
    (pkg / "rollout" / "d.py").write_text("import xrpo.rollout.a\n")
    graph = module_graph(pkg)
    assert graph["xrpo.rollout.b"] == {"xrpo.rollout.c"} and graph["xrpo.rollout.d"] == {"xrpo.rollout.a"}
    assert import_circles(graph) == [["xrpo.rollout.a", "xrpo.rollout.b", "xrpo.rollout.c"]]
    (pkg / "rollout" / "c.py").write_text("")
    assert import_circles(module_graph(pkg)) == []


def private_imports(root: Path = ROOT) -> list[str]:
    """``from xrpo.<module> import _name`` anywhere under ``root``: a private name used outside its module (dunders
    such as ``__version__`` are public)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("xrpo"):
                private = [a.name for a in node.names if a.name[0] == "_" and a.name[:2] != "__"]
                out += [f"{path.relative_to(root.parent)}: {node.module}.{name}" for name in private]
    return out


def test_no_private_names_imported_across_modules(tmp_path):
    assert not private_imports(), "make them public or keep them in their module: " + "; ".join(private_imports())
    (tmp_path / "xrpo").mkdir()
    (tmp_path / "xrpo" / "m.py").write_text("def f():\n    from xrpo.rollout.planner import _is_nonuniform\n")
    assert private_imports(tmp_path / "xrpo") == ["xrpo/m.py: xrpo.rollout.planner._is_nonuniform"]


def test_reading_a_config_imports_no_torch():
    """`xrpo --help`, and a config read and checked (where a bad key or value is reported), load no model library:
    the loss's and the planner's choices are declared in `xrpo.algo.config`, and torch comes only with the run
    (about 1 s against 8 s on a 2-core machine). Run in a fresh interpreter, whatever this one imported."""
    code = (
        "import sys, xrpo.cli\n"
        "xrpo.cli.build_parser()\n"
        "from xrpo.trainer.config_loader import build_config\n"
        "build_config(None, ['method.name=xrpo-plus', 'method.loss_agg=seq-mean-token-mean'])\n"
        "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))\n"
    )
    imported = fresh_python(code)
    assert imported == "[]", f"reading a config imported {imported}"
