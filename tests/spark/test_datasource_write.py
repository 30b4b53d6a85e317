"""df.write.format("iqkit"): real local Spark, real stores on disk, read back through
``iqkit.open`` (the engine) and ``spark.read.format("iqkit")``.

Where the issue says "writes like write_store", the same DataFrame is also written with
``write_store`` and the two stores are compared row by row (partition, key, value,
positions), so the expectations come from the reference writer, not from this file.
"""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path

import pytest
from helpers import kv_rows, non_finite_frames, tree_digest, windowed_counts
from pyspark.sql import functions as F
from store_facts import written_counts

import iqkit
from iqkit import KeyQuery, PrefixScanQuery, RangeQuery, StateQueryRequest, WindowRangeQuery
from iqkit.spark import register, write_store
from iqkit.store.encoding.partitioners import murmur2_partition


@pytest.fixture(scope="module", autouse=True)
def iqkit_format(spark):
    register(spark)
    yield


def save(df, root, store, *, mode="append", **options):
    writer = df.write.format("iqkit").mode(mode).option("store", store)
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save(str(root))


def get(engine, store, key):
    only = engine.query(
        StateQueryRequest.in_store(store).with_query(KeyQuery.with_key(key))
    ).only_partition_result()
    return None if only is None else only.result


def contents(root, store) -> dict:
    with iqkit.open(root) as engine:
        return {key: value for _, key, value in kv_rows(engine, store)}


def positions(root, store) -> dict[int, dict]:
    """Every partition's position (failures carry one too; an empty partition's is empty)."""
    with iqkit.open(root) as engine:
        r = engine.query(StateQueryRequest.in_store(store).with_query(RangeQuery.with_no_bounds()))
        return {p: q.position.to_map() for p, q in r.partition_results.items()}


def window_rows(root, store) -> list[tuple]:
    with iqkit.open(root) as engine:
        q = WindowRangeQuery.with_window_start_range(-(2**62), 2**62)
        r = engine.query(StateQueryRequest.in_store(store).with_query(q))
        out = []
        for p, qr in sorted(r.partition_results.items()):
            if qr.is_success:
                with qr.result as it:
                    out.extend((p, kv.key.key, kv.key.start, kv.key.end, kv.value) for kv in it)
        return sorted(out)


def chain_files(root, store: str, partition: int) -> list:
    """The files of ``partition``'s chain in the store's latest version."""
    from iqkit.store.chain.records import latest_version
    from iqkit.store.objects import open_objects

    record = latest_version(open_objects(root), store)
    assert record is not None
    return list(record.partitions[partition].files)


def debris(root: Path) -> list[Path]:
    return sorted(Path(root).rglob(".job-*"))


def spread(spark, partitions: list[list[tuple]], ddl: str):
    """A DataFrame whose Spark partition i holds exactly ``partitions[i]``, in order."""
    rows = [r for part in partitions for r in part]
    sizes = [len(part) for part in partitions]
    assert len(set(sizes)) == 1, "parallelize splits evenly only for equal sizes"
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, len(partitions)), ddl)
    assert [len(p) for p in df.rdd.glom().collect()] == sizes
    return df


RECORD_DDL = (
    "id string, n int, big long, x double, ok boolean, note string, tags array<string>, "
    "attrs map<string,int>, nested struct<a:int,b:string>, ts timestamp, day date, "
    "price decimal(10,2), whole decimal(12,0), raw binary, f float, nothing string"
)


def record_rows(count: int) -> list[tuple]:
    t0 = dt.datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)
    return [
        (
            f"id-{i}",
            i,
            i * 10**12,
            i / 3 if i % 5 else 1e10 * i,
            i % 2 == 0,
            None if i % 3 == 0 else (f'say "hi"\\\n{i}' if i % 10 == 1 else f"note é {i}"),
            [f"t{j}" for j in range(i % 3)],
            {"a": i, "b": None} if i % 4 else None,
            {"a": i, "b": None if i % 2 else "bee"},
            t0 + dt.timedelta(minutes=i),
            dt.date(2026, 1, 1) + dt.timedelta(days=i),
            decimal.Decimal(f"{i}.10"),
            decimal.Decimal(i),
            bytes([i % 256, 0, 255]),
            [0.1, 1.0, 1.5e-7, 3.25, -0.0, 3e38][i % 6],  # NaN/inf: refused, see below
            None,
        )
        for i in range(count)
    ]


# -- round trips ------------------------------------------------------------------------------
def test_json_records_round_trip_like_write_store(spark, tmp_path):
    df = spark.createDataFrame(record_rows(60), RECORD_DDL).repartition(3)
    save(df, tmp_path / "ds", "orders", key="id", partitions=4)
    write_store(df, tmp_path / "ws", "orders", key="id", partitions=4, progress=False)
    with iqkit.open(tmp_path / "ds") as ds, iqkit.open(tmp_path / "ws") as ws:
        ours, theirs = kv_rows(ds, "orders"), kv_rows(ws, "orders")
        assert ds.version("orders") == 1
        m = ds.manifest("orders")
        assert (m.kind, m.partitions, m.key_serde, m.value_serde, m.partitioner) == (
            "kv",
            4,
            "string",
            "json",
            "murmur2",
        )
    assert len(ours) == 60
    assert ours == theirs  # same partitions, keys and decoded JSON records
    by_key = {k: v for _, k, v in ours}
    assert by_key["id-3"]["ts"] == "2026-01-01T12:03:00.123456Z"  # to the microsecond
    assert "note" not in by_key["id-3"]  # null fields are left out, as to_json does
    # One json-valued column (a map; a null one is a delete), also like write_store.
    save(df, tmp_path / "ds", "nested", key="id", value="attrs", partitions=2)
    write_store(df, tmp_path / "ws", "nested", key="id", value="attrs", partitions=2)
    with iqkit.open(tmp_path / "ds") as ds, iqkit.open(tmp_path / "ws") as ws:
        assert kv_rows(ds, "nested") == kv_rows(ws, "nested")
        assert len(kv_rows(ds, "nested")) == 45  # the 15 null maps are not stored
    assert debris(tmp_path) == []


def test_single_value_column_append_upserts_and_overwrite_replaces(spark, tmp_path):
    root = tmp_path / "stores"
    first = spark.createDataFrame([(i, i * 10) for i in range(50)], "id int, amount long")
    save(first, root, "amounts", key="id", value="amount", partitions=3)
    update = spark.createDataFrame([(1, 111), (99, 990), (2, None)], "id int, amount long")
    save(update, root, "amounts", key="id", value="amount")  # partitions from the store
    expected = {i: i * 10 for i in range(50)} | {1: 111, 99: 990}
    del expected[2]  # a null value is a delete (Kafka's tombstone)
    assert contents(root, "amounts") == expected
    with iqkit.open(root) as engine:
        m = engine.manifest("amounts")
        assert (m.key_serde, m.value_serde) == ("int32", "int64")
        assert engine.versions("amounts") == [1, 2]
    save(update, root, "amounts", mode="overwrite", key="id", value="amount")
    assert contents(root, "amounts") == {1: 111, 99: 990}
    # An overwrite empties the partitions no row reached.
    with iqkit.open(root) as engine:
        r = engine.query(
            StateQueryRequest.in_store("amounts").with_query(RangeQuery.with_no_bounds())
        )
        assert all(q.is_success for q in r.partition_results.values())
    with iqkit.open(root, as_of=2) as engine:
        assert get(engine, "amounts", 7) == 70  # the previous version is still there
    assert debris(root) == []


def test_composite_key_round_trip_and_read_back_as_columns(spark, tmp_path):
    root = tmp_path / "stores"
    rows = [("eu", "ann", 1), ("eu", "bob", 2), ("us", "cat", 3), ("us", "ann", 4)]
    df = spark.createDataFrame(rows, "region string, user string, n long")
    save(df, root, "ck", key="region, user", value="n", partitions=2)
    write_store(df, tmp_path / "ws", "ck", key=["region", "user"], value="n", partitions=2)
    with iqkit.open(root) as engine, iqkit.open(tmp_path / "ws") as ws:
        assert engine.manifest("ck").key_serde == "ordered"
        assert kv_rows(engine, "ck") == kv_rows(ws, "ck")
        assert get(engine, "ck", ("eu", "bob")) == 2
        r = engine.query(
            StateQueryRequest.in_store("ck").with_query(PrefixScanQuery.with_prefix(("eu",)))
        )
        found = sorted(
            kv.key for q in r.partition_results.values() if q.is_success for kv in q.result
        )
    assert found == [("eu", "ann"), ("eu", "bob")]
    back = spark.read.format("iqkit").option("store", "ck").load(str(root))
    assert back.columns == ["partition", "region", "user", "value"]
    assert sorted(tuple(r) for r in back.drop("partition").collect()) == sorted(rows)


def test_window_store_round_trip_like_write_store(spark, tmp_path):
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    clicks = spark.createDataFrame(
        [("ann", t0 + dt.timedelta(minutes=m)) for m in (0, 1, 6, 7, 8, 12)]
        + [("bob", t0), ("cat", t0 + dt.timedelta(minutes=31))],
        "user string, ts timestamp",
    )
    counts = clicks.groupBy(F.window("ts", "5 minutes"), "user").agg(F.count("*").alias("n"))
    save(counts, tmp_path / "ds", "clicks", key="user", value="n", window="window", partitions=2)
    write_store(
        counts, tmp_path / "ws", "clicks", key="user", value="n", window="window", partitions=2
    )
    with iqkit.open(tmp_path / "ds") as engine:
        m = engine.manifest("clicks")
        assert (m.kind, m.window_size_ms) == ("window", 300_000)
    ours = window_rows(tmp_path / "ds", "clicks")
    assert ours == window_rows(tmp_path / "ws", "clicks")
    start = int(t0.timestamp() * 1000)
    assert [(s - start, n) for _, k, s, _, n in ours if k == "ann"] == [
        (0, 2),
        (300_000, 3),
        (600_000, 1),
    ]
    back = spark.read.format("iqkit").option("store", "clicks").load(str(tmp_path / "ds"))
    expected = counts.select(
        F.col("user").alias("key"),
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        F.col("n").alias("value"),
    )
    assert sorted(back.drop("partition").collect()) == sorted(expected.collect())
    # The window size is known only once tasks saw the rows: checked before publishing.
    before = tree_digest(tmp_path / "ds")
    wider = clicks.groupBy(F.window("ts", "10 minutes"), "user").agg(F.count("*").alias("n"))
    with pytest.raises(Exception, match=r"window_size_ms=300000 \(the DataFrame needs 600000\)"):
        save(wider, tmp_path / "ds", "clicks", key="user", value="n", window="window")
    assert tree_digest(tmp_path / "ds") == before
    assert debris(tmp_path) == []


def test_reading_back_gives_the_rows_written(spark, tmp_path):
    rows = [(f"c{i}", i, i / 4, f"city-{i % 7}") for i in range(300)]
    df = spark.createDataFrame(rows, "customer string, orders int, total double, city string")
    save(df.repartition(5), tmp_path, "totals", key="customer", partitions=4)
    # The store's value schema (recorded by the write) types the read: the key under its
    # written name, every value column under its own name and type.
    back = spark.read.format("iqkit").option("store", "totals").load(str(tmp_path))
    assert back.drop("partition").schema == df.schema
    assert sorted(tuple(r) for r in back.drop("partition").collect()) == sorted(rows)
    assert all(
        r["partition"] == murmur2_partition(r["customer"].encode(), 4)
        for r in back.select("partition", "customer").collect()
    )


# -- duplicates, deletes and runs -------------------------------------------------------------
def test_duplicate_keys_later_row_and_later_spark_partition_win_like_write_store(spark, tmp_path):
    first = spark.createDataFrame([("b", 100), ("c", 100), ("e", 100)], "k string, v long")
    second = spread(
        spark,
        [
            [("a", 1), ("a", 2), ("b", 10), ("c", None), ("d", 7)],
            [("a", 3), ("b", None), ("c", 5), ("d", 8), ("e", None)],
        ],
        "k string, v long",
    )
    for df in (first, second):
        save(df, tmp_path / "ds", "s", key="k", value="v", partitions=3)
        write_store(df, tmp_path / "ws", "s", key="k", value="v", partitions=3, progress=False)
    ours = contents(tmp_path / "ds", "s")
    # Spark partition 1 comes after partition 0 (input order): its rows win, deletes too.
    assert ours == {"a": 3, "c": 5, "d": 8}
    assert ours == contents(tmp_path / "ws", "s")


def test_kafka_offsets_order_rows_within_a_task(spark, tmp_path):
    df = spark.createDataFrame(
        [("t", 0, 7, "k", "seven"), ("t", 0, 3, "k", "three"), ("t", 0, 5, "j", "five")],
        "topic string, partition int, offset long, key string, v string",
    ).coalesce(1)
    save(df, tmp_path, "s", key="key", value="v", partitions=2)
    assert contents(tmp_path, "s") == {"k": "seven", "j": "five"}  # highest offset wins


def test_runs_within_a_task_apply_in_order_deletes_included(spark, tmp_path):
    df = spark.createDataFrame(
        [("a", 1), ("b", 1), ("a", 2), ("a", 3), ("b", None), ("c", 1), ("b", 9), ("c", None)],
        "k string, v long",
    ).coalesce(1)
    # _run_rows=2: four runs spilled by the task, sorted and merged back into its one
    # fragment; a later run's row (a delete included) wins.
    save(df, tmp_path, "s", key="k", value="v", partitions=1, _run_rows=2)
    assert contents(tmp_path, "s") == {"a": 3, "b": 9}
    # One fragment for the task's four runs, then the commit's own file: a job's chain
    # grows by a file per task, not per run (no compaction of its own runs).
    assert len(chain_files(tmp_path, "s", 0)) == 2
    write_store(df, tmp_path / "ws", "s", key="k", value="v", partitions=1, progress=False)
    assert contents(tmp_path / "ws", "s") == {"a": 3, "b": 9}
    assert debris(tmp_path) == []


# -- positions ----------------------------------------------------------------------------------
KAFKA_DDL = "topic string, partition int, offset long, k string, v long"


def kafka_rows() -> list[list[tuple]]:
    # Two Spark partitions, three input partitions (one split across both), one topic.
    return [
        [("orders", 0, o, f"k{o % 5}", o) for o in range(0, 6)]
        + [("orders", 2, o, f"k{o}", o) for o in range(10, 14)],
        [("orders", 1, o, f"m{o % 3}", o) for o in range(0, 8)]
        + [("orders", 2, o, f"k{o}", o) for o in range(14, 16)],
    ]


def test_kafka_shaped_input_advances_positions_like_write_store(spark, tmp_path):
    parts = kafka_rows()
    df = spread(spark, parts, KAFKA_DDL)
    save(df, tmp_path / "ds", "s", key="k", value="v", partitions=8)
    write_store(df, tmp_path / "ws", "s", key="k", value="v", partitions=8, progress=False)
    highest: dict[int, int] = {}
    for _, p, o, _, _ in (r for part in parts for r in part):
        highest[p] = max(o, highest.get(p, -1))
    ours = positions(tmp_path / "ds", "s")
    # murmur2 store: every partition (even one no row reached) applied the whole input.
    assert ours == {p: {"orders": highest} for p in range(8)}
    assert ours == positions(tmp_path / "ws", "s")
    assert contents(tmp_path / "ds", "s") == contents(tmp_path / "ws", "s")


def test_mark_as_partitioned_merges_a_store_partition_from_many_tasks(spark, tmp_path):
    parts = kafka_rows()
    df = spread(spark, parts, KAFKA_DDL)
    # Input partition 2 sits in both Spark partitions: write_store refuses that input;
    # the data source merges both tasks' fragments of store partition 2.
    save(
        df, tmp_path, "byp", key="k", value="offset", partitions=3, mark_as_partitioned="partition"
    )
    with iqkit.open(tmp_path) as engine:
        assert engine.manifest("byp").partitioner == "explicit"
        stored = sorted(kv_rows(engine, "byp"))
    expected: dict[tuple[int, str], int] = {}
    highest: dict[int, int] = {}
    for _, p, o, k, _ in (r for part in parts for r in part):
        expected[(p, k)] = max(o, expected.get((p, k), -1))
        highest[p] = max(o, highest.get(p, -1))
    assert stored == sorted((p, k, o) for (p, k), o in expected.items())
    assert positions(tmp_path, "byp") == {p: {"orders": highest} for p in range(3)}
    with pytest.raises(Exception, match="'mark_as_partitioned' must name the column"):
        save(df, tmp_path, "byp", key="k", value="offset")  # no key function to route by


def test_mark_as_partitioned_out_of_range_fails_the_job_naming_the_column(spark, tmp_path):
    df = spark.createDataFrame([("a", 5)], "k string, p int")
    with pytest.raises(Exception, match=r"column 'p' must hold integers in \[0, 3\); found 5"):
        save(df, tmp_path, "s", key="k", value="p", partitions=3, mark_as_partitioned="p")
    assert not (tmp_path / "s" / "manifest.json").exists()
    assert debris(tmp_path) == []


# -- save modes ------------------------------------------------------------------------------
def test_error_and_ignore_modes(spark, tmp_path):
    root = tmp_path / "stores"
    df = spark.createDataFrame([("a", 1)], "k string, v long")
    save(df, root, "s", key="k", value="v", partitions=2)
    before = tree_digest(root)
    for mode in ("error", "errorifexists", "ignore"):
        # Spark refuses these modes for every Python data source, before iqkit runs.
        with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
            save(df, root, "s", mode=mode, key="k", value="v")
    with pytest.raises(Exception, match=r"store 's' already exists under .*if_exists='error'"):
        save(df, root, "s", key="k", value="v", if_exists="error")
    other = spark.createDataFrame([("a", 2), ("b", 3)], "k string, v long")
    save(other, root, "s", key="k", value="v", if_exists="ignore")
    assert tree_digest(root) == before
    assert contents(root, "s") == {"a": 1}
    save(other, root, "new", key="k", value="v", partitions=2, if_exists="error")
    assert contents(root, "new") == {"a": 2, "b": 3}


# -- failures ------------------------------------------------------------------------------------
def test_a_task_attempt_that_dies_is_retried_and_the_job_publishes_once(spark, tmp_path):
    root = tmp_path / "stores"
    first = spark.createDataFrame([(f"k{i}", i) for i in range(100)], "k string, v long")
    save(first, root, "s", key="k", value="v", partitions=4)
    marker = tmp_path / "crash-once"
    marker.write_text("x")
    second = spark.createDataFrame([(f"k{i}", i + 1000) for i in range(100)], "k string, v long")
    save(second, root, "s", key="k", value="v", _fail_task_once=str(marker))
    assert not marker.exists()  # a task attempt really died (after writing fragments)
    with iqkit.open(root) as engine:
        assert engine.versions("s") == [1, 2]
    assert contents(root, "s") == {f"k{i}": i + 1000 for i in range(100)}
    with iqkit.open(root, as_of=1) as engine:
        assert get(engine, "s", "k5") == 5
    assert debris(root) == []  # the dead attempt's fragments were removed


def _seed_one_row(spark, root) -> None:
    """Store 's' (string → int64, 2 partitions) at version 1, holding a=1."""
    save(
        spark.createDataFrame([("a", 1)], "k string, v long"),
        root,
        "s",
        key="k",
        value="v",
        partitions=2,
    )


def test_a_failed_job_leaves_the_previous_version_and_nothing_staged(spark, tmp_path):
    root = tmp_path / "stores"
    _seed_one_row(spark, root)
    before = tree_digest(root / "s")
    # Spark partition 0 succeeds (its fragments are staged), partition 1 holds a null key.
    bad = spread(spark, [[("b", 2), ("c", 3)], [("d", 4), (None, 5)]], "k string, v long")
    with pytest.raises(Exception, match="store 's': key column 'k' holds null keys"):
        save(bad, root, "s", key="k", value="v")
    # Spark calls abort() while it may still be killing the other task, whose fragment
    # can land just after abort removed the job's files: such hidden .job-* files are
    # never read, and the next commit removes them. Everything else is unchanged.
    assert published(root / "s") == published_before(before)
    boom = spark.createDataFrame([("a", 2), ("b", 3)], "k string, v long").withColumn(
        "v", F.when(F.col("k") == "b", F.raise_error("boom")).otherwise(F.col("v"))
    )
    with pytest.raises(Exception, match="boom"):
        save(boom, root, "s", key="k", value="v")
    assert published(root / "s") == published_before(before)
    with iqkit.open(root) as engine:
        assert engine.version("s") == 1
        assert get(engine, "s", "a") == 1
    save(spark.createDataFrame([("z", 9)], "k string, v long"), root, "s", key="k", value="v")
    assert debris(root) == []


def published(folder: Path) -> dict[str, str]:
    """tree_digest without the hidden fragment files of unfinished jobs."""
    return published_before(tree_digest(folder))


def published_before(digest: dict[str, str]) -> dict[str, str]:
    return {path: h for path, h in digest.items() if not Path(path).name.startswith(".job-")}


def test_a_commit_landing_during_the_job_makes_it_publish_nothing(spark, tmp_path):
    root = tmp_path / "stores"
    _seed_one_row(spark, root)
    marker = tmp_path / "commit-once"
    marker.write_text("x")
    root_text, marker_text = str(root), str(marker)

    def commit_meanwhile(k):  # no type hints: they would make Spark guess a UDF kind
        import os

        import iqkit as iq

        try:
            os.remove(marker_text)
        except FileNotFoundError:
            return k
        with iq.StoreWriter(root_text, "s") as w:  # another writer, while the job runs
            w.put("other", 42)
        return k

    df = spark.createDataFrame([("x", 7), ("y", 8)], "k string, v long").withColumn(
        "k", F.udf(commit_meanwhile, "string")("k")
    )
    with pytest.raises(Exception, match=r"store 's' changed while the job ran \(version 1 -> 2\)"):
        save(df, root, "s", key="k", value="v")
    assert contents(root, "s") == {"a": 1, "other": 42}
    assert debris(root) == []


# -- validation before anything is written -----------------------------------------------------
def test_bad_input_is_refused_before_anything_is_written(spark, tmp_path):
    root = tmp_path / "stores"
    df = spark.createDataFrame([("a", 1, 2.5)], "k string, v long, x double")
    cases = [
        (dict(key="nope", partitions=2), "store 's': key column 'nope' is not in the DataFrame"),
        (
            dict(key="k", value="k", value_serde="int64"),
            "store 's': value column 'k' of type string does not fit the 'int64' serde",
        ),
        (dict(key="k", value="v", window="v"), "window column 'v' must be Spark's window struct"),
        (
            dict(key="k", value="v", partitions=3),
            r"store 's' exists with other settings: partitions=2 \(the DataFrame needs 3\)",
        ),
        (
            dict(key="x", value="v"),
            r"store 's' exists with other settings: key_serde='string' \(the DataFrame needs "
            r"'double'\)",
        ),
        (dict(key="k,v", key_serde="string"), "a composite key .* uses the 'ordered' serde"),
        (dict(key="k", value="v", partition=2), "unknown write option\\(s\\) 'partition'"),
        (dict(key="k", value="v", if_exists="sometimes"), "option 'if_exists' must be one of"),
        (dict(key="k", value="v", partitions="two"), "option 'partitions' must be an integer"),
    ]
    # First against a store that does not exist yet: nothing may appear under root.
    with pytest.raises(Exception, match="option 'partitions' is required to create store 's'"):
        save(df, root, "s", key="k", value="v")
    for options, message in cases[:3]:
        with pytest.raises(Exception, match=message):
            save(df, root, "s", **options)
    assert not root.exists() or tree_digest(root) == {}
    save(df, root, "s", key="k", value="v", partitions=2)
    before = tree_digest(root / "s")
    for options, message in cases:
        with pytest.raises(Exception, match=message):
            save(df, root, "s", **options)
    assert tree_digest(root / "s") == before
    assert debris(root) == []


def test_an_empty_frame_cannot_create_a_window_store(spark, tmp_path):
    empty = spark.createDataFrame([], "user string, ts timestamp, n long").select(
        "user", F.window("ts", "5 minutes").alias("w"), "n"
    )
    with pytest.raises(Exception, match="store 'w': the DataFrame is empty, its window size"):
        save(empty, tmp_path, "w", key="user", value="n", window="w", partitions=2)
    assert not (tmp_path / "w" / "manifest.json").exists()
    assert debris(tmp_path) == []


def test_root_option_and_existing_store_defaults(spark, tmp_path):
    df = spark.createDataFrame([("a", 1), ("b", 2)], "k string, v long")
    df.write.format("iqkit").mode("append").option("root", str(tmp_path)).option(
        "store", "s"
    ).option("key", "k").option("value", "v").option("partitions", 2).save()
    more = spark.createDataFrame([("c", 3)], "k string, v long")
    # key, value and partitions default to what the store was created with.
    more.write.format("iqkit").mode("append").option("store", "s").save(str(tmp_path))
    assert contents(tmp_path, "s") == {"a": 1, "b": 2, "c": 3}


def test_windows_are_counted_as_rows_not_rocksdb_keys(spark, tmp_path):
    save(windowed_counts(spark, 8, 5), tmp_path, "w", key="user", value="n", window="window",
         partitions=2)  # fmt: skip
    assert written_counts(tmp_path, "w") == (40, 40)  # was (80, 80): two keys per window


def test_nan_and_infinities_in_json_values_are_refused_like_write_store(spark, tmp_path):
    for store, df, message in non_finite_frames(spark):
        with pytest.raises(Exception, match=message):
            save(df, tmp_path, store, key="k", partitions=2)
        assert not (tmp_path / store / "manifest.json").exists()
    with iqkit.open(tmp_path) as engine:
        assert engine.store_names() == []
    assert debris(tmp_path) == []


def test_string_keys_that_are_not_utf8_are_refused_naming_the_column_like_write_store(
    spark, tmp_path
):
    # A cast from binary keeps bytes that are not UTF-8 in a Spark string.
    df = spark.createDataFrame([(bytearray(b"ok\xff"), 1)], "b binary, v long").select(
        F.col("b").cast("string").alias("k"), "v"
    )
    message = "store 's': key column 'k' holds a string that is not valid UTF-8"
    with pytest.raises(Exception, match=message):
        save(df, tmp_path, "s", key="k", value="v", partitions=2)
    with pytest.raises(Exception, match=message):
        write_store(df, tmp_path, "s", key="k", value="v", partitions=2, progress=False)
    assert not (tmp_path / "s").exists()


def test_a_first_write_that_fails_in_its_tasks_leaves_nothing(spark, tmp_path):
    # Spark partition 0 stages its fragment; partition 1 holds a null key and fails.
    bad = spread(spark, [[("b", 2)], [(None, 5)]], "k string, v long")
    with pytest.raises(Exception, match="store 's': key column 'k' holds null keys"):
        save(bad, tmp_path, "s", key="k", value="v", partitions=2)
    assert not (tmp_path / "s").exists()  # no store, and no empty folders of one
