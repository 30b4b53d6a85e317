"""Spark's ``UnsafeRow`` bytes decoded into Python values, without Spark.

Why: a Structured Streaming query's state stores keep every key and value as an UnsafeRow,
Spark's in-memory row format written to disk byte for byte, and iqkit reads checkpoints in
processes that have no JVM. A schema is compiled once (``RowDecoder``) into one
``struct`` unpacker for the fixed part of a row and one converter per field that needs
one, so a row costs one unpack plus one call per such field: materialising a version
decodes millions of rows.

The layout, little-endian throughout (Spark writes rows in the machine's byte order, and
the machines Spark runs on are little-endian):

- a row of n fields: a null bitset of ceil(n / 64) 8-byte words (bit i set: field i is
  null), one 8-byte slot per field, then a variable-length region;
- a fixed-width value sits at the start of its slot: boolean and byte take 1 byte, short
  2, integer, float and date (days since 1970-01-01) 4; long, double, timestamp
  (microseconds since 1970-01-01 UTC), timestamp_ntz (the same count for a wall-clock
  time) and a decimal of at most 18 digits (its unscaled value) 8;
- a string (UTF-8), binary, decimal of more than 18 digits (the unscaled value as
  big-endian two's complement bytes), nested struct (an UnsafeRow), array or map holds
  ``offset << 32 | size`` in its slot, the offset counted from the first byte of the row;
- an array: [element count: int64][null bitset: ceil(count / 64) words][the elements,
  each of its type's own width (8, for the offset-and-size of a variable-length element),
  padded to a whole word][variable-length region], offsets counted from the array's start;
- a map: [size in bytes of the key array: int64][key array][value array].

Python values: str, bytes, bool, int, float, ``decimal.Decimal``, ``datetime.date``,
timezone-aware UTC ``datetime`` (timestamp), naive ``datetime`` (timestamp_ntz), a dict
keyed by field name for a nested struct, a list for an array, a dict for a map (a key that
is a struct or an array becomes a tuple, so it can be a dict key), None for null; a row is
a tuple, one value per top-level field.

Rows of a flat schema of numbers, booleans, strings, binaries, dates and timestamps (the
common state of aggregations, a join's buffered rows) also decode many at once
(``RowDecoder.decode_columns``): numpy reads the null words and slots of all the rows as
one array, a column at a time. It gives the same values, as numpy columns, or nothing at
all for rows the row-at-a-time decoder would refuse or treat apart (so the caller takes
that path, which raises what it raises).
"""

from __future__ import annotations

import functools
import json
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Context, Decimal
from typing import Any

import numpy as np

from ...errors import IqkitError

__all__ = ["Column", "RowDecodeError", "RowDecoder", "UnsupportedStateTypeError"]


class UnsupportedStateTypeError(IqkitError):
    """A state schema holds a column type iqkit cannot decode yet; the message names the
    column and the type (Spark's own name for it)."""


class RowDecodeError(IqkitError):
    """Bytes that are not an UnsafeRow of the decoder's schema: an offset or size points
    past the row's end, or a value is out of range. Raised instead of returning values
    that could be wrong."""


#: A converter turns the raw number unpacked from a slot into the field's Python value:
#: ``convert(data, base, raw)``, where ``base`` is the position in ``data`` of the row or
#: array holding the slot (variable-length offsets count from it).
Converter = Callable[[bytes, int, int], Any]

_LOW32 = 0xFFFFFFFF
_INT64 = struct.Struct("<q")
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
#: Decimal.scaleb rounds to its context's precision (28 digits by default), and Spark's
#: decimals have up to 38: a context wide enough that scaling is always exact.
_EXACT = Context(prec=80)

#: Fixed-width types: (struct code of the whole 8-byte row slot, struct code of one array
#: element). Dates, timestamps and small decimals share the integer codes and convert.
_FIXED_CODES = {
    "boolean": ("?7x", "?"),
    "byte": ("b7x", "b"),
    "short": ("h6x", "h"),
    "integer": ("i4x", "i"),
    "long": ("q", "q"),
    "float": ("f4x", "f"),
    "double": ("d", "d"),
    "date": ("i4x", "i"),
    "timestamp": ("q", "q"),
    "timestamp_ntz": ("q", "q"),
}
#: A variable-length value's slot: offset << 32 | size, unsigned.
_OFFSET_AND_SIZE = ("Q", "Q")
_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(-?\d+)\s*\)")
#: char(n) and varchar(n) are strings in an UnsafeRow; a collated string is a string.
_STRING_LIKE = re.compile(r"(?:char|varchar)\(\d+\)|string(?: collate \w+)?")
#: Spark's decimals of at most this many digits are stored as their unscaled long.
_MAX_LONG_DIGITS = 18


def _variable_bytes(data: bytes, base: int, raw: int) -> tuple[int, int]:
    """Start and end in ``data`` of the variable-length value whose slot holds ``raw``;
    ``ValueError`` when they fall outside ``data``."""
    start = base + (raw >> 32)
    end = start + (raw & _LOW32)
    if end > len(data):
        raise ValueError(f"a value at byte {start} runs {end - len(data)} bytes past the row")
    return start, end


def _string(data: bytes, base: int, raw: int) -> str:
    start, end = _variable_bytes(data, base, raw)
    # Invalid UTF-8 becomes U+FFFD, as Spark's own conversion of a UTF8String does.
    return data[start:end].decode("utf-8", "replace")


def _binary(data: bytes, base: int, raw: int) -> bytes:
    start, end = _variable_bytes(data, base, raw)
    return data[start:end]


def _date(data: bytes, base: int, raw: int) -> date:
    return date.fromordinal(_EPOCH_ORDINAL + raw)


# State keys repeat their timestamps (every key of a window shares its start and end), and
# building a datetime costs about a microsecond: recent ones are kept (they are immutable).
@functools.lru_cache(maxsize=1 << 16)
def _utc_datetime(micros: int) -> datetime:
    return _EPOCH_UTC + timedelta(microseconds=micros)


@functools.lru_cache(maxsize=1 << 16)
def _naive_datetime(micros: int) -> datetime:
    return _EPOCH_NAIVE + timedelta(microseconds=micros)


def _timestamp(data: bytes, base: int, raw: int) -> datetime:
    return _utc_datetime(raw)


def _timestamp_ntz(data: bytes, base: int, raw: int) -> datetime:
    return _naive_datetime(raw)


def _void(data: bytes, base: int, raw: int) -> None:
    return None


def _small_decimal(scale: int) -> Converter:
    if scale == 0:
        return lambda data, base, raw: Decimal(raw)
    return lambda data, base, raw: Decimal(raw).scaleb(-scale, _EXACT)


def _large_decimal(scale: int) -> Converter:
    def convert(data: bytes, base: int, raw: int) -> Decimal:
        start, end = _variable_bytes(data, base, raw)
        unscaled = int.from_bytes(data[start:end], "big", signed=True)
        return Decimal(unscaled).scaleb(-scale, _EXACT)

    return convert


def _set_nulls(values: list[Any], nulls: int) -> None:
    """Put None at every position whose bit is set in the bitmask ``nulls``."""
    position = 0
    while nulls:
        if nulls & 1:
            values[position] = None
        nulls >>= 1
        position += 1


class _Row:
    """The compiled layout of one struct: its unpacker, its converters, and ``decode_at``,
    a function written for this layout (see ``_decode_function``)."""

    __slots__ = ("converters", "decode_at", "names", "unpack_from", "words")

    def __init__(self, struct_type: Mapping[str, Any], path: str) -> None:
        fields = struct_type.get("fields")
        if not isinstance(fields, list):
            raise UnsupportedStateTypeError(f"not a struct type at {path or 'the top'}: no fields")
        self.names = tuple(str(field["name"]) for field in fields)
        self.words = (len(fields) + 63) // 64
        codes = ["Q" * self.words]
        converters = []
        for index, field in enumerate(fields):
            name = f"{path}.{field['name']}" if path else str(field["name"])
            slot_code, _element_code, convert = _compile(field["type"], name)
            codes.append(slot_code)
            if convert is not None:
                converters.append((index, convert))
        self.unpack_from = struct.Struct("<" + "".join(codes)).unpack_from
        self.converters = tuple(converters)
        self.decode_at = _decode_function(self)

    def values(self, data: bytes, base: int) -> tuple[Any, ...]:
        """The row starting at ``base`` in ``data``, one Python value per field: the
        general path, for rows with nulls (``decode_at`` takes the others)."""
        raw = self.unpack_from(data, base)
        words = self.words
        nulls = raw[0] if words == 1 else sum(w << (64 * k) for k, w in enumerate(raw[:words]))
        values = list(raw[words:])
        for index, convert in self.converters:
            if not (nulls >> index) & 1:
                values[index] = convert(data, base, values[index])
        _set_nulls(values, nulls)
        return tuple(values)


def _decode_function(row: _Row) -> Callable[[bytes, int], tuple[Any, ...]]:
    """``decode_at(data, base)`` for ``row``'s layout, as straight-line code: one unpack
    into named slots, then the tuple of values with each converter called in place. A
    loop over the fields in every row cost about twice as much; a row with any null bit
    goes to ``row.values``. The code is made from field positions only (never names)."""
    count = len(row.names)
    if count == 0:
        return lambda data, base: ()
    converted = {index for index, _ in row.converters}
    words = [f"w{k}" for k in range(row.words)]
    slots = [f"v{i}" for i in range(count)]
    items = [f"c{i}(data, base, v{i})" if i in converted else f"v{i}" for i in range(count)]
    source = (
        "def decode_at(data, base):\n"
        f"    {', '.join(words + slots)}, = unpack_from(data, base)\n"
        f"    if {' or '.join(words)}:\n"
        "        return with_nulls(data, base)\n"
        f"    return ({', '.join(items)},)\n"
    )
    namespace: dict[str, Any] = {"unpack_from": row.unpack_from, "with_nulls": row.values}
    namespace.update((f"c{index}", convert) for index, convert in row.converters)
    exec(compile(source, f"<UnsafeRow decoder of {count} fields>", "exec"), namespace)
    return namespace["decode_at"]


def _struct_converter(struct_type: Mapping[str, Any], path: str) -> Converter:
    row = _Row(struct_type, path)
    names = row.names
    values = row.decode_at

    def convert(data: bytes, base: int, raw: int) -> dict[str, Any]:
        start, _end = _variable_bytes(data, base, raw)
        return dict(zip(names, values(data, start), strict=True))

    return convert


def _hashable(value: Any) -> Any:
    """``value`` as a dict key: structs (dicts) and arrays (lists) become tuples."""
    if isinstance(value, dict):
        return tuple(_hashable(v) for v in value.values())
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


ArrayReader = Callable[[bytes, int, int], list[Any]]


def _array_reader(element_type: Any, path: str) -> ArrayReader:
    """A function reading the array between ``start`` and ``end`` of ``data`` into a list."""
    _slot_code, code, convert = _compile(element_type, f"{path}[]")
    width = struct.calcsize(code)

    def read(data: bytes, start: int, end: int) -> list[Any]:
        (count,) = _INT64.unpack_from(data, start)
        words = (count + 63) >> 6
        first = start + 8 + 8 * words
        if count < 0 or first + count * width > end:
            raise ValueError(f"an array at byte {start} of {count} elements overruns its bytes")
        items = list(struct.unpack_from(f"<{count}{code}", data, first))
        nulls = int.from_bytes(data[start + 8 : first], "little") if words else 0
        if convert is not None:
            for index in range(count):
                if not (nulls >> index) & 1:
                    items[index] = convert(data, start, items[index])
        if nulls:
            _set_nulls(items, nulls)
        return items

    return read


def _array_converter(element_type: Any, path: str) -> Converter:
    read = _array_reader(element_type, path)

    def convert(data: bytes, base: int, raw: int) -> list[Any]:
        start, end = _variable_bytes(data, base, raw)
        return read(data, start, end)

    return convert


def _map_converter(key_type: Any, value_type: Any, path: str) -> Converter:
    read_keys = _array_reader(key_type, f"{path}.key")
    read_values = _array_reader(value_type, f"{path}.value")
    complex_keys = isinstance(key_type, Mapping)

    def convert(data: bytes, base: int, raw: int) -> dict[Any, Any]:
        start, end = _variable_bytes(data, base, raw)
        (key_bytes,) = _INT64.unpack_from(data, start)
        middle = start + 8 + key_bytes
        if key_bytes < 0 or middle > end:
            raise ValueError(f"a map at byte {start} has a key array overrunning its bytes")
        keys = read_keys(data, start + 8, middle)
        values = read_values(data, middle, end)
        if len(keys) != len(values):
            raise ValueError(f"a map at byte {start} has {len(keys)} keys, {len(values)} values")
        if complex_keys:
            keys = [_hashable(key) for key in keys]
        return dict(zip(keys, values, strict=True))

    return convert


def _compile(data_type: Any, path: str) -> tuple[str, str, Converter | None]:
    """(row slot code, array element code, converter or None) for a Spark type, as its
    schema JSON spells it; ``UnsupportedStateTypeError`` for a type not decoded yet."""
    if isinstance(data_type, str):
        if data_type in _FIXED_CODES:
            slot, element = _FIXED_CODES[data_type]
            convert = {
                "date": _date,
                "timestamp": _timestamp,
                "timestamp_ntz": _timestamp_ntz,
            }.get(data_type)
            return slot, element, convert
        if _STRING_LIKE.fullmatch(data_type):
            return (*_OFFSET_AND_SIZE, _string)
        if data_type == "binary":
            return (*_OFFSET_AND_SIZE, _binary)
        if data_type == "void":  # always null (dropDuplicates' placeholder value column)
            return "q", "q", _void
        if data_type == "decimal":  # Spark's name for its default decimal(10,0)
            data_type = "decimal(10,0)"
        match = _DECIMAL.fullmatch(data_type)
        if match:
            precision, scale = int(match[1]), int(match[2])
            if precision <= _MAX_LONG_DIGITS:
                return "q", "q", _small_decimal(scale)
            return (*_OFFSET_AND_SIZE, _large_decimal(scale))
    elif isinstance(data_type, Mapping):
        kind = data_type.get("type")
        if kind == "struct":
            return (*_OFFSET_AND_SIZE, _struct_converter(data_type, path))
        if kind == "array":
            return (*_OFFSET_AND_SIZE, _array_converter(data_type["elementType"], path))
        if kind == "map":
            convert = _map_converter(data_type["keyType"], data_type["valueType"], path)
            return (*_OFFSET_AND_SIZE, convert)
        data_type = kind or data_type
    raise UnsupportedStateTypeError(
        f"not supported yet: state column {path!r} of type {json.dumps(data_type)}"
    )


@dataclass(frozen=True, eq=False)  # numpy arrays: identity, not ==
class Column:
    """One top-level field of many rows, decoded by ``RowDecoder.decode_columns``.

    ``kind`` is what the field holds (a key of ``_BULK_KINDS``, or ``"struct"``);
    ``values`` one number per row (numpy: ``bool``, ``int8`` to ``int64``, ``float32``,
    ``float64``; a date's days and a timestamp's microseconds since 1970-01-01,
    unchecked), or for a string, binary or struct field where its bytes start in the
    buffer the rows came from, with ``sizes`` their lengths; ``nulls`` marks the null
    rows (``None``: no null), whose ``values`` mean nothing."""

    kind: str
    values: np.ndarray
    sizes: np.ndarray | None = None
    nulls: np.ndarray | None = None


#: Field types ``decode_columns`` reads, by what they hold: the slot's low bits as a
#: numpy type (``bytes`` for a string or binary: offset and size).
_BULK_KINDS: dict[str, Any] = {
    "boolean": np.bool_,
    "byte": np.int8,
    "short": np.int16,
    "integer": np.int32,
    "long": np.int64,
    "float": np.float32,
    "double": np.float64,
    # Days since 1970-01-01; microseconds since 1970-01-01 (UTC, or a wall-clock time):
    # the numbers ``decode`` turns into a date or a datetime.
    "date": np.int32,
    "timestamp": np.int64,
    "timestamp_ntz": np.int64,
    "string": bytes,
    "binary": bytes,
}
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


#: The kind of a nested struct field in ``decode_columns(structs=True)``: where its row is
#: (an offset and a size in its slot, as a string's).
_STRUCT = "struct"


def _is_struct(data_type: Any) -> bool:
    return isinstance(data_type, Mapping) and data_type.get("type") == "struct"


def _bulk_kind(data_type: Any) -> str | None:
    if not isinstance(data_type, str):
        return None
    if data_type in _BULK_KINDS:
        return data_type
    return "string" if _STRING_LIKE.fullmatch(data_type) else None


class RowDecoder:
    """Decodes UnsafeRows of one schema: ``decode(bytes)`` gives one Python value per
    top-level field, as a tuple (the module docstring lists the values).

    ``schema`` is a StructType as Spark writes it in JSON (the dict, or its text), as the
    checkpoint's schema files hold it. Everything that depends only on the schema (field
    offsets, unpackers, converters) is worked out here, once; unsupported types raise
    ``UnsupportedStateTypeError`` here, before any row is read."""

    def __init__(self, schema: Mapping[str, Any] | str) -> None:
        parsed = json.loads(schema) if isinstance(schema, str) else schema
        if not isinstance(parsed, Mapping) or parsed.get("type") != "struct":
            raise UnsupportedStateTypeError(f"not a struct type: {str(schema)[:200]}")
        self.schema: Mapping[str, Any] = parsed
        row = _Row(parsed, "")
        #: The top-level field names, in order (the tuple ``decode`` returns follows it).
        self.names: tuple[str, ...] = row.names
        self._decode_at = row.decode_at
        kinds = [_bulk_kind(field["type"]) for field in parsed["fields"]]
        bulk = [kind for kind in kinds if kind is not None]
        #: What each field holds, for ``decode_columns`` (``None``: not a flat schema
        #: of numbers, booleans, strings, binaries, dates and timestamps).
        self.kinds: tuple[str, ...] | None = tuple(bulk) if len(bulk) == len(kinds) else None
        nested = [_STRUCT if _is_struct(f["type"]) else k
                  for f, k in zip(parsed["fields"], kinds, strict=True)]  # fmt: skip
        #: ``kinds`` with a nested struct field as ``"struct"`` (``decode_columns(structs=True)``).
        self._nested_kinds = tuple(nested) if None not in nested else None
        self._words = row.words

    def decode(self, data: bytes) -> tuple[Any, ...]:
        """The row ``data`` (an UnsafeRow of this decoder's schema) as a tuple of Python
        values; ``RowDecodeError`` when the bytes cannot be such a row."""
        if type(data) is not bytes:
            data = bytes(data)
        try:
            return self._decode_at(data, 0)
        except (struct.error, ValueError, IndexError, OverflowError) as exc:
            raise RowDecodeError(
                f"{len(data)} bytes are not a row of {len(self.names)} fields "
                f"({', '.join(self.names)}): {exc}"
            ) from None

    def decode_columns(
        self, data: bytes, starts: np.ndarray, lengths: np.ndarray, *, structs: bool = False
    ) -> list[Column] | None:
        """The rows ``data[starts[i]:starts[i] + lengths[i]]`` (``int64`` arrays), one
        ``Column`` per field: what ``decode`` gives each row, held column-wise. ``None``
        when this schema is not one of numbers, booleans, strings, binaries, dates and
        timestamps (``kinds``), and when any row is one ``decode`` would refuse: shorter
        than its null words and slots, a null bit past the last field, a string running
        past its row's end. A date or timestamp past Python's years is not refused here:
        its days or microseconds are kept, and whoever writes them checks their range.
        With ``structs``, a nested struct field is served too, as a column of kind
        ``"struct"`` saying where each row's nested row lies (``values``: its start,
        ``sizes``: its length), for the struct's own decoder to read."""
        kinds = self._nested_kinds if structs else self.kinds
        if kinds is None:
            return None
        words, fields = self._words, len(kinds)
        width = 8 * (words + fields)
        n = len(starts)
        if n and (int(lengths.min()) < width or int((starts + width).max()) > len(data)):
            return None
        buffer = np.frombuffer(data, dtype=np.uint8)
        if n and width:
            rows = np.lib.stride_tricks.sliding_window_view(buffer, width)[starts]
            slots = rows.view("<u8")
        else:
            slots = np.zeros((n, words + fields), dtype=np.uint64)
        nulls_of = None
        if words and slots[:, :words].any():
            last = fields - 64 * (words - 1)  # fields in the last null word
            if last < 64 and (slots[:, words - 1] >> np.uint64(last)).any():
                return None  # a null bit past the last field: ``decode`` refuses the row

            def nulls_of(index: int) -> np.ndarray | None:
                bits = (slots[:, index // 64] >> np.uint64(index % 64)) & np.uint64(1)
                return bits.astype(bool) if bits.any() else None

        columns = []
        for index, kind in enumerate(kinds):
            slot = slots[:, words + index]
            nulls = nulls_of(index) if nulls_of is not None else None
            target = bytes if kind == _STRUCT else _BULK_KINDS[kind]
            if target is bytes:
                offsets = (slot >> np.uint64(32)).astype(np.int64)
                sizes = (slot & np.uint64(0xFFFFFFFF)).astype(np.int64)
                outside = offsets + sizes > lengths
                if nulls is not None:
                    outside &= ~nulls
                if outside.any():
                    return None  # ``decode`` refuses a value running past its row
                columns.append(Column(kind, starts + offsets, sizes, nulls))
                continue
            if target is np.bool_:
                values = (slot & np.uint64(0xFF)) != 0
            else:
                size = np.dtype(target).itemsize
                low = slot if size == 8 else slot.astype(_UNSIGNED[size])  # the low bytes
                values = low.view(target)
            columns.append(Column(kind, values, None, nulls))
        return columns
