"""xrpo.trainer.jsonl.read_jsonl: a run's JSONL log as a report reads it after the fact."""

from __future__ import annotations

from xrpo.trainer.jsonl import read_jsonl


def test_rows_and_unreadable_lines(tmp_path):
    p = tmp_path / "metrics.jsonl"
    assert read_jsonl(p) == ([], 0)  # no file yet: nothing logged
    # a killed writer left '{"step": 3, "a' and the resumed run appended step 3 again right after it; an empty line
    # is skipped; a partial line with no row after it is counted and dropped
    p.write_text(
        '{"step": 1, "a": 1}\n\n{"step": 2, "a": 2}\n{"step": 3, "a{"step": 3, "a": 30}\n{"step": 4, "a": 4}\n{"st\n'
    )
    rows, bad = read_jsonl(p)
    assert bad == 2
    assert rows == [{"step": 1, "a": 1}, {"step": 2, "a": 2}, {"step": 3, "a": 30}, {"step": 4, "a": 4}]
