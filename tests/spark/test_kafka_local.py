"""LocalKafkaTopic: a broker-less topic Spark reads with Kafka's source schema (real Spark,
real files, no mocks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

import iqkit
from iqkit.spark.kafka_local import (
    KAFKA_SCHEMA,
    LocalKafkaTopic,
    RecordMetadata,
)

REPO = Path(__file__).resolve().parents[2]

# Spark's Kafka source schema, written out as in KafkaRecordToRowConverter (every field
# nullable), independently of the module under test.
SPARK_KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("timestampType", IntegerType(), True),
    ]
)
SPARK_KAFKA_HEADERS = StructField(
    "headers",
    ArrayType(
        StructType(
            [StructField("key", StringType(), True), StructField("value", BinaryType(), True)]
        ),
        True,
    ),
    True,
)

# Kafka's own murmur2 test vectors (clients UtilsTest.testMurmur2): key -> Utils.murmur2.
KAFKA_MURMUR2 = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
}

COLUMNS = "key, value, topic, partition, offset, unix_millis(timestamp) AS ts, timestampType"


def by_position(row: tuple) -> tuple[int, int]:
    return row[3], row[4]


def rows_of(df) -> list[tuple]:
    """(key, value, topic, partition, offset, ts_ms, timestampType), sorted by position."""
    rows = [tuple(r) for r in df.selectExpr(*COLUMNS.split(", ")).collect()]
    return sorted(rows, key=by_position)


def run_available_now(df, checkpoint: Path) -> list[tuple[int, list[tuple]]]:
    """Run ``df`` to completion with trigger(availableNow=True); return (batch id, rows)."""
    batches: list[tuple[int, list[tuple]]] = []

    def collect(batch_df, batch_id):
        batches.append((batch_id, rows_of(batch_df)))

    query = (
        df.writeStream.foreachBatch(collect)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    assert query.awaitTermination(180), "availableNow query did not finish"
    assert query.exception() is None
    return batches


def data_files(topic: LocalKafkaTopic) -> list[str]:
    return sorted(n for n in os.listdir(topic.path) if n.endswith(".parquet"))


# -- schema ------------------------------------------------------------------------------


def test_schema_equals_kafka_source_schema(spark, tmp_path):
    topic = LocalKafkaTopic(tmp_path, "orders", partitions=2)
    topic.produce([("k", "v")])
    assert KAFKA_SCHEMA == SPARK_KAFKA_SCHEMA
    assert topic.read_batch(spark).schema == SPARK_KAFKA_SCHEMA
    stream = topic.read_stream(spark)
    assert stream.isStreaming
    assert stream.schema == SPARK_KAFKA_SCHEMA
    with_headers = StructType([*SPARK_KAFKA_SCHEMA.fields, SPARK_KAFKA_HEADERS])
    assert topic.read_stream(spark, include_headers=True).schema == with_headers
    assert topic.read_batch(spark, include_headers=True).schema == with_headers


def test_empty_topic_reads_empty_with_kafka_schema(spark, tmp_path):
    topic = LocalKafkaTopic(tmp_path, "empty", partitions=3)
    df = topic.read_batch(spark)
    assert df.schema == SPARK_KAFKA_SCHEMA
    assert df.count() == 0
    assert topic.end_offsets() == {0: 0, 1: 0, 2: 0}


# -- offsets -----------------------------------------------------------------------------


def test_offsets_consecutive_per_partition_across_calls_and_instances(tmp_path):
    topic = LocalKafkaTopic(tmp_path, "orders", partitions=3)
    produced: list[RecordMetadata] = []
    produced += topic.produce([(f"k{i}", f"v{i}") for i in range(20)])
    produced += topic.produce([(f"k{i}", f"w{i}") for i in range(20, 35)])
    # A new instance (as another process would) continues from what is on disk.
    again = LocalKafkaTopic(tmp_path, "orders")
    assert again.partitions == 3
    produced += again.produce([(f"k{i}", "x") for i in range(35, 50)])
    produced += again.produce([("solo", "y")], partition=1)

    by_partition: dict[int, list[int]] = {}
    for m in produced:
        assert m.topic == "orders"
        by_partition.setdefault(m.partition, []).append(m.offset)
    for p, offsets in by_partition.items():
        assert offsets == list(range(len(offsets))), f"partition {p}: {offsets}"
    assert topic.end_offsets() == {p: len(o) for p, o in by_partition.items()}
    assert again.end_offsets() == topic.end_offsets()
    # One immutable file per touched partition per produce call; no temp files left.
    assert len(data_files(topic)) <= 3 * 3 + 1
    assert not [n for n in os.listdir(topic.path) if n.startswith(".")]


def test_one_file_per_touched_partition_per_call(tmp_path):
    topic = LocalKafkaTopic(tmp_path, "t", partitions=4)
    topic.produce([("a", "1"), ("b", "2")], partition=2)
    topic.produce([("c", "3")], partition=2)
    topic.produce([("d", "4")], partition=0)
    assert data_files(topic) == [
        "p00000-00000000000000000000-00000000000000000000.parquet",
        "p00002-00000000000000000000-00000000000000000001.parquet",
        "p00002-00000000000000000002-00000000000000000002.parquet",
    ]
    assert topic.end_offsets() == {0: 1, 1: 0, 2: 3, 3: 0}


def test_end_position_is_log_end_offsets(tmp_path):
    topic = LocalKafkaTopic(tmp_path, "clicks", partitions=2)
    assert topic.end_position() == iqkit.Position.from_map({"clicks": {0: 0, 1: 0}})
    topic.produce([("a", "1"), ("b", "2"), ("c", "3")], partition=0)
    topic.produce([("d", "4")], partition=1)
    assert topic.end_offsets() == {0: 3, 1: 1}
    assert topic.end_position() == iqkit.Position.from_map({"clicks": {0: 3, 1: 1}})


def test_concurrent_producer_processes_never_reuse_an_offset(spark, tmp_path):
    topic = LocalKafkaTopic(tmp_path, "orders", partitions=3)
    script = (
        "import json, sys\n"
        "from iqkit.spark.kafka_local import LocalKafkaTopic\n"
        "t = LocalKafkaTopic(sys.argv[1], 'orders')\n"
        "out = []\n"
        "for i in range(10):\n"
        "    recs = [(f'{sys.argv[2]}-{i}-{j}', 'v') for j in range(5)]\n"
        "    out += [(m.partition, m.offset) for m in t.produce(recs)]\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path), name],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for name in ("a", "b")
    ]
    produced = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        produced += [tuple(x) for x in json.loads(out)]
    assert len(produced) == len(set(produced)) == 100
    ends = topic.end_offsets()
    assert sum(ends.values()) == 100
    for p, end in ends.items():
        assert sorted(o for q, o in produced if q == p) == list(range(end))
    # And the data agrees: every partition holds offsets 0..end-1 exactly once.
    got = rows_of(topic.read_batch(spark))
    assert [(r[3], r[4]) for r in got] == [(p, o) for p in range(3) for o in range(ends[p])]


# -- partitioning --------------------------------------------------------------------------


@pytest.mark.parametrize("partitions", [1, 3, 4, 7, 12])
def test_keyed_records_go_where_kafkas_default_partitioner_puts_them(tmp_path, partitions):
    topic = LocalKafkaTopic(tmp_path, "keys", partitions=partitions)
    produced = topic.produce([(k, "v") for k in KAFKA_MURMUR2])
    expected = [(h & 0x7FFFFFFF) % partitions for h in KAFKA_MURMUR2.values()]
    assert [m.partition for m in produced] == expected


def test_partition_column_matches_kafka_partitioner_in_spark(spark, tmp_path):
    topic = LocalKafkaTopic(tmp_path, "keys", partitions=5)
    topic.produce([(k, "v") for k in KAFKA_MURMUR2])
    expected = {k.encode(): (h & 0x7FFFFFFF) % 5 for k, h in KAFKA_MURMUR2.items()}
    got = {r[0]: r[3] for r in rows_of(topic.read_batch(spark))}
    assert got == expected


def test_bytes_key_partitions_like_the_same_string(tmp_path):
    topic = LocalKafkaTopic(tmp_path, "keys", partitions=7)
    a = topic.produce([("foobar", "1"), (b"foobar", "2"), (bytearray(b"foobar"), "3")])
    assert len({m.partition for m in a}) == 1
    assert [m.offset for m in a] == [0, 1, 2]


def test_null_keys_round_robin_and_explicit_partition(tmp_path):
    topic = LocalKafkaTopic(tmp_path, "rr", partitions=3)
    produced = topic.produce([(None, f"v{i}") for i in range(7)])
    assert [m.partition for m in produced] == [0, 1, 2, 0, 1, 2, 0]
    explicit = topic.produce([("foobar", "x"), (None, "y")], partition=2)
    assert [(m.partition, m.offset) for m in explicit] == [(2, 2), (2, 3)]


# -- records -------------------------------------------------------------------------------


def test_batch_read_equals_what_was_produced(spark, tmp_path):
    topic = LocalKafkaTopic(tmp_path, "orders", partitions=3)
    t0 = 1_700_000_000_000
    records = [
        ("alice", '{"amount": 3}', t0),
        (b"\x00\xffbin", b"\x01\x02", datetime(2024, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)),
        ("bob", None, t0 + 1),  # a tombstone
        (None, "no key", datetime(2024, 1, 2, 3, 4, 5, 678_999)),  # naive = UTC, floored
        ("carol", "ü-utf8", t0 + 2),
    ]
    produced = topic.produce(records)
    produced += topic.produce([("alice", '{"amount": 4}', t0 + 3)])
    expected_ts = [t0, 1704164645678, t0 + 1, 1704164645678, t0 + 2, t0 + 3]
    values = [r[1] for r in records] + ['{"amount": 4}']
    keys = [r[0] for r in records] + ["alice"]

    def as_bytes(x):
        return x.encode() if isinstance(x, str) else x

    expected = sorted(
        (
            (as_bytes(k), as_bytes(v), "orders", m.partition, m.offset, ts, 0)
            for k, v, m, ts in zip(keys, values, produced, expected_ts, strict=True)
        ),
        key=by_position,
    )
    assert [m.timestamp for m in produced] == expected_ts
    assert rows_of(topic.read_batch(spark)) == expected


def test_missing_timestamp_is_the_producer_clock(spark, tmp_path):
    topic = LocalKafkaTopic(tmp_path, "t", partitions=1)
    before = int(datetime.now(UTC).timestamp() * 1000)
    (m,) = topic.produce([("k", "v")])
    after = int(datetime.now(UTC).timestamp() * 1000)
    assert before - 1 <= m.timestamp <= after + 1
    ((_, _, _, _, _, ts, ts_type),) = rows_of(topic.read_batch(spark))
    assert (ts, ts_type) == (m.timestamp, 0)  # CreateTime


def test_headers_mirror_include_headers(spark, tmp_path):
    topic = LocalKafkaTopic(tmp_path, "h", partitions=1)
    topic.produce(
        [
            ("a", "1", None, [("trace", "abc"), ("bin", b"\x00"), ("none", None)]),
            ("b", "2", None, {"only": "x"}),
            ("c", "3"),  # no headers -> null, as Spark's Kafka source gives
        ]
    )
    rows = topic.read_batch(spark, include_headers=True).orderBy("offset").collect()
    assert [[(h.key, h.value) for h in r.headers] if r.headers else None for r in rows] == [
        [("trace", b"abc"), ("bin", b"\x00"), ("none", None)],
        [("only", b"x")],
        None,
    ]


def test_invalid_input_writes_nothing(tmp_path):
    topic = LocalKafkaTopic(tmp_path, "t", partitions=2)
    with pytest.raises(TypeError, match="str, bytes or None"):
        topic.produce([("ok", "v"), ("bad", 42)])
    with pytest.raises(TypeError, match="record"):
        topic.produce(["just a string"])
    with pytest.raises(ValueError, match=">= 0"):
        topic.produce([("k", "v", -5)])
    with pytest.raises(ValueError, match=r"partition must be in \[0, 2\)"):
        topic.produce([("k", "v")], partition=2)
    assert topic.produce([]) == []
    assert data_files(topic) == []
    assert topic.end_offsets() == {0: 0, 1: 0}


def test_topic_metadata_is_checked(tmp_path):
    LocalKafkaTopic(tmp_path, "t", partitions=2)
    assert LocalKafkaTopic(tmp_path, "t", partitions=2).partitions == 2
    with pytest.raises(ValueError, match="has 2 partitions, not 3"):
        LocalKafkaTopic(tmp_path, "t", partitions=3)
    with pytest.raises(FileNotFoundError, match="pass partitions=N"):
        LocalKafkaTopic(tmp_path, "missing")
    for bad in ("", "..", "a/b", "x" * 250, "sp ace"):
        with pytest.raises(ValueError, match="illegal topic name"):
            LocalKafkaTopic(tmp_path, bad, partitions=1)
    with pytest.raises(ValueError, match="positive int"):
        LocalKafkaTopic(tmp_path, "z", partitions=0)


# -- streaming -------------------------------------------------------------------------------


def test_stream_sees_every_record_once_across_available_now_runs(spark, tmp_path):
    topic = LocalKafkaTopic(tmp_path / "kafka", "orders", partitions=3)
    checkpoint = tmp_path / "checkpoint"
    first = topic.produce([(f"k{i}", f"v{i}") for i in range(30)])
    first += topic.produce([(None, "null-key")])

    run1 = run_available_now(topic.read_stream(spark), checkpoint)
    seen1 = sorted((r for _, rows in run1 for r in rows), key=by_position)
    assert [(r[3], r[4]) for r in seen1] == sorted((m.partition, m.offset) for m in first)

    ends_after_first = topic.end_offsets()
    second = topic.produce([(f"k{i}", f"again{i}") for i in range(10)])
    # A new query on the same checkpoint (a restarted job) reads only the new records.
    run2 = run_available_now(topic.read_stream(spark), checkpoint)
    seen2 = sorted((r for _, rows in run2 for r in rows), key=by_position)
    assert [(r[3], r[4]) for r in seen2] == sorted((m.partition, m.offset) for m in second)
    assert min(b for b, _ in run2) > max(b for b, _ in run1)
    for _, _, _, p, offset, _, _ in seen2:
        assert offset >= ends_after_first[p]

    # Together: every produced record exactly once.
    everything = seen1 + seen2
    assert len(everything) == len({(r[3], r[4]) for r in everything}) == 41
    assert sorted(everything, key=by_position) == rows_of(topic.read_batch(spark))

    # Nothing new: a third run commits no batch with data.
    run3 = run_available_now(topic.read_stream(spark), checkpoint)
    assert sum(len(rows) for _, rows in run3) == 0


def test_failed_batch_is_replayed_with_the_same_records(spark, tmp_path):
    """At-least-once through the checkpoint: a batch that failed is re-run on restart with
    the same batch id and exactly the records it was planned with (what an idempotent,
    batch-id-keyed sink needs for exactly-once), even if more was produced meanwhile."""
    from pyspark.errors import StreamingQueryException

    topic = LocalKafkaTopic(tmp_path / "kafka", "orders", partitions=2)
    checkpoint = tmp_path / "checkpoint"
    first = topic.produce([(f"k{i}", "v") for i in range(10)])

    def fail(batch_df, batch_id):
        batch_df.count()
        raise RuntimeError("sink down")

    query = (
        topic.read_stream(spark)
        .writeStream.foreachBatch(fail)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    with pytest.raises(StreamingQueryException, match="sink down"):
        query.awaitTermination(180)

    later = topic.produce([(f"n{i}", "v") for i in range(5)])
    run = run_available_now(topic.read_stream(spark), checkpoint)
    batch_ids = [b for b, _ in run]
    assert batch_ids[0] == 0  # the failed batch, replayed under its id
    assert [by_position(r) for r in run[0][1]] == sorted((m.partition, m.offset) for m in first)
    rest = sorted((r for _, rows in run[1:] for r in rows), key=by_position)
    assert [by_position(r) for r in rest] == sorted((m.partition, m.offset) for m in later)


def test_max_files_per_trigger_keeps_partition_order_across_batches(spark, tmp_path):
    topic = LocalKafkaTopic(tmp_path / "kafka", "orders", partitions=2)
    for i in range(4):
        topic.produce([(f"a{i}", "x"), (f"b{i}", "y")], partition=i % 2)
        topic.produce([(f"c{i}", "z")], partition=0)
    run = run_available_now(
        topic.read_stream(spark, max_files_per_trigger=1), tmp_path / "checkpoint"
    )
    data_batches = [rows for _, rows in run if rows]
    assert len(data_batches) == 8  # one file per micro-batch
    last = {0: -1, 1: -1}
    for rows in data_batches:  # batches in order; within a partition offsets only grow
        for r in rows:
            assert r[4] == last[r[3]] + 1
            last[r[3]] = r[4]
    assert {p: o + 1 for p, o in last.items()} == topic.end_offsets()


# -- lag ----------------------------------------------------------------------------------


def test_end_position_drives_engine_lags(tmp_path):
    topic = LocalKafkaTopic(tmp_path / "kafka", "orders", partitions=2)
    produced = topic.produce([(f"k{i}", str(i)) for i in range(5)], partition=0)
    produced += topic.produce([(f"k{i}", str(i)) for i in range(5, 8)], partition=1)
    root = tmp_path / "stores"
    iqkit.create_store(root, "totals", partitions=2, partitioner="explicit")
    with iqkit.StoreWriter(root, "totals") as w:
        # Apply partition 0 up to offset 2 and all of partition 1.
        for m in produced:
            if m.partition == 1 or m.offset <= 2:
                w.put(
                    f"k{m.offset}",
                    1,
                    partition=m.partition,
                    source=(m.topic, m.partition, m.offset),
                )
        w.record_source_end(topic.end_position())
    with iqkit.open(root) as engine:
        recorded = engine.lags()["totals"]
        explicit = engine.lags(topic.end_position())["totals"]
    assert {p: info.offset_lag for p, info in recorded.items()} == {0: 2, 1: 0}
    assert {p: info.offset_lag for p, info in explicit.items()} == {0: 2, 1: 0}
    assert recorded[0].end_position == topic.end_position()
