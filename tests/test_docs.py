"""The docs name code, files and tests that exist: every `xrpo.<module>...` name in docs/*.md, README.md and
CONTRIBUTING.md resolves in the source tree, every repository path they name exists, and every test
docs/paper_map.md cites (`tests/x.py::test_y`, or `::test_y` for the file named last before it in the same section)
is defined there.

Resolved statically (the source's syntax tree: no module is imported, so names in the optional verl and vLLM
integrations are checked without those extras)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
PAPER_MAP = ROOT / "docs" / "paper_map.md"


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body binds: defs, classes, assignments (annotated too) and imports."""
    out: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out[n.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                out[(a.asname or a.name).split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try)):  # names bound under `if TYPE_CHECKING:` / `try: import`
            out.update(_defined(node.body))
    return out


def _module_path(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def resolves(name: str) -> bool:
    """``xrpo.a.b.C.d``: the longest prefix that is a module file, then attributes of its top level and classes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        path = _module_path(parts[:i])
        if path is not None:
            break
    else:
        return False
    body = _tree(path).body
    for attr in parts[i:]:
        node = _defined(body).get(attr)
        if node is None:
            return False
        if not isinstance(node, ast.ClassDef):
            # a function, a constant or an imported name: accepted as it is, and what follows is not resolved (an
            # attribute of a returned object, a dict key, a name in the module an import came from)
            return True
        body = node.body
    return True


def _subpackages() -> set[str]:
    return {p.stem if p.suffix == ".py" else p.name for p in (ROOT / "xrpo").iterdir() if not p.name.startswith("_")}


def doc_names(text: str) -> list[str]:
    """`xrpo.<sub>...` names in backticks whose first part is a module of the package (metric names such as
    `xrpo.flips`, a tracker tag, are not code)."""
    subs = _subpackages()
    names = re.findall(r"`(xrpo(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(\*?)", text)
    # a pattern such as `xrpo.rollout.vllm_support.check_*` names several functions: not checked
    return [n for n, star in names if n.split(".")[1] in subs and not star]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_code_names_in_the_docs_exist(doc):
    missing = sorted({n for n in doc_names(doc.read_text(encoding="utf-8")) if not resolves(n)})
    assert not missing, f"{doc.relative_to(ROOT)} names code that does not exist: {missing}"


def doc_paths(text: str) -> list[str]:
    """Paths of the repository in backticks (`benchmarks/bench_step.py`, `configs/x.yaml`, `tests/a.py::test_b`);
    patterns (``*``, ``<run>``) are not checked."""
    found = re.findall(
        r"`((?:xrpo|tests|benchmarks|scripts|configs|examples|study|docs|\.ci)/[\w./-]+?)(?:::[^`]*)?`", text
    )
    return [p.rstrip("/") for p in found if "*" not in p and "<" not in p]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_paths_in_the_docs_exist(doc):
    missing = sorted({p for p in doc_paths(doc.read_text(encoding="utf-8")) if not (ROOT / p).exists()})
    assert not missing, f"{doc.relative_to(ROOT)} names files that do not exist: {missing}"


def _test_functions(path: Path) -> set[str]:
    return {n.name for n in ast.walk(_tree(path)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def paper_map_tests(text: str) -> list[tuple[str, str | None]]:
    """(test file, test name or None) for each citation; ``::name`` takes the file cited last before it in the same
    section (a heading starts a new one)."""
    out, current = [], None
    for line in text.splitlines():
        if line.startswith("#"):
            current = None
        for m in re.finditer(r"`(tests/[\w/]+\.py)(?:::([\w\[\]*-]+))?`|`::([\w\[\]*-]+)`", line):
            if m.group(1):
                current = m.group(1)
                out.append((current, m.group(2)))
            else:
                out.append((current, m.group(3)))
    return out


def test_every_test_the_paper_map_cites_exists():
    bad = []
    for file, name in paper_map_tests(PAPER_MAP.read_text(encoding="utf-8")):
        if file is None:
            bad.append(f"::{name} cites no file before it in its section")
            continue
        path = ROOT / file
        if not path.is_file():
            bad.append(f"{file} does not exist")
            continue
        if name is None:
            continue
        base = name.split("[")[0]  # a parametrized id
        defined = _test_functions(path)
        ok = any(d.startswith(base[:-1]) for d in defined) if base.endswith("*") else base in defined
        if not ok:
            bad.append(f"{file}::{name} is not defined there")
    assert not bad, "docs/paper_map.md:\n" + "\n".join(bad)


def test_the_checks_catch_what_they_are_for():
    assert resolves("xrpo.algo.allocation.allocation_priority")
    assert resolves("xrpo.algo.config.ICLPromptConfig.icl_train_prompt")  # a dataclass field
    assert not resolves("xrpo.algo.group_advantages")  # the name docs/verl.md had (it is xrpo.algo.advantages')
    assert not resolves("xrpo.algo.config.ICLPromptConfig.no_such_field")
    assert doc_names("`xrpo.flips`, `xrpo.algo.passk.pass_at_k`, `xrpo.a.check_*`") == ["xrpo.algo.passk.pass_at_k"]
    assert doc_paths("`configs/a.yaml`, `tests/b.py::test_c`, `runs/<id>/`, `docs/*.md`") == [
        "configs/a.yaml",
        "tests/b.py",
    ]
    cites = paper_map_tests("## A\n| `tests/a.py::test_x`, `::test_y` |\n| `::test_z` |\n## B\n| `::test_w` |")
    assert cites == [("tests/a.py", "test_x"), ("tests/a.py", "test_y"), ("tests/a.py", "test_z"), (None, "test_w")]
