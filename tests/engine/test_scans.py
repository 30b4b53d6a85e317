"""Range (KIP-805/617), prefix (KIP-614), window and raw queries on real RocksDB."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from helpers import request, rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iqkit
from iqkit import PrefixScanQuery, RangeQuery, ResultOrder, Windowed
from iqkit.errors import EngineClosedError


def one_partition_store(root, name, items, **kwargs):
    iqkit.create_store(root, name, partitions=1, **kwargs)
    with iqkit.StoreWriter(root, name) as w:
        for k, v in items:
            w.put(k, v)


def scan(engine, store, query, partition=0):
    return rows(
        engine.query(request(store, query).with_partitions({partition})).partition_results[
            partition
        ]
    )


# -- ranges ----------------------------------------------------------------------------------
@pytest.fixture
def letters(root):
    one_partition_store(root, "letters", [(c, ord(c)) for c in "abcdefgh"])
    return root


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (RangeQuery.with_range("b", "d"), "bcd"),
        (RangeQuery.with_range("b", "d").with_descending_keys(), "dcb"),
        (RangeQuery.with_lower_bound("f"), "fgh"),
        (RangeQuery.with_lower_bound("f").with_descending_keys(), "hgf"),
        (RangeQuery.with_upper_bound("c"), "abc"),
        (RangeQuery.with_upper_bound("c").with_descending_keys(), "cba"),
        (RangeQuery.with_no_bounds(), "abcdefgh"),
        (RangeQuery.with_no_bounds().with_descending_keys(), "hgfedcba"),
        (RangeQuery.with_range("bb", "dd"), "cd"),
        (RangeQuery.with_range("d", "b"), ""),  # lo > hi: empty success
        (RangeQuery.with_range("x", "z"), ""),
        (RangeQuery.with_range("c", "c"), "c"),
        (RangeQuery.with_range("b", "d").with_descending_keys().with_ascending_keys(), "bcd"),
    ],
)
def test_range_queries(letters, query, expected, open_engine):
    with open_engine(letters) as engine:
        assert "".join(k for k, _ in scan(engine, "letters", query)) == expected


def test_range_order_is_by_serialized_bytes_within_a_partition(root, open_engine):
    # int32 big-endian: negative numbers serialize above positive ones (Kafka's order)
    one_partition_store(
        root, "ints", [(i, i) for i in (-2, -1, 0, 1, 2)], key_serde="int32", value_serde="int32"
    )
    # ordered serde: byte order is value order, negatives included
    one_partition_store(
        root, "ord", [(i, i) for i in (-2, -1, 0, 1, 2)], key_serde="ordered", value_serde="int32"
    )
    with open_engine(root) as engine:
        assert [k for k, _ in scan(engine, "ints", RangeQuery.with_no_bounds())] == [
            0,
            1,
            2,
            -2,
            -1,
        ]
        assert [k for k, _ in scan(engine, "ord", RangeQuery.with_no_bounds())] == [-2, -1, 0, 1, 2]
        assert [
            k for k, _ in scan(engine, "ord", RangeQuery.with_range(-1, 1).with_descending_keys())
        ] == [1, 0, -1]


KEYS = st.binary(min_size=0, max_size=4)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    keys=st.sets(KEYS, min_size=0, max_size=40),
    lo=st.none() | KEYS,
    hi=st.none() | KEYS,
    descending=st.booleans(),
)
def test_range_matches_a_sorted_model(tmp_path_factory, keys, lo, hi, descending, open_engine):
    root = tmp_path_factory.mktemp("model")
    one_partition_store(
        root, "b", [(k, k.hex()) for k in keys], key_serde="bytes", value_serde="string"
    )
    expected = sorted(k for k in keys if (lo is None or k >= lo) and (hi is None or k <= hi))
    if descending:
        expected.reverse()
    query = RangeQuery.with_range(lo, hi)
    if descending:
        query = query.with_descending_keys()
    with open_engine(root) as engine:
        got = [] if not keys else [k for k, _ in scan(engine, "b", query)]
    assert got == expected


# -- prefix scans (KIP-614) -----------------------------------------------------------------
def test_prefix_scan_over_uuid_string_keys(root, open_engine):
    ids = sorted(str(uuid.UUID(int=i * 0x1234567890ABCDEF1234567 + 7)) for i in range(300))
    one_partition_store(root, "sessions", [(u, n) for n, u in enumerate(ids)])
    prefix = ids[17][:3]
    with open_engine(root) as engine:
        got = scan(engine, "sessions", PrefixScanQuery.with_prefix(prefix))
        desc = scan(engine, "sessions", PrefixScanQuery.with_prefix(prefix).with_descending_keys())
        none = scan(engine, "sessions", PrefixScanQuery.with_prefix("zzz"))
    expected = [u for u in ids if u.startswith(prefix)]
    assert [k for k, _ in got] == expected
    assert [k for k, _ in desc] == expected[::-1]
    assert none == []


def test_prefix_scan_with_a_prefix_serde_differing_from_the_key_serde(root, open_engine):
    # KIP-614's example: keys are UUIDs as bytes, the prefix is a string serialized
    # with the string serde.
    keys = [b"abc-" + uuid.UUID(int=i).bytes for i in range(5)] + [b"abd-1", b"ab"]
    one_partition_store(
        root, "raw", [(k, len(k)) for k in keys], key_serde="bytes", value_serde="int32"
    )
    with open_engine(root) as engine:
        got = scan(engine, "raw", PrefixScanQuery.with_prefix("abc-", serde="string"))
        with pytest.raises(TypeError, match="raw"):
            scan(engine, "raw", PrefixScanQuery.with_prefix("abc-"))  # bytes serde refuses str
    assert sorted(k for k, _ in got) == sorted(keys[:5])


def test_prefix_scan_of_composite_keys_uses_shorter_tuples(root, open_engine):
    items = [
        ((region, user), n)
        for n, (region, user) in enumerate(
            [("eu", "ann"), ("eu", "bob"), ("us", "cat"), ("eu", "cy"), ("us", "ann"), ("e", "zed")]
        )
    ]
    one_partition_store(root, "ck", items, key_serde="ordered", value_serde="int32")
    with open_engine(root) as engine:
        eu = [k for k, _ in scan(engine, "ck", PrefixScanQuery.with_prefix(("eu",)))]
        eu_desc = [
            k
            for k, _ in scan(
                engine, "ck", PrefixScanQuery.with_prefix(("eu",)).with_descending_keys()
            )
        ]
        exact = [k for k, _ in scan(engine, "ck", PrefixScanQuery.with_prefix(("us", "cat")))]
    assert eu == [("eu", "ann"), ("eu", "bob"), ("eu", "cy")]  # ('e', 'zed') is not under ('eu',)
    assert eu_desc == eu[::-1]
    assert exact == [("us", "cat")]


def test_prefix_of_ff_bytes_has_no_upper_bound_problem(root, open_engine):
    keys = [b"\xff", b"\xff\xff", b"\xff\xff\x00", b"\xfe", b"\x00"]
    one_partition_store(root, "ff", [(k, 1) for k in keys], key_serde="bytes", value_serde="int32")
    with open_engine(root) as engine:
        got = [k for k, _ in scan(engine, "ff", PrefixScanQuery.with_prefix(b"\xff\xff"))]
        everything = [k for k, _ in scan(engine, "ff", PrefixScanQuery.with_prefix(b""))]
    assert got == [b"\xff\xff", b"\xff\xff\x00"]
    assert everything == sorted(keys)


def test_prefix_scan_reads_only_the_prefix_range(root, open_engine):
    """A prefix scan is a bounded iterator: it yields exactly the prefix's rows, and the
    trace shows the bounds, not a full scan."""
    one_partition_store(
        root, "many", [(f"{g:03d}-{i:04d}", i) for g in range(20) for i in range(50)]
    )
    with open_engine(root) as engine:
        r = engine.query(
            request("many", PrefixScanQuery.with_prefix("007-")).enable_execution_info()
        )
        qr = r.partition_results[0]
        got = rows(qr)
    assert len(got) == 50 and all(k.startswith("007-") for k, _ in got)
    first = qr.execution_info[0]
    assert (b"\x01007-").hex() in first and (b"\x01007.").hex() in first


# -- windows ---------------------------------------------------------------------------------
@pytest.fixture
def windows(root):
    iqkit.create_store(root, "clicks", partitions=2, kind="window", window_size_ms=60_000)
    with iqkit.StoreWriter(root, "clicks") as w:
        for user in ("ann", "bob", "ann\x00x"):
            for minute in range(5):
                w.put(user, minute * 10 + len(user), window_start=minute * 60_000)
    return root


def window_rows(engine, query):
    out = []
    r = engine.query(request("clicks", query))
    for p in sorted(r.partition_results):
        qr = r.partition_results[p]
        if qr.is_success:
            out.extend(rows(qr))
    return out


def test_window_key_query_is_inclusive_and_time_ordered(windows, open_engine):
    q = iqkit.WindowKeyQuery.with_key_and_window_start_range("ann", 60_000, 180_000)
    with open_engine(windows) as engine:
        asc = window_rows(engine, q)
        desc = window_rows(engine, q.with_descending_keys())
    assert [kv[0] for kv in asc] == [
        Windowed("ann", s, s + 60_000) for s in (60_000, 120_000, 180_000)
    ]
    assert [kv[1] for kv in asc] == [13, 23, 33]
    assert [kv[0].start for kv in desc] == [180_000, 120_000, 60_000]  # newest first


def test_window_keys_are_prefix_free(windows, open_engine):
    """'ann' and 'ann\\x00x' share a byte prefix; their windows must not mix."""
    with open_engine(windows) as engine:
        got = window_rows(
            engine, iqkit.WindowKeyQuery.with_key_and_window_start_range("ann", 0, 10**9)
        )
    assert {kv[0].key for kv in got} == {"ann"}
    assert len(got) == 5


def test_window_key_query_accepts_datetimes(windows, open_engine):
    start = datetime(1970, 1, 1, 0, 2, tzinfo=UTC)
    end = datetime(1970, 1, 1, 0, 4, tzinfo=UTC)
    q = iqkit.WindowKeyQuery.with_key_and_window_start_range("bob", start, end)
    with open_engine(windows) as engine:
        assert [kv[0].start for kv in window_rows(engine, q)] == [120_000, 180_000, 240_000]


def test_window_range_query_returns_every_key_in_the_time_range(windows, open_engine):
    q = iqkit.WindowRangeQuery.with_window_start_range(60_000, 120_000)
    with open_engine(windows) as engine:
        asc = window_rows(engine, q)
        r = engine.query(request("clicks", q.with_descending_keys()))
        per_partition_desc = {
            p: [kv[0].start for kv in rows(qr)] for p, qr in r.partition_results.items()
        }
    assert sorted((kv[0].key, kv[0].start) for kv in asc) == sorted(
        (u, s) for u in ("ann", "bob", "ann\x00x") for s in (60_000, 120_000)
    )
    for starts in per_partition_desc.values():
        assert starts == sorted(starts, reverse=True)


def test_window_from_after_to_is_empty_and_deletes_remove_windows(windows, open_engine):
    with iqkit.StoreWriter(windows, "clicks") as w:
        w.delete("bob", window_start=0)
    with open_engine(windows) as engine:
        assert (
            window_rows(engine, iqkit.WindowKeyQuery.with_key_and_window_start_range("bob", 5, 1))
            == []
        )
        bob = window_rows(
            engine, iqkit.WindowKeyQuery.with_key_and_window_start_range("bob", 0, 10**9)
        )
        everything = window_rows(engine, iqkit.WindowRangeQuery.with_window_start_range(0, 0))
    assert [kv[0].start for kv in bob] == [60_000, 120_000, 180_000, 240_000]
    assert sorted(kv[0].key for kv in everything) == ["ann", "ann\x00x"]


# -- raw queries -------------------------------------------------------------------------------
def test_raw_queries_use_serialized_bytes(root, open_engine):
    one_partition_store(root, "r", [(7, 1.5), (9, 2.5)], key_serde="int32", value_serde="double")
    with open_engine(root) as engine:
        got = engine.query(request("r", iqkit.RawKeyQuery.with_key(b"\x00\x00\x00\x07")))
        allrows = scan(engine, "r", iqkit.RawScanQuery.scan())
    assert got.only_partition_result().result == b"?\xf8\x00\x00\x00\x00\x00\x00"
    assert allrows == [
        (b"\x00\x00\x00\x07", b"?\xf8" + bytes(6)),
        (b"\x00\x00\x00\x09", b"@\x04" + bytes(6)),
    ]


# -- iterator lifecycle ----------------------------------------------------------------------------
def test_iterators_are_lazy_and_peekable(letters, open_engine):
    with open_engine(letters) as engine:
        it = (
            engine.query(request("letters", RangeQuery.with_no_bounds()))
            .partition_results[0]
            .result
        )
        assert next(it).key == "a"
        assert it.peek_next_key() == "b"
        assert next(it).key == "b"
        assert [kv.key for kv in it] == list("cdefgh")
        assert it.is_closed  # exhausted iterators close themselves


def test_closing_the_engine_ends_live_iterators(root):
    one_partition_store(root, "big", [(f"k{i:05d}", i) for i in range(20_000)])
    engine = iqkit.open(root)
    it = engine.query(request("big", RangeQuery.with_no_bounds())).partition_results[0].result
    assert next(it).key == "k00000"
    engine.close()  # closes the RocksDB iterator before the database
    with pytest.raises(EngineClosedError, match="engine was closed"):
        list(it)  # never a quietly short result


@pytest.mark.parametrize("started", [False, True], ids=["unread", "half-read"])
def test_a_result_read_after_its_engine_closed_raises(letters, open_engine, started):
    """The mistake ``with iqkit.open(root) as e: result = e.query(...)`` and reading
    ``result`` after the block: one clear error, not an empty or short result."""
    with open_engine(letters) as engine:
        result = engine.query(request("letters", RangeQuery.with_no_bounds()))
        it = result.partition_results[0].result
        if started:
            assert next(it).key == "a"
    with pytest.raises(EngineClosedError, match="closed"):
        list(it)


def test_result_order_reports_the_requested_order():
    assert RangeQuery.with_no_bounds().with_descending_keys().result_order is ResultOrder.DESCENDING
