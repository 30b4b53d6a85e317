"""``murmur2_many`` (numpy, whole columns) is byte-exact with the scalar ``murmur2``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from helpers import KAFKA_MURMUR2_VECTORS
from hypothesis import given, settings
from hypothesis import strategies as st

from iqkit.store.encoding.partitioners import (
    get_partitioner,
    key_buffers,
    murmur2,
    murmur2_many,
    murmur2_partition,
    murmur2_partition_many,
)

# Kafka's UtilsTest.testMurmur2 vectors, all in one column.
# No deadline: the first call pays numpy/pyarrow warm-up, and the machine is shared.
relaxed = settings(deadline=None)

KAFKA_VECTORS = KAFKA_MURMUR2_VECTORS


def test_kafka_vectors_in_one_column():
    keys = [k for k, _ in KAFKA_VECTORS]
    assert murmur2_many(keys).tolist() == [h for _, h in KAFKA_VECTORS]


@relaxed
@given(st.lists(st.binary(min_size=0, max_size=40), max_size=60))
def test_matches_scalar_on_random_bytes_of_mixed_lengths(keys):
    got = murmur2_many(keys)
    assert got.dtype == np.int32
    assert got.tolist() == [murmur2(k) for k in keys]


@relaxed
@given(st.integers(0, 40), st.lists(st.binary(min_size=40, max_size=40), min_size=1, max_size=30))
def test_matches_scalar_when_every_key_has_the_same_length(length, blobs):
    keys = [b[:length] for b in blobs]  # the uniform fast path: no reordering by length
    assert murmur2_many(keys).tolist() == [murmur2(k) for k in keys]


@relaxed
@given(st.lists(st.binary(max_size=40), max_size=40), st.integers(0, 5), st.integers(0, 5))
def test_arrow_columns_sliced_or_not_give_the_same_hashes(keys, head, tail):
    expected = [murmur2(k) for k in keys]
    for kind in (pa.binary(), pa.large_binary()):
        arr = pa.array([b"pad"] * head + keys + [b"x"] * tail, kind).slice(head, len(keys))
        assert murmur2_many(arr).tolist() == expected
    assert murmur2_many(pa.chunked_array([pa.array(keys, pa.binary())])).tolist() == expected


@relaxed
@given(st.lists(st.text(max_size=20), max_size=40))
def test_string_columns_hash_their_utf8_bytes(texts):
    for kind in (pa.string(), pa.large_string()):
        got = murmur2_many(pa.array(texts, kind)).tolist()
        assert got == [murmur2(t.encode("utf-8")) for t in texts]


def test_every_tail_and_word_count_in_one_column():
    keys = [bytes((200 + i) % 256 for i in range(n)) for n in range(0, 41)] * 3
    assert murmur2_many(keys).tolist() == [murmur2(k) for k in keys]


def test_keys_longer_than_the_vector_cap_are_exact():
    keys = [bytes(range(256)) * 2, b"short", bytes(range(255, -1, -1)) * 5 + b"xy", b""]
    assert murmur2_many(keys).tolist() == [murmur2(k) for k in keys]


def test_empty_inputs():
    assert murmur2_many([]).tolist() == []
    assert murmur2_many(pa.array([], pa.binary())).tolist() == []
    assert murmur2_many([b"", b""]).tolist() == [murmur2(b"")] * 2


@relaxed
@given(
    st.lists(st.binary(max_size=40), max_size=50),
    st.sampled_from([1, 2, 3, 7, 8, 12, 1000]),
)
def test_partitions_match_the_scalar_partitioner(keys, n):
    got = murmur2_partition_many(keys, n)
    assert got.dtype == np.int32
    assert got.tolist() == [murmur2_partition(k, n) for k in keys]
    assert get_partitioner("murmur2").partition_many(keys, n).tolist() == got.tolist()


def test_partition_many_of_the_explicit_partitioner_refuses_like_partition():
    with pytest.raises(ValueError, match="explicit partitioner"):
        get_partitioner("explicit").partition_many([b"k"], 4)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="num_partitions"):
        murmur2_partition_many([b"k"], 0)
    with pytest.raises(TypeError, match="null key"):
        murmur2_many(pa.array([b"a", None], pa.binary()))
    with pytest.raises(TypeError, match="binary or string"):
        murmur2_many(pa.array([1, 2], pa.int32()))
    with pytest.raises(TypeError, match="bytes"):
        murmur2_many(["text"])


def test_key_buffers_reads_arrow_without_copying_the_bytes():
    arr = pa.array([b"ab", b"cde", b"f"], pa.binary()).slice(1)
    data, offsets = key_buffers(arr)
    assert [data[offsets[i] : offsets[i + 1]].tobytes() for i in range(2)] == [b"cde", b"f"]
    assert data.ctypes.data == arr.buffers()[2].address  # the Arrow buffer itself
