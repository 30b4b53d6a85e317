"""A partition's RocksDB built from immutable SST files into the file cache: how every
format's reader makes a database to serve key lookups from (the chain format from its
chain's files, the checkpoint format from the SST of a replayed state version).

``build_in_cache`` builds through a temporary folder beside the target and publishes it
with one rename, so a build cut short is never served and two processes building the
same database at once both end up reading one of them. ``build_database`` does the build
itself: RocksDB ingests the files oldest first (later values and tombstones win), in a
private scratch folder on a memory file system when there is one (no syncs: the database
is only a cache, rebuilt when lost), and the files end up hard-linked, not copied.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import IqkitError, StoreIOError, StoreNotFoundError
from ..cache import STALE_TMP_SECONDS, FileCache, PinnedFile, is_disk_full
from ..names import CACHE_BUILDING_PREFIX, ROCKSDB_SIDE_FILES
from ..objects import NotPlainFileError, link_plain_file, refused
from . import rocks
from .partition import RocksDBPartition

__all__ = [
    "MEMORY_FOLDER",
    "CachedDatabasePartition",
    "KeptOpen",
    "LayeredDatabase",
    "build_database",
    "build_in_cache",
    "remove_stale_builds",
]


class CachedDatabasePartition(RocksDBPartition):
    """A partition read from its database in the file cache: the database (and whatever
    else it reads there) stays pinned while the partition is open, so eviction skips it
    and the cache's size accounting sees what is in use."""

    def __init__(
        self,
        path: Path,
        written_by_version: int,
        pins: list[PinnedFile],
        *,
        db: rocks.Rdict | None = None,
    ) -> None:
        self._pins = pins
        try:
            super().__init__(path, written_by_version, db=db)
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        pins, self._pins = self._pins, []
        for pin in pins:
            pin.release()

    def close(self) -> None:
        super().close()
        self._release()


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
class KeptOpen:
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
) -> KeptOpen | None:
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
    return None if db is True else KeptOpen(db, path, lock)


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


class LayeredDatabase:
    """Several versions of one partition in one private RocksDB, each readable as it was:
    ``layers`` are SST files per version, oldest first (the first layer a whole chain,
    each later one the files its version added), and a RocksDB snapshot taken after each
    layer's ingestion reads the partition as of that layer (``get``). What the version
    queries read a run of versions through (store/versions.py): one database for a run
    of versions instead of one per version.

    Ingesting with snapshots alive gives each file a sequence number above them (the
    ingestion options allow global sequence numbers), so an older snapshot never sees a
    later layer. The database lives in a private scratch folder (in memory where there
    is one) and is removed on ``close``; the files are ingested through links to open
    descriptors as ``build_database`` does (no copy), refused if not plain files."""

    def __init__(self, layers: Sequence[Sequence[tuple[str | os.PathLike[str], str]]]) -> None:
        self._fds: list[int] = []
        self._snapshots: list[object] = []
        self._db: rocks.Rdict | None = None
        self._staged = 0
        scratch = _memory_scratch()
        if scratch is None:
            self._scratch, self._lock = Path(tempfile.mkdtemp(prefix=_SCRATCH_PREFIX)), None
        else:
            self._scratch, self._lock = scratch[0], scratch[1]
        try:
            self._db = rocks.open_for_build(self._scratch / "db")
            for files in layers:
                self.add_layer(files)
        except BaseException:
            self.close()
            raise

    @property
    def layers(self) -> int:
        return len(self._snapshots)

    def add_layer(self, files: Sequence[tuple[str | os.PathLike[str], str]]) -> None:
        """Ingest ``files`` (path, name) as the next layer, newer than every one before."""
        assert self._db is not None
        for file, name in files:
            stage = self._scratch / f".ingest-{self._staged}.sst"
            self._staged += 1
            if self._lock is not None:  # a link to the open file, as _build_in_memory
                fd = _open_plain(file, name)
                self._fds.append(fd)
                os.symlink(f"{_FD_LINKS}/{fd}", stage)
            else:
                try:
                    link_plain_file(file, stage, name)
                except NotPlainFileError as exc:
                    raise StoreIOError(exc.strerror) from None
            rocks.ingest(self._db, [stage], where=name)
        self._snapshots.append(self._db.snapshot())

    def get(self, layer: int, key: bytes) -> bytes | None:
        """``key``'s value as of layer ``layer`` (``None``: absent or deleted)."""
        snapshot = self._snapshots[layer]
        try:
            return snapshot[key]  # type: ignore[index,no-any-return]
        except Exception as exc:
            # Quirk: a snapshot has no ``get``; its ``[]`` raises a plain Exception
            # whose text is "key not found" for a missing key. (Its iterators also
            # ignore the snapshot and read the newest data: only point reads here.)
            if str(exc) == "key not found":
                return None
            raise rocks.classify(exc, self._scratch) from exc

    def get_many(self, layer: int, keys: list[bytes]) -> list[bytes | None]:
        """``get`` of each of ``keys``: the newest layer's in one batched read (the
        database itself is as of its newest layer; snapshots have no batched read)."""
        if layer == len(self._snapshots) - 1 and self._db is not None:
            try:
                return self._db.get(keys)  # type: ignore[no-any-return]
            except Exception as exc:
                raise rocks.classify(exc, self._scratch) from exc
        return [self.get(layer, key) for key in keys]

    def close(self) -> None:
        """Drop the snapshots, close and remove the database, close the descriptors."""
        self._snapshots.clear()
        db, self._db = self._db, None
        rocks.close_quietly(db)
        shutil.rmtree(self._scratch, ignore_errors=True)
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def remove_stale_builds(parent: Path) -> None:
    """Remove builds a killed process left (older than the cache's stale-download age;
    a younger one may be another process's build in progress)."""
    cutoff = time.time() - STALE_TMP_SECONDS
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for entry in entries:
            if entry.name.startswith(CACHE_BUILDING_PREFIX):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        shutil.rmtree(entry.path)


def build_in_cache(
    cache: FileCache, folder: Path, files: list[Path], names: list[str]
) -> tuple[PinnedFile, bool, KeptOpen | None]:
    """Build ``folder`` through a temporary folder and a rename; the database pinned,
    and False when another process's build got there first (its folder, the same chain,
    is used); and the database still open when this build kept it (``_build``), for the
    caller to own. ``files`` must be pinned by the caller."""
    while True:
        cache.make_folder(folder.parent)
        remove_stale_builds(folder.parent)
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
