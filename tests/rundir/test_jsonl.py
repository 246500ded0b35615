"""xrpo.rundir.jsonl.read_jsonl: a run's JSONL log as a report reads it after the fact."""

from __future__ import annotations

from xrpo.rundir.jsonl import read_jsonl


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


def test_strict_refuses_a_bad_line_inside_the_file_naming_it(tmp_path):
    import pytest

    from xrpo.rundir.jsonl import read_lines

    p = tmp_path / "rounds.jsonl"
    p.write_text('{"step": 1}\n{not json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"rounds\.jsonl line 2: not valid JSON \(.*\); and why"):
        read_lines(p, strict=True, why="; and why")
    assert read_jsonl(p) == ([{"step": 1}, {"step": 2}], 1)  # tolerant: counted and skipped
    # the last line cut short by a kill is counted, also when strict
    p.write_text('{"step": 1}\n{"step": 2, "a\n')
    assert read_jsonl(p, strict=True) == ([{"step": 1}], 1)
    # ... also when blank lines follow it (they are no rows); a bad line before the last row is still refused
    p.write_text('{"step": 1}\n{"step": 2, "a\n\n  \n')
    assert read_jsonl(p, strict=True) == ([{"step": 1}], 1)
    p.write_text('{"step": 1}\n{"step": 2, "a\n\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"rounds\.jsonl line 2: not valid JSON"):
        read_lines(p, strict=True)
    # byte for byte (the resume's rewind): no row recovered from a glued line; the unreadable one kept as text
    p.write_text('{"step": 1, "a{"step": 1}\n{"st')
    lines, bad = read_lines(p, glued=False, keep_unreadable=True)
    assert bad == 2 and [(ln.number, ln.text, ln.row) for ln in lines] == [
        (1, '{"step": 1, "a{"step": 1}', None),
        (2, '{"st', None),
    ]
    lines, bad = read_lines(p, keep_unreadable=True)  # glued: the row after the fragment, with its own text
    assert bad == 2 and [(ln.number, ln.text, ln.row) for ln in lines] == [
        (1, '{"step": 1}', {"step": 1}),
        (2, '{"st', None),
    ]


def test_bytes_that_are_not_utf8_or_a_number_json_cannot_read_name_the_line(tmp_path):
    import pytest

    from xrpo.rundir.jsonl import read_lines

    p = tmp_path / "metrics.jsonl"
    p.write_bytes(b'{"step": 1}\n{"step": 2, "x": "\xe9"}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl line 2: not valid UTF-8 \(byte 0xe9\); expected UTF-8"):
        read_lines(p, strict=True)
    # an integer beyond int()'s digit limit is json's ValueError, not JSONDecodeError: an unreadable line like another
    p.write_text('{"step": 1}\n{"step": ' + "9" * 5000 + '}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl line 2: not valid JSON \(Exceeds the limit"):
        read_lines(p, strict=True)
    assert read_jsonl(p) == ([{"step": 1}, {"step": 3}], 1)
