"""The version queries on a Spark checkpoint opened as stores: changes and key histories
checked against Spark's own state reader, version by version, and (RocksDB with
changelog checkpointing) against its change feed (``readChangeFeed``)."""

from __future__ import annotations

import os
from itertools import pairwise
from typing import Any

import pytest
from jobs import run_stream
from test_checkpoint_stores import BATCHES, PARTITIONS

import iqkit
from iqkit import ChangesQuery, MultiVersionedKeyQuery, StateQueryRequest, VersionedKeyQuery
from iqkit.store.checkpoint.layout import batch_metadata
from iqkit.store.objects import open_objects


def _states(spark, checkpoint: str, versions: list[int]) -> dict[int, dict[Any, Any]]:
    """Spark's state reader at every version: key -> value columns (one key column)."""
    out = {}
    for version in versions:
        rows = (
            spark.read.format("statestore").option("batchId", version - 1).load(checkpoint)
        ).collect()
        out[version] = {row["key"]["user"]: row["value"].asDict(recursive=True) for row in rows}
    return out


def _times(checkpoint: str, versions: list[int]) -> dict[int, int]:
    objects = open_objects(checkpoint)
    return {v: int(batch_metadata(objects, v - 1)["batchTimestampMs"]) for v in versions}


def state_changes(states: dict[int, dict[Any, Any]]) -> list[tuple]:
    """What ``ChangesQuery`` should give over ``states`` (version -> key -> value): each
    version against the one before, ``(version, key, kind, value, old value)`` for each
    key whose value differs, by version, then key."""
    want = []
    for before, version in pairwise(sorted(states)):
        old, new = states[before], states[version]
        for key in sorted(set(old) | set(new)):
            a, b = old.get(key), new.get(key)
            if a != b:
                kind = "insert" if a is None else "delete" if b is None else "update"
                want.append((version, key, kind, b, a))
    return want


def _changes(engine, store: str, a: int, b: int) -> list[tuple]:
    request = StateQueryRequest.in_store(store).with_query(ChangesQuery.between(a, b))
    out = []
    for p, qr in sorted(engine.query(request).partition_results.items()):
        assert qr.is_success, qr.failure_message
        out += [(c.version, c.key, c.kind, c.value, c.old_value, p) for c in qr.result]
    return sorted(out, key=lambda c: (c[0], c[1]))


@pytest.mark.parametrize("provider", ["hdfs", "rocksdb", "rocksdb-changelog"])
@pytest.mark.parametrize("kind", ["agg", "flatmap"])
def test_changes_and_histories_equal_what_spark_state_reader_gives(spark, tmp_path, kind, provider):
    checkpoint = os.fspath(
        run_stream(spark, kind, tmp_path / "ckpt", BATCHES[kind], provider=provider,
                   partitions=PARTITIONS)
    )  # fmt: skip
    with iqkit.open(checkpoint) as engine:
        (store,) = engine.store_names()
        versions = engine.versions(store)
        states = _states(spark, checkpoint, versions)
        times = _times(checkpoint, versions)
        want = state_changes(states)
        got = _changes(engine, store, versions[0], versions[-1])
        assert [c[:5] for c in got] == want
        assert any(c[2] == "update" for c in want)
        if kind == "flatmap":
            assert any(c[2] == "delete" for c in want)
        for c in got:  # each change on the partition Spark keeps the key in
            assert engine.partition_for_key(store, c[1]) == c[5]
        # Histories: one record per run of versions holding the same value.
        users = sorted({key for state in states.values() for key in state})
        for user in users:
            runs = []
            for i, v in enumerate(versions):
                value = states[v].get(user)
                if value is None:
                    continue
                if runs and runs[-1][1] == versions[i - 1] and runs[-1][2] == value:
                    runs[-1][1] = v
                else:
                    runs.append([v, v, value])
            expected = [
                (value, times[first], times.get(versions[versions.index(last) + 1])
                 if last != versions[-1] else None, first)
                for first, last, value in runs
            ]  # fmt: skip
            request = StateQueryRequest.in_store(store).with_query(
                MultiVersionedKeyQuery.with_key(user).with_ascending_timestamps()
            )
            (qr,) = engine.query(request).partition_results.values()
            assert qr.is_success, qr.failure_message
            assert [(r.value, r.timestamp, r.valid_to, r.version) for r in qr.result] == expected
            for v in versions:
                request = StateQueryRequest.in_store(store).with_query(
                    VersionedKeyQuery.with_key(user).as_of(times[v])
                )
                (qr,) = engine.query(request).partition_results.values()
                value = None if qr.result is None else qr.result.value
                assert value == states[v].get(user), (user, v)


def test_changes_equal_spark_change_feed_on_rocksdb_changelogs(spark, tmp_path):
    """RocksDB with changelog checkpointing: each version's changes are the rows Spark's
    change feed gives for its batch, less the puts that wrote a key's value again."""
    checkpoint = os.fspath(
        run_stream(spark, "flatmap", tmp_path / "ckpt", BATCHES["flatmap"],
                   provider="rocksdb-changelog", partitions=PARTITIONS)
    )  # fmt: skip
    with iqkit.open(checkpoint) as engine:
        (store,) = engine.store_names()
        versions = engine.versions(store)
        states = _states(spark, checkpoint, versions)
        feed = (
            spark.read.format("statestore")
            .option("readChangeFeed", True)
            .option("changeStartBatchId", versions[0])  # version N + 1 is batch N's
            .option("changeEndBatchId", versions[-1] - 1)
            .load(checkpoint)
            .collect()
        )
        want = []
        for row in feed:
            version = row["batch_id"] + 1
            key = row["key"]["user"]
            old = states[version - 1].get(key)
            new = None if row["change_type"] == "delete" else row["value"].asDict(recursive=True)
            if old == new:
                continue  # the same value written again: no change
            kind = "insert" if old is None else "delete" if new is None else "update"
            want.append((version, key, kind, new, old, row["partition_id"]))
        assert any(w[2] == "delete" for w in want)
        got = _changes(engine, store, versions[0], versions[-1])
        assert got == sorted(want, key=lambda c: (c[0], c[1]))
