"""A store whose manifest declares a value schema, read as Arrow (``RowSchema``'s
``value_arrow_schema`` / ``value_arrow_arrays``, ``tables.collect``, ``store_batches``,
``%iq scan``'s result) over real RocksDB stores written by ``StoreWriter`` with the
JSON the Spark writers store."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest
from helpers import request, write_store

import iqkit
from iqkit import RangeQuery
from iqkit.errors import IqkitError
from iqkit.store.rows import RowSchema, ddl_arrow_type, parse_ddl_type
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
