"""Structured Streaming into stores through store_sink, over the local Kafka stand-in."""

from __future__ import annotations

import json

import pytest
from helpers import kv_rows, non_finite_frames, orders, run_available_now
from store_facts import version_record, version_record_path

import iqkit
from iqkit.spark import last_committed_batch, store_sink
from iqkit.spark.kafka_local import LocalKafkaTopic


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
    return [version_record(root, store, v).metadata.get("spark_batch_id", -1) for v in versions]


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


def store_values(root, store):
    with iqkit.open(root) as engine:
        return engine.version(store), {k: v for _, k, v in kv_rows(engine, store)}


def test_a_new_query_is_never_taken_for_a_replay_and_a_restart_replays_nothing(spark, tmp_path):
    root = tmp_path / "stores"
    sink = store_sink(root, "latest", key="user", value="amount", partitions=4)
    # One input partition: one file per produce call, one micro-batch per file.
    orders_topic = LocalKafkaTopic(tmp_path / "topics", "orders", 1)
    for start in (0, 20, 40):
        orders_topic.produce(orders(start, 20))
    # Query A (its own checkpoint): batch ids 0, 1, 2; the last one sets user-1 to 57.
    run_available_now(spark, orders_topic, sink, tmp_path / "cp-a", max_files_per_trigger=1)
    assert last_committed_batch(root, "latest", "latest") == 2
    # Query B: a new checkpoint writing to the same store under the same (default) sink
    # name; its batch ids start again at 0, below A's 2. 50 new keys, and user-1 again.
    refunds = LocalKafkaTopic(tmp_path / "topics", "refunds", 1)
    refunds.produce([(f"new-{i}", json.dumps({"amount": -i})) for i in range(50)])
    refunds.produce([("user-1", json.dumps({"amount": -1}))])
    run_available_now(spark, refunds, sink, tmp_path / "cp-b", max_files_per_trigger=1)
    version, values = store_values(root, "latest")
    assert {k: v for k, v in values.items() if k.startswith("new-")} == {
        f"new-{i}": -i for i in range(50)
    }
    assert values["user-1"] == -1
    assert last_committed_batch(root, "latest", "latest") == 1  # B committed last
    # A restarts from its checkpoint after dying between the store commit of batch 2 and
    # Spark's commit log entry: Spark runs batch 2 again (same offsets, same query id).
    # It was committed: nothing changes (re-applying it would put user-1 back to 57).
    for name in ("2", ".2.crc"):  # the entry and Hadoop's checksum file beside it
        (tmp_path / "cp-a" / "commits" / name).unlink()
    run_available_now(spark, orders_topic, sink, tmp_path / "cp-a")
    assert (tmp_path / "cp-a" / "commits" / "2").exists()  # Spark did run batch 2 again
    assert store_values(root, "latest") == (version, values)
    # Both queries' progress is kept, each under its own query id.
    from iqkit.store.sinks import sink_progress

    record = version_record(root, "latest", version)
    assert sorted(e.batch for e in sink_progress(record.metadata, "latest").values()) == [1, 2]
    assert record.metadata["spark_query_id"] in sink_progress(record.metadata, "latest")


def test_sink_progress_in_old_version_records_still_reads(spark, tmp_path):
    """Records written before query ids were kept hold ``sinks: {name: batch id}``."""
    root = tmp_path / "stores"
    sink = store_sink(root, "s", key="k", value="v", partitions=2)
    sink(spark.createDataFrame([("a", 1)], "k string, v long"), 0)
    record = version_record_path(root, "s", 1)  # the same JSON layout in either format
    data = json.loads(record.read_text())
    data["metadata"]["sinks"] = {"s": 5}  # the old shape
    data.pop("checksum")  # records that old carried no checksum (store/integrity.py)
    record.write_text(json.dumps(data))
    assert last_committed_batch(root, "s", "s") == 5
    sink(spark.createDataFrame([("a", 2)], "k string, v long"), 5)  # a replay: skipped
    with iqkit.open(root) as engine:
        assert engine.version("s") == 1
    sink(spark.createDataFrame([("a", 3)], "k string, v long"), 6)
    assert store_values(root, "s") == (2, {"a": 3})
    assert last_committed_batch(root, "s", "s") == 6


def test_a_micro_batch_with_nan_in_a_json_value_is_refused_and_creates_no_store(spark, tmp_path):
    sink = store_sink(tmp_path, "s", key="k", partitions=2)
    _, df, _ = non_finite_frames(spark)[0]
    with pytest.raises(ValueError, match="store 's': value column 'x' holds NaN"):
        sink(df, 0)
    assert not (tmp_path / "s").exists()
