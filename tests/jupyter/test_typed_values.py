"""A store whose manifest declares a value schema, read as Arrow (``RowSchema``'s
``value_arrow_schema`` / ``value_arrow_arrays``, ``tables.collect``, ``store_batches``,
``%iq scan``'s result) over real RocksDB stores written by ``StoreWriter`` with the
JSON the Spark writers store."""

from __future__ import annotations

import datetime as dt
import decimal
import json

import pyarrow as pa
import pytest
from helpers import request, write_store

import iqkit
from iqkit import RangeQuery
from iqkit.errors import IqkitError
from iqkit.store.rows import RowSchema, ddl_arrow_type, parse_ddl_columns, parse_ddl_type
from iqkit.tables import collect, store_batches

DDL = (
    "`total` double, `n` bigint, `i` int, `f` float, `ok` boolean, `d` decimal(10,2), "
    "`day` date, `at` timestamp, `local` timestamp_ntz, `blob` binary, "
    "`tags` array<string>, `p` struct<x:int,`y z`:string>, `m` map<string,bigint>, "
    "`partition` string"
)
PROPS = {"key_columns": ["customer"], "value_schema": DDL}

#: One record as Spark's ``to_json`` writes it (timestamps with an offset, binary in
#: base64, decimals as numbers, null struct members left out).
SPARK_JSON = {
    "total": 2.5,
    "n": 2**40,
    "i": -3,
    "f": 0.1,
    "ok": True,
    "d": 12.3,
    "day": "2024-02-29",
    "at": "2024-03-01T12:30:00.250+01:00",
    "local": "2024-03-01T08:00:01.003",
    "blob": "AP8=",
    "tags": ["a", None],
    "p": {"x": 1},
    "m": {"k": 5},
    "partition": "p!",
}
TYPED = {
    "total": 2.5,
    "n": 2**40,
    "i": -3,
    "f": pytest.approx(0.1),
    "ok": True,
    "d": decimal.Decimal("12.30"),
    "day": dt.date(2024, 2, 29),
    "at": dt.datetime(2024, 3, 1, 11, 30, 0, 250000, tzinfo=dt.UTC),
    "local": dt.datetime(2024, 3, 1, 8, 0, 1, 3000),
    "blob": b"\x00\xff",
    "tags": ["a", None],
    "p": {"x": 1, "y z": None},
    "m": [("k", 5)],
    "value.partition": "p!",
}


def schema_of(manifest_props, **settings) -> RowSchema:
    from iqkit.store.kinds import StoreKind
    from iqkit.store.manifest import StoreManifest

    return RowSchema(
        StoreManifest(
            name="t",
            partitions=1,
            kind=StoreKind.KEY_VALUE,
            key_serde="string",
            value_serde=settings.get("value_serde", "json"),
            partitioner="murmur2",
            properties=manifest_props,
        )
    )


@pytest.fixture
def typed(root):
    rows = [(f"c{i}", SPARK_JSON) for i in range(6)] + [("c9", {}), ("c8", {"n": 1})]
    write_store(root, "orders", rows, partitions=3, properties=PROPS)
    return root


def test_value_arrow_schema_follows_sparks_arrow_mapping():
    rows = schema_of(PROPS)
    got = rows.value_arrow_schema()
    assert got.names == [*list(TYPED)[:-1], "partition"]  # members, not columns
    assert got.field("at").type == pa.timestamp("us", tz="UTC")
    assert got.field("local").type == pa.timestamp("us")
    assert got.field("d").type == pa.decimal128(10, 2)
    assert got.field("p").type == pa.struct([("x", pa.int32()), ("y z", pa.string())])
    assert got.field("m").type == pa.map_(pa.string(), pa.int64())
    assert ddl_arrow_type(parse_ddl_type("SMALLINT")) == pa.int16()
    assert ddl_arrow_type(parse_ddl_type("array<tinyint>")) == pa.list_(pa.int8())
    assert schema_of({}).value_arrow_schema() is None
    assert schema_of({"value_schema": DDL}, value_serde="string").value_arrow_schema() is None


def test_value_arrow_arrays_build_exact_typed_columns():
    rows = schema_of(PROPS)
    arrays = rows.value_arrow_arrays([SPARK_JSON, None, {}])
    table = pa.Table.from_arrays(arrays, schema=rows.value_arrow_schema())
    first, deleted, empty = table.to_pylist()
    want = dict(TYPED)
    want["partition"] = want.pop("value.partition")
    assert first == want
    assert set(deleted.values()) == {None} and set(empty.values()) == {None}


@pytest.mark.parametrize(
    ("value", "column"),
    [
        ({"n": "12"}, "n"),
        ({"i": 2**31}, "i"),
        ({"ok": 1}, "ok"),
        ({"n": True}, "n"),
        ({"d": 123456789.5}, "d"),
        ({"day": "29/02/2024"}, "day"),
        ({"blob": "not base64!"}, "blob"),
        ({"p": {"x": 1, "extra": 2}}, "p"),
        ({"tags": "a"}, "tags"),
    ],
)
def test_a_value_that_does_not_fit_names_its_column(value, column):
    with pytest.raises(ValueError, match=rf"store 't': value column '{column}': .* does not fit"):
        schema_of(PROPS).value_arrow_arrays([value])


def test_an_undeclared_member_or_a_non_object_is_refused():
    with pytest.raises(ValueError, match="value member 'zz' is not in the value schema"):
        schema_of(PROPS).value_arrow_arrays([{"zz": 1}])
    with pytest.raises(ValueError, match="is not a JSON object"):
        schema_of(PROPS).value_arrow_arrays([[1, 2]])


@pytest.mark.parametrize("bulk", [True, False])
def test_collect_and_store_batches_give_the_declared_columns(typed, bulk):
    from iqkit.store.columnar.shaping import bulk_decode

    columns = ["partition", "customer", *TYPED]
    with bulk_decode(bulk), iqkit.open(typed) as engine:
        query = RangeQuery.with_no_bounds()
        result = engine.query(request("orders", query))
        table = collect(result, engine.manifest("orders"), query=query).table
        streamed = store_batches(engine, "orders", batch_size=3).read_all()
    assert table.schema.names == columns
    assert streamed.schema == table.schema
    assert streamed.sort_by("customer") == table.sort_by("customer")
    by_key = {r["customer"]: r for r in table.to_pylist()}
    assert {k: by_key["c0"][k] for k in TYPED} == TYPED
    assert by_key["c8"]["n"] == 1 and by_key["c8"]["total"] is None
    assert set(by_key["c9"].values()) - {"c9", by_key["c9"]["partition"]} == {None}


def test_an_empty_typed_store_has_the_declared_columns(root):
    iqkit.create_store(root, "orders", partitions=2, properties=PROPS)
    with iqkit.open(root) as engine:
        table = store_batches(engine, "orders").read_all()
    assert table.num_rows == 0
    assert table.schema.names == ["partition", "customer", *TYPED]
    assert table.schema.field("d").type == pa.decimal128(10, 2)


def test_a_stored_value_that_does_not_fit_fails_the_scan_naming_it(root):
    rows = [("a", SPARK_JSON), ("b", {"n": "twelve"})]
    write_store(root, "orders", rows, partitions=1, properties=PROPS)
    with iqkit.open(root) as engine, pytest.raises(IqkitError, match="value column 'n'"):
        store_batches(engine, "orders").read_all()


def test_iq_scan_shows_typed_columns(typed):
    from iqkit.jupyter.testing import new_shell

    shell = new_shell(root=str(typed), progress=False)
    r = shell.run_line_magic("iq", "scan orders")
    assert r.arrow().schema.field("d").type == pa.decimal128(10, 2)
    df = r.rows
    assert list(df.columns) == ["partition", "customer", *TYPED]
    assert str(df["n"].dtype) == "Int64"
    assert df["n"].sum() == 6 * 2**40 + 1


# -- exact: decimals with every digit, timestamps to the microsecond ------------------------------
EXACT_DDL = (
    "`d` decimal(38,18), `w` decimal(38,0), `x` double, `f` float, `n` bigint, `s` string, "
    "`at` timestamp, `local` timestamp_ntz, `day` date, `blob` binary, "
    "`ds` array<decimal(20,10)>, `p` struct<q:decimal(38,18),y:double,t:timestamp>"
)
EXACT_PROPS = {"key_columns": ["k"], "value_schema": EXACT_DDL}
D = decimal.Decimal
UTC = dt.UTC

#: Stored records as the Spark writers write them now (microseconds, every digit of a
#: decimal, doubles as Java spells them), one as they wrote them before (milliseconds),
#: and an empty one.
EXACT_BYTES = [
    b'{"d":12345678901234567890.123456789012345678,'
    b'"w":12345678901234567890123456789012345678,"x":1.0E7,"f":0.1,"n":-5,"s":"\xc3\xa9",'
    b'"at":"2024-03-01T12:30:00.123456+01:00","local":"2024-03-01T08:00:01.000003",'
    b'"day":"2024-02-29","blob":"AP8=","ds":[1.0000000001,null],'
    b'"p":{"q":0E-18,"y":0.1,"t":"1999-12-31T23:59:59.999999Z"}}',
    b'{"d":-1E-18,"x":1.5E-7,"at":"2024-03-01T12:30:00.123Z","local":"2024-03-01T08:00:01.003"}',
    b"{}",
]
EXACT_ROWS = [
    {
        "d": D("12345678901234567890.123456789012345678"),
        "w": D("12345678901234567890123456789012345678"),
        "x": 1e7,
        "f": pytest.approx(0.1),
        "n": -5,
        "s": "é",
        "at": dt.datetime(2024, 3, 1, 11, 30, 0, 123456, tzinfo=UTC),
        "local": dt.datetime(2024, 3, 1, 8, 0, 1, 3),
        "day": dt.date(2024, 2, 29),
        "blob": b"\x00\xff",
        "ds": [D("1.0000000001"), None],
        "p": {"q": D(0), "y": 0.1, "t": dt.datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)},
    },
    {
        "d": D("-0.000000000000000001"),
        "x": 1.5e-7,
        "at": dt.datetime(2024, 3, 1, 12, 30, 0, 123000, tzinfo=UTC),
        "local": dt.datetime(2024, 3, 1, 8, 0, 1, 3000),
    },
    {},
]


def write_bytes(root, rows, props=EXACT_PROPS):
    """A typed store holding exactly ``rows``' value bytes (written with the ``bytes``
    serde, then the manifest names ``json``, as the Spark writers' stores do)."""
    write_store(root, "exact", rows, partitions=2, value_serde="bytes", properties=props)
    path = root / "exact" / "manifest.json"
    data = json.loads(path.read_text())
    data.pop("checksum")  # written by hand: no checksum (store/integrity.py)
    path.write_text(json.dumps({**data, "value_serde": "json"}))


def full_row(value: dict) -> dict:
    return {name: value.get(name) for name, _ in parse_ddl_columns(EXACT_DDL)}


def test_typed_records_are_read_in_bulk_exactly():
    from iqkit.store.columnar.shaping import _typed_records

    rows = schema_of(EXACT_PROPS)
    schema = rows.value_arrow_schema()
    bulk = _typed_records(EXACT_BYTES, schema)
    assert bulk is not None  # the bulk path takes Spark's records, old and new
    by_rows = rows.value_arrow_arrays(list(map(rows.exact_value_decoder(), EXACT_BYTES)))
    assert bulk == by_rows
    got = pa.Table.from_arrays(bulk, schema=schema).to_pylist()
    assert got == [full_row(v) for v in EXACT_ROWS]


@pytest.mark.parametrize(
    "value",
    [
        b'{"n":"12"}',
        b'{"n":1.5}',
        b'{"n":true}',
        b'{"s":5}',
        b'{"x":"1"}',
        b'{"x":Infinity}',
        b'{"d":1.0000000000000000001}',  # more fraction digits than the scale: rounded
        b'{"day":"2024-02-30"}',
        b'{"day":19000}',
        b'{"local":"2024-03-01T08:00:01+01:00"}',
        b'{"blob":"not base64!"}',
        b'{"p":{"q":1,"extra":2}}',
        b'{"zz":1}',
        b'{"n":1,"n":2}',
        b"[1]",
    ],
)
def test_what_the_bulk_path_cannot_vouch_for_goes_the_row_path(value):
    from iqkit.store.columnar.shaping import _typed_records

    rows = schema_of(EXACT_PROPS)
    assert _typed_records([EXACT_BYTES[0], value], rows.value_arrow_schema()) is None


@pytest.mark.parametrize("bulk", [True, False])
def test_scans_of_a_typed_store_are_exact_both_ways(root, bulk):
    from iqkit.store.columnar.shaping import bulk_decode

    write_bytes(root, [(f"k{i}", v) for i, v in enumerate(EXACT_BYTES)])
    with bulk_decode(bulk), iqkit.open(root) as engine:
        query = RangeQuery.with_no_bounds()
        result = engine.query(request("exact", query))
        table = collect(result, engine.manifest("exact"), query=query).table
        streamed = store_batches(engine, "exact", batch_size=2).read_all()
        with iqkit.SQLSession(engine=engine) as session:
            sql = session.query_arrow("SELECT k, d, w, p.q AS q FROM exact ORDER BY k")
    assert streamed.sort_by("k") == table.sort_by("k")
    assert table.schema.field("d").type == pa.decimal128(38, 18)
    got = {r.pop("k"): r for r in table.to_pylist()}
    for i, want in enumerate(EXACT_ROWS):
        assert {n: v for n, v in got[f"k{i}"].items() if n != "partition"} == full_row(want)
    rows = sql.to_pylist()
    assert rows[0]["d"] == D("12345678901234567890.123456789012345678")
    assert rows[0]["w"] == D("12345678901234567890123456789012345678")


def test_a_key_query_gives_decimal_members_as_decimals_and_doubles_as_floats(root):
    from iqkit import KeyQuery, MultiKeyQuery

    write_bytes(root, [(f"k{i}", v) for i, v in enumerate(EXACT_BYTES)])
    with iqkit.open(root) as engine:
        value = engine.query(request("exact", KeyQuery.with_key("k0"))).only_partition_result()
        many = engine.query(request("exact", MultiKeyQuery.with_keys(["k0", "k1"])))
        found = {k: v for r in many.partition_results.values() for k, v in r.result.items()}
    v = value.result
    assert v["d"] == D("12345678901234567890.123456789012345678")
    assert isinstance(v["d"], D) and isinstance(v["w"], D)
    assert type(v["x"]) is float and type(v["f"]) is float and v["n"] == -5
    assert v["ds"] == [D("1.0000000001"), None] and v["p"]["q"] == D(0)
    assert type(v["p"]["y"]) is float
    assert found["k1"]["d"] == D("-1E-18") and found["k0"] == v


def test_a_twin_holds_the_exact_typed_columns():
    from iqkit.store.columnar.twins import twin_table
    from iqkit.store.encoding.keyspace import kv_key
    from iqkit.store.kinds import StoreKind
    from iqkit.store.manifest import StoreManifest

    manifest = StoreManifest(
        name="t", partitions=1, kind=StoreKind.KEY_VALUE, key_serde="string",
        value_serde="json", partitioner="murmur2", properties=EXACT_PROPS,
    )
    rows = sorted((kv_key(f"k{i}".encode()), v) for i, v in enumerate(EXACT_BYTES))
    table = twin_table(manifest, rows)
    got = table.select([n for n, _ in parse_ddl_columns(EXACT_DDL)]).to_pylist()
    assert got == [full_row(v) for v in EXACT_ROWS]
