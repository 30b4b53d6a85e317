"""A state store's rows as iqkit stores them (store/checkpoint/shape.py), without Spark:
the fast writer of whole-number rows gives the json serde's bytes exactly, and a whole
version shaped at once (``stored_columns``) gives exactly the bytes of its rows shaped
one by one (``store_rows``), or leaves them to it."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from unsafe_rows import BLOBS, NUMBERS, TEXT, encode_row, records_of, schema

from iqkit.store.checkpoint.shape import StateShape
from iqkit.store.checkpoint.state_records import StateRows
from iqkit.store.checkpoint.unsafe_row import RowDecoder
from iqkit.store.encoding.serdes import get_serde

KEY_SCHEMA = {"type": "struct", "fields": [{"name": "user", "type": "string"}]}
WHOLE = {
    "long": st.integers(-(2**63), 2**63 - 1),
    "integer": st.integers(-(2**31), 2**31 - 1),
    "short": st.integers(-(2**15), 2**15 - 1),
    "byte": st.integers(-128, 127),
    "boolean": st.booleans(),
}


@st.composite
def value_rows(draw):
    kinds = draw(st.lists(st.sampled_from(sorted(WHOLE)), min_size=1, max_size=5))
    names = draw(st.lists(st.text(min_size=1, max_size=6), min_size=len(kinds),
                          max_size=len(kinds), unique=True))  # fmt: skip
    fields = [{"name": n, "type": k} for n, k in zip(names, kinds, strict=True)]
    rows = draw(st.lists(st.tuples(*[st.none() | WHOLE[k] for k in kinds]), max_size=5))
    return fields, rows


@given(value_rows())
def test_whole_number_rows_are_written_as_the_json_serde_writes_them(case):
    fields, rows = case
    shape = StateShape(KEY_SCHEMA, {"type": "struct", "fields": fields})
    serde = get_serde("json")
    for row in rows:
        assert shape._value_bytes(row) == serde.serialize(shape.value_of(row))


# -- a whole version at once --------------------------------------------------------------
BULK_KINDS = sorted(NUMBERS)


@st.composite
def states(draw):
    """(value kinds, value names, records): the records of a state keyed by one string
    column in replay order, keys coming back (updates) and removed now and then, now and
    then null or not UTF-8; values numbers and booleans, nulls among them."""
    kinds = draw(st.lists(st.sampled_from(BULK_KINDS), min_size=1, max_size=5))
    names = draw(st.lists(st.text(min_size=1, max_size=6), min_size=len(kinds),
                          max_size=len(kinds), unique=True))  # fmt: skip
    keys = st.none() | TEXT | BLOBS if draw(st.booleans()) else TEXT
    few = draw(st.lists(keys, min_size=1, max_size=4))  # drawn again: updates, removals
    values = st.tuples(*[st.none() | NUMBERS[k] for k in kinds])
    removal = st.none() if draw(st.booleans()) else st.nothing()
    rows = draw(st.lists(st.tuples(keys | st.sampled_from(few), values | removal), max_size=12))
    return kinds, names, rows


def state_of(kinds, names, rows) -> tuple[StateShape, StateRows]:
    key_schema = schema(["string"], ["user"])
    value_schema = schema(kinds, names)
    pairs = [
        (encode_row(["string"], [k]), None if v is None else encode_row(kinds, list(v)))
        for k, v in rows
    ]
    state = StateRows(records_of(pairs), RowDecoder(key_schema), RowDecoder(value_schema))
    return StateShape(key_schema, value_schema), state


def stored_by_rows(shape: StateShape, state: StateRows) -> list[tuple[bytes, bytes]] | Exception:
    try:
        return sorted(shape.store_rows(state))
    except (TypeError, ValueError) as exc:  # a null key; a value JSON has no number for
        return exc


@given(states())
def test_a_version_shaped_at_once_is_byte_for_byte_the_rows_shaped_one_by_one(case):
    kinds, names, rows = case
    shape, state = state_of(kinds, names, rows)
    columns = shape.stored_columns(state)
    expected = stored_by_rows(shape, state)
    odd = any(key is None or (isinstance(key, bytes) and not _utf8(key)) for key, _ in rows) or any(
        isinstance(v, float) and not math.isfinite(v) for _, values in rows for v in values or ()
    )
    if columns is None:  # only where store_rows treats rows apart
        assert odd
        return
    assert isinstance(expected, list)
    keys, values = columns
    assert list(zip(keys.to_pylist(), values.to_pylist(), strict=True)) == expected


def _utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def test_other_shapes_are_left_to_the_rows_path():
    value = schema(["long"], ["n"])
    assert not StateShape(schema(["long"], ["id"]), value)._bulk_shape  # ordered serde
    assert not StateShape(schema(["string", "long"]), value)._bulk_shape
    assert not StateShape(schema(["string"]), schema(["string"]))._bulk_shape
    assert not StateShape(schema(["string"]), schema(["long", "long"], ["n", "n"]))._bulk_shape
    assert StateShape(schema(["string"]), schema(["double", "boolean"]))._bulk_shape


def test_a_value_column_name_twice_is_written_as_the_serde_writes_it():
    shape = StateShape(KEY_SCHEMA, schema(["long", "long"], ["n", "n"]))
    assert shape._value_bytes((1, 2)) == get_serde("json").serialize(shape.value_of((1, 2)))


def test_nan_and_infinities_in_spark_state_are_kept_not_refused():
    """Spark's state may hold NaN or an infinity (a ``max`` over doubles): the row is
    stored with JSON's lenient tokens and reads back as the same floats."""
    shape = StateShape(KEY_SCHEMA, schema(["double", "double", "long"], ["max", "min", "n"]))
    stored = shape._value_bytes((math.nan, -math.inf, 3))
    assert stored == b'{"max":NaN,"min":-Infinity,"n":3}'
    back = get_serde("json").deserialize(stored)
    assert math.isnan(back["max"]) and back["min"] == -math.inf and back["n"] == 3
