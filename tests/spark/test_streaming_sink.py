"""Structured Streaming into stores through store_sink, over the local Kafka stand-in."""

from __future__ import annotations

import json

from helpers import kv_rows
from pyspark.sql import functions as F

import iqkit
from iqkit.spark import last_committed_batch, store_sink
from iqkit.spark.kafka_local import LocalKafkaTopic


def orders(start, count):
    return [(f"user-{i % 7}", json.dumps({"amount": i})) for i in range(start, start + count)]


def run_available_now(spark, topic, sink, checkpoint, **read):
    stream = topic.read_stream(spark, **read).select(
        F.col("key").cast("string").alias("user"),
        F.get_json_object(F.col("value").cast("string"), "$.amount").cast("long").alias("amount"),
        "topic",
        "partition",
        "offset",
    )
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None


def test_stream_commits_micro_batches_with_positions_and_lag(spark, tmp_path):
    root, checkpoint = tmp_path / "stores", tmp_path / "checkpoint"
    topic = LocalKafkaTopic(tmp_path / "topics", "orders", 3)
    for start in (0, 20, 40):
        topic.produce(orders(start, 20))
    sink = store_sink(
        root, "latest", key="user", value="amount", partitions=4, end_offsets=topic.end_position
    )
    run_available_now(spark, topic, sink, checkpoint, max_files_per_trigger=1)
    with iqkit.open(root) as engine:
        versions = engine.versions("latest")
        assert len(versions) >= 2  # several micro-batches, one version each
        values = {k: v for _, k, v in kv_rows(engine, "latest")}
        # the last record of each user wins: amounts 53..59 belong to users 4,5,6,0,1,2,3
        assert values == {f"user-{i % 7}": i for i in range(53, 60)}
        end = topic.end_offsets()
        r = engine.query(
            iqkit.StateQueryRequest.in_store("latest").with_query(iqkit.RawScanQuery.scan())
        )
        applied = {"orders": {ip: o - 1 for ip, o in end.items() if o > 0}}
        # a murmur2 store's partitions each read every input partition: all advance
        assert {p: qr.position.to_map() for p, qr in r.partition_results.items()} == {
            p: applied for p in range(4)
        }
        assert {li.offset_lag for li in engine.lags()["latest"].values()} == {0}
    assert last_committed_batch(root, "latest", "latest") == max(
        read_batch_ids(root, "latest", versions)
    )
    # more input: the next run commits only what is new, and positions advance
    topic.produce(orders(60, 10))
    run_available_now(spark, topic, sink, checkpoint)
    with iqkit.open(root) as engine:
        values = {k: v for _, k, v in kv_rows(engine, "latest")}
        assert values == {f"user-{i % 7}": i for i in range(63, 70)}
        r = engine.query(
            iqkit.StateQueryRequest.in_store("latest").with_query(iqkit.RawScanQuery.scan())
        )
    applied = {ip: o - 1 for ip, o in topic.end_offsets().items() if o > 0}
    assert [qr.position.to_map()["orders"] for qr in r.partition_results.values()] == [applied] * 4


def read_batch_ids(root, store, versions):
    from iqkit.store.layout import StoreLayout
    from iqkit.store.versions import read_version

    layout = StoreLayout.of(root, store)
    return [read_version(layout, v).metadata.get("spark_batch_id", -1) for v in versions]


def test_a_replayed_batch_id_changes_nothing(spark, tmp_path):
    root = tmp_path / "stores"
    sink = store_sink(root, "s", key="k", value="v", partitions=2)
    first = spark.createDataFrame([("a", 1), ("b", 2)], "k string, v long")
    sink(first, 0)
    sink(spark.createDataFrame([("a", 10)], "k string, v long"), 1)
    with iqkit.open(root) as engine:
        before = (engine.version("s"), sorted(kv_rows(engine, "s")))
    # Spark re-runs batch 1 after a restart (possibly with different rows): no effect
    sink(spark.createDataFrame([("a", 99), ("c", 3)], "k string, v long"), 1)
    sink(first, 0)
    with iqkit.open(root) as engine:
        after = (engine.version("s"), sorted(kv_rows(engine, "s")))
    assert after == before
    assert dict((k, v) for _, k, v in after[1]) == {"a": 10, "b": 2}
    sink(spark.createDataFrame([("a", 5)], "k string, v long"), 2)
    with iqkit.open(root) as engine:
        assert engine.version("s") == before[0] + 1
        assert last_committed_batch(root, "s", "s") == 2


def test_an_empty_micro_batch_records_its_id_and_end_offsets(spark, tmp_path):
    root = tmp_path / "stores"
    end = iqkit.Position.from_map({"t": {0: 5}})
    sink = store_sink(root, "s", key="k", value="v", partitions=1, end_offsets=lambda: end)
    sink(spark.createDataFrame([("a", 1)], "k string, v long"), 0)
    sink(spark.createDataFrame([], "k string, v long"), 1)
    assert last_committed_batch(root, "s", "s") == 1
    with iqkit.open(root) as engine:
        assert engine.lags()["s"][0].end_position == end
