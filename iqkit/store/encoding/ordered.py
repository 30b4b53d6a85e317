"""The order-preserving binary codec behind the ``ordered`` serde.

Why it exists: RocksDB sorts keys by their bytes, and range and prefix queries walk
that byte order. Kafka's ``int32``/``int64``/``double`` layouts are two's-complement
and IEEE big-endian, so negative numbers sort *after* positive ones. This codec makes
byte order equal value order (negatives included) so a ``RangeQuery`` over ``ordered``
keys returns what a Python user expects, and composite (tuple) keys support prefix
scans on their leading elements (KIP-614).

The design follows FoundationDB's tuple layer: every element is a one-byte type tag
followed by a self-delimiting body.

Layout (tag: body)::

    0x00          end of a nested tuple (never a value tag)
    0x01          None
    0x02          False
    0x03          True
    0x0B c' L' M' int <= -2**64: c' = ~c (1 byte), L' = ~L (c bytes), M' = ~|n| (L bytes)
    0x0C..0x13 M' int in [-(2**64-1), -1]: 8..1 bytes of the ones' complement of |n|
    0x14          0
    0x15..0x1C M  int in [1, 2**64-1]: 1..8 bytes of n, big-endian, no leading zero
    0x1D c L M    int >= 2**64: c = byte length of L, L = byte length of M, M = n
    0x21 F        float: 8 bytes IEEE-754 big-endian; sign bit flipped for positives,
                  every bit flipped for negatives, so the bytes sort like the values
    0x30 S 0x00   str: UTF-8 (lone surrogates kept via 'surrogatepass'), each 0x00
                  escaped as 0x00 0xFF, then a 0x00 terminator
    0x40 B 0x00   bytes: the same escaping and terminator
    0x50 ... 0x00 nested tuple: its elements' encodings, then a 0x00 terminator

Cross-type order therefore is None < False < True < int < float < str < bytes < tuple.
Ints and floats do NOT interleave by value (``1 < 0.5`` in bytes): mixing them in one
key column is a modelling error, and interleaving would cost the exact int encoding.

Floats are canonicalised: every NaN encodes as one positive quiet NaN that sorts above
``+inf``, and ``-0.0`` encodes as ``0.0`` (Python says ``-0.0 == 0.0``, and equal keys
must have equal bytes). So ``decode(encode(-0.0))`` is ``0.0``.

A TOP-LEVEL tuple (or list) is the plain concatenation of its elements, with no tag and
no terminator, so ``encode(t[:k])`` is a byte prefix of ``encode(t)``: a prefix scan
with a shorter tuple finds every key that starts with it. The price: a top-level
non-tuple ``v`` and the 1-tuple ``(v,)`` encode identically. ``decode`` returns the bare
element when the bytes hold exactly one element, a tuple otherwise (``()`` for ``b""``);
``decode_tuple`` always returns a tuple. Nested tuples carry a tag and a terminator so
``(1,) < (1, 0)`` still holds inside a composite key.

Properties (tested with hypothesis): ``decode(encode(v)) == v`` (up to the 1-tuple rule
above and float canonicalisation); for two values of the same type, or two tuples whose
elements pairwise have the same type, ``a < b <=> encode(a) < encode(b)`` and
``a == b <=> encode(a) == encode(b)``. NaN is the exception Python itself makes: it has
one encoding, above ``+inf``, though ``nan != nan``. ``True``/``1`` and ``1``/``1.0`` are
different types here and encode differently although Python calls them equal.

``encode_columns`` writes the same bytes for a whole table of rows at once (Arrow columns
of strings, bytes and integers, tuples of them nested): the byte rules above, applied to
numpy and Arrow buffers instead of a Python object per value, for keys made a million at
a time (a checkpoint's state, ``store.checkpoint.transform``). Its property test holds it
to ``encode``, byte for byte.
"""

from __future__ import annotations

import numbers
import operator
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["decode", "decode_tuple", "encode", "encode_columns"]

_SERDE = "ordered"

# --- tags -----------------------------------------------------------------------------
_END = 0x00
_NONE = 0x01
_FALSE = 0x02
_TRUE = 0x03
_NEG_BIG = 0x0B
_INT_ZERO = 0x14
_POS_BIG = 0x1D
_FLOAT = 0x21
_STR = 0x30
_BYTES = 0x40
_TUPLE = 0x50

_B_NONE = b"\x01"
_B_FALSE = b"\x02"
_B_TRUE = b"\x03"
_B_ZERO = b"\x14"
_B_STR = b"\x30"
_B_BYTES = b"\x40"
_B_TUPLE = b"\x50"
_B_END = b"\x00"
_ESC_FROM = b"\x00"
_ESC_TO = b"\x00\xff"

# Precomputed per-length pieces for the <= 8-byte int fast path (no per-call arithmetic).
_POS_TAG = [bytes((_INT_ZERO + i,)) for i in range(9)]
_NEG_TAG = [bytes((_INT_ZERO - i,)) for i in range(9)]
_MASK = [(1 << (8 * i)) - 1 for i in range(9)]

# A few hundred small ints cover most counters, ids and enum-like keys: encode by lookup.
_SMALL_MIN, _SMALL_MAX = -256, 1024

_DOUBLE = struct.Struct(">d")
_U64 = struct.Struct(">Q")
_pack_double = _DOUBLE.pack
_unpack_double = _DOUBLE.unpack
_unpack_u64 = _U64.unpack_from
_pack_u64 = _U64.pack
_SIGN = 1 << 63
_ALL64 = (1 << 64) - 1
_MAX_REPR = 60


def short_repr(value: Any, limit: int = _MAX_REPR) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages.

    Why not plain ``repr``: keys can be megabytes long, and ``repr`` of an int over
    4300 digits raises ``ValueError`` in Python 3.11+, which would mask the real error.
    """
    try:
        text = repr(value)
    except Exception:  # huge ints, broken __repr__: still produce a readable message
        text = f"<{type(value).__name__} object>"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def _type_error(value: Any) -> TypeError:
    return TypeError(
        f"serde {_SERDE!r} cannot serialize {short_repr(value)} ({type(value).__name__}): "
        "expected None, bool, int, float, str, bytes or a tuple/list of them"
    )


def _malformed(data: bytes, pos: int, why: str) -> ValueError:
    return ValueError(
        f"serde {_SERDE!r} cannot deserialize {short_repr(bytes(data))} "
        f"({len(data)} bytes): {why} at byte {pos}"
    )


# --- encoding -------------------------------------------------------------------------
def _enc_none(_value: None) -> bytes:
    return _B_NONE


def _enc_bool(value: bool) -> bytes:
    return _B_TRUE if value else _B_FALSE


def _enc_int_arith(n: int) -> bytes:
    if n > 0:
        size = (n.bit_length() + 7) >> 3
        if size <= 8:
            return _POS_TAG[size] + n.to_bytes(size, "big")
        size_len = (size.bit_length() + 7) >> 3
        return b"".join(
            (b"\x1d", bytes((size_len,)), size.to_bytes(size_len, "big"), n.to_bytes(size, "big"))
        )
    if n == 0:
        return _B_ZERO
    m = -n
    size = (m.bit_length() + 7) >> 3
    if size <= 8:
        return _NEG_TAG[size] + (_MASK[size] - m).to_bytes(size, "big")
    size_len = (size.bit_length() + 7) >> 3
    return b"".join(
        (
            b"\x0b",
            bytes((size_len ^ 0xFF,)),
            (((1 << (8 * size_len)) - 1) - size).to_bytes(size_len, "big"),
            (((1 << (8 * size)) - 1) - m).to_bytes(size, "big"),
        )
    )


_SMALL = tuple(_enc_int_arith(i) for i in range(_SMALL_MIN, _SMALL_MAX))


def _enc_int(n: int) -> bytes:
    if _SMALL_MIN <= n < _SMALL_MAX:
        return _SMALL[n - _SMALL_MIN]
    return _enc_int_arith(n)


_NAN_ENC = bytes((_FLOAT,)) + _pack_u64(0x7FF8_0000_0000_0000 ^ _SIGN)
_ZERO_FLOAT_ENC = bytes((_FLOAT,)) + _pack_u64(_SIGN)
_B_FLOAT = bytes((_FLOAT,))


def _enc_float(x: float) -> bytes:
    if x != x:  # every NaN -> one canonical NaN, sorting above +inf
        return _NAN_ENC
    if x == 0.0:  # -0.0 == 0.0, so both get 0.0's bytes
        return _ZERO_FLOAT_ENC
    (u,) = _unpack_u64(_pack_double(x))
    u ^= _ALL64 if u & _SIGN else _SIGN
    return _B_FLOAT + _pack_u64(u)


def _enc_str(s: str) -> bytes:
    return _B_STR + s.encode("utf-8", "surrogatepass").replace(_ESC_FROM, _ESC_TO) + _B_END


def _enc_bytes(b: bytes) -> bytes:
    return _B_BYTES + b.replace(_ESC_FROM, _ESC_TO) + _B_END


def _enc_nested(t: tuple[Any, ...] | list[Any]) -> bytes:
    get = _ELEMENT.get
    parts = [_B_TUPLE]
    append = parts.append
    for v in t:
        f = get(type(v))
        append(f(v) if f is not None else _enc_slow(v))
    append(_B_END)
    return b"".join(parts)


def _enc_slow(v: Any) -> bytes:
    """Subclasses and numpy scalars: normalise to a built-in type, or refuse."""
    if isinstance(v, int):  # IntEnum, other int subclasses
        return _enc_int(int(v))
    if isinstance(v, float):
        return _enc_float(float(v))
    if isinstance(v, str):  # StrEnum, numpy.str_
        return _enc_str(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return _enc_bytes(bytes(v))
    if isinstance(v, (tuple, list)):  # namedtuples
        return _enc_nested(v)
    if hasattr(type(v), "__index__"):  # numpy integers; numpy.bool_ has no __index__
        try:
            return _enc_int(operator.index(v))
        except TypeError:
            pass
    elif isinstance(v, numbers.Real) and not isinstance(v, numbers.Integral):
        return _enc_float(float(v))  # numpy.float32, fractions.Fraction
    raise _type_error(v)


_ELEMENT: dict[type, Callable[[Any], bytes]] = {
    type(None): _enc_none,
    bool: _enc_bool,
    int: _enc_int,
    float: _enc_float,
    str: _enc_str,
    bytes: _enc_bytes,
    tuple: _enc_nested,
    list: _enc_nested,
}
_SCALAR = {k: v for k, v in _ELEMENT.items() if k not in (tuple, list)}


def encode(value: Any) -> bytes:
    """Encode ``value`` so that byte order equals value order.

    A top-level tuple or list is the concatenation of its elements' encodings (so
    shorter tuples are byte prefixes); nested tuples are tagged and terminated.
    Raises ``TypeError`` naming the ``ordered`` serde for unsupported types.
    """
    f = _SCALAR.get(type(value))
    if f is not None:
        return f(value)
    if isinstance(value, (tuple, list)):
        get = _ELEMENT.get
        parts = []
        append = parts.append
        try:
            for v in value:
                f = get(type(v))
                append(f(v) if f is not None else _enc_slow(v))
        except TypeError as exc:
            raise TypeError(f"{exc} (element of {short_repr(value)})") from None
        return b"".join(parts)
    return _enc_slow(value)


# --- encoding whole columns -------------------------------------------------------------
#: A column ``encode_columns`` takes: an Arrow array, or a sequence of them (a nested tuple).
Columns = Sequence[Any]


def encode_columns(columns: Columns) -> pa.Array | None:
    """``encode(row)`` for every row of ``columns`` (its top-level elements, Arrow arrays
    of one length; a sequence of arrays among them is a nested tuple), as one Arrow
    ``binary`` array. Serves ``string``, ``binary`` and ``int8`` to ``int64`` columns
    without nulls; ``None`` for any other column, a null, or past 2 GiB of bytes (the
    caller then encodes row by row)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    pieces = _column_pieces(columns, nested=False)
    if pieces is None:
        return None
    if not pieces:
        return None  # no columns: no rows to count
    if len(pieces) == 1 and isinstance(pieces[0], pa.Array):
        return pieces[0]
    if not any(isinstance(p, pa.Array) for p in pieces):
        return None
    try:
        return pc.binary_join_element_wise(*pieces, b"")
    except (pa.ArrowCapacityError, pa.ArrowInvalid):
        return None  # past 2 GiB (32-bit offsets)


def _column_pieces(columns: Columns, *, nested: bool) -> list[Any] | None:
    """What ``binary_join_element_wise`` joins into ``columns``' bytes: Arrow arrays of
    each element's bytes, scalars for a nested tuple's tag and terminator."""
    import pyarrow as pa

    pieces: list[Any] = [pa.scalar(_B_TUPLE)] if nested else []
    for column in columns:
        if isinstance(column, pa.Array):
            encoded = _encode_column(column)
            if encoded is None:
                return None
            pieces.append(encoded)
            continue
        inner = _column_pieces(column, nested=True)
        if inner is None:
            return None
        pieces += inner
    if nested:
        pieces.append(pa.scalar(_B_END))
    return pieces


def _encode_column(column: pa.Array) -> pa.Array | None:
    """One element of every row: ``_enc_str``, ``_enc_bytes`` or ``_enc_int`` of each."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if column.null_count:
        return None
    if pa.types.is_string(kind) or pa.types.is_binary(kind):
        raw = column.cast(pa.binary())
        if pc.any(pc.match_substring(raw, _ESC_FROM)).as_py():
            raw = pc.replace_substring(raw, _ESC_FROM, _ESC_TO)
        tag = _B_STR if pa.types.is_string(kind) else _B_BYTES
        return pc.binary_join_element_wise(pa.scalar(tag), raw, pa.scalar(_B_END), b"")
    if pa.types.is_integer(kind) and pa.types.is_signed_integer(kind):
        return _encode_ints(column)
    return None


def _encode_ints(column: pa.Array) -> pa.Array | None:
    """``_enc_int`` of every value (all within 8 bytes): a tag of the body's length, then
    the body big-endian, no leading zero byte (a negative number's ones' complement, no
    leading 0xff byte). Each row is written as 9 bytes, tag and 8-byte body, and the
    body's leading bytes are dropped in one boolean gather."""
    import numpy as np
    import pyarrow as pa

    n = len(column)
    values = column.cast(pa.int64()).to_numpy(zero_copy_only=False)
    negative = values < 0
    # |n| as uint64: -(-2**63) wraps to -2**63, whose uint64 view is 2**63.
    magnitude = np.where(negative, np.negative(values), values).view(np.uint64)
    size = np.zeros(n, dtype=np.int64)
    for k in range(8):
        size += magnitude >= np.uint64(1 << (8 * k))
    masks = np.array(_MASK, dtype=np.uint64)
    body = np.where(negative, masks[size] - magnitude, magnitude)
    tag = np.where(negative, _INT_ZERO - size, _INT_ZERO + size).astype(np.uint8)
    rows = np.empty((n, 9), dtype=np.uint8)
    rows[:, 0] = tag
    rows[:, 1:] = body.astype(">u8").view(np.uint8).reshape(n, 8)
    kept = np.arange(9) >= (9 - size)[:, None]
    kept[:, 0] = True
    data = rows[kept]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(size + 1, out=offsets[1:])
    if offsets[-1] >= 2**31:
        return None
    buffers = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.binary(), n, buffers)


# --- decoding -------------------------------------------------------------------------
def _read_escaped(data: bytes, pos: int) -> tuple[bytes, int]:
    """Body of a str/bytes element starting at ``pos``; returns (raw, next_pos)."""
    n = len(data)
    end = pos
    escaped = False
    find = data.find
    while True:
        end = find(b"\x00", end)
        if end < 0:
            raise _malformed(data, pos - 1, "unterminated string/bytes element")
        if end + 1 < n and data[end + 1] == 0xFF:
            escaped = True
            end += 2
            continue
        break
    raw = data[pos:end]
    if escaped:
        raw = raw.replace(_ESC_TO, _ESC_FROM)
    return raw, end + 1


def _decode_elements(data: bytes) -> list[Any]:
    """Decode every element of ``data``; iterative so deep nesting cannot overflow."""
    if type(data) is not bytes:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"serde {_SERDE!r} can only deserialize bytes, got {type(data).__name__}"
            )
        data = bytes(data)
    n = len(data)
    pos = 0
    cur: list[Any] = []
    stack: list[list[Any]] = []
    while pos < n:
        start = pos
        tag = data[pos]
        pos += 1
        if _NEG_BIG < tag < _POS_BIG:  # ints of at most 8 bytes, the common case
            if tag == _INT_ZERO:
                cur.append(0)
                continue
            if tag > _INT_ZERO:
                size = tag - _INT_ZERO
                if pos + size > n:
                    raise _malformed(data, start, "truncated int")
                if data[pos] == 0:
                    raise _malformed(data, start, "non-canonical int (leading zero byte)")
                cur.append(int.from_bytes(data[pos : pos + size], "big"))
            else:
                size = _INT_ZERO - tag
                if pos + size > n:
                    raise _malformed(data, start, "truncated int")
                if data[pos] == 0xFF:
                    raise _malformed(data, start, "non-canonical int (leading 0xff byte)")
                cur.append(int.from_bytes(data[pos : pos + size], "big") - _MASK[size])
            pos += size
        elif tag == _STR:
            raw, pos = _read_escaped(data, pos)
            try:
                cur.append(raw.decode("utf-8", "surrogatepass"))
            except UnicodeDecodeError:
                raise _malformed(data, start, "invalid UTF-8 in str element") from None
        elif tag == _BYTES:
            raw, pos = _read_escaped(data, pos)
            cur.append(raw)
        elif tag == _FLOAT:
            if pos + 8 > n:
                raise _malformed(data, start, "truncated float")
            (u,) = _unpack_u64(data, pos)
            u ^= _SIGN if u & _SIGN else _ALL64
            cur.append(_unpack_double(_pack_u64(u))[0])
            pos += 8
        elif tag == _NONE:
            cur.append(None)
        elif tag == _FALSE:
            cur.append(False)
        elif tag == _TRUE:
            cur.append(True)
        elif tag == _TUPLE:
            stack.append(cur)
            cur = []
        elif tag == _END:
            if not stack:
                raise _malformed(data, start, "tuple terminator outside a nested tuple")
            done = tuple(cur)
            cur = stack.pop()
            cur.append(done)
        elif tag in (_POS_BIG, _NEG_BIG):
            value, pos = _decode_big_int(data, start)
            cur.append(value)
        else:
            raise _malformed(data, start, f"unknown type tag 0x{tag:02x}")
    if stack:
        raise _malformed(data, n, "unterminated nested tuple")
    return cur


def _decode_big_int(data: bytes, start: int) -> tuple[int, int]:
    """(value, next_pos) for a 0x0B/0x1D int whose tag is at ``start``."""
    n = len(data)
    negative = data[start] == _NEG_BIG
    pos = start + 1
    if pos >= n:
        raise _malformed(data, start, "truncated big int")
    size_len = data[pos] ^ 0xFF if negative else data[pos]
    pos += 1
    if size_len == 0 or pos + size_len > n:
        raise _malformed(data, start, "truncated big int")
    size = int.from_bytes(data[pos : pos + size_len], "big")
    if negative:
        size = ((1 << (8 * size_len)) - 1) - size
    pos += size_len
    if size <= 8 or (size.bit_length() + 7) >> 3 != size_len or pos + size > n:
        raise _malformed(data, start, "malformed big int length")
    end = pos + size
    if data[pos] == (0xFF if negative else 0):
        raise _malformed(data, start, "non-canonical big int (leading zero byte)")
    body = int.from_bytes(data[pos:end], "big")
    if negative:
        return body - ((1 << (8 * size)) - 1), end
    return body, end


def decode(data: bytes) -> Any:
    """Decode bytes made by :func:`encode`.

    Returns the bare element when ``data`` holds exactly one element, a tuple when it
    holds zero or several (see the module docstring: ``encode(v) == encode((v,))``).
    Malformed input raises ``ValueError`` naming the ``ordered`` serde.
    """
    items = _decode_elements(data)
    if len(items) == 1:
        return items[0]
    return tuple(items)


def decode_tuple(data: bytes) -> tuple[Any, ...]:
    """Decode bytes made by :func:`encode` as a tuple, even when they hold one element.

    Use this where keys are known to be composite: ``decode`` cannot tell ``(v,)`` from
    ``v``.
    """
    return tuple(_decode_elements(data))
