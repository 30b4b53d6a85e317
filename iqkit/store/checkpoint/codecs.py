"""The compression of a checkpoint's state files undone, whichever codec Spark wrote it
with: one home for the four codecs of ``spark.sql.streaming.stateStore.compression.codec``.

Why here: the default provider's ``.delta`` / ``.snapshot`` files (``hdfs_files``) and the
RocksDB provider's ``.changelog`` files (``rocksdb_files``) are each one stream of Spark's
``CompressionCodec`` (lz4 by default; lzf, snappy or zstd when the query was started with
another), and both readers need the same bytes back. The codec is told by the stream's
first bytes, not by the offsets log: a file is read the same wherever it came from.

What each codec's stream is (checked on files PySpark 4.3 wrote):

- **lz4** (lz4-java ``LZ4BlockOutputStream``, 32 KiB blocks): blocks of ``["LZ4Block"]
  [token: method << 4 | (log2(block size) - 10), 1 byte][compressed size][original
  size][checksum]`` (three int32 LE) and the payload. The method is 1 (stored as is) or 2
  (lz4 block, the ``lz4`` package); the checksum is xxHash32 (seed 0x9747B28C) of the
  original bytes, masked to its low 28 bits; an empty stored block ends the stream.
- **zstd** (zstd-jni ``ZstdOutputStreamNoFinalizer``, level 1): standard zstd frames
  (magic ``28 B5 2F FD``), read with the ``zstandard`` package. Spark's frames state no
  content size and carry no content checksum (frame header descriptor 0x00); a frame
  that does carry one is checked by libzstd. A frame ends with its last-block flag (Spark's
  end with an empty last block), so a stream cut short is seen; several frames in a row
  are read one after the other.
- **snappy** (snappy-java ``SnappyOutputStream``, 32 KiB blocks): a 16-byte header,
  ``[82 "SNAPPY" 00][version: int32 BE, 1][compatible version: int32 BE, 1]``, then blocks
  ``[compressed size: int32 BE][raw snappy block]`` (each block starts with its original
  size as a varint), read with ``cramjam``'s raw snappy. A header may come again (streams
  written one after the other). Not Snappy's framing format (``sNaPpY``), not Hadoop's.
- **lzf** (ning compress-lzf ``LZFOutputStream``, chunks of at most 65,535 bytes): chunks
  ``["ZV"][type, 1 byte]``, type 0 (stored) ``[size: uint16 BE][bytes]``, type 1 (LZF)
  ``[compressed size: uint16 BE][original size: uint16 BE][LZF data]``, read with
  ``python-neo-lzf`` (liblzf). No stream header and no end mark.

What each gives against damage: lz4 checks every block (xxHash32, 28 bits) and has an
end mark; zstd and snappy check their own structure (block sizes, back-references inside
the output, the original size each block states), zstd also its end; lzf checks each
chunk's header and sizes only. None but lz4 (and a zstd frame with a content checksum)
can see a changed literal byte. What follows catches more: the records' framing must end
exactly with the end record (a stream of snappy blocks or lzf chunks cut at a block's
end is then still found), and the row decoder refuses rows that point outside themselves.
Where Hadoop wrote its ``.<name>.crc`` beside a file (its local file system and HDFS do;
object stores get none) every byte is checked before this, whatever the codec.

Anything wrong raises ``StateFileError``: one line naming the file and what is wrong,
never another exception and never bytes that are not the file's.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

from ...errors import IqkitError

__all__ = ["CODECS", "StateFileError", "UnknownFormatError", "decompress_state_file"]


class StateFileError(IqkitError):
    """A state file of a checkpoint is missing, cut short or damaged; the message is one
    line naming the file and what is wrong with it."""


class UnknownFormatError(StateFileError):
    """A checkpoint file says it is in a format version iqkit does not know: a newer
    Spark's (or a damaged version marker). The refusal names the file, the version and
    (``spark_release``) the Spark that wrote the checkpoint."""


#: lz4-java's block stream.
_LZ4_MAGIC = b"LZ4Block"
_LZ4_HEADER = struct.Struct("<8sBiii")  # magic, token, compressed size, size, checksum
_METHOD_RAW = 0x10
_METHOD_LZ4 = 0x20
_XXHASH_SEED = 0x9747B28C
_CHECKSUM_MASK = 0x0FFFFFFF
#: zstd's frame magic (0xFD2FB528, little-endian).
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: snappy-java's stream header: magic, version, compatible version (int32 BE).
_SNAPPY_MAGIC = b"\x82SNAPPY\x00"
_SNAPPY_HEADER = struct.Struct(">8sii")
_SNAPPY_VERSION = 1
#: A raw snappy block's output is at most 64 bytes per 3-byte copy tag: anything stating
#: more than this many bytes per compressed byte is damaged (and is never allocated).
_SNAPPY_MOST_EXPANSION = 22
#: compress-lzf's chunk: "ZV", its type, then its sizes (uint16 BE).
_LZF_MAGIC = b"ZV"
_LZF_STORED = 0
_LZF_COMPRESSED = 1
_UINT16_BE = struct.Struct(">H")
_INT32_BE = struct.Struct(">i")


def decompress_state_file(raw: bytes, where: str) -> bytes:
    """The original bytes of the state file ``raw`` (named ``where`` in messages),
    whichever of Spark's codecs compressed it (told by its first bytes), every check
    the codec allows made; ``StateFileError`` for anything else."""
    for magic, _, decompress in _READERS:
        if raw.startswith(magic):
            return decompress(raw, where)
    if not raw:
        raise StateFileError(f"{where}: empty")
    raise StateFileError(
        f"{where}: not a stream of any codec Spark compresses state with ({', '.join(CODECS)};"
        f" it starts with {raw[:8].hex(' ')})"
    )


def _lz4_stream(raw: bytes, where: str) -> bytes:
    """lz4-java's block stream: each block's checksum verified."""
    from lz4.block import LZ4BlockError, decompress

    blocks: list[bytes] = []
    checksums: list[int] = []
    position = 0
    while True:
        if position + _LZ4_HEADER.size > len(raw):
            raise StateFileError(f"{where}: cut short at byte {len(raw)} (no end mark)")
        magic, token, packed, size, checksum = _LZ4_HEADER.unpack_from(raw, position)
        method, block_size = token & 0xF0, 1 << ((token & 0x0F) + 10)
        if (
            magic != _LZ4_MAGIC
            or method not in (_METHOD_RAW, _METHOD_LZ4)
            or not 0 <= size <= block_size
            or packed < 0
            or (method == _METHOD_RAW and packed != size)
        ):
            raise StateFileError(f"{where}: damaged lz4 block header at byte {position}")
        position += _LZ4_HEADER.size
        if size == 0:  # the end mark
            if packed or checksum:
                raise StateFileError(f"{where}: damaged end mark at byte {position}")
            break
        payload = raw[position : position + packed]
        if len(payload) < packed:
            raise StateFileError(f"{where}: cut short at byte {len(raw)} (inside an lz4 block)")
        position += packed
        if method == _METHOD_LZ4:
            try:
                payload = decompress(payload, uncompressed_size=size)
            except LZ4BlockError as exc:
                raise StateFileError(f"{where}: damaged lz4 block ending at {position}") from exc
            if len(payload) != size:
                raise StateFileError(f"{where}: damaged lz4 block ending at {position}")
        blocks.append(payload)
        checksums.append(checksum)
    if position != len(raw):
        raise StateFileError(f"{where}: {len(raw) - position} bytes after the end mark")
    for index, actual in enumerate(_xxhash32_masked(blocks)):
        if actual != checksums[index]:
            raise StateFileError(f"{where}: lz4 block {index} fails its checksum (damaged)")
    return b"".join(blocks)


def _xxhash32_masked(blocks: Sequence[bytes]) -> list[int]:
    """Each block's xxHash32 with lz4-java's seed, masked as lz4-java stores it (the
    ``xxhash`` package's C implementation: about 30x the pure-Python one it replaced)."""
    from xxhash import xxh32_intdigest

    return [xxh32_intdigest(block, _XXHASH_SEED) & _CHECKSUM_MASK for block in blocks]


def _zstd_frames(raw: bytes, where: str) -> bytes:
    """zstd frames, one after the other, each read to its end (its content checksum
    verified by libzstd where it has one)."""
    from zstandard import ZstdDecompressor, ZstdError

    decompressor = ZstdDecompressor()
    view = memoryview(raw)
    parts: list[bytes] = []
    position = 0
    while position < len(raw):
        frame = decompressor.decompressobj()
        try:
            parts.append(frame.decompress(view[position:]))
        except ZstdError as exc:
            raise StateFileError(
                f"{where}: damaged zstd frame starting at byte {position} ({_one_line(exc)})"
            ) from None
        if not frame.eof:
            raise StateFileError(f"{where}: cut short at byte {len(raw)} (inside a zstd frame)")
        position = len(raw) - len(frame.unused_data)
    return b"".join(parts)


def _snappy_stream(raw: bytes, where: str) -> bytes:
    """snappy-java's stream: its header(s), then blocks of raw snappy."""
    from cramjam import DecompressionError, snappy

    blocks: list[bytes] = []
    position = 0
    while position < len(raw):
        if raw.startswith(_SNAPPY_MAGIC, position):  # the header, first or again
            if position + _SNAPPY_HEADER.size > len(raw):
                raise StateFileError(f"{where}: cut short at byte {len(raw)} (in a header)")
            _, version, compatible = _SNAPPY_HEADER.unpack_from(raw, position)
            if version < _SNAPPY_VERSION or compatible != _SNAPPY_VERSION:
                raise StateFileError(
                    f"{where}: a snappy-java stream of version {version} (compatible with "
                    f"{compatible}) at byte {position}; iqkit reads version 1"
                )
            position += _SNAPPY_HEADER.size
            continue
        if position + 4 > len(raw):
            raise StateFileError(f"{where}: cut short at byte {len(raw)} (in a block's size)")
        (packed,) = _INT32_BE.unpack_from(raw, position)
        block = raw[position + 4 : position + 4 + packed]
        if packed <= 0:
            raise StateFileError(f"{where}: damaged snappy block size at byte {position}")
        if len(block) < packed:
            raise StateFileError(f"{where}: cut short at byte {len(raw)} (inside a snappy block)")
        size = _varint(block)
        if size is None or size > _SNAPPY_MOST_EXPANSION * packed:
            raise StateFileError(f"{where}: damaged snappy block at byte {position}")
        try:
            original = bytes(snappy.decompress_raw(block))
        except DecompressionError as exc:
            raise StateFileError(
                f"{where}: damaged snappy block at byte {position} ({_one_line(exc)})"
            ) from None
        if len(original) != size:
            raise StateFileError(f"{where}: damaged snappy block at byte {position}")
        blocks.append(original)
        position += 4 + packed
    return b"".join(blocks)


def _varint(block: bytes) -> int | None:
    """The original size a raw snappy block starts with (a little-endian base-128
    varint of at most 32 bits); ``None`` when it is not one."""
    value = 0
    for index in range(min(5, len(block))):
        byte = block[index]
        value |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            return value if value <= 0xFFFFFFFF else None
    return None


def _lzf_chunks(raw: bytes, where: str) -> bytes:
    """compress-lzf's chunks, each one's sizes checked (the data carries no checksum)."""
    from lzf import decompress

    chunks: list[bytes] = []
    position = 0
    while position < len(raw):
        header = raw[position : position + 7]
        if header[:2] != _LZF_MAGIC or (len(header) > 2 and header[2] > _LZF_COMPRESSED):
            raise StateFileError(f"{where}: damaged lzf chunk header at byte {position}")
        stored = len(header) > 2 and header[2] == _LZF_STORED
        start = position + (5 if stored else 7)
        if start > len(raw):
            raise StateFileError(f"{where}: cut short at byte {len(raw)} (in a chunk header)")
        (packed,) = _UINT16_BE.unpack_from(raw, position + 3)
        payload = raw[start : start + packed]
        if len(payload) < packed:
            raise StateFileError(f"{where}: cut short at byte {len(raw)} (inside an lzf chunk)")
        if not stored:
            (size,) = _UINT16_BE.unpack_from(raw, position + 5)
            try:
                original = decompress(payload, size) if size else None
            except ValueError:
                original = None
            if original is None or len(original) != size:
                raise StateFileError(f"{where}: damaged lzf chunk at byte {position}")
            payload = original
        chunks.append(payload)
        position = start + packed
    return b"".join(chunks)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


_READERS: tuple[tuple[bytes, str, Callable[[bytes, str], bytes]], ...] = (
    (_LZ4_MAGIC, "lz4", _lz4_stream),
    (_ZSTD_MAGIC, "zstd", _zstd_frames),
    (_SNAPPY_MAGIC, "snappy", _snappy_stream),
    (_LZF_MAGIC, "lzf", _lzf_chunks),
)
#: The codecs read, by Spark's short names.
CODECS: tuple[str, ...] = tuple(sorted(name for _, name, _ in _READERS))
