"""IQResult's frames (rows, partitions, trace, lag), lag_frame and stores_frame, over
real RocksDB stores and the real engine."""

from __future__ import annotations

import duckdb
import pandas as pd
import pytest
from helpers import break_partition, iq_result, request, write_store

import iqkit
from iqkit import FailureReason, KeyQuery, LagInfo, Position, RangeQuery, StateQueryRequest
from iqkit.jupyter.result import (
    LAG_COLUMNS,
    PARTITION_COLUMNS,
    TRACE_COLUMNS,
    compact_position,
    lag_frame,
    parse_trace_line,
)
from iqkit.jupyter.stores_table import STORES_COLUMNS, stores_frame
from iqkit.store.partitions.layers import twin_scans

run = iq_result


@pytest.fixture
def totals(root):
    """A murmur2 store fed by topic "orders" (2 partitions), end offsets recorded."""
    rows = [
        (
            f"u{i:02d}",
            {"total": i, "bonus": i if i % 4 == 0 else None},
            {"source": ("orders", i % 2, i)},
        )
        for i in range(24)
    ]
    write_store(root, "totals", rows, partitions=3)
    with iqkit.StoreWriter(root, "totals") as w:
        w.record_source_end({"orders": {0: 30, 1: 25}})
    return root


@pytest.fixture
def shards(root):
    """An explicit (co-partitioned) store: partition 1 empty, partition 2 broken."""
    rows = [
        ("a", 1, {"partition": 0, "source": ("in", 0, 5)}),
        ("b", 2, {"partition": 2, "source": ("in", 2, 9)}),
        ("c", 3, {"partition": 3, "source": ("in", 3, 4)}),
    ]
    write_store(root, "shards", rows, partitions=4, partitioner="explicit")
    break_partition(root, "shards", 2)
    return root


def scan_request(store: str, *partitions: int) -> StateQueryRequest:
    req = request(store, RangeQuery.with_no_bounds()).enable_execution_info()
    return req.with_partitions(set(partitions)) if partitions else req


# -- rows ----------------------------------------------------------------------------------
def test_rows_arrow_and_len(totals):
    with iqkit.open(totals) as engine:
        r = run(engine, scan_request("totals"))
    assert r.arrow() is r.collected.table
    assert len(r) == 24 == len(r.rows)
    assert list(r.rows.columns) == ["partition", "key", "total", "bonus"]
    assert str(r.rows["bonus"].dtype) == "Int64"  # ints with nulls stay ints
    assert r.rows["bonus"].isna().sum() == 18
    assert r.rows is r.rows  # built once
    assert r.store == "totals" and r.query_type == "RangeQuery" and r.truncated is False


def test_a_limited_result_says_it_is_truncated(totals):
    with iqkit.open(totals) as engine:
        r = run(engine, scan_request("totals"), limit=5)
    assert len(r) == 5 and r.truncated is True
    assert "truncated=True" in repr(r)


# -- partitions ----------------------------------------------------------------------------
def test_partitions_frame_reports_each_partition(shards):
    with iqkit.open(shards) as engine:
        r = run(engine, scan_request("shards", 0, 1, 2, 3, 9))
    f = r.partitions
    assert list(f.columns) == PARTITION_COLUMNS
    assert f["partition"].tolist() == [0, 1, 2, 3, 9]
    # partition 1 was never written: empty, not failed (issue 10; it was NOT_PRESENT)
    assert f["status"].tolist() == ["success", "success", "failed", "success", "failed"]
    assert pd.isna(f["failure_reason"].iloc[1]) and f["failure_reason"].iloc[2] == "STORE_EXCEPTION"
    assert f["failure_reason"].iloc[4] == "DOES_NOT_EXIST"
    assert pd.isna(f["failure_reason"].iloc[0]) and pd.isna(f["message"].iloc[0])
    assert "partition 9 does not exist" in f["message"].iloc[4]
    assert f["rows"].tolist()[0] == 1 and f["rows"].tolist()[3] == 1
    assert f["rows"].isna().tolist() == [False, False, True, False, True]
    assert f["rows"].iloc[1] == 0 and f["position"].iloc[1] == ""
    assert f["position"].tolist()[0] == "in[0]=5" and f["position"].tolist()[3] == "in[3]=4"
    assert set(r.failures) == {2, 9}
    assert r.failures[2].failure_reason is FailureReason.STORE_EXCEPTION
    assert r.ok_partitions == 3
    # A failed partition carries its position too: the version record's, known without
    # reading the files that failed (the scan of partition 2's twins).
    assert r.position == Position.from_map({"in": {0: 5, 2: 9, 3: 4}})
    assert r.failures[2].position == Position.from_map({"in": {2: 9}})


def test_elapsed_is_engine_trace_time_plus_read_time(totals):
    with iqkit.open(totals) as engine:
        r = run(engine, scan_request("totals"))
        plain = run(engine, request("totals", KeyQuery.with_key("u01")))
    for p, qr in r.result.partition_results.items():
        engine_ns = sum(
            parse_trace_line(line)[2]
            for line in qr.execution_info
            if line.startswith("Handled in StateEngine")
        )
        expected = (engine_ns + r.collected.read_ns[p]) / 1e6
        got = r.partitions.set_index("partition").loc[p, "elapsed_ms"]
        assert got == pytest.approx(expected)
    # no trace and nothing iterated: not measured, so NA rather than a made-up 0
    assert plain.partitions["elapsed_ms"].isna().all()


# -- trace ---------------------------------------------------------------------------------
@pytest.mark.parametrize("twins", [True, False])
def test_trace_parses_every_partition_line(totals, twins):
    with iqkit.open(totals) as engine, twin_scans(twins):
        r = run(engine, scan_request("totals"))
    t = r.trace
    assert list(t.columns) == TRACE_COLUMNS
    if twins:  # the scan reads the twins: no database is opened, so no FileCache line
        layers = ["ColumnarScan", "TypedKeyValueLayer", "StateEngine"]
    else:  # opening the partition says what it read (its files, the database)
        layers = ["RocksDBLayer", "CachingLayer", "TypedKeyValueLayer", "FileCache", "StateEngine"]
    for p, qr in r.result.partition_results.items():
        rows = t[t["partition"] == p]
        assert rows["step"].tolist() == list(range(len(qr.execution_info)))
        assert rows["layer"].tolist() == layers
        for line, (_, row) in zip(qr.execution_info, rows.iterrows(), strict=True):
            assert line.startswith(f"Handled in {row['layer']} in {row['nanoseconds']}ns: ")
            assert line.endswith(row["detail"])
    assert r.version == 2  # named by the StateEngine lines


def test_trace_line_parsing_keeps_odd_lines():
    assert parse_trace_line("Handled in CachingLayer in 12ns: cache hit") == (
        "CachingLayer",
        "cache hit",
        12,
    )
    assert parse_trace_line("something else") == (None, "something else", None)


def test_no_execution_info_is_an_empty_trace(totals):
    with iqkit.open(totals) as engine:
        r = run(engine, request("totals", RangeQuery.with_no_bounds()))
    assert r.trace.empty and list(r.trace.columns) == TRACE_COLUMNS
    assert r.version is None


# -- lag -----------------------------------------------------------------------------------
def test_lag_has_one_row_per_input_component(totals):
    with iqkit.open(totals) as engine:
        infos = engine.lags(stores=["totals"])["totals"]
        r = run(engine, scan_request("totals"), lags=infos)
    lag = r.lag
    assert list(lag.columns) == LAG_COLUMNS
    assert set(lag["store"]) == {"totals"}
    # (partition, input partition) -> (current, end, lag): the last offset applied (where
    # murmur2 puts "u<i>", fed from orders partition i % 2 at offset i), the recorded end
    # (30 and 25, the next offsets) and what lies between: 30-22-1 for (0, 0).
    want = {
        (0, 0): (22, 30, 7),
        (0, 1): (23, 25, 1),
        (1, 0): (18, 30, 11),
        (1, 1): (19, 25, 5),
        (2, 0): (12, 30, 17),
        (2, 1): (21, 25, 3),
    }
    got = {
        (row["partition"], row["input_partition"]): (row["current"], row["end"], row["lag"])
        for _, row in lag.iterrows()
    }
    assert set(lag["topic"]) == {"orders"}
    assert got == want
    assert {p: info.offset_lag for p, info in infos.items()} == {0: 8, 1: 16, 2: 20}


def test_a_store_with_no_source_recorded_says_so_in_words(totals):
    # issue 10: its partitions were rows of <NA>; now no rows, and the words
    write_store(totals, "s", [("a", 1, {"source": ("t", 0, 3)})], partitions=2)
    with iqkit.open(totals) as engine:
        infos = engine.lags()
        frame = lag_frame(infos)
        alone = lag_frame({"s": infos["s"]})
    assert all(info.offset_lag is None for info in infos["s"].values())
    assert set(frame["store"]) == {"totals"} and frame["lag"].notna().all()
    assert frame.no_source == ("s",) and alone.no_source == ("s",)
    assert alone.empty and list(alone.columns) == LAG_COLUMNS
    assert repr(alone) == "s: no source recorded (lag unknown)"
    assert repr(frame).endswith("\ns: no source recorded (lag unknown)")
    assert "s: no source recorded (lag unknown)" in frame._repr_html_()
    sliced = frame[frame["partition"] == 0].reset_index(drop=True)
    assert sliced.no_source == ("s",)  # kept through pandas operations
    assert frame["lag"].sum() == sum(i.offset_lag for i in infos["totals"].values())
    assert lag_frame({"totals": infos["totals"]}).no_source == ()


def test_explicit_stores_bind_only_their_own_input_partition(shards):
    with iqkit.open(shards) as engine:
        end = Position.from_map({"in": {0: 10, 1: 7, 2: 12, 3: 4}})
        infos = engine.lags(end, stores=["shards"])
        manifests = {"shards": engine.manifest("shards")}
    given = lag_frame(infos, manifests=manifests)
    inferred = lag_frame(infos)
    pd.testing.assert_frame_equal(given, inferred)
    p0 = given[given["partition"] == 0]
    assert p0["input_partition"].tolist() == [0] and p0["lag"].tolist() == [4]
    for p, info in infos["shards"].items():
        assert given[given["partition"] == p]["lag"].sum() == info.offset_lag


def test_lag_shows_only_the_partitions_the_query_ran_on(totals, root):
    iqkit.create_store(root, "batch", partitions=4)  # a batch write: no source
    with iqkit.StoreWriter(root, "batch") as w:
        w.put("a", 1)
    with iqkit.open(totals) as engine:
        infos = engine.lags(stores=["totals"])["totals"]
        owner = engine.partition_for_key("totals", "u07")
        key = run(engine, request("totals", KeyQuery.with_key("u07")), lags=infos)
        some = run(engine, scan_request("totals", 0, 2), lags=infos)
        batch = run(engine, scan_request("batch"), lags=engine.lags(stores=["batch"])["batch"])
    assert set(key.lag_infos) == {owner}
    assert set(key.lag["partition"]) == {owner} and len(key.lag) == 2  # orders[0], orders[1]
    assert key.lag["lag"].sum() == infos[owner].offset_lag
    assert set(some.lag_infos) == {0, 2} and set(some.lag["partition"]) == {0, 2}
    assert batch.has_source is False and batch.lag.empty  # no rows of nulls
    assert batch.lag.no_source == ("batch",)


def test_lag_is_read_lazily_once(totals):
    calls = []
    with iqkit.open(totals) as engine:

        def lags() -> dict[int, LagInfo]:
            calls.append(1)
            return engine.lags(stores=["totals"])["totals"]

        r = run(engine, scan_request("totals"), lags=lags)
        assert calls == []
        assert len(r.lag) == 6 and len(r.lag) == 6
    assert calls == [1]


def test_no_lags_is_an_empty_frame_with_the_columns(totals):
    with iqkit.open(totals) as engine:
        r = run(engine, scan_request("totals"))
    assert r.lag.empty and list(r.lag.columns) == LAG_COLUMNS


# -- elsewhere -----------------------------------------------------------------------------
def test_to_duckdb_registers_the_rows(totals):
    con = duckdb.connect()
    with iqkit.open(totals) as engine:
        r = run(engine, scan_request("totals"))
    rel = r.to_duckdb(con, "totals_rows")
    assert rel.aggregate("count(*)").fetchall() == [(len(r),)]
    n, total = con.execute("SELECT count(*), sum(total) FROM totals_rows").fetchall()[0]
    assert n == len(r) and total == r.rows["total"].sum()
    with pytest.raises(ValueError, match="name"):
        r.to_duckdb(con, "")


def test_plot_draws_one_bar_per_partition(totals):
    import matplotlib

    matplotlib.use("Agg")  # matplotlib is a dependency (the notebooks draw lag and windows)
    with iqkit.open(totals) as engine:
        r = run(engine, scan_request("totals"))
    assert len(r.plot().patches) == 3
    with pytest.raises(ValueError, match="'rows' or 'lag'"):
        r.plot("bytes")


def test_repr_is_stable_and_informative(totals):
    with iqkit.open(totals) as engine:
        a = run(engine, scan_request("totals"))
        b = run(engine, scan_request("totals"))
    assert repr(a) == (
        "IQResult(store='totals', query=RangeQuery(lower=None, upper=None, order=ANY), "
        "rows=24, partitions=3 ok/0 failed, truncated=False)"
    )
    assert str(a) == str(b)  # no timings in the text form
    assert str(a).startswith(repr(a))


def test_compact_position():
    pos = Position.from_map({"b": {1: 5, 0: 3}, "a": {2: 7}})
    assert compact_position(pos) == "a[2]=7,b[0]=3,b[1]=5"
    assert compact_position(Position.empty()) == ""


# -- %iq stores ------------------------------------------------------------------------------
def test_stores_frame(totals):
    root = totals
    write_store(root, "win", [(f"k{i}", i, {"window_start": i}) for i in range(9)], partitions=2,
                kind="window", window_size_ms=5)  # fmt: skip
    iqkit.create_store(root, "empty", partitions=2, key_serde="int64")
    with iqkit.open(root) as engine:
        f = stores_frame(engine).set_index("name")
        lags = engine.lags()
    assert ["name", *f.columns] == STORES_COLUMNS
    assert list(f.index) == ["empty", "totals", "win"]
    assert f.loc["totals", "kind"] == "kv" and f.loc["win", "kind"] == "window"
    assert f.loc["empty", "key_serde"] == "int64" and f.loc["totals", "partitioner"] == "murmur2"
    assert f.loc["totals", "version"] == 2 and pd.isna(f.loc["empty", "version"])
    assert f.loc["totals", "approx_rows"] == 24 and f.loc["win", "approx_rows"] == 9
    assert f.loc["empty", "approx_rows"] == 0
    assert f.loc["totals", "position"] == "orders[0]=22,orders[1]=23"
    assert f.loc["totals", "lag"] == sum(i.offset_lag for i in lags["totals"].values())
    # no end offsets recorded: unknown, never 0 -- in words (issue 10; it was NA)
    assert f.loc["win", "lag"] == f.loc["empty", "lag"] == "no source recorded"
