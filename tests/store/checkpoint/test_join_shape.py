"""A stream-stream join side shaped a whole partition at once (``JoinShape.stored_columns``)
gives exactly the bytes of its keys shaped one by one (``store_rows`` over the
``SideState``), or leaves them to it; and the frozen join cells are shaped at once.

The states are made as Spark's join makes them, without Spark: a side's two stores
written record by record in replay order (rows appended, a row updated in place, a row
evicted with the key's last row moved into its index, a key removed), as
``store/checkpoint/joins.py``'s docstring says Spark keeps them.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from unsafe_rows import BLOBS, NUMBERS, TEXT, encode_row, records_of, schema

from iqkit.store.checkpoint.codecs import StateFileError
from iqkit.store.checkpoint.joins import JoinShape, SideState, is_join_side, open_side
from iqkit.store.checkpoint.layout import operator_stores
from iqkit.store.checkpoint.providers import StateReader, VersionFiles
from iqkit.store.checkpoint.snapshot import committed_versions
from iqkit.store.checkpoint.state_records import StateRows
from iqkit.store.checkpoint.unsafe_row import RowDecoder
from iqkit.store.objects import open_objects

#: Micros (days for a date) of years 1 to 9999: what Python's datetimes hold.
MICROS = st.integers(-62_135_596_800_000_000, 253_402_300_799_999_999)
DAYS = st.integers(-719_162, 2_932_896)
#: What each row column kind is drawn from, and the kind its slot is written as.
ROW_KINDS = {
    "long": (NUMBERS["long"], "long"),
    "integer": (NUMBERS["integer"], "integer"),
    "boolean": (NUMBERS["boolean"], "boolean"),
    "double": (NUMBERS["double"], "double"),
    "string": (TEXT | BLOBS, "string"),
    "timestamp": (MICROS, "long"),
    "timestamp_ntz": (MICROS, "long"),
    "date": (DAYS, "integer"),
}
KEY = schema(["string"], ["field0"])
COUNTS_KEY, COUNT = KEY, schema(["long"], ["value"])
ROWS_KEY = schema(["string", "long"], ["field0", "index"])
FILES = VersionFiles("state/0/0/left", None, "query\nleft-keyToNumValues/1.delta")


@st.composite
def sides(draw):
    """(row kinds, counts store records, rows store records, damaged): a join side's two
    stores in replay order, made by Spark's moves on a few keys; ``damaged``: a row
    record of a counted key left out (the stores disagree)."""
    kinds = draw(st.lists(st.sampled_from(sorted(ROW_KINDS)), min_size=1, max_size=4))
    kinds.append("boolean")  # matched
    written = [ROW_KINDS[k][1] for k in kinds]
    odd_keys = draw(st.booleans())
    key = st.none() | TEXT | BLOBS if odd_keys else TEXT
    few = draw(st.lists(key, min_size=1, max_size=4, unique_by=repr))
    row = st.tuples(*[st.none() | ROW_KINDS[k][0] for k in kinds])
    held: dict[object, list[tuple]] = {}
    counts: list[tuple[bytes, bytes | None]] = []
    rows: list[tuple[bytes, bytes | None]] = []

    def count(k):
        n = len(held[k])
        counts.append((encode_row(["string"], [k]), encode_row(["long"], [n]) if n else None))
        if not n:
            del held[k]

    def put(k, i):
        rows.append((encode_row(["string", "long"], [k, i]), encode_row(written, held[k][i])))

    def drop(k, i):
        rows.append((encode_row(["string", "long"], [k, i]), None))

    move_kinds = st.sampled_from(["add", "add", "update", "evict", "remove"])
    for move, k in draw(st.lists(st.tuples(move_kinds, st.sampled_from(few)), max_size=16)):
        if move == "add" or k not in held:
            held.setdefault(k, []).append(list(draw(row)))
            put(k, len(held[k]) - 1)
            count(k)
        elif move == "update":  # a row joined: its matched flag rewritten in place
            i = draw(st.integers(0, len(held[k]) - 1))
            held[k][i][-1] = True
            put(k, i)
        elif move == "evict":  # the last row moves into the evicted row's index
            i = draw(st.integers(0, len(held[k]) - 1))
            last = len(held[k]) - 1
            held[k][i] = held[k][last]
            held[k].pop()
            if i != last:
                put(k, i)
            drop(k, last)
            count(k)
        else:
            for i in range(len(held[k])):
                drop(k, i)
            held[k] = []
            count(k)
    damaged = bool(held) and draw(st.booleans())
    if damaged:
        k = draw(st.sampled_from(sorted(held, key=repr)))
        i = draw(st.integers(0, len(held[k]) - 1))
        target = encode_row(["string", "long"], [k, i])
        rows = [(rk, rv) for rk, rv in rows if rk != target]
    return kinds, counts, rows, damaged or odd_keys


def side_of(kinds, counts, rows) -> tuple[JoinShape, SideState]:
    row_schema = schema(kinds, [f"c{i}" for i in range(len(kinds) - 1)] + ["matched"])
    state = SideState(
        StateRows(records_of(counts), RowDecoder(COUNTS_KEY), RowDecoder(COUNT)),
        StateRows(records_of(rows), RowDecoder(ROWS_KEY), RowDecoder(row_schema)),
        FILES,
    )
    return JoinShape(KEY, row_schema, side="left"), state


def stored_by_rows(shape: JoinShape, state: SideState) -> list[tuple[bytes, bytes]] | Exception:
    try:
        return sorted(shape.store_rows(state))
    except (TypeError, ValueError, StateFileError) as exc:  # a null key; a missing row
        return exc


def _rows_written_apart(kinds, rows) -> bool:
    """Whether a row holds what ``json_objects`` leaves to ``store_rows``: NaN or an
    infinity, text that is not UTF-8, a date or instant before the year 1000."""
    for _, value in rows:
        if value is None:
            continue
        decoded = RowDecoder(schema(kinds)).decode(value)
        for kind, v in zip(kinds, decoded, strict=True):
            if v is None:
                continue
            if kind == "double" and not math.isfinite(v):
                return True
            if kind.startswith(("timestamp", "date")) and v.year < 1000:
                return True
            if kind == "string" and "\ufffd" in v:
                return True
    return False


@given(sides())
def test_a_join_side_shaped_at_once_is_byte_for_byte_the_keys_shaped_one_by_one(case):
    kinds, counts, rows, odd = case
    shape, state = side_of(kinds, counts, rows)
    columns = shape.stored_columns(state)
    expected = stored_by_rows(shape, state)
    if columns is None:  # only where store_rows treats the state apart, or refuses it
        assert odd or _rows_written_apart(kinds, rows)
        return
    assert isinstance(expected, list)
    keys, values = columns
    assert list(zip(keys.to_pylist(), values.to_pylist(), strict=True)) == expected


def test_escapes_and_text_are_written_as_the_json_serde_writes_them():
    kinds = ["string", "timestamp", "date", "double", "boolean"]
    text = 'a"b\\c\x00\x1f\n\t\u2028é日😀\x7f'
    rows_written = [
        (encode_row(["string", "long"], ["k", 0]),
         encode_row(["string", "long", "integer", "double", "boolean"],
                    [text, 1_700_000_000_123_456, 19_000, 0.1, None])),
        (encode_row(["string", "long"], ["k", 1]),
         encode_row(["string", "long", "integer", "double", "boolean"],
                    [None, None, None, -0.0, True])),
    ]  # fmt: skip
    counts = [(encode_row(["string"], ["k"]), encode_row(["long"], [2]))]
    shape, state = side_of(kinds, counts, rows_written)
    columns = shape.stored_columns(state)
    assert columns is not None
    (value,) = columns[1].to_pylist()
    assert [(columns[0][0].as_py(), value)] == stored_by_rows(shape, state)
    first = json.loads(value)[0]
    assert first["c0"] == text and first["c1"] == "2023-11-14T22:13:20.123456Z"


def test_a_counted_row_missing_is_left_to_the_row_path_which_names_it():
    counts = [(encode_row(["string"], ["k"]), encode_row(["long"], [2]))]
    rows = [(encode_row(["string", "long"], ["k", 0]), encode_row(["long", "boolean"], [1, 0]))]
    shape, state = side_of(["long", "boolean"], counts, rows)
    assert shape.stored_columns(state) is None
    with pytest.raises(StateFileError, match="counts 2 rows but row 1 is missing"):
        list(shape.store_rows(state))


# -- the frozen join cells -----------------------------------------------------------------
CELLS = sorted(
    cell
    for cell in Path("tests/data/checkpoints").glob("*/join-*")
    if (cell / "checkpoint").is_dir() and "-v4-" not in cell.name  # format 4: refused
)


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: f"{c.parent.name}/{c.name}")
def test_the_frozen_join_cells_are_shaped_at_once(cell, tmp_path):
    """Every side, version and partition of the frozen join cells (formats 1 to 3, both
    providers) takes the bulk path, and gives the rows path's bytes: if the bulk path
    stopped serving Spark's own join state, this fails."""
    objects = open_objects(cell / "checkpoint")
    reader = StateReader(objects)
    shaped = 0
    for store in filter(is_join_side, operator_stores(objects)):
        side, shape = open_side(reader, store)
        for version in committed_versions(objects):
            for p in range(store.partitions):
                files = side.version_files(store, p, version)
                with tempfile.TemporaryDirectory(dir=tmp_path) as work:
                    state = side.state_rows(store, version, files, work)
                    columns = shape.stored_columns(state)
                    assert columns is not None, (store.name, version, p)
                    found = list(zip(*(c.to_pylist() for c in columns), strict=True))
                    assert found == sorted(shape.store_rows(state))
                    shaped += len(found)
    assert shaped
