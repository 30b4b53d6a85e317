"""iqkit.tables: query results as Arrow tables (collect) and streamed full scans
(store_batches), over real RocksDB stores."""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa
import pytest
from helpers import break_partition, kv_rows, request, write_store

import iqkit
from iqkit import (
    FailureReason,
    KeyQuery,
    KeyValueIterator,
    MultiKeyQuery,
    PrefixScanQuery,
    RangeQuery,
    RawScanQuery,
    WindowRangeQuery,
    tables,
)
from iqkit.store.partitions.layers import twin_scans
from iqkit.tables import collect, store_batches, to_pandas

UTC_MS = pa.timestamp("ms", tz="UTC")


def scan(engine: iqkit.StateEngine, store: str, query=None, **kwargs) -> tables.Collected:
    query = query or RangeQuery.with_no_bounds()
    result = engine.query(request(store, query))
    return collect(result, engine.manifest(store), query=query, **kwargs)


@pytest.fixture
def orders(root):
    """Four partitions of JSON records; one record has an extra field, one lacks one."""
    rows = [(f"o{i:03d}", {"amount": i, "city": f"c{i % 3}"}) for i in range(40)]
    rows.append(("o900", {"amount": 7, "city": "x", "coupon": "SAVE"}))
    rows.append(("o901", {"amount": 8}))
    write_store(root, "orders", rows, partitions=4)
    return root


# -- collect: schema and rows --------------------------------------------------------------
def test_json_records_expand_to_columns_in_first_seen_order(orders):
    with iqkit.open(orders) as engine:
        c = scan(engine, "orders")
        expected = kv_rows(engine, "orders")
    t = c.table
    assert t.schema.names == ["partition", "key", "amount", "city", "coupon"]
    assert t.schema.field("partition").type == pa.int32()
    assert t.schema.field("amount").type == pa.int64()
    got = list(zip(t["partition"].to_pylist(), t["key"].to_pylist(), strict=True))
    assert got == [(p, k) for p, k, _ in expected]  # partitions ascending, engine order
    by_key = {r["key"]: r for r in t.to_pylist()}
    for _, key, value in expected:
        assert {f: by_key[key][f] for f in ("amount", "city", "coupon")} == {
            "amount": value.get("amount"),
            "city": value.get("city"),
            "coupon": value.get("coupon"),
        }
    assert c.rows_per_partition == {p: sum(1 for r in expected if r[0] == p) for p in range(4)}
    assert set(c.read_ns) == {0, 1, 2, 3} and all(ns >= 0 for ns in c.read_ns.values())
    assert c.truncated is False and len(c) == len(expected)


def test_a_field_named_like_a_row_column_is_renamed(root):
    write_store(root, "s", [("a", {"key": "inner", "partition": 9, "x": 1})], partitions=1)
    with iqkit.open(root) as engine:
        t = scan(engine, "s").table
    assert t.schema.names == ["partition", "key", "value.key", "value.partition", "x"]
    assert t.to_pylist() == [
        {"partition": 0, "key": "a", "value.key": "inner", "value.partition": 9, "x": 1}
    ]


def test_serde_types_carry_into_arrow(root):
    write_store(
        root, "ints", [(-5, 10), (7, 2**40)], partitions=1, key_serde="int32", value_serde="int64"
    )
    write_store(
        root, "raw", [(b"\x00k", b"\xffv")], partitions=1, key_serde="bytes", value_serde="bytes"
    )
    write_store(root, "d", [("a", 1.5)], partitions=1, value_serde="double")
    with iqkit.open(root) as engine:
        ints = scan(engine, "ints").table
        raw = scan(engine, "raw").table
        d = scan(engine, "d").table
    assert ints.schema.field("key").type == pa.int32()
    assert ints.schema.field("value").type == pa.int64()
    assert sorted(ints["key"].to_pylist()) == [-5, 7]
    assert raw.schema.field("key").type == pa.binary()
    assert raw.to_pylist() == [{"partition": 0, "key": b"\x00k", "value": b"\xffv"}]
    assert d.schema.field("value").type == pa.float64()


def test_tuple_keys_use_the_declared_key_columns(root):
    rows = [(("eu", "ann"), 1), (("us", "bob"), 2), (("eu",), 3)]
    write_store(
        root, "t", rows, partitions=1, key_serde="ordered",
        properties={"key_columns": ["region", "user"]},
    )  # fmt: skip
    with iqkit.open(root) as engine:
        t = scan(engine, "t").table
    assert t.schema.names == ["partition", "region", "user", "value"]
    assert {(r["region"], r["user"], r["value"]) for r in t.to_pylist()} == {
        ("eu", "ann", 1),
        ("us", "bob", 2),
        ("eu", None, 3),  # a short key leaves the later columns null
    }


def test_tuple_keys_without_names_are_key_0_key_1(root):
    rows = [((1, "a"), "x"), ((2, "b"), "y")]
    write_store(root, "t", rows, partitions=1, key_serde="ordered", value_serde="string")
    with iqkit.open(root) as engine:
        t = scan(engine, "t").table
    assert t.schema.names == ["partition", "key_0", "key_1", "value"]
    assert t.schema.field("key_0").type == pa.int64()
    assert t.to_pylist() == [
        {"partition": 0, "key_0": 1, "key_1": "a", "value": "x"},
        {"partition": 0, "key_0": 2, "key_1": "b", "value": "y"},
    ]


def test_window_rows_have_utc_window_columns(root):
    rows = [(k, {"n": i}, {"window_start": i * 1000}) for i, k in enumerate("abcde")]
    write_store(root, "w", rows, partitions=2, kind="window", window_size_ms=500)
    query = WindowRangeQuery.with_window_start_range(0, 10_000)
    with iqkit.open(root) as engine:
        t = scan(engine, "w", query).table
        result = engine.query(request("w", query))
        expected = []
        for p, qr in result.partition_results.items():
            with qr.result as it:
                expected += [(p, kv.key.key, kv.key.start, kv.key.end, kv.value["n"]) for kv in it]
    assert t.schema.names == ["partition", "key", "window_start", "window_end", "n"]
    assert t.schema.field("window_start").type == UTC_MS
    assert t.schema.field("window_end").type == UTC_MS
    starts = t["window_start"].cast(pa.int64()).to_pylist()
    ends = t["window_end"].cast(pa.int64()).to_pylist()
    got = list(
        zip(t["partition"].to_pylist(), t["key"].to_pylist(), starts, ends, t["n"].to_pylist(),
            strict=True)
    )  # fmt: skip
    assert got == expected and len(got) == 5


def test_mixed_types_fall_back_to_json_text_for_that_column_only(root):
    rows = [
        ("a", {"mixed": 1, "num": 1, "ok": "x"}),
        ("b", {"mixed": "one", "num": 2.5, "ok": "y"}),
        ("c", {"mixed": [1, "z"], "num": 3, "ok": "z"}),
    ]
    write_store(root, "m", rows, partitions=1)
    write_store(root, "v", [("a", 1), ("b", "text"), ("c", True)], partitions=1)
    with iqkit.open(root) as engine:
        m = scan(engine, "m").table
        v = scan(engine, "v").table
    assert m.schema.field("mixed").type == pa.string()
    assert [json.loads(x) for x in m["mixed"].to_pylist()] == [1, "one", [1, "z"]]
    assert m.schema.field("num").type == pa.float64()  # ints and floats: Arrow widens
    assert m["ok"].to_pylist() == ["x", "y", "z"]
    assert [json.loads(x) for x in v["value"].to_pylist()] == [1, "text", True]


def test_chunks_with_different_types_are_unified(root, monkeypatch):
    monkeypatch.setattr(tables, "CHUNK_ROWS", 3)
    monkeypatch.setattr(tables, "PROGRESS_ROWS", 3)
    rows = [(f"k{i}", {"n": i, "s": "x"}) for i in range(6)]  # first chunk: n is int
    rows += [(f"k{i}", {"n": i + 0.5, "s": i, "late": True}) for i in range(6, 9)]
    write_store(root, "c", rows, partitions=1)
    with iqkit.open(root) as engine:
        with twin_scans(False):  # RocksDB's rows come in chunks, each shaped on its own
            t = scan(engine, "c").table
        twin = scan(engine, "c").table
        expected = kv_rows(engine, "c")
    # The twin holds the file's columns, typed once for all its rows: the same table.
    assert twin.schema == t.schema and twin.to_pylist() == t.to_pylist()
    assert t.num_rows == 9 and t.column("n").num_chunks == 3
    assert t.schema.names == ["partition", "key", "n", "s", "late"]
    assert t.schema.field("n").type == pa.float64()
    assert t["n"].to_pylist() == [float(v["n"]) for _, _, v in expected]
    # "s" is a string in two chunks and an int in one: JSON text in every chunk
    assert [json.loads(x) for x in t["s"].to_pylist()] == [v["s"] for _, _, v in expected]
    assert t["late"].to_pylist() == [v.get("late") for _, _, v in expected]


def test_raw_scan_is_bytes(orders):
    with iqkit.open(orders) as engine:
        t = scan(engine, "orders", RawScanQuery.scan()).table
        n = len(kv_rows(engine, "orders"))
    assert t.schema.names == ["partition", "key", "value"]
    assert t.schema.field("key").type == pa.binary() and t.num_rows == n
    assert json.loads(t["value"][0].as_py())["amount"] >= 0


def test_empty_result_still_has_typed_columns(root):
    write_store(root, "e", [("a", 1)], partitions=1, key_serde="string", value_serde="int64")
    with iqkit.open(root) as engine:
        c = scan(engine, "e", RangeQuery.with_range("x", "z"))
    assert c.table.num_rows == 0
    assert c.table.schema == pa.schema(
        [("partition", pa.int32()), ("key", pa.string()), ("value", pa.int64())]
    )
    assert c.rows_per_partition == {0: 0} and c.truncated is False


# -- collect: key lookups, failures ----------------------------------------------------------
def test_key_and_multi_key_results_need_the_query(orders):
    with iqkit.open(orders) as engine:
        manifest = engine.manifest("orders")
        one = KeyQuery.with_key("o007")
        many = MultiKeyQuery.with_keys(["o001", "o002", "missing"])
        c1 = collect(engine.query(request("orders", one)), manifest, query=one)
        c2 = collect(engine.query(request("orders", many)), manifest, query=request("o", many))
        with pytest.raises(ValueError, match="query="):
            collect(engine.query(request("orders", one)), manifest)
        owner = engine.partition_for_key("orders", "o007")
    assert c1.table.to_pylist() == [{"partition": owner, "key": "o007", "amount": 7, "city": "c1"}]
    assert sorted(c2.table["key"].to_pylist()) == ["o001", "o002"]
    assert c2.table["partition"].to_pylist() == sorted(c2.table["partition"].to_pylist())


def test_failed_partitions_contribute_no_rows(root):
    rows = [("a", 1, {"partition": 0}), ("b", 2, {"partition": 2})]
    write_store(root, "x", rows, partitions=3, partitioner="explicit")
    break_partition(root, "x", 2)
    with iqkit.open(root) as engine:
        result = engine.query(
            request("x", RangeQuery.with_no_bounds()).with_partitions({0, 1, 2, 5})
        )
        c = collect(result, engine.manifest("x"))
    reasons = {p: r.failure_reason for p, r in result.partition_results.items() if r.is_failure}
    # partition 1 was never written: empty, no failure (issue 10; it was NOT_PRESENT)
    assert reasons == {2: FailureReason.STORE_EXCEPTION, 5: FailureReason.DOES_NOT_EXIST}
    assert c.rows_per_partition == {0: 1, 1: 0}
    assert c.table.to_pylist() == [{"partition": 0, "key": "a", "value": 1}]


# -- collect: limit, progress, closing -------------------------------------------------------
def iterators_of(result: iqkit.StateQueryResult) -> list[KeyValueIterator]:
    return [r.result for r in result.partition_results.values() if r.is_success]


@pytest.mark.parametrize("limit", [0, 1, 5, 41])
def test_limit_stops_reading_and_closes_every_iterator(orders, limit):
    with iqkit.open(orders) as engine:
        full = scan(engine, "orders").table
        result = engine.query(request("orders", RangeQuery.with_no_bounds()))
        its = iterators_of(result)
        c = collect(result, engine.manifest("orders"), limit=limit)
    assert c.table.num_rows == limit
    if limit:  # the first `limit` rows (columns of fields not reached are not there)
        assert c.table.select(["partition", "key", "amount"]).to_pylist() == (
            full.slice(0, limit).select(["partition", "key", "amount"]).to_pylist()
        )
    assert c.truncated is True
    assert sum(c.rows_per_partition.values()) == limit
    assert all(it.is_closed for it in its)


def test_a_limit_at_or_above_the_row_count_is_not_truncation(orders):
    with iqkit.open(orders) as engine:
        n = scan(engine, "orders").table.num_rows
        exact = scan(engine, "orders", limit=n)
        above = scan(engine, "orders", limit=n + 10)
    assert exact.table.num_rows == above.table.num_rows == n
    assert exact.truncated is False and above.truncated is False


def test_limit_reached_at_a_partition_end_checks_later_partitions(root):
    rows = [("a", 1, {"partition": 0}), ("b", 2, {"partition": 0}), ("c", 3, {"partition": 2})]
    write_store(root, "x", rows, partitions=3, partitioner="explicit")
    with iqkit.open(root) as engine:
        two = scan(engine, "x", limit=2)
        engine_rows = kv_rows(engine, "x")
    assert two.table.num_rows == 2 and two.truncated is True  # "c" in partition 2 was left
    assert two.rows_per_partition == {0: 2, 1: 0, 2: 0}  # 1: never written, empty
    assert len(engine_rows) == 3


def test_limit_applies_to_multi_key_results(orders):
    query = MultiKeyQuery.with_keys([f"o{i:03d}" for i in range(10)])
    with iqkit.open(orders) as engine:
        c = collect(engine.query(request("orders", query)), engine.manifest("orders"),
                    query=query, limit=4)  # fmt: skip
    assert c.table.num_rows == 4 and c.truncated is True


def test_progress_reports_growing_counts(root):
    write_store(root, "big", [(f"k{i:05d}", i) for i in range(10_000)], partitions=2,
                value_serde="int64")  # fmt: skip
    seen: list[int] = []
    with iqkit.open(root) as engine:
        c = scan(engine, "big", progress=seen.append)
    assert len(seen) >= 10_000 // tables.PROGRESS_ROWS
    assert seen == sorted(seen) and seen[-1] == c.table.num_rows == 10_000


def test_an_interrupt_while_reading_closes_every_iterator(root):
    write_store(root, "big", [(f"k{i:05d}", i) for i in range(10_000)], partitions=3,
                value_serde="int64")  # fmt: skip

    def interrupt(rows: int) -> None:
        raise KeyboardInterrupt

    with iqkit.open(root) as engine:
        result = engine.query(request("big", RangeQuery.with_no_bounds()))
        its = iterators_of(result)
        with pytest.raises(KeyboardInterrupt):
            collect(result, engine.manifest("big"), progress=interrupt)
    assert len(its) == 3 and all(it.is_closed for it in its)


def test_bad_limit_is_rejected(orders):
    with iqkit.open(orders) as engine, pytest.raises(ValueError, match="limit"):
        scan(engine, "orders", limit=-1)


def test_to_pandas_keeps_ints_with_nulls_as_ints(orders):
    with iqkit.open(orders) as engine:
        df = to_pandas(scan(engine, "orders", PrefixScanQuery.with_prefix("o")).table)
    assert str(df["partition"].dtype) == "Int32" and str(df["amount"].dtype) == "Int64"
    assert df["coupon"].notna().sum() == 1
    assert df.loc[df["key"] == "o901", "city"].isna().all()


# -- store_batches -------------------------------------------------------------------------
def test_store_batches_streams_the_whole_store_in_bounded_batches(orders):
    with iqkit.open(orders) as engine:
        reader = store_batches(engine, "orders", batch_size=7)
        batches = list(reader)
        full = scan(engine, "orders").table
    assert [b.num_rows for b in batches[:-1]] == [7] * (len(batches) - 1)
    assert 0 < batches[-1].num_rows <= 7
    assert all(b.schema == reader.schema for b in batches)
    streamed = pa.Table.from_batches(batches)
    assert streamed.to_pylist() == full.to_pylist()


def test_store_batches_of_a_window_store_cover_all_time(root):
    rows = [("a", 1, {"window_start": -5_000}), ("b", 2, {"window_start": 2**50})]
    write_store(root, "w", rows, partitions=1, kind="window", window_size_ms=10,
                value_serde="int64")  # fmt: skip
    with iqkit.open(root) as engine:
        t = store_batches(engine, "w").read_all()
    assert t.schema.names == ["partition", "key", "window_start", "window_end", "value"]
    assert t["window_start"].cast(pa.int64()).to_pylist() == [-5_000, 2**50]
    assert t["value"].to_pylist() == [1, 2]


def test_store_batches_partition_subset_and_bad_arguments(orders):
    with iqkit.open(orders) as engine:
        only = store_batches(engine, "orders", partitions=[2]).read_all()
        expected = [k for p, k, _ in kv_rows(engine, "orders") if p == 2]
        with pytest.raises(ValueError, match="partition 4"):
            store_batches(engine, "orders", partitions=[1, 4])
        with pytest.raises(ValueError, match="batch_size"):
            store_batches(engine, "orders", batch_size=0)
        with pytest.raises(ValueError, match="sample_rows"):
            store_batches(engine, "orders", sample_rows=0)
        with pytest.raises(iqkit.UnknownStoreError, match="did you mean 'orders'"):
            store_batches(engine, "order")
    assert set(only["partition"].to_pylist()) == {2}
    assert only["key"].to_pylist() == expected


def test_store_batches_skips_empty_partitions_and_raises_on_broken_ones(root):
    rows = [("a", 1, {"partition": 0}), ("b", 2, {"partition": 2})]
    write_store(root, "x", rows, partitions=3, partitioner="explicit")
    with iqkit.open(root) as engine:
        assert store_batches(engine, "x").read_all()["key"].to_pylist() == ["a", "b"]
    break_partition(root, "x", 2)
    with iqkit.open(root) as engine:
        with pytest.raises(iqkit.IqkitError, match=r"partition 2 failed \(STORE_EXCEPTION\)"):
            store_batches(engine, "x")
        # the healthy partitions can still be scanned on their own
        assert store_batches(engine, "x", partitions=[0, 1]).read_all().num_rows == 1


def test_the_sample_covers_the_start_of_every_partition(root):
    rows = [(f"k{i}", {"n": i}, {"partition": 0}) for i in range(4)]
    rows.append(("z", {"n": 9, "extra": "x"}, {"partition": 1}))
    write_store(root, "s", rows, partitions=2, partitioner="explicit")
    with iqkit.open(root) as engine:
        t = store_batches(engine, "s", batch_size=2, sample_rows=1).read_all()
    assert t.schema.names == ["partition", "key", "n", "extra"]
    assert t["extra"].to_pylist() == [None] * 4 + ["x"]


def test_a_field_missing_from_the_inferred_schema_is_an_error_not_a_silent_drop(root):
    rows = [(f"k{i}", {"n": i}) for i in range(4)]
    rows.append(("z", {"n": 9, "extra": "x"}))
    write_store(root, "s", rows, partitions=1)
    with iqkit.open(root) as engine:
        # A twin's schema comes from the whole file: 'extra' is in it, null where absent.
        whole = store_batches(engine, "s", batch_size=4, sample_rows=4).read_all()
        assert whole.schema.names == ["partition", "key", "n", "extra"]
        assert whole["extra"].to_pylist() == [None] * 4 + ["x"]
        with twin_scans(False), pytest.raises(  # RocksDB's schema comes from a sample of rows
            iqkit.IqkitError, match=r"store 's' partition 0: field 'extra' is not in the schema"
        ):
            store_batches(engine, "s", batch_size=4, sample_rows=4).read_all()
        explicit = pa.schema(
            [("partition", pa.int32()), ("key", pa.string()), ("n", pa.float64()),
             ("extra", pa.string())]
        )  # fmt: skip
        t = store_batches(engine, "s", batch_size=4, schema=explicit).read_all()
        with pytest.raises(iqkit.IqkitError, match="field 'extra' is not in the given schema"):
            store_batches(engine, "s", schema=explicit.remove(3)).read_all()
    assert t.schema == explicit
    assert t["extra"].to_pylist() == [None] * 4 + ["x"]
    assert t["n"].to_pylist() == [0.0, 1.0, 2.0, 3.0, 9.0]


def test_later_batches_are_conformed_to_the_first(root):
    rows = [(f"k{i}", {"n": i, "opt": None, "mixed": i if i else "zero"}) for i in range(3)]
    rows += [("k3", {"n": 3, "opt": "text", "mixed": "s"}), ("k4", {"n": 4, "opt": 5})]
    write_store(root, "s", rows, partitions=1)
    with iqkit.open(root) as engine:
        with twin_scans(False):  # the schema from the first rows read, the rest conformed
            t = store_batches(engine, "s", batch_size=3, sample_rows=3).read_all()
        twin = store_batches(engine, "s", batch_size=3, sample_rows=3).read_all()
        bad = [("k5", {"n": 5.5})]
    # A twin's types come from the whole file: 'opt' holds a string and an int there, so
    # it is JSON text in every row; the other columns are as the conformed ones.
    assert twin.schema == t.schema
    assert twin["opt"].to_pylist() == [None, None, None, '"text"', "5"]
    assert twin.drop_columns(["opt"]).to_pylist() == t.drop_columns(["opt"]).to_pylist()
    assert t.schema.field("opt").type == pa.string()  # only nulls in the first batch
    assert t["opt"].to_pylist() == [None, None, None, "text", "5"]  # later strings as is
    assert t.schema.field("mixed").type == pa.string()  # JSON text from the first batch
    assert [None if x is None else json.loads(x) for x in t["mixed"].to_pylist()] == [
        "zero",
        1,
        2,
        "s",
        None,
    ]
    assert t["n"].to_pylist() == [0, 1, 2, 3, 4]
    with iqkit.StoreWriter(root, "s") as w:
        for key, value in bad:
            w.put(key, value)
    cast_refused = r"field 'n' holds double but .* says int64"
    with iqkit.open(root) as engine:
        with twin_scans(False), pytest.raises(iqkit.IqkitError, match=cast_refused):
            store_batches(engine, "s", batch_size=3, sample_rows=3).read_all()
        # The twins' first table is the partition's whole chain merged: one type fits all.
        merged = store_batches(engine, "s", batch_size=3, sample_rows=3).read_all()
    assert merged.schema.field("n").type == pa.float64()
    assert merged["n"].to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.5]


def test_store_batches_read_one_version_even_if_commits_land_meanwhile(root):
    write_store(root, "s", [(f"k{i}", i) for i in range(10)], partitions=2)
    with iqkit.open(root) as engine:
        reader = store_batches(engine, "s", batch_size=2)
        first = reader.read_next_batch()
        with iqkit.StoreWriter(root, "s") as w:
            for i in range(10, 20):
                w.put(f"k{i}", i)
        rest = reader.read_all()
        assert store_batches(engine, "s").read_all().num_rows == 20
    assert first.num_rows + rest.num_rows == 10


def test_closing_the_engine_mid_scan_is_an_error_not_a_short_scan(orders):
    engine = iqkit.open(orders)
    reader = store_batches(engine, "orders", batch_size=2)
    reader.read_next_batch()
    engine.close()
    with pytest.raises(iqkit.IqkitError, match="closed"):
        reader.read_all()


def test_duckdb_reads_the_stream(orders):
    with iqkit.open(orders) as engine:
        reader = store_batches(engine, "orders", batch_size=5)
        expected = sum(v.get("amount", 0) for _, _, v in kv_rows(engine, "orders"))
        con = duckdb.connect()
        con.register("orders", reader)
        total, n = con.execute("SELECT sum(amount), count(*) FROM orders").fetchone()
    assert total == expected and n == 42
