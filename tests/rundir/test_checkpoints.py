"""xrpo.rundir.checkpoints: which directories are checkpoints, which one a resume picks, what a new run refuses, and
state.json read and updated. Writing a checkpoint: tests/trainer/test_checkpoint.py."""

from __future__ import annotations

import json

import pytest

from xrpo.rundir.checkpoints import (
    MARKER,
    CheckpointError,
    checkpoint_dir,
    find_resume_checkpoint,
    list_checkpoints,
    load_state,
    refuse_existing_run,
    set_aside_later_checkpoints,
    update_state,
)


def fake_checkpoint(out, step, complete=True):
    d = checkpoint_dir(out, step)
    d.mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"step": step}))
    if complete:
        (d / MARKER).write_text("ok\n")
    return d


def test_list_checkpoints_only_complete_ones_in_step_order(tmp_path):
    assert list_checkpoints(tmp_path) == []
    for s in (10, 9, 100):
        fake_checkpoint(tmp_path, s)
    fake_checkpoint(tmp_path, 200, complete=False)  # killed before its marker
    (tmp_path / "checkpoints" / "discarded-step-00000300").mkdir()
    assert [int(p.name.split("-")[1]) for p in list_checkpoints(tmp_path)] == [9, 10, 100]


def test_resume_picks_the_latest_complete_checkpoint_or_says_why_not(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        find_resume_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="is not a checkpoint"):
        find_resume_checkpoint(tmp_path)
    (tmp_path / "config.yaml").write_text("steps: 3\n")
    with pytest.raises(CheckpointError, match="no complete checkpoint yet.*xrpo train --config"):
        find_resume_checkpoint(tmp_path)
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 5)
    fake_checkpoint(tmp_path, 7, complete=False)
    assert find_resume_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 5)
    assert find_resume_checkpoint(checkpoint_dir(tmp_path, 2)) == checkpoint_dir(tmp_path, 2)  # a checkpoint itself


def test_a_damaged_state_json_is_refused_naming_the_file(tmp_path):
    d = fake_checkpoint(tmp_path, 2)
    for text, match in [
        ('{"step": 2, "samp', r"checkpoint .*step-00000002: state\.json unreadable"),
        ("[1, 2]", r"step-00000002/state\.json: expected a JSON object, got list"),
        ('{"step": "2"}', r"step-00000002/state\.json: field 'step' must be an integer >= 0, got '2'"),
        (b'{"step": 2, "x": "\xe9"}', r"state\.json unreadable: 'utf-8' codec"),
    ]:
        (d / "state.json").write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(CheckpointError, match=match):
            load_state(d)


def test_later_checkpoints_are_set_aside_not_deleted(tmp_path):
    for s in (1, 2, 3):
        fake_checkpoint(tmp_path, s)
    moved = set_aside_later_checkpoints(tmp_path, 1)
    assert [p.name for p in moved] == ["discarded-step-00000002", "discarded-step-00000003"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000001"]
    fake_checkpoint(tmp_path, 2)  # the resumed run writes step 2 again, and is resumed from 1 once more
    assert [p.name for p in set_aside_later_checkpoints(tmp_path, 1)] == ["discarded-step-00000002-2"]
    assert json.loads((moved[0] / "state.json").read_text()) == {"step": 2}


def test_a_new_run_refuses_a_directory_with_checkpoints(tmp_path):
    refuse_existing_run(tmp_path / "fresh")  # nothing there
    fake_checkpoint(tmp_path, 3, complete=False)
    refuse_existing_run(tmp_path)  # stopped before its first complete checkpoint: may start again
    fake_checkpoint(tmp_path, 4)
    with pytest.raises(CheckpointError, match=r"step-00000004.*xrpo train --resume"):
        refuse_existing_run(tmp_path)


def test_update_state(tmp_path):
    d = fake_checkpoint(tmp_path, 1)
    update_state(d, eval_history=[1, 2])
    assert load_state(d) == {"step": 1, "eval_history": [1, 2]}
