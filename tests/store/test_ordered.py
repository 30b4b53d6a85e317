"""The order-preserving codec: round trips, byte order == value order, prefixes, errors."""

from __future__ import annotations

import enum
import math
from collections import namedtuple
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from iqkit.store.encoding.ordered import decode, decode_tuple, encode, encode_columns

# --- strategies -----------------------------------------------------------------------
# Ints: small, around the 8-byte fast-path edge, and far beyond it (hundreds of bytes).
INTS = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-(2**3000), max_value=2**3000),
    st.sampled_from([0, 1, -1, 255, 256, -255, -256, 2**64 - 1, 2**64, -(2**64) + 1, -(2**64)]),
)
FLOATS = st.floats(allow_nan=False)  # NaN is ordered by the codec, not by Python
TEXT = st.text(st.characters())  # any code point, '\x00' and lone surrogates included
BINARY = st.one_of(
    st.binary(),
    st.lists(st.sampled_from([0x00, 0x01, 0xFE, 0xFF])).map(bytes),  # escape edge cases
)
SCALAR_TYPES = {
    "none": st.none(),
    "bool": st.booleans(),
    "int": INTS,
    "float": FLOATS,
    "str": TEXT,
    "bytes": BINARY,
}
SCALARS = st.one_of(*SCALAR_TYPES.values())


def _nested(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(children, max_size=4).map(tuple)


VALUES = st.recursive(SCALARS, _nested, max_leaves=12)


@st.composite
def schema(draw: st.DrawFn, depth: int = 0) -> list[st.SearchStrategy]:
    """A list of per-position strategies: two tuples drawn from it compare in Python."""
    kinds = [*SCALAR_TYPES] + (["tuple"] if depth < 2 else [])
    out = []
    for kind in draw(st.lists(st.sampled_from(kinds), max_size=5)):
        if kind == "tuple":
            inner = draw(schema(depth + 1))
            out.append(_tuple_from(inner))
        else:
            out.append(SCALAR_TYPES[kind])
    return out


def _tuple_from(positions: list[st.SearchStrategy]) -> st.SearchStrategy:
    """Tuples following ``positions``, possibly cut short (so prefixes get compared)."""
    return st.integers(min_value=0, max_value=len(positions)).flatmap(
        lambda k: st.tuples(*positions[:k])
    )


@st.composite
def comparable_tuples(draw: st.DrawFn) -> tuple[tuple, tuple]:
    positions = draw(schema())
    a = draw(_tuple_from(positions))
    b = draw(st.one_of(_tuple_from(positions), st.just(a)))
    return a, b


def _assert_order(a: object, b: object) -> None:
    ea, eb = encode(a), encode(b)
    assert (a < b) == (ea < eb), (a, b, ea, eb)
    assert (a == b) == (ea == eb), (a, b, ea, eb)
    assert (a > b) == (ea > eb), (a, b, ea, eb)


# --- round trips ----------------------------------------------------------------------
@given(VALUES)
def test_round_trip_of_any_value(value: object) -> None:
    # decode returns the bare element for a 1-element encoding, so wrap to compare.
    assert decode_tuple(encode((value,))) == (value,)
    if not isinstance(value, tuple):
        assert decode(encode(value)) == value


@given(st.lists(VALUES, max_size=6).map(tuple))
def test_decode_tuple_round_trips_top_level_tuples(value: tuple) -> None:
    assert decode_tuple(encode(value)) == value
    if len(value) != 1:
        assert decode(encode(value)) == value


@given(st.recursive(SCALARS, lambda c: st.lists(c, max_size=3), max_leaves=8))
def test_lists_encode_as_tuples(value: object) -> None:
    def as_tuples(v: object) -> object:
        return tuple(as_tuples(x) for x in v) if isinstance(v, list) else v

    assert encode(value) == encode(as_tuples(value))
    assert decode_tuple(encode([value])) == (as_tuples(value),)


def test_round_trip_types_are_exact() -> None:
    for value in [None, True, False, 0, 7, -7, 2**200, 1.5, "x", b"x", (1, (2, "a"))]:
        out = decode(encode(value))
        assert out == value
        assert type(out) is type(value)


def test_decode_returns_bare_element_or_tuple() -> None:
    assert decode(encode(("a",))) == "a"
    assert decode(encode("a")) == "a"
    assert encode(("a",)) == encode("a")
    assert decode_tuple(encode("a")) == ("a",)
    assert decode(encode(("a", 1))) == ("a", 1)
    assert decode(b"") == ()
    assert encode(()) == b""
    assert decode(encode(((1, 2),))) == (1, 2)  # a 1-tuple holding a tuple -> the tuple
    assert decode_tuple(encode(((1, 2),))) == ((1, 2),)


# --- floats ---------------------------------------------------------------------------
def test_nan_is_canonical_and_sorts_above_infinity() -> None:
    nan_bytes = encode(float("nan"))
    assert encode(float("-nan")) == nan_bytes
    assert encode(math.copysign(float("nan"), -1.0)) == nan_bytes
    assert encode(float("inf")) < nan_bytes
    assert math.isnan(decode(nan_bytes))


def test_negative_zero_is_canonicalised() -> None:
    assert encode(-0.0) == encode(0.0)
    out = decode(encode(-0.0))
    assert out == 0.0 and math.copysign(1.0, out) == 1.0
    assert encode(-5e-324) < encode(-0.0) < encode(5e-324)


@given(FLOATS, FLOATS)
def test_float_order(a: float, b: float) -> None:
    _assert_order(a, b)


@given(FLOATS)
def test_float_round_trip(value: float) -> None:
    assert decode(encode(value)) == value


def test_float_extremes_in_order() -> None:
    values = [-math.inf, -1.7976931348623157e308, -1.0, -5e-324, 0.0, 5e-324, 1.0, math.inf]
    encoded = [encode(v) for v in values]
    assert encoded == sorted(encoded)


# --- ints -----------------------------------------------------------------------------
@given(INTS, INTS)
def test_int_order(a: int, b: int) -> None:
    _assert_order(a, b)


@given(INTS)
def test_int_round_trip(value: int) -> None:
    assert decode(encode(value)) == value


def test_int_boundaries_sort_in_value_order() -> None:
    edges = {0}
    for bits in (8, 16, 56, 63, 64, 65, 72, 2040, 2048, 2056):
        for base in (2**bits, -(2**bits)):
            edges.update({base - 1, base, base + 1})
    values = sorted(edges)
    encoded = [encode(v) for v in values]
    assert encoded == sorted(encoded)
    assert len(set(encoded)) == len(encoded)
    assert [decode(e) for e in encoded] == values


def test_int_layout_is_fdb_style() -> None:
    assert encode(0) == b"\x14"
    assert encode(1) == b"\x15\x01"
    assert encode(-1) == b"\x13\xfe"
    assert encode(256) == b"\x16\x01\x00"
    assert encode(2**64 - 1) == b"\x1c" + b"\xff" * 8
    # past 8 bytes: tag, length-of-length, length, magnitude
    assert encode(2**64) == b"\x1d\x01\x09\x01" + b"\x00" * 8
    assert encode(-(2**64)) == b"\x0b\xfe\xf6\xfe" + b"\xff" * 8


def test_enormous_ints_round_trip_and_order() -> None:
    big = 10**5000  # beyond Python's int->str digit limit: must not need repr
    assert decode(encode(big)) == big
    assert decode(encode(-big)) == -big
    assert encode(-big) < encode(-(2**64)) < encode(0) < encode(2**64) < encode(big)
    assert encode(big) < encode(big + 1)
    assert encode(-big - 1) < encode(-big)


# --- strings and bytes ----------------------------------------------------------------
@given(TEXT, TEXT)
def test_str_order(a: str, b: str) -> None:
    _assert_order(a, b)


@given(BINARY, BINARY)
def test_bytes_order(a: bytes, b: bytes) -> None:
    _assert_order(a, b)


def test_embedded_nul_and_ff_escape() -> None:
    assert encode("a\x00b") == b"\x30a\x00\xffb\x00"
    assert encode(b"\x00\xff") == b"\x40\x00\xff\xff\x00"
    assert encode("a") < encode("a\x00") < encode("a\x00\x00") < encode("a\x01")
    assert encode(b"") < encode(b"\x00") < encode(b"\x00\xff") < encode(b"\x01")
    assert decode(encode(("a\x00", "b"))) == ("a\x00", "b")


def test_unicode_and_surrogates() -> None:
    for s in ["é", "\U0001f600", "\ud800", "z\udfff", "\uffff"]:
        assert decode(encode(s)) == s
    # code point order, like Python's str comparison (UTF-8 preserves it)
    assert encode("\uffff") < encode("\U00010000")
    assert encode("\ud7ff") < encode("\ud800") < encode("\ue000")


# --- cross-type order -----------------------------------------------------------------
def test_cross_type_order_is_by_type_tag() -> None:
    ordered_values = [
        None,
        False,
        True,
        -(10**30),
        0,
        10**30,
        -math.inf,
        0.5,
        math.inf,
        float("nan"),
        "",
        "zzz",
        b"",
        b"\xff",
        (),
        (None,),
    ]
    encoded = [encode((v,)) if isinstance(v, tuple) else encode(v) for v in ordered_values]
    assert encoded == sorted(encoded)


def test_ints_and_floats_do_not_interleave() -> None:
    assert encode(10**30) < encode(-1.0)


def test_bool_and_int_differ() -> None:
    assert encode(True) != encode(1)
    assert encode(False) != encode(0)
    assert decode(encode(True)) is True


# --- tuples ---------------------------------------------------------------------------
@given(comparable_tuples())
def test_tuple_order_matches_python(pair: tuple[tuple, tuple]) -> None:
    _assert_order(*pair)


@given(comparable_tuples())
def test_nested_tuple_order_matches_python(pair: tuple[tuple, tuple]) -> None:
    a, b = pair
    # the same tuples, one level down, inside a composite key
    _assert_order(("k", a), ("k", b))
    _assert_order((a, 1), (b, 1))


@given(st.lists(VALUES, max_size=6).map(tuple))
def test_prefix_property(value: tuple) -> None:
    full = encode(value)
    for k in range(len(value) + 1):
        assert full.startswith(encode(value[:k]))


def test_prefix_examples() -> None:
    assert encode(("user", 7, "click")).startswith(encode(("user", 7)))
    assert encode(("user", 7)).startswith(encode("user"))
    # a str element is complete: "use" is not an element prefix of "user"
    assert not encode(("user", 7)).startswith(encode("use"))


def test_nested_tuple_needs_terminator() -> None:
    assert encode(((1,), 2)) == b"\x50\x15\x01\x00\x15\x02"
    assert encode(((1,), 9)) < encode(((1, 0),))
    assert decode(encode(((), ((),)))) == ((), ((),))


def test_namedtuple_and_subclasses_are_accepted() -> None:
    point = namedtuple("point", "x y")

    class Color(enum.IntEnum):
        RED = 3

    class Name(str):
        pass

    assert encode(point(1, "a")) == encode((1, "a"))
    assert encode(("p", point(1, 2))) == encode(("p", (1, 2)))
    assert encode(Color.RED) == encode(3)
    assert encode(Name("x")) == encode("x")
    assert encode(bytearray(b"ab")) == encode(b"ab")
    assert encode(memoryview(b"ab")) == encode(b"ab")
    assert encode(np.int64(-5)) == encode(-5)
    assert encode(np.float32(0.5)) == encode(0.5)
    assert encode(np.float64(0.25)) == encode(0.25)
    assert encode(Fraction(1, 4)) == encode(0.25)


# --- errors ---------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [{"a": 1}, {1, 2}, object(), 1j, np.bool_(True), frozenset()])
def test_unsupported_types_raise_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match=r"^serde 'ordered' cannot serialize .+ \(\w+\): expected"):
        encode(bad)


def test_type_error_inside_tuple_names_element_and_key() -> None:
    with pytest.raises(TypeError) as info:
        encode(("user", {"x": 1}))
    msg = str(info.value)
    assert msg.startswith("serde 'ordered' cannot serialize {'x': 1} (dict)")
    assert "element of ('user', {'x': 1})" in msg


def test_error_repr_is_truncated() -> None:
    with pytest.raises(TypeError) as info:
        encode({"k" * 500})
    shown = str(info.value).split("serialize ", 1)[1].split(" (set)")[0]
    assert len(shown) <= 60 and shown.endswith("...")


@pytest.mark.parametrize(
    "data",
    [
        b"\x15",  # truncated 1-byte int
        b"\x1c\x01",  # truncated 8-byte int
        b"\x15\x00",  # non-canonical (leading zero)
        b"\x13\xff",  # non-canonical negative
        b"\x21\x00",  # truncated float
        b"\x30abc",  # unterminated str
        b"\x40ab",  # unterminated bytes
        b"\x30\xff\xfe\x00",  # invalid UTF-8
        b"\x50\x15\x01",  # unterminated nested tuple
        b"\x00",  # terminator outside a nested tuple
        b"\x99",  # unknown tag
        b"\xff",  # unknown tag
        b"\x1d\x01\x05\x01\x02\x03\x04\x05",  # big-int form for a small int
        b"\x1d\x01\x09\x01",  # truncated big int
        b"\x1d",  # truncated big int header
        b"\x0b\xfe",  # truncated negative big int
    ],
)
def test_malformed_input_raises_value_error(data: bytes) -> None:
    with pytest.raises(ValueError, match=r"^serde 'ordered' cannot deserialize"):
        decode(data)


def test_deep_nesting_decodes_without_recursion() -> None:
    depth = 5000
    data = b"\x50" * depth + b"\x00" * depth
    out = decode(data)
    for _ in range(depth - 1):
        assert isinstance(out, tuple) and len(out) == 1
        out = out[0]
    assert out == ()


def test_decode_accepts_bytes_likes_and_rejects_others() -> None:
    assert decode(bytearray(encode(("a", 1)))) == ("a", 1)
    assert decode(memoryview(encode(5))) == 5
    with pytest.raises(TypeError, match="ordered"):
        decode("not bytes")  # type: ignore[arg-type]


# --- whole columns at once ------------------------------------------------------------
COLUMN_TYPES = {
    # Arrow text is valid UTF-8: no lone surrogates.
    "string": st.text(st.characters(exclude_categories=("Cs",)))
    | st.sampled_from(["", "\x00", "a\x00\x00b", "é日😀", "\x00\xff"]),
    "binary": BINARY,
    "int8": st.integers(-(2**7), 2**7 - 1),
    "int16": st.integers(-(2**15), 2**15 - 1),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1)
    | st.sampled_from([0, 1, -1, 255, 256, -256, -257, 2**56, -(2**56), 2**63 - 1, -(2**63)]),
}
COLUMN_KINDS = st.sampled_from(sorted(COLUMN_TYPES))


@st.composite
def column_tables(draw: st.DrawFn) -> tuple[list, list[tuple]]:
    """(columns as ``encode_columns`` takes them, the same rows as Python tuples): top-level
    columns and nested tuples of columns, a few rows of values of each column's type."""
    layout = draw(st.lists(COLUMN_KINDS | st.lists(COLUMN_KINDS, min_size=1, max_size=3),
                           min_size=1, max_size=4))  # fmt: skip
    n = draw(st.integers(0, 6))

    def column(kind: str) -> tuple[pa.Array, list]:
        values = draw(st.lists(COLUMN_TYPES[kind], min_size=n, max_size=n))
        return pa.array(values, getattr(pa, kind)()), values

    columns, per_element = [], []
    for element in layout:
        if isinstance(element, str):
            array, values = column(element)
            columns.append(array)
            per_element.append(values)
        else:
            arrays, lists = zip(*map(column, element), strict=True)
            columns.append(list(arrays))
            per_element.append(list(zip(*lists, strict=True)) if n else [])
    rows = [tuple(values[i] for values in per_element) for i in range(n)]
    return columns, rows


@given(column_tables())
def test_whole_columns_encode_byte_for_byte_as_each_row(table: tuple[list, list[tuple]]) -> None:
    columns, rows = table
    encoded = encode_columns(columns)
    assert encoded is not None
    assert encoded.type == pa.binary()
    assert encoded.to_pylist() == [encode(row) for row in rows]


def test_columns_of_other_types_or_with_nulls_are_left_to_encode() -> None:
    ints = pa.array([1, 2], pa.int64())
    assert encode_columns([ints, pa.array([1.5, 2.0])]) is None  # floats
    assert encode_columns([pa.array([1, 2], pa.uint64())]) is None
    assert encode_columns([pa.array([True, False])]) is None
    assert encode_columns([ints, pa.array(["a", None])]) is None  # a null
    assert encode_columns([[ints, pa.array([1, None], pa.int32())]]) is None
    assert encode_columns([ints]).to_pylist() == [encode(1), encode(2)]
