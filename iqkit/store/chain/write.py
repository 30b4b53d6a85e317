"""Writing SST-chain versions: one delta SST per partition a commit changes.

``commit_partition`` turns a commit's sorted changes (puts, and deletes as ``None``
values) plus the partition's commit record into one delta SST (tombstones for deletes),
uploads it under a unique name and returns the new chain: the previous files plus the
delta. What a commit uploads is proportional to what it changed, not to the store.

Every read of a chain ingests all its files, so long chains slow the first open (about
8 ms per file; docs/DECISIONS.md "Compaction"). Once a chain would exceed ``COMPACT_AFTER_DELTAS``
deltas, the commit compacts instead: it builds the chain plus its changes into a local
RocksDB, writes every live row into one new base SST (no tombstones), and uploads only
that. Older versions keep their files until retention drops them. A commit also
compacts any partition of the previous version whose chain is over that bound, touched
or not (a chain left long by another writer, or by one that never compacted), so every
version a commit publishes has chains of at most ``1 + COMPACT_AFTER_DELTAS`` files. A
compaction that fails fails the commit (nothing is published, the chain is as before):
publishing the longer chain instead would let repeated failures grow it without bound,
and a read of a chain costs time per file.

Each commit writes its SSTs in a working folder of its own (``work``, or ``TMPDIR``),
flocked while the writer lives; a writer killed mid-commit cannot remove its folder, so
the next writer that makes one in the same place removes those whose lock is free.

``commit_version`` does this for every partition a commit touches and publishes the
next store version (``records.publish_version``: one exclusive create, so a racing writer
gets ``VersionConflictError`` and its uploads stay behind as orphans for retention).
Before it does, ``publish_next`` checks that every file the new version adds is on the
root: another writer's retention removes unlisted files once they are older than the
grace, and a version listing one of them would fail every read of its partition.

The writer's clock (``writer_clock``) stamps SST names, commit records and version
records; nothing judges ages by it (retention reads the storage's timestamps), so a
writer whose clock is off writes what it would with a right one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ...errors import IqkitError, ObjectMissingError
from ...query.position import Position
from ..cache import FileCache
from ..integrity import checksum_file
from ..locking import CommitLock
from ..manifest import StoreManifest
from ..names import (
    CHAIN_SST_DIR,
    CHAIN_WORK_PREFIX,
    COMMIT_KEY,
    LOCK_FILE,
    META_PREFIX,
    twin_key,
)
from ..objects import ObjectStore
from ..partitions import rocks
from ..partitions.builds import build_database
from ..partitions.partition import encode_commit_record
from ..sorted_rows import ArrowRows
from .read import check_twins, place_on_root
from .records import (
    ROWS_AT_MOST,
    ChainFile,
    ChainVersion,
    PartitionChain,
    check_next_version,
    next_record,
    publish_version,
)

__all__ = [
    "COMPACT_AFTER_DELTAS",
    "Change",
    "commit_partition",
    "chain_commit_lock",
    "commit_version",
    "compact_files",
    "overlong",
    "publish_next",
    "sst_key",
    "upload_file",
    "work_folder",
    "write_arrow_delta",
    "writer_clock",
]

#: A change: a value, or None for a delete.
Change = tuple[bytes, bytes | None]

#: The longest chain a commit leaves (base + this many deltas); the next commit compacts.
#: Measured: 1 base + 4 deltas opens in ~43 ms, + 16 in ~145 ms
#: (docs/DECISIONS.md "Compaction").
COMPACT_AFTER_DELTAS = 8


def writer_clock() -> float:
    """This writer's clock (seconds since the epoch): what its SST names and records are
    stamped with (module docstring). One function, so a test can set it off."""
    return time.time()


def sst_key(store: str, partition: int, version: int) -> str:
    """A fresh, unique key for an SST of ``partition`` written by ``version``; the
    writer's clock (milliseconds) is in the name, for people (retention reads the
    storage's timestamps)."""
    millis = int(writer_clock() * 1000)
    return (
        f"{store}/{CHAIN_SST_DIR}/{partition}/"
        f"{version:012d}-{millis:013d}-{uuid.uuid4().hex[:16]}.sst"
    )


def _checked(changes: Iterable[Change], commit: bytes) -> Iterator[Change]:
    """The commit record first (its key sorts before every user key), then ``changes``,
    which must be sorted, unique, and outside iqkit's reserved keyspace."""
    yield COMMIT_KEY, commit
    last = None
    for key, value in changes:
        if key[:1] <= META_PREFIX:
            raise ValueError(f"change key {key[:20]!r} is in iqkit's reserved keyspace (0x00)")
        if last is not None and key <= last:
            raise ValueError(
                f"changes must be sorted by key, each key once: {key[:20]!r} after {last[:20]!r}"
            )
        last = key
        yield key, value


def write_arrow_delta(path: Path, rows: ArrowRows, commit: bytes) -> None:
    """A delta SST of Arrow rows (a Spark job task's partition: keys sorted, values
    aligned, deletes as nulls), its commit record first. The one place an Arrow-held
    delta becomes an SST, so a file written from the same arrays (a columnar copy) goes
    here, next to it. The rows' order and keyspace are checked column-wise."""
    rocks.write_arrow_sst(path, _checked_arrow(rows.chunks()), head=[(COMMIT_KEY, commit)])


def _checked_arrow(chunks: Iterable[tuple[Any, Any]]) -> Iterator[tuple[Any, Any]]:
    """``_checked`` for ``(keys, values)`` Arrow chunks: keys strictly increasing within
    and across chunks, so only the first key needs the reserved-keyspace check."""
    import pyarrow.compute as pc

    last: bytes | None = None
    for keys, values in chunks:
        n = len(keys)
        if not n:
            continue
        first = keys[0].as_py()
        if last is None and first[:1] <= META_PREFIX:
            raise ValueError(f"change key {first[:20]!r} is in iqkit's reserved keyspace (0x00)")
        if last is not None and first <= last:
            raise ValueError(
                f"changes must be sorted by key, each key once: {first[:20]!r} after {last[:20]!r}"
            )
        if n > 1 and not pc.all(pc.less(keys.slice(0, n - 1), keys.slice(1))).as_py():
            raise ValueError("changes must be sorted by key, each key once")
        last = keys[n - 1].as_py()
        yield keys, values


@contextlib.contextmanager
def work_folder(parent: str | os.PathLike[str] | None = None) -> Iterator[Path]:
    """A fresh working folder (``CHAIN_WORK_PREFIX``) in ``parent`` (default: TMPDIR),
    flocked while it is in use and removed after. First, the folders there that killed
    writers left (their lock is free) are removed (module docstring)."""
    where = os.fspath(parent) if parent is not None else tempfile.gettempdir()
    remove_dead_work_folders(where)
    while True:
        path = tempfile.mkdtemp(prefix=CHAIN_WORK_PREFIX, dir=where)
        # Until it is locked the new folder looks like a dead writer's to another
        # writer's sweep (another process, or another thread of this one), which may
        # remove it before it is opened, or between the open and the lock: then make
        # another.
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _same_folder(path, fd):
            break
        os.close(fd)
    try:
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def _same_folder(path: str, fd: int) -> bool:
    try:
        here = os.lstat(path)
    except FileNotFoundError:
        return False
    there = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def remove_dead_work_folders(parent: str) -> list[str]:
    """Remove the working folders in ``parent`` whose writer is dead: this user's real
    folders (no links) named ``CHAIN_WORK_PREFIX*`` whose flock this process can take
    without waiting (the kernel dropped a killed writer's). Returns their names; best
    effort (what cannot be removed now stays for the next writer)."""
    removed = []
    try:
        names = [n for n in os.listdir(parent) if n.startswith(CHAIN_WORK_PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _same_folder(path, fd):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(name)
        except OSError:  # BlockingIOError: its writer is alive
            pass
        finally:
            os.close(fd)
    return removed


def _rows_at_most(previous: dict[str, Any] | None, counts: Mapping[str, int] | None) -> int | None:
    """An upper bound on the rows of the chain a commit leaves: the previous chain's
    bound plus this commit's puts (deletes and overwrites only lower the truth). None
    when either is unknown (a task's commit counts nothing; chains of earlier iqkits).
    Readers skip a chain whose bound is 0 without building its database."""
    puts = (counts or {}).get("puts")
    before = 0 if previous is None else previous.get(ROWS_AT_MOST)
    if puts is None or before is None:
        return None
    return int(before) + int(puts)


def _commit_record(
    previous: PartitionChain | None,
    version: int,
    position: Position | None,
    counts: Mapping[str, int] | None,
) -> bytes:
    """The partition's commit record: ``position`` merged into the previous one, and
    the bound on the chain's rows when it is known (``_rows_at_most``)."""
    last = previous.commit_record() if previous is not None else None
    before = last.get("position") if last is not None else None
    record: dict[str, Any] = {
        "version": version,
        "position": (position or Position.empty()).merge(before),
        "committed_at": writer_clock(),
    }
    record.update(counts or {})
    bound = _rows_at_most(last, counts)
    if bound is not None:
        record[ROWS_AT_MOST] = bound
    return encode_commit_record(record)


def commit_partition(
    objects: ObjectStore,
    store: str,
    partition: int,
    previous: PartitionChain | None,
    changes: Iterable[Change],
    *,
    version: int,
    cache: FileCache,
    position: Position | None = None,
    counts: Mapping[str, int] | None = None,
    compact_after: int = COMPACT_AFTER_DELTAS,
    work: str | os.PathLike[str] | None = None,
    uploaded: tuple[ChainFile, ...] = (),
    manifest: StoreManifest | None = None,
) -> PartitionChain:
    """Upload ``partition``'s changes for ``version`` (module docstring); returns its new
    chain. Nothing is published here; ``cache`` serves the previous chain's files when
    the commit compacts. ``work`` is a local folder for the files being written.

    ``uploaded``: SSTs of this commit already on the root (a Spark data source write's
    task fragments, in the order they apply), which go between ``previous``'s files and
    the delta holding ``changes`` and the commit record.

    ``manifest``: the store's, when its SSTs get columnar twins (``store/columnar/twins.py``):
    the uploaded SST's twin is uploaded beside it."""
    commit = _commit_record(previous, version, position, counts)
    old = (*(previous.files if previous is not None else ()), *uploaded)
    twinned = manifest is not None and manifest.kind.has_twins
    with work_folder(work) as tmp:
        delta = Path(tmp) / "delta.sst"
        rows: list[Change]
        twin: Path | None = Path(tmp) / "upload.parquet" if twinned else None
        compacting = bool(old) and len(old) > compact_after
        streamed = False  # the delta's twin written while its SST was
        if isinstance(changes, ArrowRows):
            if twinned and compacting:  # the merged twin needs the delta's rows: keep them
                chunks = list(changes.chunks())
                changes = ArrowRows(chunks)
                rows = [
                    pair
                    for keys, values in chunks
                    for pair in zip(keys.to_pylist(), values.to_pylist(), strict=True)
                ]
            elif twinned:  # the twin from the same chunks, as they stream to the SST
                assert manifest is not None and twin is not None
                from ..columnar import twins  # pyarrow: imported by writers only

                rows = []
                writer = twins.TwinWriter(twin, manifest, changes.twin_columns, keep_keys=bool(old))
                changes = ArrowRows(writer.tee(changes.sequenced_chunks()))
                streamed = True
            else:
                rows = []
            write_arrow_delta(delta, changes, commit)
            if streamed:
                assert manifest is not None
                footer = None
                if old:  # the delta's position deletes, from the keys it streamed
                    footer = _position_deletes(cache, objects, old, manifest, writer.keys())
                if not writer.close(footer):
                    twin = None
        elif twinned:  # the twin is made from the same rows
            rows = list(_checked(changes, commit))
            rocks.write_changes_sst(delta, rows)
        else:
            rows = []
            rocks.write_changes_sst(delta, _checked(changes, commit))
        if compacting:
            upload = Path(tmp) / "base.sst"
            compact_files(
                cache, objects, old, upload, Path(tmp) / "db", manifest, twin, delta, rows
            )
            kept: tuple[ChainFile, ...] = ()
        else:
            upload, kept = delta, old
            if twin is not None and not streamed:
                assert manifest is not None
                from ..columnar import twins  # pyarrow: imported by writers only

                deletes = _position_deletes(cache, objects, old, manifest, [k for k, _ in rows])
                if not twins.try_write(twins.write_twin_of_rows, twin, manifest, rows, deletes):
                    twin = None
        del rows
        new = upload_file(objects, sst_key(store, partition, version), upload, twin)
    return PartitionChain(files=(*kept, new), commit=commit, written_by=version)


def _position_deletes(
    cache: FileCache,
    objects: ObjectStore,
    old: tuple[ChainFile, ...],
    manifest: StoreManifest,
    keys: Any,
) -> dict[bytes, bytes] | None:
    """The position deletes the delta's twin carries for the older files ``old``
    (``store/columnar/deletes.py``), or None: no older file, one without a twin a
    reader may be handed, or one that cannot be read (readers then merge on keys, as
    before; a commit never fails for want of them)."""
    if not old or not all(f.twin_readable for f in old):
        return None
    import pyarrow as pa

    from ..columnar import deletes  # pyarrow: imported by writers only

    if not deletes.writing_enabled():
        return None
    try:
        with cache.sources(objects, [f.twin_name for f in old if f.twin_name]) as paths:
            check_twins(objects, old, [os.fspath(p) for p in paths])  # integrity.py
            older = [(f.name, p) for f, p in zip(old, paths, strict=True)]
            return deletes.superseded_metadata(manifest, older, keys)
    except (IqkitError, OSError, ValueError, pa.ArrowException):
        return None


def upload_file(objects: ObjectStore, key: str, sst: Path, twin: Path | None) -> ChainFile:
    """Upload ``sst`` under ``key`` and its twin (when written) beside it; the chain
    file that lists them, with the checksums of the bytes uploaded (integrity.py)."""
    checksum = checksum_file(sst)
    objects.put_immutable(key, sst)
    twin_size = twin_checksum = None
    if twin is not None and twin.exists():
        twin_checksum = checksum_file(twin)
        objects.put_immutable(twin_key(key), twin)
        twin_size = twin.stat().st_size
    return ChainFile(key, sst.stat().st_size, twin_size, checksum, twin_checksum)


def compact_files(
    cache: FileCache,
    objects: ObjectStore,
    files: tuple[ChainFile, ...],
    base: Path,
    db_dir: Path,
    manifest: StoreManifest | None,
    twin: Path | None,
    delta: Path | None = None,
    delta_rows: list[Change] | None = None,
) -> None:
    """Write ``base``: every live row of ``files`` (plus a commit's ``delta``), no
    tombstones, and its twin at ``twin`` when asked: merged from the files' twins (and
    the delta's rows) when every file has one, else made from the base's rows. The
    files are read where ``FileCache.sources`` says: in place on a local root, else the
    cache's copies. A commit compacts inline, ``compaction.compact_store`` on its own."""
    delta_rows = delta_rows or []
    with cache.sources(objects, [f.name for f in files]) as paths:
        names = [place_on_root(objects, f.name) for f in files]
        sources = list(paths)
        if delta is not None:
            names.append("this commit's delta")
            sources.append(delta)
        build_database(db_dir, sources, names)
    db = rocks.open_for_read(db_dir)
    try:
        if twin is None:
            rocks.write_sst(base, rocks.scan(db, b"", None))
        else:
            from ..columnar import merge, twins  # pyarrow: imported by writers only

            assert manifest is not None
            if all(f.twin_readable for f in files):
                rocks.write_sst(base, rocks.scan(db, b"", None))
                keys = [f.twin_name for f in files]
                with cache.sources(objects, [k for k in keys if k]) as twin_paths:
                    # checked whole before pyarrow reads them (integrity.py)
                    check_twins(objects, files, [os.fspath(p) for p in twin_paths])
                    made = twins.try_write(
                        merge.write_merged_twin, twin, manifest, twin_paths, delta_rows
                    )
            else:  # an earlier iqkit's files: the twin from the base's rows
                rows = list(rocks.scan(db, b"", None))
                rocks.write_sst(base, iter(rows))
                made = twins.try_write(twins.write_twin_of_rows, twin, manifest, rows)
            if not made:
                twin.unlink(missing_ok=True)
    finally:
        rocks.close_quietly(db)
        with contextlib.suppress(OSError):
            shutil.rmtree(db_dir)


def chain_commit_lock(
    objects: ObjectStore, store: str, *, who: str, timeout: float
) -> contextlib.AbstractContextManager[object]:
    """What a chain commit holds while it publishes: on a local root the store's commit
    lock (``locking.CommitLock``, waited for up to ``timeout`` seconds), so local writers
    and jobs queue instead of one losing the race of the version record's create; on an
    object root nothing, as the exclusive create alone decides (writers there cannot
    share a lock)."""
    local = objects.root.local
    if local is None:
        return contextlib.nullcontext()
    return CommitLock(os.path.join(local, store, LOCK_FILE), store, who=who, timeout=timeout)


def overlong(version: ChainVersion | None, compact_after: int = COMPACT_AFTER_DELTAS) -> list[int]:
    """Partitions of ``version`` whose chains are longer than a commit leaves them (the
    next commit compacts them, whether it changes them or not)."""
    if version is None:
        return []
    return sorted(p for p, chain in version.partitions.items() if chain.deltas > compact_after)


def publish_next(
    objects: ObjectStore,
    store: str,
    previous: ChainVersion | None,
    version: int,
    written: Mapping[int, PartitionChain],
    *,
    source_end: Position | None = None,
    metadata: Mapping[str, Any] | None = None,
    who: str = "writer",
    replace_all: bool = False,
) -> ChainVersion:
    """Publish ``version``: ``written`` partitions' new chains, the others as in
    ``previous`` (none of them for ``replace_all``, an overwrite), with what every
    version carries forward (``records.next_record``). ``VersionConflictError`` when
    another writer published that number first; ``ObjectMissingError`` (nothing
    published) when a file the new version adds is not on the root."""
    check_next_version(store, version)
    partitions, end, facts = next_record(
        previous,
        version,
        written,
        source_end=source_end,
        metadata=metadata or {},
        who=who,
        replace_all=replace_all,
    )
    record = ChainVersion(
        version=version,
        partitions=partitions,
        created_at=writer_clock(),
        source_end=end,
        metadata=facts,
    )
    _check_files_there(objects, store, record, previous)
    publish_version(objects, store, record)
    return record


def _check_files_there(
    objects: ObjectStore, store: str, record: ChainVersion, previous: ChainVersion | None
) -> None:
    """``ObjectMissingError`` naming the first file ``record`` adds to ``previous`` that
    is not on the root (one stat, or one HEAD, per added file: a commit adds about one
    per partition it wrote). What ``previous`` lists is there: it is the latest version,
    which retention never removes."""
    known = previous.files() if previous is not None else set()
    for name in sorted(record.files() - known):
        if not objects.exists(name):
            raise ObjectMissingError(
                f"store {store!r}: version {record.version} was not published: "
                f"{objects.where(name)}, written by this commit, is gone (removed by "
                f"another writer's retention after more than its grace period?); "
                f"commit again"
            )


def commit_version(
    objects: ObjectStore,
    store: str,
    previous: ChainVersion | None,
    changes: Mapping[int, Iterable[Change]],
    *,
    cache: FileCache,
    positions: Mapping[int, Position] | None = None,
    counts: Mapping[int, Mapping[str, int]] | None = None,
    source_end: Position | None = None,
    metadata: Mapping[str, Any] | None = None,
    who: str = "writer",
    compact_after: int = COMPACT_AFTER_DELTAS,
    work: str | os.PathLike[str] | None = None,
    manifest: StoreManifest | None = None,
) -> ChainVersion:
    """Commit ``changes`` (partition -> sorted changes) on top of ``previous`` (the
    latest version this writer read, or None for the first) and publish the next
    version; partitions without changes keep their chains. ``VersionConflictError``
    when another writer published that number first."""
    version = previous.version + 1 if previous is not None else 1
    check_next_version(store, version)
    before = previous.partitions if previous is not None else {}
    # Chains over the bound that this commit does not touch are compacted too.
    changes = {**{p: [] for p in overlong(previous, compact_after)}, **changes}
    written = {
        p: commit_partition(
            objects,
            store,
            p,
            before.get(p),
            rows,
            version=version,
            cache=cache,
            position=(positions or {}).get(p),
            counts=(counts or {}).get(p),
            compact_after=compact_after,
            work=work,
            manifest=manifest,
        )
        for p, rows in sorted(changes.items())
    }
    return publish_next(
        objects,
        store,
        previous,
        version,
        written,
        source_end=source_end,
        metadata=metadata,
        who=who,
    )
