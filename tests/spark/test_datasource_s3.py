"""df.write.format("iqkit") and spark.read.format("iqkit") on an object-storage root
(``s3://bucket/stores`` on the test S3 server, SST-chain stores) behave exactly as on a
local root (folder stores).

Every test makes the same writes to a local root and to an S3 root and compares what
the two hold — every retained version's rows and positions, read through ``iqkit.open``
and through ``spark.read`` — so the expectations come from the folder format, which
tests/spark/test_datasource_write.py and test_datasource_read.py pin down. The Spark
session's Python workers reach the same S3 server with a cache of their own
(tests/conftest.py), so the driver and the tasks share nothing but the URL.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from pathlib import Path

import pytest
from helpers import kv_rows
from pyspark.sql import functions as F

import iqkit
from iqkit import RangeQuery, StateQueryRequest, WindowRangeQuery
from iqkit.spark import register
from iqkit.store.chain.records import read_version
from iqkit.store.chain.stores import chain_store_names
from iqkit.store.names import CHAIN_SST_DIR
from iqkit.store.objects import open_objects
from iqkit.store.roots import parse_root

KV_DDL = "k string, v long"
KAFKA_DDL = "topic string, partition int, offset long, k string, v long"


@pytest.fixture(scope="module", autouse=True)
def iqkit_format(spark):
    register(spark)
    # The folder a URL would become if it were ever taken for a path ("s3:/bucket/...").
    # Python workers run in the JVM's working folder; this process may chdir.
    workers_cwd = spark.sparkContext.parallelize([0], 1).map(lambda _: os.getcwd()).collect()[0]
    folders = {Path.cwd(), Path(workers_cwd)}
    before = {f: _url_like(f) for f in folders}
    yield
    assert {f: _url_like(f) for f in folders} == before


def _url_like(folder: Path) -> set[str]:
    return {e.name for e in folder.iterdir() if e.name.lower().startswith("s3")}


@pytest.fixture
def roots(s3_root, tmp_path, monkeypatch):
    """A local root and an S3 root, from an empty current folder that must stay empty."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield tmp_path / "local", s3_root
    assert list(cwd.iterdir()) == []


def save(df, root, store, *, mode="append", **options):
    writer = df.write.format("iqkit").mode(mode).option("store", store)
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save(str(root))


def save_both(df, roots, store, **options):
    for root in roots:
        save(df, root, store, **options)


def spread(spark, partitions: list[list[tuple]], ddl: str):
    """A DataFrame whose Spark partition i holds exactly ``partitions[i]``, in order."""
    rows = [r for part in partitions for r in part]
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, len(partitions)), ddl)
    assert [len(p) for p in df.rdd.glom().collect()] == [len(p) for p in partitions]
    return df


# -- what a root holds -------------------------------------------------------------------------
def state(root, store) -> dict:
    """The store's settings and every retained version's rows and positions."""
    with iqkit.open(root) as engine:
        manifest = engine.manifest(store)
        versions = engine.versions(store)
    # Settings only: a chain store's manifest says format_version 2 (a folder store's 1).
    settings = {k: v for k, v in dataclasses.asdict(manifest).items() if k != "format_version"}
    out: dict = {"manifest": settings, "versions": versions}
    for version in versions:
        with iqkit.open(root, as_of={store: version}) as engine:
            if manifest.kind.windowed:
                query = WindowRangeQuery.with_window_start_range(-(2**62), 2**62)
            else:
                query = RangeQuery.with_no_bounds()
            r = engine.query(StateQueryRequest.in_store(store).with_query(query))
            rows = []
            for p, q in sorted(r.partition_results.items()):
                assert q.is_success, q.failure_message
                with q.result as it:
                    for kv in it:
                        key = kv.key
                        if isinstance(key, iqkit.Windowed):
                            rows.append((p, key.key, key.start, key.end, kv.value))
                        else:
                            rows.append((p, key, kv.value))
            positions = {p: q.position.to_map() for p, q in r.partition_results.items()}
            out[version] = {"rows": sorted(rows, key=repr), "positions": positions}
    return out


def spark_read(spark, root, store, **options):
    reader = spark.read.format("iqkit").option("store", store)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(str(root))


def spark_rows(spark, root, store, **options) -> list[tuple]:
    return sorted((tuple(r) for r in spark_read(spark, root, store, **options).collect()), key=repr)


def assert_same(spark, roots, store, *reads: dict) -> dict:
    """The S3 store equals the local one (engine and Spark reads); returns its state."""
    local, s3 = roots
    expected = state(local, store)
    assert state(s3, store) == expected
    for options in ({}, *reads):
        # Both roots read in one Spark job (the test's time goes to Spark jobs).
        both = (
            spark_read(spark, s3, store, **options)
            .withColumn("_s3", F.lit(True))
            .unionByName(spark_read(spark, local, store, **options).withColumn("_s3", F.lit(False)))
            .collect()
        )
        from_s3 = sorted((tuple(r)[:-1] for r in both if r["_s3"]), key=repr)
        from_local = sorted((tuple(r)[:-1] for r in both if not r["_s3"]), key=repr)
        assert from_s3 == from_local, options
        if not options:
            assert len(from_s3) == len(expected[expected["versions"][-1]]["rows"])
    assert unlisted_ssts(s3, store) == set()
    return expected


def unlisted_ssts(s3_root: str, store: str) -> set[str]:
    """SSTs on the root that no retained version lists (runs a commit compacted away, or
    a job that failed, must not be left behind by the data source)."""
    objects = open_objects(parse_root(s3_root))
    with iqkit.open(s3_root) as engine:
        versions = engine.versions(store)
    listed = set().union(*(read_version(objects, store, v).files() for v in versions))
    return {k for k in objects.list(f"{store}/{CHAIN_SST_DIR}") if k.endswith(".sst")} - listed


# -- tests -------------------------------------------------------------------------------------
def test_append_with_deletes_then_overwrite_like_a_local_root(spark, roots):
    first = spark.createDataFrame([(f"k{i}", i) for i in range(40)], KV_DDL).repartition(3)
    save_both(first, roots, "s", key="k", value="v", partitions=3)
    # Two Spark partitions (the later one wins), null values (deletes), several sorted
    # runs per task (_run_rows=2), merged in order, tombstones included.
    update = spread(
        spark,
        [
            [("k1", 100), ("k2", None), ("k1", 101), ("new", 7), ("k3", None)],
            [("k1", 102), ("k2", 200), ("k4", None), ("k5", None), ("new", None)],
        ],
        KV_DDL,
    )
    save_both(update, roots, "s", key="k", value="v", _run_rows=2)
    after_update = assert_same(spark, roots, "s", {"as_of": 1})
    assert after_update["versions"] == [1, 2]
    assert len(after_update[2]["rows"]) < len(after_update[1]["rows"])  # deletes landed
    # Overwrite: the store holds only the new rows; the old versions stay readable.
    replacement = spark.createDataFrame([("z", 1), ("k1", 2), ("gone", None)], KV_DDL)
    save_both(replacement, roots, "s", mode="overwrite", key="k", value="v")
    after = assert_same(spark, roots, "s")
    assert after["versions"] == [1, 2, 3]
    assert len(after[3]["rows"]) == 2
    # if_exists: "ignore" writes nothing, "error" refuses.
    s3 = roots[1]
    save(first, s3, "s", key="k", value="v", if_exists="ignore")
    with pytest.raises(Exception, match=r"store 's' already exists under s3://.*if_exists"):
        save(first, s3, "s", key="k", value="v", if_exists="error")
    assert state(s3, "s") == after


def test_many_runs_make_one_fragment_leaving_no_unlisted_file(spark, roots):
    rows = [(f"k{i % 9}", i if i % 4 else None) for i in range(60)]
    df = spark.createDataFrame(rows, KV_DDL).coalesce(1)
    # 30 runs of 2 rows, spilled and merged by the task into one fragment (assert_same
    # checks no SST is left unlisted).
    save_both(df, roots, "s", key="k", value="v", partitions=1, _run_rows=2)
    assert assert_same(spark, roots, "s")["versions"] == [1]


def test_kafka_shaped_input_positions_and_json_records_like_a_local_root(spark, roots):
    parts = [
        [("orders", 0, o, f"k{o % 5}", o) for o in range(0, 6)]
        + [("orders", 2, o, f"k{o}", o) for o in range(10, 14)],
        [("orders", 1, o, f"m{o % 3}", o) for o in range(0, 8)]
        + [("orders", 2, o, f"k{o}", o) for o in range(14, 16)],
    ]
    df = spread(spark, parts, KAFKA_DDL)
    save_both(df, roots, "s", key="k", value="v", partitions=4)  # murmur2: all advance
    save_both(df, roots, "byp", key="k", partitions=3, mark_as_partitioned="partition")
    got = assert_same(spark, roots, "s")
    assert all(got[1]["positions"][p] for p in range(4))  # positions were recorded
    assert assert_same(spark, roots, "byp")[1]["rows"]


def test_window_store_like_a_local_root(spark, roots):
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    clicks = spark.createDataFrame(
        [("ann", t0 + dt.timedelta(minutes=m)) for m in (0, 1, 6, 7, 8, 12)]
        + [("bob", t0), ("cat", t0 + dt.timedelta(minutes=31))],
        "user string, ts timestamp",
    )
    counts = clicks.groupBy(F.window("ts", "5 minutes"), "user").agg(F.count("*").alias("n"))
    save_both(counts, roots, "clicks", key="user", value="n", window="window", partitions=2)
    later = counts.where("user = 'ann'").withColumn("n", F.col("n") * 10)
    save_both(later, roots, "clicks", key="user", value="n", window="window")
    start = int(t0.timestamp() * 1000)
    got = assert_same(spark, roots, "clicks", {"key": "ann", "time_to": start + 300_000})
    assert got["manifest"]["window_size_ms"] == 300_000
    # A window of another size is refused before anything is published.
    s3 = roots[1]
    wider = clicks.groupBy(F.window("ts", "10 minutes"), "user").agg(F.count("*").alias("n"))
    with pytest.raises(Exception, match=r"window_size_ms=300000 \(the DataFrame needs"):
        save(wider, s3, "clicks", key="user", value="n", window="window")
    assert state(s3, "clicks") == got
    assert unlisted_ssts(s3, "clicks") == set()  # the refused job's runs were removed


def test_a_failed_job_publishes_nothing_and_the_last_version_stays_readable(spark, roots):
    _, s3 = roots
    save(spark.createDataFrame([("a", 1), ("b", 2)], KV_DDL), s3, "s", key="k", value="v",
         partitions=2)  # fmt: skip
    before, read_before = state(s3, "s"), spark_rows(spark, s3, "s")
    # Spark partition 0 uploads its runs, partition 1 holds a null key: the task fails.
    bad = spread(spark, [[("b", 20), ("c", 3)], [("d", 4), (None, 5)]], KV_DDL)
    with pytest.raises(Exception, match="store 's': key column 'k' holds null keys"):
        save(bad, s3, "s", key="k", value="v")
    # Nothing is published: version 1 reads as before. (A run that a still-running task
    # uploads after abort() may be left: chain retention removes such orphans.)
    assert state(s3, "s") == before
    assert spark_rows(spark, s3, "s") == read_before
    # A first write whose commit fails (every task uploaded its runs; windows of two
    # sizes are refused on the driver) leaves nothing: no store, no run.
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    clicks = spark.createDataFrame([("ann", t0), ("bob", t0)], "user string, ts timestamp")
    mixed = clicks.select("user", F.window("ts", "5 minutes").alias("w")).unionByName(
        clicks.select("user", F.window("ts", "10 minutes").alias("w"))
    )
    with pytest.raises(Exception, match="store 'new': window column 'w' must hold windows of"):
        save(mixed.withColumn("n", F.lit(1)), s3, "new", key="user", value="n", window="w",
             partitions=2)  # fmt: skip
    objects = open_objects(parse_root(s3))
    assert chain_store_names(objects) == ["s"]
    assert objects.list("new") == []


def test_a_task_attempt_that_dies_is_retried_and_the_job_publishes_once(spark, roots, tmp_path):
    local, s3 = roots
    first = spark.createDataFrame([(f"k{i}", i) for i in range(30)], KV_DDL)
    save_both(first, roots, "s", key="k", value="v", partitions=3)
    second = spark.createDataFrame([(f"k{i}", i + 1000) for i in range(30)], KV_DDL)
    save(second, local, "s", key="k", value="v")
    marker = tmp_path / "crash-once"
    marker.write_text("x")
    save(second, s3, "s", key="k", value="v", _fail_task_once=str(marker))
    assert not marker.exists()  # a task attempt really died (after uploading its runs)
    got = state(s3, "s")
    assert got == state(local, "s")
    assert got["versions"] == [1, 2]


def test_a_commit_landing_during_the_job_makes_it_publish_nothing(spark, roots, tmp_path):
    _, s3 = roots
    save(spark.createDataFrame([("a", 1)], KV_DDL), s3, "s", key="k", value="v", partitions=2)
    marker = tmp_path / "commit-once"
    marker.write_text("x")
    root_text, marker_text = s3, str(marker)

    def commit_meanwhile(k):  # no type hints: they would make Spark guess a UDF kind
        import os

        import iqkit as iq

        try:
            os.remove(marker_text)
        except FileNotFoundError:
            return k
        with iq.StoreWriter(root_text, "s") as w:  # another writer, on an executor
            w.put("other", 42)
        return k

    df = spark.createDataFrame([("x", 7), ("y", 8)], KV_DDL).withColumn(
        "k", F.udf(commit_meanwhile, "string")("k")
    )
    with pytest.raises(Exception, match=r"store 's' changed while the job ran \(version 1 -> 2"):
        save(df, s3, "s", key="k", value="v")
    with iqkit.open(s3) as engine:
        assert engine.versions("s") == [1, 2]
        assert {k: v for _, k, v in kv_rows(engine, "s")} == {"a": 1, "other": 42}
    assert unlisted_ssts(s3, "s") == set()  # the job's runs were removed


def test_a_missing_or_misspelt_store_names_the_stores_of_an_s3_root(spark, roots):
    _, s3 = roots
    save(spark.createDataFrame([("a", 1)], KV_DDL), s3, "totals", key="k", value="v",
         partitions=2)  # fmt: skip
    with pytest.raises(Exception, match=r"option 'store' is required \(stores under s3://.*totals"):
        spark.read.format("iqkit").load(s3).collect()
    with pytest.raises(Exception, match="unknown store 'totls'; did you mean 'totals'"):
        spark.read.format("iqkit").option("store", "totls").load(s3).collect()
