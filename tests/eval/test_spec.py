"""xrpo.eval.spec: the data-spec language, the names it gives datasets, and the built-in datasets it loads."""

from __future__ import annotations

import dataclasses

import pytest

from xrpo.eval.model import resolve_model
from xrpo.eval.spec import DataSpec, dataset_name, load_dataset, parse_data_spec, slug


def test_parse_data_spec():
    s = parse_data_spec("data/aime.parquet:name=AIME'24,prompt=Problem,answer=Answer,id=ID,layout=aime2024")
    assert (s.source, s.name, s.prompt_key, s.answer_key, s.id_key, s.layout) == (
        "data/aime.parquet",
        "AIME'24",
        "Problem",
        "Answer",
        "ID",
        "aime2024",
    )
    assert parse_data_spec("champ").source == "champ"
    assert parse_data_spec("x.jsonl", "prompt=q").prompt_key == "q"
    # the column map and the spec's own options merge, the spec's winning key by key
    s = parse_data_spec("x.jsonl:name=X", "prompt=q,answer=a")
    assert (s.name, s.prompt_key, s.answer_key, s.id_key) == ("X", "q", "a", None)
    s = parse_data_spec("x.jsonl:answer=b,id=i", "prompt=q,answer=a,format=jsonl")
    assert (s.prompt_key, s.answer_key, s.id_key, s.fmt) == ("q", "b", "i", "jsonl")
    # the built-in datasets have fixed fields: the column map is for files, their own field options are refused
    s = parse_data_spec("champ:name=C", "prompt=q")
    assert (s.source, s.name, s.prompt_key) == ("champ", "C", None)
    with pytest.raises(
        ValueError,
        match=r"data spec 'default:prompt=q': default is a built-in dataset with fixed "
        r"fields; it takes only name=, got prompt=",
    ):
        parse_data_spec("default:prompt=q")
    with pytest.raises(ValueError, match=r"--column-map: 'name' would give every dataset the same name"):
        parse_data_spec("x.jsonl", "name=X")
    with pytest.raises(ValueError, match="unknown key 'colour'"):
        parse_data_spec("x.jsonl:colour=red")


def test_dataset_names(tmp_path):
    assert dataset_name(DataSpec("data/aime.parquet", name="AIME'24")) == "AIME'24"
    assert dataset_name(DataSpec("champ")) == "champ"
    assert dataset_name(DataSpec("data/math500.jsonl")) == "math500"
    # a generic stem names nothing: its directory goes first
    (tmp_path / "aime24").mkdir()
    assert dataset_name(DataSpec(str(tmp_path / "aime24" / "test.parquet"))) == "aime24-test"
    assert dataset_name(DataSpec(str(tmp_path / "aime24" / "train-00000-of-00001.parquet"))) == (
        "aime24-train-00000-of-00001"
    )
    assert slug("AIME'24 (v2)") == "AIME_24_v2"
    assert slug("///") == "dataset"


def test_default_is_the_held_out_split_of_the_training_task():
    from xrpo.data.tasks import make_default_task

    run = resolve_model("default").run
    problems, info = load_dataset(DataSpec("default"), run, limit=5)
    _, heldout = make_default_task(n_train=0, n_heldout=run.n_heldout, seed=run.seed)
    assert [p.id for p in problems] == [p.id for p in heldout[:5]]
    assert info["layout"] == "default task"
    with pytest.raises(ValueError, match="the run trained on a file and has no data.heldout"):
        load_dataset(DataSpec("default"), dataclasses.replace(run, train="train.jsonl"), limit=None)


def test_default_follows_the_runs_families_and_levels():
    """A run trained on a restricted built-in task is evaluated on that task's held-out split, not the full one."""
    from xrpo.data.tasks import make_default_task
    from xrpo.eval.model import run_defaults
    from xrpo.trainer.config_loader import build_config
    from xrpo.trainer.setup import load_data

    cfg = build_config(None, ["data.families=[gcd, products]", "data.levels={products: [2]}", "data.n_heldout=12"])
    cfg.data.n_train = 10
    train, heldout = load_data(cfg, log=lambda *_: None)
    problems, _ = load_dataset(DataSpec("default"), run_defaults(cfg), limit=None)
    assert [p.id for p in problems] == [p.id for p in heldout]
    cells = {(p.metadata["family"], p.metadata["difficulty"]) for p in train + heldout}
    assert cells == {("gcd", 0), ("gcd", 1), ("products", 2)}
    _, full = make_default_task(n_train=0, n_heldout=12, seed=0)
    assert [p.id for p in problems] != [p.id for p in full]


def test_a_hub_dataset_id_is_not_downloaded():
    with pytest.raises(FileNotFoundError, match=r"data someone/dataset: no such file or directory\. A hub dataset\?"):
        load_dataset(DataSpec("someone/dataset"), resolve_model("default").run, limit=None)
