"""The one place iqkit opens, iterates, checkpoints and closes RocksDB (via rocksdict).

Everything rocksdict-specific lives here, so its quirks are worked around once:

* Raw mode everywhere (``Options(raw_mode=True)``): keys and values are plain ``bytes``.
  rocksdict's default mode tags keys with a type byte and pickles values, which no other
  tool could read.
* Opening a database in any mode creates the folder when it is missing and rewrites
  ``rocksdict-config.json`` in it. Readers therefore check for RocksDB's ``CURRENT`` file
  before opening (so a typo never creates an empty store), and always pass explicit
  options, so the rewrite writes back the same bytes and nothing reads the file.
* Iterating backwards ignores the iterator's lower bound: reverse scans stop by hand.
* Iterators and column-family handles keep the database open and locked: callers drop
  them (``KeyValueIterator.close``) before ``close()``.
* Errors are plain exceptions carrying RocksDB's message text: ``classify`` turns them
  into iqkit's own exceptions (lock, corruption, not found, other I/O) in one place.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from itertools import islice

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Cache,
    Checkpoint,
    IngestExternalFileOptions,
    Options,
    Rdict,
    ReadOptions,
    SstFileWriter,
    WriteBatch,
)

from ..errors import (
    IqkitError,
    StoreCorruptedError,
    StoreIOError,
    StoreLockedError,
    StoreNotFoundError,
)
from .names import ROCKSDB_CURRENT_FILE

__all__ = [
    "Rdict",
    "WriteBatch",
    "checkpoint",
    "classify",
    "close_quietly",
    "database_exists",
    "ingest",
    "new_write_batch",
    "open_for_read",
    "open_for_write",
    "scan",
    "scan_chunks",
    "write_sst",
]

#: One block cache shared by every partition a process reads: with one RocksDB per
#: partition per store, per-database caches would multiply memory (Kafka's lesson,
#: rocksdb#10700).
_SHARED_BLOCK_CACHE = Cache(256 * 1024 * 1024)
#: Caps open files per database; many partitions are open at once in one engine.
_MAX_OPEN_FILES_PER_DB = 256


def _options(*, create: bool) -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(create)
    opts.set_max_open_files(_MAX_OPEN_FILES_PER_DB)
    table = BlockBasedOptions()
    table.set_block_cache(_SHARED_BLOCK_CACHE)
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    return opts


def database_exists(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` holds a RocksDB database (its ``CURRENT`` file exists)."""
    return os.path.isfile(os.path.join(path, ROCKSDB_CURRENT_FILE))


def classify(exc: BaseException, path: str | os.PathLike[str]) -> IqkitError:
    """Map a rocksdict exception (plain ``Exception`` with RocksDB text) to iqkit's own."""
    if isinstance(exc, IqkitError):
        return exc
    text = str(exc)
    lowered = text.lower()
    where = os.fspath(path)
    if "corruption" in lowered or "checksum mismatch" in lowered or "bad magic" in lowered:
        return StoreCorruptedError(f"corrupt RocksDB data at {where}: {text}")
    if "lock" in lowered and ("io error" in lowered or "resource temporarily" in lowered):
        return StoreLockedError(f"RocksDB at {where} is locked by another process: {text}")
    if "no such file" in lowered or "does not exist" in lowered:
        return StoreNotFoundError(f"missing RocksDB files at {where}: {text}")
    return StoreIOError(f"RocksDB error at {where}: {text}")


def open_for_read(path: str | os.PathLike[str]) -> Rdict:
    """Open a published, immutable partition version read-only.

    Read-only mode takes no LOCK, so any number of readers coexist with a writer
    (which never writes into a published folder).
    """
    if not database_exists(path):
        # rocksdict would create the folder (quirk): refuse before it gets the chance.
        raise StoreNotFoundError(f"no RocksDB database at {os.fspath(path)}")
    try:
        return Rdict(
            os.fspath(path),
            _options(create=False),
            access_type=AccessType.read_only(error_if_log_file_exist=False),
        )
    except Exception as exc:  # rocksdict raises plain Exception
        raise classify(exc, path) from exc


def open_for_write(path: str | os.PathLike[str], *, create: bool) -> Rdict:
    """Open a private (staging) partition folder read-write."""
    try:
        return Rdict(os.fspath(path), _options(create=create))
    except Exception as exc:
        raise classify(exc, path) from exc


def new_write_batch() -> WriteBatch:
    """A raw-mode batch: puts and deletes applied in one atomic ``write``."""
    return WriteBatch(raw_mode=True)


def write_sst(path: str | os.PathLike[str], rows: Iterator[tuple[bytes, bytes]]) -> int:
    """Write ``rows`` (keys strictly increasing in byte order) to an SST file at ``path``;
    return the number of rows. ``SstFileWriter`` needs the same raw mode as the database
    (quirk: with default options it would pickle) and refuses out-of-order keys."""
    writer = SstFileWriter(_options(create=True))
    count = 0
    try:
        writer.open(os.fspath(path))
        for key, value in rows:
            writer[key] = value
            count += 1
        if count:
            writer.finish()
    except Exception as exc:
        raise classify(exc, path) from exc
    return count


def ingest(db: Rdict, paths: list[str] | tuple[str, ...] | Iterator[str]) -> None:
    """Ingest SST files into ``db``, moving (hard-linking) rather than copying them;
    ingested keys are newer than what ``db`` holds (global sequence numbers)."""
    opts = IngestExternalFileOptions()
    opts.set_move_files(True)
    opts.set_allow_global_seqno(True)
    opts.set_allow_blocking_flush(True)
    try:
        db.ingest_external_file([os.fspath(p) for p in paths], opts)
    except Exception as exc:
        raise classify(exc, getattr(db, "path", lambda: "?")()) from exc


def checkpoint(db: Rdict, dest: str | os.PathLike[str]) -> None:
    """Hard-link ``db`` into ``dest`` (RocksDB checkpoint): cheap on one filesystem.

    ``dest`` must not exist. Works on a read-only handle, so building the next version
    never opens the published one for writing.
    """
    try:
        Checkpoint(db).create_checkpoint(os.fspath(dest))
    except Exception as exc:
        raise classify(exc, dest) from exc


def close_quietly(db: Rdict | None) -> None:
    """Close ``db``; errors on close (already closed, shutdown in progress) are benign."""
    if db is None:
        return
    with contextlib.suppress(Exception):
        db.close()


def scan_chunks(
    db: Rdict, lower: bytes, upper: bytes | None, *, reverse: bool = False
) -> Iterator[list[tuple[bytes, bytes]]]:
    """Yield lists of ``(key, value)`` for ``lower <= key < upper`` in byte order (or
    reversed), read through a bounded RocksDB iterator.

    Only the keys in range are read, so a prefix of a thousand keys in a store of a
    million costs a thousand steps. Rows come in chunks (64 rows first, growing to 1,024)
    pulled from rocksdict's iterator in C (``islice``): per-row Python work is what makes
    scans slow, and a small first chunk keeps "the last 100" cheap. ``upper=None`` means
    no upper bound. The generator holds the rocksdict iterator; closing the generator
    (or dropping it) releases it, which must happen before the database is closed.
    """
    read_opts = ReadOptions()
    read_opts.set_iterate_lower_bound(lower)
    if upper is not None:
        read_opts.set_iterate_upper_bound(upper)
    size = 64
    if not reverse:
        items = db.items(from_key=lower, read_opt=read_opts)
        while chunk := list(islice(items, size)):
            yield chunk
            size = min(size * 2, 1024)
        return
    # Reverse: seek_for_prev(upper) lands on ``upper`` itself when it exists: skip it.
    # rocksdict's backward iteration ignores the lower bound (quirk): stop by hand.
    items = db.items(backwards=True, from_key=upper, read_opt=read_opts)
    first = True
    while chunk := list(islice(items, size)):
        if first:
            first = False
            if upper is not None and chunk[0][0] >= upper:
                chunk = chunk[1:]
        if chunk and chunk[-1][0] < lower:
            yield [kv for kv in chunk if kv[0] >= lower]
            return
        if chunk:
            yield chunk
        size = min(size * 2, 1024)


def scan(
    db: Rdict, lower: bytes, upper: bytes | None, *, reverse: bool = False
) -> Iterator[tuple[bytes, bytes]]:
    """Row by row view of ``scan_chunks``."""
    for chunk in scan_chunks(db, lower, upper, reverse=reverse):
        yield from chunk
