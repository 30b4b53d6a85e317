"""Partitioners: which store partition a key lives in.

Why Kafka's murmur2: a store fed from a Kafka topic keyed the same way should put every
key in the partition Kafka put it in, so store partition ``p`` holds exactly the state
built from input partition ``p``, and a store partition's position is that input
partition's offset. ``murmur2`` here is byte-exact with
``org.apache.kafka.common.utils.Utils.murmur2`` and ``murmur2_partition`` with the
Java client's default (``BuiltInPartitioner.partitionForKey``):
``toPositive(murmur2(keyBytes)) % numPartitions``.

``explicit`` is KIP-759's ``markAsPartitioned``: the data is already partitioned, the
writer names the partition, and no key function exists, so point lookups must visit
every partition (``routes_keys`` is ``False``).

``murmur2`` runs on every key lookup and every put, so it is written for CPython: the
aligned prefix is unpacked in one ``struct`` call (a ``Struct`` cached per word count)
and the Java ``int`` overflow is emulated with a single mask per step.

``murmur2_many`` hashes a whole column of keys (a Spark Arrow batch) with numpy: per-key
Python calls are what made bulk writes slow. It is the same function, word step by word
step, on ``uint32`` arrays, whose multiplication wraps modulo 2**32 like Java's ``int``.
"""

from __future__ import annotations

import difflib
import struct
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "PARTITIONER_NAMES",
    "ExplicitPartitioner",
    "Murmur2Partitioner",
    "Partitioner",
    "SparkHashPartitioner",
    "get_partitioner",
    "murmur2",
    "murmur2_many",
    "murmur2_partition",
    "murmur2_partition_many",
    "to_positive",
]

# '<nI' unpackers by word count; keys are short, so this stays small. Past 256 words
# (1 KiB keys) we stop caching and build the Struct per call: its cost is dwarfed by the
# loop at that size, and the cache cannot grow without bound.
#: Shared with spark_hash.py (Spark's Murmur3 reads its blocks the same way).
WORD_UNPACKERS: dict[int, struct.Struct] = {}
_CACHE_LIMIT = 256


#: ``unpack_from`` of the ``'<nI'`` unpacker for ``n`` words, by ``n`` (keys of up to 64
#: words): murmur2's per-key cost is a few hundred nanoseconds, and a list index plus a
#: bound method is a dict lookup and an attribute lookup less per key.
_UNPACK_WORDS = [struct.Struct(f"<{n}I").unpack_from for n in range(65)]


def word_unpacker(count: int) -> struct.Struct:
    """The ``'<{count}I'`` unpacker: ``count`` little-endian unsigned 32-bit words (use
    ``WORD_UNPACKERS.get(count) or word_unpacker(count)`` on hot paths)."""
    s = WORD_UNPACKERS.get(count)
    if s is None:
        s = struct.Struct(f"<{count}I")
        if count <= _CACHE_LIMIT:
            WORD_UNPACKERS[count] = s
    return s


def _murmur2_u32(data: bytes) -> int:
    """Kafka's murmur2 as an unsigned 32-bit int (``data`` must be bytes-like).

    Constants are locals (faster than globals in the loop). Masking once per step is
    exact: ``(a ^ b) & mask == (a & mask) ^ (b & mask)`` and products of 32-bit values
    are only ever needed modulo 2**32, like Java's overflowing ``int`` arithmetic.
    """
    m = 0x5BD1E995  # Kafka's mixing constant; r = 24 below; seed 0x9747B28C
    mask = 0xFFFFFFFF
    length = len(data)
    h = 0x9747B28C ^ length
    count = length >> 2
    if count:
        unpack = _UNPACK_WORDS[count] if count <= 64 else word_unpacker(count).unpack_from
        for k in unpack(data):
            k = k * m & mask
            h = (h * m ^ (k ^ k >> 24) * m) & mask
    tail = length & 3
    if tail:
        i = length - tail
        if tail == 3:
            h ^= data[i + 2] << 16
        if tail >= 2:
            h ^= data[i + 1] << 8
        h = (h ^ data[i]) * m & mask
    h ^= h >> 13
    h = h * m & mask
    return h ^ h >> 15


def _check_bytes(data: object) -> bytes:
    """Slow path for non-``bytes`` keys: copy bytes-likes, refuse everything else."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"murmur2 needs key bytes (bytes-like), got {type(data).__name__}")


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2(byte[])``: the signed 32-bit Java ``int`` result.

    Java's tail bytes are masked with ``& 0xff`` and its shifts are ``>>>``, so working
    on unsigned 32-bit values and converting to signed at the end is exact.
    """
    if type(data) is not bytes:
        data = _check_bytes(data)
    h = _murmur2_u32(data)
    return h - 0x100000000 if h & 0x80000000 else h


def to_positive(number: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit (not ``abs``, which overflows)."""
    return number & 0x7FFFFFFF


def murmur2_partition(key_bytes: bytes, num_partitions: int) -> int:
    """``toPositive(murmur2(key_bytes)) % num_partitions``: Kafka's default for keyed records."""
    if type(key_bytes) is not bytes:
        key_bytes = _check_bytes(key_bytes)
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be a positive int, got {num_partitions!r}")
    return (_murmur2_u32(key_bytes) & 0x7FFFFFFF) % num_partitions


# -- many keys at once (numpy) -------------------------------------------------------------
#: Keys longer than this many 4-byte words are hashed one by one: the vectorized loop runs
#: once per word position of the longest key, so one huge key would cost more than it saves.
_MAX_VECTOR_WORDS = 64


def key_buffers(keys: Any, *, widen: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(data, offsets)`` of many keys: ``uint8`` bytes and ``int64`` offsets (one more
    than keys) such that key ``i`` is ``data[offsets[i]:offsets[i + 1]]``.

    ``keys``: a pyarrow ``binary``/``string`` array (large or not; sliced arrays are fine;
    read without copying) or a sequence of bytes-likes. Nulls are refused: a null key
    has no bytes to hash. ``widen=False``: an Arrow array's offsets as Arrow holds them
    (``int32``, or ``int64`` for the large types), not copied.
    """
    import numpy as np

    if type(keys).__module__.startswith("pyarrow"):  # an Array or a ChunkedArray
        import pyarrow as pa

        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        t = keys.type
        if not (
            pa.types.is_binary(t)
            or pa.types.is_string(t)
            or pa.types.is_large_binary(t)
            or pa.types.is_large_string(t)
        ):
            raise TypeError(f"murmur2 needs binary or string keys, got an Arrow {t} array")
        if keys.null_count:
            raise TypeError("murmur2 needs key bytes, got a null key")
        _, off_buf, data_buf = keys.buffers()
        large = pa.types.is_large_binary(t) or pa.types.is_large_string(t)
        offsets = np.frombuffer(off_buf, dtype=np.int64 if large else np.int32)
        offsets = offsets[keys.offset : keys.offset + len(keys) + 1]
        if widen:
            offsets = offsets.astype(np.int64)
        data = (
            np.frombuffer(data_buf, dtype=np.uint8)
            if data_buf is not None
            else np.zeros(0, dtype=np.uint8)
        )
        return data, offsets
    items = [k if type(k) is bytes else _check_bytes(k) for k in keys]
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum([len(k) for k in items], out=offsets[1:])
    return np.frombuffer(b"".join(items), dtype=np.uint8), offsets


def murmur2_many(keys: Any) -> np.ndarray:
    """Kafka's ``murmur2`` of every key (see :func:`key_buffers` for ``keys``): an
    ``int32`` array equal to ``[murmur2(k) for k in keys]``.

    Rows are ordered by word count so that word ``j`` is mixed into the suffix of rows
    that have one (a slice, no scatter), then the 1–3 tail bytes and the final mix are
    applied to every row at once. Words are read through an unaligned ``uint32`` view of
    the byte buffer (little-endian, as Kafka assembles them), one gather per word.
    """
    import numpy as np

    data, offsets = key_buffers(keys)
    n = len(offsets) - 1
    m = np.uint32(0x5BD1E995)
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    if n and (lengths == lengths[0]).all() and lengths[0] <= 4 * _MAX_VECTOR_WORDS:
        size = int(lengths[0])
        return _murmur2_equal_lengths(data[int(offsets[0]) : int(offsets[-1])].reshape(n, size))
    h = (lengths.astype(np.uint32) ^ np.uint32(0x9747B28C)).astype(np.uint32)
    nwords = lengths >> 2
    long_rows = np.flatnonzero(nwords > _MAX_VECTOR_WORDS)
    max_words = int(nwords.max(initial=0))
    if max_words and len(data) >= 4:
        # uint32 at every byte position (stride 1): numpy reads unaligned values.
        words = np.ndarray((len(data) - 3,), dtype="<u4", buffer=data, strides=(1,))
        capped = np.minimum(nwords, _MAX_VECTOR_WORDS)
        uniform = bool((capped == capped[0]).all())
        order = None if uniform else np.argsort(capped, kind="stable")
        hs = h if uniform else h[order]
        pos = starts if uniform else starts[order]
        cs = capped if uniform else capped[order]
        for j in range(min(max_words, _MAX_VECTOR_WORDS)):
            first = 0 if uniform else int(np.searchsorted(cs, j, side="right"))
            k = words[pos[first:] + 4 * j]
            k *= m
            k ^= k >> np.uint32(24)
            k *= m
            part = hs[first:]
            part *= m
            part ^= k
        if not uniform:
            h[order] = hs
    tail = (lengths & 3).astype(np.int8)
    at = starts + (nwords << 2)
    for size, shift in ((3, 16), (2, 8)):
        rows = np.flatnonzero(tail >= size)
        if len(rows):
            h[rows] ^= data[at[rows] + (size - 1)].astype(np.uint32) << np.uint32(shift)
    rows = np.flatnonzero(tail >= 1)
    if len(rows):
        h[rows] = (h[rows] ^ data[at[rows]]) * m
    h ^= h >> np.uint32(13)
    h *= m
    h ^= h >> np.uint32(15)
    for i in long_rows.tolist():  # rare: keys over 256 bytes
        h[i] = _murmur2_u32(data[offsets[i] : offsets[i + 1]].tobytes())
    return h.view(np.int32) if n else np.zeros(0, dtype=np.int32)


def _murmur2_equal_lengths(rows: np.ndarray) -> np.ndarray:
    """``murmur2_many`` of keys of one length (a ``uint8`` matrix, a key per row; ids,
    fixed formats): word ``j`` of every key is column ``j`` of one ``uint32`` view, and
    the tail bytes are columns too, where keys of mixed lengths need a gather each."""
    import numpy as np

    n, size = rows.shape
    m = np.uint32(0x5BD1E995)
    h = np.full(n, np.uint32(size) ^ np.uint32(0x9747B28C), dtype=np.uint32)
    nwords = size >> 2
    if nwords:
        words = np.ascontiguousarray(rows[:, : 4 * nwords]).view("<u4")
        for j in range(nwords):
            k = words[:, j] * m
            k ^= k >> np.uint32(24)
            k *= m
            h *= m
            h ^= k
    tail = size & 3
    at = 4 * nwords
    if tail >= 3:
        h ^= rows[:, at + 2].astype(np.uint32) << np.uint32(16)
    if tail >= 2:
        h ^= rows[:, at + 1].astype(np.uint32) << np.uint32(8)
    if tail >= 1:
        h ^= rows[:, at]
        h *= m
    h ^= h >> np.uint32(13)
    h *= m
    h ^= h >> np.uint32(15)
    return h.view(np.int32)


def murmur2_partition_many(keys: Any, num_partitions: int) -> np.ndarray:
    """``murmur2_partition`` of every key: an ``int32`` array of partitions."""
    import numpy as np

    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be a positive int, got {num_partitions!r}")
    h = murmur2_many(keys).view(np.uint32) & np.uint32(0x7FFFFFFF)
    return (h % np.uint32(num_partitions)).astype(np.int32)


class Partitioner(ABC):
    """Maps serialized keys to partitions; ``name`` is what manifests store.

    ``routes_keys`` says whether the key alone determines the partition: when it is
    ``True`` a key lookup can go to one partition; when ``False`` it must ask all.
    """

    __slots__ = ()  # stateless: instances are immutable and compare by class
    name: ClassVar[str]
    routes_keys: ClassVar[bool]

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash((Partitioner, self.name))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @property
    def inputs_feed_every_partition(self) -> bool:
        """Whether any input partition may feed any store partition (the data was shuffled
        by key), which is what the lag and bound rules count (``store.inputs.binds``):
        so when keys are routed; a store whose lookups cannot be routed may still say
        so (``spark_hash`` over a window key)."""
        return self.routes_keys

    @abstractmethod
    def partition(self, key_bytes: bytes, num_partitions: int) -> int:
        """The partition ``key_bytes`` belongs to, in ``[0, num_partitions)``."""

    def partition_many(self, keys: Sequence[bytes] | Any, num_partitions: int) -> np.ndarray:
        """``partition`` of many serialized keys (bytes or a pyarrow binary array), as an
        ``int32`` numpy array; partitioners with a vectorized path override it."""
        import numpy as np

        if hasattr(keys, "to_pylist"):
            keys = keys.to_pylist()
        return np.array([self.partition(k, num_partitions) for k in keys], dtype=np.int32)


class Murmur2Partitioner(Partitioner):
    """Kafka's default partitioner for keyed records (see :func:`murmur2_partition`)."""

    __slots__ = ()
    name: ClassVar[str] = "murmur2"
    routes_keys: ClassVar[bool] = True

    def partition(self, key_bytes: bytes, num_partitions: int) -> int:
        if type(key_bytes) is bytes:  # key lookups: one call less, and no hash when
            if num_partitions == 1:  # every key has one owner (about 1 µs a key)
                return 0
            if num_partitions > 1:
                return (_murmur2_u32(key_bytes) & 0x7FFFFFFF) % num_partitions
        return murmur2_partition(key_bytes, num_partitions)

    def partition_many(self, keys: Sequence[bytes] | Any, num_partitions: int) -> np.ndarray:
        return murmur2_partition_many(keys, num_partitions)


class ExplicitPartitioner(Partitioner):
    """KIP-759 ``markAsPartitioned``: the writer names each record's partition."""

    __slots__ = ()
    name: ClassVar[str] = "explicit"
    routes_keys: ClassVar[bool] = False

    def partition(self, key_bytes: bytes, num_partitions: int) -> int:
        raise ValueError("store uses the explicit partitioner: pass partition=...")


class SparkHashPartitioner(Partitioner):
    """Spark's ``HashPartitioning``, as a streaming query's state is partitioned:
    ``pmod(hash(key columns), n)`` (``spark_hash.py``). The hash is of the key's typed
    columns, not of its bytes, so this generic instance (what the manifest's name alone
    gives) cannot route a key and asks every partition, always right; the format that
    knows the key's Spark schema hands out one that routes
    (``StoreFormat.partitioner``)."""

    __slots__ = ()
    name: ClassVar[str] = "spark_hash"
    routes_keys: ClassVar[bool] = False

    @property
    def inputs_feed_every_partition(self) -> bool:
        return True  # Spark shuffles a stateful operator's input by the key

    def partition(self, key_bytes: bytes, num_partitions: int) -> int:
        raise ValueError("a spark_hash store routes keys only with its key schema")


_PARTITIONERS: dict[str, Partitioner] = {
    p.name: p for p in (Murmur2Partitioner(), ExplicitPartitioner(), SparkHashPartitioner())
}
PARTITIONER_NAMES: tuple[str, ...] = tuple(_PARTITIONERS)


def get_partitioner(name: str | Partitioner) -> Partitioner:
    """The partitioner called ``name`` (an instance is returned as is).

    Unknown names raise ``ValueError`` listing the known ones, with a suggestion.
    """
    if isinstance(name, Partitioner):
        return name
    if not isinstance(name, str):
        raise TypeError(f"partitioner name must be a str, got {type(name).__name__}")
    p = _PARTITIONERS.get(name)
    if p is not None:
        return p
    msg = f"unknown partitioner {name!r}"
    key = name.strip().lower()
    close = difflib.get_close_matches(key, PARTITIONER_NAMES, n=1, cutoff=0.6)
    if key in ("default", "kafka", "murmur", "hash"):
        close = ["murmur2"]
    elif key in ("manual", "partitioned", "none", "custom"):
        close = ["explicit"]
    if close:
        msg += f"; did you mean {close[0]!r}?"
    msg += f" (known partitioners: {', '.join(PARTITIONER_NAMES)})"
    raise ValueError(msg)
