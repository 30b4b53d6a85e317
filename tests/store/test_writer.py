"""StoreWriter and create_store."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from helpers import request, tree_digest

import iqkit
from iqkit.store.chain.records import list_versions
from iqkit.store.encoding.partitioners import murmur2_partition
from iqkit.store.formats import format_for
from iqkit.store.names import CHAIN_RECORDS_DIR, CHAIN_SST_DIR
from iqkit.store.objects import open_objects
from iqkit.store.roots import parse_root


def latest_published(root, store):
    return format_for(parse_root(root)).latest_published(store)


def published_files(root, store: str) -> dict[str, str]:
    """Path -> sha256 of the files a store's versions publish: its SSTs and version
    records (``sst/``, ``chain/``)."""
    folders = (CHAIN_SST_DIR, CHAIN_RECORDS_DIR)
    return {
        f"{folder}/{path}": digest
        for folder in folders
        for path, digest in tree_digest(root / store / folder).items()
    }


def get(engine: iqkit.StateEngine, store: str, key: object) -> object:
    result = engine.query(request(store, iqkit.KeyQuery.with_key(key)))
    only = result.only_partition_result()
    return None if only is None else only.result


# -- create_store ------------------------------------------------------------------------
def test_create_store_writes_manifest_and_is_idempotent(root):
    m1 = iqkit.create_store(root, "totals", partitions=4, value_serde="int64")
    m2 = iqkit.create_store(root, "totals", partitions=4, value_serde="int64")
    assert m1 == m2
    data = json.loads((root / "totals" / "manifest.json").read_text())
    assert data["partitions"] == 4
    assert data["key_serde"] == "string"
    assert data["value_serde"] == "int64"
    assert data["partitioner"] == "murmur2"
    assert data["kind"] == "kv"


def test_create_store_with_other_settings_names_the_difference(root):
    iqkit.create_store(root, "totals", partitions=4)
    with pytest.raises(iqkit.StoreExistsError, match=r"partitions=4 \(asked 8\)"):
        iqkit.create_store(root, "totals", partitions=8)


def test_ensure_store_checks_only_the_settings_asked_and_creates_only_when_told(root):
    """The one settings check every writer shares (create_store and the Spark writers)."""
    from iqkit.store.manifest import StoreManifest
    from iqkit.store.writer import ensure_store

    wanted = StoreManifest(
        name="s",
        kind="kv",
        partitions=2,
        key_serde="string",
        value_serde="json",
        partitioner="murmur2",
    )
    assert ensure_store(root, wanted) == wanted
    assert not (root / "s").exists()  # create=False: the caller's job creates it later
    iqkit.create_store(root, "s", partitions=2, partitioner="explicit")
    other = dataclasses.replace(wanted, partitions=3)
    with pytest.raises(iqkit.StoreExistsError) as caught:
        ensure_store(root, other, asked="the DataFrame needs")
    assert str(caught.value) == (
        "store 's' exists with other settings: partitions=2 (the DataFrame needs 3), "
        "partitioner='explicit' (the DataFrame needs 'murmur2')"
    )
    assert isinstance(caught.value, ValueError)  # what the Spark writers raised before
    got = ensure_store(root, other, settings=("kind", "key_serde", "value_serde"))
    assert got.partitions == 2  # the existing store's manifest


@pytest.mark.parametrize("name", ["", "a/b", "..", "a..b", "../x", ".hidden", "a\\b"])
def test_store_names_with_separators_or_dots_are_refused(root, name):
    with pytest.raises(ValueError, match="store name"):
        iqkit.create_store(root, name, partitions=1)
    assert not root.exists() or not any(root.iterdir())


@pytest.mark.parametrize(
    "name",
    ["a" * 256, "é" * 128, "x\ud800y", "x\udc80y"],
    ids=["256 ascii bytes", "256 utf-8 bytes", "lone surrogate", "a non-UTF-8 file name byte"],
)
def test_store_names_that_cannot_be_a_folder_name_are_a_short_value_error(root, name):
    with pytest.raises(ValueError, match="store name") as info:
        iqkit.create_store(root, name, partitions=1)
    assert len(str(info.value)) < 200
    with pytest.raises(ValueError, match="store name"):
        iqkit.StateQueryRequest.in_store(name)
    assert not root.exists() or os.listdir(root) == []


def test_a_store_name_of_255_bytes_works(root):
    name = "n" * 255
    iqkit.create_store(root, name, partitions=1)
    with iqkit.StoreWriter(root, name) as w:
        w.put("a", 1)
    with iqkit.open(root) as engine:
        assert get(engine, name, "a") == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"partitions": 0}, "partitions must be an int from 1 to 100000"),
        ({"partitions": 2, "kind": "table"}, "kind must be one of"),
        ({"partitions": 2, "key_serde": "utf8"}, "utf8"),
        ({"partitions": 2, "partitioner": "random"}, "random"),
        ({"partitions": 2, "kind": "window"}, "window_size_ms > 0"),
        ({"partitions": 2, "window_size_ms": 10}, "only for window stores"),
    ],
)
def test_bad_store_settings_are_refused_before_anything_is_written(root, kwargs, message):
    with pytest.raises(ValueError, match=message):
        iqkit.create_store(root, "s", **kwargs)
    assert not (root / "s" / "manifest.json").exists()


def test_writer_on_unknown_store_suggests_a_name(root):
    iqkit.create_store(root, "totals", partitions=1)
    with pytest.raises(iqkit.UnknownStoreError, match="did you mean 'totals'"):
        iqkit.StoreWriter(root, "total")


# -- commits and versions ----------------------------------------------------------------
def test_each_commit_publishes_the_next_version(root):
    iqkit.create_store(root, "s", partitions=2)
    seen = []
    for i in range(3):
        with iqkit.StoreWriter(root, "s") as w:
            w.put(f"k{i}", i)
        seen.append(w.version)
    assert seen == [1, 2, 3]
    with iqkit.open(root) as engine:
        assert engine.version("s") == 3
        assert [get(engine, "s", f"k{i}") for i in range(3)] == [0, 1, 2]


def test_an_exception_inside_the_block_commits_nothing(root):
    iqkit.create_store(root, "s", partitions=2)
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1)
    before = tree_digest(root / "s")
    with pytest.raises(RuntimeError, match="boom"), iqkit.StoreWriter(root, "s") as w:
        w.put("a", 2)
        w.put("b", 3)
        raise RuntimeError("boom")
    assert w.version is None
    assert tree_digest(root / "s") == before
    with iqkit.open(root) as engine:
        assert get(engine, "s", "a") == 1
        assert get(engine, "s", "b") is None


def test_a_failure_while_publishing_leaves_the_previous_version(root, monkeypatch):
    iqkit.create_store(root, "s", partitions=2)
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1)

    def failing_publish(objects, store, record):
        raise OSError("disk full (injected)")

    monkeypatch.setattr("iqkit.store.chain.write.publish_version", failing_publish)
    with pytest.raises(OSError, match="injected"), iqkit.StoreWriter(root, "s") as w:
        w.put("a", 2)
    monkeypatch.undo()
    # Its uploaded SST is listed by no version (retention removes it after its grace).
    assert list_versions(open_objects(root), "s") == [1]
    with iqkit.open(root) as engine:
        assert engine.version("s") == 1
        assert get(engine, "s", "a") == 1
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 3)
    assert w.version == 2
    with iqkit.open(root) as engine:
        assert get(engine, "s", "a") == 3


def test_untouched_partitions_keep_their_data_and_folders(root):
    iqkit.create_store(root, "s", partitions=4)
    keys = [f"user-{i}" for i in range(40)]
    with iqkit.StoreWriter(root, "s") as w:
        for k in keys:
            w.put(k, k.upper())
    target = murmur2_partition(b"user-0", 4)
    before = latest_published(root, "s")
    with iqkit.StoreWriter(root, "s") as w:
        w.put("user-0", "changed")
    record = latest_published(root, "s")  # partition -> its chain of files
    assert record.version == 2 and set(record.partitions) == set(before.partitions)
    assert record.partitions[target] != before.partitions[target]
    assert all(v == before.partitions[p] for p, v in record.partitions.items() if p != target)
    with iqkit.open(root) as engine:
        assert get(engine, "s", "user-0") == "changed"
        assert all(get(engine, "s", k) == k.upper() for k in keys[1:])


def test_put_none_deletes_and_delete_removes(root):
    iqkit.create_store(root, "s", partitions=2)
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1)
        w.put("b", 2)
        w.put("c", 3)
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", None)
        w.delete("b")
    with iqkit.open(root) as engine:
        assert [get(engine, "s", k) for k in "abc"] == [None, None, 3]


def test_later_writes_in_one_commit_win(root):
    iqkit.create_store(root, "s", partitions=1)
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1)
        w.put("a", 2)
        w.delete("b")
        w.put("b", 5)
    with iqkit.open(root) as engine:
        assert get(engine, "s", "a") == 2
        assert get(engine, "s", "b") == 5


def test_an_empty_writer_publishes_nothing(root):
    iqkit.create_store(root, "s", partitions=1)
    with iqkit.StoreWriter(root, "s") as w:
        pass
    assert w.version is None
    assert latest_published(root, "s") is None  # no version record
    assert published_files(root, "s") == {}  # and no data files


def test_a_writer_cannot_be_used_after_its_commit(root):
    iqkit.create_store(root, "s", partitions=1)
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1)
    with pytest.raises(RuntimeError, match="committed"):
        w.put("b", 2)


# -- routing and bad input -----------------------------------------------------------------
def test_murmur2_store_routes_keys_like_kafka(root):
    iqkit.create_store(root, "s", partitions=8)
    with iqkit.StoreWriter(root, "s") as w:
        for i in range(100):
            w.put(f"key-{i}", i)
    for i in range(100):
        expected = murmur2_partition(f"key-{i}".encode(), 8)
        assert expected in latest_published(root, "s").partitions
    with iqkit.open(root) as engine:
        for i in range(0, 100, 7):
            result = engine.query(request("s", iqkit.KeyQuery.with_key(f"key-{i}")))
            assert list(result.partition_results) == [murmur2_partition(f"key-{i}".encode(), 8)]


def test_a_wrong_partition_for_a_murmur2_store_is_refused(root):
    iqkit.create_store(root, "s", partitions=8)
    owner = murmur2_partition(b"alice", 8)
    with iqkit.StoreWriter(root, "s") as w:
        w.put("alice", 1, partition=owner)  # agreeing is fine
        with pytest.raises(ValueError, match=f"belongs to partition {owner}"):
            w.put("alice", 1, partition=(owner + 1) % 8)


def test_explicit_store_needs_a_partition_in_range(root):
    iqkit.create_store(root, "s", partitions=3, partitioner="explicit")
    with iqkit.StoreWriter(root, "s") as w:
        with pytest.raises(ValueError, match="explicit partitioner: pass partition="):
            w.put("a", 1)
        with pytest.raises(ValueError, match=r"partition must be an int in \[0, 3\), got 3"):
            w.put("a", 1, partition=3)
        w.put("a", 1, partition=2)
    assert set(latest_published(root, "s").partitions) == {2}


def test_wrong_types_name_the_store_the_serde_and_the_value(root):
    iqkit.create_store(root, "counts", partitions=1, key_serde="int32", value_serde="int64")
    with iqkit.StoreWriter(root, "counts") as w:
        with pytest.raises(TypeError) as info:
            w.put("abc", 1)
        message = str(info.value)
        assert "counts" in message and "int32" in message and "'abc'" in message
        with pytest.raises(TypeError, match=r"counts.*int64.*'x'"):
            w.put(1, "x")
        with pytest.raises(ValueError, match="key must not be None"):
            w.put(None, 1)
        w.put(1, 2)
    assert w.version == 1


def test_window_store_needs_a_window_start_and_kv_store_refuses_one(root):
    iqkit.create_store(root, "w", partitions=1, kind="window", window_size_ms=1000)
    iqkit.create_store(root, "kv", partitions=1)
    with iqkit.StoreWriter(root, "w") as w, pytest.raises(ValueError, match="window_start"):
        w.put("a", 1)
    with (
        iqkit.StoreWriter(root, "kv") as w,
        pytest.raises(ValueError, match="window_start is not allowed"),
    ):
        w.put("a", 1, window_start=0)


# -- positions -----------------------------------------------------------------------------
def test_source_advances_the_position_of_the_partition_the_record_lands_in(root):
    iqkit.create_store(root, "s", partitions=2, partitioner="explicit")
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1, partition=0, source=("orders", 0, 10))
        w.put("b", 1, partition=1, source=("orders", 1, 4))
        w.put("c", 1, partition=1, source=("orders", 1, 7))
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 2, partition=0, source=("orders", 0, 3))  # lower: never lowers
    with iqkit.open(root) as engine:
        result = engine.query(request("s", iqkit.RawScanQuery.scan()))
        positions = {p: r.position.to_map() for p, r in result.partition_results.items()}
    assert positions == {0: {"orders": {0: 10}}, 1: {"orders": {1: 7}}}


def test_advance_moves_a_position_without_data(root):
    iqkit.create_store(root, "s", partitions=2, partitioner="explicit")
    with iqkit.StoreWriter(root, "s") as w:
        w.advance(1, ("orders", 1, 99))
    with iqkit.open(root) as engine:
        r = engine.query(request("s", iqkit.KeyQuery.with_key("x")).with_partitions({1}))
        assert r.partition_results[1].is_success
        assert r.partition_results[1].position.to_map() == {"orders": {1: 99}}


def test_record_applied_advances_every_partition_of_a_murmur2_store(root):
    iqkit.create_store(root, "s", partitions=4)
    with iqkit.StoreWriter(root, "s") as w:
        w.put("alice", 1, source=("orders", 0, 17))
        w.put("bob", 2, source=("orders", 1, 3))
        w.record_applied({"orders": {0: 19, 1: 3}})
        w.record_source_end({"orders": {0: 20, 1: 4}})  # log-end: everything applied
    applied = {"orders": {0: 19, 1: 3}}
    bound = iqkit.PositionBound.at(iqkit.Position.from_map(applied))
    with iqkit.open(root) as engine:
        r = engine.query(request("s", iqkit.RawScanQuery.scan()).with_position_bound(bound))
        lags = engine.lags()["s"]
    assert sorted(r.partition_results) == [0, 1, 2, 3]
    for qr in r.partition_results.values():  # partitions no record reached included
        assert qr.is_success and qr.position.to_map() == applied
        qr.result.close()
    assert {p: info.offset_lag for p, info in lags.items()} == {0: 0, 1: 0, 2: 0, 3: 0}


def test_record_applied_on_an_explicit_store_advances_partition_p_for_input_p(root):
    iqkit.create_store(root, "s", partitions=3, partitioner="explicit")
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1, partition=0, source=("in", 0, 4))
        w.record_applied(iqkit.Position.from_map({"in": {0: 9, 2: 5}}))
        w.record_source_end({"in": {0: 10, 1: 3, 2: 6}})
    with iqkit.open(root) as engine:
        r = engine.query(request("s", iqkit.RawScanQuery.scan()))
        lags = engine.lags()["s"]
    positions = {p: qr.position.to_map() for p, qr in r.partition_results.items()}
    assert positions == {0: {"in": {0: 9}}, 1: {}, 2: {"in": {2: 5}}}
    assert {p: info.offset_lag for p, info in lags.items()} == {0: 0, 1: 3, 2: 0}
    for qr in r.partition_results.values():
        qr.result.close()


def test_record_applied_never_lowers_and_refuses_bad_input_whole(root):
    iqkit.create_store(root, "s", partitions=2, partitioner="explicit")
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1, partition=0, source=("in", 0, 50))
        w.record_applied({"in": {0: 7}})  # lower than what the put applied: kept at 50
    with iqkit.StoreWriter(root, "s") as w:
        with pytest.raises(ValueError, match=r"store 's': record_applied: input partition 5"):
            w.record_applied({"in": {1: 8, 5: 1}})  # 5 feeds no partition: nothing recorded
        with pytest.raises(ValueError, match=r"store 's': record_applied: offset must be >= -1"):
            w.record_applied({"in": {1: -4}})
        with pytest.raises(TypeError, match=r"store 's': record_applied: .*mapping"):
            w.record_applied([("in", 1, 8)])
    assert w.version == 1  # nothing was buffered: nothing published
    with iqkit.open(root) as engine:
        r = engine.query(request("s", iqkit.RawScanQuery.scan()))
        positions = {p: qr.position.to_map() for p, qr in r.partition_results.items()}
        for qr in r.partition_results.values():
            qr.result.close()
    assert positions == {0: {"in": {0: 50}}, 1: {}}


# -- readers never change what they read -----------------------------------------------------
def test_queries_do_not_modify_published_files(root):
    iqkit.create_store(root, "s", partitions=2)
    with iqkit.StoreWriter(root, "s") as w:
        for i in range(50):
            w.put(f"k{i}", i)
    before = published_files(root, "s")
    assert before  # the store's sst/ and chain/ files
    with iqkit.open(root) as engine:
        assert get(engine, "s", "k1") == 1
        with (
            engine.query(request("s", iqkit.RangeQuery.with_no_bounds()))
            .partition_results[0]
            .result as it
        ):
            list(it)
    assert published_files(root, "s") == before
