"""``spark.read.format("iqkit")`` through columnar twins: full, range and prefix reads of
partitions that have twins yield Arrow record batches made from the twins, and the
DataFrame equals the row path's, schema and rows (real local Spark, real stores).

The row path is the same read with the hidden ``_twin_scans=false`` option: the tasks
then read RocksDB rows (``twin_scans(False)`` in the driver would not reach Spark's
Python workers, other processes). The hidden ``_trace_dir`` says which path each
partition took, so a test cannot pass by reading rows both times.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os

import pytest

import iqkit
from iqkit.spark import register, write_store
from iqkit.tables import store_batches

PARTITIONS = 4


@pytest.fixture(scope="module", autouse=True)
def iqkit_format(spark):
    register(spark)


def read(spark, root, store, trace=None, **options):
    r = spark.read.format("iqkit").option("store", store)
    for name, value in options.items():
        r = r.option(name, value)
    if trace is not None:
        r = r.option("_trace_dir", str(trace))
    return r.load(str(root))


def paths(trace) -> set[str]:
    """The paths the traced partition reads took (``columnar``, ``rows``)."""
    return {json.load(open(os.path.join(trace, f)))["path"] for f in os.listdir(trace)}


def rows_of(df) -> list:
    key = next(c for c in df.columns if c != "partition")
    return df.orderBy("partition", key).collect()


def assert_same_as_rows(spark, root, store, tmp_path, **options):
    """The twin read equals the row path's read: schema, rows; and it took the twins."""
    twins = read(spark, root, store, trace=tmp_path / "twins", **options)
    plain = read(spark, root, store, trace=tmp_path / "plain", _twin_scans="false", **options)
    assert twins.schema == plain.schema
    got, want = rows_of(twins), rows_of(plain)
    assert got == want
    assert paths(tmp_path / "twins") == {"columnar"}
    assert paths(tmp_path / "plain") == {"rows"}
    return got


#: The records' declared columns (what a Spark writer records): their reads are columnar.
RECORD_DDL = "price double, qty bigint, tag string, note string"


def json_value(i: int) -> dict:
    """A record of ``RECORD_DDL`` (``note`` only in some)."""
    value = {"price": (i * 7919 % 10_000) / 100, "qty": i % 50, "tag": f"tag{i % 16:02d}"}
    if i % 7 == 0:
        value["note"] = "é \"quoted\"\n"
    return value


def as_record(value: dict) -> dict:
    """``value`` as a row of the typed DataFrame: every declared column, null if absent."""
    return {c: value.get(c) for c in ("price", "qty", "tag", "note")}


def create_records_store(root) -> None:
    """The ``records`` store: json values with the declared columns ``RECORD_DDL``."""
    iqkit.create_store(
        root,
        "records",
        partitions=PARTITIONS,
        value_serde="json",
        properties={"value_schema": RECORD_DDL},
    )


#: What the json store holds after its three commits (key -> value).
LATEST: dict[str, object] = {}


@pytest.fixture(scope="module")
def json_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("json-root")
    create_records_store(root)
    model = LATEST
    with iqkit.StoreWriter(root, "records") as w:
        for i in range(2_000):
            model[f"k{i:05d}"] = json_value(i)
            w.put(f"k{i:05d}", json_value(i))
    with iqkit.StoreWriter(root, "records") as w:  # a second file per partition, deletes
        for i in range(0, 2_000, 5):
            model.pop(f"k{i:05d}")
            w.delete(f"k{i:05d}")
        for i in range(1_990, 2_100):
            model[f"k{i:05d}"] = {"price": 1.5, "qty": i, "tag": "late"}
            w.put(f"k{i:05d}", model[f"k{i:05d}"])
    with iqkit.StoreWriter(root, "records") as w:
        for i in range(1, 2_000, 9):
            model[f"k{i:05d}"] = {"qty": i, "tag": "again"}
            w.put(f"k{i:05d}", {"qty": i, "tag": "again"})
        model.pop("k00001")
        w.delete("k00001")
    return root


def test_full_read_of_a_json_store_equals_the_row_path(spark, json_root, tmp_path):
    got = assert_same_as_rows(spark, json_root, "records", tmp_path)
    assert {r.key: as_record(r.asDict()) for r in got} == {
        k: as_record(v) for k, v in LATEST.items()
    }


def test_narrowed_reads_equal_the_row_path(spark, json_root, tmp_path):
    got = assert_same_as_rows(
        spark, json_root, "records", tmp_path / "range", key_from="k00100", key_to="k00199"
    )
    assert {r.key for r in got} == {k for k in LATEST if "k00100" <= k <= "k00199"}
    got = assert_same_as_rows(spark, json_root, "records", tmp_path / "prefix", prefix="k019")
    assert {r.key for r in got} == {k for k in LATEST if k.startswith("k019")}


def test_as_of_reads_the_older_version_through_twins(spark, json_root, tmp_path):
    got = assert_same_as_rows(spark, json_root, "records", tmp_path, as_of="1")
    assert len(got) == 2_000
    assert as_record(got[0].asDict()) == as_record(json_value(int(got[0].key[1:])))


def test_a_json_store_read_equals_store_batches(spark, json_root, tmp_path):
    """Another reader of the same twins: the keys and values ``iqkit.tables`` gives."""
    got = read(spark, json_root, "records", trace=tmp_path).collect()
    with iqkit.open(json_root) as engine:
        table = store_batches(engine, "records").read_all()
    assert sorted((r.partition, r.key) for r in got) == sorted(
        zip(table.column("partition").to_pylist(), table.column("key").to_pylist(), strict=True)
    )
    assert paths(tmp_path) == {"columnar"}


def test_a_json_store_without_a_schema_reads_its_values_on_the_row_path(spark, tmp_path):
    """Twins keep no stored text, and their typed columns cannot give it back exactly:
    whole JSON values (a store with no declared schema) are read as rows, still right."""
    root = tmp_path / "root"
    iqkit.create_store(root, "loose", partitions=PARTITIONS, value_serde="json")
    values = {f"k{i:03d}": json_value(i) if i % 3 else [i, "x"] for i in range(200)}
    with iqkit.StoreWriter(root, "loose") as w:
        for k, v in values.items():
            w.put(k, v)
    got = read(spark, root, "loose", trace=tmp_path / "t").collect()
    assert {r.key: json.loads(r.value) for r in got} == values
    assert paths(tmp_path / "t") == {"rows"}


def test_value_schema_option_takes_the_row_path(spark, json_root, tmp_path):
    """Members decoded PERMISSIVE-ly from JSON are not in the twins: rows, still right."""
    df = read(spark, json_root, "records", trace=tmp_path, value_schema="price double, qty int")
    got = {r.key: r for r in df.collect()}
    assert got["k02050"].qty == 2_050 and got["k00010"].price is None
    assert paths(tmp_path) == {"rows"}


SCALARS = [
    ("int32", "int64", lambda i: i * 1_000_003 - 7),
    ("string", "double", lambda i: i / 7),
    ("int64", "string", lambda i: f"v{i}é"),
    ("string", "bytes", lambda i: bytes([i % 256, 0, 255])),
]


@pytest.mark.parametrize(("key_serde", "value_serde", "value"), SCALARS)
def test_scalar_serdes_equal_the_row_path(spark, tmp_path, key_serde, value_serde, value):
    root = tmp_path / "root"
    iqkit.create_store(
        root, "s", partitions=PARTITIONS, key_serde=key_serde, value_serde=value_serde
    )
    key = (lambda i: f"k{i:04d}") if key_serde == "string" else (lambda i: i - 150)
    for start in (0, 200):
        with iqkit.StoreWriter(root, "s") as w:
            for i in range(start, start + 300):
                w.put(key(i), value(i))
            w.delete(key(start + 3))
    got = assert_same_as_rows(spark, root, "s", tmp_path)
    assert len(got) == 500 - 2


TYPED_DDL = (
    "customer string, total double, n bigint, i int, ok boolean, amount decimal(10,2), "
    "day date, at timestamp, tags array<string>, point struct<x:int,label:string>, "
    "attrs map<string,int>"
)


def typed_row(i: int) -> tuple:
    return (
        f"c{i:04d}",
        i * 1.25,
        i * 10**9,
        None if i % 9 == 0 else i,
        i % 2 == 0,
        decimal.Decimal(f"{i}.{i % 100:02d}"),
        dt.date(2024, 1, 1) + dt.timedelta(days=i % 300),
        dt.datetime(2024, 5, 1, 12, 0, i % 60, 123000, tzinfo=dt.UTC),
        [f"t{i % 3}", "x"] if i % 4 else None,
        {"x": i, "label": f"p{i}"},
        {"a": i, "b": -i},
    )


def test_a_typed_store_equals_the_row_path(spark, tmp_path):
    root = tmp_path / "root"
    df = spark.createDataFrame([typed_row(i) for i in range(400)], TYPED_DDL)
    write_store(df, str(root), "typed", key="customer", partitions=PARTITIONS, progress=False)
    with iqkit.StoreWriter(root, "typed") as w:
        for i in range(0, 400, 6):
            w.delete(f"c{i:04d}")
    later = spark.createDataFrame([typed_row(i) for i in range(350, 450)], TYPED_DDL)
    write_store(later, str(root), "typed", key="customer", partitions=PARTITIONS, progress=False)
    got = assert_same_as_rows(spark, root, "typed", tmp_path)
    assert len(got) == 450 - len(range(0, 350, 6))
    assert read(spark, root, "typed").columns[:3] == ["partition", "customer", "total"]
    assert_same_as_rows(spark, root, "typed", tmp_path / "prefix", prefix="c01")


def test_a_store_the_data_source_creates_reads_through_twins(spark, tmp_path):
    # Its tasks write the twins before the store exists: for the layout the store is
    # created with at commit (else no twin would ever be read).
    root = tmp_path / "root"
    df = spark.createDataFrame(
        [(f"c{i:04d}", i * 1.5, i) for i in range(300)], "customer string, total double, n bigint"
    )
    (
        df.write.format("iqkit").mode("append").option("store", "ds").option("key", "customer")
        .option("partitions", 3).save(str(root))
    )  # fmt: skip
    got = assert_same_as_rows(spark, root, "ds", tmp_path)
    assert sorted((r["customer"], r["total"], r["n"]) for r in got) == [
        (f"c{i:04d}", i * 1.5, i) for i in range(300)
    ]


def test_an_object_root_reads_through_twins(spark, s3_root, tmp_path):
    create_records_store(s3_root)
    with iqkit.StoreWriter(s3_root, "records") as w:
        for i in range(600):
            w.put(f"k{i:05d}", json_value(i))
    with iqkit.StoreWriter(s3_root, "records") as w:
        for i in range(0, 600, 4):
            w.delete(f"k{i:05d}")
    got = assert_same_as_rows(spark, s3_root, "records", tmp_path)
    assert len(got) == 450
    narrowed = assert_same_as_rows(
        spark, s3_root, "records", tmp_path / "range", key_from="k00100", key_to="k00109"
    )
    assert [r.key for r in sorted(narrowed, key=lambda r: r.key)] == [
        f"k{i:05d}" for i in range(100, 110) if i % 4
    ]
