"""write_store: DataFrames into stores, queried back through the engine (real Spark)."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from helpers import NON_FINITE_DDL, kv_rows, non_finite_frames, windowed_counts
from pyspark.sql import functions as F
from store_facts import written_counts

import iqkit
from iqkit import KeyQuery, StateQueryRequest
from iqkit.spark import register, write_store
from iqkit.store.encoding.partitioners import murmur2_partition


def get(engine, store, key):
    only = engine.query(
        StateQueryRequest.in_store(store).with_query(KeyQuery.with_key(key))
    ).only_partition_result()
    return None if only is None else only.result


def job_debris(root):
    return list(root.rglob(".job-*"))


def test_batch_write_then_query(spark, tmp_path):
    root = tmp_path / "stores"
    df = spark.createDataFrame(
        [(f"c{i}", i, float(i) / 2) for i in range(200)],
        "customer string, orders int, total double",
    )
    version = write_store(df, root, "totals", key="customer", partitions=4)
    assert version == 1
    with iqkit.open(root) as engine:
        assert get(engine, "totals", "c7") == {"orders": 7, "total": 3.5}
        assert engine.manifest("totals").partitioner == "murmur2"
        rows = kv_rows(engine, "totals")
    assert len(rows) == 200
    for p, key, _ in rows:  # each key sits where Kafka's partitioner puts it
        assert p == murmur2_partition(key.encode(), 4)
    assert job_debris(root) == []


def test_single_value_column_and_upsert_then_overwrite(spark, tmp_path):
    root = tmp_path / "stores"
    df = spark.createDataFrame([(i, i * 10) for i in range(50)], "id int, amount long")
    write_store(df, root, "amounts", key="id", value="amount", partitions=3)
    update = spark.createDataFrame([(1, 111), (99, 990)], "id int, amount long")
    write_store(update, root, "amounts", key="id", value="amount", partitions=3)
    with iqkit.open(root) as engine:
        m = engine.manifest("amounts")
        assert (m.key_serde, m.value_serde) == ("int32", "int64")
        assert [get(engine, "amounts", k) for k in (1, 2, 99)] == [111, 20, 990]
    write_store(update, root, "amounts", key="id", value="amount", partitions=3, mode="overwrite")
    with iqkit.open(root) as engine:
        assert [get(engine, "amounts", k) for k in (1, 2, 99)] == [111, None, 990]
        assert len(kv_rows(engine, "amounts")) == 2


def test_later_rows_of_a_key_win(spark, tmp_path):
    root = tmp_path / "stores"
    df = spark.createDataFrame([("a", 1), ("b", 2), ("a", 3)], "k string, v long").coalesce(1)
    write_store(df, root, "s", key="k", value="v", partitions=2)
    with iqkit.open(root) as engine:
        assert get(engine, "s", "a") == 3


def test_composite_keys_use_the_ordered_serde(spark, tmp_path):
    root = tmp_path / "stores"
    df = spark.createDataFrame(
        [("eu", "ann", 1), ("eu", "bob", 2), ("us", "cat", 3)], "region string, user string, n long"
    )
    write_store(df, root, "ck", key=["region", "user"], value="n", partitions=2)
    with iqkit.open(root) as engine:
        assert engine.manifest("ck").key_serde == "ordered"
        assert get(engine, "ck", ("eu", "bob")) == 2
        r = engine.query(
            StateQueryRequest.in_store("ck").with_query(iqkit.PrefixScanQuery.with_prefix(("eu",)))
        )
        found = sorted(
            kv.key for qr in r.partition_results.values() if qr.is_success for kv in qr.result
        )
    assert found == [("eu", "ann"), ("eu", "bob")]


def test_composite_key_store_reads_back_as_typed_columns_and_refuses_other_settings(
    spark, tmp_path
):
    """write_store records the key columns' types as the data source does (one shared
    ensure_spark_store), so the reader splits the key into typed columns; and a write
    with other settings raises the StoreExistsError create_store raises."""
    root = tmp_path / "stores"
    rows = [("eu", 1, 10), ("us", 2, 20)]
    df = spark.createDataFrame(rows, "region string, id long, n long")
    write_store(df, root, "ck", key=["region", "id"], value="n", partitions=2)
    register(spark)
    back = spark.read.format("iqkit").option("store", "ck").load(str(root))
    assert back.columns == ["partition", "region", "id", "value"]
    assert back.schema["id"].dataType.simpleString() == "bigint"
    assert sorted(tuple(r) for r in back.drop("partition").collect()) == sorted(rows)
    with pytest.raises(iqkit.StoreExistsError, match=r"partitions=2 \(the DataFrame needs 3\)"):
        write_store(df, root, "ck", key=["region", "id"], value="n", partitions=3)


def test_window_store_from_a_windowed_aggregation(spark, tmp_path):
    root = tmp_path / "stores"
    t0 = dt.datetime(2026, 1, 1, 0, 0, tzinfo=dt.UTC)
    clicks = spark.createDataFrame(
        [("ann", t0 + dt.timedelta(minutes=m)) for m in (0, 1, 6, 7, 8, 12)] + [("bob", t0)],
        "user string, ts timestamp",
    )
    counts = clicks.groupBy(F.window("ts", "5 minutes"), "user").agg(F.count("*").alias("clicks"))
    write_store(counts, root, "clicks", key="user", value="clicks", window="window", partitions=2)
    start = int(t0.timestamp() * 1000)
    with iqkit.open(root) as engine:
        assert engine.manifest("clicks").window_size_ms == 300_000
        q = iqkit.WindowKeyQuery.with_key_and_window_start_range("ann", start, start + 3_600_000)
        r = engine.query(StateQueryRequest.in_store("clicks").with_query(q))
        got = [
            (kv.key.start - start, kv.value)
            for qr in r.partition_results.values()
            if qr.is_success
            for kv in qr.result
        ]
    assert sorted(got) == [(0, 2), (300_000, 3), (600_000, 1)]


def test_bad_input_is_refused_before_anything_is_written(spark, tmp_path):
    root = tmp_path / "stores"
    df = spark.createDataFrame([("a", 1), (None, 2)], "k string, v long")
    with pytest.raises(ValueError, match="store 's': key column 'k' holds null keys"):
        write_store(df, root, "s", key="k", value="v", partitions=2)
    with pytest.raises(ValueError, match="key column 'nope' is not in the DataFrame"):
        write_store(df, root, "s", key="nope", partitions=2)
    with pytest.raises(
        ValueError, match="value column 'k' of type string does not fit the 'int64' serde"
    ):
        write_store(df, root, "s2", key="v", value="k", value_serde="int64", partitions=2)
    with pytest.raises(ValueError, match="window column 'v' must be Spark's window struct"):
        write_store(df, root, "s3", key="k", value="v", window="v", partitions=2)
    assert not (root / "s" / "LATEST").exists()
    good = spark.createDataFrame([("a", 1)], "k string, v long")
    write_store(good, root, "s", key="k", value="v", partitions=2)
    with pytest.raises(
        ValueError,
        match=r"store 's' exists with other settings: partitions=2 \(the DataFrame needs 3\)",
    ):
        write_store(good, root, "s", key="k", value="v", partitions=3)


def _stages_of_last_job(spark, group):
    tracker = spark.sparkContext.statusTracker()
    job = max(tracker.getJobIdsForGroup(group))
    return len(tracker.getJobInfo(job).stageIds)


def test_mark_as_partitioned_writes_without_a_shuffle_and_fans_out(spark, tmp_path):
    root = tmp_path / "stores"
    rows = [("in", p, o, f"k{p}-{o}") for p in range(3) for o in range(5)]
    # parallelize splits the list in order: Spark partition p holds input partition p
    df = spark.createDataFrame(
        spark.sparkContext.parallelize(rows, 3),
        "topic string, partition int, offset long, k string",
    )
    sc = spark.sparkContext
    sc.setJobGroup("explicit-write", "mark_as_partitioned")
    write_store(
        df, root, "byp", key="k", value="offset", partitions=3, mark_as_partitioned="partition"
    )
    no_shuffle = _stages_of_last_job(spark, "explicit-write")
    sc.setJobGroup("hashed-write", "murmur2")
    write_store(df, root, "hashed", key="k", value="offset", partitions=3)
    with_shuffle = _stages_of_last_job(spark, "hashed-write")
    sc.setJobGroup("other", "other")
    assert (no_shuffle, with_shuffle) == (1, 2)  # the write job: one stage, or map + reduce
    with iqkit.open(root) as engine:
        assert engine.manifest("byp").partitioner == "explicit"
        r = engine.query(StateQueryRequest.in_store("byp").with_query(KeyQuery.with_key("k2-4")))
        assert sorted(r.partition_results) == [0, 1, 2]  # key queries fan out
        assert r.partition_results[2].result == 4
        assert r.partition_results[0].result is None
        positions = {p: q.position.to_map() for p, q in r.partition_results.items()}
    assert positions[2]["in"][2] == 4


def test_mark_as_partitioned_refuses_a_column_out_of_range(spark, tmp_path):
    df = spark.createDataFrame([("a", 5)], "k string, p int")
    with pytest.raises(ValueError, match=r"must hold integers in \[0, 3\); found 5"):
        write_store(df, tmp_path, "s", key="k", value="p", partitions=3, mark_as_partitioned="p")


def test_mark_as_partitioned_detects_input_that_is_not_partitioned(spark, tmp_path):
    df = spark.createDataFrame(
        [(f"k{i}", i % 2) for i in range(40)], "k string, p int"
    ).repartition(4)
    with pytest.raises(ValueError, match="more than one Spark partition"):
        write_store(df, tmp_path, "s", key="k", value="p", partitions=2, mark_as_partitioned="p")
    assert job_debris(tmp_path) == []
    assert not (tmp_path / "s" / "LATEST").exists()


def test_a_failed_task_is_retried_and_the_job_publishes_exactly_once(spark, tmp_path):
    root = tmp_path / "stores"
    first = spark.createDataFrame([(f"k{i}", i) for i in range(100)], "k string, v long")
    write_store(first, root, "s", key="k", value="v", partitions=4)
    marker = tmp_path / "fail-once"
    marker.write_text("x")
    second = spark.createDataFrame([(f"k{i}", i + 1000) for i in range(100)], "k string, v long")
    version = write_store(
        second, root, "s", key="k", value="v", partitions=4, _fail_task_once=str(marker)
    )
    assert not marker.exists()  # a task attempt really failed
    assert version == 2
    with iqkit.open(root) as engine:
        assert engine.versions("s") == [1, 2]
        assert [get(engine, "s", f"k{i}") for i in range(0, 100, 9)] == [
            i + 1000 for i in range(0, 100, 9)
        ]
    with iqkit.open(root, as_of=1) as engine:
        assert get(engine, "s", "k5") == 5
    assert job_debris(root) == []


def test_a_job_that_fails_leaves_the_previous_version(spark, tmp_path):
    root = tmp_path / "stores"
    write_store(
        spark.createDataFrame([("a", 1)], "k string, v long"),
        root,
        "s",
        key="k",
        value="v",
        partitions=2,
    )
    bad = spark.createDataFrame([("a", 2), ("b", 3)], "k string, v long").withColumn(
        "v", F.when(F.col("k") == "b", F.raise_error("boom")).otherwise(F.col("v"))
    )
    with pytest.raises(Exception, match="boom"):
        write_store(bad, root, "s", key="k", value="v", partitions=2)
    with iqkit.open(root) as engine:
        assert engine.version("s") == 1
        assert get(engine, "s", "a") == 1
    assert job_debris(root) == []


def test_partitions_a_small_upsert_never_reached_are_empty(spark, tmp_path):
    root = tmp_path / "stores"
    write_store(
        spark.createDataFrame([("a", 1)], "k string, v long"),
        root,
        "s",
        key="k",
        value="v",
        partitions=8,
    )
    with iqkit.open(root) as engine:
        r = engine.query(
            StateQueryRequest.in_store("s").with_query(iqkit.RangeQuery.with_no_bounds())
        )
        # never written: empty, not failed (issue 10: they were NOT_PRESENT)
        assert all(q.is_success for q in r.partition_results.values())
        found = kv_rows(engine, "s")
    assert found == [(murmur2_partition(b"a", 8), "a", 1)]


def test_progress_reports_what_was_written(spark, tmp_path, capsys):
    df = spark.createDataFrame([(f"k{i}", i) for i in range(30)], "k string, v long")
    write_store(df, tmp_path, "s", key="k", value="v", partitions=3)
    err = capsys.readouterr().err
    assert "iqkit write 's'" in err
    assert "rows=30" in err and "version=1" in err
    write_store(df, tmp_path, "s", key="k", value="v", partitions=3, progress=False)
    assert "iqkit write" not in capsys.readouterr().err


def test_progress_counts_windows_not_rocksdb_keys(spark, tmp_path, capsys):
    # Each window is two RocksDB keys (the window and its time-index entry): the bar,
    # the version's rows_written and the commit records said 80 for these 40 windows.
    write_store(
        windowed_counts(spark, 8, 5), tmp_path, "w", key="user", value="n", window="window",
        partitions=2, _shuffle=False,
    )  # fmt: skip
    assert "rows=40," in capsys.readouterr().err
    rows_written, puts = written_counts(tmp_path, "w")
    assert rows_written == 40
    # On the shuffle path a partition's commit record is the first key of its SST,
    # written before the rows stream in, so it carries no counts (docs/DECISIONS.md "Spark writes");
    # written in place, the commit records count windows too.
    assert puts == 40
    write_store(
        windowed_counts(spark, 8, 5), tmp_path, "w2", key="user", value="n", window="window",
        partitions=2, _shuffle=True,
    )  # fmt: skip
    assert written_counts(tmp_path, "w2") == (40, None)


def test_a_first_write_that_fails_creates_no_store(spark, tmp_path):
    root = tmp_path / "stores"
    nulls = spark.createDataFrame([("a", "x", 1), (None, "y", 2)], "k string, k2 string, v long")
    spread_rows = spark.createDataFrame(
        [(f"k{i}", i % 2) for i in range(40)], "k string, p int"
    ).repartition(4)
    nan = spark.createDataFrame([("a", 1.0), ("b", float("nan"))], "k string, x double")
    cases = [
        # JVM-routed: the write tasks count null keys, the driver refuses the job
        ("jvm_nulls", nulls, dict(key="k", value="v"), "key column 'k' holds null keys"),
        # Python-routed: null keys are looked for before the job
        ("py_nulls", nulls, dict(key=["k", "k2"], value="v"), "key column 'k' holds null keys"),
        (
            "out_of_range",
            spark.createDataFrame([("a", 5)], "k string, p int"),
            dict(key="k", value="p", mark_as_partitioned="p"),
            r"must hold integers in \[0, 2\); found 5",
        ),
        (
            "not_partitioned",
            spread_rows,
            dict(key="k", value="p", mark_as_partitioned="p"),
            "more than one Spark partition",
        ),
        ("nan", nan, dict(key="k"), "value column 'x' holds NaN or an infinity"),
    ]
    for name, df, options, message in cases:
        with pytest.raises(ValueError, match=message):
            write_store(df, root, name, partitions=2, progress=False, **options)
        assert not (root / name).exists(), name  # no store, no folder, nothing staged
    with iqkit.open(root) as engine:
        assert engine.store_names() == []


def test_nan_and_infinities_in_json_values_are_refused_naming_the_column(spark, tmp_path):
    for store, df, message in non_finite_frames(spark):
        with pytest.raises(ValueError, match=message):
            write_store(df, tmp_path, store, key="k", partitions=2, progress=False)
        assert not (tmp_path / store).exists()
    # one json value column, routed in Python (binary keys): the same rule
    _, df, _ = non_finite_frames(spark)[1]
    df = df.withColumn("k", F.col("k").cast("binary"))
    with pytest.raises(ValueError, match="store 'one': value column 'xs' holds NaN"):
        write_store(df, tmp_path, "one", key="k", value="xs", value_serde="json", partitions=2)
    # the data a store already holds is untouched by a refused write
    fine = spark.createDataFrame([("a", 1.5, [1.0], {"u": 1.0}, (0.5,))], NON_FINITE_DDL)
    write_store(fine, tmp_path, "kept", key="k", partitions=2, progress=False)
    with pytest.raises(ValueError, match="store 'kept': value column 'x' holds NaN"):
        write_store(non_finite_frames(spark)[0][1], tmp_path, "kept", key="k", partitions=2)
    with iqkit.open(tmp_path) as engine:
        assert engine.version("kept") == 1
        assert get(engine, "kept", "a") == {"x": 1.5, "xs": [1.0], "m": {"u": 1.0}, "s": {"a": 0.5}}
        assert get(engine, "kept", "b") is None
    # a double value column keeps them: the double serde stores NaN and infinities
    x = spark.createDataFrame([("a", float("nan")), ("b", float("-inf"))], "k string, x double")
    write_store(x, tmp_path, "doubles", key="k", value="x", partitions=2, progress=False)
    with iqkit.open(tmp_path) as engine:
        assert math.isnan(get(engine, "doubles", "a"))
        assert get(engine, "doubles", "b") == float("-inf")


def test_windows_at_sparks_latest_timestamp_are_stored_exactly(spark, tmp_path):
    """Issue 20: a window start never wraps around. A Spark timestamp is 64-bit
    microseconds, so the milliseconds of its latest one fit in iqkit's 64-bit window
    starts: the window is stored where it is (Spark's own window() overflows before any
    later row could reach iqkit)."""
    root = tmp_path / "stores"
    latest_us = 2**63 - 1 - 300_000_000  # room for Spark's 5-minute window end
    df = spark.sql(f"SELECT 'a' AS user, timestamp_micros({latest_us}) AS ts")
    counts = df.groupBy(F.window("ts", "5 minutes"), "user").agg(F.count("*").alias("n"))
    write_store(counts, root, "far", key="user", value="n", window="window", partitions=2)
    with iqkit.open(root) as engine:
        q = iqkit.WindowRangeQuery.with_window_start_range(-(2**63), 2**63 - 1)
        r = engine.query(StateQueryRequest.in_store("far").with_query(q))
        got = [
            (kv.key.start, kv.key.end) for qr in r.partition_results.values() for kv in qr.result
        ]
    start_ms = latest_us // 1000 // 300_000 * 300_000
    assert got == [(start_ms, start_ms + 300_000)]


def test_the_session_s_arrow_batch_size_is_put_back_after_a_write(spark, tmp_path):
    # write_store raises Spark's Arrow batch size for its own job only (batch.py's
    # _arrow_batches); a smaller size the user chose is theirs again afterwards, also
    # when the write fails.
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "7")
    try:
        df = spark.createDataFrame([(f"c{i}", i) for i in range(50)], "customer string, n long")
        write_store(df, tmp_path / "stores", "small", key="customer", partitions=2)
        assert spark.conf.get(key) == "7"
        with pytest.raises(ValueError, match="null keys"):
            bad = spark.createDataFrame([(None, 1)], "customer string, n long")
            write_store(bad, tmp_path / "stores", "small", key="customer", partitions=2)
        assert spark.conf.get(key) == "7"
        with iqkit.open(tmp_path / "stores") as engine:
            assert get(engine, "small", "c42") == {"n": 42}
    finally:
        spark.conf.set(key, before)
