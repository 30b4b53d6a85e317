"""Point reads and full reads of one SST file without opening RocksDB: iqkit's own files,
read in Python, for the reads where building a database costs more than the read.

A RocksDB database is the fast way to read a chain many times, but making one costs
milliseconds before the first read (creating the database, ingesting each file: 2-5 ms
here). A key's history over 100 versions needs one value from each of about 100 files,
and RocksDB's iterators never show a tombstone, which a change feed needs. This module
reads the block-based table format directly, for the files iqkit itself writes
(``rocks.write_changes_sst``): format version 6, Snappy or no compression, a binary-search
index whose keys are user keys and whose handles are delta-encoded, point deletes only.
Anything else (another writer's options, a future format, a damaged file) raises
``UnsupportedSst``, and the caller reads the file through RocksDB instead: this reader
is an optimisation, never the only way.

The format, as RocksDB writes it:

* The file ends with a 53-byte footer: checksum type (1 byte), an extended magic number
  (4), the footer's checksum (4), a base context checksum (4), the metaindex block's size
  (4), 24 bytes of padding, the format version (4) and the table magic number (8). The
  metaindex block lies just before the footer, less a block trailer.
* Every block is followed by a 5-byte trailer: its compression type (0 none, 1 Snappy,
  whose raw format carries its own length) and a checksum, verified here before the
  block is used, as RocksDB verifies it (kXXH3 with format version 6's context modifier):
  a mismatch is ``StoreCorruptedError`` naming the file (damage is never read another
  way). Damage to the footer either fails a block's check (its base context checksum,
  the metaindex's size) or makes the file one this reader refuses, which RocksDB then
  reads and checks, footer checksum included.
* A block is a run of entries, then ``num_restarts`` little-endian uint32 offsets of the
  entries that start with no shared key prefix, then ``num_restarts`` itself (its high
  bits flag a hash index or separated values, neither of which iqkit writes). An entry
  is ``shared``, ``non_shared`` and (not in delta-encoded index blocks) ``value_length``
  as varints, the key's unshared tail, the value.
* Data block keys are internal keys: the user key, then 8 bytes holding the sequence
  number and the entry's type (1 a value, 0 or 7 a delete). Index keys are user keys
  (``rocksdb.index.key.is.user.key``); each separates its data block from the next.
  A restart entry's index value is a block handle (two varints, offset and size);
  the others hold only the size's difference from the previous handle's, whose block
  their own follows.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import BinaryIO

from xxhash import xxh3_64_intdigest as _xxh3

from ...errors import StoreCorruptedError

__all__ = ["MISSING", "SstFile", "UnsupportedSst"]

#: What ``SstFile.get`` returns for a key the file does not hold (a tombstone is None).
MISSING = object()

_MAGIC = 0x88E241B785F4CFF7
_EXTENDED_MAGIC = b"\x3e\x00\x7a\x00"
_FOOTER = 53
_TRAILER = 5
_NO_COMPRESSION, _SNAPPY = 0, 1
_HASH_INDEX_BIT = 1 << 31
_UNIFORM_KEYS_BIT = 1 << 29
_SEPARATED_KV_BIT = 1 << 28
_TYPE_DELETION, _TYPE_VALUE, _TYPE_SINGLE_DELETION = 0, 1, 7
#: Bytes read at once from a file's end when it is opened.
_TAIL_BYTES = 64 * 1024
_UINT32 = struct.Struct("<I")
#: The footer's checksum type iqkit's files use (RocksDB's kXXH3), and what RocksDB
#: mixes the block's last (compression type) byte in with.
_CHECKSUM_XXH3 = 4
_XXH3_LAST_BYTE = 0x6B9083D9
_MASK32 = 0xFFFFFFFF
_UINT64 = struct.Struct("<Q")


class UnsupportedSst(Exception):
    """The file is not one this reader knows how to read (module docstring): read it
    through RocksDB."""


def _varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise UnsupportedSst("a varint longer than 64 bits")


def _signed(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


class _Block:
    """A decoded block's bytes and restart points."""

    __slots__ = ("data", "end", "restarts")

    def __init__(self, data: bytes) -> None:
        if len(data) < 4:
            raise UnsupportedSst("a block too short for its footer")
        packed = _UINT32.unpack_from(data, len(data) - 4)[0]
        if packed & (_HASH_INDEX_BIT | _SEPARATED_KV_BIT):
            raise UnsupportedSst("a data block hash index or separated values")
        count = packed & ~_UNIFORM_KEYS_BIT
        self.end = len(data) - 4 - 4 * count
        if count < 1 or self.end < 0:
            raise UnsupportedSst("a block's restart array does not fit")
        self.data = data
        self.restarts = struct.unpack_from(f"<{count}I", data, self.end)

    def entry(self, pos: int, *, value_length: bool = True) -> tuple[int, int, int, int]:
        """(shared, non_shared, value_length or -1, the position of the key tail)."""
        data = self.data
        shared, non_shared = data[pos], data[pos + 1]
        if value_length:
            length = data[pos + 2]
            if (shared | non_shared | length) < 128:
                return shared, non_shared, length, pos + 3
            shared, pos = _varint(data, pos)
            non_shared, pos = _varint(data, pos)
            length, pos = _varint(data, pos)
            return shared, non_shared, length, pos
        if (shared | non_shared) < 128:
            return shared, non_shared, -1, pos + 2
        shared, pos = _varint(data, pos)
        non_shared, pos = _varint(data, pos)
        return shared, non_shared, -1, pos

    def entries(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) of a block with value lengths, in order."""
        data, pos, key = self.data, 0, b""
        while pos < self.end:
            shared, non_shared, length, pos = self.entry(pos)
            key = key[:shared] + data[pos : pos + non_shared]
            pos += non_shared
            yield key, data[pos : pos + length]
            pos += length


class SstFile:
    """One SST file read from ``fh`` (a binary file the caller opened, as its root allows:
    through no link), for reads (module docstring); ``UnsupportedSst`` when it is not one
    this reader knows. ``close`` closes ``fh``."""

    def __init__(self, fh: BinaryIO, *, name: str | None = None) -> None:
        self._fh = fh
        #: The file's place on its root, for messages (None: unnamed).
        self.name = name
        self._base_context = 0
        try:
            self._open()
        except (UnsupportedSst, StoreCorruptedError, OSError):
            self._fh.close()
            raise
        except (ValueError, IndexError, struct.error) as exc:
            self._fh.close()
            raise UnsupportedSst(f"cannot parse: {exc}") from None

    def _read(self, offset: int, size: int) -> bytes:
        tail = self._tail_at
        if offset >= tail and offset + size <= tail + len(self._tail):
            return self._tail[offset - tail : offset - tail + size]
        # pread: no shared file position, so readers on several threads may share it
        data = os.pread(self._fh.fileno(), size, offset)
        if len(data) != size:
            raise UnsupportedSst("a block past the end of the file")
        return data

    def _block(self, offset: int, size: int) -> bytes:
        raw = self._read(offset, size + _TRAILER)
        kind = raw[size]
        # The trailer's checksum, exactly as RocksDB checks it (kXXH3, format version 6):
        # the low 32 bits of XXH3-64 of the block's bytes, the compression-type byte
        # mixed in, plus a modifier of the file's base context checksum and the block's
        # offset. A mismatch is damage, never a reason to read the file another way.
        stored = _UINT32.unpack_from(raw, size + 1)[0]
        computed = (_xxh3(memoryview(raw)[:size]) & _MASK32) ^ ((kind * _XXH3_LAST_BYTE) & _MASK32)
        computed = (computed + self._modifier(offset)) & _MASK32
        if computed != stored:
            raise StoreCorruptedError(
                f"{self.name or 'an SST file'} is damaged: its block at offset {offset} "
                f"({size} bytes) fails its checksum"
            )
        if kind == _NO_COMPRESSION:
            return raw[:size]
        if kind == _SNAPPY:
            import pyarrow as pa  # a Snappy decoder at hand wherever iqkit runs

            length, _start = _varint(raw, 0)
            return pa.Codec("snappy").decompress(  # type: ignore[no-any-return]
                raw[:size], decompressed_size=length, asbytes=True
            )
        raise UnsupportedSst(f"compression type {kind}")

    def _open(self) -> None:
        size = os.fstat(self._fh.fileno()).st_size
        if size < _FOOTER:
            raise UnsupportedSst("shorter than a footer")
        # The file's end (footer, metaindex, properties, index: a delta file whole) in
        # one read: most reads of a small file are then slices of it.
        self._tail_at = max(0, size - _TAIL_BYTES)
        self._tail = b""
        self._tail = self._read(self._tail_at, size - self._tail_at)
        footer_offset = size - _FOOTER
        footer = self._read(footer_offset, _FOOTER)
        if _UINT64.unpack_from(footer, _FOOTER - 8)[0] != _MAGIC:
            raise UnsupportedSst("not a block-based table")
        version = _UINT32.unpack_from(footer, _FOOTER - 12)[0]
        if version != 6 or footer[1:5] != _EXTENDED_MAGIC:
            raise UnsupportedSst(f"format version {version}")
        if _UINT64.unpack_from(footer, 33)[0] != 0:
            raise UnsupportedSst("a future feature in the footer")
        if footer[0] != _CHECKSUM_XXH3:
            raise UnsupportedSst(f"checksum type {footer[0]}")
        self._base_context = _UINT32.unpack_from(footer, 9)[0]
        meta_size = _UINT32.unpack_from(footer, 13)[0]
        meta = _Block(self._block(footer_offset - _TRAILER - meta_size, meta_size))
        handles = {}
        for name, value in meta.entries():
            offset, pos = _varint(value, 0)
            length, _ = _varint(value, pos)
            handles[name] = (offset, length)
        if b"rocksdb.index" not in handles or b"rocksdb.properties" not in handles:
            raise UnsupportedSst("no index or properties block")
        props = dict(_Block(self._block(*handles[b"rocksdb.properties"])).entries())

        def number(name: bytes) -> int:
            value = props.get(name)
            return -1 if value is None else _varint(value, 0)[0]

        index_type = props.get(b"rocksdb.block.based.table.index.type")
        if index_type is None or _UINT32.unpack_from(index_type)[0] != 0:
            raise UnsupportedSst("an index other than a binary search")
        if number(b"rocksdb.index.key.is.user.key") != 1:
            raise UnsupportedSst("index keys are internal keys")
        self._delta = number(b"rocksdb.index.value.is.delta.encoded") == 1
        if number(b"rocksdb.num.range-deletions") not in (0, -1):
            raise UnsupportedSst("range deletions")
        if props.get(b"rocksdb.comparator", b"leveldb.BytewiseComparator") != (
            b"leveldb.BytewiseComparator"
        ):
            raise UnsupportedSst("a comparator other than bytewise")
        self._index = _Block(self._block(*handles[b"rocksdb.index"]))
        self._restarts = frozenset(self._index.restarts)

    def _modifier(self, offset: int) -> int:
        """RocksDB's ``ChecksumModifierForContext``: 0 when the file has no base context
        checksum, else the base xor the offset's two 32-bit halves added."""
        base = self._base_context
        if base == 0:
            return 0
        return (base ^ (((offset & _MASK32) + (offset >> 32)) & _MASK32)) & _MASK32

    # -- the index ------------------------------------------------------------------------
    def _restart_key(self, restart: int) -> bytes:
        block = self._index
        _shared, non_shared, _length, pos = block.entry(
            block.restarts[restart], value_length=not self._delta
        )
        return block.data[pos : pos + non_shared]

    def _index_from(self, restart: int) -> Iterator[tuple[bytes, tuple[int, int]]]:
        """(index key, data block handle) of every entry from restart point ``restart``
        on, in order."""
        block = self._index
        data, restarts = block.data, self._restarts
        pos, key, handle = block.restarts[restart], b"", (0, 0)
        while pos < block.end:
            at = pos
            shared, non_shared, _length, pos = block.entry(pos, value_length=not self._delta)
            key = key[:shared] + data[pos : pos + non_shared]
            pos += non_shared
            if self._delta and at not in restarts:
                delta, pos = _varint(data, pos)
                handle = (handle[0] + handle[1] + _TRAILER, handle[1] + _signed(delta))
            else:
                offset, pos = _varint(data, pos)
                size, pos = _varint(data, pos)
                handle = (offset, size)
            yield key, handle

    def _find_block(self, key: bytes) -> tuple[int, int] | None:
        """The handle of the first data block whose index key is >= ``key`` (the only
        block that can hold it), or None past the last."""
        lo, hi = 0, len(self._index.restarts)
        while lo < hi:  # the first restart whose key is >= key
            mid = (lo + hi) // 2
            if self._restart_key(mid) < key:
                lo = mid + 1
            else:
                hi = mid
        for index_key, handle in self._index_from(max(lo - 1, 0)):
            if index_key >= key:
                return handle
        return None

    # -- reads ----------------------------------------------------------------------------
    def get(self, key: bytes) -> bytes | object | None:
        """``key``'s value in this file: its bytes, ``None`` for a tombstone, ``MISSING``
        when the file does not hold it."""
        try:
            handle = self._find_block(key)
            if handle is None:
                return MISSING
            block = _Block(self._block(*handle))
            restarts, data = block.restarts, block.data
            lo, hi = 0, len(restarts) - 1
            while lo < hi:  # the last restart whose user key is <= key
                mid = (lo + hi + 1) // 2
                _s, non_shared, _l, pos = block.entry(restarts[mid])
                if data[pos : pos + non_shared - 8] <= key:
                    lo = mid
                else:
                    hi = mid - 1
            pos, current = restarts[lo], b""
            while pos < block.end:
                shared, non_shared, length, pos = block.entry(pos)
                current = current[:shared] + data[pos : pos + non_shared]
                pos += non_shared
                user = current[:-8]
                if user == key:
                    return _value(current, data[pos : pos + length])
                if user > key:
                    return MISSING
                pos += length
            return MISSING
        except (ValueError, IndexError, struct.error) as exc:
            raise UnsupportedSst(f"cannot parse: {exc}") from None

    def items(self) -> Iterator[tuple[bytes, bytes | None]]:
        """Every (user key, value or None for a tombstone), in key order."""
        try:
            for handle in self._all_blocks():
                for internal, value in _Block(self._block(*handle)).entries():
                    yield internal[:-8], _value(internal, value)
        except (ValueError, IndexError, struct.error) as exc:
            raise UnsupportedSst(f"cannot parse: {exc}") from None

    def _all_blocks(self) -> Iterator[tuple[int, int]]:
        for _key, handle in self._index_from(0):
            yield handle

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> SstFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _value(internal: bytes, value: bytes) -> bytes | None:
    kind = internal[-8]
    if kind == _TYPE_VALUE:
        return value
    if kind in (_TYPE_DELETION, _TYPE_SINGLE_DELETION):
        return None
    raise UnsupportedSst(f"an entry of type {kind}")
