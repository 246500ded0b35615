"""The sandbox is a floor of its own (CONTRIBUTING.md): it imports nothing of xrpo, so the verifiers build on it and
it never reaches back into them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import xrpo.sandbox

PACKAGE = Path(xrpo.sandbox.__file__).parent


def test_no_module_of_the_sandbox_imports_the_rest_of_xrpo():
    outside = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            outside += [
                f"{path.name}: {n}"
                for n in names
                if n.split(".")[0] == "xrpo" and n.split(".")[:2] != ["xrpo", "sandbox"]
            ]
    assert outside == []
    # and importing it loads nothing else of xrpo (a pool's template process starts from this package alone)
    code = (
        f"import sys; sys.path.insert(0, {str(PACKAGE.parents[1])!r}); import xrpo.sandbox; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'xrpo'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert eval(out) == [
        "xrpo",
        "xrpo.sandbox",
        "xrpo.sandbox.cleanup",
        "xrpo.sandbox.pool",
        "xrpo.sandbox.programs",
        "xrpo.sandbox.stream",
    ]
