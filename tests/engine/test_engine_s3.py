"""Stores on an object root end to end (issue 13): ``create_store`` and ``StoreWriter``
write the SST-chain format to the real S3 server, ``iqkit.open`` serves it through the
local file cache, and the trace says what each query fetched."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from helpers import request, rows

import iqkit
from iqkit.errors import StoreExistsError, VersionConflictError
from iqkit.store.chain.records import list_versions
from iqkit.store.objects import open_objects
from iqkit.store.partitions.layers import twin_scans


@pytest.fixture
def elsewhere(tmp_path, monkeypatch) -> Path:
    """An empty current folder: writing to a URL must make nothing here (the old bug
    made ``./s3:/bucket/...``)."""
    folder = tmp_path / "cwd"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def write_totals(root: str) -> None:
    iqkit.create_store(root, "totals", partitions=3, value_serde="int64")
    with iqkit.StoreWriter(root, "totals") as w:
        for i in range(30):
            w.put(f"user-{i:02d}", i, source=("clicks", i % 2, i))
        w.delete("user-07", source=("clicks", 1, 31))
        w.record_source_end({"clicks": {0: 40, 1: 40}})
        w.set_metadata(batch=1)
    assert w.version == 1


def traced(store: str, query: iqkit.Query) -> iqkit.StateQueryRequest:
    return request(store, query).enable_execution_info()


def cache_lines(result: iqkit.StateQueryResult) -> list[str]:
    return [
        line
        for qr in result.partition_results.values()
        for line in qr.execution_info
        if line.startswith("Handled in FileCache")
    ]


def test_create_store_on_s3_writes_the_manifest_once_with_the_local_rules(s3_root, elsewhere):
    made = iqkit.create_store(s3_root, "totals", partitions=2)
    assert iqkit.create_store(s3_root, "totals", partitions=2) == made  # same settings: fine
    with pytest.raises(StoreExistsError, match=r"partitions=2 \(asked 4\)"):
        iqkit.create_store(s3_root, "totals", partitions=4)
    iqkit.create_store(s3_root, "other", partitions=1, kind="window", window_size_ms=60_000)
    assert open_objects(s3_root).list() == ["other/manifest.json", "totals/manifest.json"]
    with iqkit.open(s3_root) as engine:
        assert engine.store_names() == ["other", "totals"]
        assert engine.manifest("totals").partitions == 2
        assert engine.version("totals") is None
    assert list(elsewhere.iterdir()) == []


def test_a_store_written_to_s3_answers_key_range_prefix_and_lag(s3_root, elsewhere):
    write_totals(s3_root)
    with iqkit.open(s3_root) as engine:
        assert engine.version("totals") == 1
        got = engine.query(request("totals", iqkit.KeyQuery.with_key("user-05")))
        assert got.only_partition_result().result == 5
        gone = engine.query(request("totals", iqkit.KeyQuery.with_key("user-07")))
        assert gone.only_partition_result() is None  # not found, as locally
        scan = engine.query(request("totals", iqkit.RangeQuery.with_range("user-10", "user-12")))
        found = sorted(kv for qr in scan.partition_results.values() for kv in rows(qr))
        assert found == [("user-10", 10), ("user-11", 11), ("user-12", 12)]
        prefixed = engine.query(request("totals", iqkit.PrefixScanQuery.with_prefix("user-0")))
        keys = sorted(k for qr in prefixed.partition_results.values() for k, _ in rows(qr))
        assert keys == [f"user-0{i}" for i in range(10) if i != 7]
        on_s3 = lag_facts(engine)
    assert list(elsewhere.iterdir()) == []
    write_totals(os.fspath(elsewhere / "local"))  # the same writes to a local root
    with iqkit.open(elsewhere / "local") as engine:
        assert on_s3 == lag_facts(engine)
    assert all(lag[1] is not None for lag in on_s3.values())


def lag_facts(engine: iqkit.StateEngine) -> dict[int, tuple]:
    return {
        p: (lag.current_position.to_map(), lag.offset_lag, lag.end_position.to_map())
        for p, lag in engine.lags()["totals"].items()
    }


def test_a_window_store_on_s3(s3_root):
    iqkit.create_store(s3_root, "clicks", partitions=2, kind="window", window_size_ms=60_000)
    with iqkit.StoreWriter(s3_root, "clicks") as w:
        for minute in range(5):
            w.put("ann", minute, window_start=minute * 60_000)
        w.put("bob", 9, window_start=0)
        w.delete("ann", window_start=120_000)
    with iqkit.open(s3_root) as engine:
        q = iqkit.WindowKeyQuery.with_key_and_window_start_range("ann", 0, 10**9)
        result = engine.query(request("clicks", q))
        got = [(k.start, v) for qr in result.partition_results.values() for k, v in rows(qr)]
        assert sorted(got) == [(0, 0), (60_000, 1), (180_000, 3), (240_000, 4)]


def test_partitions_never_written_are_empty_and_as_of_pins_a_version(s3_root):
    iqkit.create_store(s3_root, "totals", partitions=4, partitioner="explicit")
    with iqkit.StoreWriter(s3_root, "totals") as w:
        w.put("a", 1, partition=1)
    with iqkit.StoreWriter(s3_root, "totals") as w:
        w.put("a", 2, partition=1)
    with iqkit.open(s3_root, as_of=1) as old, iqkit.open(s3_root) as new:
        q = iqkit.StateQueryRequest.in_store("totals").with_query(iqkit.KeyQuery.with_key("a"))
        assert old.query(q.with_partitions([1])).partition_results[1].result == 1
        assert new.query(q.with_partitions([1])).partition_results[1].result == 2
        empty = new.query(traced("totals", iqkit.KeyQuery.with_key("a")).with_partitions([3]))
        assert empty.partition_results[3].result is None
        assert "never written" in empty.partition_results[3].execution_info[-1]
        assert new.versions("totals") == [1, 2]
    with pytest.raises(ValueError, match="has no version 9"):
        iqkit.open(s3_root, as_of=9).version("totals")


@pytest.mark.parametrize("twins", [True, False])
def test_the_trace_says_what_was_fetched_and_a_new_version_fetches_only_its_delta(
    s3_root, twins
):
    """A scan fetches the partitions' twins (``twins``) or SSTs, for their database."""
    write_totals(s3_root)
    q = traced("totals", iqkit.RangeQuery.with_no_bounds())
    read = "columnar twin read, no database" if twins else "database"
    with twin_scans(twins), iqkit.open(s3_root) as engine:
        first = cache_lines(engine.query(q))
        assert len(first) == 3 and all("fetched 1 file" in line for line in first)
        assert all(read in line for line in first), first
        again = cache_lines(engine.query(q))  # same version: nothing fetched
        assert len(again) == 3 and all("fetched 0 files" in line for line in again)
    with twin_scans(twins), iqkit.open(s3_root) as engine:  # a new reader on the same cache
        reopened = cache_lines(engine.query(q))
        assert len(reopened) == 3 and all("fetched 0 files" in line for line in reopened)
        assert all(("1 columnar twin" if twins else "reused") in line for line in reopened)
        if twins:  # a key lookup builds the owner's database: the SST is fetched now
            lookup = traced("totals", iqkit.KeyQuery.with_key("user-05"))
            (built,) = cache_lines(engine.query(lookup))
            assert "fetched 1 file" in built and "database built" in built, built
    with iqkit.StoreWriter(s3_root, "totals", who="second") as w:
        w.put("user-05", 500, partition=None)
    owner = iqkit.open(s3_root).partition_for_key("totals", "user-05")
    with twin_scans(twins), iqkit.open(s3_root) as engine:
        result = engine.query(q)
        lines = {p: cache_lines_of(qr) for p, qr in result.partition_results.items()}
    assert "fetched 1 file" in lines[owner] and "1 from cache" in lines[owner]
    assert all("fetched 0 files" in lines[p] for p in lines if p != owner)


def cache_lines_of(qr: iqkit.QueryResult) -> str:
    return next(line for line in qr.execution_info if line.startswith("Handled in FileCache"))


def test_writers_racing_for_a_version_publish_it_once_and_the_loser_is_one_line(s3_root):
    iqkit.create_store(s3_root, "totals", partitions=2, value_serde="int64")
    barrier = threading.Barrier(6)
    won: list[int] = []
    lost: list[str] = []

    def write(i: int) -> None:
        w = iqkit.StoreWriter(s3_root, "totals")
        w.put(f"k{i}", i)
        barrier.wait()
        try:
            won.append(w.commit())
        except VersionConflictError as exc:
            lost.append(str(exc))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == list(range(1, len(won) + 1))
    assert list_versions(open_objects(s3_root), "totals") == sorted(won)
    for message in lost:
        assert "\n" not in message and "published by another writer first" in message
    with iqkit.open(s3_root) as engine:  # each published commit holds its one key
        result = engine.query(request("totals", iqkit.RangeQuery.with_no_bounds()))
        present = [k for qr in result.partition_results.values() for k, _ in rows(qr)]
    assert len(present) == len(won) == 6 - len(lost)


def test_an_unreachable_endpoint_or_no_credentials_is_one_line(s3_root, monkeypatch):
    write_totals(s3_root)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(iqkit.IqkitError) as info:
        iqkit.open(s3_root)
    assert "\n" not in str(info.value) and "no credentials" in str(info.value)
    with pytest.raises(iqkit.IqkitError, match="no credentials"):
        iqkit.StoreWriter(s3_root, "totals")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(iqkit.IqkitError) as info:
        iqkit.open(s3_root)
    assert "\n" not in str(info.value) and "cannot be reached" in str(info.value)
    assert os.environ["IQKIT_CACHE"]
