"""Typed columns both ways: a DataFrame written by ``write_store`` or
``df.write.format("iqkit")`` reads back through ``spark.read.format("iqkit")`` with the key
under its written name and every value column under its own name and Spark type, and
``iqkit.sql`` / Arrow tables over the same store show the same typed columns (real local
Spark, real stores on disk).

Two types cannot round-trip exactly through the JSON the writers store (Spark's
``to_json``, kept as it is): timestamps keep milliseconds (``to_json`` writes
``yyyy-MM-dd'T'HH:mm:ss.SSSXXX``), and decimals keep at most 15 significant digits (the
json serde decodes a JSON number as a double). The round trip below uses values within
those bounds; ``test_timestamps_keep_milliseconds`` pins the first.
"""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

import iqkit
from iqkit.errors import StoreExistsError
from iqkit.spark import write_store
from iqkit.tables import store_batches

#: Every Spark type a store value can hold.
SCHEMA = (
    "customer string, s string, i int, n bigint, total double, f float, ok boolean, "
    "amount decimal(10,2), day date, at timestamp, at_ntz timestamp_ntz, blob binary, "
    "tags array<string>, nums array<bigint>, point struct<x:int,y:double,label:string>, "
    "attrs map<string,int>, nested array<struct<k:string,v:array<int>>>"
)

ARROW = pa.schema(
    [
        ("s", pa.string()),
        ("i", pa.int32()),
        ("n", pa.int64()),
        ("total", pa.float64()),
        ("f", pa.float32()),
        ("ok", pa.bool_()),
        ("amount", pa.decimal128(10, 2)),
        ("day", pa.date32()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("at_ntz", pa.timestamp("us")),
        ("blob", pa.binary()),
        ("tags", pa.list_(pa.string())),
        ("nums", pa.list_(pa.int64())),
        ("point", pa.struct([("x", pa.int32()), ("y", pa.float64()), ("label", pa.string())])),
        ("attrs", pa.map_(pa.string(), pa.int32())),
        (
            "nested",
            pa.list_(pa.struct([("k", pa.string()), ("v", pa.list_(pa.int32()))])),
        ),
    ]
)


def _row(i: int) -> tuple:
    if i % 5 == 4:  # every value column null
        return (f"c{i:02d}",) + (None,) * 16
    return (
        f"c{i:02d}",
        f"ünï {i} \"q\"",
        i - 3,
        2**40 + i,
        i / 4,
        0.5 + i,
        i % 2 == 0,
        decimal.Decimal(f"{i * 101}.{i:02d}"),
        dt.date(2024, 1, 1) + dt.timedelta(days=i),
        dt.datetime(2024, 3, 1, 12, 30) + dt.timedelta(minutes=i, milliseconds=7 * i),
        dt.datetime(2024, 3, 1, 8) + dt.timedelta(seconds=i, milliseconds=3),
        bytes([i, 0, 255]),
        [f"t{i}", None] if i % 2 else [],
        [i, None, -i],
        (i, None if i % 3 == 0 else i / 2, None if i % 2 else f"p{i}"),
        {"a": i, "b": None},
        [(f"k{i}", [i, None])],
    )


ROWS = [_row(i) for i in range(20)]


@pytest.fixture(scope="module")
def frame(spark):
    return spark.createDataFrame(ROWS, SCHEMA)


@pytest.fixture(scope="module", params=["write_store", "data source"])
def typed_store(request, frame, tmp_path_factory):
    """A store of ``frame`` keyed by ``customer``, written by either Spark writer."""
    root = tmp_path_factory.mktemp("typed")
    if request.param == "write_store":
        write_store(frame, root, "orders", key="customer", partitions=3)
    else:
        (
            frame.write.format("iqkit")
            .mode("append")
            .option("store", "orders")
            .option("key", "customer")
            .option("partitions", 3)
            .save(str(root))
        )
    return root


def read(spark, root, **options):
    reader = spark.read.format("iqkit").option("store", "orders")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(str(root))


def test_manifest_records_the_value_schema(typed_store):
    with iqkit.open(typed_store) as engine:
        props = engine.manifest("orders").properties
    assert props["key_columns"] == ["customer"]
    assert props["value_schema"].startswith("`s` string, `i` int, `n` bigint")


def test_every_spark_type_round_trips(spark, frame, typed_store):
    back = read(spark, typed_store)
    assert back.columns == ["partition", *frame.columns]
    assert back.drop("partition").schema == frame.schema
    assert sorted(back.drop("partition").collect()) == sorted(frame.collect())


def test_aggregates_work_on_typed_columns(spark, frame, typed_store):
    back = read(spark, typed_store)
    got = back.agg(F.sum("n"), F.sum("amount"), F.max("day")).first()
    want = frame.agg(F.sum("n"), F.sum("amount"), F.max("day")).first()
    assert got == want


def test_blank_value_schema_reads_the_json_text(spark, typed_store):
    back = read(spark, typed_store, value_schema="")
    assert back.columns == ["partition", "customer", "value"]
    assert dict(back.dtypes)["value"] == "string"
    texts = {r.customer: r.value for r in back.collect()}
    assert texts["c04"] == "{}"
    assert texts["c01"].startswith('{"s":"ünï 1 \\"q\\"","i":-2,')


def test_sql_and_arrow_tables_show_the_same_typed_columns(spark, frame, typed_store):
    with iqkit.open(typed_store) as engine, iqkit.SQLSession(engine=engine) as session:
        table = store_batches(engine, "orders").read_all()
        via_sql = session.query_arrow("SELECT * FROM orders")
        sums = session.query("SELECT sum(n) AS n, sum(i) AS i FROM orders")
    assert table.schema.names == ["partition", *frame.columns]
    assert table.schema.field("customer").type == pa.string()
    for field in ARROW:
        assert table.schema.field(field.name).type == field.type, field.name
    # DuckDB hands the same columns back in its own spelling (a timestamp's zone as
    # Etc/UTC, a list's item as "l"): the same types and rows once spelt alike.
    assert via_sql.schema.names == table.schema.names
    text = [f.name for f in via_sql.schema if pa.types.is_string(f.type)]
    assert text == ["customer", "s"]
    assert via_sql.schema.field("at").type.tz in ("UTC", "Etc/UTC")
    assert via_sql.cast(table.schema).sort_by("customer") == table.sort_by("customer")
    expected = frame.agg(F.sum("n").alias("n"), F.sum("i").alias("i")).first()
    assert (int(sums["n"][0]), int(sums["i"][0])) == (expected.n, expected.i)
    # Row values equal Spark's own rows, column by column (Arrow hands timestamps back
    # in UTC; Spark, in the session's zone, naive).
    spark_rows = {r.customer: r.asDict(recursive=True) for r in frame.collect()}
    zone = dt.datetime.now().astimezone().tzinfo
    for row in table.to_pylist():
        want = spark_rows[row["customer"]]
        if row["at"] is not None:
            row["at"] = row["at"].astimezone(zone).replace(tzinfo=None)
        row["attrs"] = None if row["attrs"] is None else dict(row["attrs"])
        for name in frame.columns:
            assert row[name] == want[name], (row["customer"], name)


def test_a_write_with_another_value_schema_is_refused(spark, frame, typed_store):
    other = frame.withColumn("n", F.col("n").cast("string"))
    with pytest.raises(StoreExistsError, match=r"value schema .*n string \(store: bigint\)"):
        write_store(other, typed_store, "orders", key="customer", partitions=3)
    fewer = frame.drop("blob")
    with pytest.raises(StoreExistsError, match="no blob"):
        write_store(fewer, typed_store, "orders", key="customer", partitions=3)
    # The same columns in another order are the same schema.
    reordered = frame.select("customer", *reversed(frame.columns[1:]))
    write_store(reordered, typed_store, "orders", key="customer", partitions=3)
    assert sorted(read(spark, typed_store).drop("partition").collect()) == sorted(frame.collect())


def test_timestamps_keep_milliseconds(spark, tmp_path):
    """Not exact: Spark's ``to_json`` writes timestamps to the millisecond."""
    at = dt.datetime(2024, 5, 6, 7, 8, 9, 123456)
    df = spark.createDataFrame([("a", at)], "k string, at timestamp")
    write_store(df, tmp_path, "orders", key="k", partitions=1)
    (got,) = read(spark, tmp_path).collect()
    assert got.at == at.replace(microsecond=123000)


def test_a_record_member_named_partition_is_renamed(spark, tmp_path):
    df = spark.createDataFrame([("a", 7, 1.5)], "k string, partition int, x double")
    write_store(df, tmp_path, "orders", key="k", partitions=2)
    back = read(spark, tmp_path)
    assert back.columns == ["partition", "k", "value.partition", "x"]
    assert back.drop("partition").first() == ("a", 7, 1.5)
    with iqkit.open(tmp_path) as engine, iqkit.SQLSession(engine=engine) as session:
        table = session.query_arrow('SELECT * FROM orders')
    assert table.schema.names == ["partition", "k", "value.partition", "x"]
    assert table.to_pylist()[0]["value.partition"] == 7
