"""Output comparison (xrpo/rewards/code_compare.py): the rules for stdout tokens and lines and for returned values,
and, for anything a program prints or returns, a verdict that never raises, never passes by a tolerance it
should not get, and costs the grader linear work."""

from __future__ import annotations

import json
import tracemalloc
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xrpo.rewards.code_compare import compare_returned, compare_stdout, compare_values


@pytest.mark.parametrize(
    "out, want, ok",
    [
        ("3\n", "3", True),
        ("1 2\n3", "1\n2 3\n", True),  # tokens ignore line structure
        ("1 2", "1 2 3", False),
        ("0.3333333", "0.333333333", True),  # |diff| = 3.3e-8 <= 1e-6
        ("0.334", "0.333", False),  # |diff| = 1e-3
        ("1000000.5", "1000000.0", True),  # relative: 0.5 <= 1e-6 * 1e6 (= 1)
        ("1000002.5", "1000000.0", False),  # relative: 2.5 > 1
        ("3", "3.0", True),  # an integer printed where a real is expected: within tolerance
        ("1.0", "1", True),  # an expected integer: the same integer with a zero fraction
        ("-0.000", "0", True),
        ("+5 007 -0", "5 7 0", True),  # sign and leading zeros do not change an integer
        ("12345678901234567890", "12345678901234567891", False),  # integers compare exactly
        # an expected integer is never matched within a tolerance (one let answers near 1e9 off by hundreds pass)
        ("1000000500.0", "1000000000", False),
        ("999999999.9999999", "1000000000", False),
        ("1000000000.0000001", "1000000000", False),
        ("1e9", "1000000000", False),  # nor written with an exponent
        ("0x10 1_0", "16 10", False),  # nor in any other base or with underscores
        ("\u0661\u0662", "12", False),  # nor in other scripts' digits
        ("YES", "yes", False),
        ("nan", "nan", True),  # equal strings
        ("NaN", "0.5", False),  # special values are words, never numbers
        ("inf", "1e999", False),
        ("1e999", "1e999", True),
        ("1e999", "1e998", False),  # an expected real that overflows matches only itself
        ("1" * 5000, "1" * 5000, True),  # longer than int()'s digit limit: still exact
        ("1" * 5000, "1" * 4999 + "2", False),
        ("0" * 5000 + "3", "3", True),
        ("1" * 5000, "3", False),
        ("1" * 400, "1.5", False),  # overflows a float
    ],
)
def test_compare_tokens(out, want, ok):
    assert compare_stdout(out, want)[0] is ok


def test_compare_lines_is_lcb_exact():
    assert compare_stdout("1 2\n3\n", "1 2\n3", mode="lines")[0]
    assert not compare_stdout("1 2 3", "1 2\n3", mode="lines")[0]
    assert compare_stdout("1.50 2", "1.5 2.0", mode="lines")[0]  # equal decimals
    assert compare_stdout("1E+2", "100", mode="lines")[0]
    assert not compare_stdout("0.3333333", "0.333333333", mode="lines")[0]  # no tolerance in LCB
    # special decimal values (a signalling NaN once raised out of the comparison) are words: equal only as text
    for out, want in (
        ("sNaN", "1"),
        ("sNaN", "sNaN1"),
        ("NaN", "NaN1"),
        ("1 sNaN", "1 2"),
        ("Infinity", "inf"),
        ("1e9999999999999999999", "1"),
        ("-sNaN", "sNaN"),
    ):
        assert compare_stdout(out, want, mode="lines") == (False, f"line 0: got {out!r}, expected {want!r}")
    for same in ("NaN", "sNaN", "Infinity", "1 NaN"):
        assert compare_stdout(same, same, mode="lines")[0]
    assert not compare_stdout("NaN", "nan", mode="lines")[0]


def test_compare_stdout_takes_bytes_and_ascii_whitespace():
    assert compare_stdout(b"1 2\r\n", "1 2")[0]
    assert compare_stdout(b"\xff\xfe 2", b"\xff\xfe 2")[0]  # bytes that are not UTF-8 compare as bytes
    assert not compare_stdout(b"\xff", "\ufffd")[0]  # not through a decoding that replaces them
    assert not compare_stdout("1\u00a02", "1 2")[0]  # only ASCII whitespace separates tokens
    assert compare_stdout(b"3\n", b"3")[0] and compare_stdout("3", b"3\n", mode="lines")[0]


def test_compare_values():
    assert compare_values([1, 2], [1, 2])
    assert compare_values(0.1 + 0.2, 0.3)
    assert not compare_values(0.31, 0.3)
    assert compare_values(6, [6])  # APPS wraps expected values in a list
    assert compare_values([6], [[6]])  # [[6]] unwraps to [6]
    assert not compare_values(6, [6], unwrap=False)
    assert not compare_values({"a": 1}, {"a": 2})
    assert compare_values({"a": [1.0, 2]}, {"a": [1, 2]})  # 1.0 is exactly the expected 1
    assert not compare_values("1", 1)
    assert compare_values(3, 3.0000001)  # an int where a float is expected: within tolerance
    # an expected int is matched exactly, never within a tolerance
    assert not compare_values(1000000500.0, 1000000000)
    assert not compare_values(999999999.9999999, 1000000000)
    assert compare_values(1e9, 1000000000)
    assert not compare_values(2**53 + 1.0, 2**53 + 1)  # the float is 2**53: not the expected integer
    # bools are not numbers
    assert not compare_values(True, 1) and not compare_values(1, True) and not compare_values(0.0, False)
    assert compare_values(True, True) and not compare_values(True, False)
    # huge integers against floats: no OverflowError, just unequal
    assert not compare_values(10**400, 1.5) and not compare_values(1.5, 10**400)
    assert not compare_values(10**400, float("inf")) and not compare_values([10**400], [1e308])
    # special values: NaN equals NaN, infinities equal themselves, nothing else is within tolerance of them
    nan, inf = float("nan"), float("inf")
    assert compare_values(nan, nan) and not compare_values(nan, 1.0) and not compare_values(1.0, nan)
    assert compare_values(inf, inf) and not compare_values(-inf, inf) and not compare_values(1e308, inf)
    assert not compare_values(inf, 1e308) and not compare_values(nan, 0)


# ------------------------------------------------------------------ any bytes, any values

_numberish = st.from_regex(rb"\A[+-]?[0-9]{0,12}(\.[0-9]{0,12})?([eE][+-]?[0-9]{0,4})?\Z")
_words = st.sampled_from(
    [
        b"nan",
        b"NaN",
        b"sNaN",
        b"-sNaN",
        b"inf",
        b"-Infinity",
        b"1e999",
        b"0x1f",
        b"1_0",
        b".",
        b"-",
        b"+",
        b"e5",
        b"\xff",
        "\u0661".encode(),
        b"1" * 5000,
        b"9" * 400 + b".5",
    ]
)
_token = st.one_of(_numberish, _words, st.binary(max_size=8))
_output = st.lists(st.tuples(_token, st.sampled_from([b" ", b"\n", b"\t", b"\r\n", b"  ", b"\x0b"])), max_size=8).map(
    lambda parts: b"".join(t + s for t, s in parts)
)


@settings(max_examples=300, deadline=None)
@given(
    out=st.one_of(_output, st.binary(max_size=64)),
    want=st.one_of(_output, st.binary(max_size=64)),
    mode=st.sampled_from(["tokens", "lines"]),
)
def test_compare_stdout_gives_a_verdict_for_any_bytes(out, want, mode):
    ok, why = compare_stdout(out, want, mode=mode)
    assert isinstance(ok, bool) and isinstance(why, str)
    assert ok is (why == "")
    assert compare_stdout(out, out, mode=mode) == (True, "")


_digits = st.from_regex(r"\A[+-]?[0-9]{1,6000}\Z")


@settings(max_examples=200, deadline=None)
@given(a=_digits, b=_digits)
def test_integers_compare_exactly(a, b):
    same = Decimal(a) == Decimal(b)  # the reference twin: exact at any length (int() stops at 4300 digits)
    assert compare_stdout(a, b)[0] is same
    assert compare_stdout(b, a)[0] is same
    assert compare_stdout(f"{a} {b}", f"{b} {a}")[0] is same


@settings(max_examples=200, deadline=None)
@given(
    y=st.integers(-(10**30), 10**30), got=st.from_regex(r"\A[+-]?[0-9]{1,25}(\.[0-9]{0,25})?([eE][+-]?[0-9]{1,3})?\Z")
)
def test_an_expected_integer_takes_only_that_integer(y, got):
    """Written as an integer or with a fraction of zeros, never within a tolerance, never with an exponent."""
    exact = "e" not in got.lower() and Decimal(got) == y
    assert compare_stdout(got, str(y))[0] is exact


_plain = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(-(10**400), 10**400),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=4),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(got=_plain, want=_plain)
def test_compare_values_gives_a_verdict_for_any_values(got, want):
    assert isinstance(compare_values(got, want), bool)


@settings(max_examples=300, deadline=None)
@given(
    x=st.one_of(st.integers(), st.integers(-(10**400), 10**400)),
    y=st.one_of(st.integers(), st.integers(-(10**400), 10**400)),
    f=st.floats(allow_nan=True, allow_infinity=True),
)
def test_compare_values_integers_exactly(x, y, f):
    assert compare_values(x, y) is (x == y)
    assert compare_values(f, y) is (f == y)  # a float where an int is expected: only the exact value (Python's ==)


@settings(max_examples=300, deadline=None)
@given(
    raw=st.one_of(
        st.binary(max_size=64),
        _plain.map(lambda v: json.dumps(v).encode()),
        st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n),
        st.integers(1, 200_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    ),
    want=_plain,
)
def test_a_returned_value_gives_a_verdict_for_any_bytes(raw, want):
    ok, why = compare_returned(raw, want)
    assert isinstance(ok, bool) and ok is (why == "") and len(why) < 400


def test_a_returned_value_is_not_parsed_into_many_times_its_size():
    """JSON of empty lists becomes objects 18 times its size: 15 MB of it was 300 MB in the grader's thread."""
    value = b"[" + b"[]," * 5_000_000 + b"[]]"
    tracemalloc.start()
    try:
        ok, why = compare_returned(value, [[1], [2]])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not ok and why == "the returned value's JSON has 15000004 bytes, more than any match could (144)"
    assert peak < 2**20
    # every writing of a matching value is within the bound: floats' repr, a float for an int, escapes
    for got, want in (
        (2.220446049250313e-16, 0.0),
        (0.9999999999999999, 1.0),
        (5.0, 5),
        ("\U0001f600" * 3, "\U0001f600" * 3),
        ([1.0000000000000002] * 50, [1] * 50),
        (float("nan"), float("nan")),
        (10**30 * 1.0, 10**30),
    ):
        assert compare_returned(json.dumps(got).encode(), want)[0] is compare_values(got, want), (got, want)


def test_compare_returned():
    assert compare_returned(b"[0, 1]", [0, 1]) == (True, "")
    assert compare_returned(b"1000000500.0", 1000000000) == (False, "returned 1000000500.0, expected 1000000000")
    deep = b"[" * 100_000 + b"]" * 100_000
    assert compare_returned(deep, [0] * 30000) == (False, "the returned value could not be read (nested too deeply)")
    assert compare_returned(b"1" * 5000, 1)[0] is False
    assert compare_returned(b"\xff", "x") == (False, "the returned value could not be read (not JSON)")
