"""The engine's execution rules, each against real stores on disk: which partitions a
request reaches (owner of a key, requested partitions, fan-out), the per-partition checks
in order (DOES_NOT_EXIST, UNKNOWN_QUERY_TYPE, NOT_ACTIVE, NOT_UP_TO_BOUND, then
STORE_EXCEPTION), a never-written partition read as empty, and lags."""

from __future__ import annotations

import re

import pytest
from helpers import break_partition, partition_files, request, twin_files

import iqkit
from iqkit import FailureReason, KeyQuery, Position, PositionBound
from iqkit.store.encoding.partitioners import murmur2_partition
from iqkit.store.partitions.layers import twin_scans

HANDLED = re.compile(r"^Handled in (\w+) in (\d+)ns")


@pytest.fixture
def totals(root):
    """murmur2 store, 4 partitions, positions from topic 'orders' (2 input partitions)."""
    iqkit.create_store(root, "totals", partitions=4)
    with iqkit.StoreWriter(root, "totals") as w:
        for i in range(40):
            w.put(f"user-{i}", i, source=("orders", i % 2, i))
    return root


@pytest.fixture
def explicit(root):
    """explicit store, 3 partitions; partition p applied input partition p up to 10*p+5."""
    iqkit.create_store(root, "byp", partitions=3, partitioner="explicit")
    with iqkit.StoreWriter(root, "byp") as w:
        for p in range(2):  # partition 2 is never written
            w.put(f"k{p}", p, partition=p, source=("in", p, 10 * p + 5))
    return root


# -- request-level errors ----------------------------------------------------------------
def test_unknown_store_raises_with_a_did_you_mean_hint(totals):
    with iqkit.open(totals) as engine, pytest.raises(iqkit.UnknownStoreError) as info:
        engine.query(request("total", KeyQuery.with_key("a")))
    assert "did you mean 'totals'" in str(info.value)


def test_a_closed_engine_raises(totals):
    engine = iqkit.open(totals)
    engine.close()
    with pytest.raises(iqkit.EngineClosedError):
        engine.query(request("totals", KeyQuery.with_key("a")))
    with pytest.raises(iqkit.EngineClosedError):
        engine.store_names()


def test_opening_a_missing_root_says_so_and_creates_nothing(tmp_path):
    missing = tmp_path / "no" / "such" / "root"
    with pytest.raises(iqkit.StoreNotFoundError, match="no iqkit root"):
        iqkit.open(missing)
    assert not (tmp_path / "no").exists()


def test_store_names_lists_stores(totals, explicit):
    with iqkit.open(totals) as engine:
        assert engine.store_names() == ["byp", "totals"]


# -- per-partition failures ----------------------------------------------------------------
def test_partition_beyond_the_count_does_not_exist(totals, open_engine):
    with open_engine(totals) as engine:
        r = engine.query(request("totals", KeyQuery.with_key("a")).with_partitions({1, 4, 9}))
    assert r.partition_results[4].failure_reason is FailureReason.DOES_NOT_EXIST
    assert r.partition_results[9].failure_reason is FailureReason.DOES_NOT_EXIST
    assert "4 partitions" in r.partition_results[4].failure_message
    assert r.partition_results[1].is_success


# (issue 10 changed these two: a partition no commit touched was NOT_PRESENT, now empty)
def test_partition_never_written_is_empty_not_failed(explicit, open_engine):
    with open_engine(explicit) as engine:
        r = engine.query(request("byp", KeyQuery.with_key("k0")))
        scan = engine.query(request("byp", iqkit.RangeQuery.with_no_bounds()))
        traced = engine.query(
            request("byp", KeyQuery.with_key("k0")).with_partitions({2}).enable_execution_info()
        )
    assert sorted(r.partition_results) == [0, 1, 2]
    assert all(q.is_success for q in r.partition_results.values())
    assert r.partition_results[2].result is None  # a KeyQuery on an empty partition: None
    assert r.partition_results[2].position == Position.empty()
    assert r.partition_results[0].result == 0
    assert r.partition_results[1].result is None
    assert r.only_partition_result().result == 0
    never = scan.partition_results[2]
    assert never.is_success and never.position.is_empty
    with never.result as it:
        assert list(it) == []
    assert "never written" in traced.partition_results[2].execution_info[-1]


def test_nothing_committed_is_empty_everywhere(root, open_engine):
    iqkit.create_store(root, "empty", partitions=2)
    iqkit.create_store(root, "wempty", partitions=1, kind="window", window_size_ms=10)
    with open_engine(root) as engine:
        r = engine.query(request("empty", iqkit.RangeQuery.with_no_bounds()))
        k = engine.query(request("empty", iqkit.MultiKeyQuery.with_keys(["a", "b"])))
        w = engine.query(
            request("wempty", iqkit.WindowKeyQuery.with_key_and_window_start_range("a", 0, 9))
        )
    assert sorted(r.partition_results) == [0, 1]
    for q in [*r.partition_results.values(), *w.partition_results.values()]:
        assert q.is_success and q.position.is_empty
        with q.result as it:
            assert list(it) == []
    assert all(q.result == {} for q in k.partition_results.values())


def test_position_bounds_still_apply_to_an_empty_partition(explicit, totals, root, open_engine):
    iqkit.create_store(root, "fresh", partitions=2)
    # byp's partition 2 was never written; only in[2] binds it (explicit store)
    binding = PositionBound.at(Position.from_map({"in": {2: 0}}))
    other = PositionBound.at(Position.from_map({"in": {0: 5}}))
    with open_engine(root) as engine:
        failed = engine.query(
            request("byp", iqkit.RangeQuery.with_no_bounds())
            .with_partitions({2})
            .with_position_bound(binding)
        ).partition_results[2]
        passed = engine.query(
            request("byp", iqkit.RangeQuery.with_no_bounds())
            .with_partitions({2})
            .with_position_bound(other)
        ).partition_results[2]
        fresh = engine.query(
            request("fresh", KeyQuery.with_key("a")).with_position_bound(other)
        ).only_partition_result()
    assert failed.failure_reason is FailureReason.NOT_UP_TO_BOUND
    assert failed.position.is_empty
    assert passed.is_success  # in[0] does not bind store partition 2
    passed.result.close()
    assert fresh.failure_reason is FailureReason.NOT_UP_TO_BOUND  # murmur2: every component


def test_require_active_applies_to_a_partition_an_old_version_never_wrote(root, open_engine):
    iqkit.create_store(root, "s", partitions=2, partitioner="explicit")
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1, partition=0)
    with iqkit.StoreWriter(root, "s") as w:
        w.put("b", 2, partition=1)
    with open_engine(root, as_of=1) as old:
        stale = old.query(request("s", KeyQuery.with_key("b")).require_active())
        relaxed = old.query(request("s", KeyQuery.with_key("b")))
    assert stale.partition_results[1].failure_reason is FailureReason.NOT_ACTIVE
    assert relaxed.partition_results[1].is_success
    assert relaxed.partition_results[1].result is None  # version 1 never wrote it


def test_a_corrupt_partition_fails_alone(totals, open_engine):
    victim = 2
    for path in [*partition_files(totals, "totals", victim), *twin_files(totals, "totals", victim)]:
        data = bytearray(path.read_bytes())  # the SSTs and their columnar twins
        data[: len(data) // 2] = b"\xde\xad" * (len(data) // 4)
        path.write_bytes(bytes(data))
    with open_engine(totals) as engine:
        r = engine.query(request("totals", iqkit.RangeQuery.with_no_bounds()))
        statuses = {}
        for p, qr in r.partition_results.items():
            if qr.is_failure:
                statuses[p] = qr.failure_reason
                continue
            try:
                with qr.result as it:
                    list(it)
                statuses[p] = "ok"
            except iqkit.StoreCorruptedError:
                statuses[p] = "corrupt while iterating"
    assert statuses[victim] in (FailureReason.STORE_EXCEPTION, "corrupt while iterating")
    assert all(statuses[p] == "ok" for p in range(4) if p != victim)


@pytest.mark.parametrize("twins", [True, False])
def test_an_unreadable_partition_is_a_store_exception(totals, open_engine, twins):
    """Whichever files a scan reads (the twins, or RocksDB: ``twin_scans(False)``, a raw
    scan), the damaged one is named in that partition's result, never raised while
    iterating; and once one file of the partition is found damaged, the partition's
    other queries fail with the same verdict (store/integrity.py: the raw scan after a
    twin scan names the twin the first found damaged)."""
    break_partition(totals, "totals", 1)
    with open_engine(totals) as engine, twin_scans(twins):
        r = engine.query(request("totals", iqkit.RangeQuery.with_no_bounds()))
        raw = engine.query(request("totals", iqkit.RawScanQuery.scan()))  # always RocksDB
    found = ".parquet" if twins else ".sst"
    for result, damaged in [(r, found), (raw, found)]:
        failed = result.partition_results[1]
        assert failed.failure_reason is FailureReason.STORE_EXCEPTION
        assert "partition 1" in failed.failure_message
        assert f"{damaged}" in failed.failure_message, failed.failure_message
        assert all(result.partition_results[p].is_success for p in (0, 2, 3))


def test_a_query_the_store_kind_cannot_run_is_unknown_query_type(totals, root, open_engine):
    iqkit.create_store(root, "win", partitions=1, kind="window", window_size_ms=10)
    with iqkit.StoreWriter(root, "win") as w:
        w.put("a", 1, window_start=0)
    with open_engine(root) as engine:
        r = engine.query(
            request("totals", iqkit.WindowKeyQuery.with_key_and_window_start_range("a", 0, 1))
        )
        w = engine.query(request("win", KeyQuery.with_key("a")))
        # checked before the bound: an impossible bound still yields UNKNOWN_QUERY_TYPE
        far = PositionBound.at(Position.empty().with_component("orders", 0, 10**9))
        b = engine.query(
            request(
                "totals", iqkit.WindowRangeQuery.with_window_start_range(0, 1)
            ).with_position_bound(far)
        )
    assert {q.failure_reason for q in r.partition_results.values()} == {
        FailureReason.UNKNOWN_QUERY_TYPE
    }
    assert w.partition_results[0].failure_reason is FailureReason.UNKNOWN_QUERY_TYPE
    assert {q.failure_reason for q in b.partition_results.values()} == {
        FailureReason.UNKNOWN_QUERY_TYPE
    }


# -- require_active -------------------------------------------------------------------------
def test_require_active_fails_on_an_older_version(root, open_engine):
    iqkit.create_store(root, "s", partitions=1)
    for v in range(2):
        with iqkit.StoreWriter(root, "s") as w:
            w.put("a", v, source=("t", 0, v))
    with open_engine(root, as_of=1) as old, open_engine(root) as new:
        stale = old.query(request("s", KeyQuery.with_key("a")).require_active())
        fresh = new.query(request("s", KeyQuery.with_key("a")).require_active())
        relaxed = old.query(request("s", KeyQuery.with_key("a")))
    only = stale.only_partition_result()
    assert only.failure_reason is FailureReason.NOT_ACTIVE
    assert only.position.to_map() == {"t": {0: 0}}  # failures carry the position too
    assert fresh.only_partition_result().result == 1
    assert relaxed.only_partition_result().result == 0


# -- position bounds ------------------------------------------------------------------------
def test_murmur2_store_checks_every_bound_component(totals, open_engine):
    # every partition of 'totals' read both input partitions; the max offsets are 38 / 39
    with open_engine(totals) as engine:
        positions = {
            p: r.position
            for p, r in engine.query(
                request("totals", iqkit.RawScanQuery.scan())
            ).partition_results.items()
        }
        low = PositionBound.at(Position.from_map({"orders": {0: 0, 1: 1}}))
        ok = engine.query(request("totals", iqkit.RawScanQuery.scan()).with_position_bound(low))
        assert all(r.is_success for r in ok.partition_results.values())
        p0 = positions[0].partition_positions("orders")
        just_above = PositionBound.at(Position.from_map({"orders": {1: p0[1] + 1}}))
        r = engine.query(
            request("totals", iqkit.RawScanQuery.scan())
            .with_partitions({0})
            .with_position_bound(just_above)
        )
        missing_topic = PositionBound.at(Position.from_map({"payments": {0: 0}}))
        m = engine.query(
            request("totals", iqkit.RawScanQuery.scan()).with_position_bound(missing_topic)
        )
    failed = r.partition_results[0]
    assert failed.failure_reason is FailureReason.NOT_UP_TO_BOUND
    assert failed.position == positions[0]
    assert "not yet up to the bound" in failed.failure_message
    assert {q.failure_reason for q in m.partition_results.values()} == {
        FailureReason.NOT_UP_TO_BOUND
    }


def test_explicit_store_checks_only_its_own_input_partition(explicit, open_engine):
    # partition 0 applied in[0]=5, partition 1 applied in[1]=15
    bound = PositionBound.at(Position.from_map({"in": {0: 5, 1: 15}}))
    too_far = PositionBound.at(Position.from_map({"in": {0: 6, 1: 15}}))
    with open_engine(explicit) as engine:
        r = engine.query(
            request("byp", KeyQuery.with_key("k0"))
            .with_partitions({0, 1})
            .with_position_bound(bound)
        )
        f = engine.query(
            request("byp", KeyQuery.with_key("k0"))
            .with_partitions({0, 1})
            .with_position_bound(too_far)
        )
    assert r.partition_results[0].result == 0
    assert r.partition_results[1].is_success
    assert f.partition_results[0].failure_reason is FailureReason.NOT_UP_TO_BOUND
    assert f.partition_results[1].is_success  # in[0] does not bind store partition 1


def test_unbounded_and_empty_bounds_always_pass(totals, open_engine):
    with open_engine(totals) as engine:
        for bound in (PositionBound.unbounded(), PositionBound.at(Position.empty())):
            r = engine.query(
                request("totals", KeyQuery.with_key("user-1")).with_position_bound(bound)
            )
            assert r.only_partition_result().result == 1


# -- routing -------------------------------------------------------------------------------
def test_key_query_on_murmur2_store_runs_only_on_the_owner(totals, open_engine):
    with open_engine(totals) as engine:
        r = engine.query(request("totals", KeyQuery.with_key("user-7")))
        owner = engine.partition_for_key("totals", "user-7")
    assert owner == murmur2_partition(b"user-7", 4)
    assert list(r.partition_results) == [owner]
    assert r.only_partition_result().result == 7
    assert r.position == r.partition_results[owner].position


def test_key_query_on_explicit_store_fans_out(explicit, open_engine):
    with open_engine(explicit) as engine:
        r = engine.query(request("byp", KeyQuery.with_key("k1")))
        assert engine.partition_for_key("byp", "k1") is None
    assert sorted(r.partition_results) == [0, 1, 2]
    assert r.partition_results[0].result is None
    assert r.partition_results[1].result == 1
    assert r.partition_results[2].is_success and r.partition_results[2].result is None


def test_multi_key_query_groups_keys_by_owner(totals, open_engine):
    keys = [f"user-{i}" for i in (1, 2, 3, 5, 8, 13)] + ["nobody"]
    with open_engine(totals) as engine:
        r = engine.query(request("totals", iqkit.MultiKeyQuery.with_keys(keys)))
    owners = {murmur2_partition(k.encode(), 4) for k in keys}
    assert set(r.partition_results) == owners
    merged = {}
    for qr in r.partition_results.values():
        merged.update(qr.result)
    assert merged == {k: int(k.split("-")[1]) for k in keys if k != "nobody"}


def test_requested_partitions_are_honoured_for_key_queries(totals, open_engine):
    owner = murmur2_partition(b"user-3", 4)
    other = (owner + 1) % 4
    with open_engine(totals) as engine:
        r = engine.query(request("totals", KeyQuery.with_key("user-3")).with_partitions({other}))
    assert list(r.partition_results) == [other]
    assert r.partition_results[other].result is None


# -- execution info and the cache ------------------------------------------------------------
def test_execution_info_has_one_line_per_layer(totals, open_engine):
    with open_engine(totals) as engine:
        r = engine.query(request("totals", KeyQuery.with_key("user-4")).enable_execution_info())
        quiet = engine.query(request("totals", KeyQuery.with_key("user-4")))
    lines = r.only_partition_result().execution_info
    layers = [HANDLED.match(line).group(1) for line in lines]
    # Opening the partition says what it read (FileCache: its files, the database
    # built or reused in the cache).
    assert layers == [
        "RocksDBLayer",
        "CachingLayer",
        "TypedKeyValueLayer",
        "FileCache",
        "StateEngine",
    ]
    assert "cache miss" in lines[1]
    assert "version 1" in lines[0]
    assert quiet.only_partition_result().execution_info == []


def test_second_lookup_hits_the_cache_and_skip_cache_bypasses_it(totals, open_engine):
    with open_engine(totals) as engine:

        def trace(query):
            r = engine.query(request("totals", query).enable_execution_info())
            return r.only_partition_result().execution_info

        first = trace(KeyQuery.with_key("user-9"))
        second = trace(KeyQuery.with_key("user-9"))
        skipped = trace(KeyQuery.with_key("user-9").skip_cache())
    assert any("cache miss" in line for line in first)
    assert any("RocksDBLayer" in line for line in first)
    assert any("cache hit" in line for line in second)
    assert not any("RocksDBLayer" in line for line in second)  # answered from the cache
    assert any("skipped (skip_cache)" in line for line in skipped)
    assert any("RocksDBLayer" in line for line in skipped)  # really went to RocksDB


def test_skip_cache_reaches_every_partition_a_multi_key_query_is_routed_to(totals, open_engine):
    keys = ["user-1", "user-2", "user-3", "user-9"]
    owners = {murmur2_partition(k.encode(), 4) for k in keys}
    assert len(owners) > 1  # routed to several partitions, each with a query of its own
    with open_engine(totals) as engine:

        def traces(query):
            r = engine.query(request("totals", query).enable_execution_info())
            assert sorted(r.partition_results) == sorted(owners)
            return {p: qr.execution_info for p, qr in r.partition_results.items()}

        traces(iqkit.MultiKeyQuery.with_keys(keys))  # every key now in the cache
        cached = traces(iqkit.MultiKeyQuery.with_keys(keys))
        skipped = traces(iqkit.MultiKeyQuery.with_keys(keys).skip_cache())
    for p in owners:
        assert any(re.search(r"CachingLayer.*: \d+ cache hits, 0 misses", x) for x in cached[p])
        assert not any("RocksDBLayer" in line for line in cached[p])  # all from the cache
        assert any("skipped (skip_cache)" in line for line in skipped[p]), skipped[p]
        assert any("RocksDBLayer" in line for line in skipped[p])  # really went to RocksDB


@pytest.mark.parametrize("twins", [True, False])
def test_scan_traces_name_what_the_scan_reads(totals, open_engine, twins):
    """From the columnar twins: the files and row groups; from RocksDB (twins off): the
    bounded iterator."""
    with open_engine(totals) as engine, twin_scans(twins):
        r = engine.query(
            request("totals", iqkit.PrefixScanQuery.with_prefix("user-1"))
            .with_partitions({0})
            .enable_execution_info()
        )
        lines = r.partition_results[0].execution_info
        r.partition_results[0].result.close()
    if twins:
        assert lines[0].startswith("Handled in ColumnarScan in ")
        assert "1 file, 1 row groups read, 0 row groups skipped by key statistics" in lines[0]
    else:
        assert "bounded iterator" in lines[0]
        assert "forward" in lines[0]


# -- lag -----------------------------------------------------------------------------------
def test_lags_use_recorded_end_offsets(root, open_engine):
    iqkit.create_store(root, "s", partitions=2, partitioner="explicit")
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1, partition=0, source=("in", 0, 9))
        w.put("b", 1, partition=1, source=("in", 1, 3))
        w.record_source_end({"in": {0: 10, 1: 10}})  # log-end offsets
    with open_engine(root) as engine:
        lags = engine.lags()["s"]
    assert lags[0].offset_lag == 0  # applied 9, log end 10: nothing behind
    assert lags[1].offset_lag == 6  # applied 3 of 0..9
    assert lags[0].current_position.to_map() == {"in": {0: 9}}
    assert lags[0].end_position.to_map() == {"in": {0: 10, 1: 10}}


def test_lags_of_a_chain_store_come_from_its_record_and_build_no_database(
    root, tmp_path, monkeypatch
):
    # The chain record carries each partition's commit record: lag needs no partition
    # opened (on an object root, nothing fetched), and says what a query's position says.
    monkeypatch.setenv("IQKIT_CACHE", str(tmp_path / "cache"))
    iqkit.create_store(root, "s", partitions=3, partitioner="explicit")
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1, partition=0, source=("in", 0, 9))
        w.put("b", 1, partition=1, source=("in", 1, 3))
        w.record_source_end({"in": {0: 10, 1: 10, 2: 4}})
    with iqkit.open(root) as engine:
        lags = engine.lags()["s"]
        assert not (tmp_path / "cache" / "dbs").exists() or not any(
            (tmp_path / "cache" / "dbs").rglob("CURRENT")
        )
        positions = {
            p: qr.position
            for p, qr in engine.query(
                request("s", iqkit.RangeQuery.with_no_bounds())
            ).partition_results.items()
        }
    assert {p: li.offset_lag for p, li in lags.items()} == {0: 0, 1: 6, 2: 4}
    assert {p: li.current_position for p, li in lags.items()} == positions
    assert positions[0].to_map() == {"in": {0: 9}} and positions[2].is_empty


def test_lags_with_given_end_and_unknown_end(root, totals, open_engine):
    with open_engine(totals) as engine:
        unknown = engine.lags()["totals"]
        given = engine.lags(Position.from_map({"orders": {0: 100, 1: 100}}))["totals"]
        per_store = engine.lags({"totals": Position.from_map({"orders": {0: 50}})})["totals"]
    assert all(li.offset_lag is None and li.end_position is None for li in unknown.values())
    # The last offset of each input partition each store partition applied (where
    # murmur2 puts "user-<i>", fed from orders partition i % 2 at offset i):
    applied = {0: {0: 38, 1: 39}, 1: {0: 34, 1: 35}, 2: {0: 32, 1: 25}, 3: {0: 36, 1: 37}}
    assert {p: li.current_position.to_map()["orders"] for p, li in given.items()} == applied
    # End offsets 100 and 100 (the next offsets): partition 0 is 100-38-1 + 100-39-1 behind.
    assert {p: li.offset_lag for p, li in given.items()} == {0: 121, 1: 129, 2: 141, 3: 125}
    # End offset 50 of orders partition 0 only: partition 0 is 50-38-1 behind.
    assert {p: li.offset_lag for p, li in per_store.items()} == {0: 11, 1: 15, 2: 17, 3: 13}


def test_lag_of_a_partition_with_no_data_counts_everything(root, open_engine):
    iqkit.create_store(root, "s", partitions=2, partitioner="explicit")
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1, partition=0, source=("in", 0, 4))
        w.record_source_end({"in": {0: 5, 1: 7}})
    with open_engine(root) as engine:
        lags = engine.lags()["s"]
    assert lags[1].current_position.is_empty
    assert lags[1].offset_lag == 7  # offsets 0..6 of in[1], none applied


def test_a_partition_past_an_older_recorded_end_lags_by_zero(root, open_engine):
    """An end recorded before later commits applied more (the source moved on, no new end
    recorded yet) is behind the partition: nothing is missing, the lag is 0, never
    5 - 15 - 1 = -11."""
    iqkit.create_store(root, "s", partitions=2, partitioner="explicit")
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1, partition=0, source=("in", 0, 4))
        w.put("b", 1, partition=1, source=("in", 1, 2))
        w.record_source_end({"in": {0: 5, 1: 5}})
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 2, partition=0, source=("in", 0, 15))
    with open_engine(root) as engine:
        lags = engine.lags()["s"]
        given = engine.lags(Position.from_map({"in": {0: 5, 1: 5}}))["s"]
    assert lags[0].current_position.to_map() == {"in": {0: 15}}
    assert lags[0].end_position.to_map() == {"in": {0: 5, 1: 5}}  # the older end, kept
    assert {p: li.offset_lag for p, li in lags.items()} == {0: 0, 1: 2}  # 1: 5 - 2 - 1
    assert {p: li.offset_lag for p, li in given.items()} == {0: 0, 1: 2}
