"""A transformWithState variable's version shaped at once (``TransformShape.stored_columns``,
store/checkpoint/transform.py) gives exactly the bytes of its rows shaped one by one
(``store_rows``), or leaves them to it: random value and map states (several user keys per
grouping key, grouping keys of several columns, nulls, text that is not UTF-8, values the
JSON writer declines, keys cut short), and every version and partition of the frozen
transformWithState cells, whose value and map states must take the bulk path.

Removals are not drawn here: a variable's rows are its column family's live keys, which
the changelog replay (``rocksdb_files.load_family_state``) settles before they are shaped;
the frozen cells remove map entries and values between versions."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from unsafe_rows import BLOBS, NUMBERS, TEXT, encode_row, schema

from iqkit.errors import IqkitError
from iqkit.store.checkpoint.layout import committed_batches, operator_stores, state_partitions
from iqkit.store.checkpoint.providers import StateReader
from iqkit.store.checkpoint.state_schema import ColumnFamilySchema
from iqkit.store.checkpoint.transform import TransformShape, VariableRows, _Codec
from iqkit.store.checkpoint.variables import LIST, MAP, TIMER, VALUE
from iqkit.store.objects import open_objects

CELLS_DIR = Path("tests/data/checkpoints")
relaxed = settings(deadline=None, max_examples=150)

#: Key column kinds and values; those ``stored_columns`` does not serve in keys last.
KEY_KINDS = {
    "string": TEXT,
    "long": NUMBERS["long"],
    "integer": NUMBERS["integer"],
    "short": NUMBERS["short"],
    "byte": NUMBERS["byte"],
    "binary": BLOBS,
    "boolean": NUMBERS["boolean"],
    "double": NUMBERS["double"],
}
SERVED_KEYS = {"string", "long", "integer", "short", "byte", "binary"}
#: Value column kinds: numbers and booleans (column-wise), strings (row by row).
VALUE_KINDS = {**NUMBERS, "string": TEXT}


def _part(draw, *, odd: bool, most: int = 3) -> tuple[list[str], st.SearchStrategy]:
    """A key part's column kinds and a strategy for its values; ``odd``: kinds and values
    the bulk path leaves to the row path among them (nulls, text that is not UTF-8)."""
    kinds = draw(st.lists(st.sampled_from(sorted(KEY_KINDS if odd else SERVED_KEYS)),
                          min_size=1, max_size=most))  # fmt: skip

    def column(kind: str) -> st.SearchStrategy:
        if odd:
            return st.none() | KEY_KINDS[kind]
        return st.text(max_size=8) if kind == "string" else KEY_KINDS[kind]

    return kinds, st.tuples(*map(column, kinds))


def _row(kinds: list[str], values: tuple[Any, ...]) -> bytes:
    return b"\x00" + encode_row(kinds, list(values))  # Spark's version byte, then the row


def _wrapped(kinds: list[str], values: tuple[Any, ...], nested: bool) -> bytes:
    """A prefix-scan key part: a row of one struct column (a struct's slot is laid out as
    a binary's), or with ``nested`` false the part's own row."""
    if not nested:
        return _row(kinds, values)
    return b"\x00" + encode_row(["binary"], [encode_row(kinds, list(values))])


def _struct(kinds: list[str], prefix: str) -> dict[str, Any]:
    return schema(kinds, [f"{prefix}{i}" for i in range(len(kinds))])


@st.composite
def variables(draw):
    """(shape, rows): a value or map state's shape and its family's live keys and values,
    as Spark's RocksDB encoder writes them in UnsafeRows."""
    kind = draw(st.sampled_from([VALUE, MAP]))
    odd = draw(st.booleans())
    group_kinds, groups = _part(draw, odd=odd)
    value_kinds = draw(st.lists(st.sampled_from(sorted(VALUE_KINDS)), min_size=1, max_size=3))
    value_schema = _struct(value_kinds, "v")
    values = st.tuples(*[st.none() | VALUE_KINDS[k] for k in value_kinds])
    group_schema = _struct(group_kinds, "g")
    rows: dict[bytes, bytes] = {}
    if kind == VALUE:
        for group in draw(st.lists(groups, max_size=8)):
            rows[_row(group_kinds, group)] = _row(value_kinds, draw(values))
        family = ColumnFamilySchema("v", group_schema, value_schema)
        shape = TransformShape(group_schema, value_schema, VALUE)
    else:
        nested = draw(st.booleans())  # the user key a struct, or a column of its own
        user_kinds, users = _part(draw, odd=odd and draw(st.booleans()), most=3 if nested else 1)
        user_schema = _struct(user_kinds, "u")
        for group in draw(st.lists(groups, max_size=5)):
            first = _wrapped(group_kinds, group, True)
            for user in draw(st.lists(users, min_size=1, max_size=4)):
                key = struct.pack("<i", len(first)) + first + _wrapped(user_kinds, user, nested)
                rows[key] = _row(value_kinds, draw(values))
        user = {"name": "userKey", "type": user_schema} if nested else user_schema["fields"][0]
        fields = [{"name": "key", "type": group_schema}, user]
        spec = {"keyStateEncoderType": "PrefixKeyScanStateEncoderSpec", "numColsPrefixKey": 1}
        family = ColumnFamilySchema(
            "m", {"type": "struct", "fields": fields}, value_schema, key_encoder_spec=spec
        )
        shape = TransformShape(group_schema, value_schema, MAP, user_schema)
    if odd and rows and draw(st.booleans()):  # a key cut short
        key = draw(st.sampled_from(sorted(rows)))
        rows[key[: draw(st.integers(0, len(key) - 1))]] = rows.pop(key)
    return shape, odd, VariableRows(rows, _Codec(family, False, "test"), shape.kind, b"")


def _by_rows(shape: TransformShape, rows: VariableRows) -> list[tuple[bytes, bytes]] | Exception:
    try:
        return sorted(shape.store_rows(rows))
    except (IqkitError, TypeError, ValueError) as exc:  # a key cut short, two keys alike
        return exc


@relaxed
@given(variables())
def test_a_variable_shaped_at_once_is_byte_for_byte_its_rows_shaped_one_by_one(case):
    shape, odd, rows = case
    columns = shape.stored_columns(rows)
    expected = _by_rows(shape, rows)
    if columns is None:  # only for what the row path treats apart
        assert odd
        return
    assert isinstance(expected, list), expected
    keys, values = columns
    assert list(zip(keys.to_pylist(), values.to_pylist(), strict=True)) == expected
    assert len(set(keys.to_pylist())) == len(expected)


# -- the frozen cells ----------------------------------------------------------------------
CELLS = sorted(
    str(path.relative_to(CELLS_DIR))
    for path in CELLS_DIR.glob("*/tws-*")
    if (path / "checkpoint").is_dir()
)
#: The value and map states of the frozen cells (``total``, ``amounts``): keys of a string
#: grouping key and a long user key, values with a TTL column (row by row).
BULK_STORES = ("transform.total", "transform.amounts")


@pytest.mark.parametrize("cell", CELLS)
def test_frozen_value_and_map_states_are_shaped_at_once_as_row_by_row(cell, tmp_path):
    """Every version and partition of a frozen cell's value and map state: UnsafeRows take
    the bulk path (``stored_columns`` gives the columns, not ``None``), byte for byte what
    the row path stores; Avro rows are left to the row path."""
    objects = open_objects(CELLS_DIR / cell / "checkpoint")
    reader = StateReader(objects)
    avro = "avro" in cell
    stores = {s.name: s for s in operator_stores(objects)}
    shaped = 0
    for name in BULK_STORES:
        store = stores[name]
        shape = reader.shape(store)
        assert isinstance(shape, TransformShape)
        for batch in committed_batches(objects):
            version = batch + 1
            for p in range(state_partitions(objects, store, version)):
                files = reader.version_files(store, p, version)
                rows = reader.state_rows(store, version, files, tmp_path / f"{name}-{version}-{p}")
                columns = shape.stored_columns(rows)
                if avro:
                    assert columns is None
                    continue
                assert columns is not None, f"{name} version {version} partition {p}"
                keys, values = columns
                expected = sorted(shape.store_rows(rows))
                assert list(zip(keys.to_pylist(), values.to_pylist(), strict=True)) == expected
                shaped += len(expected)
    assert avro or shaped > 0


def test_lists_and_timers_are_left_to_the_row_path(tmp_path):
    objects = open_objects(CELLS_DIR / CELLS[-1] / "checkpoint")
    reader = StateReader(objects)
    for store in operator_stores(objects):
        shape = reader.shape(store)
        if shape.kind in (LIST, TIMER):
            version = committed_batches(objects)[-1] + 1
            files = reader.version_files(store, 0, version)
            assert shape.stored_columns(reader.state_rows(store, version, files, tmp_path)) is None
