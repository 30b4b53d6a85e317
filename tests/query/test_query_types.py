"""The query types: factories, validation, builders returning copies, value semantics."""

from __future__ import annotations

import copy
import pickle
from datetime import UTC, datetime, timedelta, timezone

import pytest

from iqkit.query import (
    KeyQuery,
    MultiKeyQuery,
    PrefixScanQuery,
    Query,
    RangeQuery,
    RawKeyQuery,
    RawScanQuery,
    ResultOrder,
    WindowKeyQuery,
    WindowRangeQuery,
    to_epoch_millis,
)

ALL_QUERIES = [
    KeyQuery.with_key("a"),
    MultiKeyQuery.with_keys(["a", "b"]),
    RangeQuery.with_range(1, 5),
    PrefixScanQuery.with_prefix("ab"),
    WindowKeyQuery.with_key_and_window_start_range("k", 0, 10),
    WindowRangeQuery.with_window_start_range(0, 10),
    RawKeyQuery.with_key(b"k"),
    RawScanQuery.scan(),
]


# -- shared value semantics ---------------------------------------------------------------


@pytest.mark.parametrize("query", ALL_QUERIES, ids=lambda q: type(q).__name__)
def test_queries_are_immutable(query):
    before = repr(query)
    for name in ("key", "_key", "_order", "result_order", "anything"):
        with pytest.raises(AttributeError):
            setattr(query, name, "x")
    with pytest.raises(AttributeError):
        del query.anything
    assert repr(query) == before


@pytest.mark.parametrize("query", ALL_QUERIES, ids=lambda q: type(q).__name__)
def test_queries_are_values(query):
    assert isinstance(query, Query)
    twin = copy.copy(query)
    assert twin == query
    assert hash(twin) == hash(query)
    assert pickle.loads(pickle.dumps(query)) == query
    assert copy.deepcopy(query) == query
    others = [q for q in ALL_QUERIES if type(q) is not type(query)]
    assert all(query != other for other in others)


@pytest.mark.parametrize(
    "cls",
    [KeyQuery, MultiKeyQuery, RangeQuery, PrefixScanQuery, WindowKeyQuery, WindowRangeQuery,
     RawKeyQuery, RawScanQuery],
)  # fmt: skip
def test_constructors_point_to_factories(cls):
    with pytest.raises(TypeError, match=rf"{cls.__name__}\.\w+\("):
        cls()


def test_custom_queries_can_subclass_query():
    class CountQuery(Query[int]):
        pass

    assert isinstance(CountQuery(), Query)


def test_query_equality_is_by_type_and_fields():
    assert KeyQuery.with_key("a") == KeyQuery.with_key("a")
    assert KeyQuery.with_key("a") != KeyQuery.with_key("b")
    assert KeyQuery.with_key("a") != KeyQuery.with_key("a").skip_cache()
    assert KeyQuery.with_key(b"a") != RawKeyQuery.with_key(b"a")
    assert RawScanQuery.scan() == RawScanQuery.scan()
    assert len({KeyQuery.with_key("a"), KeyQuery.with_key("a"), KeyQuery.with_key("b")}) == 2


def test_unhashable_key_makes_query_unhashable_but_comparable():
    q = KeyQuery.with_key([1, 2])
    assert q == KeyQuery.with_key([1, 2])
    with pytest.raises(TypeError):
        hash(q)


# -- KeyQuery / MultiKeyQuery -------------------------------------------------------------


def test_key_query():
    q = KeyQuery.with_key("a")
    assert q.key == "a"
    assert not q.is_skip_cache
    assert repr(q) == "KeyQuery(key='a')"
    s = q.skip_cache()
    assert s is not q
    assert s.is_skip_cache and s.key == "a"
    assert not q.is_skip_cache
    assert repr(s) == "KeyQuery(key='a', skip_cache=True)"


def test_falsy_keys_are_fine():
    assert KeyQuery.with_key(0).key == 0
    assert KeyQuery.with_key("").key == ""


@pytest.mark.parametrize(
    "make",
    [
        lambda: KeyQuery.with_key(None),
        lambda: MultiKeyQuery.with_keys(["a", None]),
        lambda: MultiKeyQuery.with_keys(None),
        lambda: WindowKeyQuery.with_key_and_window_start_range(None, 0, 1),
        lambda: RawKeyQuery.with_key(None),
        lambda: PrefixScanQuery.with_prefix(None),
    ],
)
def test_none_key_is_value_error(make):
    with pytest.raises(ValueError, match="must not be None"):
        make()


def test_multi_key_query():
    q = MultiKeyQuery.with_keys(k for k in ["b", "a", "b", "c", "a"])
    assert q.keys == ("b", "a", "c")
    assert not q.is_skip_cache
    assert repr(q) == "MultiKeyQuery(keys=('b', 'a', 'c'))"
    s = q.skip_cache()
    assert s.is_skip_cache and not q.is_skip_cache
    assert s.keys == q.keys
    assert repr(s) == "MultiKeyQuery(keys=('b', 'a', 'c'), skip_cache=True)"


def test_multi_key_query_empty_and_unhashable_keys():
    assert MultiKeyQuery.with_keys([]).keys == ()
    assert MultiKeyQuery.with_keys([[1], [1], [2]]).keys == ([1], [2])


def test_multi_key_query_copies_the_input():
    keys = ["a"]
    q = MultiKeyQuery.with_keys(keys)
    keys.append("b")
    assert q.keys == ("a",)


def test_multi_key_query_none_error_says_where():
    with pytest.raises(ValueError, match="index 1"):
        MultiKeyQuery.with_keys(["a", None])


@pytest.mark.parametrize("keys", ["abc", b"abc", 5])
def test_multi_key_query_refuses_single_values(keys):
    with pytest.raises(TypeError):
        MultiKeyQuery.with_keys(keys)


def test_multi_key_str_error_suggests_the_fix():
    with pytest.raises(TypeError, match=r"with_keys\(\['ab'\]\)"):
        MultiKeyQuery.with_keys("ab")


# -- RangeQuery ---------------------------------------------------------------------------


def test_range_query_factories():
    q = RangeQuery.with_range(1, 5)
    assert (q.lower_bound, q.upper_bound, q.result_order) == (1, 5, ResultOrder.ANY)
    assert RangeQuery.with_lower_bound(3).lower_bound == 3
    assert RangeQuery.with_lower_bound(3).upper_bound is None
    assert RangeQuery.with_upper_bound(3).lower_bound is None
    assert RangeQuery.with_upper_bound(3).upper_bound == 3
    n = RangeQuery.with_no_bounds()
    assert (n.lower_bound, n.upper_bound, n.result_order) == (None, None, ResultOrder.ANY)
    assert RangeQuery.with_range(None, None) == n
    assert RangeQuery.with_range(5, 1).lower_bound == 5  # lo > hi is allowed


def test_range_query_repr():
    assert repr(RangeQuery.with_range("a", "c")) == "RangeQuery(lower='a', upper='c', order=ANY)"
    assert (
        repr(RangeQuery.with_lower_bound(1).with_descending_keys())
        == "RangeQuery(lower=1, upper=None, order=DESCENDING)"
    )


def test_range_query_order_builders_return_copies():
    q = RangeQuery.with_range(1, 5)
    d = q.with_descending_keys()
    a = d.with_ascending_keys()
    assert q.result_order is ResultOrder.ANY
    assert d.result_order is ResultOrder.DESCENDING
    assert a.result_order is ResultOrder.ASCENDING
    assert d is not q and a is not d
    assert (d.lower_bound, d.upper_bound) == (1, 5)
    assert q != d != a != q


def test_range_bound_methods_on_a_query_keep_the_rest():
    q = RangeQuery.with_lower_bound(1).with_descending_keys()
    both = q.with_upper_bound(5)
    assert (both.lower_bound, both.upper_bound, both.result_order) == (
        1, 5, ResultOrder.DESCENDING,
    )  # fmt: skip
    assert q.upper_bound is None
    moved = both.with_lower_bound(2)
    assert (moved.lower_bound, moved.upper_bound) == (2, 5)
    assert both.with_range(7, 8) == RangeQuery.with_range(7, 8).with_descending_keys()
    cleared = both.with_no_bounds()
    assert (cleared.lower_bound, cleared.upper_bound, cleared.result_order) == (
        None, None, ResultOrder.DESCENDING,
    )  # fmt: skip


def test_range_factory_methods_are_documented():
    assert RangeQuery.with_lower_bound.__name__ == "with_lower_bound"
    assert "inclusive" in RangeQuery.with_lower_bound.__doc__
    assert RangeQuery.with_range.__qualname__ == "RangeQuery.with_range"


# -- PrefixScanQuery ----------------------------------------------------------------------


def test_prefix_scan_query():
    q = PrefixScanQuery.with_prefix("ab")
    assert q.prefix == "ab"
    assert q.prefix_serde is None
    assert q.result_order is ResultOrder.ANY
    assert repr(q) == "PrefixScanQuery(prefix='ab', order=ANY)"
    s = PrefixScanQuery.with_prefix("ab", serde="string")
    assert s.prefix_serde == "string"
    assert repr(s.with_descending_keys()) == (
        "PrefixScanQuery(prefix='ab', serde='string', order=DESCENDING)"
    )
    assert s != q
    assert PrefixScanQuery.with_prefix(("eu",)).prefix == ("eu",)
    assert PrefixScanQuery.with_prefix("").prefix == ""


def test_prefix_scan_order_builders():
    q = PrefixScanQuery.with_prefix("ab", "string")
    d = q.with_descending_keys()
    assert d.result_order is ResultOrder.DESCENDING
    assert d.with_ascending_keys().result_order is ResultOrder.ASCENDING
    assert q.result_order is ResultOrder.ANY
    assert d.prefix_serde == "string" and d.prefix == "ab"


def test_prefix_serde_must_be_a_name():
    with pytest.raises(TypeError):
        PrefixScanQuery.with_prefix("ab", serde=object())


# -- window queries -----------------------------------------------------------------------


def test_window_key_query():
    q = WindowKeyQuery.with_key_and_window_start_range("k", 1000, 5000)
    assert (q.key, q.time_from, q.time_to) == ("k", 1000, 5000)
    assert q.result_order is ResultOrder.ASCENDING
    assert repr(q) == "WindowKeyQuery(key='k', time_from=1000, time_to=5000, order=ASCENDING)"
    d = q.with_descending_keys()
    assert d.result_order is ResultOrder.DESCENDING and q.result_order is ResultOrder.ASCENDING
    assert d.with_ascending_keys() == q
    assert (d.key, d.time_from, d.time_to) == ("k", 1000, 5000)


def test_window_range_query():
    q = WindowRangeQuery.with_window_start_range(0, 10)
    assert (q.time_from, q.time_to, q.result_order) == (0, 10, ResultOrder.ASCENDING)
    assert repr(q) == "WindowRangeQuery(time_from=0, time_to=10, order=ASCENDING)"
    d = q.with_descending_keys()
    assert repr(d) == "WindowRangeQuery(time_from=0, time_to=10, order=DESCENDING)"
    assert q.result_order is ResultOrder.ASCENDING


def test_window_times_accept_datetimes():
    naive = datetime(2024, 1, 1)
    aware = datetime(2024, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))
    q = WindowRangeQuery.with_window_start_range(naive, aware)
    assert q.time_from == 1_704_067_200_000
    assert q.time_to == 1_704_067_200_000  # 01:00+01:00 is midnight UTC
    k = WindowKeyQuery.with_key_and_window_start_range(
        "k", datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 1, 0, 0, 1, 999, tzinfo=UTC)
    )
    assert (k.time_from, k.time_to) == (1_704_067_200_000, 1_704_067_201_000)


def test_to_epoch_millis():
    assert to_epoch_millis(5) == 5
    assert to_epoch_millis(-5) == -5
    assert to_epoch_millis(datetime(1970, 1, 1)) == 0
    assert to_epoch_millis(datetime(1969, 12, 31, 23, 59, 59, 999_500)) == -1
    big = datetime(2262, 4, 11, 23, 47, 16, 854_775)
    assert to_epoch_millis(big) == 9_223_372_036_854
    for bad in (1.5, "2024-01-01", True, datetime(2024, 1, 1).date()):
        with pytest.raises(TypeError):
            to_epoch_millis(bad)
    with pytest.raises(ValueError):
        to_epoch_millis(None)


def test_window_times_from_after_to_is_allowed():
    q = WindowRangeQuery.with_window_start_range(10, 0)
    assert (q.time_from, q.time_to) == (10, 0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: WindowRangeQuery.with_window_start_range(None, 1),
        lambda: WindowRangeQuery.with_window_start_range(0, None),
        lambda: WindowKeyQuery.with_key_and_window_start_range("k", None, 1),
        lambda: WindowKeyQuery.with_key_and_window_start_range("k", 0, None),
    ],
)
def test_window_times_must_not_be_none(make):
    with pytest.raises(ValueError, match=r"time_(from|to) must not be None"):
        make()


def test_window_times_must_be_int_or_datetime():
    with pytest.raises(TypeError):
        WindowRangeQuery.with_window_start_range(0.5, 1)
    with pytest.raises(TypeError):
        WindowKeyQuery.with_key_and_window_start_range("k", 0, "tomorrow")


# -- raw queries --------------------------------------------------------------------------


def test_raw_key_query():
    q = RawKeyQuery.with_key(b"\x00k")
    assert q.key == b"\x00k"
    assert repr(q) == "RawKeyQuery(key=b'\\x00k')"
    buf = bytearray(b"ab")
    copied = RawKeyQuery.with_key(buf)
    buf[0] = ord("z")
    assert copied.key == b"ab"
    assert type(copied.key) is bytes
    assert RawKeyQuery.with_key(memoryview(b"ab")) == RawKeyQuery.with_key(b"ab")


@pytest.mark.parametrize("key", ["ab", 1, ["a"]])
def test_raw_key_query_requires_bytes(key):
    with pytest.raises(TypeError, match="bytes"):
        RawKeyQuery.with_key(key)


def test_raw_scan_query():
    q = RawScanQuery.scan()
    assert repr(q) == "RawScanQuery()"
    assert q is not RawScanQuery.scan()
    assert q == RawScanQuery.scan()
