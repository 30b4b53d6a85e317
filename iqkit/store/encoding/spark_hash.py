"""Spark's hash partitioning in pure Python: which partition of a Spark state store holds a key.

Why: a Structured Streaming checkpoint keeps the state of partition ``p`` for exactly the
keys with ``pmod(hash(key columns), numPartitions) == p``: Spark shuffles stateful
operators' input with its hash partitioning. A key lookup that computes ``p`` in Python
opens one partition instead of all of them, with no Spark at hand (no pyspark import).

What Spark computes, and this module reproduces bit for bit:

- ``hash(c1, c2, ...)`` is Murmur3 x86_32 folded over the columns: the running hash
  starts at the seed 42 and each column's hash, seeded with it, replaces it. A null
  column (or null struct field, or null array element) leaves it unchanged.
- boolean (1 or 0), byte, short, int and date (days since 1970-01-01) are one 32-bit
  block (``hash_int``); long and timestamps (microseconds since the epoch, wall clock
  for ``timestamp_ntz``) are two blocks, low word first (``hash_long``).
- float is the block of its IEEE bits, double the two blocks of its bits, with ``-0.0``
  hashed as ``0.0`` and every NaN as the one canonical NaN (Java's ``floatToIntBits`` and
  ``doubleToLongBits``).
- string is its UTF-8 bytes and binary its bytes (``hash_bytes``), which are NOT standard
  Murmur3: after the 4-byte little-endian words, each of the 1..3 trailing bytes is mixed
  as a whole block of its own, sign-extended, and the final mix uses the byte length.
- decimal(p, s) is ``hash_long`` of the unscaled value when p <= 18, and otherwise
  ``hash_bytes`` of the unscaled value's minimal big-endian two's-complement bytes.
- struct folds its fields in order and array its elements, both recursively.
- the partition is ``pmod(hash, n)``: the non-negative remainder of the signed result.

Speed: a key lookup hashes every key of a ``MultiKeyQuery``, so :class:`SparkKeyHasher`
compiles the key schema once into one function per column type (``partitions`` maps a
whole batch of keys); the Murmur3 steps are inlined with the Java ``int`` overflow
emulated by one mask per step, as in ``partitioners.py``. Hashes are unsigned 32-bit
inside and signed only on the way out.
"""

from __future__ import annotations

import decimal
import json
import operator
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from .partitioners import WORD_UNPACKERS, word_unpacker

__all__ = [
    "SPARK_HASH_SEED",
    "SparkKeyHasher",
    "spark_hash",
    "spark_partition",
]

#: The seed of Spark SQL's ``hash()`` and of its hash partitioning.
SPARK_HASH_SEED = 42

#: One column's hash step: ``(non-null value, running hash) -> running hash``, unsigned.
HashStep = Callable[[Any, int], int]

_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)
_FLOAT_NAN_BITS = 0x7FC00000  # Java's floatToIntBits of every NaN
_DOUBLE_NAN_BITS = 0x7FF8000000000000  # Java's doubleToLongBits of every NaN
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")
_U64 = struct.Struct("<Q")
# Unscaled values of wide decimals have up to 38 digits; the default context keeps 28.
_WIDE = decimal.Context(prec=200, rounding=decimal.ROUND_HALF_UP)


# -- Murmur3 x86_32 with Spark's byte tail ------------------------------------------------
def _mix_k1(block: int) -> int:
    """Murmur3's key mix of one 32-bit block (a negative int is read as its two's complement)."""
    k = block * 0xCC9E2D51 & 0xFFFFFFFF
    return (k << 15 | k >> 17) * 0x1B873593 & 0xFFFFFFFF


#: The mixed block of each tail byte, by its unsigned value: Spark reads a tail byte as a
#: Java (signed) byte, so bytes over 0x7f are sign-extended to a negative int.
_TAIL_BLOCKS = tuple(_mix_k1(b - 256 if b > 127 else b) for b in range(256))


def hash_int(value: int, seed: int) -> int:
    """Murmur3 of one 32-bit block (``value`` is any int; its low 32 bits are hashed).

    Java's overflowing ``int`` arithmetic is one mask per step: the low 32 bits of a sum
    or product depend only on the operands' low 32 bits (so a rotation feeding a product
    needs no mask of its own), and Python's ``&`` reads a negative int as its infinite
    two's complement. Only what is shifted right must be masked first."""
    k = value * 0xCC9E2D51 & 0xFFFFFFFF
    k = (k << 15 | k >> 17) * 0x1B873593 & 0xFFFFFFFF
    h = seed ^ k
    h = (h << 13 | h >> 19) * 5 + 0xE6546B64 & 0xFFFFFFFF
    h ^= 4  # the final mix takes the input's length in bytes
    h ^= h >> 16
    h = h * 0x85EBCA6B & 0xFFFFFFFF
    h ^= h >> 13
    h = h * 0xC2B2AE35 & 0xFFFFFFFF
    return h ^ h >> 16


def hash_long(value: int, seed: int) -> int:
    """Murmur3 of a 64-bit value as two blocks, the low 32 bits first, then the high."""
    k = value * 0xCC9E2D51 & 0xFFFFFFFF
    k = (k << 15 | k >> 17) * 0x1B873593 & 0xFFFFFFFF
    h = seed ^ k
    h = (h << 13 | h >> 19) * 5 + 0xE6546B64 & 0xFFFFFFFF
    k = (value >> 32) * 0xCC9E2D51 & 0xFFFFFFFF  # >> on a negative int sign-extends: exact
    k = (k << 15 | k >> 17) * 0x1B873593 & 0xFFFFFFFF
    h ^= k
    h = (h << 13 | h >> 19) * 5 + 0xE6546B64 & 0xFFFFFFFF
    h ^= 8
    h ^= h >> 16
    h = h * 0x85EBCA6B & 0xFFFFFFFF
    h ^= h >> 13
    h = h * 0xC2B2AE35 & 0xFFFFFFFF
    return h ^ h >> 16


def hash_bytes(data: bytes, seed: int) -> int:
    """Spark's Murmur3 of a byte string (its strings' UTF-8 bytes, binary, wide decimals).

    The aligned prefix is read as little-endian words (one ``struct`` call): Spark reads
    them in the machine's byte order, little-endian on the platforms it runs on. The tail is
    Spark's own, kept for compatibility with its old hashes: each trailing byte is
    sign-extended and mixed as a full block of its own (both the key mix and the hash
    mix), where standard Murmur3 packs the 1..3 tail bytes into one block and mixes only
    the key. The final mix uses the length in bytes."""
    mask = 0xFFFFFFFF
    length = len(data)
    aligned = length & ~3
    h = seed
    if aligned:
        count = aligned >> 2
        for k in (WORD_UNPACKERS.get(count) or word_unpacker(count)).unpack_from(data):
            k = k * 0xCC9E2D51 & mask
            k = (k << 15 | k >> 17) * 0x1B873593 & mask
            h ^= k
            h = (h << 13 | h >> 19) * 5 + 0xE6546B64 & mask
    if length != aligned:
        # Spark mixes each tail byte as a full block, signed, unlike standard Murmur3
        # (_TAIL_BLOCKS holds each byte's mixed block).
        for b in data[aligned:]:
            h ^= _TAIL_BLOCKS[b]
            h = (h << 13 | h >> 19) * 5 + 0xE6546B64 & mask
    h ^= length
    h ^= h >> 16
    h = h * 0x85EBCA6B & mask
    h ^= h >> 13
    h = h * 0xC2B2AE35 & mask
    return h ^ h >> 16


def _signed(h: int) -> int:
    return h - 0x100000000 if h & 0x80000000 else h


# -- values of each type ----------------------------------------------------------------
def _refuse(value: Any, type_name: str) -> TypeError:
    return TypeError(f"{value!r} ({type(value).__name__}) is not a Spark {type_name} value")


def _unwrap(value: Any) -> Any:
    """A numpy scalar's Python value (``.item()``); anything else as is."""
    item = getattr(value, "item", None)
    if item is not None and type(value).__module__ == "numpy":
        return item()
    return value


def _integer_step(type_name: str, bits: int) -> HashStep:
    """byte, short and int: one block. Values outside the type's range are refused (Spark
    has no such value, so no partition holds it)."""
    low, high = -(1 << (bits - 1)), 1 << (bits - 1)

    def step(value: Any, h: int) -> int:
        if type(value) is not int:
            value = _as_int(value, type_name)
        if not low <= value < high:
            raise ValueError(f"{value} is outside Spark's {type_name} range")
        return hash_int(value, h)

    return step


def _as_int(value: Any, type_name: str) -> int:
    value = _unwrap(value)
    if isinstance(value, float | str | bytes | decimal.Decimal | date):
        raise _refuse(value, type_name)
    try:
        return operator.index(value)
    except TypeError:
        raise _refuse(value, type_name) from None


def _long_step(value: Any, h: int) -> int:
    if type(value) is not int:
        value = _as_int(value, "long")
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"{value} is outside Spark's long range")
    return hash_long(value, h)


def _boolean_step(value: Any, h: int) -> int:
    value = _unwrap(value)
    if value is True or value is False or (type(value) is int and value in (0, 1)):
        return hash_int(1 if value else 0, h)  # Spark hashes a boolean as the int 1 or 0
    raise _refuse(value, "boolean")


def _as_float(value: Any, type_name: str) -> float:
    value = _unwrap(value)
    if isinstance(value, bool) or not isinstance(value, float | int):
        raise _refuse(value, type_name)
    return float(value)


def _float_step(value: Any, h: int) -> int:
    if type(value) is not float:
        value = _as_float(value, "float")
    if value != value:
        bits = _FLOAT_NAN_BITS  # every NaN hashes as the canonical NaN
    else:
        try:
            packed = _F32.pack(value)  # rounds to the nearest float32, as Java's cast does
        except OverflowError:  # Java's cast overflows to an infinity instead
            packed = _F32.pack(value * float("inf"))
        bits = _U32.unpack(packed)[0]
        if bits == 0x80000000:
            bits = 0  # Spark hashes -0.0 as 0.0
    return hash_int(bits, h)


def _double_step(value: Any, h: int) -> int:
    if type(value) is not float:
        value = _as_float(value, "double")
    if value != value:
        bits = _DOUBLE_NAN_BITS  # every NaN hashes as the canonical NaN
    elif value == 0.0:
        bits = 0  # Spark hashes -0.0 as 0.0
    else:
        bits = _U64.unpack(_F64.pack(value))[0]
    return hash_long(bits, h)


def _string_step(value: Any, h: int) -> int:
    if type(value) is not str:
        value = _unwrap(value)
        if not isinstance(value, str):
            raise _refuse(value, "string")
    return hash_bytes(value.encode("utf-8"), h)


def _binary_step(value: Any, h: int) -> int:
    if type(value) is not bytes:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise _refuse(value, "binary")
        value = bytes(value)
    return hash_bytes(value, h)


def _date_step(value: Any, h: int) -> int:
    if not isinstance(value, date) or isinstance(value, datetime):  # a datetime is no date
        raise _refuse(value, "date")
    return hash_int(value.toordinal() - _EPOCH_ORDINAL, h)  # days since 1970-01-01


def _timestamp_step(value: Any, h: int) -> int:
    """An instant: an aware ``datetime``; a naive one is taken to be UTC (iqkit's rule
    everywhere, never the machine's time zone)."""
    if not isinstance(value, datetime):
        raise _refuse(value, "timestamp")
    if value.tzinfo is None:  # Spark hashes microseconds since the epoch, as a long
        return hash_long((value - _EPOCH_NAIVE) // _MICROSECOND, h)
    return hash_long((value - _EPOCH) // _MICROSECOND, h)


def _timestamp_ntz_step(value: Any, h: int) -> int:
    """A wall-clock time: a naive ``datetime``; an aware one keeps its wall clock and
    drops its zone, as iqkit's row conversion does."""
    if not isinstance(value, datetime):
        raise _refuse(value, "timestamp_ntz")
    return hash_long((value.replace(tzinfo=None) - _EPOCH_NAIVE) // _MICROSECOND, h)


def _time_step(value: Any, h: int) -> int:
    """A time of day: nanoseconds since midnight (its zone, if any, is ignored)."""
    if not isinstance(value, time):
        raise _refuse(value, "time")
    seconds = (value.hour * 60 + value.minute) * 60 + value.second
    # Spark keeps a time as nanoseconds (not microseconds), and hashes that long
    return hash_long(seconds * 1_000_000_000 + value.microsecond * 1000, h)


def _void_step(value: Any, h: int) -> int:
    """NullType: its only value is null, which never reaches a step."""
    raise _refuse(value, "void")


def _java_big_integer_bytes(n: int) -> bytes:
    """Java's ``BigInteger.toByteArray``: the fewest big-endian two's-complement bytes
    that hold ``n`` and its sign bit (``0`` is one zero byte)."""
    return n.to_bytes((n if n >= 0 else ~n).bit_length() // 8 + 1, "big", signed=True)


def _decimal_step(precision: int, scale: int) -> HashStep:
    """decimal(p, s): the unscaled value at scale s. A value with more fraction digits is
    rounded half up, as Spark rounds a decimal into decimal(p, s); one with more than p
    digits is refused (Spark has no such value)."""
    type_name = f"decimal({precision},{scale})"
    quantum = decimal.Decimal(1).scaleb(-scale)
    bound = 10**precision

    def unscaled(value: Any) -> int:
        value = _unwrap(value)
        if isinstance(value, bool) or not isinstance(value, decimal.Decimal | int):
            raise _refuse(value, type_name)
        d = decimal.Decimal(value)
        if not d.is_finite():
            raise ValueError(f"{value} is not a Spark {type_name} value")
        try:
            n = int(d.quantize(quantum, context=_WIDE).scaleb(scale, context=_WIDE))
        except decimal.InvalidOperation:  # more digits than even the wide context holds
            n = bound
        if not -bound < n < bound:
            raise ValueError(f"{value} has more digits than Spark's {type_name}")
        return n

    if precision <= 18:  # the unscaled value fits a long: Spark hashes it as one
        return lambda value, h: hash_long(unscaled(value), h)
    return lambda value, h: hash_bytes(_java_big_integer_bytes(unscaled(value)), h)


def _struct_step(fields: Sequence[tuple[str | None, HashStep]]) -> HashStep:
    """Fields folded in order, each seeded with the running hash; a null field is skipped.
    A value is a tuple or list (by position: a ``Row`` too) or a dict (by field name; a
    missing field is null)."""
    names = [name for name, _ in fields]
    steps = [step for _, step in fields]
    count = len(steps)

    def step(value: Any, h: int) -> int:
        if isinstance(value, Mapping):
            if None in names:
                raise TypeError(f"this struct's fields have no names; got a dict: {value!r}")
            items = [value.get(name) for name in names]
        elif isinstance(value, tuple | list):
            if len(value) != count:
                raise ValueError(f"a struct of {count} fields, got {len(value)}: {value!r}")
            items = value
        else:
            raise _refuse(value, "struct")
        for item, field_step in zip(items, steps, strict=True):
            if item is not None:
                h = field_step(item, h)
        return h

    return step


def _array_step(element: HashStep) -> HashStep:
    def step(value: Any, h: int) -> int:
        if not isinstance(value, tuple | list):
            raise _refuse(value, "array")
        for item in value:
            if item is not None:  # a null element is skipped
                h = element(item, h)
        return h

    return step


# -- type names and schemas -------------------------------------------------------------
_ATOMIC: dict[str, HashStep] = {
    "boolean": _boolean_step,
    "byte": _integer_step("byte", 8),
    "short": _integer_step("short", 16),
    "integer": _integer_step("integer", 32),
    "long": _long_step,
    "float": _float_step,
    "double": _double_step,
    "string": _string_step,
    "binary": _binary_step,
    "date": _date_step,
    "timestamp": _timestamp_step,
    "timestamp_ntz": _timestamp_ntz_step,
    "void": _void_step,
}
# SQL's spellings of the same types
_ALIASES = {
    "bool": "boolean",
    "tinyint": "byte",
    "smallint": "short",
    "int": "integer",
    "bigint": "long",
    "real": "float",
    "timestamp_ltz": "timestamp",
}
_DECIMAL = re.compile(r"(?:decimal|dec|numeric)\s*(?:\(\s*(\d+)\s*(?:,\s*(-?\d+)\s*)?\))?")
_TIME = re.compile(r"time\s*(?:\(\s*\d+\s*\))?")
_CHAR = re.compile(r"(?:var)?char\s*\(\s*\d+\s*\)")
_COLLATED = re.compile(r"string\s+collate\s+(\w+)", re.IGNORECASE)
#: Spark keeps a string field's collation in its metadata, under this key.
_COLLATIONS_KEY = "__COLLATIONS"


def _check_collation(collation: str | None, where: str) -> None:
    """A collated string is hashed by its collation's own hash in Spark, not by its bytes;
    only the default (binary) collation is the byte hash."""
    if collation is not None and collation.rsplit(".", 1)[-1].upper() != "UTF8_BINARY":
        raise NotImplementedError(
            f"{where}: strings with collation {collation} are not supported "
            "(Spark hashes them by the collation, not by their bytes)"
        )


def _named_step(spec: str, path: str, collations: Mapping[str, str]) -> HashStep:
    name = spec.strip().lower()
    name = _ALIASES.get(name, name)
    step = _ATOMIC.get(name)
    if step is not None:
        if name == "string":
            _check_collation(collations.get(path), path or spec)
        return step
    if m := _DECIMAL.fullmatch(name):
        precision = int(m.group(1) or 10)  # plain "decimal" is decimal(10,0)
        return _decimal_step(precision, int(m.group(2) or 0))
    if _TIME.fullmatch(name):  # time(p), p <= 6: a datetime.time holds it exactly
        return _time_step
    if _CHAR.fullmatch(name):  # char(n) and varchar(n) values are strings
        _check_collation(collations.get(path), path or spec)
        return _string_step
    if m := _COLLATED.fullmatch(spec.strip()):
        _check_collation(m.group(1), path or spec)
        return _string_step
    if name in ("struct", "array", "map"):
        raise ValueError(
            f"a {name} type needs its members' types: give Spark's JSON of it "
            '({"type": "struct", "fields": [...]}) or, for a struct, a list of field types'
        )
    raise NotImplementedError(f"Spark type {spec!r} is not supported by iqkit's Spark hash")


def _field_steps(fields: Sequence[Any]) -> list[tuple[str | None, HashStep]]:
    """``(name, step)`` of a StructType JSON's ``fields``; collations come from each
    field's metadata (the field's own path and its array elements' ``<name>.element``)."""
    out: list[tuple[str | None, HashStep]] = []
    for field in fields:
        if not isinstance(field, Mapping) or "name" not in field or "type" not in field:
            raise ValueError(f"a struct field must be {{'name': ..., 'type': ...}}, got {field!r}")
        metadata = field.get("metadata") or {}
        collations = metadata.get(_COLLATIONS_KEY) or {}
        out.append((field["name"], _compile(field["type"], field["name"], collations)))
    return out


def _compile(spec: Any, path: str = "", collations: Mapping[str, str] | None = None) -> HashStep:
    """One column's hash step from its type: a name (``"long"``, ``"decimal(38,2)"``),
    Spark's JSON of a type (``{"type": "struct", "fields": [...]}``, ``{"type": "array",
    ...}``), a list or tuple of field types (a struct read by position), or an object with
    Spark's ``jsonValue()`` (a pyspark ``DataType``)."""
    collations = collations or {}
    if isinstance(spec, str):
        return _named_step(spec, path, collations)
    if isinstance(spec, Mapping):
        kind = spec.get("type")
        if kind == "struct":
            return _struct_step(_field_steps(spec.get("fields", ())))
        if kind == "array":
            return _array_step(_compile(spec["elementType"], f"{path}.element", collations))
        if kind == "map":
            raise NotImplementedError("Spark refuses to hash maps (and cannot group by them)")
        raise NotImplementedError(f"Spark type {spec!r} is not supported by iqkit's Spark hash")
    if isinstance(spec, tuple | list):
        return _struct_step([(None, _compile(t)) for t in spec])
    json_value = getattr(spec, "jsonValue", None)
    if callable(json_value):
        return _compile(json_value(), path, collations)
    raise TypeError(f"not a Spark type: {spec!r}")


def _fold(steps: Sequence[HashStep], values: Sequence[Any]) -> int:
    """The running hash over one row's columns, from the seed."""
    if isinstance(values, str | bytes) or len(values) != len(steps):
        raise ValueError(f"{len(steps)} column values expected, got {values!r}")
    h = SPARK_HASH_SEED
    for value, step in zip(values, steps, strict=True):
        if value is not None:  # a null column leaves the running hash unchanged
            h = step(value, h)
    return h


def _partitions_error(partitions: Any) -> ValueError:
    return ValueError(f"partitions must be a positive int, got {partitions!r}")


class SparkKeyHasher:
    """Spark's hash and partition of keys of one key schema, compiled once.

    ``key_schema``: the key columns as Spark's StructType JSON (a dict, or its text, as
    a checkpoint's schema files and ``StructType.jsonValue()`` give it; a pyspark
    ``StructType`` too), or a sequence of column types as :func:`spark_hash` takes them.

    A key is given the IQv2 way: a one-column key is the column's value; a key of several
    columns is a tuple (or list) of their values in key-schema order, or a dict by column
    name. Struct values (a window's ``{start, end}``) are dicts by field name or tuples.
    """

    __slots__ = ("_key_hash", "_steps", "columns")

    def __init__(self, key_schema: Any) -> None:
        if isinstance(key_schema, str):
            key_schema = json.loads(key_schema)
        elif not isinstance(key_schema, Mapping | tuple | list) and hasattr(
            key_schema, "jsonValue"
        ):
            key_schema = key_schema.jsonValue()
        if isinstance(key_schema, Mapping):
            if key_schema.get("type") != "struct":
                raise ValueError(f"a key schema is a struct type's JSON, got {key_schema!r}")
            named = _field_steps(key_schema.get("fields", ()))
        elif isinstance(key_schema, tuple | list):
            named = [(None, _compile(t)) for t in key_schema]
        else:
            raise TypeError(f"not a key schema: {key_schema!r}")
        if not named:
            raise ValueError("a key schema needs at least one column")
        #: The key columns' names (``None`` for a schema given as bare types).
        self.columns: tuple[str | None, ...] = tuple(name for name, _ in named)
        self._steps = tuple(step for _, step in named)
        self._key_hash = self._compile_key()

    def __repr__(self) -> str:
        return f"SparkKeyHasher(columns={list(self.columns)!r})"

    def _compile_key(self) -> Callable[[Any], int]:
        """``key -> unsigned hash``, with as little per-key work as the column count allows."""
        seed = SPARK_HASH_SEED
        steps = self._steps
        if len(steps) == 1:
            (step,) = steps
            return lambda key: seed if key is None else step(key, seed)
        names, count = self.columns, len(steps)

        def key_hash(key: Any) -> int:
            if type(key) is not tuple:
                if isinstance(key, Mapping):
                    if None in names:
                        raise TypeError(f"these key columns have no names; got a dict: {key!r}")
                    key = [key.get(name) for name in names]
                elif not isinstance(key, tuple | list):
                    raise TypeError(f"a key of {count} columns is a tuple, got {key!r}")
            if len(key) != count:
                raise ValueError(f"a key of {count} columns, got {len(key)}: {key!r}")
            h = seed
            for value, step in zip(key, steps):  # noqa: B905 - lengths checked above
                if value is not None:  # a null column leaves the running hash unchanged
                    h = step(value, h)
            return h

        return key_hash

    def hash(self, key: Any) -> int:
        """Spark's ``hash(key columns)``: the signed 32-bit result."""
        h = self._key_hash(key)
        return h - 0x100000000 if h & 0x80000000 else h

    def partition(self, key: Any, partitions: int) -> int:
        """Spark's ``pmod(hash(key columns), partitions)``: the partition holding ``key``."""
        h = self._key_hash(key)
        if type(partitions) is not int or partitions <= 0:
            raise _partitions_error(partitions)
        # Python's % of a positive int is already non-negative: Spark's pmod.
        return (h - 0x100000000 if h & 0x80000000 else h) % partitions

    def partitions(self, keys: Any, partitions: int) -> list[int]:
        """:meth:`partition` of every key, in order (one loop for a ``MultiKeyQuery``)."""
        if type(partitions) is not int or partitions <= 0:
            raise _partitions_error(partitions)
        key_hash = self._key_hash
        return [
            (h - 0x100000000 if h & 0x80000000 else h) % partitions for h in map(key_hash, keys)
        ]


def _hasher(types: Sequence[Any]) -> SparkKeyHasher:
    """A cached hasher for ``types`` (so repeated calls compile them once)."""
    try:
        cache_key: Any = tuple(types)
        hasher = _HASHERS.get(cache_key)
    except TypeError:  # dicts or lists among the types: key them by their JSON
        cache_key = json.dumps(types, sort_keys=True, default=repr)
        hasher = _HASHERS.get(cache_key)
    if hasher is None:
        hasher = SparkKeyHasher(list(types))
        if len(_HASHERS) >= _HASHERS_LIMIT:
            _HASHERS.clear()
        _HASHERS[cache_key] = hasher
    return hasher


_HASHERS: dict[Any, SparkKeyHasher] = {}
#: Compiled hashers kept at most (the cache is cleared past it).
_HASHERS_LIMIT = 256


def spark_hash(values: Sequence[Any], types: Sequence[Any]) -> int:
    """Spark SQL's ``hash(c1, c2, ...)`` of one row's column ``values`` of ``types``: the
    signed 32-bit Murmur3 with seed 42, folded over the columns.

    ``types``: one per column, each a Spark type name as a schema's JSON spells it
    (``"string"``, ``"integer"``, ``"long"``, ``"short"``, ``"byte"``, ``"boolean"``,
    ``"double"``, ``"float"``, ``"date"``, ``"timestamp"``, ``"timestamp_ntz"``,
    ``"binary"``, ``"decimal(p,s)"``, ``"time(p)"``, ``"void"``; SQL's ``int``, ``bigint``
    ... too), a struct as Spark's JSON of it (``{"type": "struct", "fields": [{"name":
    "start", "type": "timestamp"}, ...]}``) or as a list of its field types, an array as
    Spark's JSON of it, or a pyspark ``DataType``. Maps, intervals, variants and collated
    strings raise ``NotImplementedError``.

    ``values``: ``str``, ``bytes``, ``int``, ``float``, ``bool``, ``datetime.date``,
    ``datetime.datetime`` (aware = an instant, naive = UTC for ``timestamp``; the wall
    clock for ``timestamp_ntz``), ``datetime.time``, ``decimal.Decimal``, a dict or tuple
    for a struct, a list for an array, ``None`` for null. A value the type cannot hold
    raises ``TypeError`` or ``ValueError`` (Spark has no such key).

    Compiled types are cached; for many keys of one schema, :class:`SparkKeyHasher` skips
    even the cache lookup."""
    return _signed(_fold(_hasher(types)._steps, values))


def spark_partition(values: Sequence[Any], types: Sequence[Any], partitions: int) -> int:
    """Spark's ``pmod(hash(c1, c2, ...), partitions)``: the partition of a hash-partitioned
    shuffle (and so of a stateful operator's state) that holds this row's key."""
    if type(partitions) is not int or partitions <= 0:
        raise _partitions_error(partitions)
    return spark_hash(values, types) % partitions
