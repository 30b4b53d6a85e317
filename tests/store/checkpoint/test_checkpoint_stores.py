"""A Structured Streaming checkpoint opened with ``iqkit.open``: its stores, every committed
version's rows against Spark's own state reader (``format("statestore")``), key routing,
window queries, and the refusals (read-only, unsupported, uncommitted batches)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

import pytest
from jobs import run_stream

import iqkit
from iqkit import (
    KeyQuery,
    MultiKeyQuery,
    PrefixScanQuery,
    RangeQuery,
    StateQueryRequest,
    WindowKeyQuery,
    WindowRangeQuery,
)
from iqkit.errors import ReadOnlyStoreError

PARTITIONS = 3


def _ts(second: int) -> str:
    return f"2026-01-01T00:00:{second:02d}"


#: Three micro-batches: new keys, updates of old ones, and (for the window) a watermark
#: that moves past the first windows, so Spark evicts them.
AGG_BATCHES = [
    [{"user": "alice", "amount": 5, "ts": _ts(1)}, {"user": "bob", "amount": 2, "ts": _ts(2)}],
    [{"user": "alice", "amount": 7, "ts": _ts(12)}, {"user": "carol", "amount": 1, "ts": _ts(13)},
     {"user": "émile", "amount": 9, "ts": _ts(14)}],
    [{"user": "dave", "amount": 3, "ts": _ts(45)}, {"user": "bob", "amount": 4, "ts": _ts(46)}],
]  # fmt: skip


@pytest.fixture(scope="module")
def agg_checkpoint(spark, tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("agg") / "ckpt"
    return os.fspath(
        run_stream(spark, "agg", os.fspath(folder), AGG_BATCHES, partitions=PARTITIONS)
    )


@pytest.fixture(scope="module")
def window_checkpoint(spark, tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("window") / "ckpt"
    return os.fspath(
        run_stream(spark, "window", os.fspath(folder), AGG_BATCHES, partitions=PARTITIONS)
    )


def _oracle(spark, checkpoint: str, version: int) -> dict[int, dict[Any, dict[str, Any]]]:
    """Spark's own state reader at ``version``: partition -> key -> value columns."""
    rows = spark.read.format("statestore").option("batchId", version - 1).load(checkpoint).collect()
    out: dict[int, dict[Any, dict[str, Any]]] = {p: {} for p in range(PARTITIONS)}
    for row in rows:
        key = row["key"].asDict(recursive=True)
        parts = tuple(tuple(v.values()) if isinstance(v, dict) else v for v in key.values())
        out[row["partition_id"]][parts] = row["value"].asDict(recursive=True)
    return out


def _scan(engine: iqkit.StateEngine, store: str) -> dict[int, dict[Any, Any]]:
    request = StateQueryRequest.in_store(store).with_query(RangeQuery.with_no_bounds())
    result = engine.query(request)
    out = {}
    for p, partition in result.partition_results.items():
        assert partition.is_success, partition.failure_message
        out[p] = {kv.key: kv.value for kv in partition.result}
    return out


def test_a_checkpoint_with_one_aggregation_has_one_store(agg_checkpoint):
    with iqkit.open(agg_checkpoint) as engine:
        assert engine.store_names() == ["aggregate"]
        manifest = engine.manifest("aggregate")
    assert manifest.partitions == PARTITIONS
    assert manifest.properties["key_columns"] == ["user"]
    assert manifest.key_serde == "string"


#: Batches per operator: new keys, updates of old ones, and removed keys (a watermark that
#: moves past old windows and old ids; a negative amount, which ``spark_jobs.running_total_fn``
#: takes as "forget this user").
DEDUP_BATCHES = [
    [{"id": 1, "user": "a", "ts": _ts(1)}, {"id": 2, "user": "b", "ts": _ts(2)}],
    [{"id": 2, "user": "b", "ts": _ts(3)}, {"id": 3, "user": "c", "ts": _ts(4)}],
    [{"id": 4, "user": "d", "ts": _ts(45)}],
    [{"id": 5, "user": "e", "ts": _ts(46)}],
]
FLATMAP_BATCHES = [
    *AGG_BATCHES,
    [{"user": "bob", "amount": -1, "ts": _ts(50)}, {"user": "erin", "amount": 6, "ts": _ts(51)}],
]
BATCHES = {
    "agg": AGG_BATCHES,
    "window": [*AGG_BATCHES, [{"user": "erin", "amount": 1, "ts": _ts(59)}]],
    "dedup": DEDUP_BATCHES,
    "dedup-watermark": DEDUP_BATCHES,
    "flatmap": FLATMAP_BATCHES,
}
#: The operators whose state shrinks in these batches (the test checks it did).
REMOVES_KEYS = {"window", "dedup-watermark", "flatmap"}


def _run_kind(spark, tmp_path, kind: str, provider: str) -> tuple[str, str, Any, list[int]]:
    """``kind``'s query over its ``BATCHES`` on ``provider``: (the checkpoint, its one
    store, that store's manifest, its committed versions)."""
    checkpoint = os.fspath(
        run_stream(spark, kind, tmp_path / "ckpt", BATCHES[kind], provider=provider,
                   partitions=PARTITIONS)
    )  # fmt: skip
    with iqkit.open(checkpoint) as engine:
        (store,) = engine.store_names()
        return checkpoint, store, engine.manifest(store), engine.versions(store)


def _iso_text(column: Any) -> Any:
    """A key column as iqkit keeps it: a timestamp column as ISO text in UTC, to the
    microsecond (the test session's time zone is UTC)."""
    if isinstance(column, datetime):
        return column.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return column


def _as_spark_rows(kv: Any, window_ms: int | None) -> tuple[tuple[Any, ...], Any]:
    """An iqkit row as the state reader gives it: the key as a tuple of its columns (a
    window as its (start, end) datetimes, in UTC as the test session's time zone)."""
    if window_ms is None:
        return (kv.key if isinstance(kv.key, tuple) else (kv.key,)), kv.value

    def utc(ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None)

    key = kv.key.key if isinstance(kv.key.key, tuple) else (kv.key.key,)
    return ((utc(kv.key.start), utc(kv.key.end)), *key), kv.value


@pytest.mark.parametrize("provider", ["hdfs", "rocksdb", "rocksdb-changelog"])
@pytest.mark.parametrize("kind", ["agg", "window", "dedup", "dedup-watermark", "flatmap"])
def test_every_version_of_every_operator_reads_as_spark_reads_it(spark, tmp_path, kind, provider):
    """For each provider Spark ships and each supported operator: every committed
    version, partition by partition, holds exactly the rows Spark's own state reader
    gives for it (``as_of=N`` is Spark's batch N - 1)."""
    checkpoint, store, manifest, versions = _run_kind(spark, tmp_path, kind, provider)
    assert manifest.properties["spark_provider"] == provider.split("-")[0]
    assert versions == list(range(1, len(BATCHES[kind]) + 1))
    window_ms = manifest.window_size_ms if manifest.kind == "window" else None
    sizes = []
    for version in versions:
        expected = {
            p: {tuple(_iso_text(v) for v in key): value for key, value in rows.items()}
            for p, rows in _oracle(spark, checkpoint, version).items()
        }
        with iqkit.open(checkpoint, as_of=version) as engine:
            request = StateQueryRequest.in_store(store).with_query(RangeQuery.with_no_bounds())
            if window_ms is not None:
                query = WindowRangeQuery.with_window_start_range(0, 2**62)
                request = StateQueryRequest.in_store(store).with_query(query)
            got = {}
            for p, partition in engine.query(request).partition_results.items():
                assert partition.is_success, partition.failure_message
                got[p] = dict(_as_spark_rows(kv, window_ms) for kv in partition.result)
        assert got == expected, f"version {version}"
        sizes.append(sum(len(rows) for rows in expected.values()))
    if kind in REMOVES_KEYS:
        assert min(sizes[1:]) < max(sizes), f"no version removed keys: {sizes}"


def test_a_key_lookup_runs_on_the_partition_spark_put_the_key_in(spark, agg_checkpoint):
    owners = {
        row["key"]["user"]: row["partition_id"]
        for row in spark.read.format("statestore").load(agg_checkpoint).collect()
    }
    with iqkit.open(agg_checkpoint) as engine:
        for user, owner in owners.items():
            request = StateQueryRequest.in_store("aggregate").with_query(KeyQuery.with_key(user))
            result = engine.query(request)
            assert set(result.partition_results) == {owner}
            assert result.partition_results[owner].result is not None
        keys = MultiKeyQuery.with_keys(sorted(owners))
        result = engine.query(StateQueryRequest.in_store("aggregate").with_query(keys))
        assert set(result.partition_results) == set(owners.values())


def test_spark_reads_a_checkpoint_key_from_its_owning_partition_only(spark, agg_checkpoint):
    """``format("iqkit")`` with ``key``: one task, on the partition Spark's hash put the
    key in (the engine's routing, not the manifest's partitioner name)."""
    owners = {
        row["key"]["user"]: row["partition_id"]
        for row in spark.read.format("statestore").load(agg_checkpoint).collect()
    }
    for user, owner in owners.items():
        df = (
            spark.read.format("iqkit")
            .option("store", "aggregate")
            .option("key", user)
            .option("max_partition_bytes", "1")  # one task per store partition read
            .load(agg_checkpoint)
        )
        assert df.rdd.getNumPartitions() == 1
        (row,) = df.collect()
        assert (row["partition"], row["user"]) == (owner, user)  # the key column keeps its name


def test_range_prefix_and_descending_scans(agg_checkpoint):
    with iqkit.open(agg_checkpoint) as engine:
        everything = sorted(k for rows in _scan(engine, "aggregate").values() for k in rows)

        def keys(query) -> list[str]:
            result = engine.query(StateQueryRequest.in_store("aggregate").with_query(query))
            return [kv.key for p in result.partition_results.values() for kv in p.result]

        assert sorted(keys(RangeQuery.with_range("b", "d"))) == [
            k for k in everything if "b" <= k <= "d"
        ]
        assert keys(PrefixScanQuery.with_prefix("al")) == ["alice"]
        descending = StateQueryRequest.in_store("aggregate").with_query(
            RangeQuery.with_no_bounds().with_descending_keys()
        )
        for partition in engine.query(descending).partition_results.values():
            got = [kv.key for kv in partition.result]
            assert got == sorted(got, reverse=True)


def test_a_batch_without_a_commit_is_not_served(agg_checkpoint, tmp_path):
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(agg_checkpoint, copy)
    os.remove(copy / "commits" / "2")  # batch 2 "still running": its state is on disk
    with iqkit.open(os.fspath(copy)) as engine:
        assert engine.versions("aggregate") == [1, 2]
        assert engine.version("aggregate") == 2


def test_an_operator_name_iqkit_does_not_know_is_refused_naming_the_metadata_file(
    agg_checkpoint, tmp_path
):
    # A newer Spark's operator, or a damaged byte: Spark's metadata files carry no checksum.
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(agg_checkpoint, copy)
    metadata = copy / "state/0/_metadata/metadata"
    (copy / "state/0/_metadata/.metadata.crc").unlink(missing_ok=True)
    text = metadata.read_bytes()
    assert b'"stateStoreSave"' in text
    metadata.write_bytes(text.replace(b'"stateStoreSave"', b'"stateSuoreSave"'))
    with iqkit.open(os.fspath(copy)) as engine:
        assert engine.store_names() == ["stateSuoreSave"]
        for store in ("aggregate", "stateSuoreSave"):
            request = StateQueryRequest.in_store(store).with_query(KeyQuery.with_key("alice"))
            with pytest.raises(iqkit.errors.IqkitError) as error:
                engine.query(request)
            message = str(error.value)
            assert "state/0/_metadata/metadata" in message and "stateSuoreSave" in message
            assert "\n" not in message


@pytest.mark.parametrize(
    ("damaged", "before", "after"),
    [
        # A column type iqkit does not know, in the state schema file.
        ("state/0/0/_metadata/schema", b'"type":"long"', b'"type":"lonf"'),
        # A provider class iqkit does not know, in the newest offsets log file.
        ("offsets/2", b"HDFSBackedStateStoreProvider", b"HDFSBackedStateStoreProvidev"),
    ],
)
def test_a_type_or_provider_iqkit_does_not_know_is_refused_naming_the_file(
    agg_checkpoint, tmp_path, damaged, before, after
):
    # A newer Spark's, or a damaged byte: Spark's schema files and logs carry no checksum.
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(agg_checkpoint, copy)
    path = copy / damaged
    path.with_name(f".{path.name}.crc").unlink(missing_ok=True)
    text = path.read_bytes()
    assert before in text
    path.write_bytes(text.replace(before, after))
    with iqkit.open(os.fspath(copy)) as engine:
        request = StateQueryRequest.in_store("aggregate").with_query(KeyQuery.with_key("alice"))
        with pytest.raises(iqkit.errors.IqkitError) as error:
            engine.query(request)
    message = str(error.value)
    assert message.startswith("not supported yet") and damaged in message, message
    assert "\n" not in message


def test_an_offsets_log_whose_provider_setting_is_damaged_is_refused_naming_it(
    agg_checkpoint, tmp_path
):
    """A flipped bit in the setting's name (found by the damaged-files probe): the conf
    then names no provider, and a guess of Spark's default would fail later, naming a
    state file the default provider would have written instead of the damaged log."""
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(agg_checkpoint, copy)
    path = copy / "offsets" / "2"
    path.with_name(".2.crc").unlink(missing_ok=True)
    text = path.read_bytes()
    assert b'"spark.sql.streaming.stateStore.providerClass"' in text
    path.write_bytes(text.replace(b"stateStore.providerClass", b"stateStore.providerClaqs"))
    with iqkit.open(os.fspath(copy)) as engine:
        request = StateQueryRequest.in_store("aggregate").with_query(KeyQuery.with_key("alice"))
        with pytest.raises(iqkit.errors.IqkitError) as error:
            engine.query(request)
    message = str(error.value)
    assert "offsets/2" in message and "damaged" in message and "\n" not in message, message


def test_writes_to_a_checkpoint_are_refused_and_change_nothing(agg_checkpoint):
    before = sorted(os.walk(agg_checkpoint))
    with (
        pytest.raises(ReadOnlyStoreError, match="only reads"),
        iqkit.StoreWriter(agg_checkpoint, "aggregate") as writer,
    ):
        writer.put("mallory", {"sum": 1, "count": 1})
    assert sorted(os.walk(agg_checkpoint)) == before


def test_a_windowed_aggregation_is_a_window_store(spark, window_checkpoint):
    with iqkit.open(window_checkpoint) as engine:
        manifest = engine.manifest(engine.store_names()[0])
        assert manifest.kind == "window"
        assert manifest.window_size_ms == 10_000
        versions = engine.versions(manifest.name)
    for version in versions:
        expected = _oracle(spark, window_checkpoint, version)
        want = {
            (window[0], user): value
            for rows in expected.values()
            for (window, user), value in rows.items()
        }
        with iqkit.open(window_checkpoint, as_of=version) as engine:
            query = WindowRangeQuery.with_window_start_range(0, 2**62)
            result = engine.query(StateQueryRequest.in_store(manifest.name).with_query(query))
            got = {}
            for partition in result.partition_results.values():
                assert partition.is_success, partition.failure_message
                for kv in partition.result:
                    start = datetime.fromtimestamp(kv.key.start / 1000, UTC).replace(tzinfo=None)
                    got[(start, kv.key.key)] = kv.value
            assert got == want
            for start, user in want:
                ms = int(start.replace(tzinfo=UTC).timestamp() * 1000)
                query = WindowKeyQuery.with_key_and_window_start_range(user, ms, ms)
                result = engine.query(StateQueryRequest.in_store(manifest.name).with_query(query))
                found = [kv for p in result.partition_results.values() for kv in p.result]
                assert len(found) == 1


#: The file of version 3 each provider reads last, and so is damaged (``test_a_damaged...``).
LAST_FILE = {"hdfs": "3.delta", "rocksdb": "3.zip", "rocksdb-changelog": "3.changelog"}


@pytest.mark.parametrize("provider", ["hdfs", "rocksdb", "rocksdb-changelog"])
@pytest.mark.parametrize("damage", ["cut", "flipped", "missing"])
def test_a_damaged_state_file_fails_its_partition_only(spark, tmp_path, provider, damage):
    """A state file cut short, with a byte changed, or gone: the partition that needs it
    fails with one line naming the file; the other partitions answer."""
    checkpoint = run_stream(spark, "agg", tmp_path / "ckpt", AGG_BATCHES, provider=provider,
                            partitions=PARTITIONS)  # fmt: skip
    owner = next(
        row["partition_id"]
        for row in spark.read.format("statestore").load(os.fspath(checkpoint)).collect()
    )
    target = checkpoint / "state" / "0" / str(owner) / LAST_FILE[provider]
    crc = target.with_name(f".{target.name}.crc")
    data = target.read_bytes()
    if damage == "cut":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "flipped":
        middle = len(data) // 2
        target.write_bytes(data[:middle] + bytes([data[middle] ^ 0x5A]) + data[middle + 1 :])
    else:
        target.unlink()
    crc.unlink(missing_ok=True)  # Hadoop's checksum would catch it first: test the file's own
    with iqkit.open(os.fspath(checkpoint)) as engine:
        request = StateQueryRequest.in_store("aggregate").with_query(RangeQuery.with_no_bounds())
        result = engine.query(request)
        failed = {}
        for p, partition in result.partition_results.items():
            if partition.is_failure:
                failed[p] = partition.failure_message
            else:
                list(partition.result)
    assert list(failed) == [owner]
    message = failed[owner]
    assert f"state/0/{owner}/{LAST_FILE[provider]}" in message, message
    assert "\n" not in message


def test_positions_and_lag_come_from_the_sources_a_batch_read(spark, tmp_path):
    """A streaming count over a local stand-in topic: every version's position is, per
    topic partition, the last offset its batch had read; lag counts what was produced
    since and not read yet."""
    from iqkit.spark import LocalKafkaTopic

    topic = LocalKafkaTopic(tmp_path / "topics", "clicks", partitions=2)
    checkpoint = os.fspath(tmp_path / "ckpt")
    read: dict[int, int] = {}
    expected: dict[int, dict[int, int]] = {}
    for batch in range(3):
        produced = topic.produce([(f"user{i % 5}", f"v{batch}") for i in range(batch + 4)])
        for record in produced:
            read[record.partition] = max(read.get(record.partition, -1), record.offset)
        expected[batch + 1] = dict(read)
        counts = topic.read_stream(spark).groupBy("key").count()
        query = (
            counts.writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    unread = topic.produce([("late", "x"), ("later", "y")])
    for version, offsets in expected.items():
        with iqkit.open(checkpoint, as_of=version) as engine:
            store = engine.store_names()[0]
            request = StateQueryRequest.in_store(store).with_query(RangeQuery.with_no_bounds())
            for partition in engine.query(request).partition_results.values():
                assert partition.position.to_map() == {"clicks": offsets}
    with iqkit.open(checkpoint) as engine:
        lags = engine.lags()[store]
    assert lags and all(info.offset_lag == len(unread) for info in lags.values())


def test_a_version_is_replayed_once_then_read_from_the_cache(agg_checkpoint, tmp_path, monkeypatch):
    """Another process's first open builds the version's databases in the shared cache;
    this one reads them without reading the checkpoint's state again, and reading
    changes nothing in the checkpoint."""
    import subprocess
    import sys

    monkeypatch.setenv("IQKIT_CACHE", os.fspath(tmp_path / "cache"))
    before = sorted(os.walk(agg_checkpoint))
    code = "import iqkit, sys; print(iqkit.open(sys.argv[1]).approximate_rows('aggregate'))"
    done = subprocess.run(
        [sys.executable, "-c", code, agg_checkpoint], capture_output=True, text=True, check=True
    )
    with iqkit.open(agg_checkpoint) as engine:
        assert int(done.stdout) == engine.approximate_rows("aggregate")
        request = (
            StateQueryRequest.in_store("aggregate")
            .with_query(KeyQuery.with_key("alice"))
            .enable_execution_info()
        )
        (partition,) = engine.query(request).partition_results.values()
    alice = [r["amount"] for batch in AGG_BATCHES for r in batch if r["user"] == "alice"]
    assert partition.result == {"sum": sum(alice), "count": len(alice)}
    assert any("database reused from the cache" in line for line in partition.execution_info)
    assert sorted(os.walk(agg_checkpoint)) == before


def test_iq_stores_shows_the_operator_schemas_and_provider(spark, agg_checkpoint):
    from iqkit.jupyter.stores_table import stores_frame

    value = spark.read.format("statestore").load(agg_checkpoint).schema["value"].dataType
    value_columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in value.fields)
    with iqkit.open(agg_checkpoint) as engine:
        frame = stores_frame(engine)
        versions = engine.versions("aggregate")
    row = frame.set_index("name").loc["aggregate"]
    assert row["operator"] == "stateStoreSave (id 0)"
    assert row["key_schema"] == "user string"
    assert row["value_schema"] == value_columns
    assert row["provider"] == "hdfs"
    assert row["version"] == versions[-1]


def test_state_written_with_row_checksums_reads_as_spark_reads_it(spark, tmp_path):
    """With row checksums on, Spark puts a CRC before each value; the setting is read
    from the checkpoint's own offsets log."""
    conf = {"spark.sql.streaming.stateStore.rowChecksum.enabled": "true"}
    checkpoint = os.fspath(
        run_stream(spark, "agg", tmp_path / "ckpt", AGG_BATCHES, partitions=PARTITIONS, conf=conf)
    )
    with iqkit.open(checkpoint) as engine:
        versions = engine.versions("aggregate")
    for version in versions:
        with iqkit.open(checkpoint, as_of=version) as engine:
            got = _scan(engine, "aggregate")
        expected = _oracle(spark, checkpoint, version)
        assert {p: {(k,): v for k, v in rows.items()} for p, rows in got.items()} == expected


def test_a_stream_stream_join_is_served_as_its_two_sides(spark, tmp_path):
    """A join's internal stores are served as its two sides: each keyed by the join key,
    a key's value the rows the side buffers for it (every layout is held to Spark's own
    reader on the frozen cells: test_joins.py)."""
    import json as json_module

    inputs = tmp_path / "input"
    inputs.mkdir()
    (inputs / "a.json").write_text(
        "\n".join(json_module.dumps(r) for r in AGG_BATCHES[0]), encoding="utf-8"
    )
    left = spark.readStream.schema("user string, amount long, ts string").json(str(inputs))
    right = left.select("user", (left.amount * 2).alias("double"))
    checkpoint = os.fspath(tmp_path / "ckpt")
    (left.join(right, "user").writeStream.format("noop")
     .option("checkpointLocation", checkpoint).trigger(availableNow=True)
     .start().awaitTermination())  # fmt: skip
    with iqkit.open(checkpoint) as engine:
        assert engine.store_names() == ["join.left", "join.right"]
        for row in AGG_BATCHES[0]:
            user = row["user"]
            for side, want in (
                ("left", row),
                ("right", {"user": user, "double": 2 * row["amount"]}),
            ):
                request = StateQueryRequest.in_store(f"join.{side}").with_query(
                    KeyQuery.with_key(user)
                )
                (value,) = [r.result for r in engine.query(request).partition_results.values()]
                assert [{k: v for k, v in r.items() if k != "matched"} for r in value] == [want]


def test_transform_with_state_serves_each_state_variable_as_spark_reads_it(spark, tmp_path):
    """transformWithState keeps one column family per state variable: each is a store
    (``transform.<variable>``) holding what Spark's reader gives for it; list elements
    appended one at a time (RocksDB merge records) come back in order."""
    from test_hdfs_state import run_transform_with_state

    checkpoint = os.fspath(run_transform_with_state(spark, tmp_path))

    def read(name: str, **options: str) -> list[dict[str, Any]]:
        reader = spark.read.format("statestore").option("stateVarName", name)
        for option, value in options.items():
            reader = reader.option(option, value)
        return [row.asDict(recursive=True) for row in reader.load(checkpoint).collect()]

    want = {
        "transform.total": {r["key"]["user"]: r["value"] for r in read("total")},
        "transform.seen": {
            r["key"]["user"]: r["list_value"] for r in read("seen", flattenCollectionTypes="false")
        },
        "transform.counts": {
            (r["key"]["user"], r["user_map_key"]["name"]): r["user_map_value"]
            for r in read("counts")
        },
    }
    with iqkit.open(checkpoint) as engine:
        assert engine.store_names() == sorted(want)
        for store, rows in want.items():
            got = {k: v for p in _scan(engine, store).values() for k, v in p.items()}
            assert got == rows, store
    assert any(len(elements) > 1 for elements in want["transform.seen"].values())


def test_transform_with_state_of_one_map_variable_and_no_timers_is_read(spark, tmp_path):
    """A processor with a single state variable and no timers keeps its state in one
    column family, and none named ``default``: still the variable's store, keyed by
    (grouping key, user key), as Spark's reader reads it."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor
    from test_hdfs_state import run_processor

    class Amounts(StatefulProcessor):
        def init(self, handle):
            self.amounts = handle.getMapState("amounts", "id long", "amount long")

        def handleInputRows(self, key, rows, timerValues):
            import pandas as pd

            for frame in rows:
                for i, amount in zip(frame["id"], frame["amount"], strict=True):
                    self.amounts.updateValue((int(i),), (int(amount),))
            yield pd.DataFrame({"user": [key[0]]})

        def close(self):
            pass

    checkpoint = os.fspath(run_processor(spark, Amounts(), "user string", tmp_path))
    rows = spark.read.format("statestore").option("stateVarName", "amounts").load(checkpoint)
    want = {
        (r["key"]["user"], r["user_map_key"]["id"]): r["user_map_value"]
        for r in (row.asDict(recursive=True) for row in rows.collect())
    }
    assert len(want) == 7
    with iqkit.open(checkpoint) as engine:
        assert engine.store_names() == ["transform.amounts"]
        got = {k: v for p in _scan(engine, "transform.amounts").values() for k, v in p.items()}
        assert got == want
        key = ("u1", 2)
        request = StateQueryRequest.in_store("transform.amounts").with_query(KeyQuery.with_key(key))
        assert engine.query(request).only_partition_result().result == want[key]


@pytest.mark.parametrize("provider", ["hdfs", "rocksdb-changelog"])
@pytest.mark.parametrize("kind", ["agg", "window", "flatmap"])
def test_a_newer_version_is_built_on_an_older_ones_database(
    spark, tmp_path, monkeypatch, kind, provider
):
    """Opening the versions in turn, each is built from the one before it in the cache
    (only the deltas since are read: the trace says so), and holds exactly what a build
    from nothing holds and what Spark's state reader reads: updates, new keys and
    removed keys (windows past the watermark, a user ``running_total`` forgets)."""
    checkpoint, store, manifest, versions = _run_kind(spark, tmp_path, kind, provider)
    windowed = manifest.kind == "window"
    query = (
        WindowRangeQuery.with_window_start_range(0, 2**62)
        if windowed
        else (RangeQuery.with_no_bounds())
    )

    def read(version: int) -> tuple[dict[int, list[Any]], list[str]]:
        rows, trace = {}, []
        with iqkit.open(checkpoint, as_of=version) as engine:
            request = StateQueryRequest.in_store(store).with_query(query).enable_execution_info()
            for p, partition in engine.query(request).partition_results.items():
                assert partition.is_success, partition.failure_message
                rows[p] = [(kv.key, kv.value) for kv in partition.result]
                trace += partition.execution_info
        return rows, trace

    def table_files() -> dict[str, bytes]:
        """Every table file of the cache's state databases, by path: its bytes' digest."""
        import hashlib

        return {
            os.fspath(f): hashlib.sha256(f.read_bytes()).digest()
            for f in (tmp_path / "in-turn").rglob("*.sst")
            if ".building-" not in os.fspath(f)
        }

    monkeypatch.setenv("IQKIT_CACHE", os.fspath(tmp_path / "in-turn"))
    in_turn = {}
    for version in versions:
        before = table_files()
        in_turn[version], trace = read(version)
        after = table_files()
        # the older databases' files, shared with the new one, are never changed
        assert {f: after.get(f) for f in before} == before
        built_on = [line for line in trace if f"since version {version - 1} replayed" in line]
        if version > 1:
            assert len(built_on) == PARTITIONS, trace
    for version in versions:
        monkeypatch.setenv("IQKIT_CACHE", os.fspath(tmp_path / f"alone-{version}"))
        alone, trace = read(version)
        assert not any("since version" in line for line in trace)
        assert alone == in_turn[version], f"version {version}"


def test_sql_and_the_command_line_read_a_checkpoint(spark, agg_checkpoint, capsys):
    """``iqkit.sql`` and ``python -m iqkit`` open a checkpoint as they open a root: the
    state's typed columns in SQL, a key through the command line."""
    from iqkit.__main__ import main

    expected = {
        user: {"sum": sum(r["amount"] for b in AGG_BATCHES for r in b if r["user"] == user),
               "count": sum(1 for b in AGG_BATCHES for r in b if r["user"] == user)}
        for user in {r["user"] for b in AGG_BATCHES for r in b}
    }  # fmt: skip
    frame = iqkit.sql('SELECT "user", "sum", "count" FROM aggregate', root=agg_checkpoint)
    got = {row["user"]: {"sum": row["sum"], "count": row["count"]} for _, row in frame.iterrows()}
    assert got == expected
    assert main(["stores", agg_checkpoint]) == 0
    assert capsys.readouterr().out.split("\t")[0] == "aggregate"
    assert main(["get", agg_checkpoint, "aggregate", "émile"]) == 0
    assert capsys.readouterr().out.strip() == repr(expected["émile"])
