import dataclasses

import pytest

from xrpo.data import DataError, Problem


def test_text_prompt():
    p = Problem(id="a", prompt="What is 2+2?", answer="4")
    assert p.text == "What is 2+2?"
    assert not p.is_chat
    assert p.data_source == "" and p.metadata == {}


def test_chat_prompt_text_is_last_user_message():
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "the real question"},
        {"role": "assistant", "content": "prefill"},
    ]
    p = Problem(id="a", prompt=msgs, answer="1")
    assert p.is_chat
    assert p.text == "the real question"


def test_chat_prompt_tuple_is_stored_as_list_of_copies():
    msg = {"role": "user", "content": "q", "name": "kept"}
    p = Problem(id="a", prompt=(msg,), answer="1")
    assert p.prompt == [{"role": "user", "content": "q", "name": "kept"}]
    msg["content"] = "mutated"
    assert p.text == "q"


def test_frozen():
    p = Problem(id="a", prompt="q", answer="1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.answer = "2"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(id="", prompt="q", answer="1"), "id: expected a non-empty string"),
        (dict(id=3, prompt="q", answer="1"), "id: expected a non-empty string"),
        (dict(id="a", prompt="  ", answer="1"), "prompt of problem 'a': expected non-empty text"),
        (dict(id="a", prompt=None, answer="1"), "prompt of problem 'a': expected a string or a list"),
        (dict(id="a", prompt=[], answer="1"), "non-empty list of chat messages"),
        (dict(id="a", prompt=["hi"], answer="1"), r"prompt\[0\]: expected a chat message"),
        (dict(id="a", prompt=[{"content": "q"}], answer="1"), r"prompt\[0\]: chat message has no 'role'"),
        (dict(id="a", prompt=[{"role": "user"}], answer="1"), r"prompt\[0\]: chat message has no 'content'"),
        (dict(id="a", prompt=[{"role": "user", "content": 5}], answer="1"), r"prompt\[0\]\.content: expected a str"),
        (dict(id="a", prompt=[{"role": 1, "content": "q"}], answer="1"), r"prompt\[0\]\.role: expected a str"),
        (dict(id="a", prompt=[{"role": "system", "content": "q"}], answer="1"), "no 'user' message"),
        (dict(id="a", prompt="q", answer=4), "answer of problem 'a': expected a string, got int"),
        (dict(id="a", prompt="q", answer=""), "answer of problem 'a': expected a non-empty string"),
        (dict(id="a", prompt="q", answer="1", data_source=None), "data_source of problem 'a'"),
        (dict(id="a", prompt="q", answer="1", metadata=[]), "metadata of problem 'a': expected a dict"),
    ],
)
def test_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Problem(**kwargs)


def test_data_error_is_value_error():
    assert issubclass(DataError, ValueError)
