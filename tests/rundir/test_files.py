"""xrpo.rundir.files: an atomic write replaces the file whole and leaves no temporary file behind."""

from __future__ import annotations

from xrpo.rundir.files import write_atomic


def test_write_atomic_replaces_the_file_and_leaves_nothing_else(tmp_path):
    p = tmp_path / "f.json"
    write_atomic(p, "old")
    write_atomic(p, b"new")
    assert p.read_bytes() == b"new" and sorted(x.name for x in tmp_path.iterdir()) == ["f.json"]
