"""Spark's Avro encoding of state rows (``spark.sql.streaming.stateStore.encodingFormat=avro``,
transformWithState only) decoded into the Python values ``unsafe_row`` gives, without Spark.

Why: with that setting Spark keeps each key and value of a transformWithState store as an
Avro binary datum (no container, no header) instead of an UnsafeRow, so reading such a
checkpoint needs an Avro decoder driven by the state schema.

Decoded straight from Spark's ``StructType`` (the schema file's JSON), the way Spark's
``toAvroTypeWithDefaults`` turns it into an Avro schema: a struct is a record whose
fields come in order, **every field a union of null and its type** (branch 0 null, 1 the
value: one zig-zag varint, 0x00 or 0x02), whether or not Spark marks it nullable, nested
structs alike; an array's elements and a map's values are such unions where Spark lets
them be null (``containsNull`` / ``valueContainsNull``); a map's keys are strings. Values:
boolean one byte; byte, short, integer and date (days since 1970-01-01) a zig-zag varint;
long, timestamp and timestamp_ntz (microseconds) a zig-zag varint; float and double 4
and 8 bytes little-endian; string and binary a varint length and the bytes; an array or
map blocks of a varint count (a negative count is followed by the block's size in bytes)
ending with a count of 0; ``void`` nothing at all. Decimals (Avro ``fixed``) are refused
in one line. Anything that does not decode is ``RowDecodeError``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from datetime import date, timedelta
from typing import Any

from .unsafe_row import (  # one home of the epochs
    RowDecodeError,
    UnsupportedStateTypeError,
    _naive_datetime,
    _utc_datetime,
)

__all__ = ["AvroRowDecoder"]

_EPOCH_DAY = date(1970, 1, 1)
_FLOAT = struct.Struct("<f")
_DOUBLE = struct.Struct("<d")

#: Reads one value at a position: (value, next position).
Reader = Callable[[bytes, int], tuple[Any, int]]


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """A zig-zag varint (Avro's int and long)."""
    shift = result = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), position
        shift += 7
        if shift > 70:
            raise ValueError("a varint longer than 10 bytes")


def _bytes(data: bytes, position: int) -> tuple[bytes, int]:
    size, position = _varint(data, position)
    end = position + size
    if size < 0 or end > len(data):
        raise ValueError(f"a length of {size} past the end")
    return bytes(data[position:end]), end


def _string(data: bytes, position: int) -> tuple[str, int]:
    raw, position = _bytes(data, position)
    return raw.decode("utf-8", "replace"), position


def _boolean(data: bytes, position: int) -> tuple[bool, int]:
    return data[position] != 0, position + 1


def _float(data: bytes, position: int) -> tuple[float, int]:
    return _FLOAT.unpack_from(data, position)[0], position + 4


def _double(data: bytes, position: int) -> tuple[float, int]:
    return _DOUBLE.unpack_from(data, position)[0], position + 8


def _void(data: bytes, position: int) -> tuple[None, int]:
    return None, position


def _converted(read: Reader, convert: Callable[[Any], Any]) -> Reader:
    def reader(data: bytes, position: int) -> tuple[Any, int]:
        value, position = read(data, position)
        return convert(value), position

    return reader


def _nullable(read: Reader) -> Reader:
    """A union of null (branch 0) and ``read``'s type (branch 1)."""

    def reader(data: bytes, position: int) -> tuple[Any, int]:
        branch, position = _varint(data, position)
        if branch == 0:
            return None, position
        if branch != 1:
            raise ValueError(f"union branch {branch} (Spark writes 0 or 1)")
        return read(data, position)

    return reader


def _blocks(read_item: Reader) -> Callable[[bytes, int], tuple[list[Any], int]]:
    def reader(data: bytes, position: int) -> tuple[list[Any], int]:
        items: list[Any] = []
        count, position = _varint(data, position)
        while count != 0:
            if count < 0:
                count = -count
                _, position = _varint(data, position)  # the block's size in bytes
            for _ in range(count):
                item, position = read_item(data, position)
                items.append(item)
            count, position = _varint(data, position)
        return items, position

    return reader


def _record(fields: list[tuple[str, Reader]]) -> Callable[[bytes, int], tuple[dict, int]]:
    def reader(data: bytes, position: int) -> tuple[dict[str, Any], int]:
        out = {}
        for name, read in fields:
            out[name], position = read(data, position)
        return out, position

    return reader


def _compile(data_type: Any, path: str) -> Reader:
    """The reader of one value of Spark type ``data_type`` (not the union around it)."""
    if isinstance(data_type, str):
        simple: dict[str, Reader] = {
            "boolean": _boolean,
            "byte": _varint,
            "short": _varint,
            "integer": _varint,
            "long": _varint,
            "float": _float,
            "double": _double,
            "string": _string,
            "binary": _bytes,
            "void": _void,
            "timestamp": _converted(_varint, _utc_datetime),
            "timestamp_ntz": _converted(_varint, _naive_datetime),
            "date": _converted(_varint, _days),
        }
        found = simple.get(data_type)
        if found is None:
            raise UnsupportedStateTypeError(
                f"not supported yet: a state column of type {data_type} in Avro ({path})"
            )
        return found
    kind = data_type.get("type")
    if kind == "struct":
        record = _record(
            [(f["name"], _field(f["type"], f"{path}.{f['name']}")) for f in data_type["fields"]]
        )
        return record
    if kind == "array":
        item = _compile(data_type["elementType"], f"{path}[]")
        return _blocks(_nullable(item) if data_type.get("containsNull", True) else item)
    if kind == "map":
        key = _compile(data_type["keyType"], f"{path}{{key}}")
        value = _compile(data_type["valueType"], f"{path}{{value}}")
        if data_type.get("valueContainsNull", True):
            value = _nullable(value)

        def pair(data: bytes, position: int) -> tuple[tuple[Any, Any], int]:
            k, position = key(data, position)
            v, position = value(data, position)
            return (k, v), position

        pairs = _blocks(pair)
        return _converted(pairs, dict)
    raise UnsupportedStateTypeError(
        f"not supported yet: a state column of type {kind} in Avro ({path})"
    )


def _days(days: int) -> date:
    return _EPOCH_DAY + timedelta(days=days)


def _field(data_type: Any, path: str) -> Reader:
    """A record field: a union with null, except ``void`` (no bytes at all)."""
    read = _compile(data_type, path)
    return read if data_type == "void" else _nullable(read)


class AvroRowDecoder:
    """Decodes Avro datums of one state schema (Spark's JSON ``StructType``) into tuples,
    one value per top-level field, as ``unsafe_row.RowDecoder`` does for UnsafeRows."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self._fields = [
            (f["name"], _field(f["type"], str(f["name"]))) for f in schema.get("fields", [])
        ]

    def decode_at(self, data: bytes, position: int = 0) -> tuple[tuple[Any, ...], int]:
        """(the row at ``position``, the position after it)."""
        values = []
        try:
            for _, read in self._fields:
                value, position = read(data, position)
                values.append(value)
        except (ValueError, IndexError, struct.error, UnicodeDecodeError) as exc:
            raise RowDecodeError(f"not an Avro row of the state schema: {exc}") from None
        return tuple(values), position

    def decode(self, data: bytes) -> tuple[Any, ...]:
        """The row that is all of ``data`` (bytes left after it are ``RowDecodeError``)."""
        row, end = self.decode_at(data)
        if end != len(data):
            raise RowDecodeError(f"{len(data) - end} bytes after an Avro row")
        return row
