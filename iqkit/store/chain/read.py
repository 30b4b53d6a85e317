"""Reading one partition of an SST-chain version: its files from the cache, one RocksDB.

``open_partition`` pins the chain's SSTs in the ``FileCache`` (fetching only the ones
missing), then opens the partition's RocksDB folder in the cache,
``dbs/<root id>/<store>/<p>/<written_by>-<chain hash>/``, building it first if no
process has: the chain's files ingested oldest first into a new RocksDB
(``build_database``: in memory, unsynced, then moved into a temporary folder beside it),
renamed into place. The rename is
atomic and fails when the folder exists, so two processes building the same version at
once both succeed and one keeps the other's folder; a second open of the version
(in any process) reuses it, touching neither the root nor the network.

The database counts against the cache's limit like its files (``FileCache.evict``), so
an open partition pins its database folder (a shared ``flock`` on it, taken on the
temporary folder before the rename so no eviction can slip in between) as well as its
files, and eviction never removes a database a live reader has open. A database evicted
while nobody had it open is simply built again by the next open.

The database holds a hard link of each of the chain's files (cached, or the root's own
on a local root): it shares their bytes (no copy), the files are never changed, and
evicting a cached file later does not break an open database. The result is a
``RocksDBPartition`` (the engine's ``BytesPartition``); the process that built the
database reads through the handle its build kept open, others open it read-only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import stat
import sys
import tempfile
import time
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import IqkitError, StoreCorruptedError, StoreIOError, StoreNotFoundError
from ..cache import STALE_TMP_SECONDS, CacheStats, FileCache, PinnedFile, counted, is_disk_full
from ..manifest import StoreManifest
from ..names import CACHE_BUILDING_PREFIX, CACHE_DBS_DIR, CHAIN_SST_DIR, ROCKSDB_SIDE_FILES
from ..objects import NotPlainFileError, ObjectStore, check_key, link_plain_file, refused
from ..partitions import rocks
from ..partitions.partition import RocksDBPartition
from .records import PartitionChain

__all__ = [
    "ChainPartition",
    "build_database",
    "database_folder",
    "open_partition",
    "place_on_root",
    "plan_twin_scan",
]


def build_database(
    folder: Path,
    files: Sequence[str | os.PathLike[str]],
    names: Sequence[str] | None = None,
) -> None:
    """Create the RocksDB ``folder`` (must not exist) holding ``files`` (SSTs, oldest
    first: each ingestion is newer than the last, so later values and tombstones win).
    The files themselves are left in place: the database holds hard links of them
    (``folder``'s own names, no copy; a copy from another file system). ``names``: what
    errors call each file (its place on the root), else its path. A file that is a
    symbolic link or not a plain file is refused (``StoreIOError`` naming it): a version
    naming a planted link must not read another store's file, or any file.

    RocksDB syncs every small file it writes while creating a database and ingesting
    (16 ``fsync``s here, and one of each ingested file; on a busy disk most of a first
    query's time). A database built for reading is only a cache of the chain's files,
    rebuilt when lost, so it needs none of that: when a memory file system is at hand
    (``_memory_scratch``) RocksDB builds there (``_build_in_memory``) and what it wrote
    is then moved into ``folder`` with plain writes. The caller publishes ``folder``
    with one rename either way, so a build cut short is never served; one a power loss
    left incomplete fails to open, and ``open_partition`` builds it again."""
    _build(Path(folder), files, names)


@dataclass
class _KeptOpen:
    """A database just built in memory and kept open to serve its first reads
    (``_build(serve_from=...)``): RocksDB's own files in ``scratch`` (locked by the
    descriptor ``lock`` while in use), its table files symbolic links to the published
    database's."""

    db: rocks.Rdict
    scratch: Path
    lock: int

    def discard(self) -> None:
        rocks.close_quietly(self.db)
        shutil.rmtree(self.scratch, ignore_errors=True)
        os.close(self.lock)


def _build(
    folder: Path,
    files: Sequence[str | os.PathLike[str]],
    names: Sequence[str] | None,
    *,
    serve_from: Path | None = None,
) -> _KeptOpen | None:
    """``build_database``; with ``serve_from`` (where ``folder`` is about to be renamed to)
    a database built in memory is kept open and returned, its table files linked to
    ``serve_from``'s: the first reads need no second open of the database (a read-only
    open through a view, rocks.open_for_read, was a quarter of a first query)."""
    folder.mkdir()
    named = [(f, names[i] if names is not None else os.fspath(f)) for i, f in enumerate(files)]
    scratch = _memory_scratch()
    if scratch is None:
        _build_here(folder, named)
        return None
    path, lock = scratch
    memory_full = False
    try:
        db = _build_in_memory(folder, path, named, serve_from)
    except (OSError, IqkitError) as exc:
        db = True
        if not is_disk_full(exc):
            raise
        memory_full = True  # (or the cache's disk: building in place says which)
    except BaseException:
        db = True
        raise
    finally:
        if db is True:  # closed (or never opened): the scratch folder has served
            shutil.rmtree(path, ignore_errors=True)
            os.close(lock)
    if memory_full:
        shutil.rmtree(folder)
        folder.mkdir()
        _build_here(folder, named)
        return None
    return None if db is True else _KeptOpen(db, path, lock)


def _build_here(folder: Path, files: list[tuple[str | os.PathLike[str], str]]) -> None:
    """``build_database`` with RocksDB writing (and syncing) in ``folder`` itself."""
    stages = []
    for file, name in files:
        # Ingestion (move_files) removes the path it is given (quirk): it gets a second
        # link (or, from another file system, a copy).
        stage = folder / f".ingest-{uuid.uuid4().hex}.sst"
        try:
            link_plain_file(file, stage, name)
        except FileNotFoundError:
            raise StoreNotFoundError(f"{name}: a file of this version is missing") from None
        except NotPlainFileError as exc:
            raise StoreIOError(exc.strerror) from None
        stages.append((stage, name))
    db = rocks.open_for_build(folder)
    try:
        for stage, name in stages:
            rocks.ingest(db, [stage], where=name)
    finally:
        rocks.close_quietly(db)


def _build_in_memory(
    folder: Path,
    scratch: Path,
    files: list[tuple[str | os.PathLike[str], str]],
    serve_from: Path | None,
) -> rocks.Rdict | bool:
    """``build_database`` with RocksDB writing in ``scratch`` (a memory file system).

    Each file is opened once, refusing a link (``O_NOFOLLOW``) and anything but a plain
    file, and RocksDB ingests a symbolic link to the open descriptor (``/proc/self/fd``):
    it reads exactly the file checked, and moving it into the database links the
    symbolic link itself (link(2) does not follow it). Once the ingestions are done,
    ``folder`` gets a hard link of each descriptor's file under the name RocksDB gave
    it, and a copy of every other file it wrote (not its lock, info log or rocksdict's
    config: what readers' views leave out, rocks.ROCKSDB_SIDE_FILES).

    Returns the database still open when ``serve_from`` is given (its table files then
    link to ``serve_from``'s, before the descriptors they named close: a number reused
    must never be read as a table), else closes it and returns True."""
    opened: dict[str, tuple[int, str]] = {}
    copies: list[Path] = []
    db = None
    try:
        for file, name in files:
            fd = _open_plain(file, name)
            opened[f"{_FD_LINKS}/{fd}"] = (fd, name)
            if not os.access(f"{_FD_LINKS}/{fd}", os.W_OK, effective_ids=True):
                # RocksDB opens each ingested file to write, to sync it (quirk): one this
                # user may not write (another user's store) is ingested from a copy.
                copy = folder / f".ingest-{uuid.uuid4().hex}.sst"
                _copy_open_file(fd, copy)
                copies.append(copy)
                del opened[f"{_FD_LINKS}/{fd}"]
                os.close(fd)
                fd = _open_plain(copy, name)
                opened[f"{_FD_LINKS}/{fd}"] = (fd, name)
        built = scratch / "db"
        db = rocks.open_for_build(built)
        for i, (link, (_fd, name)) in enumerate(opened.items()):
            stage = scratch / f".ingest-{i}.sst"
            os.symlink(link, stage)
            rocks.ingest(db, [stage], where=name)
        if serve_from is None:
            db, closing = None, db
            rocks.close_quietly(closing)
        # Everything RocksDB writes for an ingestion is written (and synced) when it
        # returns: the files are complete whether the database is still open or not.
        with os.scandir(built) as entries:
            for entry in entries:
                target = folder / entry.name
                if entry.is_symlink():
                    fd, name = opened[os.readlink(entry.path)]
                    _link_open_file(fd, target)
                    if serve_from is not None:
                        relink = scratch / f".relink-{entry.name}"
                        os.symlink(serve_from / entry.name, relink)
                        os.replace(relink, entry.path)
                elif entry.is_file(follow_symlinks=False) and entry.name not in ROCKSDB_SIDE_FILES:
                    # (A table file RocksDB copied, as it does when it cannot link, is
                    # a plain file too.)
                    shutil.copyfile(entry.path, target, follow_symlinks=False)
        for copy in copies:
            copy.unlink()  # the database holds its own link
    except BaseException:
        rocks.close_quietly(db)
        raise
    finally:
        for fd, _name in opened.values():
            os.close(fd)
    return True if db is None else db


#: Where RocksDB builds a database before it is moved into the cache (build_database):
#: a memory file system, whose syncs cost nothing. ``None`` (or a folder this process
#: cannot write to) builds in place.
MEMORY_FOLDER: Path | None = Path("/dev/shm") if sys.platform == "linux" else None
#: Linux's links to a process's open descriptors (``_build_in_memory`` needs them).
_FD_LINKS = "/proc/self/fd"
#: Prefix of a build's scratch folder in ``MEMORY_FOLDER``.
_SCRATCH_PREFIX = "iqkit-build-"
#: The processes (this one, or the one it was forked from) that swept ``MEMORY_FOLDER``.
_swept: set[int] = set()


def _memory_scratch() -> tuple[Path, int] | None:
    """A private scratch folder (0700) in ``MEMORY_FOLDER`` for one build and a
    descriptor holding a shared ``flock`` on it (released by the kernel if the process
    dies), else ``None`` (none configured, not writable, or no ``/proc/self/fd``: the
    build runs in place). Once per process, this user's scratch folders nobody holds
    are removed first: a build killed before its ``finally`` leaves a few small files
    there, in memory."""
    memory = MEMORY_FOLDER
    if memory is None or not os.access(memory, os.W_OK | os.X_OK):
        return None
    if not os.path.isdir(_FD_LINKS):
        return None
    if os.getpid() not in _swept:
        _swept.add(os.getpid())
        _remove_unheld(memory)
    for _ in range(3):
        try:
            path = tempfile.mkdtemp(prefix=_SCRATCH_PREFIX, dir=memory)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None  # (a sweep may take the folder before it is opened: tried again)
        fcntl.flock(fd, fcntl.LOCK_SH)
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return Path(path), fd
        os.close(fd)  # another process's sweep took it before the lock: another one
    return None


def _remove_unheld(memory: Path) -> None:
    """Remove this user's scratch folders in ``memory`` whose builder died (nobody holds
    their lock)."""
    uid = os.geteuid()
    with contextlib.suppress(OSError), os.scandir(memory) as entries:
        for entry in entries:
            if not entry.name.startswith(_SCRATCH_PREFIX):
                continue
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    shutil.rmtree(entry.path)
                finally:
                    os.close(fd)


def _open_plain(file: str | os.PathLike[str], name: str) -> int:
    """A read-only descriptor of ``file``, which must be a plain file and not a link
    (else ``StoreIOError`` naming ``name``; a missing one is ``StoreNotFoundError``)."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise StoreNotFoundError(f"{name}: a file of this version is missing") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreIOError(refused(name, stat.S_IFLNK).strerror) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise StoreIOError(refused(name, mode).strerror)
    return fd


def _link_open_file(fd: int, target: Path) -> None:
    """Give the file open as ``fd`` the new name ``target``: a hard link, else (another
    file system, another user's file) a copy of its bytes."""
    # os.link calls link(2), which links a symbolic link itself, unless it is given a
    # folder descriptor (quirk): then it calls linkat(2) with AT_SYMLINK_FOLLOW, which
    # links the open file. The folder is never used (the source path is absolute).
    here = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(f"{_FD_LINKS}/{fd}", target, src_dir_fd=here, follow_symlinks=True)
        return
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
    finally:
        os.close(here)
    _copy_open_file(fd, target)


def _copy_open_file(fd: int, target: Path) -> None:
    """A new file ``target`` holding the bytes of the file open as ``fd``."""
    with open(fd, "rb", closefd=False) as src, open(target, "xb") as out:
        src.seek(0)
        shutil.copyfileobj(src, out, 1 << 20)


def database_folder(
    cache: FileCache, objects: ObjectStore, store: str, partition: int, chain: PartitionChain
) -> Path:
    """Where ``chain``'s database lives in ``cache`` (the names hashed in: a folder holds
    one chain whatever the version numbers of racing writers were)."""
    root_id = cache.path_of(objects, store).relative_to(cache.objects_dir).parts[0]
    names = "\n".join(f.name for f in chain.files)
    written_by = str(chain.written_by)
    if len(written_by) > _MAX_VERSION_DIGITS:
        # A record's number may be any JSON integer: one too long for a folder name is
        # hashed in with the names (still one folder per chain and number).
        names, written_by = f"{written_by}\n{names}", "big"
    digest = hashlib.sha256(names.encode()).hexdigest()[:16]
    return (
        cache.folder
        / CACHE_DBS_DIR
        / root_id
        / check_key(store)
        / str(partition)
        / f"{written_by}-{digest}"
    )


#: The longest version number written as itself in a database folder's name (a 64-bit
#: number has 20 digits at most).
_MAX_VERSION_DIGITS = 20


class ChainPartition(RocksDBPartition):
    """A partition of an SST-chain version, opened read-only from the cache.

    It keeps its database folder and the chain's cached files pinned while open
    (eviction skips them, so the cache's size accounting sees what is in use), and says
    what opening it cost."""

    def __init__(
        self,
        path: Path,
        chain: PartitionChain,
        pins: list[PinnedFile],
        fetch: CacheStats,
        built: bool,
        *,
        in_place: int = 0,
        where: str = "",
        note: str | None = None,
        db: rocks.Rdict | None = None,
    ) -> None:
        self._pins = pins
        #: Whether it reads the database its build kept open (rocksdict's read-write
        #: handle: a few more descriptors, its write-ahead log, MANIFEST and lock).
        self._kept = db is not None
        try:
            super().__init__(path, chain.written_by, db=db)
        except BaseException:
            self._release()
            raise
        #: The database folder in the cache this partition reads.
        self.database = path
        #: Where the partition is on its root (messages and traces name it, never the
        #: cache's folder: that differs per machine and per reader).
        self.location = where or self.location
        self.chain = chain
        #: What opening fetched and what came from the cache (and what it evicted).
        self.fetch = fetch
        #: True when this open built the database; False when it was already in the cache.
        self.built = built
        #: How many of the chain's files were read in place on a local root (no fetch).
        self.in_place = in_place
        #: Why the cache is not the folder configured (``FileCache.note``), else None.
        self.note = note

    def trace_line(self) -> str:
        """One line for an execution trace: fetched files, cache hits, database reuse
        (on a local root: the files read in place, never fetched), what eviction and
        distrust removed; then, on a line of its own, ``note`` when there is one."""
        made = "built" if self.built else "reused"
        files = f"database {made} ({counted(len(self.chain.files), 'SST file')})"
        if self.in_place:
            line = f"local root: {counted(self.in_place, 'file')} read in place; {files}"
            extra = [self.fetch.evicted_line()]
            if self.fetch.distrusted:
                extra.append(self.fetch.distrust_line())
            line = "; ".join([line, *filter(None, extra)])
        else:
            line = f"{self.fetch.line()}; {files}"
        return line if self.note is None else f"{line}\n{self.note}"

    @property
    def descriptors(self) -> int:
        """File descriptors this open partition may hold, counted high: one per pin (its
        ``flock``), one per SST RocksDB opens as it reads, one for RocksDB's info log.
        What the reader's bound on open partitions adds up (chain_snapshot.OpenChains)."""
        return len(self._pins) + len(self.chain.files) + 1 + (3 if self._kept else 0)

    def _release(self) -> None:
        pins, self._pins = self._pins, []
        for pin in pins:
            pin.release()

    def close(self) -> None:
        super().close()
        self._release()


def open_partition(
    cache: FileCache, objects: ObjectStore, store: str, partition: int, chain: PartitionChain
) -> ChainPartition:
    """``chain`` (partition ``partition`` of a version of ``store``) as a read-only
    partition; fetches only the files the cache lacks (module docstring).

    A database found in the cache that does not open or read is discarded and built
    again, once (builds are not synced to disk, build_database: a power loss may leave
    one incomplete). A full disk (or quota) makes room first: every unpinned entry of
    the cache is evicted (the disk is full whatever the cache's limit says), then the
    open is retried once. What still fails in the cache's folders is one
    ``StoreIOError`` line naming the cache and the partition's place on the root (never a
    build's temporary folder)."""
    before = cache.stats.copy()
    where = place_on_root(objects, f"{store}/{CHAIN_SST_DIR}/{partition}")
    for attempt in (1, 2):
        try:
            return _open_partition(cache, objects, store, partition, chain, before)
        except _ReusedDatabaseFailed as exc:
            if attempt == 1:
                continue  # discarded: built again from the chain's files
            raise StoreCorruptedError(str(exc)) from exc.__cause__
        except (OSError, IqkitError) as exc:
            if is_disk_full(exc) and attempt == 1:
                cache.evict(down_to=0)
                continue
            if is_disk_full(exc):
                reason = "No space left on device, even after evicting every unpinned entry"
            elif isinstance(exc, OSError) and not isinstance(exc, IqkitError):
                reason = exc.strerror or type(exc).__name__  # mkdir, link, rename in the cache
            else:
                raise
            raise StoreIOError(
                f"cannot read {where} through the cache at {cache.folder}: {reason}"
            ) from None
    raise AssertionError("unreachable")


def _open_partition(
    cache: FileCache,
    objects: ObjectStore,
    store: str,
    partition: int,
    chain: PartitionChain,
    before: CacheStats,
) -> ChainPartition:
    """One attempt of ``open_partition`` (``before``: the cache's counts at its start)."""
    pins: list[PinnedFile] = []
    sources: list[Path] = []  # the chain's files, oldest first, where the build reads them
    folder = database_folder(cache, objects, store, partition, chain)
    where = place_on_root(objects, f"{store}/{CHAIN_SST_DIR}/{partition}")
    in_place = reused = False
    kept: _KeptOpen | None = None
    try:
        database = cache.pin_database(folder)
        if database is not None:
            pins.append(database)
            reused = True
        local = [objects.local_file(f.name) for f in chain.files]
        in_place = all(p is not None for p in local)
        if in_place:
            # A local root: its immutable files are read where they are (a copy in the
            # cache would only double the disk used). The database built from them holds
            # its own hard links, so it outlives retention removing one; nothing here
            # writes to them.
            sources = [p for p in local if p is not None]
        else:
            for f in chain.files:
                if database is not None and not cache.path_of(objects, f.name).exists():
                    continue  # evicted, but the database holds its own link: no fetch
                pin = cache.pin(objects, f.name)
                pins.append(pin)
                sources.append(pin.path)
        built = False
        if database is None:
            names = [place_on_root(objects, f.name) for f in chain.files]
            database, built, kept = _build_in_place(cache, folder, sources, names)
            pins.append(database)
            if kept is not None:
                # The scratch folder's lock is held (and the folder removed with the
                # database, rocks.close_quietly) for as long as the partition is open.
                pins.append(PinnedFile(kept.scratch, 0, kept.lock))
                rocks.remove_on_close(kept.db, kept.scratch)
            if built:
                cache.added(database.size)  # counts against the limit (it is pinned)
        fetch = cache.stats.since(before)
        read_in_place = len(sources) if in_place else 0
        note = cache.note
        db, kept = (kept.db if kept is not None else None), None  # now the partition's
        return ChainPartition(
            folder,
            chain,
            pins,
            fetch,
            built,
            in_place=read_in_place,
            where=where,
            note=note,
            db=db,
        )
    except BaseException as exc:
        if kept is not None:
            rocks.close_quietly(kept.db)
        for pin in pins:
            pin.release()
        if not isinstance(exc, StoreCorruptedError):
            raise
        named = _as_on_root(exc, folder, where, _names_by_inode(cache, objects, chain))
        # A retry builds the database again, from files fetched again (or, on a local
        # root, from the root's files as they are then).
        cache.discard_database(folder)
        if not in_place:
            cache.discard(objects, [f.name for f in chain.files])
        if reused:
            raise _ReusedDatabaseFailed(str(named)) from exc
        raise named from exc


class _ReusedDatabaseFailed(StoreCorruptedError):
    """A database found in the cache did not open or read (now discarded):
    ``open_partition`` builds it again once before this counts as the partition's."""


def _names_by_inode(
    cache: FileCache, objects: ObjectStore, chain: PartitionChain
) -> dict[tuple[int, int], str]:
    """The chain's files by inode, named by their place on the root: a database's SSTs
    are hard links of them (the root's own files on a local root, else the cache's)."""
    found = {}
    for f in chain.files:
        with contextlib.suppress(OSError, IqkitError):  # a file refused or gone: unnamed
            path = objects.local_file(f.name) or cache.path_of(objects, f.name)
            st = os.stat(path, follow_symlinks=False)
            found[(st.st_dev, st.st_ino)] = place_on_root(objects, f.name)
    return found


def _as_on_root(
    exc: StoreCorruptedError,
    database: Path,
    where: str,
    names: dict[tuple[int, int], str],
) -> StoreCorruptedError:
    """``exc`` (a database in the cache that would not open or read: a file of the
    version was damaged on the root after the database was built from it, the two
    sharing its bytes) as one line naming the root's file when RocksDB's own name for it
    maps to one (``names``, by inode), else the partition's place on the root — never
    the cache's folders."""
    text = str(exc)
    if any(root_name in text for root_name in names.values()):
        # Already named as the root has it (a build's ingest names the file it read).
        first = text.splitlines()[0]
        return exc if first == text else StoreCorruptedError(first)
    raw = str(exc.__cause__ or exc).splitlines()[0]
    # RocksDB names the database's own file (in the cache, or the private read view
    # rocks.open_for_read opens it through).
    match = re.search(r"(\S*/)?([^/\s:]+\.sst)\b", raw)
    if match is None:
        return StoreCorruptedError(f"corrupt RocksDB data at {where}: {raw}")
    named = None
    with contextlib.suppress(OSError):
        st = os.stat(database / match.group(2))
        named = names.get((st.st_dev, st.st_ino))
    if named:  # the file is named in front: drop RocksDB's name for it
        detail = re.sub(r":?\s*" + re.escape(match.group(0)), "", raw, count=1)
    else:
        detail = raw.replace(match.group(0), match.group(2))
    return StoreCorruptedError(f"corrupt RocksDB data at {named or where}: {detail}")


def _remove_stale_builds(parent: Path) -> None:
    """Remove builds a killed process left (older than the cache's stale-download age;
    a younger one may be another process's build in progress)."""
    cutoff = time.time() - STALE_TMP_SECONDS
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for entry in entries:
            if entry.name.startswith(CACHE_BUILDING_PREFIX):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        shutil.rmtree(entry.path)


def place_on_root(objects: ObjectStore, key: str) -> str:
    """``key`` under the root as the user gave it (messages and traces: the same on every
    machine for a relative root, unlike the cache's folders)."""
    return f"{objects.root.text.rstrip('/')}/{key}"


def _build_in_place(
    cache: FileCache, folder: Path, files: list[Path], names: list[str]
) -> tuple[PinnedFile, bool, _KeptOpen | None]:
    """Build ``folder`` through a temporary folder and a rename; the database pinned,
    and False when another process's build got there first (its folder, the same chain,
    is used); and the database still open when this build kept it (``_build``), for the
    caller to own. ``files`` must be pinned by the caller."""
    while True:
        cache.make_folder(folder.parent)
        _remove_stale_builds(folder.parent)
        tmp = folder.with_name(f"{CACHE_BUILDING_PREFIX}{uuid.uuid4().hex}-{folder.name}")
        kept = None
        try:
            kept = _build(tmp, files, names, serve_from=folder)
            pin = cache.hold_new_database(tmp)  # the lock moves with the folder
            try:
                os.rename(tmp, folder)
            except OSError as exc:
                pin.release()
                if kept is not None:
                    kept, closing = None, kept
                    closing.discard()  # linked to a folder this build does not own
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                # Another process's build is there, or was: an eviction may have taken
                # it between the rename and now (seen with three processes evicting).
                theirs = cache.pin_database(folder)
                if theirs is None:
                    continue  # evicted as soon as it appeared: build again
                return theirs, False, None
            pin.path = folder
            kept, handed = None, kept
            return pin, True, handed
        finally:
            if kept is not None:
                kept.discard()
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp)


def plan_twin_scan(
    cache: FileCache,
    objects: ObjectStore,
    chain: PartitionChain,
    manifest: StoreManifest,
    lower: bytes,
    upper: bytes | None,
    reverse: bool,
    footers: dict[str, Any] | None = None,
) -> Any:
    """A ``TwinScan`` of ``chain``'s columnar twins (every file has one) for
    ``[lower, upper)``: read in place on a local root, else from the cache (fetched if
    missing, pinned until the scan is gone). No database is opened or built. None when
    the twins were written for another layout than ``manifest``'s."""
    from ..columnar.scan import TwinScan  # pyarrow: imported once twins are read
    from ..columnar.twins import layout_of

    before = cache.stats.copy()
    paths, names, pins = pin_twins(cache, objects, chain)
    try:
        scan = TwinScan(
            paths,
            lower,
            upper,
            reverse=reverse,
            names=names,
            layout=layout_of(manifest),
            manifest=manifest,
            footers=footers,
            # On a local root the root's own files, opened refusing a link; pinned cache
            # copies are opened as they are.
            opener=None if pins else _opener_by_key(objects, paths, chain),
        )
    except BaseException:
        for pin in pins:
            pin.release()
        raise
    if scan.stale:
        for pin in pins:
            pin.release()
        return None
    for pin in pins:  # released when the scan is gone (its rows read, or dropped)
        weakref.finalize(scan, pin.release)
    if pins:  # an object root: the trace says what was fetched, as a database's open does
        twins = counted(len(pins), "columnar twin")
        scan.fetched = f"{cache.stats.since(before).line()}; {twins} read, no database"
    return scan


def _opener_by_key(objects: ObjectStore, paths: list[str], chain: PartitionChain) -> Any:
    """Opens each of ``paths`` (``chain``'s twins on a local root) through the root,
    by its key, so no link is followed whatever is on the path by then."""
    keys = dict(zip(paths, (f.twin_name for f in chain.files), strict=True))
    return lambda local: objects.open_local_file(keys[local])


def pin_twins(
    cache: FileCache, objects: ObjectStore, chain: PartitionChain
) -> tuple[list[str], list[str], list[PinnedFile]]:
    """``chain``'s twins (every file has one) as local paths, oldest first: the root's
    own files on a local root, else the cache's copies (fetched if missing) and their
    pins, which the caller releases; and each twin's place on the root."""
    keys = [f.twin_name for f in chain.files]
    local = [objects.local_file(k) for k in keys if k is not None]
    pins: list[PinnedFile] = []
    if len(local) == len(keys) and all(p is not None for p in local):
        paths = [os.fspath(p) for p in local if p is not None]
    else:
        try:
            for k in keys:
                assert k is not None
                pins.append(cache.pin(objects, k))
        except BaseException:
            for pin in pins:
                pin.release()
            raise
        paths = [os.fspath(p.path) for p in pins]
    names = [place_on_root(objects, k) for k in keys if k is not None]
    return paths, names, pins
