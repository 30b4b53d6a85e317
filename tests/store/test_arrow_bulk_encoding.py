"""Whole-column encoding for bulk writes: ``Serde.serialize_arrow`` and
``keyspace.kv_keys_arrow`` agree with their one-value-at-a-time counterparts."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iqkit.store.encoding import keyspace
from iqkit.store.encoding.serdes import SERDE_NAMES, get_serde

relaxed = settings(deadline=None)  # first calls pay numpy/pyarrow warm-up; shared machine

INT_TYPES = {
    pa.int8(): (-(2**7), 2**7 - 1),
    pa.int16(): (-(2**15), 2**15 - 1),
    pa.int32(): (-(2**31), 2**31 - 1),
    pa.int64(): (-(2**63), 2**63 - 1),
    pa.uint8(): (0, 2**8 - 1),
    pa.uint32(): (0, 2**32 - 1),
}


def expected(serde_name, values):
    serde = get_serde(serde_name)
    return [None if v is None else serde.serialize(v) for v in values]


def sliced(values, arrow_type, head=2):
    """The column as a slice of a bigger array: offsets into shared buffers must hold."""
    pad = [None] * head
    return pa.array(pad + values + pad, arrow_type).slice(head, len(values))


@relaxed
@given(st.data())
@pytest.mark.parametrize("arrow_type", list(INT_TYPES), ids=str)
@pytest.mark.parametrize("serde_name", ["int32", "int64", "double"])
def test_integer_columns(serde_name, arrow_type, data):
    lo, hi = INT_TYPES[arrow_type]
    values = data.draw(st.lists(st.none() | st.integers(lo, hi), max_size=30))
    serde = get_serde(serde_name)
    fits = serde_name == "double" or all(v is None or serde.MIN <= v <= serde.MAX for v in values)
    for arr in (pa.array(values, arrow_type), sliced(values, arrow_type)):
        got = serde.serialize_arrow(arr)
        if fits:
            assert got.type == pa.binary()
            assert got.to_pylist() == expected(serde_name, values)
        else:  # out of range: no vectorized result, so serialize raises per value
            assert got is None


@relaxed
@given(st.lists(st.none() | st.floats(allow_nan=True, allow_infinity=True), max_size=30))
def test_double_columns_keep_java_nan_and_negative_zero(values):
    serde = get_serde("double")
    for arr in (pa.array(values, pa.float64()), sliced(values, pa.float64())):
        assert serde.serialize_arrow(arr).to_pylist() == expected("double", values)


@relaxed
@given(st.lists(st.none() | st.floats(width=32), max_size=30))
def test_float32_columns_widen_exactly(values):
    got = get_serde("double").serialize_arrow(pa.array(values, pa.float32()))
    assert got.to_pylist() == expected("double", values)


def test_double_specials():
    arr = pa.array([math.nan, -math.nan, -0.0, math.inf, None])
    got = get_serde("double").serialize_arrow(arr).to_pylist()
    assert got[0] == got[1] == bytes.fromhex("7ff8000000000000")  # Java's canonical NaN
    assert got[2] == bytes.fromhex("8000000000000000")
    assert got[4] is None


@relaxed
@given(st.lists(st.none() | st.text(max_size=10), max_size=30))
def test_string_columns(values):
    serde = get_serde("string")
    for t in (pa.string(), pa.large_string()):
        for arr in (pa.array(values, t), sliced(values, t)):
            got = serde.serialize_arrow(arr)
            assert got.type == pa.binary()
            assert got.to_pylist() == expected("string", values)


def test_string_column_with_invalid_utf8_has_no_vectorized_result():
    bad = pa.Array.from_buffers(
        pa.string(), 2, [None, pa.py_buffer(np.array([0, 2, 3], np.int32)), pa.py_buffer(b"ok\xff")]
    )
    assert get_serde("string").serialize_arrow(bad) is None


@relaxed
@given(st.lists(st.none() | st.binary(max_size=10), max_size=30))
def test_bytes_columns(values):
    serde = get_serde("bytes")
    for t in (pa.binary(), pa.large_binary()):
        for arr in (pa.array(values, t), sliced(values, t)):
            assert serde.serialize_arrow(arr).to_pylist() == expected("bytes", values)


@pytest.mark.parametrize(
    ("serde_name", "arr"),
    [
        ("string", pa.array([1, 2])),
        ("bytes", pa.array(["a"])),
        ("int32", pa.array([1.5])),
        ("int64", pa.array([True])),
        ("double", pa.array(["1.5"])),
        ("double", pa.array([True])),
        ("json", pa.array([1])),
        ("ordered", pa.array([1])),
    ],
)
def test_columns_without_a_vectorized_path(serde_name, arr):
    assert get_serde(serde_name).serialize_arrow(arr) is None


def test_every_serde_answers():
    """Every serde answers any column without raising: None (no vectorized path for an
    int64 column: string, bytes, json, ordered) or the column serialized value by value
    (the number serdes), an empty column too."""
    values = [0, None, -5, 2**31 - 1]
    vectorized = {"int32", "int64", "double"}
    for name in SERDE_NAMES:
        for column in ([], values):
            got = get_serde(name).serialize_arrow(pa.array(column, pa.int64()))
            if name in vectorized:
                assert got is not None and got.type == pa.binary(), name
                assert got.to_pylist() == expected(name, column), name
            else:
                assert got is None, name


@relaxed
@given(st.lists(st.binary(max_size=12), max_size=30), st.sampled_from([b"\x01", b"", b"\x02\x00"]))
def test_prefixed_keys(keys, prefix):
    want = [prefix + k for k in keys]
    for arr in (pa.array(keys, pa.binary()), sliced(keys, pa.binary())):
        got = keyspace.prefixed_arrow(prefix, arr)
        assert got.type == pa.binary() and got.to_pylist() == want
    assert keyspace.kv_keys_arrow(pa.array(keys, pa.binary())).to_pylist() == [
        keyspace.kv_key(k) for k in keys
    ]


@relaxed
@given(st.integers(0, 12), st.integers(0, 20))
def test_prefixed_keys_of_equal_length(width, count):
    keys = [bytes([i % 256]) * width for i in range(count)]
    got = keyspace.kv_keys_arrow(sliced(keys, pa.binary()))
    assert got.to_pylist() == [keyspace.kv_key(k) for k in keys]
