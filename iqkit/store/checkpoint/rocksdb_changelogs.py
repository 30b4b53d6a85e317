"""A RocksDB state store changelog's records (``<v>.changelog``, ``rocksdb_files``),
after its decompression: its format told, its lineage read, its records framed and typed.

Why a module of its own: the byte framing of the four changelog formats is one seam,
apart from which files rebuild a version (``rocksdb_files``) and what a record's key and
value hold. Format 1 has no header: records ``[key size: int32 BE][key][value size:
int32 BE][value]``, a value size of -1 a delete, a key size of -1 the end. Format 3 is
format 1 after ``writeUTF("v3")`` and the lineage text. Formats 2 and 4 (a store in
column families) are formats 1 and 3 with a type byte before each record: 0x01 a put,
0x10 a delete, 0x11 a merge (a list state's append), 0x00 the end.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator

import numpy as np

from .codecs import StateFileError, UnknownFormatError, decompress_state_file
from .hdfs_files import frame_records
from .shape import UnsupportedStateError
from .state_records import StateRecords

__all__ = [
    "COLUMN_FAMILIES",
    "DELETE",
    "MERGE",
    "PUT",
    "framed_records",
    "lineage",
    "records",
    "records_of",
]

_INT32_BE = struct.Struct(">i")
_UTF_LENGTH = struct.Struct(">H")
COLUMN_FAMILIES = "not supported yet: transformWithState's column families"
#: Changelog formats 2 and 4's record types (the byte before each record); formats 1 and
#: 3 have puts and deletes only.
_END, PUT, DELETE, MERGE = 0x00, 0x01, 0x10, 0x11


def records_of(raw: bytes, where: str) -> tuple[memoryview, int]:
    """(the decompressed changelog, where its records start), the header checked."""
    data = memoryview(decompress_state_file(raw, where))
    version, start = _changelog_format(data)
    if version not in (1, 2, 3, 4):
        raise UnknownFormatError(
            f"{where}: changelog format v{version} is not supported yet (known: v1 to v4)"
        )
    return data, start


def _changelog_format(data: memoryview) -> tuple[int, int]:
    """(format version, offset after the version text). Quirk: format 1 writes no header,
    so Spark reads a ``writeUTF`` text anyway and takes anything that is not ``v<digits>``
    (the start of a record, or a text cut short) as format 1, and so does this."""
    if len(data) >= 2:
        (length,) = _UTF_LENGTH.unpack_from(data)
        text = bytes(data[2 : 2 + length])
        if len(text) == length and text[:1] == b"v" and text[1:].isdigit():
            version = int(text[1:])
            return (1, 0) if version == 1 else (version, 2 + length)
    return 1, 0


def lineage(records: tuple[memoryview, int], where: str) -> list[tuple[int, str]]:
    """The (version, unique id) pairs a format-3 changelog's lineage text names."""
    data, start = records
    if start == 0:
        raise StateFileError(f"{where}: a changelog with a unique id but no lineage")
    try:
        (length,) = _UTF_LENGTH.unpack_from(data, start)
        items = json.loads(bytes(data[start + 2 : start + 2 + length]))
        return [(int(i["version"]), str(i["checkpointUniqueId"])) for i in items]
    except (struct.error, KeyError, TypeError, ValueError):
        raise StateFileError(f"{where}: damaged lineage") from None


def records(
    data: memoryview, start: int, where: str, *, families: bool
) -> Iterator[tuple[int, memoryview, memoryview | None]]:
    """The (type, key, value or None for a delete) records of a changelog (``start``:
    after the version text; the lineage text of formats 3 and 4 comes next), the framing
    checked to the last byte. Formats 1 and 3 hold puts and deletes; formats 2 and 4 (a
    type byte before each record: column families) are read only for ``families``."""
    version = _changelog_format(data)[0] if start else 1
    position = start + 2 + _UTF_LENGTH.unpack_from(data, start)[0] if version in (3, 4) else start
    if version in (2, 4):
        if not families:
            raise UnsupportedStateError(f"{COLUMN_FAMILIES} ({where})")
        yield from _typed_records(data, position, where)
        return
    end = len(data)
    take = _INT32_BE.unpack_from
    try:
        (key_size,) = take(data, position)
        while key_size != -1:
            key, value, position = _framed(data, position)
            yield (PUT if value is not None else DELETE), key, value
            (key_size,) = take(data, position)
        position += 4
    except (ValueError, struct.error) as exc:
        raise StateFileError(f"{where}: damaged records ({exc})") from None
    if position != end:
        raise StateFileError(f"{where}: {end - position} bytes after the last record")


def framed_records(data: memoryview, start: int, where: str) -> StateRecords | None:
    """``records`` of a changelog of format 1 or 3 held column-wise (``state_records``),
    for a plain store's first open in bulk: the keys' and values' rows without Spark's
    encoding version byte, deletes marked ``removed``. ``None`` (read them with
    ``records``, which names what is wrong) for formats 2 and 4, and where a key or value
    does not start with the version byte 0. ``StateFileError`` for damaged framing."""
    version = _changelog_format(data)[0] if start else 1
    if version in (2, 4):
        return None
    position = start + 2 + _UTF_LENGTH.unpack_from(data, start)[0] if version == 3 else start
    framed = frame_records(where, bytes(data[position:]))
    live = np.ones(len(framed), dtype=bool) if framed.removed is None else ~framed.removed
    buffer = np.frombuffer(framed.data, dtype=np.uint8)
    if (
        (framed.key_lengths < 1).any()
        or (framed.value_lengths[live] < 1).any()
        or buffer[framed.key_starts].any()
        or buffer[framed.value_starts[live]].any()
    ):
        return None
    return StateRecords(
        framed.data, framed.key_starts + 1, framed.key_lengths - 1,
        np.where(live, framed.value_starts + 1, framed.value_starts),
        np.where(live, framed.value_lengths - 1, 0), framed.removed,
    )  # fmt: skip


def _framed(data: memoryview, position: int) -> tuple[memoryview, memoryview | None, int]:
    """The record at ``position``: ``[key size: int32 BE][key][value size: int32 BE]
    [value]`` (a value size of -1: a delete, no value), and the position after it;
    ``ValueError`` (or ``struct.error``) where the sizes do not fit the data."""
    end = len(data)
    take = _INT32_BE.unpack_from
    (key_size,) = take(data, position)
    if key_size < 0 or position + 8 + key_size > end:
        raise ValueError(f"bad key size {key_size} at byte {position}")
    key = data[position + 4 : position + 4 + key_size]
    position += 4 + key_size
    (value_size,) = take(data, position)
    position += 4
    if value_size == -1:
        return key, None, position
    if not 0 <= value_size <= end - position:
        raise ValueError(f"bad value size {value_size} at byte {position - 4}")
    return key, data[position : position + value_size], position + value_size


def _typed_records(
    data: memoryview, position: int, where: str
) -> Iterator[tuple[int, memoryview, memoryview | None]]:
    """``_records`` of changelog formats 2 and 4 from ``position`` (after the lineage
    text of format 4): a type byte before each record, then format 1's framing (a put and
    a merge with a value, a delete without); a type byte 0 ends the file."""
    end = len(data)
    try:
        while True:
            if position >= end:
                raise ValueError("no end record")
            kind = data[position]
            position += 1
            if kind == _END:
                break
            if kind not in (PUT, DELETE, MERGE):
                raise ValueError(f"record type {kind:#04x} at byte {position - 1}")
            at = position
            key, value, position = _framed(data, position)
            if (value is None) != (kind == DELETE):
                raise ValueError(f"a record of type {kind:#04x} at byte {at} with a wrong value")
            yield kind, key, value
    except (ValueError, struct.error) as exc:
        raise StateFileError(f"{where}: damaged records ({exc})") from None
    if position != end:
        raise StateFileError(f"{where}: {end - position} bytes after the last record")
