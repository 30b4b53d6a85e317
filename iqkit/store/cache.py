"""The local cache of a root's immutable files, shared by readers and writers.

Why: object storage is slow and billed per request, and the immutable format names every
file uniquely, so a file fetched once is good forever. Each file lands once in
``IQKIT_CACHE`` (default ``$XDG_CACHE_HOME/iqkit``, else ``~/.cache/iqkit``), under
``objects/<hash of the root URL>/<key>``; versions that share files share them here.
Beside them, ``dbs/`` holds the RocksDB databases readers build from those files
(store/chain/read.py), one folder per partition chain.

- **Bounded.** ``IQKIT_CACHE_SIZE`` (or ``limit=``; ``10GiB`` by default) caps the bytes of
  cached files *and* databases together; past it the least recently used entries go
  first, an entry being one cached file or one whole database folder. Recency is the
  file's or the database folder's mtime, touched on every hit or open, so every process
  sees the same order. Counting the cache walks all of it, so it is not done after every
  fetch and database build (with one database per partition, a fan-out over 1,000
  partitions spent most of its time counting): each process keeps a running count (its
  last count plus what it added since) and counts again, evicting, when that passes the
  limit or is older than ``RECOUNT_SECONDS`` (so what other processes added is seen).
  The cache is over the limit by what is pinned, and for at most that long by what
  other processes added.
- **Bytes are counted once per inode.** A database's SSTs are hard links of the cached
  files (same inode, no copy), so the cache counts each ``(st_dev, st_ino)`` once
  whatever its number of names in ``objects/`` and ``dbs/`` (``st_nlink`` > 1), and a
  removal frees an inode's bytes only when it took the inode's last name in the cache
  (a name elsewhere, ``st_nlink`` above the names found, is outside what the cache
  manages: the bytes count as freed when the cache lets go of them).
  Eviction therefore skips, for now, a file whose bytes a database still holds (removing
  it would free nothing) and comes back to it once that database is gone. Builds in
  progress (``.building-*``) are not counted; their files are mostly links anyway.
- **Pins.** A reader pins the files and the database it uses: a shared ``flock`` on the
  file, or on the database's folder, released by the kernel if the process dies;
  eviction takes an exclusive ``flock`` without waiting and skips what it cannot get, so
  nothing a live reader pinned is ever removed, in this process or another. A database
  is evicted by renaming its folder away (``.evicting-*``) while holding the exclusive
  lock, then deleting it; a later open simply builds it again.
- **Safe with several processes.** Files arrive by download to a temporary name and a
  rename, databases by a build in a temporary folder and a rename; a pin checks, once
  locked, that the name still holds what it opened (an eviction may have won the race),
  else fetches (or builds) again.
- **Private.** The folder is this user's alone (``_private_folder``: 0700, nothing above
  it writable by others unless sticky; a shared 1777 folder gives a per-uid subfolder),
  and an entry another user owns is never used (renamed away, made again): a database's
  path follows from the public record, so a writable cache could be handed forged ones.
  With no usable folder (read-only, a file in the way, no home folder) the process
  reads through a private temporary cache, removed at exit, and ``note`` says why.
- **Counted.** ``stats`` says what was fetched (files, bytes, seconds), what came from
  the cache, and what eviction removed (files, databases, bytes freed), for traces.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import functools
import hashlib
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import IqkitError, StoreCorruptedError, StoreIOError
from .integrity import checksum_fd
from .names import (
    CACHE_DBS_DIR,
    CACHE_EVICTING_PREFIX,
    ROCKSDB_CURRENT_FILE,
)
from .objects import TMP_PREFIX, ObjectStore, check_key

__all__ = [
    "DEFAULT_LIMIT",
    "CacheStats",
    "FileCache",
    "PinnedFile",
    "default_cache_dir",
    "counted",
    "is_disk_full",
    "parse_size",
    "reader_cache",
]

ENV_DIR = "IQKIT_CACHE"
ENV_LIMIT = "IQKIT_CACHE_SIZE"
DEFAULT_LIMIT = 10 * 2**30
#: A temporary download older than this was left by a process that died; eviction
#: removes it.
STALE_TMP_SECONDS = 3600.0
#: A process's running count of the cache is trusted for this long (module docstring).
RECOUNT_SECONDS = 5.0


@dataclass
class _RunningCount:
    """This process's count of one cache folder: bytes as last counted plus what the
    process added since (``None``: not counted yet), and when (``time.monotonic``)."""

    total: int | None = None
    counted_at: float = 0.0


#: The running count of each cache folder, shared by every ``FileCache`` of it in this
#: process: each engine has one, and a count per instance made every ``iqkit.open``
#: walk the whole cache at its first build (the checkpoint matrix spent 40% counting).
_RUNNING: dict[Path, _RunningCount] = {}
_RUNNING_LOCK = threading.RLock()  # re-entrant: `_running_count`'s first look-up takes it

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}  # fmt: skip


def parse_size(text: str | int, *, what: str = ENV_LIMIT) -> int:
    """Bytes in ``text`` (``10GiB``, ``512MB``, ``1000``); else one-line ``ValueError``."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"{what} must be >= 0 bytes, got {text}")
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"{what} must be a size such as 10GiB, 500MB or 1000000, got {text!r}")
    return int(float(match.group(1)) * _UNITS[unit])


def default_cache_dir() -> Path:
    """The cache folder the environment names, absolute: ``IQKIT_CACHE`` (a relative one
    is taken from the working folder now, once), else ``$XDG_CACHE_HOME/iqkit`` (when
    absolute), else ``~/.cache/iqkit``. Never a folder relative to the working folder by
    accident: ``StoreIOError`` when there is no home folder to put it in (``HOME`` unset
    and no passwd entry, where ``~`` would stay a literal ``~``) or the home folder does
    not exist."""
    configured = os.environ.get(ENV_DIR)
    if configured:
        expanded = os.path.expanduser(configured)
        if expanded.startswith("~"):
            raise StoreIOError(f"{ENV_DIR} {configured!r}: {_no_home()}")
        return Path(os.path.abspath(expanded))
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # a relative one is to be ignored (the XDG rule)
        return Path(xdg) / "iqkit"
    home = os.path.expanduser("~")
    if not os.path.isabs(home):
        raise StoreIOError(_no_home())
    if not os.path.isdir(home):
        raise StoreIOError(f"the home folder {home!r} does not exist")
    return Path(home) / ".cache" / "iqkit"


def _no_home() -> str:
    return f"no home folder (HOME is unset and uid {os.geteuid()} has no passwd entry)"


class _Unusable(Exception):
    """Why a cache folder cannot be this user's private cache (one line)."""


def _private_folder(configured: Path) -> Path:
    """``configured`` made this user's private cache: created (0700) when missing and
    used when this user owns it and no other user may write to it; else (a shared
    cache, e.g. a 1777 folder) its subfolder named by the uid, created 0700, which must
    be this user's. Every folder above must be this user's or root's, and writable by
    others only when sticky (no other user can then rename our folder away and put
    another in its place). Raises ``_Unusable`` naming what is wrong."""
    uid = os.geteuid()
    try:
        configured.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(configured)
    except FileExistsError:  # what mkdir says of a file in the way
        raise _Unusable(f"{configured} is not a folder") from None
    except OSError as exc:
        raise _Unusable(f"{configured} cannot be made a folder ({_reason(exc)})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise _Unusable(f"{configured} is not a folder")
    folder = configured
    if st.st_uid != uid or st.st_mode & 0o022:
        folder = configured / str(uid)  # a shared folder: this user's own subfolder
        try:
            with contextlib.suppress(FileExistsError):
                folder.mkdir(mode=0o700)
            st = os.lstat(folder)
        except OSError as exc:
            raise _Unusable(f"{folder} cannot be made a folder ({_reason(exc)})") from None
        if not stat.S_ISDIR(st.st_mode):
            raise _Unusable(f"{folder} is not a folder")
        if st.st_uid != uid:
            raise _Unusable(f"{folder} belongs to uid {st.st_uid}, not this user")
        if st.st_mode & 0o077:
            with contextlib.suppress(OSError):
                os.chmod(folder, 0o700)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise _Unusable(f"{folder} is not writable")
    _check_above(folder, uid)
    return folder


def _check_above(folder: Path, uid: int) -> None:
    """The folders above ``folder`` (``_private_folder``'s rule for them)."""
    real = Path(os.path.realpath(folder))
    for above in real.parents:
        try:
            st = os.stat(above)
        except OSError as exc:
            raise _Unusable(f"{above} cannot be checked ({_reason(exc)})") from None
        if st.st_uid not in (0, uid):
            raise _Unusable(f"{above} (above {folder}) belongs to uid {st.st_uid}")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise _Unusable(f"{above} (above {folder}) is writable by other users")


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


#: (pid, folder) of this process's private temporary cache, once one was needed.
_temporary: tuple[int, Path] | None = None


def _temporary_folder() -> Path:
    """This process's private temporary cache (``tempfile.mkdtemp``: 0700, this user's),
    made on first need (again after a fork) and removed at exit."""
    global _temporary
    if _temporary is not None and _temporary[0] == os.getpid() and _temporary[1].is_dir():
        return _temporary[1]
    folder = Path(tempfile.mkdtemp(prefix="iqkit-cache-"))
    _temporary = (os.getpid(), folder)
    atexit.register(_remove_temporary, os.getpid(), folder)
    return folder


def _remove_temporary(pid: int, folder: Path) -> None:
    if os.getpid() == pid:  # not in a forked child that inherited the handler
        shutil.rmtree(folder, ignore_errors=True)


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the user's quota) is full: an ``OSError`` with
    that errno, or RocksDB's error text (rocksdict gives no errno)."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    text = str(exc)
    return isinstance(exc, IqkitError) and (
        "No space left on device" in text or "Disk quota exceeded" in text
    )


def reader_cache() -> FileCache:
    """The cache a reader uses (``IQKIT_CACHE``), its size limit checked now: a malformed
    ``IQKIT_CACHE_SIZE`` is one ``ValueError`` when a reader starts, not a failure of
    every partition (writers build ``FileCache()`` directly: it reads the limit only if
    they read through the cache)."""
    cache = FileCache()
    cache.limit  # noqa: B018 (parsed now, for the one line above)
    return cache


@dataclass
class CacheStats:
    """What a cache did: fetched files (count, bytes, seconds), hits, and evictions
    (cached files and whole databases removed, and the bytes that freed on disk)."""

    files_fetched: int = 0
    bytes_fetched: int = 0
    fetch_seconds: float = 0.0
    hits: int = 0
    hit_bytes: int = 0
    files_evicted: int = 0
    databases_evicted: int = 0
    bytes_evicted: int = 0
    #: Cached files and databases found but not this user's: never used, made again.
    distrusted: int = 0

    def since(self, before: CacheStats) -> CacheStats:
        """The counts added after ``before`` (a copy taken earlier): one query's share."""
        return CacheStats(
            *(getattr(self, f) - getattr(before, f) for f in self.__dataclass_fields__)
        )

    def copy(self) -> CacheStats:
        return CacheStats(**{f: getattr(self, f) for f in self.__dataclass_fields__})

    def line(self) -> str:
        """One trace line, e.g. ``cache: fetched 3 files (1.2 MB) in 0.412 s; 5 from cache``
        (``...; evicted 2 files, 1 databases (8.1 MB freed)`` when eviction removed any)."""
        text = (
            f"cache: fetched {counted(self.files_fetched, 'file')} ({_mb(self.bytes_fetched)}) "
            f"in {self.fetch_seconds:.3f} s; {self.hits} from cache ({_mb(self.hit_bytes)})"
        )
        evicted = self.evicted_line()
        if evicted:
            text += f"; {evicted}"
        if self.distrusted:
            text += f"; {self.distrust_line()}"
        return text

    def evicted_line(self) -> str | None:
        """``evicted ...`` when eviction removed anything, else ``None``."""
        if not (self.files_evicted or self.databases_evicted):
            return None
        return (
            f"evicted {counted(self.files_evicted, 'file')}, "
            f"{counted(self.databases_evicted, 'database')} ({_mb(self.bytes_evicted)} freed)"
        )

    def distrust_line(self) -> str:
        return (
            f"{counted(self.distrusted, 'cache entry', 'cache entries')} not owned by this "
            "user ignored and made again"
        )


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 file``, ``3 files``: a count in a trace line."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@dataclass
class PinnedFile:
    """A cached file (or database folder) a reader uses: it stays on disk until
    ``release()`` (or the end of the ``with`` block, or the process)."""

    path: Path
    size: int
    _fd: int | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> PinnedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


#: A file's identity: the same bytes under every hard link.
_Inode = tuple[int, int]


@dataclass
class _Entry:
    """One thing eviction may remove: a cached file, or a database folder."""

    mtime: float
    path: Path
    inodes: list[_Inode]
    database: bool


@dataclass
class _Census:
    """The cache now: its entries, each inode's size, and its names in the cache."""

    entries: list[_Entry] = field(default_factory=list)
    sizes: dict[_Inode, int] = field(default_factory=dict)
    names: dict[_Inode, int] = field(default_factory=dict)

    def add(self, st: os.stat_result) -> _Inode:
        inode = (st.st_dev, st.st_ino)
        self.sizes[inode] = st.st_size
        self.names[inode] = self.names.get(inode, 0) + 1
        return inode

    def total(self) -> int:
        return sum(self.sizes.values())

    def would_free(self, entry: _Entry) -> int:
        """Bytes removing ``entry`` frees: its inodes with no other name in the cache."""
        own: dict[_Inode, int] = {}
        for inode in entry.inodes:
            own[inode] = own.get(inode, 0) + 1
        return sum(self.sizes[i] for i, n in own.items() if self.names[i] == n)

    def remove(self, entry: _Entry) -> int:
        """Forget ``entry``'s names; the bytes that freed."""
        freed = 0
        for inode in entry.inodes:
            self.names[inode] -= 1
            if self.names[inode] == 0:
                freed += self.sizes.pop(inode)
        return freed


class FileCache:
    """Immutable files of store roots, fetched once into a local folder, and the
    databases built from them (module doc)."""

    def __init__(
        self, folder: str | os.PathLike[str] | None = None, *, limit: int | str | None = None
    ):
        #: The folder asked for (absolute; ``None``: none could be named, ``_unnamed``
        #: says why). Nothing is made or read until the cache is first used, so a writer
        #: that never reads through it needs neither a usable folder nor a valid limit.
        self._configured: Path | None = None
        self._unnamed = ""
        if folder is not None:
            self._configured = Path(os.path.abspath(os.fspath(folder)))
        else:
            try:
                self._configured = default_cache_dir()
            except StoreIOError as exc:
                self._unnamed = str(exc)
        self._limit = limit
        #: Why this cache is not the folder configured (one trace line), else ``None``.
        self.note: str | None = None
        self.stats = CacheStats()

    @functools.cached_property
    def limit(self) -> int:
        """The size limit in bytes (``limit=``, else ``IQKIT_CACHE_SIZE``, else 10GiB);
        a malformed one is a one-line ``ValueError`` on first use."""
        if self._limit is not None:
            return parse_size(self._limit, what="the cache limit")
        return parse_size(os.environ.get(ENV_LIMIT) or DEFAULT_LIMIT)

    @functools.cached_property
    def folder(self) -> Path:
        """The folder this cache uses, chosen on first use: the configured one made
        private (``_private_folder``), else this process's private temporary cache, and
        ``note`` says why. Never a folder another user can write to."""
        try:
            if self._configured is None:
                raise _Unusable(self._unnamed)
            return _private_folder(self._configured)
        except _Unusable as exc:
            why = str(exc)
        try:
            folder = _temporary_folder()
        except OSError as exc:
            raise StoreIOError(
                f"no usable cache: {why}; no temporary folder either ({_reason(exc)})"
            ) from None
        self.note = f"cache: {why}; a private temporary cache is used (removed at exit)"
        return folder

    @property
    def objects_dir(self) -> Path:
        return self.folder / "objects"

    @property
    def dbs_dir(self) -> Path:
        return self.folder / CACHE_DBS_DIR

    def make_folder(self, path: Path) -> None:
        """Make the folder ``path`` inside this cache and the ones between (0700). One
        that is not this user's folder (only root could have put it in a private cache)
        is renamed away and made again (``stats.distrusted``); ``StoreIOError`` if that
        fails."""
        uid = os.geteuid()
        top = self.folder
        for part in [*reversed(path.relative_to(top).parents), path.relative_to(top)]:
            here = top / part
            for attempt in (1, 2):
                with contextlib.suppress(FileExistsError):
                    here.mkdir(mode=0o700)
                st = os.lstat(here)
                if stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
                    break
                if attempt == 2:
                    raise StoreIOError(f"cache folder {here} is not this user's and stays")
                self.stats.distrusted += 1
                _remove_folder(here)

    def path_of(self, objects: ObjectStore, key: str) -> Path:
        """Where ``key`` of ``objects``' root lives in this cache."""
        root_id = hashlib.sha256(objects.root.url.encode()).hexdigest()[:20]
        return self.objects_dir / root_id / check_key(key)

    def pin(self, objects: ObjectStore, key: str, *, checksum: str | None = None) -> PinnedFile:
        """``key`` as a local file, fetched if missing, pinned until released;
        ``checksum``: what its record says its bytes hash to (integrity.py), checked on a
        copy fetched now before it is used (a copy that does not match is removed and
        ``StoreCorruptedError`` names the root's file)."""
        path = self.path_of(objects, key)
        fetched = False
        while True:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                self.make_folder(path.parent)
                started = time.perf_counter()
                size = objects.download(key, path)
                self.stats.fetch_seconds += time.perf_counter() - started
                self.stats.files_fetched += 1
                self.stats.bytes_fetched += size
                fetched = True
                continue
            fcntl.flock(fd, fcntl.LOCK_SH)
            if _same_file(fd, path):
                if os.fstat(fd).st_uid == os.geteuid():
                    break
                # Another user's file: never trusted, fetched again (ours then).
                os.close(fd)
                self.stats.distrusted += 1
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                continue
            os.close(fd)  # evicted between open and lock: fetch it again
        size = os.fstat(fd).st_size
        if fetched and checksum is not None and checksum_fd(fd) != checksum:
            # Checked once pinned (an eviction cannot remove it under the check), before
            # anything reads it: a bad copy is removed, so the next read fetches again.
            with contextlib.suppress(OSError):
                os.unlink(path)
            os.close(fd)
            raise StoreCorruptedError(
                f"{objects.where(key)} is damaged: the bytes fetched do not match the "
                f"checksum its version record gives"
            )
        if fetched:
            self.added(size)  # after pinning, so the file just fetched cannot be the victim
        else:
            self.stats.hits += 1
            self.stats.hit_bytes += size
            with contextlib.suppress(OSError):
                os.utime(path)  # most recently used
        return PinnedFile(path, size, fd)

    @contextlib.contextmanager
    def pinned(self, objects: ObjectStore, keys: list[str]) -> Iterator[list[Path]]:
        """Pin every key for the block; the local paths, in order."""
        pins: list[PinnedFile] = []
        try:
            for key in keys:
                pins.append(self.pin(objects, key))
            yield [p.path for p in pins]
        finally:
            for p in pins:
                p.release()

    @contextlib.contextmanager
    def sources(self, objects: ObjectStore, keys: list[str]) -> Iterator[list[Path]]:
        """Local paths of ``keys`` to read for the block, in order: the root's own files
        on a local root (read in place, never copied: nothing here is pinned or cached),
        else the cached copies, pinned (``pinned``). When the block fails with
        ``StoreCorruptedError`` the cached copies are discarded once released, so a
        retry fetches them again instead of failing on a bad copy for good."""
        local = [objects.local_file(k) for k in keys]
        if all(p is not None for p in local):
            yield [p for p in local if p is not None]
            return
        try:
            with self.pinned(objects, keys) as paths:
                yield paths
        except StoreCorruptedError:
            self.discard(objects, keys)
            raise

    def discard(self, objects: ObjectStore, keys: list[str]) -> None:
        """Remove the cached copies of ``keys`` that no process pins (a copy that turned
        out corrupt: the next pin fetches the root's file again)."""
        for key in keys:
            with contextlib.suppress(OSError):
                _remove_unpinned(self.path_of(objects, key))

    # -- databases (built by store/chain/read.py under dbs/) ------------------------------------
    def discard_database(self, folder: Path) -> None:
        """Remove the database ``folder`` unless a process pins it (one that turned out
        corrupt: the next open builds it again)."""
        with contextlib.suppress(OSError):
            _remove_unpinned_folder(folder)

    def pin_database(self, folder: Path) -> PinnedFile | None:
        """The database ``folder`` (under ``dbs_dir``) pinned until released and marked
        most recently used; ``None`` when there is none (never built, or evicted)."""
        while True:
            try:
                fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except (FileNotFoundError, NotADirectoryError):
                return None
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while an eviction renames it away
            if _same_file(fd, folder) and (folder / ROCKSDB_CURRENT_FILE).is_file():
                break
            os.close(fd)  # evicted (and perhaps rebuilt) between open and lock: look again
        try:
            files = _file_stats(folder)
        except OSError:
            files = []
        uid = os.geteuid()
        if os.fstat(fd).st_uid != uid or any(st.st_uid != uid for st in files):
            # Another user's database (or files in it): never read, built again.
            os.close(fd)
            self.stats.distrusted += 1
            _remove_folder(folder)
            return None
        with contextlib.suppress(OSError):
            os.utime(folder)  # most recently used
        return PinnedFile(folder, sum(st.st_size for st in files), fd)

    def hold_new_database(self, building: Path) -> PinnedFile:
        """Pin the database being built in ``building`` before it is renamed into place:
        the lock is on the folder itself, so the rename carries it, and no eviction can
        take the database between its rename and its first use."""
        fd = os.open(building, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return PinnedFile(building, _folder_bytes(building), fd)

    # -- size and eviction -------------------------------------------------------------
    def usage(self) -> int:
        """Bytes of cached files and databases now, each inode counted once."""
        return self._census().total()

    def _census(self) -> _Census:
        census = _Census()
        self._scan_objects(census)
        self._scan_databases(census)
        return census

    def _scan_objects(self, census: _Census) -> None:
        for dirpath, _, files in os.walk(self.objects_dir):
            for name in files:
                path = Path(dirpath) / name
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                if name.startswith(TMP_PREFIX):
                    if time.time() - st.st_mtime > STALE_TMP_SECONDS:
                        with contextlib.suppress(FileNotFoundError):
                            path.unlink()
                    continue
                census.entries.append(_Entry(st.st_mtime, path, [census.add(st)], False))

    def _scan_databases(self, census: _Census) -> None:
        """Every database folder (one holding RocksDB's ``CURRENT``) under ``dbs/``;
        folders an eviction left half-deleted are deleted, builds are left alone."""
        for dirpath, dirs, files in os.walk(self.dbs_dir):
            here = Path(dirpath)
            if ROCKSDB_CURRENT_FILE in files:
                dirs[:] = []
                try:
                    mtime = here.stat().st_mtime
                    inodes = [census.add(st) for st in _file_stats(here)]
                except FileNotFoundError:
                    continue  # evicted by another process meanwhile
                census.entries.append(_Entry(mtime, here, inodes, True))
                continue
            for name in [d for d in dirs if d.startswith(".")]:
                dirs.remove(name)  # builds in progress and evictions: never databases
                if name.startswith(CACHE_EVICTING_PREFIX):
                    shutil.rmtree(here / name, ignore_errors=True)

    def added(self, size: int) -> int:
        """``size`` new bytes are in the cache (a fetch or a database build, pinned):
        ``evict`` when the running count says the cache may be over its limit, or is
        too old to trust (module docstring); returns the bytes that freed."""
        count = self._running_count
        with _RUNNING_LOCK:
            if count.total is not None:
                count.total += size
                fresh = time.monotonic() - count.counted_at < RECOUNT_SECONDS
                if fresh and count.total <= self.limit:
                    return 0
        return self.evict()

    @functools.cached_property
    def _running_count(self) -> _RunningCount:
        with _RUNNING_LOCK:
            return _RUNNING.setdefault(self.folder, _RunningCount())

    def evict(self, *, down_to: int | None = None) -> int:
        """Remove least recently used, unpinned files and databases until the cache
        fits its limit (or ``down_to`` bytes: ``0`` when the disk is full); returns the
        bytes that freed. Pinned ones stay even if the cache is then over. A removal
        that would free nothing now (a file whose bytes a database holds) waits until
        the entries holding the same bytes are gone."""
        limit = self.limit if down_to is None else down_to
        census = self._census()
        counted_at = time.monotonic()
        total = census.total()
        freed = 0
        waiting: list[_Entry] = []  # in recency order, like the entries

        def take(entry: _Entry) -> bool:
            nonlocal total, freed
            removed = (_remove_unpinned_folder if entry.database else _remove_unpinned)(entry.path)
            if not removed:
                return False
            gone = census.remove(entry)
            total -= gone
            freed += gone
            self.stats.bytes_evicted += gone
            if entry.database:
                self.stats.databases_evicted += 1
            else:
                self.stats.files_evicted += 1
            return True

        for entry in sorted(census.entries, key=lambda e: e.mtime):
            if total <= limit:
                break
            if census.would_free(entry) == 0 and not entry.database:
                waiting.append(entry)
                continue
            if take(entry) and entry.database:
                # Files whose bytes only this database shared may free them now.
                for older in [w for w in waiting if census.would_free(w) > 0]:
                    if total <= limit:
                        break
                    waiting.remove(older)
                    take(older)
        count = self._running_count
        with _RUNNING_LOCK:
            count.total, count.counted_at = total, counted_at
        return freed


def _file_stats(folder: Path) -> list[os.stat_result]:
    with os.scandir(folder) as entries:
        return [e.stat(follow_symlinks=False) for e in entries if e.is_file(follow_symlinks=False)]


def _folder_bytes(folder: Path) -> int:
    with contextlib.suppress(OSError):
        return sum(st.st_size for st in _file_stats(folder))
    return 0


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


@contextlib.contextmanager
def _unpinned(path: Path, flags: int) -> Iterator[bool]:
    """Whether ``path`` is free to remove: an exclusive ``flock`` taken without waiting
    (no process pins it), and the name still holds what was opened (another evictor may
    have removed it and a fetch or build put a new one there). Held for the block."""
    try:
        fd = os.open(path, flags | os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield _same_file(fd, path)
    finally:
        os.close(fd)


def _remove_unpinned(path: Path) -> bool:
    """Unlink ``path`` unless some process holds a pin on it (a shared flock)."""
    with _unpinned(path, 0) as free:
        if free:
            os.unlink(path)
        return free


def _remove_folder(path: Path) -> None:
    """Rename ``path`` (a folder, or anything in its place) away, atomic: the next open
    builds anew; then delete what this user may (another user's files may stay under
    the ``.evicting-`` name)."""
    doomed = path.with_name(f"{CACHE_EVICTING_PREFIX}{uuid.uuid4().hex}-{path.name}")
    with contextlib.suppress(OSError):
        os.rename(path, doomed)
        if os.path.isdir(doomed) and not os.path.islink(doomed):
            shutil.rmtree(doomed, ignore_errors=True)
        else:
            os.unlink(doomed)


def _remove_unpinned_folder(path: Path) -> bool:
    """Delete the database folder ``path`` unless some process holds a pin on it.

    Under the exclusive lock the folder is renamed away (atomic: a reader opening it
    after this finds nothing and builds again; one that opened it just before waits for
    the lock, then sees the name no longer holds its folder), and deleted after."""
    doomed = path.with_name(f"{CACHE_EVICTING_PREFIX}{uuid.uuid4().hex}-{path.name}")
    with _unpinned(path, os.O_DIRECTORY) as free:
        if not free:
            return False
        try:
            os.rename(path, doomed)
        except FileNotFoundError:
            return False
    shutil.rmtree(doomed, ignore_errors=True)
    return True
