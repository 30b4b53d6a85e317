"""A running query's checkpoint read while the query commits, and while Spark's maintenance
deletes old versions' files (issue 35).

The query sums one record per micro-batch from a local stand-in topic (one file per batch:
``max_files_per_trigger=1``), so version N is the sum of the first N records and its
position is offset N - 1: the model knows every version's state. Spark keeps few
versions (``minBatchesToRetain`` 2, a snapshot every 2 versions, maintenance every
second), so versions the readers hold go while they read. Every answer must be a whole
version the model knows, at the version its trace and its position both say, or, for a
version that is gone, the one line saying so and naming the newest. Nothing here asserts
on time: the test waits for what it observes (commits, deleted files), with a generous
limit only so a stuck query fails instead of hanging. The same rules are checked on a
frozen checkpoint with the maintenance done by hand (a version gone; a file missing from a
version Spark keeps, which is damage and names the file).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jobs import PROVIDERS, restart_state_store_maintenance, session_conf

import iqkit
from iqkit import KeyQuery, RangeQuery, StateQueryRequest
from iqkit.engine import served_version
from iqkit.spark.kafka_local import LocalKafkaTopic
from iqkit.store.checkpoint.snapshot import VersionGoneError

STORE = "aggregate"
TOPIC = "clicks"
BATCHES = 12
USERS = 5
#: Enough for a loaded two-core machine; reaching it is a failure, never a measurement.
PATIENCE_S = 300.0
#: ``iqkit.open(as_of=...)``'s error for a version gone, and a partition's failure for it.
GONE = re.compile(
    rf"store '{STORE}' version (\d+) is gone \(Spark's maintenance deleted it\); "
    r"the newest is (\d+)"
)
GONE_PARTITION = re.compile(rf"store '{STORE}' partition \d+: VersionGoneError: {GONE.pattern}")
_STATE_FILE = re.compile(r"(\d+)(?:_[0-9A-Za-z-]+)?\.(delta|snapshot|zip|changelog)")


def _record(i: int) -> tuple[str, str]:
    return f"u{i % USERS}", str(i + 1)


def _model(version: int) -> dict[str, dict[str, int]]:
    """The state after batches 0 .. version - 1: the sums of the first ``version`` records."""
    state: dict[str, dict[str, int]] = {}
    for i in range(version):
        user, amount = _record(i)
        entry = state.setdefault(user, {"sum": 0, "count": 0})
        entry["sum"] += int(amount)
        entry["count"] += 1
    return state


def _wait_for(what: str, ready: Callable[[], Any]) -> Any:
    """``ready()``'s first true value, polled; fails naming ``what`` after ``PATIENCE_S``."""
    give_up = time.monotonic() + PATIENCE_S
    while not (value := ready()):
        if time.monotonic() > give_up:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.2)
    return value


def _committed(checkpoint: Path) -> int:
    """The newest committed version (0: none yet), from the commit log."""
    names = os.listdir(checkpoint / "commits") if (checkpoint / "commits").is_dir() else []
    return max((int(n) + 1 for n in names if n.isdigit()), default=0)


def _next_commit(checkpoint: Path, after: int) -> int:
    """The newest committed version, once it is above ``after``."""
    return int(_wait_for(f"a commit after version {after}", lambda: _newer(checkpoint, after)))


def _newer(checkpoint: Path, after: int) -> int:
    newest = _committed(checkpoint)
    return newest if newest > after else 0


def _oldest_file(checkpoint: Path, partition: int) -> int:
    """The oldest version any state file of ``partition`` is named after."""
    names = os.listdir(checkpoint / "state" / "0" / str(partition))
    return min(int(m[1]) for n in names if (m := _STATE_FILE.fullmatch(n)))


def _scan_request() -> StateQueryRequest:
    return StateQueryRequest.in_store(STORE).with_query(RangeQuery.with_no_bounds())


def _check_scan(
    engine: iqkit.StateEngine, *, pinned: int | None = None, partition: int | None = None
) -> int | None:
    """A scan of ``engine``'s store (of one ``partition``, or all), every partition
    checked: rows and position of the version the result says it read (the one pinned,
    if any), or that version gone, in one line. Returns the version read, or ``None``
    when every partition found it gone."""
    request = _scan_request()
    if partition is not None:
        request = request.with_partitions([partition])
    result = engine.query(request.enable_execution_info())
    version = served_version(result)
    read = None
    for p, partition in result.partition_results.items():
        if partition.is_failure:
            message = partition.failure_message
            gone = GONE_PARTITION.fullmatch(message)
            assert gone is not None, f"partition {p}: {message!r}"
            assert pinned is None or int(gone[1]) == pinned
            assert int(gone[2]) > int(gone[1])
            continue
        assert version is not None and (pinned is None or version == pinned)
        assert partition.position.to_map() == {TOPIC: {0: version - 1}}
        rows = {kv.key: kv.value for kv in partition.result}
        expected = {
            user: value
            for user, value in _model(version).items()
            if engine.partition_for_key(STORE, user) == p
        }
        assert rows == expected, f"partition {p} at version {version}"
        read = version
    return read


def _check_key(engine: iqkit.StateEngine, user: str) -> int | None:
    """A routed KeyQuery: the value of the version it read (``None``: gone)."""
    request = StateQueryRequest.in_store(STORE).with_query(KeyQuery.with_key(user))
    result = engine.query(request.enable_execution_info())
    (partition,) = result.partition_results.values()
    if partition.is_failure:
        assert GONE_PARTITION.fullmatch(partition.failure_message), partition.failure_message
        return None
    version = served_version(result)
    assert version is not None
    assert partition.position.to_map() == {TOPIC: {0: version - 1}}
    assert partition.result == _model(version).get(user)
    return version


def _open_pinned(checkpoint: Path, version: int) -> tuple[iqkit.StateEngine | None, int]:
    """``iqkit.open(as_of=version)``: the engine, or ``None`` with the version gone (the
    one-line error checked)."""
    try:
        return iqkit.open(checkpoint, as_of=version), version
    except VersionGoneError as exc:
        gone = GONE.fullmatch(str(exc))
        assert gone is not None and int(gone[1]) == version, str(exc)
        return None, version


@pytest.mark.parametrize("provider", ["hdfs", "rocksdb-changelog"])
def test_readers_of_a_running_query_see_whole_versions_or_gone(
    spark, tmp_path, monkeypatch, provider
):
    from pyspark.sql import functions as F

    monkeypatch.setenv("IQKIT_CACHE", os.fspath(tmp_path / "iqkit-cache"))
    topic = LocalKafkaTopic(tmp_path / "topics", TOPIC, partitions=1)
    for i in range(BATCHES):
        topic.produce([_record(i)], partition=0)  # one file: one micro-batch
    checkpoint = tmp_path / "ckpt"
    settings = {
        "spark.sql.streaming.stateStore.providerClass": PROVIDERS[provider],
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": str(
            provider == "rocksdb-changelog"
        ).lower(),
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.minBatchesToRetain": "2",
        "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",
        "spark.sql.streaming.stateStore.maintenanceInterval": "1s",
        # Quirk: stopping the maintenance task after the query waits for its shutdown
        # timeouts (300 s and 60 s by default); the query that starts it fixes them.
        "spark.sql.streaming.stateStore.maintenanceShutdownTimeout": "2",
        "spark.sql.streaming.stateStore.maintenanceForceShutdownTimeout": "2",
    }
    with session_conf(spark, settings):
        source = topic.read_stream(spark, max_files_per_trigger=1)
        totals = (
            source.select(
                F.col("key").cast("string").alias("user"),
                F.col("value").cast("string").cast("long").alias("amount"),
            )
            .groupBy("user")
            .agg(F.sum("amount"), F.count("*"))
        )
        restart_state_store_maintenance(spark)
        query = (
            totals.writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", os.fspath(checkpoint))
            .trigger(processingTime="100 milliseconds")
            .start()
        )
        engines: list[iqkit.StateEngine] = []
        try:
            _wait_for("the first commit", lambda: _committed(checkpoint))
            live = iqkit.open(checkpoint)  # kept open: it moves on to each new version
            engines.append(live)
            # Opened at the first version, read only at the end, after its files are gone.
            idle, idle_version = _open_pinned(checkpoint, _committed(checkpoint))
            assert idle is not None  # the newest committed version is never gone
            engines.append(idle)
            pins: list[tuple[iqkit.StateEngine, int]] = []  # read on every round
            live_read = rounds = gone_pins = gone_opens = 0
            newest = 0
            while newest < BATCHES:
                # A round per new commit (reads left to run flat out would take the CPU
                # the query needs); the query goes on committing while the round reads.
                newest = _next_commit(checkpoint, newest)
                assert query.exception() is None
                with iqkit.open(checkpoint) as fresh:
                    read = _check_scan(fresh)
                    assert read is None or read >= newest
                    _check_key(fresh, _record(newest)[0])
                version = _check_scan(live)
                assert version is None or version >= live_read
                live_read = version or live_read
                _check_key(live, "u0")
                # A pin of the version before the newest: partition 0 read at once,
                # partition 1 first three versions later, when its files may be gone.
                engine, pinned = _open_pinned(checkpoint, max(1, newest - 1))
                if engine is not None:
                    engines.append(engine)
                    pins.append((engine, pinned))
                for engine, pinned in pins:
                    for p in (0, 1) if newest >= pinned + 3 else (0,):
                        if _check_scan(engine, pinned=pinned, partition=p) is None:
                            gone_pins += 1
                # The oldest version still committed, pinned anew: read whole, or gone
                # at open or on a read.
                older, pinned = _open_pinned(checkpoint, max(1, newest - 2))
                if older is None:
                    gone_opens += 1
                else:
                    with older:
                        if _check_scan(older, pinned=pinned) is None:
                            gone_pins += 1
                rounds += 1
            assert query.exception() is None
            assert _check_scan(live) == BATCHES
            # Every partition's files of the idle engine's version deleted: it says so.
            _wait_for(
                f"Spark's maintenance to delete version {idle_version}'s files",
                lambda: all(_oldest_file(checkpoint, p) > idle_version for p in (0, 1)),
            )
            result = idle.query(_scan_request())
            expected = (
                f"store '{STORE}' version {idle_version} is gone (Spark's maintenance "
                f"deleted it); the newest is {BATCHES}"
            )
            assert {p: r.failure_message for p, r in result.partition_results.items()} == {
                p: f"store '{STORE}' partition {p}: VersionGoneError: {expected}" for p in (0, 1)
            }
            with pytest.raises(VersionGoneError, match=re.escape(expected)):
                iqkit.open(checkpoint, as_of=idle_version)
            with pytest.raises(ValueError, match=f"has no committed version {BATCHES + 1} "):
                iqkit.open(checkpoint, as_of=BATCHES + 1)
            # What the rounds saw (reported on failure only, never asserted: timing).
            print(
                f"{provider}: {rounds} rounds; pinned reads that found their version gone: "
                f"{gone_pins}; as_of opens refused as gone: {gone_opens}"
            )
        finally:
            query.stop()
            restart_state_store_maintenance(spark)  # later queries start it with their own
            for engine in engines:
                engine.close()


# -- the same rules on a frozen checkpoint, maintenance done by hand (no Spark) ----------
#: A frozen checkpoint (Spark 4.3, HDFS provider): versions 1 to 4, a snapshot at
#: version 3 in each of its three partitions.
FROZEN = Path(__file__).resolve().parents[2] / "data" / "checkpoints" / "4.3.0" / "agg-hdfs"


def _frozen_copy(tmp_path: Path) -> Path:
    if not (FROZEN / "checkpoint").is_dir():
        pytest.skip("frozen checkpoint 4.3.0/agg-hdfs not here (tests/data/checkpoints)")
    copy = tmp_path / "checkpoint"
    shutil.copytree(FROZEN / "checkpoint", copy)
    return copy


def _maintain(checkpoint: Path, below: int) -> None:
    """What Spark's maintenance does with a snapshot at ``below`` and few versions to
    retain: every partition's state files of the versions before it deleted."""
    for path in checkpoint.glob("state/0/*/*"):
        match = _STATE_FILE.fullmatch(path.name.removeprefix(".").removesuffix(".crc"))
        if match and int(match[1]) < below:
            path.unlink()


def test_a_pinned_version_spark_deleted_is_gone_in_one_line_naming_the_newest(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("IQKIT_CACHE", os.fspath(tmp_path / "iqkit-cache"))
    checkpoint = _frozen_copy(tmp_path)
    with iqkit.open(checkpoint, as_of=2) as pinned, iqkit.open(checkpoint, as_of=3) as kept:
        partitions = pinned.manifest(STORE).partitions
        _maintain(checkpoint, below=3)
        gone = (
            f"store '{STORE}' version 2 is gone (Spark's maintenance deleted it); the newest is 4"
        )
        result = pinned.query(_scan_request())
        assert {p: r.failure_message for p, r in result.partition_results.items()} == {
            p: f"store '{STORE}' partition {p}: VersionGoneError: {gone}" for p in range(partitions)
        }
        with pytest.raises(VersionGoneError, match=re.escape(gone)):
            iqkit.open(checkpoint, as_of=2)
        # Version 3 is its snapshot: still whole.
        result = kept.query(_scan_request())
        assert all(r.is_success for r in result.partition_results.values())
    with pytest.raises(ValueError, match="has no committed version 5 "):
        iqkit.open(checkpoint, as_of=5)


def test_a_file_missing_from_a_version_spark_keeps_is_damage_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("IQKIT_CACHE", os.fspath(tmp_path / "iqkit-cache"))
    checkpoint = _frozen_copy(tmp_path)
    (checkpoint / "state/0/1/4.delta").unlink()
    with iqkit.open(checkpoint) as engine:
        result = engine.query(_scan_request())
    assert result.partition_results[0].is_success
    failure = result.partition_results[1].failure_message
    assert "StateFileError" in failure and "state/0/1/4.delta: missing" in failure
    assert "\n" not in failure


def _open_under(folder: Path) -> set[str]:
    """Paths under ``folder`` this process holds open (``/proc/self/fd``)."""
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed since the listing
        if target.startswith(f"{folder}{os.sep}"):
            held.add(target)
    return held


def test_a_long_lived_engine_lets_go_of_the_versions_it_moved_on_from(tmp_path, monkeypatch):
    cache = tmp_path / "iqkit-cache"
    monkeypatch.setenv("IQKIT_CACHE", os.fspath(cache))
    checkpoint = _frozen_copy(tmp_path)
    commit = (checkpoint / "commits" / "3").read_bytes()
    (checkpoint / "commits" / "3").unlink()  # batch 3 still running: version 3 the newest
    with iqkit.open(checkpoint) as engine:
        result = engine.query(_scan_request().enable_execution_info())
        assert served_version(result) == 3
        for partition in result.partition_results.values():
            assert list(partition.result)  # read to the end: no scan of version 3 open
        held = _open_under(cache)
        assert any(f"{os.sep}3-" in path for path in held)  # version 3's databases
        (checkpoint / "commits" / "3").write_bytes(commit)  # batch 3 committed
        result = engine.query(_scan_request().enable_execution_info())
        assert served_version(result) == 4
        assert all(list(r.result) for r in result.partition_results.values())
        # Version 4's databases may be built on version 3's (its SSTs shared, one inode):
        # what only version 3's databases hold must be closed.
        fours = {f.stat().st_ino for f in cache.glob("dbs/*/spark-state/*/*/4-*/*.sst")}
        held = _open_under(cache)
        threes = [path for path in held if f"{os.sep}3-" in path]
        assert held and not [path for path in threes if os.stat(path).st_ino not in fours]
