"""Dependencies point one way (CONTRIBUTING.md): each floor of the package imports only the floors below it. Every
``import xrpo...`` in a module counts, function-level (lazy) imports included."""

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
