import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xrpo.data import DataError, Problem, load_problems, save_problems_jsonl, save_problems_verl_parquet

CHAT = [{"role": "system", "content": "Think."}, {"role": "user", "content": "1+1?"}]


def sample_problems():
    return [
        Problem(id="p0", prompt="What is 2+3?", answer="5", data_source="toy", metadata={"level": 1, "tags": ["a"]}),
        Problem(id="p1", prompt=CHAT, answer="2", data_source="toy/chat", metadata={}),
        Problem(id="p2", prompt="Simplify 2/4.", answer="\\frac{1}{2}", metadata={"nested": {"x": 1.5}}),
    ]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_parquet(path, records):
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


# -------------------------------------------------------------------------------------------------------------------
# Round trips
# -------------------------------------------------------------------------------------------------------------------


def test_jsonl_round_trip(tmp_path):
    probs = sample_problems()
    path = save_problems_jsonl(probs, tmp_path / "sub" / "p.jsonl")
    assert load_problems(path) == probs


def test_verl_parquet_round_trip(tmp_path):
    probs = sample_problems()
    path = save_problems_verl_parquet(probs, tmp_path / "p.parquet")
    # the file is verl's layout
    table = pq.read_table(path)
    assert set(table.column_names) == {"data_source", "prompt", "reward_model", "extra_info"}
    row = table.to_pylist()[1]
    assert row["prompt"] == CHAT
    assert row["reward_model"] == {"style": "rule", "ground_truth": "2"}
    assert row["extra_info"]["index"] == "p1"
    assert table.to_pylist()[0]["prompt"] == [{"role": "user", "content": "What is 2+3?"}]

    loaded = load_problems(path)
    # a text prompt comes back as a one-message chat with the same text; everything else is equal
    assert loaded[0].prompt == [{"role": "user", "content": "What is 2+3?"}]
    for got, want in zip(loaded, probs):
        assert (got.id, got.text, got.answer, got.data_source, got.metadata) == (
            want.id,
            want.text,
            want.answer,
            want.data_source,
            want.metadata,
        )
    assert loaded[1] == probs[1]


def test_json_list_round_trip(tmp_path):
    records = [{"question": "q0", "answer": "a0"}, {"question": "q1", "answer": "a1", "extra": 3}]
    path = tmp_path / "data.json"
    path.write_text(json.dumps(records))
    got = load_problems(path)
    assert got == [
        Problem(id="data-0", prompt="q0", answer="a0"),
        Problem(id="data-1", prompt="q1", answer="a1", metadata={"extra": 3}),
    ]


def test_plain_parquet(tmp_path):
    path = write_parquet(
        tmp_path / "t.parquet",
        [
            {"problem": "p0", "solution": "s0", "level": "Level 1"},
            {"problem": "p1", "solution": "s1", "level": "Level 2"},
        ],
    )
    got = load_problems(path)
    assert [(p.id, p.prompt, p.answer, p.metadata) for p in got] == [
        ("t-0", "p0", "s0", {"level": "Level 1"}),
        ("t-1", "p1", "s1", {"level": "Level 2"}),
    ]


def test_datasets_directory_round_trip(tmp_path):
    datasets = pytest.importorskip("datasets")
    records = [
        {
            "data_source": "gsm8k",
            "prompt": [{"role": "user", "content": f"q{i}"}],
            "reward_model": {"style": "rule", "ground_truth": str(i)},
            "extra_info": {"index": i, "split": "train"},
        }
        for i in range(3)
    ]
    datasets.Dataset.from_list(records).save_to_disk(str(tmp_path / "ds"))
    got = load_problems(tmp_path / "ds")
    assert got == [
        Problem(
            id=str(i),
            prompt=[{"role": "user", "content": f"q{i}"}],
            answer=str(i),
            data_source="gsm8k",
            metadata={"split": "train"},
        )
        for i in range(3)
    ]
    assert load_problems(tmp_path / "ds", limit=2) == got[:2]


def test_datasets_dict_directory_names_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    d = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([{"question": "q", "answer": "1"}]),
            "test": datasets.Dataset.from_list([{"question": "q", "answer": "1"}]),
        }
    )
    d.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match=r"DatasetDict with splits \['test', 'train'\]"):
        load_problems(tmp_path / "dd")
    assert len(load_problems(tmp_path / "dd" / "train")) == 1


def test_datasets_missing_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "state.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(ImportError, match=r"xrpo\[datasets\]"):
        load_problems(tmp_path / "ds")


def test_directory_that_is_not_a_dataset(tmp_path):
    with pytest.raises(DataError, match="not a datasets save_to_disk directory"):
        load_problems(tmp_path)


# -------------------------------------------------------------------------------------------------------------------
# Layouts, keys, ids, answers
# -------------------------------------------------------------------------------------------------------------------


def test_verl_layout_from_a_verl_style_file(tmp_path):
    # what verl's examples/data_preprocess/gsm8k.py writes
    path = write_parquet(
        tmp_path / "gsm8k.parquet",
        [
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": f"Q{i}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": f"{i}"},
                "extra_info": {"split": "test", "index": i, "answer": "work", "question": f"Q{i}"},
            }
            for i in range(2)
        ],
    )
    got = load_problems(path)
    assert got[1] == Problem(
        id="1",
        prompt=[{"role": "user", "content": "Q1"}],
        answer="1",
        data_source="openai/gsm8k",
        metadata={"ability": "math", "split": "test", "answer": "work", "question": "Q1"},
    )


def test_generic_key_priority(tmp_path):
    # problem before question before prompt; answer before solution before ground_truth
    path = write_jsonl(
        tmp_path / "k.jsonl",
        [
            {"prompt": "P", "question": "Q", "problem": "R", "ground_truth": "G", "solution": "S", "answer": "A"},
        ],
    )
    (p,) = load_problems(path)
    assert (p.prompt, p.answer) == ("R", "A")
    assert p.metadata == {"prompt": "P", "question": "Q", "ground_truth": "G", "solution": "S"}
    path = write_jsonl(tmp_path / "k2.jsonl", [{"question": "Q", "ground_truth": 7}])
    (p,) = load_problems(path)
    assert (p.prompt, p.answer) == ("Q", "7")


def test_explicit_column_mapping_and_nested_keys(tmp_path):
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [
            {"uid": "u1", "input": {"text": "2*3"}, "target": {"values": ["6", "6.0"]}, "question": "ignored?"},
        ],
    )
    (p,) = load_problems(path, prompt_key="input.text", answer_key="target.values.0", id_key="uid", data_source="mine")
    assert (p.id, p.prompt, p.answer, p.data_source) == ("u1", "2*3", "6", "mine")
    assert p.metadata == {"question": "ignored?"}


def test_field_name_with_a_dot_is_found_first(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"q": "x", "reward_model.ground_truth": "lit", "reward_model": {"ground_truth": "nested"}}],
    )
    (p,) = load_problems(path, prompt_key="q", answer_key="reward_model.ground_truth")
    assert p.answer == "lit"


def test_data_source_argument_overrides_field(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [{"question": "q", "answer": "1", "data_source": "file"}])
    assert load_problems(path)[0].data_source == "file"
    assert load_problems(path, data_source="arg")[0].data_source == "arg"


@pytest.mark.parametrize("value, expected", [(4, "4"), (-2, "-2"), (3.0, "3"), (0.25, "0.25"), ("1/2", "1/2")])
def test_answer_conversion(tmp_path, value, expected):
    path = write_jsonl(tmp_path / "a.jsonl", [{"question": "q", "answer": value}])
    assert load_problems(path)[0].answer == expected


def test_id_from_id_field_and_integers(tmp_path):
    path = write_jsonl(
        tmp_path / "i.jsonl", [{"id": 7, "question": "q", "answer": "1"}, {"id": "x", "question": "q", "answer": "1"}]
    )
    assert [p.id for p in load_problems(path)] == ["7", "x"]


def test_default_ids_count_records_not_lines(tmp_path):
    path = tmp_path / "blank.jsonl"
    path.write_text('{"question": "a", "answer": "1"}\n\n{"question": "b", "answer": "2"}\n')
    assert [p.id for p in load_problems(path)] == ["blank-0", "blank-1"]


def test_limit(tmp_path):
    # the malformed third line is never read
    path = tmp_path / "l.jsonl"
    path.write_text('{"question": "a", "answer": "1"}\n{"question": "b", "answer": "2"}\nnot json\n')
    assert [p.prompt for p in load_problems(path, limit=2)] == ["a", "b"]
    with pytest.raises(DataError, match="line 3"):
        load_problems(path)
    ppath = write_parquet(tmp_path / "l.parquet", [{"question": str(i), "answer": "1"} for i in range(5)])
    assert [p.prompt for p in load_problems(ppath, limit=3)] == ["0", "1", "2"]


def test_fmt_overrides_extension(tmp_path):
    path = write_jsonl(tmp_path / "data.txt", [{"question": "q", "answer": "1"}])
    assert load_problems(path, fmt="jsonl")[0].prompt == "q"


# -------------------------------------------------------------------------------------------------------------------
# Errors: every message names the file, the record and the field
# -------------------------------------------------------------------------------------------------------------------

GOOD = {"question": "q", "answer": "1"}


@pytest.mark.parametrize(
    "bad, field_msg",
    [
        ({"answer": "1", "other": 1}, r"missing field 'question' \(the prompt\)"),
        ({"question": "q"}, r"missing field 'answer' \(the answer\)"),
        ({"question": None, "answer": "1"}, r"field 'question' \(the prompt\) is null"),
        ({"question": 5, "answer": "1"}, r"field 'question' \(the prompt\) must be text or a list of chat messages"),
        ({"question": "  ", "answer": "1"}, "field 'question': prompt of problem 'bad-1': expected non-empty text"),
        (
            {"question": [{"role": "user"}], "answer": "1"},
            r"field 'question'.*prompt\[0\]: chat message has no 'content'",
        ),
        ({"question": "q", "answer": None}, "field 'answer' is null"),
        ({"question": "q", "answer": ""}, "field 'answer' is an empty string"),
        ({"question": "q", "answer": True}, "field 'answer' must be a string or a number, got a boolean"),
        ({"question": "q", "answer": ["1", "2"]}, r"field 'answer' is a list of 2 answers.*answer_key='answer.0'"),
        ({"question": "q", "answer": [{"input": "1"}, 2]}, "field 'answer' mixes test-case objects with other values"),
        ({"question": "q", "answer": []}, "field 'answer' is an empty list"),
        ({"question": "q", "answer": float("nan")}, "field 'answer' is nan"),
        ({"question": "q", "answer": "1", "data_source": 3}, "field 'data_source' must be a string"),
    ],
)
def test_malformed_row_jsonl(tmp_path, bad, field_msg):
    path = tmp_path / "bad.jsonl"
    # line 1 good, line 2 blank (counted), line 3 bad
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps(bad, allow_nan=True) + "\n")
    with pytest.raises(DataError, match=rf"bad\.jsonl line 3: {field_msg}"):
        load_problems(path)


def test_malformed_row_parquet_names_row(tmp_path):
    path = write_parquet(
        tmp_path / "bad.parquet",
        [
            {
                "prompt": [{"role": "user", "content": "q"}],
                "reward_model": {"ground_truth": gt},
                "extra_info": {"index": i},
            }
            for i, gt in enumerate(["1", None])
        ],
    )
    with pytest.raises(DataError, match=r"bad\.parquet row 1 \(0-based\): field 'reward_model\.ground_truth' is null"):
        load_problems(path)


def test_missing_nested_field_parquet(tmp_path):
    path = write_parquet(
        tmp_path / "nest.parquet",
        [
            {"prompt": "q0", "reward_model": {"ground_truth": "1"}, "extra_info": {"index": 0}},
            {"prompt": "q1", "reward_model": {"ground_truth": "1"}, "extra_info": None},
        ],
    )
    msg = r"nest\.parquet row 1 \(0-based\): missing field 'extra_info\.index' \(the id\)"
    with pytest.raises(DataError, match=msg):
        load_problems(path)


def test_bad_id_values(tmp_path):
    path = write_jsonl(tmp_path / "ids.jsonl", [{"id": 1.5, "question": "q", "answer": "1"}])
    with pytest.raises(DataError, match=r"ids\.jsonl line 1: field 'id' \(the id\) must be a string or an integer"):
        load_problems(path)
    path = write_jsonl(
        tmp_path / "ids2.jsonl", [{"id": "a", "question": "q", "answer": "1"}, {"question": "q", "answer": "1"}]
    )
    with pytest.raises(DataError, match=r"ids2\.jsonl line 2: missing field 'id' \(the id\)"):
        load_problems(path)


def test_missing_explicit_id_key(tmp_path):
    path = write_jsonl(tmp_path / "idk.jsonl", [GOOD])
    with pytest.raises(DataError, match=r"idk\.jsonl line 1: missing field 'uid' \(the id\)"):
        load_problems(path, id_key="uid")


def test_no_prompt_or_answer_field_in_first_record(tmp_path):
    path = write_jsonl(tmp_path / "np.jsonl", [{"text": "q", "answer": "1"}])
    msg = r"np\.jsonl line 1: no prompt field: expected one of .*fields present: \['answer', 'text'\]"
    with pytest.raises(DataError, match=msg):
        load_problems(path)
    path = write_jsonl(tmp_path / "na.jsonl", [{"question": "q", "label": "1"}])
    with pytest.raises(DataError, match=r"na\.jsonl line 1: no answer field"):
        load_problems(path)


def test_invalid_json_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + '{"question": "q", "answer": \n')
    with pytest.raises(DataError, match=r"broken\.jsonl line 2: not valid JSON"):
        load_problems(path)


def test_jsonl_line_not_an_object(tmp_path):
    path = tmp_path / "arr.jsonl"
    path.write_text(json.dumps(GOOD) + "\n[1, 2]\n")
    with pytest.raises(DataError, match=r"arr\.jsonl line 2: expected an object with named fields, got list"):
        load_problems(path)


def test_text_that_is_not_utf8_names_the_line_and_column(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b'\n{"question": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(DataError, match=r"latin1\.jsonl line 2: not valid UTF-8 \(byte 0xe9 at column 18\)"):
        load_problems(path)
    path = tmp_path / "latin1.json"
    path.write_bytes(b'[{"question": "q", "answer": "1"},\n {"question": "\xff", "answer": "2"}]')
    with pytest.raises(DataError, match=r"latin1\.json line 2: not valid UTF-8 \(byte 0xff at column 16\)"):
        load_problems(path)


def test_a_byte_order_mark_is_skipped(tmp_path):
    rows = [GOOD, {"question": "q2", "answer": "2"}]
    (tmp_path / "bom.jsonl").write_text("\ufeff" + "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "bom.json").write_text("\ufeff" + json.dumps(rows), encoding="utf-8")
    assert [(p.prompt, p.answer) for p in load_problems(tmp_path / "bom.jsonl")] == [("q", "1"), ("q2", "2")]
    assert [(p.prompt, p.answer) for p in load_problems(tmp_path / "bom.json")] == [("q", "1"), ("q2", "2")]


def test_a_number_json_cannot_read_names_the_line(tmp_path):
    # an integer beyond Python's int() digit limit raises ValueError (not JSONDecodeError) inside json
    huge = '{"question": "q", "answer": ' + "9" * 5000 + "}"
    (tmp_path / "huge.jsonl").write_text(json.dumps(GOOD) + "\n" + huge + "\n")
    with pytest.raises(DataError, match=r"huge\.jsonl line 2: not valid JSON \(Exceeds the limit"):
        load_problems(tmp_path / "huge.jsonl")
    (tmp_path / "huge.json").write_text("[" + huge + "]")
    with pytest.raises(DataError, match=r"huge\.json: not valid JSON \(Exceeds the limit"):
        load_problems(tmp_path / "huge.json")


def test_json_errors(tmp_path):
    path = tmp_path / "obj.json"
    path.write_text(json.dumps({"data": [GOOD]}))
    with pytest.raises(DataError, match=r"obj\.json: expected a JSON list of objects at the top level, got dict"):
        load_problems(path)
    path = tmp_path / "lines.json"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n")
    with pytest.raises(DataError, match=r"lines\.json: not valid JSON .*looks like JSON Lines"):
        load_problems(path)
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([GOOD, {"question": "q"}]))
    with pytest.raises(DataError, match=r"rows\.json row 1 \(0-based\): missing field 'answer'"):
        load_problems(path)


def test_not_parquet(tmp_path):
    path = tmp_path / "fake.parquet"
    path.write_text("hello")
    with pytest.raises(DataError, match=r"fake\.parquet: not a readable parquet file"):
        load_problems(path)


def test_duplicate_ids(tmp_path):
    path = write_jsonl(
        tmp_path / "dup.jsonl",
        [
            {"id": "a", "question": "q", "answer": "1"},
            {"id": "b", "question": "q", "answer": "1"},
            {"id": "a", "question": "q", "answer": "1"},
        ],
    )
    with pytest.raises(DataError, match=r"dup\.jsonl line 3: duplicate id 'a' \(first seen at line 1\)"):
        load_problems(path)


@pytest.mark.parametrize("name, content", [("e.jsonl", ""), ("e2.jsonl", "\n \n"), ("e.json", "[]")])
def test_empty_file(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError, match=rf"no problems in .*{name}"):
        load_problems(path)


def test_empty_parquet(tmp_path):
    path = tmp_path / "e.parquet"
    pq.write_table(pa.table({"question": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), path)
    with pytest.raises(DataError, match=r"no problems in .*e\.parquet"):
        load_problems(path)


def test_argument_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl does not exist"):
        load_problems(tmp_path / "nope.jsonl")
    path = write_jsonl(tmp_path / "ok.csv", [GOOD])
    with pytest.raises(ValueError, match=r"cannot tell the format from the extension '\.csv'"):
        load_problems(path)
    msg = r"fmt: unknown format 'csv'; valid formats: \['jsonl', 'json', 'parquet', 'datasets'\]"
    with pytest.raises(ValueError, match=msg):
        load_problems(path, fmt="csv")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="limit: expected a positive integer"):
            load_problems(path, fmt="jsonl", limit=bad)
    with pytest.raises(ValueError, match="prompt_key: expected a non-empty field name"):
        load_problems(path, fmt="jsonl", prompt_key="")
    with pytest.raises(ValueError, match="fmt='datasets' expects a save_to_disk directory"):
        load_problems(path, fmt="datasets")


def test_save_errors(tmp_path):
    with pytest.raises(ValueError, match="save_problems_jsonl: no problems to save"):
        save_problems_jsonl([], tmp_path / "x.jsonl")
    p = Problem(id="a", prompt="q", answer="1")
    with pytest.raises(ValueError, match=r"save_problems_verl_parquet: duplicate id 'a' at problems\[1\]"):
        save_problems_verl_parquet([p, p], tmp_path / "x.parquet")
    with pytest.raises(ValueError, match=r"problems\[0\] is a dict, expected a Problem"):
        save_problems_jsonl([{"id": "a"}], tmp_path / "x.jsonl")
    odd = Problem(id="odd", prompt="q", answer="1", metadata={"s": {1, 2}})
    with pytest.raises(ValueError, match="metadata of problem 'odd' is not JSON-serialisable"):
        save_problems_jsonl([odd], tmp_path / "x.jsonl")


def test_pandas_index_column_is_not_metadata(tmp_path):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"question": ["q0", "q1"], "answer": [1, 2]}, index=[5, 7])
    df.to_parquet(tmp_path / "pd.parquet")
    assert "__index_level_0__" in pq.read_table(tmp_path / "pd.parquet").column_names
    got = load_problems(tmp_path / "pd.parquet")
    assert [(p.prompt, p.answer, p.metadata) for p in got] == [("q0", "1", {}), ("q1", "2", {})]
