"""``write_store`` and ``store_sink`` on an object-storage root (a real S3 server on
127.0.0.1): each test runs the same writes against an S3 root and a local root and
expects the same store, read through ``iqkit.open``.

The session's Python workers reach the server through the AWS variables they inherited
when the session started (tests/conftest.py), as executors on a cluster would from their
own environment; nothing is shared with the driver but the URL."""

from __future__ import annotations

import os

import pytest
from helpers import orders, run_available_now, windowed_counts

import iqkit
from iqkit.errors import StoreConflictError
from iqkit.spark import last_committed_batch, store_sink, write_store
from iqkit.spark.kafka_local import LocalKafkaTopic


def store_state(root, store: str) -> dict:
    """Every partition's records as bytes, its position and the versions: what two
    stores written alike must share."""
    with iqkit.open(root) as engine:
        r = engine.query(
            iqkit.StateQueryRequest.in_store(store).with_query(iqkit.RawScanQuery.scan())
        )
        partitions = {}
        for p, qr in sorted(r.partition_results.items()):
            assert qr.is_success, qr
            with qr.result as it:
                partitions[p] = ([(kv.key, kv.value) for kv in it], qr.position.to_map())
        return {"partitions": partitions, "versions": len(engine.versions(store))}


@pytest.fixture
def roots(s3_root, tmp_path, monkeypatch):
    """(the S3 root, a local root); the current folder is an empty one of the test's, so
    a URL taken for a path would show up there."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return s3_root, tmp_path / "local"


def test_write_store_upsert_then_overwrite_matches_a_local_root(spark, roots):
    first = spark.createDataFrame(
        [(f"c{i}", i, f"r{i % 3}") for i in range(40)], "customer string, total long, region string"
    )
    second = spark.createDataFrame(
        [("c1", 100, "r9"), ("c50", 5, "r0")], "customer string, total long, region string"
    )
    for root in roots:
        assert write_store(first, root, "totals", key="customer", partitions=4) == 1
        assert write_store(second, root, "totals", key="customer", partitions=4) == 2
        assert (
            write_store(second, root, "totals", key="customer", partitions=4, mode="overwrite") == 3
        )
    s3, local = roots
    assert store_state(s3, "totals") == store_state(local, "totals")
    with iqkit.open(s3) as engine:
        r = engine.query(iqkit.StateQueryRequest.in_store("totals").with_query(
            iqkit.KeyQuery.with_key("c1")))  # fmt: skip
        assert r.only_partition_result().result == {"total": 100, "region": "r9"}
        assert list(engine.versions("totals")) == [1, 2, 3]
    assert os.listdir(".") == []


def test_window_store_and_composite_keys_match_a_local_root(spark, roots):
    counts = windowed_counts(spark, users=6, windows=3)
    pairs = spark.createDataFrame(
        [("eu", f"u{i}", i * 1.5) for i in range(12)], "region string, user string, score double"
    )
    for root in roots:
        write_store(counts, root, "clicks", key="user", value="n", window="window", partitions=3)
        write_store(pairs, root, "scores", key=["region", "user"], value="score", partitions=2)
    s3, local = roots
    for store in ("clicks", "scores"):
        assert store_state(s3, store) == store_state(local, store)


def test_kafka_positions_and_a_retried_task_match_a_local_root(spark, roots, tmp_path):
    rows = [(f"k{i % 9}", i, "orders", i % 2, i) for i in range(30)]
    df = spark.createDataFrame(
        rows, "key string, v long, topic string, partition int, offset long"
    ).repartition(2)
    for n, root in enumerate(roots):
        marker = tmp_path / f"fail-once-{n}"
        marker.touch()
        version = write_store(
            df, root, "latest", key="key", value="v", partitions=3, _fail_task_once=str(marker)
        )
        assert version == 1 and not marker.exists()  # one attempt failed, the retry won
    s3, local = roots
    assert store_state(s3, "latest") == store_state(local, "latest")


def test_a_failed_job_on_s3_publishes_nothing_and_the_last_version_stays(spark, s3_root):
    good = spark.createDataFrame([("a", 1), ("b", 2)], "k string, v long")
    write_store(good, s3_root, "s", key="k", value="v", partitions=2)
    before = store_state(s3_root, "s")
    bad = spark.createDataFrame([("a", 10), (None, 3)], "k string, v long")
    with pytest.raises(ValueError, match="null keys"):
        write_store(bad, s3_root, "s", key="k", value="v", partitions=2)
    assert store_state(s3_root, "s") == before
    # a first write that fails creates no store
    with pytest.raises(ValueError, match="null keys"):
        write_store(bad, s3_root, "never", key="k", value="v", partitions=2)
    with iqkit.open(s3_root) as engine:
        assert engine.store_names() == ["s"]


def test_a_commit_that_landed_meanwhile_makes_the_job_publish_nothing(spark, s3_root):
    from iqkit.store.encoding.keyspace import kv_key
    from iqkit.store.formats import format_for
    from iqkit.store.roots import parse_root

    df = spark.createDataFrame([("a", 1)], "k string, v long")
    write_store(df, s3_root, "s", key="k", value="v", partitions=2)
    with format_for(parse_root(s3_root)).open_job_commit("s") as job:
        # another writer publishes version 2 while this job holds base version 1
        write_store(df, s3_root, "s", key="k", value="v", partitions=2)
        staged = [job.spec.stage(0, [(kv_key(b"x"), b"1")], attempt="t")]
        with pytest.raises(StoreConflictError, match="changed while the job ran"):
            job.publish(staged)
    with iqkit.open(s3_root) as engine:
        assert list(engine.versions("s")) == [1, 2]


def test_store_sink_on_s3_matches_a_local_root_and_skips_replays(spark, roots, tmp_path):
    topic = LocalKafkaTopic(tmp_path / "topics", "orders", 3)
    for start in (0, 20):
        topic.produce(orders(start, 20))
    for n, root in enumerate(roots):
        sink = store_sink(
            root, "latest", key="user", value="amount", partitions=4,
            end_offsets=topic.end_position,
        )  # fmt: skip
        run_available_now(spark, topic, sink, tmp_path / f"checkpoint-{n}", max_files_per_trigger=1)
    s3, local = roots
    assert store_state(s3, "latest") == store_state(local, "latest")
    done = last_committed_batch(s3, "latest", "latest")
    assert done is not None and done == last_committed_batch(local, "latest", "latest")
    # a replayed batch id of the same caller changes nothing; an empty batch records its id
    sink = store_sink(s3, "latest", key="user", value="amount", partitions=4)
    versions = store_state(s3, "latest")["versions"]
    sink(spark.createDataFrame([("user-1", 999)], "user string, amount long"), 0)
    sink(spark.createDataFrame([], "user string, amount long"), 1)
    sink(spark.createDataFrame([("user-1", 999)], "user string, amount long"), 1)  # replay
    assert store_state(s3, "latest")["versions"] == versions + 2
    with iqkit.open(s3) as engine:
        r = engine.query(iqkit.StateQueryRequest.in_store("latest").with_query(
            iqkit.KeyQuery.with_key("user-1")))  # fmt: skip
        assert r.only_partition_result().result == 999
        assert {li.offset_lag for li in engine.lags()["latest"].values()} == {0}
