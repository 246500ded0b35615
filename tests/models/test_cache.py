"""xrpo.models.cache.build_once: a cache directory is built once however many processes ask for it at the same time,
is never seen half-written, and a failed build leaves nothing behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from xrpo.models.cache import MARKER, build_once, is_complete

REPO = Path(__file__).resolve().parents[2]


def _run_at_once(code: str, n: int) -> list[str]:
    pipe = subprocess.PIPE
    procs = [
        subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=pipe, stderr=pipe, text=True) for _ in range(n)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        outs.append(out)
    return outs


def test_processes_asking_at_once_build_it_once(tmp_path):
    final = tmp_path / "cache" / "model"
    code = textwrap.dedent(f"""
        import os, time
        from pathlib import Path
        from xrpo.models.cache import build_once, is_complete

        def build(tmp):
            with open({str(tmp_path / "builds.txt")!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            time.sleep(1.0)  # long enough for the other processes to arrive while it builds
            (tmp / "weights").write_text("w")

        out = build_once(Path({str(final)!r}), build)
        print(out, is_complete(out), (out / "weights").read_text())
    """)
    outs = _run_at_once(code, 3)
    assert [o.split() for o in outs] == [[str(final), "True", "w"]] * 3
    assert len((tmp_path / "builds.txt").read_text().splitlines()) == 1
    assert sorted(p.name for p in final.parent.iterdir()) == ["model", "model.lock"]  # no temporary directory left


def test_a_complete_directory_is_kept_and_rebuild_replaces_it(tmp_path):
    calls = []

    def build(tmp):
        calls.append(tmp)
        (tmp / "weights").write_text(str(len(calls)))

    final = tmp_path / "m"
    assert build_once(final, build, marker="src\n") == final
    assert (final / MARKER).read_text() == "src\n" and (final / "weights").read_text() == "1"
    build_once(final, build)
    assert len(calls) == 1
    build_once(final, build, rebuild=True)
    assert len(calls) == 2 and (final / "weights").read_text() == "2"


def test_a_failed_build_leaves_nothing_and_an_incomplete_directory_is_rebuilt(tmp_path):
    final = tmp_path / "m"

    def fails(tmp):
        (tmp / "weights").write_text("half")
        raise RuntimeError("out of disk")

    with pytest.raises(RuntimeError, match="out of disk"):
        build_once(final, fails)
    assert not final.exists() and [p.name for p in tmp_path.iterdir()] == ["m.lock"]
    final.mkdir()  # a directory without the marker (e.g. copied by hand, half-way): not a finished one
    (final / "weights").write_text("partial")
    assert not is_complete(final)
    build_once(final, lambda tmp: (tmp / "weights").write_text("whole"))
    assert is_complete(final) and (final / "weights").read_text() == "whole"


def test_the_default_model_is_built_once_by_runs_started_together(tmp_path):
    # the real path of `xrpo train` on a fresh machine, two runs at once: one builds, the other waits and loads it
    code = textwrap.dedent(f"""
        from pathlib import Path
        from xrpo.models.default import ensure_default_model
        print(ensure_default_model(Path({str(tmp_path)!r}), warmup_steps=2, log=lambda m: print("LOG", m)))
    """)
    outs = _run_at_once(code, 2)
    built = [ln for o in outs for ln in o.splitlines() if ln.startswith("LOG building the default model")]
    assert len(built) == 1, outs
    paths = {o.splitlines()[-1] for o in outs}
    assert len(paths) == 1 and is_complete(Path(paths.pop()))
