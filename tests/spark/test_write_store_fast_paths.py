"""write_store's shuffle path and its fast paths (real Spark; ``_shuffle=True``, as a
DataFrame of many Spark partitions takes it): routing in the JVM is byte-exact with Kafka's
murmur2, vectorized serialization matches the serdes, the Python fallback and the
spilling sort give the same stores, and duplicate keys keep the later row."""

from __future__ import annotations

import random
import struct

import pytest
from helpers import kv_rows
from pyspark.sql import functions as F

import iqkit
import iqkit.spark.batch as batch
from iqkit import KeyQuery, StateQueryRequest
from iqkit.spark import write_store
from iqkit.store.encoding.partitioners import murmur2, murmur2_partition
from iqkit.store.encoding.serdes import get_serde

INT32_EDGES = [0, 1, -1, 2, -2, 255, 256, -256, 2**31 - 1, -(2**31), 2**24, -(2**24) - 7]
INT64_EDGES = [*INT32_EDGES, 2**63 - 1, -(2**63), 2**32, -(2**32), 2**40 + 12345]
STRINGS = ["", "a", "21", "foobar", "é", "中文", "😀 emoji", "nul\x00byte", "x" * 300, "ß" * 3]


def store_rows(root, store):
    with iqkit.open(root) as engine:
        return kv_rows(engine, store)


def assert_kafka_placement(rows, serde, partitions):
    for p, key, _ in rows:
        assert p == murmur2_partition(get_serde(serde).serialize(key), partitions), key


@pytest.mark.parametrize(("width", "fmt"), [(4, ">i"), (8, ">q")])
def test_the_jvm_computes_kafkas_murmur2_for_int_keys(spark, width, fmt):
    rng = random.Random(width)
    lo, hi = (-(2**31), 2**31) if width == 4 else (-(2**63), 2**63)
    values = [v for v in INT64_EDGES if lo <= v < hi] + [rng.randrange(lo, hi) for _ in range(5000)]
    df = spark.createDataFrame([(v,) for v in values], "v long")
    got = [r[0] for r in df.select(batch._murmur2_big_endian(F.col("v"), width)).collect()]
    pack = struct.Struct(fmt).pack
    assert got == [murmur2(pack(v)) & 0xFFFFFFFF for v in values]


def test_the_jvm_routes_string_keys_like_kafka(spark, tmp_path):
    assert batch._string_murmur2_in_jvm(spark)
    rng = random.Random(9)
    alphabet = "abz09 -_é中😀\x00\x7f"
    keys = STRINGS + [
        "".join(rng.choice(alphabet) for _ in range(rng.randrange(40))) for _ in range(400)
    ]
    keys = sorted(set(keys))
    df = spark.createDataFrame([(k, i) for i, k in enumerate(keys)], "k string, v long")
    write_store(df, tmp_path, "s", key="k", value="v", partitions=7, progress=False, _shuffle=True)
    rows = store_rows(tmp_path, "s")
    assert sorted(k for _, k, _ in rows) == keys
    assert_kafka_placement(rows, "string", 7)
    assert {k: v for _, k, v in rows} == {k: i for i, k in enumerate(keys)}


@pytest.mark.parametrize(
    ("ddl", "serde", "keys"),
    [
        ("k int", "int32", INT32_EDGES),
        ("k long", "int64", INT64_EDGES),
        ("k short", "int32", [0, 1, -1, 32767, -32768]),
    ],
)
def test_int_keys_land_where_kafka_puts_them(spark, tmp_path, ddl, serde, keys):
    df = spark.createDataFrame([(k, f"v{k}") for k in keys], f"{ddl}, v string")
    write_store(df, tmp_path, "s", key="k", value="v", partitions=5, progress=False, _shuffle=True)
    rows = store_rows(tmp_path, "s")
    assert {k: v for _, k, v in rows} == {k: f"v{k}" for k in keys}
    assert_kafka_placement(rows, serde, 5)


@pytest.mark.parametrize(
    ("ddl", "serde", "rows"),
    [
        ("k binary", "bytes", [(b"", 1.5), (b"\x00\xff", None), (b"abc", float("nan"))]),
        ("k double", "double", [(0.0, 1.0), (-0.0, 2.0), (1e300, -3.5), (float("nan"), 4.0)]),
    ],
)
def test_python_routed_keys_and_vectorized_values(spark, tmp_path, ddl, serde, rows):
    # bytes/double keys have no JVM murmur2: the Python encoder routes them (vectorized)
    df = spark.createDataFrame(rows, f"{ddl}, v double")
    write_store(df, tmp_path, "s", key="k", value="v", partitions=3, progress=False, _shuffle=True)
    got = store_rows(tmp_path, "s")
    assert_kafka_placement(got, serde, 3)
    key_bytes, value_bytes = get_serde(serde).serialize, get_serde("double").serialize
    have = {key_bytes(k): value_bytes(v) for _, k, v in got}  # bytes: NaN == NaN
    assert have == {key_bytes(k): value_bytes(v) for k, v in rows if v is not None}


def test_python_routing_gives_the_same_store_as_jvm_routing(spark, tmp_path):
    df = spark.createDataFrame(
        [(f"user-{i % 50}", i, i * 0.25) for i in range(600)], "user string, n long, x double"
    ).repartition(3)
    write_store(df, tmp_path / "jvm", "s", key="user", partitions=4, progress=False, _shuffle=True)
    app = spark.sparkContext.applicationId
    before = batch._jvm_murmur2_checked.pop(app, None)
    batch._jvm_murmur2_checked[app] = False  # as if commons-codec were missing
    try:
        write_store(
            df, tmp_path / "py", "s", key="user", partitions=4, progress=False, _shuffle=True
        )
    finally:
        batch._jvm_murmur2_checked.pop(app)
        if before is not None:
            batch._jvm_murmur2_checked[app] = before
    assert store_rows(tmp_path / "jvm", "s") == store_rows(tmp_path / "py", "s")


def test_later_rows_win_across_input_partitions_and_through_spills(spark, tmp_path):
    # 4 input partitions, every key in each of them: the row with the highest id (input
    # order, monotonically_increasing_id) wins. A 1-byte budget spills every batch.
    df = spark.range(0, 4000, 1, 4).select(
        (F.col("id") % 97).cast("int").alias("k"), F.col("id").alias("v")
    )
    want = {k: max(i for i in range(4000) if i % 97 == k) for k in range(97)}
    for name, spill in (("mem", None), ("spill", 1)):
        write_store(
            df,
            tmp_path,
            name,
            key="k",
            value="v",
            partitions=3,
            progress=False,
            _shuffle=True,
            _spill_bytes=spill,
        )
        assert {k: v for _, k, v in store_rows(tmp_path, name)} == want


def test_kafka_shaped_input_keeps_the_highest_offset(spark, tmp_path):
    # Rows listed newest first: input order says "a"=1, the offsets say "a"=3.
    rows = [("t", 0, 9, "a", 3), ("t", 0, 5, "b", 2), ("t", 0, 2, "a", 1), ("t", 0, 1, "b", 0)]
    df = spark.createDataFrame(
        rows, "topic string, partition int, offset long, k string, v long"
    ).coalesce(1)
    write_store(df, tmp_path, "s", key="k", value="v", partitions=2, progress=False, _shuffle=True)
    assert {k: v for _, k, v in store_rows(tmp_path, "s")} == {"a": 3, "b": 2}


def test_a_null_value_deletes_and_the_last_row_decides(spark, tmp_path):
    write_store(
        spark.createDataFrame([("a", "1"), ("b", "2"), ("c", "3")], "k string, v string"),
        tmp_path,
        "s",
        key="k",
        value="v",
        partitions=2,
        progress=False,
        _shuffle=True,
    )
    update = spark.createDataFrame(
        [("a", None), ("b", None), ("b", "22"), ("d", None)], "k string, v string"
    ).coalesce(1)
    write_store(
        update, tmp_path, "s", key="k", value="v", partitions=2, progress=False, _shuffle=True
    )
    assert {k: v for _, k, v in store_rows(tmp_path, "s")} == {"b": "22", "c": "3"}


@pytest.mark.parametrize("ddl", ["k long, v long", "k string, v long"])
def test_null_keys_found_in_the_job_are_refused_and_nothing_is_published(spark, tmp_path, ddl):
    key = 1 if ddl.startswith("k long") else "x"
    df = spark.createDataFrame([(key, 1), (None, 2)], ddl).repartition(2)
    with pytest.raises(ValueError, match="store 's': key column 'k' holds null keys"):
        write_store(
            df, tmp_path, "s", key="k", value="v", partitions=2, progress=False, _shuffle=True
        )
    assert not (tmp_path / "s" / "LATEST").exists()
    assert list(tmp_path.rglob(".job-*")) == []


def test_string_keys_that_are_not_utf8_are_refused_naming_the_column(spark, tmp_path):
    df = spark.createDataFrame([(bytearray(b"ok\xff"), 1)], "b binary, v long").select(
        F.col("b").cast("string").alias("k"), "v"
    )
    with pytest.raises(Exception, match="key column 'k' holds a string that is not valid UTF-8"):
        write_store(
            df, tmp_path, "s", key="k", value="v", partitions=2, progress=False, _shuffle=True
        )
    assert not (tmp_path / "s" / "LATEST").exists()


def test_mark_as_partitioned_with_vectorized_keys_and_values(spark, tmp_path):
    rows = [(p, float(p * 10 + i), f"v{p}-{i}") for p in range(3) for i in range(4)]
    df = spark.createDataFrame(
        spark.sparkContext.parallelize(rows, 3), "part int, k double, v string"
    )
    write_store(
        df,
        tmp_path,
        "s",
        key="k",
        value="v",
        partitions=3,
        mark_as_partitioned="part",
        progress=False,
        _shuffle=True,
    )
    got = store_rows(tmp_path, "s")
    assert sorted(got) == sorted((p, k, v) for p, k, v in rows)
    with iqkit.open(tmp_path) as engine:
        r = engine.query(StateQueryRequest.in_store("s").with_query(KeyQuery.with_key(21.0)))
        assert {p for p, q in r.partition_results.items() if q.result is not None} == {2}
