"""How user keys map to RocksDB key bytes inside one partition (see names.py).

Key-value stores: ``DATA_PREFIX + serialized_key``, so byte order of the RocksDB keys is
byte order of the serialized keys, and a KIP-614 prefix scan is a bounded iteration.

Window stores keep one key's windows contiguous and time-ordered:
``WINDOW_PREFIX + escape(serialized_key) + TERMINATOR + time(start)``. The escape makes
the key prefix-free (key ``a`` can never be confused with key ``a\\x00...``) while keeping
byte order: ``0x00`` becomes ``0x00 0xff`` and the terminator is ``0x00 0x01``, which
sorts below every escaped continuation. Times are 8-byte big-endian with the sign bit
flipped, so negative epoch milliseconds also sort. A second index
``WINDOW_TIME_PREFIX + time(start) + escape(key) + TERMINATOR`` serves window-range
queries ("every key's windows between t1 and t2") without scanning every key.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

from ..names import DATA_PREFIX, END_OF_USER_KEYSPACE, WINDOW_PREFIX, WINDOW_TIME_PREFIX

_TIME = struct.Struct(">Q")
_SIGN = 1 << 63
_TERMINATOR = b"\x00\x01"
TIME_LEN = _TIME.size


def successor(key: bytes) -> bytes:
    """The smallest byte string greater than ``key``: turns an inclusive bound exclusive."""
    return key + b"\x00"


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with ``prefix``.

    ``None`` when there is none (the prefix is all ``0xff``).
    """
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


# -- key-value stores ----------------------------------------------------------------------
def kv_key(key_bytes: bytes) -> bytes:
    return DATA_PREFIX + key_bytes


def kv_keys_arrow(key_bytes: pa.Array) -> pa.Array:
    """``kv_key`` of a whole pyarrow ``binary`` column (no nulls): a ``binary`` array."""
    return prefixed_arrow(DATA_PREFIX, key_bytes)


def prefixed_arrow(prefix: bytes, values: pa.Array) -> pa.Array:
    """``prefix + v`` for every ``v`` of a pyarrow ``binary`` column without nulls, with
    no per-row Python objects: equal-length values (int keys, fixed formats) are one
    numpy reshape; others go through Arrow's ``binary_join_element_wise``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from .partitioners import key_buffers
    from .serde_arrow import binary_scalar

    data, offsets = key_buffers(values)
    n, width = len(offsets) - 1, len(prefix)
    lengths = np.diff(offsets)
    if n and (lengths == lengths[0]).all():
        size = int(lengths[0])
        out = np.empty((n, width + size), dtype=np.uint8)
        out[:, :width] = np.frombuffer(prefix, dtype=np.uint8)
        out[:, width:] = data[int(offsets[0]) : int(offsets[-1])].reshape(n, size)
        new_offsets = np.arange(n + 1, dtype=np.int64) * (width + size)
        if new_offsets[-1] < 2**31:
            buffers = [None, pa.py_buffer(new_offsets.astype(np.int32)), pa.py_buffer(out)]
            return pa.Array.from_buffers(pa.binary(), n, buffers)
    return pc.binary_join_element_wise(
        binary_scalar(prefix), values.cast(pa.binary()), binary_scalar(b"")
    )


def unprefixed_arrow(values: pa.Array, width: int) -> pa.Array:
    """Every value of a pyarrow ``binary`` column without nulls with its first ``width``
    bytes dropped (each value has at least that many): ``prefixed_arrow``'s inverse, in
    numpy. (Arrow's ``binary_slice`` fails on some inputs here, "Negative buffer
    resize", pyarrow 22.)"""
    import numpy as np
    import pyarrow as pa

    from .partitioners import key_buffers

    data, offsets = key_buffers(values)
    n = len(offsets) - 1
    keep = np.ones(len(data), dtype=bool)
    first = int(offsets[0]) if n else 0
    for i in range(width):
        keep[offsets[:-1] + i] = False
    kept = data[first : int(offsets[-1])][keep[first : int(offsets[-1])]] if n else data[:0]
    new_offsets = (offsets - offsets[0]) - width * np.arange(n + 1, dtype=np.int64)
    buffers = [None, pa.py_buffer(new_offsets.astype(np.int32)), pa.py_buffer(kept.tobytes())]
    return pa.Array.from_buffers(pa.binary(), n, buffers)


KV_LOWER = DATA_PREFIX
KV_UPPER = WINDOW_PREFIX  # the next namespace: exclusive upper bound of user kv keys
RAW_PREFIX_LEN = len(DATA_PREFIX)


def kv_range(lower: bytes | None, upper_inclusive: bytes | None) -> tuple[bytes, bytes]:
    """RocksDB bounds ``[lo, hi)`` for serialized keys ``lower <= k <= upper``."""
    lo = DATA_PREFIX + lower if lower is not None else KV_LOWER
    hi = DATA_PREFIX + successor(upper_inclusive) if upper_inclusive is not None else KV_UPPER
    return lo, hi


def kv_prefix_range(prefix: bytes) -> tuple[bytes, bytes]:
    """RocksDB bounds of every kv key whose serialized form starts with ``prefix``."""
    end = prefix_end(DATA_PREFIX + prefix)
    return DATA_PREFIX + prefix, end if end is not None else KV_UPPER


# -- window stores -------------------------------------------------------------------------
def encode_time(ms: int) -> bytes:
    """``ms`` as 8 sortable bytes; ``ValueError`` outside 64-bit epoch milliseconds (it
    used to wrap around: 2**63 was stored as -2**63). Callers check times first
    (``query.window.to_epoch_millis``); this keeps a missed check from storing a wrong
    window, at no cost on the way through (``struct`` range-checks the unsigned value)."""
    try:
        return _TIME.pack(ms + _SIGN)
    except struct.error:
        raise ValueError(
            f"window start {ms} is outside 64-bit epoch milliseconds (-2**63 .. 2**63-1)"
        ) from None


def decode_time(data: bytes) -> int:
    return _TIME.unpack(data)[0] - _SIGN


def escape(key_bytes: bytes) -> bytes:
    return key_bytes.replace(b"\x00", b"\x00\xff") + _TERMINATOR


def unescape(escaped: bytes) -> bytes:
    """Inverse of ``escape`` (``escaped`` without its terminator)."""
    return escaped.replace(b"\x00\xff", b"\x00")


def window_key(key_bytes: bytes, start_ms: int) -> bytes:
    return WINDOW_PREFIX + escape(key_bytes) + encode_time(start_ms)


def window_time_key(key_bytes: bytes, start_ms: int) -> bytes:
    return WINDOW_TIME_PREFIX + encode_time(start_ms) + escape(key_bytes)


def split_window_time_key(raw: bytes) -> tuple[bytes, int]:
    """``window_time_key`` bytes → ``(serialized_key, start_ms)``."""
    start = decode_time(raw[len(WINDOW_TIME_PREFIX) : len(WINDOW_TIME_PREFIX) + TIME_LEN])
    body = raw[len(WINDOW_TIME_PREFIX) + TIME_LEN : -len(_TERMINATOR)]
    return unescape(body), start


def window_key_range(key_bytes: bytes, time_from: int, time_to: int) -> tuple[bytes, bytes]:
    """Bounds of one key's windows starting in ``[time_from, time_to]``."""
    base = WINDOW_PREFIX + escape(key_bytes)
    return base + encode_time(time_from), successor(base + encode_time(time_to))


def window_time_range(time_from: int, time_to: int) -> tuple[bytes, bytes]:
    """Bounds of the time index for windows starting in ``[time_from, time_to]``."""
    return (
        WINDOW_TIME_PREFIX + encode_time(time_from),
        WINDOW_TIME_PREFIX + encode_time(time_to + 1)
        if time_to < (1 << 63) - 1
        else END_OF_USER_KEYSPACE,
    )


WINDOW_LOWER = WINDOW_PREFIX
WINDOW_UPPER = WINDOW_TIME_PREFIX
