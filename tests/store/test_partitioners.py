"""murmur2 is byte-exact with Kafka; partitioners by name."""

from __future__ import annotations

import pytest
from helpers import KAFKA_MURMUR2_VECTORS
from hypothesis import given
from hypothesis import strategies as st

from iqkit.store.encoding.partitioners import (
    PARTITIONER_NAMES,
    Partitioner,
    get_partitioner,
    murmur2,
    murmur2_partition,
    to_positive,
)

KAFKA_VECTORS = KAFKA_MURMUR2_VECTORS


def _java_int(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x & 0x80000000 else x


def _java_murmur2(data: bytes) -> int:
    """A line-by-line transliteration of Kafka's ``Utils.murmur2`` with Java ``int``
    semantics (signed bytes, overflowing multiply, ``>>>``), as an independent oracle.
    """
    signed = [b - 256 if b > 127 else b for b in data]  # Java's byte[]
    length = len(signed)
    seed = _java_int(0x9747B28C)
    m = 0x5BD1E995
    r = 24
    h = _java_int(seed ^ length)
    for i in range(length // 4):
        i4 = i * 4
        k = (
            (signed[i4] & 0xFF)
            + ((signed[i4 + 1] & 0xFF) << 8)
            + ((signed[i4 + 2] & 0xFF) << 16)
            + ((signed[i4 + 3] & 0xFF) << 24)
        )
        k = _java_int(k)
        k = _java_int(k * m)
        k = _java_int(k ^ ((k & 0xFFFFFFFF) >> r))  # k >>> r
        k = _java_int(k * m)
        h = _java_int(h * m)
        h = _java_int(h ^ k)
    rem = length % 4
    base = length & ~3
    if rem == 3:
        h = _java_int(h ^ ((signed[base + 2] & 0xFF) << 16))
    if rem >= 2:
        h = _java_int(h ^ ((signed[base + 1] & 0xFF) << 8))
    if rem >= 1:
        h = _java_int(h ^ (signed[base] & 0xFF))
        h = _java_int(h * m)
    h = _java_int(h ^ ((h & 0xFFFFFFFF) >> 13))
    h = _java_int(h * m)
    h = _java_int(h ^ ((h & 0xFFFFFFFF) >> 15))
    return h


@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS)
def test_kafka_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS)
def test_oracle_agrees_with_kafka_vectors(data: bytes, expected: int) -> None:
    assert _java_murmur2(data) == expected  # proves the oracle before it is trusted below


@given(st.binary(max_size=200))
def test_matches_java_transliteration(data: bytes) -> None:
    assert murmur2(data) == _java_murmur2(data)


@given(st.lists(st.integers(min_value=0x80, max_value=0xFF), max_size=11).map(bytes))
def test_high_bytes_in_tail_and_words(data: bytes) -> None:
    # bytes >= 0x80 are negative in Java: the & 0xff handling must match
    assert murmur2(data) == _java_murmur2(data)


def test_empty_and_every_tail_length() -> None:
    assert murmur2(b"") == 275646681
    for n in range(0, 40):
        data = bytes(range(200, 200 + n))
        assert murmur2(data) == _java_murmur2(data), n


def test_result_is_signed_32_bit() -> None:
    values = [murmur2(bytes([i])) for i in range(256)]
    assert all(-(2**31) <= v < 2**31 for v in values)
    assert any(v < 0 for v in values) and any(v > 0 for v in values)


def test_bytes_likes_are_accepted_and_others_rejected() -> None:
    assert murmur2(bytearray(b"foobar")) == -790332482
    assert murmur2(memoryview(b"foobar")) == -790332482
    assert murmur2_partition(bytearray(b"foobar"), 10) == 6
    with pytest.raises(TypeError, match="bytes"):
        murmur2("foobar")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bytes"):
        murmur2_partition(None, 3)  # type: ignore[arg-type]


def test_to_positive_is_kafka_to_positive() -> None:
    assert to_positive(-790332482) == 1357151166
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(2**31)) == 0  # not abs(): Java's abs(MIN_VALUE) overflows
    assert to_positive(5) == 5


# Kafka's default partitioner for keyed records with a String key (StringSerializer,
# UTF-8): toPositive(murmur2(key)) % n. Expected partitions computed from the vectors.
@pytest.mark.parametrize(
    ("key", "num_partitions", "expected"),
    [
        ("foobar", 10, 6),
        ("foobar", 50, 16),
        ("foobar", 1, 0),
        ("21", 7, 3),
        ("21", 50, 40),
        ("a-little-bit-long-string", 12, 8),
        ("a-little-bit-longer-string", 12, 11),
        ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", 12, 5),
        ("abc", 12, 3),
        ("abc", 7, 4),
        # Keys and 12-partition placements published by another Kafka-compatible client.
        ("1039-36302-36840-2-9f138052", 12, 4),
        ("1388-20023-36900-2-c9985f66", 12, 0),
        ("1175-03505-36600-2-126dd9ca", 12, 1),
        ("1011-98208-36480-2-9eef750a", 12, 8),
        ("233-75504-36900-2-609151bd", 12, 10),
        ("1182-07205-22440-2-0ad4507d", 12, 9),
        ("599999", 12, 3),
    ],
)
def test_default_partitioner_for_string_keys(key: str, num_partitions: int, expected: int) -> None:
    key_bytes = key.encode("utf-8")
    assert murmur2_partition(key_bytes, num_partitions) == expected
    assert to_positive(murmur2(key_bytes)) % num_partitions == expected
    assert get_partitioner("murmur2").partition(key_bytes, num_partitions) == expected


def test_partition_within_range() -> None:
    for n in (1, 2, 3, 7, 64, 1000):
        for i in range(200):
            assert 0 <= murmur2_partition(str(i).encode(), n) < n


@pytest.mark.parametrize("bad", [0, -1])
def test_non_positive_partition_count_is_rejected(bad: int) -> None:
    with pytest.raises(ValueError, match="num_partitions"):
        murmur2_partition(b"k", bad)


# --- partitioners by name -------------------------------------------------------------
def test_partitioner_registry() -> None:
    assert PARTITIONER_NAMES == ("murmur2", "explicit", "spark_hash")
    m = get_partitioner("murmur2")
    e = get_partitioner("explicit")
    assert isinstance(m, Partitioner) and isinstance(e, Partitioner)
    assert (m.name, m.routes_keys) == ("murmur2", True)
    assert (e.name, e.routes_keys) == ("explicit", False)
    assert get_partitioner(m) is m
    assert m != e and m == get_partitioner("murmur2")


def test_spark_hash_by_name_alone_asks_every_partition() -> None:
    """A spark_hash store's partitioner needs the key's column types to route; the one
    its name alone gives asks every partition (always right) while the lag rule still
    counts every input partition (Spark shuffled the input by key)."""
    s = get_partitioner("spark_hash")
    assert (s.name, s.routes_keys, s.inputs_feed_every_partition) == ("spark_hash", False, True)
    assert get_partitioner("murmur2").inputs_feed_every_partition
    assert not get_partitioner("explicit").inputs_feed_every_partition
    with pytest.raises(ValueError, match="key schema"):
        s.partition(b"k", 4)


def test_explicit_partitioner_refuses_to_route() -> None:
    with pytest.raises(ValueError, match=r"explicit partitioner: pass partition="):
        get_partitioner("explicit").partition(b"k", 4)


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("murmur", "murmur2"),
        ("Murmur2", "murmur2"),
        ("default", "murmur2"),
        ("explict", "explicit"),
        ("manual", "explicit"),
    ],
)
def test_unknown_partitioner_lists_known(name: str, suggestion: str) -> None:
    with pytest.raises(ValueError) as info:
        get_partitioner(name)
    msg = str(info.value)
    assert msg.startswith(f"unknown partitioner {name!r}; did you mean {suggestion!r}?")
    assert "murmur2" in msg and "explicit" in msg


def test_unknown_partitioner_without_suggestion() -> None:
    with pytest.raises(
        ValueError,
        match=r"^unknown partitioner 'roundrobin' \(known partitioners: "
        r"murmur2, explicit, spark_hash\)$",
    ):
        get_partitioner("roundrobin")
