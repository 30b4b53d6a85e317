"""The one place iqkit opens, iterates, writes and closes RocksDB (via rocksdict).

Everything rocksdict-specific lives here, so its quirks are worked around once:

* Raw mode everywhere (``Options(raw_mode=True)``): keys and values are plain ``bytes``.
  rocksdict's default mode tags keys with a type byte and pickles values, which no other
  tool could read.
* Opening a database in any mode, read-only included, creates the folder when it is
  missing and then writes ``rocksdict-config.json`` into it, unconditionally. Published
  folders are therefore never opened in place: readers open a private *view* of them
  (symbolic links to their data files, in this process's temporary folder) after
  checking RocksDB's ``CURRENT`` file exists (so a typo never creates an empty store).
  Reading writes nothing under a store, and works on read-only stores.
* Iterating backwards ignores the iterator's lower bound: reverse scans stop by hand.
* Iterators and column-family handles keep the database open and locked: callers drop
  them (``KeyValueIterator.close``) before ``close()``.
* Errors are plain exceptions carrying RocksDB's message text: ``classify`` turns them
  into iqkit's own exceptions (lock, corruption, not found, other I/O) in one place.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    IngestExternalFileOptions,
    Options,
    Rdict,
    ReadOptions,
    SstFileWriter,
    WriteBatch,
)

from ...errors import (
    IqkitError,
    StoreCorruptedError,
    StoreIOError,
    StoreLockedError,
    StoreNotFoundError,
)
from ..names import (
    READ_VIEWS_PREFIX,
    ROCKSDB_CURRENT_FILE,
    ROCKSDB_SIDE_FILES,
)

__all__ = [
    "Rdict",
    "WriteBatch",
    "check_table_file",
    "classify",
    "close_quietly",
    "database_exists",
    "ingest",
    "open_for_build",
    "open_for_read",
    "open_for_write",
    "remove_on_close",
    "scan",
    "scan_chunks",
    "write_arrow_sst",
    "write_changes_sst",
    "write_sst",
]

#: A scan's chunks: this many rows first, doubling up to ``MAX_CHUNK_ROWS`` (scan_chunks).
FIRST_CHUNK_ROWS = 64
MAX_CHUNK_ROWS = 1024

#: One block cache shared by every partition a process reads: with one RocksDB per
#: partition per store, a cache per database would multiply memory by the number of
#: open partitions (Kafka Streams users hit exactly this with per-store caches).
_SHARED_BLOCK_CACHE = Cache(256 * 1024 * 1024)
#: Caps open files per database; many partitions are open at once in one engine.
_MAX_OPEN_FILES_PER_DB = 256
#: Threads RocksDB starts to open a database's table files. Quirk: every open starts
#: this many threads (default 16) even for the few files a partition has (a chain
#: partition has at most 9), and starting them was most of an open's cost: measured
#: here, a read-only open took 2.2-3.8 ms with 16 and 0.8 ms with 1, creating a
#: database and ingesting one SST 9.6-13 ms against 6.5-7.1 ms.
_FILE_OPENING_THREADS = 1
#: How every table file iqkit writes (SSTs of commits, compactions and Spark tasks) is
#: compressed: zstd at level 1 in 16 KiB blocks (RocksDB's defaults: Snappy, 4 KiB).
#: Measured on a partition of issue 36's 10M-key store (1.25M JSON records of a random
#: float, an int and a string; a 32 MiB block cache, the shared one's share), bytes a
#: row / a random point read: Snappy 4 KiB 43.9 B / 12 us; zstd 4 KiB 29.1 / 17, 8 KiB
#: 27.3 / 22, 16 KiB 25.7 / 35, 32 KiB 24.3 / 56. Writing an SST alone is ~25% slower
#: than Snappy, a whole bulk commit as fast (CPU per row within the noise: Python's
#: per-row calls and the twin dominate); level 1 wrote smaller blocks than level 3 here,
#: and faster. 16 KiB: the store's bytes count against a target, lookups against raw
#: RocksDB reads of the same files (a read that hits the cache decompresses nothing).
#: No dictionary: RocksDB buffers a whole file's blocks to train one (a bounded writer
#: could not), for 1-4 B a row. Files written with other options (Snappy, before) stay
#: readable: RocksDB reads any compression from the block, and ``sst_reader`` these two.
SST_ZSTD_LEVEL = 1
SST_BLOCK_BYTES = 16 * 1024


def _options(*, create: bool) -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(create)
    opts.set_max_open_files(_MAX_OPEN_FILES_PER_DB)
    opts.set_max_file_opening_threads(_FILE_OPENING_THREADS)
    # What a written file's blocks are (SST_ZSTD_LEVEL); reads take it from the file.
    opts.set_compression_type(DBCompressionType.zstd())
    # (window bits, level, strategy, dictionary bytes): RocksDB's defaults but the level
    opts.set_compression_options(-14, SST_ZSTD_LEVEL, 0, 0)
    table = BlockBasedOptions()
    table.set_block_cache(_SHARED_BLOCK_CACHE)
    table.set_bloom_filter(10, False)
    table.set_block_size(SST_BLOCK_BYTES)
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
    """Open a published, immutable partition version read-only, writing nothing under it.

    rocksdict writes its config file into the folder of every database it opens,
    read-only ones included (quirk, see the module docstring), which would change the
    published folder, or fail on a read-only store. So the database is opened through a
    private view: a folder in this process's temporary folder holding symbolic links to
    the published folder's data files. rocksdict's config (and any info log) land in
    the view, which ``close_quietly`` removes. Read-only mode takes no LOCK, so any
    number of readers coexist with a writer (who never writes into a published folder).
    """
    if not database_exists(path):
        # rocksdict would create the folder (quirk): refuse before it gets the chance.
        raise StoreNotFoundError(f"no RocksDB database at {os.fspath(path)}")
    source = os.path.abspath(path)
    view = ""
    try:
        view = tempfile.mkdtemp(dir=_views_folder())
        for name in _data_files(source):
            os.symlink(os.path.join(source, name), os.path.join(view, name))
        db = Rdict(
            view,
            _options(create=False),
            access_type=AccessType.read_only(error_if_log_file_exist=False),
        )
    except Exception as exc:  # rocksdict raises plain Exception
        if view:
            shutil.rmtree(view, ignore_errors=True)
            exc_text = str(exc).replace(view, source)
        else:
            exc_text = str(exc)
        raise classify(Exception(exc_text), path) from exc
    _VIEWS[id(db)] = view
    return db


#: id(Rdict) -> its view folder, removed when the database is closed.
_VIEWS: dict[int, str] = {}
#: (pid, folder, descriptor holding a shared flock on it) of this process's views.
_views_home: tuple[int, str, int] | None = None


def _data_files(folder: str) -> list[str]:
    """A database folder's own files: not what RocksDB and rocksdict write beside them."""
    with os.scandir(folder) as entries:
        return [
            e.name
            for e in entries
            if not e.is_dir(follow_symlinks=False)
            and e.name not in ROCKSDB_SIDE_FILES
            and not e.name.startswith("LOG.old")
        ]


def _views_folder() -> str:
    """This process's folder of views, made on first use (again after a fork).

    It holds a shared ``flock`` on the folder, released by the kernel when the process
    dies, so a later process can tell views of dead processes and remove them.
    """
    global _views_home
    pid = os.getpid()
    if _views_home is not None:
        home_pid, home, fd = _views_home
        if home_pid == pid and os.path.isdir(home):
            return home
        if home_pid == pid:  # removed under us (a temporary-folder cleaner): make another
            os.close(fd)
        _views_home = None
    _remove_dead_views()
    while True:
        folder = tempfile.mkdtemp(prefix=READ_VIEWS_PREFIX)
        try:
            fd = os.open(folder, os.O_RDONLY)
        except FileNotFoundError:  # another process's sweep took it before we opened it
            continue
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            same = os.stat(folder).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:  # another process's sweep took it before our lock
            same = False
        if same:
            break
        os.close(fd)
    _views_home = (pid, folder, fd)
    atexit.register(_remove_views_folder, pid, folder)
    return folder


def _remove_views_folder(pid: int, folder: str) -> None:
    if os.getpid() == pid:  # not in a forked child that inherited the handler
        shutil.rmtree(folder, ignore_errors=True)


def _remove_dead_views() -> None:
    """Remove view folders whose process died (nobody holds their lock)."""
    tmp = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(tmp):
            if not name.startswith(READ_VIEWS_PREFIX):
                continue
            folder = os.path.join(tmp, name)
            try:
                fd = os.open(folder, os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # alive
            else:
                shutil.rmtree(folder, ignore_errors=True)
            finally:
                os.close(fd)


def remove_on_close(db: Rdict, folder: str | os.PathLike[str]) -> None:
    """``close_quietly(db)`` removes ``folder`` too (a private folder the database was
    opened in, as a read view is)."""
    _VIEWS[id(db)] = os.fspath(folder)


def open_for_write(path: str | os.PathLike[str], *, create: bool) -> Rdict:
    """Open a private (staging) partition folder read-write."""
    try:
        return Rdict(os.fspath(path), _options(create=create))
    except Exception as exc:
        raise classify(exc, path) from exc


def open_for_build(path: str | os.PathLike[str]) -> Rdict:
    """Create the database ``path`` (must not hold one) that only ever receives ingested
    SSTs and is then read: automatic compactions are off, so its table files stay
    exactly the files it was given (links, sharing their bytes) and nothing runs in
    the background while it is built (a compaction would write a second copy of the
    rows, in the cache or in the memory folder a build may run in)."""
    opts = _options(create=True)
    opts.set_error_if_exists(True)
    opts.set_disable_auto_compactions(True)
    try:
        return Rdict(os.fspath(path), opts)
    except Exception as exc:
        raise classify(exc, path) from exc


def write_sst(path: str | os.PathLike[str], rows: Iterator[tuple[bytes, bytes]]) -> int:
    """Write ``rows`` (keys strictly increasing in byte order) to an SST file at ``path``;
    return the number of rows. ``SstFileWriter`` needs the same raw mode as the database
    (quirk: with default options it would pickle) and refuses out-of-order keys."""
    return write_changes_sst(path, rows)


def write_changes_sst(
    path: str | os.PathLike[str], changes: Iterable[tuple[bytes, bytes | None]]
) -> int:
    """``write_sst`` with deletes: a value ``None`` writes a tombstone, which hides the
    key's older values once the file is ingested above them (the SST chain's deltas).
    Quirk: rocksdict's writer has no ``delete`` method; ``del writer[key]`` is it.
    Nothing is written (no file) when ``changes`` is empty: RocksDB refuses to finish
    an empty SST."""
    with _sst_writer(path) as (writer, written):
        for key, value in changes:
            if value is None:
                del writer[key]
            else:
                writer[key] = value
            written[0] += 1
    return written[0]


@contextlib.contextmanager
def _sst_writer(path: str | os.PathLike[str]) -> Iterator[tuple[SstFileWriter, list[int]]]:
    """An ``SstFileWriter`` open on ``path`` for the block, and a one-item list the block
    counts its rows in: the SST is finished only when it has some (RocksDB refuses to
    finish an empty one). rocksdict's errors are classified (``classify``); a
    ``ValueError`` is the caller's own check of its rows and passes as it is."""
    writer = SstFileWriter(_options(create=True))
    written = [0]
    try:
        writer.open(os.fspath(path))
        yield writer, written
        if written[0]:
            writer.finish()
    except ValueError:
        raise
    except Exception as exc:  # rocksdict raises plain Exception
        raise classify(exc, path) from exc


#: Rows turned into Python objects at a time by ``write_arrow_sst`` (bounds its memory).
_ARROW_CHUNK_ROWS = 65_536


def write_arrow_sst(
    path: str | os.PathLike[str],
    chunks: Iterable[tuple[Any, Any]],
    *,
    head: Iterable[tuple[bytes, bytes]] = (),
) -> tuple[int, int]:
    """``write_changes_sst`` of rows held as Arrow: ``chunks`` of ``(keys, values)``
    ``binary`` arrays (keys strictly increasing across all chunks, a null value a
    tombstone), after the ``head`` rows (keys before every chunk's). Returns (puts,
    deletes) of the chunks; with no row at all the SST is not finished (RocksDB refuses
    an empty one).

    rocksdict has no bulk API, so each row is still one call into it, but no Python frame
    runs per row: the calls are ``map`` over ``to_pylist()`` lists consumed by a C-level
    ``deque``, a slice of puts or of deletes at a time (measured on 1M rows: 0.35 s
    against 0.42 s for a ``for`` loop over ``zip``, and 0.73 s for the pairs path's
    generators)."""
    import numpy as np

    puts = deletes = 0
    with _sst_writer(path) as (writer, written):
        put, delete = writer.__setitem__, writer.__delitem__
        for key, value in head:
            writer[key] = value
            written[0] += 1
        for keys, values in chunks:
            for lo in range(0, len(keys), _ARROW_CHUNK_ROWS):
                k = keys.slice(lo, _ARROW_CHUNK_ROWS).to_pylist()
                v = values.slice(lo, _ARROW_CHUNK_ROWS)
                n, nulls = len(k), v.null_count
                if not nulls:
                    deque(map(put, k, v.to_pylist()), maxlen=0)
                elif nulls == n:
                    deque(map(delete, k), maxlen=0)
                else:  # runs of puts and of deletes, in key order
                    valid = np.asarray(v.is_valid())
                    cuts = (np.flatnonzero(np.diff(valid)) + 1).tolist()
                    vs = v.to_pylist()
                    for a, b in zip([0, *cuts], [*cuts, n], strict=True):
                        if valid[a]:
                            deque(map(put, k[a:b], vs[a:b]), maxlen=0)
                        else:
                            deque(map(delete, k[a:b]), maxlen=0)
                puts, deletes, written[0] = puts + n - nulls, deletes + nulls, written[0] + n
    return puts, deletes


def ingest(
    db: Rdict, paths: list[str] | tuple[str, ...] | Iterator[str], *, where: str | None = None
) -> None:
    """Ingest SST files into ``db``, moving (hard-linking) rather than copying them;
    ingested keys are newer than what ``db`` holds (global sequence numbers). Errors name
    ``where`` (what a user knows the files as), else the database's folder."""
    opts = IngestExternalFileOptions()
    opts.set_move_files(True)
    opts.set_allow_global_seqno(True)
    opts.set_allow_blocking_flush(True)
    files = [os.fspath(p) for p in paths]
    try:
        db.ingest_external_file(files, opts)
    except Exception as exc:
        if where is None:
            raise classify(exc, getattr(db, "path", lambda: "?")()) from exc
        # RocksDB's text names the staged link (a temporary name, different every run):
        # the message names ``where`` once instead.
        text = str(exc)
        for f in files:
            text = text.replace(f": {f}", "").replace(f, where)
        raise classify(Exception(text), where) from exc


def check_table_file(
    path: str | os.PathLike[str], *, scratch_dir: str | os.PathLike[str]
) -> None:
    """Read the table file ``path`` alone, every block of it, in a folder made (and
    removed) in ``scratch_dir``; raise ``StoreCorruptedError`` when RocksDB cannot.

    Why: a database's error does not always name the table file at fault (damage in a
    file's properties block is reported as "properties unsorted" against the MANIFEST).
    A file written by a database (not ``SstFileWriter``) cannot be ingested (quirk:
    "External file version not found"), so a copy is given to RocksDB's repair in a
    scratch folder, which builds a MANIFEST around the files it can read and moves the
    others to ``lost/``; the rebuilt database is then scanned. No shared block cache: it
    could serve blocks of an undamaged file with the same identity."""
    name = os.path.basename(os.fspath(path))
    with tempfile.TemporaryDirectory(prefix="iqkit-table-check-", dir=scratch_dir) as scratch:
        shutil.copyfile(path, os.path.join(scratch, name))
        opts = Options(raw_mode=True)
        table = BlockBasedOptions()
        table.disable_cache()
        opts.set_block_based_table_factory(table)
        db = None
        try:
            Rdict.repair(scratch, opts)
            if not os.path.isfile(os.path.join(scratch, name)):
                raise StoreCorruptedError(f"RocksDB cannot read the table file {name}")
            db = Rdict(scratch, opts, access_type=AccessType.read_only())
            chunks = scan_chunks(db, b"", None)  # checks how the scan ended
            try:
                deque(chunks, maxlen=0)
            finally:
                chunks.close()
        except Exception as exc:  # rocksdict raises plain Exception
            raise classify(exc, name) from exc
        finally:
            close_quietly(db)


def close_quietly(db: Rdict | None) -> None:
    """Close ``db``; errors on close (already closed, shutdown in progress) are benign."""
    if db is None:
        return
    with contextlib.suppress(Exception):
        db.close()
    view = _VIEWS.pop(id(db), None)
    if view is not None:
        shutil.rmtree(view, ignore_errors=True)


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
    if upper is not None:
        read_opts.set_iterate_lower_bound(lower)
        read_opts.set_iterate_upper_bound(upper)
    # else no bounds at all: rocksdict's iterator with a lower bound and no upper bound
    # yields nothing (quirk); ``from_key`` seeks to ``lower`` and the reverse loop below
    # stops at it by hand anyway.
    size = FIRST_CHUNK_ROWS
    if not reverse:
        items = db.items(from_key=lower, read_opt=read_opts)
        last = None
        while chunk := list(islice(items, size)):
            last = chunk[-1][0]
            yield chunk
            size = min(size * 2, MAX_CHUNK_ROWS)
        del items
        _check_scan_ended(db, lower, upper, last)
        return
    # Reverse: seek_for_prev(upper) lands on ``upper`` itself when it exists: skip it.
    # rocksdict's backward iteration ignores the lower bound (quirk): stop by hand.
    items = db.items(backwards=True, from_key=upper, read_opt=read_opts)
    first = True
    last = None
    while chunk := list(islice(items, size)):
        if first:
            first = False
            if upper is not None and chunk[0][0] >= upper:
                chunk = chunk[1:]
        if chunk and chunk[-1][0] < lower:
            yield [kv for kv in chunk if kv[0] >= lower]
            return
        if chunk:
            last = chunk[-1][0]
            yield chunk
        size = min(size * 2, MAX_CHUNK_ROWS)
    del items
    _check_scan_ended(db, lower, upper, last, reverse=True)


def _check_scan_ended(
    db: Rdict, lower: bytes, upper: bytes | None, last: bytes | None, *, reverse: bool = False
) -> None:
    """Raise the error that ended a scan early, if one did (``last``: the last key it
    read, ``None`` for none).

    Quirk: rocksdict's ``items()`` ends quietly where its iterator meets an error (a data
    block failing its checksum, an SST that cannot be read), so a damaged file would read
    as fewer rows. A raw iterator placed just past the last row read must therefore be at
    the end of the range, with an OK status (``status()`` raises the stored error)."""
    probe = db.iter()
    try:
        if not reverse:
            probe.seek(lower if last is None else last)
            if last is not None and probe.valid() and probe.key() == last:
                probe.next()
            more = probe.valid() and (upper is None or probe.key() < upper)
        else:
            if last is not None:
                probe.seek(last)
            elif upper is not None:
                probe.seek(upper)
            else:
                probe.seek_to_last()
            if probe.valid() and (last is not None or upper is not None):
                probe.prev()  # past the last key read, or below the exclusive upper bound
            elif not probe.valid() and last is None and upper is not None:
                probe.seek_to_last()  # every key is below ``upper``
            more = probe.valid() and probe.key() >= lower and (upper is None or probe.key() < upper)
        probe.status()
    except Exception as exc:  # rocksdict raises plain Exception
        raise classify(exc, db.path()) from exc
    finally:
        del probe
    if more:
        raise StoreCorruptedError(f"a scan of {db.path()} ended before the end of its range")


def scan(
    db: Rdict, lower: bytes, upper: bytes | None, *, reverse: bool = False
) -> Iterator[tuple[bytes, bytes]]:
    """Row by row view of ``scan_chunks``."""
    for chunk in scan_chunks(db, lower, upper, reverse=reverse):
        yield from chunk
