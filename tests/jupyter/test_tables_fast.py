"""iqkit.tables decoding stored bytes in bulk with Arrow (``tables.bulk_decode``) must
give exactly what decoding every row with the engine gives: same schema, values, chunks
and errors. Each test runs the same query on the same real RocksDB store both ways.

Scans here read RocksDB (``twin_scans(False)``): the columnar twins, which a scan reads
by default, are held to the RocksDB path by tests/store/test_twin_scans.py."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from helpers import request, write_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iqkit
from iqkit import PrefixScanQuery, RangeQuery, RawScanQuery, tables
from iqkit.store.columnar import twins
from iqkit.store.partitions.layers import ScanIterator, twin_scans
from iqkit.tables import collect, store_batches


# -- running both ways -----------------------------------------------------------------------
@contextlib.contextmanager
def tables_settings(**values: Any) -> Iterator[None]:
    """Module settings of iqkit.tables set for a block (hypothesis examples share one
    function-scoped fixture, so monkeypatch cannot reset them per example)."""
    old = {name: getattr(tables, name) for name in values}
    for name, value in values.items():
        setattr(tables, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(tables, name, value)


def normalized(value: Any) -> Any:
    """``value`` with floats made comparable: NaN equals NaN, -0.0 differs from 0.0."""
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else value.hex())
    if isinstance(value, list):
        return [normalized(v) for v in value]
    if isinstance(value, dict):
        return [(k, normalized(v)) for k, v in value.items()]
    return value


def outcome(fn: Callable[[], Any]) -> Any:
    """What ``fn`` gives, comparable: a table as (schema, chunk lengths, normalized rows),
    a raised exception as (type, message)."""
    try:
        out = fn()
    except Exception as exc:  # the row path's error must be the bulk path's error
        return ("raised", type(exc), str(exc))
    if isinstance(out, tables.Collected):
        return (
            outcome(lambda: out.table),
            out.rows_per_partition,
            out.truncated,
        )
    assert isinstance(out, pa.Table)
    chunks = [[len(c) for c in column.chunks] for column in out.columns]
    return (out.schema, chunks, normalized(out.to_pylist()))


def both_ways(fn: Callable[[], Any]) -> tuple[Any, Any]:
    with tables.bulk_decode(True):
        bulk = outcome(fn)
    with tables.bulk_decode(False):
        rows = outcome(fn)
    return bulk, rows


def assert_same_both_ways(fn: Callable[[], Any]) -> Any:
    bulk, rows = both_ways(fn)
    assert bulk == rows
    return bulk


@pytest.fixture(autouse=True)
def scans_read_rocksdb() -> Iterator[None]:
    with twin_scans(False):
        yield


@pytest.fixture
def bulk_chunks(monkeypatch) -> list[bool]:
    """For every chunk a scan offered to bulk decoding: whether it was decoded in bulk
    (True) or left to the row path (False). A commit shaping its columnar twin's
    columns offers chunks too; those are not recorded."""
    seen: list[bool] = []
    decode = tables._Shaper._bulk_columns
    twin_table = twins.twin_table
    writing = []

    def recording(self, segments, key_offset):
        cols = decode(self, segments, key_offset)
        if not writing:
            seen.append(cols is not None)
        return cols

    def shaping_a_twin(*args, **kwargs):
        writing.append(True)
        try:
            return twin_table(*args, **kwargs)
        finally:
            writing.pop()

    monkeypatch.setattr(tables._Shaper, "_bulk_columns", recording)
    monkeypatch.setattr(twins, "twin_table", shaping_a_twin)
    return seen


def scan(engine: iqkit.StateEngine, store: str, query=None, **kwargs) -> tables.Collected:
    query = query or RangeQuery.with_no_bounds()
    return collect(
        engine.query(request(store, query)), engine.manifest(store), query=query, **kwargs
    )


def write_bytes_as(root: Path, name: str, rows, *, value_serde: str = "json", **settings):
    """A store whose values are the given bytes, declared as ``value_serde``: what
    another writer (Spark, a Kafka consumer) can leave, pretty-printed JSON or worse.
    Written with the ``bytes`` serde, then the manifest names the real one."""
    write_store(root, name, rows, value_serde="bytes", **settings)
    rewrite_manifest(root, name, value_serde=value_serde)


def rewrite_manifest(root: Path, name: str, **changes) -> None:
    """Change settings in ``name``'s manifest on disk (what no iqkit writer does)."""
    path = root / name / "manifest.json"
    data = json.loads(path.read_text())
    data.pop("checksum")  # written by hand: no checksum (store/integrity.py)
    path.write_text(json.dumps({**data, **changes}))


# -- the bulk path is taken where it should be -------------------------------------------------
def test_serde_columns_and_json_records_are_decoded_in_bulk(root, bulk_chunks):
    records = [
        {
            "n": i,
            "x": i / 4,
            "s": f"é{i}😀",
            "ok": i % 2 == 0,
            "tags": ["a", None],
            "at": {"city": "Zürich", "zip": i},
            "key": "inner",
            "never": None,
        }
        for i in range(50)
    ]
    write_store(root, "j", [(f"k{i:03d}", r) for i, r in enumerate(records)], partitions=3)
    write_store(
        root, "i", [(i, i * 2**40) for i in range(-20, 20)], key_serde="int32", value_serde="int64"
    )
    write_store(
        root, "d", [(i / 3, -i / 7) for i in range(30)], key_serde="double", value_serde="double"
    )
    write_store(
        root,
        "b",
        [(bytes([i, 0]), bytes([255, i])) for i in range(30)],
        key_serde="bytes",
        value_serde="bytes",
    )
    write_store(root, "s", [(f"ключ{i}", f"значение{i}") for i in range(30)], value_serde="string")
    write_store(
        root,
        "t",
        [((i % 3, f"u{i}"), {"v": i}) for i in range(30)],
        key_serde="ordered",
        properties={"key_columns": ["region", "user"]},
    )
    with iqkit.open(root) as engine:
        got = {
            name: assert_same_both_ways(lambda name=name: scan(engine, name))
            for name in ("j", "i", "d", "b", "s", "t")
        }
        raw = assert_same_both_ways(lambda: scan(engine, "j", RawScanQuery.scan()))
        streamed = assert_same_both_ways(
            lambda: store_batches(engine, "j", batch_size=7).read_all()
        )
    assert bulk_chunks and all(bulk_chunks)
    schema = got["j"][0][0]
    assert schema.names == [
        "partition",
        "key",
        "n",
        "x",
        "s",
        "ok",
        "tags",
        "at",
        "value.key",
        "never",
    ]
    assert schema.field("at").type == pa.struct([("city", pa.string()), ("zip", pa.int64())])
    assert schema.field("never").type == pa.null()
    assert got["i"][0][0].field("key").type == pa.int32()
    assert got["t"][0][0].names == ["partition", "region", "user", "v"]
    assert raw[0][0].field("value").type == pa.binary()
    never = schema.get_field_index("never")  # null-only in the sample: a string stream column
    assert streamed[0] == schema.set(never, pa.field("never", pa.string()))


def test_iso_dates_stay_strings_in_bulk(root, bulk_chunks):
    # pyarrow.json reads "2020-01-01" as a timestamp; json.loads (the row path) as text.
    rows = [
        ("a", {"day": "2020-01-01", "at": {"t": "2021-03-04T05:06:07"}, "l": ["2020-01-01"]}),
        ("b", {"day": "2020-01-02 10:00:00", "at": {"t": None}, "l": []}),
    ]
    write_store(root, "ts", rows, partitions=1)
    with iqkit.open(root) as engine:
        (table_outcome, _, _) = assert_same_both_ways(lambda: scan(engine, "ts"))
    schema, _, got = table_outcome
    assert bulk_chunks == [True]
    assert schema.field("day").type == pa.string()
    assert schema.field("at").type == pa.struct([("t", pa.string())])
    assert got[0][2] == ("day", "2020-01-01")


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ([{"n": 1}, {"n": 2**63}], "an int beyond 64 bits is JSON text, not a double"),
        ([{"n": 0.5}, {"n": 2**53 + 1}], "an int beyond 2**53 cannot share a double column"),
        ([{"n": 1}, {"n": "one"}], "mixed types are JSON text"),
        ([{"n": 1}, 2], "not every value is a record"),
        ([{"n": {"a": 1}}, {"n": {"a": True}}], "mixed nested types"),
    ],
)
def test_what_bulk_decoding_leaves_to_the_row_path(root, bulk_chunks, values, why):
    write_store(root, "m", [(f"k{i}", v) for i, v in enumerate(values)], partitions=1)
    with iqkit.open(root) as engine:
        assert_same_both_ways(lambda: scan(engine, "m"))
    assert bulk_chunks == [False], why


@pytest.mark.parametrize(
    "value",
    [
        b'{"n": 1, "s": "x"}',  # spaces: fine in bulk
        b'{"n":1,"s":"\\u00e9\\ud83d\\ude00"}',  # ASCII-escaped, surrogate pair
    ],
)
def test_json_from_other_writers_in_bulk(root, bulk_chunks, value):
    write_bytes_as(root, "o", [("a", value), ("b", b'{"n":2}')], partitions=1)
    with iqkit.open(root) as engine:
        assert_same_both_ways(lambda: scan(engine, "o"))
    assert bulk_chunks == [True]


# Bytes pyarrow.json reads differently from json.loads (or crashes on: a lone "null").
ODD_JSON = [
    b"null",
    b"1",
    b"[1]",
    b'"s"',
    b"",
    b"{}",
    b"{} {}",
    b'{"a":1}}',
    b'{"a":1} ',
    b' {"a":1}',
    b'{\n"a": 1\n}',
    b'{"a":1}\n',
    b'{"a":Inf}',
    b'{"a":-Inf}',
    b'{"a":-NaN}',
    b'{"a":NaN}',
    b'{"a":Infinity}',
    b'{"a":1e400}',
    b'{"a":1,"a":2}',
    b'{"a":1,"\\u0061":2}',
    b'\xef\xbb\xbf{"a":1}',
    b'{"a":"\xff"}',
    b'{"a":"\xed\xa0\x80"}',
    b'{"a":"\x01"}',
    b'{"a":"\\ud800"}',
    b'{"a":18446744073709551616}',
    b'{"a":[1,-9223372036854775809]}',
    b'{"a":tru}',
    b'{"a":1,}',
    b'{"a":01}',
    b'{"a":"2020-01-01"}',
    b'{"a":{"b":{}}}',
]


@pytest.mark.parametrize("odd", ODD_JSON)
def test_odd_json_bytes_decode_as_the_row_path_does(root, odd):
    rows = [("a", b'{"a":1}'), ("b", odd), ("c", b'{"a":2.5}')]
    write_bytes_as(root, "o", rows, partitions=1)
    with iqkit.open(root) as engine:
        assert_same_both_ways(lambda: scan(engine, "o"))
        assert_same_both_ways(lambda: store_batches(engine, "o").read_all())
        assert_same_both_ways(lambda: store_batches(engine, "o", sample_rows=1).read_all())


def test_malformed_bytes_raise_the_serdes_error_both_ways(root):
    write_bytes_as(root, "bad", [("a", b'{"a":1}'), ("b", b'{"a":')], partitions=1)
    write_bytes_as(root, "utf", [("a", b"ok"), ("b", b"\xff")], partitions=1, value_serde="string")
    with iqkit.open(root) as engine:
        for store in ("bad", "utf"):
            bulk = assert_same_both_ways(lambda store=store: scan(engine, store))
            assert bulk[:2] == ("raised", ValueError), store
            assert f"serde '{engine.manifest(store).value_serde}'" in bulk[2]
            bulk = assert_same_both_ways(lambda store=store: store_batches(engine, store))
            assert bulk[:2] == ("raised", ValueError)


def test_invalid_utf8_string_keys_raise_the_serdes_error_both_ways(root):
    iqkit.create_store(root, "k", partitions=1, key_serde="bytes", value_serde="int64")
    with iqkit.StoreWriter(root, "k") as w:
        w.put(b"ok", 1)
        w.put(b"\xc3\x28", 2)
    rewrite_manifest(root, "k", key_serde="string")
    with iqkit.open(root) as engine:
        bulk = assert_same_both_ways(lambda: scan(engine, "k"))
    assert bulk[:2] == ("raised", ValueError) and "invalid UTF-8" in bulk[2]


def test_bulk_collect_keeps_limit_progress_and_read_times(root, bulk_chunks):
    write_store(root, "big", [(f"k{i:05d}", {"n": i}) for i in range(9_000)], partitions=3)
    seen: list[int] = []
    with iqkit.open(root) as engine:
        result = engine.query(request("big", RangeQuery.with_no_bounds()))
        iterators = [r.result for r in result.partition_results.values()]
        c = collect(result, engine.manifest("big"), limit=5_000, progress=seen.append)
        with tables.bulk_decode(False):
            slow = scan(engine, "big", limit=5_000)
    assert bulk_chunks and all(bulk_chunks)
    assert c.table.equals(slow.table) and c.truncated and slow.truncated
    assert c.rows_per_partition == slow.rows_per_partition
    assert seen == sorted(seen) and seen[-1] == 5_000
    assert all(it.is_closed for it in iterators)
    assert all(c.read_ns[p] > 0 for p, n in c.rows_per_partition.items() if n)


# -- ScanIterator.take_chunks (iqkit/store/partitions/layers.py) --------------------------
def test_a_scan_hands_over_its_rows_undecoded_only_before_reading(root):
    write_store(root, "s", [(f"k{i}", {"n": i}) for i in range(5)], partitions=1)
    query = RangeQuery.with_no_bounds().with_descending_keys()
    with iqkit.open(root) as engine:
        typed = engine.query(request("s", query)).partition_results[0].result.to_list()
        it = engine.query(request("s", query)).partition_results[0].result
        assert isinstance(it, ScanIterator)
        chunks = it.take_chunks()
        assert chunks is not None and it.take_chunks() is None
        stored = [row for chunk in chunks for row in chunk]
        assert it.decode(stored) == typed  # same rows, same (descending) order
        assert all(
            k[it.key_offset :].decode() == kv.key for (k, _), kv in zip(stored, typed, strict=True)
        )
        assert list(it) == []  # handed over: the iterator itself yields nothing more

        read = engine.query(request("s", query)).partition_results[0].result
        assert read.peek_next_key() == "k4"
        assert read.take_chunks() is None  # rows were decoded already
        assert read.to_list() == typed

        closed = engine.query(request("s", query)).partition_results[0].result
        closed.close()
        assert closed.take_chunks() is None


def test_closing_a_scan_ends_the_chunks_it_handed_over(root):
    write_store(root, "s", [(f"k{i:04d}", i) for i in range(3_000)], partitions=1)
    with iqkit.open(root) as engine:
        it = engine.query(request("s", RangeQuery.with_no_bounds())).partition_results[0].result
        chunks = it.take_chunks()
        first = next(chunks)
        it.close()
        assert 0 < len(first) < 3_000
        assert next(chunks, None) is None  # the RocksDB iterator was released


# -- property: any records, both ways ------------------------------------------------------------
FIELDS = st.sampled_from(["a", "b", "n", "key", "partition", "value.key", "é", "x y", "", "ts"])
INTS = st.integers(-(2**70), 2**70) | st.sampled_from(
    [0, -1, 2**53, 2**53 + 1, -(2**53) - 1, 2**63 - 1, -(2**63), 2**63, 2**64]
)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)  # the json serde writes no NaN
TEXT = st.text(max_size=5) | st.sampled_from(
    ["2020-01-01", "2021-03-04T05:06:07", "2021-03-04 05:06:07Z", "12:30", "😀", "\n", "\x00"]
)
SCALARS = st.none() | st.booleans() | INTS | FLOATS | TEXT
ANYTHING = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(FIELDS, inner, max_size=3),
    max_leaves=6,
)
#: Per field, the values it holds: one kind per field makes columns Arrow can type in
#: bulk; "anything" mixes types (JSON text in the row path).
KINDS = {
    "int": st.integers(-(10**6), 10**6),
    "int64+": INTS,
    "float": FLOATS,
    "number": st.integers(-100, 100) | FLOATS,
    "text": TEXT,
    "bool": st.booleans(),
    "list": st.lists(st.none() | st.integers(-5, 5), max_size=3),
    "numbers": st.lists(st.integers(-5, 5) | FLOATS, max_size=3),
    "struct": st.dictionaries(
        st.sampled_from(["x", "y", "z"]), st.none() | st.integers(0, 9) | TEXT, max_size=3
    ),
    "structs": st.lists(
        st.dictionaries(st.sampled_from(["x", "y"]), st.integers(0, 9)), max_size=2
    ),
    "null": st.none(),
    "anything": ANYTHING,
}


@st.composite
def record_lists(draw) -> list[dict[str, Any]]:
    fields = draw(st.lists(FIELDS, unique=True, max_size=5))
    kinds = {f: KINDS[draw(st.sampled_from(sorted(KINDS)))] for f in fields}
    records = []
    for _ in range(draw(st.integers(1, 24))):
        present = draw(st.permutations(fields))[: draw(st.integers(0, len(fields)))]
        records.append({f: draw(st.none() | kinds[f]) for f in present})
    return records


PROPERTY = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@PROPERTY
@given(
    records=record_lists(),
    chunk_rows=st.sampled_from([3, 8, 65_536]),
    limit=st.none() | st.integers(0, 30),
    batch_size=st.sampled_from([2, 5, 65_536]),
    sample_rows=st.sampled_from([1, 4, 2_048]),
    bounds=st.tuples(st.none() | st.integers(0, 30), st.none() | st.integers(0, 30)),
    descending=st.booleans(),
)
def test_json_records_bulk_equals_row_by_row(
    tmp_path_factory, records, chunk_rows, limit, batch_size, sample_rows, bounds, descending
):
    root = tmp_path_factory.mktemp("records")
    write_store(root, "r", [(f"k{i:02d}", r) for i, r in enumerate(records)], partitions=2)
    lo, hi = (None if b is None else f"k{b:02d}" for b in bounds)
    query = RangeQuery.with_range(lo, hi)
    query = query.with_descending_keys() if descending else query
    with tables_settings(CHUNK_ROWS=chunk_rows, PROGRESS_ROWS=3), iqkit.open(root) as engine:
        assert_same_both_ways(lambda: scan(engine, "r", limit=limit))
        assert_same_both_ways(lambda: scan(engine, "r", query))
        assert_same_both_ways(lambda: scan(engine, "r", PrefixScanQuery.with_prefix("k1")))
        assert_same_both_ways(
            lambda: store_batches(
                engine, "r", batch_size=batch_size, sample_rows=sample_rows
            ).read_all()
        )


ENCODINGS: dict[str, Callable[[Any], bytes]] = {
    "compact": lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode(),
    "spaced": lambda v: json.dumps(v).encode(),  # ensure_ascii: \\u escapes, surrogate pairs
    "indented": lambda v: json.dumps(v, indent=1).encode(),  # newlines: never bulk
}


@PROPERTY
@given(
    records=record_lists(),
    encoding=st.sampled_from(sorted(ENCODINGS)),
    odd=st.none() | st.sampled_from(ODD_JSON),
)
def test_json_bytes_from_other_writers_bulk_equals_row_by_row(
    tmp_path_factory, records, encoding, odd
):
    root = tmp_path_factory.mktemp("bytes")
    values = [ENCODINGS[encoding](r) for r in records]
    if odd is not None:
        values[len(values) // 2] = odd
    write_bytes_as(root, "o", [(f"k{i:02d}", v) for i, v in enumerate(values)], partitions=2)
    with iqkit.open(root) as engine:
        assert_same_both_ways(lambda: scan(engine, "o"))
        assert_same_both_ways(lambda: store_batches(engine, "o", sample_rows=3).read_all())


@PROPERTY
@given(
    serdes=st.sampled_from(
        [
            ("int32", "int64"),
            ("int64", "double"),
            ("double", "string"),
            ("string", "bytes"),
            ("bytes", "int32"),
            ("ordered", "json"),
        ]
    ),
    data=st.data(),
)
def test_serde_columns_bulk_equal_row_by_row(tmp_path_factory, serdes, data):
    values = {
        "int32": st.integers(-(2**31), 2**31 - 1),
        "int64": st.integers(-(2**63), 2**63 - 1),
        "double": st.floats(),  # NaN, infinities and -0.0 too
        "string": st.text(max_size=6),
        "bytes": st.binary(max_size=6),
        "ordered": st.tuples(st.integers(-5, 5), st.text(max_size=2)) | st.integers(-5, 5),
        "json": st.integers() | st.dictionaries(FIELDS, SCALARS, max_size=3),
    }
    key_serde, value_serde = serdes
    keys = data.draw(st.lists(values[key_serde], max_size=30, unique_by=repr))
    rows = [(k, data.draw(values[value_serde])) for k in keys]
    root = tmp_path_factory.mktemp("serdes")
    write_store(root, "s", rows, partitions=2, key_serde=key_serde, value_serde=value_serde)
    with iqkit.open(root) as engine:
        assert_same_both_ways(lambda: scan(engine, "s"))
        assert_same_both_ways(lambda: scan(engine, "s", RawScanQuery.scan()))
        assert_same_both_ways(lambda: store_batches(engine, "s", batch_size=7).read_all())


def test_bulk_decode_switches_the_path_for_a_block_and_restores_it_on_error(root, bulk_chunks):
    """The row-by-row path is chosen with a context manager, never by setting a module
    flag: the bulk path comes back after the block, even when the block raised."""
    write_store(root, "sw", [(f"k{i}", {"n": i}) for i in range(50)], partitions=1)
    with iqkit.open(root) as engine:
        with pytest.raises(RuntimeError, match="boom"), tables.bulk_decode(False):
            assert scan(engine, "sw").table.num_rows == 50
            assert not bulk_chunks  # no stored bytes were taken
            raise RuntimeError("boom")
        assert scan(engine, "sw").table.num_rows == 50
    assert bulk_chunks and all(bulk_chunks)
