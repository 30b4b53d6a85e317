"""The local cache of a root's immutable files, shared by readers and writers.

Why: object storage is slow and billed per request, and the immutable format names every
file uniquely, so a file fetched once is good forever. Each file lands once in
``IQKIT_CACHE`` (default ``$XDG_CACHE_HOME/iqkit``, else ``~/.cache/iqkit``), under
``objects/<hash of the root URL>/<key>``; versions that share files share them here.

- **Bounded.** ``IQKIT_CACHE_SIZE`` (or ``limit=``; ``10GiB`` by default) caps the bytes of
  cached files; past it the least recently used files go first (recency is the file's
  mtime, touched on every hit, so every process sees the same order).
- **Pins.** A reader pins the files it uses (a shared ``flock`` on the file, released by
  the kernel if the process dies); eviction takes an exclusive ``flock`` without waiting
  and skips a file it cannot get, so a file a live reader pinned is never removed, in
  this process or another.
- **Safe with several processes.** Files arrive by download to a temporary name and a
  rename; a pin checks, once locked, that the name still holds the file it opened (an
  eviction may have won the race), else fetches again.
- **Counted.** ``stats`` says what was fetched (files, bytes, seconds) and what came from
  the cache, for execution traces.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .objects import TMP_PREFIX, ObjectStore, check_key

__all__ = [
    "DEFAULT_LIMIT",
    "CacheStats",
    "FileCache",
    "PinnedFile",
    "default_cache_dir",
    "parse_size",
]

ENV_DIR = "IQKIT_CACHE"
ENV_LIMIT = "IQKIT_CACHE_SIZE"
DEFAULT_LIMIT = 10 * 2**30
#: A temporary download older than this was left by a process that died; eviction
#: removes it.
STALE_TMP_SECONDS = 3600.0

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
    """``IQKIT_CACHE``, else the user's cache folder (XDG) + ``iqkit``."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "iqkit"


@dataclass
class CacheStats:
    """What a cache did: fetched files (count, bytes, seconds) and hits."""

    files_fetched: int = 0
    bytes_fetched: int = 0
    fetch_seconds: float = 0.0
    hits: int = 0
    hit_bytes: int = 0
    files_evicted: int = 0

    def since(self, before: CacheStats) -> CacheStats:
        """The counts added after ``before`` (a copy taken earlier): one query's share."""
        return CacheStats(
            *(getattr(self, f) - getattr(before, f) for f in self.__dataclass_fields__)
        )

    def copy(self) -> CacheStats:
        return CacheStats(**{f: getattr(self, f) for f in self.__dataclass_fields__})

    def line(self) -> str:
        """One trace line, e.g. ``cache: fetched 3 files (1.2 MB) in 0.412 s; 5 from cache``."""
        return (
            f"cache: fetched {self.files_fetched} files ({_mb(self.bytes_fetched)}) in "
            f"{self.fetch_seconds:.3f} s; {self.hits} from cache ({_mb(self.hit_bytes)})"
        )


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@dataclass
class PinnedFile:
    """A cached file a reader uses: it stays on disk until ``release()`` (or the end of
    the ``with`` block, or the process)."""

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


class FileCache:
    """Immutable files of store roots, fetched once into a local folder (module doc)."""

    def __init__(
        self, folder: str | os.PathLike[str] | None = None, *, limit: int | str | None = None
    ):
        self.folder = Path(folder) if folder is not None else default_cache_dir()
        if limit is not None:
            self.limit = parse_size(limit, what="the cache limit")
        else:
            self.limit = parse_size(os.environ.get(ENV_LIMIT) or DEFAULT_LIMIT)
        self.objects_dir = self.folder / "objects"
        self.stats = CacheStats()

    def path_of(self, objects: ObjectStore, key: str) -> Path:
        """Where ``key`` of ``objects``' root lives in this cache."""
        root_id = hashlib.sha256(objects.root.url.encode()).hexdigest()[:20]
        return self.objects_dir / root_id / check_key(key)

    def pin(self, objects: ObjectStore, key: str) -> PinnedFile:
        """``key`` as a local file, fetched if missing, pinned until released."""
        path = self.path_of(objects, key)
        fetched = False
        while True:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                path.parent.mkdir(parents=True, exist_ok=True)
                started = time.perf_counter()
                size = objects.download(key, path)
                self.stats.fetch_seconds += time.perf_counter() - started
                self.stats.files_fetched += 1
                self.stats.bytes_fetched += size
                fetched = True
                continue
            fcntl.flock(fd, fcntl.LOCK_SH)
            if _same_file(fd, path):
                break
            os.close(fd)  # evicted between open and lock: fetch it again
        size = os.fstat(fd).st_size
        if fetched:
            self.evict()  # after pinning, so the file just fetched cannot be the victim
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

    def usage(self) -> int:
        """Bytes of cached files now."""
        return sum(size for _, size, _ in self._entries())

    def _entries(self) -> list[tuple[float, int, Path]]:
        out = []
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
                out.append((st.st_mtime, st.st_size, path))
        return out

    def evict(self) -> int:
        """Remove least recently used, unpinned files until the cache fits its limit;
        returns the bytes removed. Pinned files stay even if the cache is then over."""
        entries = self._entries()
        total = sum(size for _, size, _ in entries)
        freed = 0
        for _, size, path in sorted(entries, key=lambda e: e[0]):
            if total - freed <= self.limit:
                break
            if _remove_unpinned(path):
                freed += size
                self.stats.files_evicted += 1
        return freed


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _remove_unpinned(path: Path) -> bool:
    """Unlink ``path`` unless some process holds a pin on it (a shared flock)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if not _same_file(fd, path):
            return False  # another evictor removed it and a fetch put a new one there
        os.unlink(path)
        return True
    finally:
        os.close(fd)
