"""The read options of ``format("iqkit")``, checked and planned without a Spark session."""

from __future__ import annotations

import pytest

from iqkit import KeyQuery, MultiKeyQuery, PrefixScanQuery, RangeQuery, WindowKeyQuery
from iqkit.query import WindowRangeQuery
from iqkit.spark.read_spec import ReadSpec, parse_read_options
from iqkit.store.encoding.partitioners import murmur2_partition
from iqkit.store.encoding.serdes import get_serde
from iqkit.store.manifest import StoreManifest


def manifest(**settings) -> StoreManifest:
    base = {
        "name": "t",
        "partitions": 4,
        "kind": "kv",
        "key_serde": "string",
        "value_serde": "json",
        "partitioner": "murmur2",
    }
    base.update(settings)
    return StoreManifest(**base)


def test_no_options_read_every_partition_with_a_full_range():
    spec = parse_read_options({"store": "t", "path": "/r"}, manifest())
    assert spec == ReadSpec()
    assert spec.plan(manifest()) == [(p, None) for p in range(4)]
    assert repr(spec.queries("kv", None)) == repr([RangeQuery.with_no_bounds()])


def test_keys_are_routed_to_their_murmur2_owners_only():
    m = manifest()
    spec = parse_read_options({"keys": '["a", "b", "c", "a"]'}, m)
    assert spec.keys == ("a", "b", "c")  # duplicates dropped, order kept
    owners: dict[int, list[str]] = {}
    for k in ("a", "b", "c"):
        owners.setdefault(murmur2_partition(k.encode(), 4), []).append(k)
    assert dict(spec.plan(m)) == {p: tuple(ks) for p, ks in owners.items()}
    one = next(ks for _, ks in spec.plan(m))
    queries = spec.queries("kv", one)
    assert isinstance(queries[0], KeyQuery if len(one) == 1 else MultiKeyQuery)


def test_explicit_stores_look_keys_up_everywhere():
    m = manifest(partitioner="explicit")
    spec = parse_read_options({"key": "a", "partitions": "1-2"}, m)
    assert spec.plan(m) == [(1, ("a",)), (2, ("a",))]


def test_keys_are_typed_by_the_key_serde():
    assert parse_read_options({"key": "42"}, manifest(key_serde="int64")).keys == (42,)
    assert parse_read_options({"key": "0x0a"}, manifest(key_serde="bytes")).keys == (b"\n",)
    ordered = manifest(key_serde="ordered")
    assert parse_read_options({"key": '["eu", 5]'}, ordered).keys == (("eu", 5),)
    assert parse_read_options({"prefix": '["eu"]'}, ordered).prefix == ("eu",)
    assert parse_read_options({"keys": '[["eu", 5], ["us", 1]]'}, ordered).keys == (
        ("eu", 5),
        ("us", 1),
    )
    # json keys may be lists (unhashable); bare words are strings
    js = manifest(key_serde="json")
    assert parse_read_options({"keys": "[[1, 2], [1, 2], 3]"}, js).keys == ([1, 2], 3)
    assert parse_read_options({"key": "alice"}, js).keys == ("alice",)


def test_window_options_make_window_queries():
    m = manifest(kind="window", window_size_ms=1000)
    spec = parse_read_options(
        {"key": "a", "time_from": "1000", "time_to": "1970-01-01T00:00:02"}, m
    )
    assert repr(spec.queries("window", ("a",))) == repr(
        [WindowKeyQuery.with_key_and_window_start_range("a", 1000, 2000)]
    )
    whole = parse_read_options({}, m).queries("window", None)
    assert isinstance(whole[0], WindowRangeQuery)
    assert repr(parse_read_options({"prefix": "x"}, manifest()).queries("kv", None)) == repr(
        [PrefixScanQuery.with_prefix("x")]
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"prefx": "a"}, r"unknown read option\(s\) 'prefx'"),
        ({"key": "a", "keys": '["b"]'}, r"give option 'key' or 'keys', not both"),
        ({"key": "a", "key_to": "b"}, r"'key_to' cannot be combined with a key lookup"),
        ({"prefix": "a", "key_from": "b"}, r"'prefix' or 'key_from'/'key_to', not both"),
        ({"partitions": "4"}, r"'4' is outside store 't'.s partitions 0-3"),
        ({"partitions": "x"}, r"takes numbers and ranges like '0,2'"),
        ({"keys": "[]"}, r"'keys' takes a non-empty JSON array"),
        ({"keys": "[1]"}, r"1 is not a string key"),
        ({"time_from": "0"}, r"'time_from' does not apply to store 't' \(kv store\)"),
    ],
)
def test_bad_options_are_one_clear_error(options, message):
    with pytest.raises(ValueError, match=message):
        parse_read_options(options, manifest())


def test_ranges_need_an_order_preserving_key_serde():
    with pytest.raises(ValueError, match=r"'int32' keys \(negative numbers sort after"):
        parse_read_options({"key_from": "1"}, manifest(key_serde="int32"))
    spec = parse_read_options({"key_from": "-5"}, manifest(key_serde="ordered"))
    assert spec.key_from == -5
    assert get_serde("ordered").order_preserving
