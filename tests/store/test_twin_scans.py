"""Scans read from columnar twins (store/columnar/) give exactly what the same scans give
from RocksDB: random histories of commits (puts, deletes, compactions, retention) over
several partitions and every serde, commits with position deletes and without them (an
earlier iqkit's: chains then merge on keys), every scan shape (full, range, prefix,
ascending and descending), every retained version (``as_of``), compared row by row.

The rows compared are the engine's ``KeyValue``s (what a notebook iterates): a scan of
twins decodes them from the same stored bytes, so they must be equal, floats bit for
bit. Tables (``collect``) are compared too where Arrow's types are fixed by the serdes;
for JSON records, whose column types Arrow infers, the twins infer them per file and the
row path per chunk read, so there the values are compared field by field.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iqkit
from iqkit import KeyQuery, PrefixScanQuery, RangeQuery, StateQueryRequest
from iqkit.store.columnar import twins as twin_module
from iqkit.store.columnar.deletes import writing
from iqkit.store.partitions.layers import twin_scans
from iqkit.tables import bulk_decode, collect, store_batches

VALUES = {
    "string": st.text(max_size=5),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1),
    "double": st.floats(),  # NaN, infinities and -0.0 too
    "bytes": st.binary(max_size=5),
    "ordered": st.tuples(st.integers(-3, 3), st.text("ab", max_size=2)),
    # Records whose fields keep one type, so Arrow's columns are the same however many
    # rows a type is inferred from; and any JSON value, compared value by value.
    "json": st.fixed_dictionaries(
        {"n": st.integers(-1000, 1000), "s": st.text("xyz", max_size=3)},
        optional={"f": st.floats(allow_nan=False, allow_infinity=False)},
    ),
    "json-any": st.recursive(
        st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.text("ab", max_size=2),
        lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.sampled_from("ab"), inner),
        max_leaves=4,
    ),
}
SERDES = [
    ("string", "json"),
    ("string", "json-any"),
    ("int32", "int64"),
    ("int64", "double"),
    ("double", "string"),
    ("bytes", "bytes"),
    ("ordered", "json"),
    ("string", "ordered"),
]

PROPERTY = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def same(a: Any, b: Any) -> bool:
    """Equal, with floats compared bit for bit (NaN equals NaN, -0.0 differs from 0.0)."""
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack(">d", a) == struct.pack(">d", b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def rows_of(engine: iqkit.StateEngine, store: str, query: Any) -> dict[int, list[tuple]]:
    result = engine.query(StateQueryRequest.in_store(store).with_query(query))
    out = {}
    for p, r in result.partition_results.items():
        assert r.is_success, r.failure_message
        out[p] = [(kv.key, kv.value) for kv in r.result]
    return out


def both(fn: Any) -> tuple[Any, Any]:
    """``fn()`` reading twins, then reading RocksDB."""
    with twin_scans(True), bulk_decode(True):
        twins = fn()
    with twin_scans(False), bulk_decode(False):
        rocks = fn()
    return twins, rocks


def cell(value: Any) -> Any:
    """A table cell as a JSON value (JSON-text cells parsed), for value-by-value checks."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def scans(key_serde: str, keys: list[Any]) -> list[Any]:
    """Every scan shape over keys like ``keys``."""
    queries: list[Any] = [
        RangeQuery.with_no_bounds(),
        RangeQuery.with_no_bounds().with_descending_keys(),
    ]
    ordered = sorted(keys, key=repr)
    if len(ordered) >= 2:
        lo, hi = ordered[0], ordered[-1]
        if key_serde != "double" or not any(map(math.isnan, (lo, hi))):
            queries += [
                RangeQuery.with_range(lo, hi),
                RangeQuery.with_lower_bound(hi).with_descending_keys(),
                RangeQuery.with_upper_bound(lo),
            ]
    if key_serde == "string":
        queries += [
            PrefixScanQuery.with_prefix("a"),
            PrefixScanQuery.with_prefix("").with_descending_keys(),
        ]
    if key_serde == "bytes":
        queries += [PrefixScanQuery.with_prefix(b"\x00")]
    return queries


def twin_files(root: Path, store: str) -> list[Path]:
    return sorted((root / store / "sst").rglob("*.parquet"))


@PROPERTY
@given(serdes=st.sampled_from(SERDES), data=st.data())
def test_twin_scans_equal_rocksdb_scans(tmp_path_factory, serdes, data):
    key_serde, value_serde = serdes
    keyspace = data.draw(st.lists(VALUES[key_serde], min_size=1, max_size=12, unique_by=repr))
    if key_serde == "string":
        keyspace = [*keyspace, "a", "ab", "b"]
    root = tmp_path_factory.mktemp("twins")
    retention = data.draw(st.integers(2, 4))
    iqkit.create_store(
        root,
        "s",
        partitions=data.draw(st.integers(1, 3)),
        key_serde=key_serde,
        value_serde="json" if value_serde == "json-any" else value_serde,
        retention=retention,
    )
    commits = data.draw(st.integers(1, 11))  # over 9 commits: a chain is compacted
    # Row groups of 2 or 3 rows: files of several, some held whole by a scan's bounds
    # (read without the key column when the reader names none) and some not.
    group_rows = data.draw(st.sampled_from([2, 3, twin_module.ROW_GROUP_ROWS]))
    for _ in range(commits):
        # A commit without position deletes is one of an earlier iqkit: chains mixing
        # both are merged on keys, chains whose newest twin has them by position.
        positions = data.draw(st.integers(0, 3)) > 0
        with (
            mock.patch.object(twin_module, "ROW_GROUP_ROWS", group_rows),
            writing(positions),
            iqkit.StoreWriter(root, "s") as w,
        ):
            for key in data.draw(st.lists(st.sampled_from(keyspace), max_size=8)):
                if data.draw(st.integers(0, 3)) == 0:
                    w.delete(key)
                else:
                    w.put(key, data.draw(VALUES[value_serde]))
    with iqkit.open(root) as latest:
        versions = latest.versions("s")
    assert bool(versions) == bool(twin_files(root, "s"))
    for version in versions:
        with iqkit.open(root, as_of=version) as engine:
            manifest = engine.manifest("s")
            if value_serde != "json-any":  # any JSON may hold what Parquet cannot
                read_from_twins(engine, "s")
            for query in [*scans(key_serde, keyspace), None, *scans(key_serde, keyspace)]:
                if query is None:
                    # Again with every partition's database open: the rows then come from
                    # it, and only a reader taking the twins whole (tables) plans them.
                    open_databases(engine, "s", keyspace)
                    continue
                twins, rocks = both(lambda q=query: rows_of(engine, "s", q))
                assert twins.keys() == rocks.keys()
                for p in twins:
                    assert len(twins[p]) == len(rocks[p]), (version, query, p)
                    assert all(map(same, twins[p], rocks[p])), (version, query, p)
                if value_serde == "json-any":
                    continue  # which values become record fields depends on the rows read
                tables = both(
                    lambda q=query, m=manifest: (
                        (
                            collect(engine.query(StateQueryRequest.in_store("s").with_query(q)), m)
                        ).table
                    )
                )
                check_tables(*tables, exact=value_serde != "ordered")
            streams = both(lambda: store_batches(engine, "s").read_all())
            if value_serde != "json-any":
                check_tables(*streams, exact=value_serde != "ordered")


def open_databases(engine: iqkit.StateEngine, store: str, keys: list[Any]) -> None:
    """Opens the database of every partition a key of ``keys`` belongs to (a partition's
    first key lookup reads its files in place, the next one opens its database)."""
    for key in keys:
        for _ in range(2):
            request = StateQueryRequest.in_store(store).with_query(
                KeyQuery.with_key(key).skip_cache()
            )
            assert all(r.is_success for r in engine.query(request).partition_results.values())


def read_from_twins(engine: iqkit.StateEngine, store: str) -> None:
    """Every partition written so far is scanned from its twins (also after compaction)."""
    request = (
        StateQueryRequest.in_store(store)
        .with_query(RangeQuery.with_no_bounds())
        .enable_execution_info()
    )
    for p, r in engine.query(request).partition_results.items():
        lines = r.execution_info
        written = not any("never written" in s or "nothing fetched" in s for s in lines)
        assert not written or any("ColumnarScan" in line for line in lines), (p, lines)


def check_tables(twins: pa.Table, rocks: pa.Table, *, exact: bool) -> None:
    """The same rows: equal tables (but for fields null in every row, which only the
    twins' files may have, and the order of record fields), or, for values whose types
    Arrow infers, equal values cell by cell."""
    a, b = twins.to_pylist(), rocks.to_pylist()
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        extra = {k for k in x.keys() - y.keys() if x[k] is None}
        assert x.keys() - extra == y.keys()
        for k in y:
            if exact:
                assert same(x[k], y[k]), (k, x[k], y[k])
            else:
                assert same(cell(x[k]), cell(y[k])) or x[k] == y[k], (k, x[k], y[k])
    if exact:
        names = [n for n in rocks.column_names]
        assert twins.select(names).schema == rocks.schema


def test_a_twin_holds_the_sst_rows_typed(root):
    iqkit.create_store(root, "t", partitions=1, key_serde="string", value_serde="json")
    with iqkit.StoreWriter(root, "t") as w:
        w.put("a", {"n": 1, "s": "x"})
        w.put("b", {"n": 2, "s": "y"})
    with iqkit.StoreWriter(root, "t") as w:
        w.delete("a")
        w.put("c", {"n": 3.5})
    base, delta = (pq.read_table(p) for p in twin_files(root, "t"))
    assert base.column("key").to_pylist() == ["a", "b"]
    assert base.schema.field("n").type == pa.int64()
    assert delta.column("__deleted").to_pylist() == [True, False]
    # String keys give the RocksDB key back: the twin keeps no __key, and no value bytes.
    assert delta.column("key").to_pylist() == ["a", "c"]
    assert "__key" not in delta.column_names and "__value" not in delta.column_names
    assert delta.column("n").to_pylist() == [None, 3.5]
    iqkit.create_store(root, "o", partitions=1, key_serde="ordered", value_serde="int64")
    with iqkit.StoreWriter(root, "o") as w:
        w.put((1, "x"), 5)
    (ordered,) = (pq.read_table(p) for p in twin_files(root, "o"))
    assert ordered.column("__key").to_pylist()[0][:1] == b"\x01"  # ordered keys keep it
    with iqkit.open(root) as engine:
        r = engine.query(
            StateQueryRequest.in_store("t")
            .with_query(RangeQuery.with_no_bounds())
            .enable_execution_info()
        ).partition_results[0]
        assert [(kv.key, kv.value) for kv in r.result] == [
            ("b", {"n": 2, "s": "y"}),
            ("c", {"n": 3.5}),
        ]
        assert any(
            line.startswith("Handled in ColumnarScan") and "2 files" in line
            for line in r.execution_info
        )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "stores"


def test_floats_of_unique_values_are_split_by_byte_and_repeated_ones_take_a_dictionary(root):
    """Random floats compress only once their bytes are split into streams (the sign and
    exponent bytes repeat; Parquet's BYTE_STREAM_SPLIT); floats that repeat keep their
    dictionary. Both read back bit for bit, through the twins and through RocksDB."""
    iqkit.create_store(root, "f", partitions=1, key_serde="string", value_serde="json")
    values = {f"k{i:05d}": {"x": i * 0.7310585786, "p": (i % 7) / 4} for i in range(3_000)}
    with iqkit.StoreWriter(root, "f") as w:
        for k, v in values.items():
            w.put(k, v)
    (twin,) = twin_files(root, "f")
    group = pq.ParquetFile(twin).metadata.row_group(0)
    columns = [group.column(c) for c in range(group.num_columns)]
    encodings = {c.path_in_schema: c.encodings for c in columns}
    assert "BYTE_STREAM_SPLIT" in encodings["x"]
    assert "RLE_DICTIONARY" in encodings["p"] and "BYTE_STREAM_SPLIT" not in encodings["p"]
    with iqkit.open(root) as engine:
        (r,) = engine.query(
            StateQueryRequest.in_store("f").with_query(RangeQuery.with_no_bounds())
        ).partition_results.values()
        got = {kv.key: kv.value for kv in r.result}
    assert got.keys() == values.keys() and all(same(got[k], values[k]) for k in values)
    table = pq.read_table(twin)
    assert table.column("x").to_pylist() == [v["x"] for v in values.values()]


def test_a_twin_swapped_for_a_link_after_planning_is_never_read(root, tmp_path):
    """A scan opens its twin through the root, refusing a link, also when the link is
    put in place after the scan was planned (the file was checked then)."""
    iqkit.create_store(root, "t", partitions=1, key_serde="string", value_serde="int64")
    with iqkit.StoreWriter(root, "t") as w:
        w.put("a", 1)
    other = tmp_path / "other"  # another store's twin: what a link would show
    iqkit.create_store(other, "o", partitions=1, key_serde="string", value_serde="int64")
    with iqkit.StoreWriter(other, "o") as w:
        w.put("a", 666)
    (twin,) = twin_files(root, "t")
    (outside,) = twin_files(other, "o")
    with iqkit.open(root) as engine:
        r = engine.query(StateQueryRequest.in_store("t").with_query(RangeQuery.with_no_bounds()))
        it = r.partition_results[0].result  # planned: its footer was read
        twin.unlink()
        twin.symlink_to(outside)
        with pytest.raises(iqkit.IqkitError, match="link"):
            list(it)


@settings(max_examples=300, deadline=None)
@given(
    groups=st.lists(
        st.tuples(
            st.integers(0, 2),
            st.none() | st.tuples(st.binary(max_size=2), st.binary(max_size=2)).map(sorted),
        ),
        max_size=8,
    ),
    ordered=st.booleans(),
    lower=st.binary(max_size=2),
    upper=st.none() | st.binary(max_size=2),
)
def test_a_twins_row_groups_are_found_as_one_test_per_group_finds_them(
    groups, ordered, lower, upper
):
    """Planning finds a sorted twin's row groups by bisection (``_Footer.overlapping``):
    the same groups as testing each group's key statistics against the bounds, for
    sorted groups, unsorted ones, empty ones and ones without statistics."""
    from iqkit.store.columnar.scan import _Footer, _overlaps

    groups = [(rows, tuple(b) if b is not None else None) for rows, b in groups]
    if ordered:  # as a twin is written: each group's keys after the previous group's
        edges = sorted(e for _, b in groups if b is not None for e in b)
        it = iter(edges)
        groups = [(rows, (next(it), next(it)) if b is not None else None) for rows, b in groups]
    footer = _Footer(pa.schema([]), None, None, groups)
    expected = [g for g, (rows, b) in enumerate(groups) if rows and _overlaps(b, lower, upper)]
    assert footer.overlapping(lower, upper) == expected


def test_a_scan_beside_an_open_database_reads_it_and_leaves_the_twins_to_tables(root):
    """Once a partition's database is open, a scan's rows come from it: without a trace
    its twins are not even planned unless a table reader takes them (a damaged twin is
    then never noticed by iterating), and with one the trace says where the rows come
    from (the RocksDB iterator only where there are no twins to read: it opens only if
    the rows are read). A table reader reads the twins, and a damaged twin it finds is
    the partition's verdict. The same rows every way."""
    expected = [(f"k{i}", i) for i in range(1, 6)]
    for store in ("whole", "damaged"):
        iqkit.create_store(root, store, partitions=1, key_serde="string", value_serde="int64")
        with iqkit.StoreWriter(root, store) as w:
            for i in range(5):
                w.put(f"k{i}", i)
        with iqkit.StoreWriter(root, store) as w:
            w.delete("k0")
            w.put("k5", 5)

    def scan(store: str) -> StateQueryRequest:
        return StateQueryRequest.in_store(store).with_query(PrefixScanQuery.with_prefix("k"))

    def table_rows(engine: iqkit.StateEngine, store: str) -> list[tuple]:
        table = collect(engine.query(scan(store)), engine.manifest(store)).table
        return list(zip(*(table.column(c).to_pylist() for c in ("key", "value")), strict=True))

    with iqkit.open(root) as engine:
        for store in ("whole", "damaged"):
            open_databases(engine, store, ["k1"])
        for twin in twin_files(root, "damaged"):
            twin.write_bytes(b"not a parquet file")
        # Iterated without a trace: the rows of the database; the twins are not read.
        for store in ("whole", "damaged"):
            assert [
                tuple(kv) for kv in engine.query(scan(store)).partition_results[0].result
            ] == expected
        traced = engine.query(scan("whole").enable_execution_info()).partition_results[0]
        assert [tuple(kv) for kv in traced.result] == expected
        (columnar,) = [line for line in traced.execution_info if "ColumnarScan" in line]
        assert "2 files" in columnar and "rows iterated are read from RocksDB" in columnar
        assert not any("bounded iterator" in line for line in traced.execution_info)
        assert table_rows(engine, "whole") == expected
        # Damaged twins: a table reader plans them and finds the damage, which is the
        # partition's verdict from then on (store/integrity.py: the database beside
        # them must not hide it), in every shape.
        with pytest.raises(iqkit.StoreCorruptedError, match=r"\.parquet is damaged"):
            table_rows(engine, "damaged")
        traced = engine.query(scan("damaged").enable_execution_info()).partition_results[0]
        assert traced.failure_reason.name == "STORE_EXCEPTION"
        assert ".parquet is damaged" in traced.failure_message
        key = engine.query(
            StateQueryRequest.in_store("damaged").with_query(KeyQuery.with_key("k1"))
        )
        assert ".parquet is damaged" in key.partition_results[0].failure_message


#: Keys sharing prefixes, of varied lengths (NULs inside and at the end): a key and the
#: same key with bytes after it, around each other in the files' merge; some long.
SHAPED_KEYS = st.lists(st.sampled_from([b"\x00", b"a", b"\xff", b"~" * 130]), max_size=4).map(
    b"".join
)
#: What goes before every key of a store: nothing (short keys: compared as numbers),
#: some bytes (compared as byte strings) or many (compared by Arrow's sort).
KEY_HEADS = st.sampled_from([b"", b"head-", b"h" * 200])
MERGED = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@MERGED
@given(key_serde=st.sampled_from(["bytes", "string", "int64"]), data=st.data())
def test_a_chain_merged_by_position_is_in_key_order_as_rocksdb_has_it(
    tmp_path_factory, key_serde, data
):
    """A base and deltas with position deletes (puts, deletes, new keys between old
    ones) read from the twins: the same rows in the same order as RocksDB gives them,
    whole (``store_batches``), by range, and descending."""
    head = data.draw(KEY_HEADS)
    if key_serde == "int64":
        keys = data.draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=30))
    else:
        raw = [head + k for k in data.draw(st.lists(SHAPED_KEYS, min_size=1, max_size=30))]
        keys = raw if key_serde == "bytes" else [k.decode("latin-1") for k in raw]
    keys = list(dict.fromkeys(keys))
    root = tmp_path_factory.mktemp("merged")
    iqkit.create_store(root, "s", partitions=data.draw(st.integers(1, 2)), key_serde=key_serde)
    for c in range(data.draw(st.integers(2, 7))):
        with writing(True), iqkit.StoreWriter(root, "s") as w:
            for key in data.draw(st.lists(st.sampled_from(keys), min_size=c == 0)):
                if c and data.draw(st.integers(0, 3)) == 0:
                    w.delete(key)
                else:
                    w.put(key, {"n": data.draw(st.integers(-9, 9)), "c": c})
    lo, hi = sorted(data.draw(st.lists(st.sampled_from(keys), min_size=2, max_size=2)), key=repr)
    queries = [
        RangeQuery.with_no_bounds(),
        RangeQuery.with_no_bounds().with_descending_keys(),
        RangeQuery.with_range(lo, hi),
        RangeQuery.with_lower_bound(lo).with_descending_keys(),
    ]
    with iqkit.open(root) as engine:
        streams = both(lambda: store_batches(engine, "s").read_all())
        assert streams[0].to_pylist() == streams[1].to_pylist()
        for query in queries:
            twins, rocks = both(lambda q=query: rows_of(engine, "s", q))
            assert twins == rocks, query


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(SHAPED_KEYS, unique=True, max_size=40),
    head=KEY_HEADS,
    text=st.booleans(),
    data=st.data(),
)
def test_files_rows_are_merged_as_sorting_them_would_order_them(keys, head, text, data):
    """``key_order.merge_order`` (files' live rows, each file's in key order, no key
    live in two files, with superseded rows among them) gives the live rows in byte
    order."""
    from iqkit.store.encoding.key_order import merge_order

    keys = [head + k for k in keys]
    files = data.draw(st.integers(1, 5))
    home = {k: data.draw(st.integers(-1, files - 1)) for k in keys}  # -1: deleted
    arrays, kept = [], []
    for i in range(files):
        rows = sorted(k for k in keys if home[k] == i or data.draw(st.integers(0, 2)) == 0)
        arrays.append(pa.array([r.decode("latin-1") for r in rows] if text else rows))
        kept.append(np.array([j for j, k in enumerate(rows) if home[k] == i], dtype=np.int64))
    every = [k for a in arrays for k in a.to_pylist()]
    got = [every[i] for i in merge_order(arrays, kept)]
    live = sorted(k for k in keys if home[k] >= 0)
    assert got == ([k.decode("latin-1") for k in live] if text else live)


def test_a_reader_naming_only_value_columns_reads_no_key_column(root):
    """A table reader that names its columns (the Spark data source with a schema of
    value columns only) gets tables of those columns: the key column is not even read
    for row groups its bounds hold whole, and is read where the bounds cut a group."""
    iqkit.create_store(root, "s", partitions=1, key_serde="string", value_serde="int64")
    with mock.patch.object(twin_module, "ROW_GROUP_ROWS", 4), iqkit.StoreWriter(root, "s") as w:
        for i in range(10):
            w.put(f"k{i}", i)

    def tables(query: Any) -> list[pa.Table]:
        with iqkit.open(root) as engine:
            request = StateQueryRequest.in_store("s").with_query(query)
            result = engine.query(request).partition_results[0].result
            return list(result.take_twin(["value"]))

    whole = tables(RangeQuery.with_no_bounds())
    assert [t.column("value").to_pylist() for t in whole] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert not any("key" in t.column_names for t in whole)
    cut = tables(RangeQuery.with_range("k2", "k9"))  # the first and last groups are cut
    assert [v for t in cut for v in t.column("value").to_pylist()] == list(range(2, 10))
    assert "key" in cut[0].column_names and "key" not in cut[1].column_names
