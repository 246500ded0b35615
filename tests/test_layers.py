"""Dependencies point one way (CONTRIBUTING.md): each floor of the package imports only the floors below it, and no
two modules import each other, directly or round a circle. Every ``import xrpo...`` in a module counts,
function-level (lazy) and ``TYPE_CHECKING`` imports included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "xrpo"

BELOW = {
    "algo": set(),
    "sandbox": set(),
    "data": {"algo"},
    "icl": {"algo"},
    "rewards": {"algo", "sandbox"},
    "models": {"algo", "data"},
}
BELOW["rollout"] = set().union(*BELOW.values(), BELOW) - {"rollout"}
BELOW["trainer"] = BELOW["rollout"] | {"rollout"}
TOP = {"eval", "integrations", "sim", "cli", "__init__"}  # they may import any floor


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


def test_every_floor_imports_only_the_floors_below_it():
    floors = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert floors <= set(BELOW) | TOP, f"a new subpackage needs its place in BELOW or TOP: {floors - set(BELOW) - TOP}"
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        floor = parts[0] if len(parts) > 1 else path.stem
        if floor in TOP:
            continue
        for dst in sorted(imports(path) - {floor} - BELOW[floor]):
            wrong.append(f"{path.relative_to(ROOT.parent)} ({floor}) imports xrpo.{dst}")
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_lazy_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from xrpo.trainer.loop import train\n    import xrpo.rollout.engine\n")
    assert imports(f) == {"trainer", "rollout"}


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
