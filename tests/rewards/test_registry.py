"""Verifier registry and user verifiers by dotted path (xrpo/rewards/registry.py)."""

import sys
import textwrap

import pytest

from xrpo.rewards import (
    VERIFIERS,
    FunctionVerifier,
    MathVerifier,
    Verifier,
    VerifyResult,
    get_verifier,
    register_verifier,
)

USER_MODULE = """
from xrpo.rewards import Verifier, VerifyResult


def exact(completion, reference):
    return float(completion.strip() == reference.strip())


def as_result(completion, reference):
    ok = completion == reference
    return VerifyResult(1.0 if ok else 0.0, completion, None if ok else "mismatch", {"by": "user"})


def make_threshold(cutoff=0.5):
    def verify(completion, reference):
        return float(len(completion) >= cutoff)
    return verify


def no_arg_factory():
    return exact


class Prefix(Verifier):
    def __init__(self, n=1):
        self.n = n

    def verify_batch(self, completions, references):
        return [VerifyResult(float(c[: self.n] == r[: self.n]), c[: self.n]) for c, r in zip(completions, references)]


class CallableThing:
    def __call__(self, completion, reference):
        return completion.endswith(reference)


class BatchedThing:
    def __call__(self, completion, reference):
        raise AssertionError("verify_batch should be used")

    def verify_batch(self, completions, references):
        return [0.25 for _ in completions]


def explodes(completion, reference):
    if completion == "bad":
        raise RuntimeError("cannot grade " + completion)
    return 1.0


def returns_string(completion, reference):
    return "yes"


instance = Prefix(2)
not_callable = 42
"""


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    path = tmp_path_factory.mktemp("user_verifiers")
    (path / "my_verifiers.py").write_text(textwrap.dedent(USER_MODULE))
    sys.path.insert(0, str(path))
    yield "my_verifiers"
    sys.path.remove(str(path))
    sys.modules.pop("my_verifiers", None)


def test_math_is_registered():
    assert VERIFIERS["math"] is MathVerifier
    v = get_verifier("math", timeout=2.5, in_process=True)
    assert isinstance(v, MathVerifier) and v.timeout == 2.5 and v.in_process


def test_unknown_name_lists_registered():
    with pytest.raises(ValueError, match=r"unknown verifier 'nope'; registered: .*math"):
        get_verifier("nope")


@pytest.mark.parametrize("bad", ["", "   ", None, 3])
def test_bad_name(bad):
    with pytest.raises(ValueError, match="verifier"):
        get_verifier(bad)


def test_register_and_duplicate():
    name = "test_registry_dummy"
    try:

        @register_verifier(name)
        class Dummy(Verifier):
            def verify_batch(self, completions, references):
                return [VerifyResult(1.0, "x") for _ in completions]

        assert get_verifier(name)("a", "b") == VerifyResult(1.0, "x")
        with pytest.raises(ValueError, match="already registered"):
            register_verifier(name)(Dummy)
        with pytest.raises(ValueError, match="already registered"):
            register_verifier("math")(Dummy)
    finally:
        VERIFIERS.pop(name, None)


@pytest.mark.parametrize("bad", ["", "a.b", "a:b", None])
def test_register_bad_name(bad):
    with pytest.raises(ValueError, match="verifier name"):
        register_verifier(bad)


def test_registered_plain_function_is_wrapped():
    name = "test_registry_fn"
    try:
        register_verifier(name)(lambda: lambda c, r: c == r)
        v = get_verifier(name)
        assert isinstance(v, Verifier)
        assert v.verify_batch(["a", "b"], ["a", "a"]) == [VerifyResult(1.0, None), VerifyResult(0.0, None)]
    finally:
        VERIFIERS.pop(name, None)


@pytest.mark.parametrize("sep", [":", "."])
def test_dotted_path_function(user_module, sep):
    v = get_verifier(f"{user_module}{sep}exact")
    assert isinstance(v, FunctionVerifier)
    assert v(" 4", "4") == VerifyResult(1.0, None)
    assert v.verify_batch(["4", "5"], ["4", "4"]) == [VerifyResult(1.0, None), VerifyResult(0.0, None)]


def test_dotted_path_returning_results(user_module):
    v = get_verifier(f"{user_module}:as_result")
    assert v("x", "y") == VerifyResult(0.0, "x", "mismatch", {"by": "user"})


def test_dotted_path_factory_with_kwargs(user_module):
    v = get_verifier(f"{user_module}:make_threshold", cutoff=3)
    assert [r.score for r in v.verify_batch(["ab", "abc"], ["", ""])] == [0.0, 1.0]
    # a factory that takes no arguments is called, not mistaken for the verifier
    assert get_verifier(f"{user_module}:no_arg_factory")("1", "1").score == 1.0


def test_dotted_path_class_and_instances(user_module):
    v = get_verifier(f"{user_module}.Prefix", n=3)
    assert type(v).__name__ == "Prefix" and v.n == 3
    assert v("abcd", "abcx") == VerifyResult(1.0, "abc")
    assert get_verifier(f"{user_module}:instance")("abz", "aby") == VerifyResult(1.0, "ab")
    callable_cls = get_verifier(f"{user_module}:CallableThing")
    assert callable_cls("the end", "end") == VerifyResult(1.0, None)
    # a duck-typed object's own verify_batch is used, and its floats are wrapped
    assert get_verifier(f"{user_module}:BatchedThing").verify_batch(["a"], ["b"]) == [VerifyResult(0.25, None)]


def test_user_exception_scores_zero_without_failing_the_batch(user_module):
    out = get_verifier(f"{user_module}:explodes").verify_batch(["ok", "bad", "ok"], ["", "", ""])
    assert [r.score for r in out] == [1.0, 0.0, 1.0]
    assert out[1].reason == "error" and out[1].metadata["error"] == "RuntimeError: cannot grade bad"


def test_user_bad_return_type_raises(user_module):
    with pytest.raises(TypeError, match="returned str"):
        get_verifier(f"{user_module}:returns_string")("a", "b")


@pytest.mark.parametrize(
    "path, message",
    [
        ("no_such_module_xyz:f", "no module named 'no_such_module_xyz'"),
        ("no_such_module_xyz.sub.f", "no module of that path can be imported"),
        ("{m}:missing", "has no attribute 'missing'"),
        ("{m}.missing", "has no attribute 'missing'"),
        ("{m}:not_callable", "expected a class, function or factory, got int"),
        ("{m}:", "expected 'pkg.mod:obj'"),
        (":exact", "expected 'pkg.mod:obj'"),
        ("{m}..exact", "expected 'pkg.mod.obj'"),
    ],
)
def test_bad_paths(user_module, path, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        get_verifier(path.format(m=user_module))


def test_kwargs_to_instance_or_bad_kwargs(user_module):
    with pytest.raises(ValueError, match="takes no keyword arguments"):
        get_verifier(f"{user_module}:instance", n=2)
    with pytest.raises(ValueError, match="cannot instantiate"):
        get_verifier(f"{user_module}:Prefix", bogus=1)
    with pytest.raises(ValueError, match="cannot call"):
        get_verifier(f"{user_module}:make_threshold", bogus=1)


def test_batch_input_validation():
    v = FunctionVerifier(lambda c, r: 1.0)
    with pytest.raises(ValueError, match="same length, got 2 and 1"):
        v.verify_batch(["a", "b"], ["a"])
    with pytest.raises(ValueError, match=r"completions\[1\]: expected str, got int"):
        v.verify_batch(["a", 3], ["a", "b"])
    with pytest.raises(ValueError, match="completions: expected a list of strings, got str"):
        v.verify_batch("ab", ["a", "b"])


def test_verify_result_metadata_is_not_shared():
    a, b = VerifyResult(1.0, "x"), VerifyResult(1.0, "x")
    assert a.metadata == {} and a.metadata is not b.metadata and a.reason is None
