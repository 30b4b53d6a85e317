"""Point reads and full reads of one SST file without opening RocksDB: iqkit's own files,
read in Python, for the reads where building a database costs more than the read.

A RocksDB database is the fast way to read a chain many times, but making one costs
milliseconds before the first read (creating the database, ingesting each file: 2-5 ms
here). A key's history over 100 versions needs one value from each of about 100 files,
and RocksDB's iterators never show a tombstone, which a change feed needs. This module
reads the block-based table format directly, for the files iqkit itself writes
(``rocks.write_changes_sst``): format version 6, zstd without a dictionary (Snappy in
files written before, or none), a binary-search index whose keys are user keys and whose
handles are delta-encoded, point deletes only.
Anything else (another writer's options, a future format, a file too mangled to find its
blocks in) raises ``UnsupportedSst``, and the caller reads the file through RocksDB
instead, which reports any damage itself: this reader is an optimisation, never the only
way.

Checksums are verified exactly as RocksDB verifies them, because a reader that skips
them answers wrongly from a damaged file: a present key read as absent, or a wrong value
(measured without the checks: 15 wrong answers in 400 single-bit flips of one file, and
in ``tests/store/test_sst_checksums.py``'s 300 flips, cuts and zeroed pages of a
5,000-key file 185 wrong answers from 144 damaged copies; RocksDB, and this reader with
the checks, gave none). The footer's own checksum is checked when the file is opened,
and every block this reader uses (metaindex, properties, index, each data block read) is
checked before it is parsed; a mismatch raises ``StoreCorruptedError`` naming the file
and the block. A block that verified but does not parse is still ``UnsupportedSst``.
The filter block is never read, so never checked. Checking costs one hash of the bytes
read, never the whole file: 1-2 us per 4 KiB block with XXH3, 10-15 us more for a first
lookup (footer, metaindex, properties, index and one data block) of 0.1-0.8 ms.

The format, as RocksDB writes it (``table/format.cc``):

* The file ends with a 53-byte footer: checksum type (1 byte), an extended magic number
  (4), the footer's checksum (4), a base context checksum (4), the metaindex block's size
  (4), 24 bytes of padding, the format version (4) and the table magic number (8). The
  footer's checksum is that of its 53 bytes with the checksum field zeroed, plus the
  context modifier of the footer's offset (below). The metaindex block lies just before
  the footer, less a block trailer.
* Every block is followed by a 5-byte trailer: its compression type (0 none, 1 Snappy,
  whose raw format carries its own length, 7 zstd, its length a varint before the
  frame; a file compressed with a dictionary has a ``rocksdb.compression_dict`` block,
  refused here) and a little-endian uint32 checksum of the block's bytes followed by
  the compression type byte, of the footer's checksum type:
  1 CRC32c (masked: rotated right 15 bits, plus 0xa282ead8; read only when a CRC32c
  library, ``google-crc32c`` or ``crc32c``, is installed, else ``UnsupportedSst``),
  2 xxHash32, 3 the lower 32 bits of xxHash64, 4 (what iqkit's files use, RocksDB's
  default) the lower 32 bits of XXH3-64 of the block's bytes, xor the type byte times
  0x6b9083d9. Type 0 (no checksums) is refused: RocksDB reads those. From format
  version 6 the stored value also has a context modifier added (mod 2**32), so that a
  block read from the wrong place fails: ``base ^ (lower32(offset) + upper32(offset))``,
  ``base`` the footer's base context checksum (never 0), ``offset`` the block's (or the
  footer's) offset in the file.
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

import functools
import os
import struct
from collections.abc import Callable, Iterator
from typing import BinaryIO

import xxhash

from ...errors import StoreCorruptedError

__all__ = ["MISSING", "SstFile", "UnsupportedSst"]

#: What ``SstFile.get`` returns for a key the file does not hold (a tombstone is None).
MISSING = object()

_MAGIC = 0x88E241B785F4CFF7
_EXTENDED_MAGIC = b"\x3e\x00\x7a\x00"
_FOOTER = 53
_TRAILER = 5
_NO_COMPRESSION, _SNAPPY, _ZSTD = 0, 1, 7
_HASH_INDEX_BIT = 1 << 31
_UNIFORM_KEYS_BIT = 1 << 29
_SEPARATED_KV_BIT = 1 << 28
_TYPE_DELETION, _TYPE_VALUE, _TYPE_SINGLE_DELETION = 0, 1, 7
#: Bytes read at once from a file's end when it is opened.
_TAIL_BYTES = 64 * 1024
_UINT32 = struct.Struct("<I")
_MASK32 = 0xFFFFFFFF
#: The footer's checksum types (RocksDB's ChecksumType; iqkit's files use kXXH3).
_CRC32C, _XXHASH, _XXHASH64, _XXH3 = 1, 2, 3, 4
#: What RocksDB's kXXH3 mixes a block's last (compression type) byte in with.
_XXH3_LAST_BYTE = 0x6B9083D9
#: RocksDB's ``crc32c::Mask`` constant.
_CRC_MASK_DELTA = 0xA282EAD8
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


# -- checksums (RocksDB's ComputeBuiltinChecksumWithLastByte, table/format.cc) -----------
#: A checksum function: (the bytes, the byte after them) -> RocksDB's 32-bit checksum.
_Checksum = Callable[[bytes | memoryview, int], int]


def _xxh3(data: bytes | memoryview, last: int) -> int:
    return (xxhash.xxh3_64_intdigest(data) & _MASK32) ^ ((last * _XXH3_LAST_BYTE) & _MASK32)


def _xxh32(data: bytes | memoryview, last: int) -> int:
    state = xxhash.xxh32(data)
    state.update(bytes((last,)))
    return state.intdigest()  # type: ignore[no-any-return]


def _xxh64(data: bytes | memoryview, last: int) -> int:
    state = xxhash.xxh64(data)
    state.update(bytes((last,)))
    return state.intdigest() & _MASK32  # type: ignore[no-any-return]


@functools.cache
def _crc32c_library() -> _Checksum | None:
    """RocksDB's masked CRC32c through an installed library, or None when there is none
    (the file is then read through RocksDB)."""
    extend: Callable[[int, bytes | memoryview], int]
    try:
        import google_crc32c  # type: ignore[import-not-found,unused-ignore]

        extend = google_crc32c.extend
    except ImportError:
        try:
            import crc32c  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            return None

        def extend(crc: int, data: bytes | memoryview) -> int:
            return crc32c.crc32c(data, crc)  # type: ignore[no-any-return]

    def masked(data: bytes | memoryview, last: int) -> int:
        # bytes: google_crc32c's C extension takes no memoryview (a copy: CRC32c only)
        crc = extend(extend(0, bytes(data)), bytes((last,)))
        rotated = ((crc >> 15) | (crc << 17)) & _MASK32
        return (rotated + _CRC_MASK_DELTA) & _MASK32

    return masked


def _checksum_function(kind: int) -> _Checksum:
    if kind == _XXH3:
        return _xxh3
    if kind == _XXHASH:
        return _xxh32
    if kind == _XXHASH64:
        return _xxh64
    if kind == _CRC32C:
        crc = _crc32c_library()
        if crc is None:
            raise UnsupportedSst("CRC32c checksums, and no CRC32c library is installed")
        return crc
    raise UnsupportedSst(f"checksum type {kind}")


def _context(base: int, offset: int) -> int:
    """RocksDB's ``ChecksumModifierForContext``: added to a block's checksum (format
    version 6), from the file's base context checksum and the block's offset."""
    if base == 0:
        return 0
    return base ^ (((offset & _MASK32) + (offset >> 32)) & _MASK32)


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
        """The block at ``offset`` (``size`` bytes before its trailer), its checksum
        verified, decompressed."""
        raw = self._read(offset, size + _TRAILER)
        kind = raw[size]
        # The trailer's checksum, exactly as RocksDB checks it (VerifyBlockChecksum): of
        # the block's bytes and then its compression type byte, plus the context modifier
        # of the block's offset. A mismatch is damage, never a reason to read the file
        # another way.
        stored = _UINT32.unpack_from(raw, size + 1)[0]
        computed = self._checksum(memoryview(raw)[:size], kind)
        computed = (computed + _context(self._base_context, offset)) & _MASK32
        if computed != stored:
            raise self._damaged(f"block at offset {offset} (size {size})", stored, computed)
        if kind == _NO_COMPRESSION:
            return raw[:size]
        if kind == _SNAPPY:
            return _decompress("snappy", raw[:size], length_first=False)
        if kind == _ZSTD:
            return _decompress("zstd", raw[:size], length_first=True)
        raise UnsupportedSst(f"compression type {kind}")

    def _damaged(self, what: str, stored: int, computed: int) -> StoreCorruptedError:
        """The error for damage a checksum found: one line, naming the file when known."""
        return StoreCorruptedError(
            f"{self.name or 'SST file'}: {what}: checksum mismatch "
            f"(stored 0x{stored:08x}, computed 0x{computed:08x})"
        )

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
        self._checksum = _checksum_function(footer[0])
        self._base_context = _UINT32.unpack_from(footer, 9)[0]
        if self._base_context == 0:  # RocksDB: "Invalid base context checksum"
            raise StoreCorruptedError(
                f"{self.name or 'SST file'}: footer at offset {footer_offset}: "
                "invalid base context checksum 0"
            )
        # The footer's own checksum (Footer::DecodeFrom): of its 53 bytes with that field
        # zeroed, plus the context modifier of the footer's offset. Covers the metaindex
        # size, the base context checksum and the reserved bytes.
        stored = _UINT32.unpack_from(footer, 5)[0]
        zeroed = footer[:5] + bytes(4) + footer[9:]
        computed = self._checksum(zeroed[:-1], zeroed[-1])
        computed = (computed + _context(self._base_context, footer_offset)) & _MASK32
        if computed != stored:
            raise self._damaged(f"footer at offset {footer_offset}", stored, computed)
        if _UINT64.unpack_from(footer, 33)[0] != 0:  # checked: written so, not damaged
            raise UnsupportedSst("a future feature in the footer")
        meta_size = _UINT32.unpack_from(footer, 13)[0]
        if meta_size > footer_offset - _TRAILER:
            raise UnsupportedSst("a metaindex block larger than the file")
        meta = _Block(self._block(footer_offset - _TRAILER - meta_size, meta_size))
        handles = {}
        for name, value in meta.entries():
            offset, pos = _varint(value, 0)
            length, _ = _varint(value, pos)
            handles[name] = (offset, length)
        if b"rocksdb.index" not in handles or b"rocksdb.properties" not in handles:
            raise UnsupportedSst("no index or properties block")
        if b"rocksdb.compression_dict" in handles:  # its blocks need the dictionary
            raise UnsupportedSst("compression with a dictionary")
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


def _decompress(codec: str, block: bytes, *, length_first: bool) -> bytes:
    """A compressed ``block`` decompressed with pyarrow's ``codec`` (a decoder at hand
    wherever iqkit runs). Both start with the decompressed length as a varint: Snappy's
    raw format is so, and RocksDB (format version 2 on) writes it before a zstd frame
    (``length_first``: the frame follows it)."""
    import pyarrow as pa

    try:
        length, start = _varint(block, 0)
        data = block[start:] if length_first else block
        out = pa.Codec(codec).decompress(data, decompressed_size=length, asbytes=True)
        return out  # type: ignore[no-any-return]
    except (pa.ArrowException, OSError, ValueError, IndexError) as exc:
        raise UnsupportedSst(f"a block that does not decompress: {exc}") from None


def _value(internal: bytes, value: bytes) -> bytes | None:
    kind = internal[-8]
    if kind == _TYPE_VALUE:
        return value
    if kind in (_TYPE_DELETION, _TYPE_SINGLE_DELETION):
        return None
    raise UnsupportedSst(f"an entry of type {kind}")
