"""Reading one partition of an SST-chain version: its files from the cache, one RocksDB.

``open_partition`` pins the chain's SSTs in the ``FileCache`` (fetching only the ones
missing), then opens the partition's RocksDB folder in the cache,
``dbs/<root id>/<store>/<p>/<written_by>-<chain hash>/``, building it first if no
process has: the chain's files ingested oldest first into a new RocksDB
(``partitions.builds``: in memory, unsynced, then moved into a temporary folder beside
it), renamed into place. The rename is atomic and fails when the folder exists, so two
processes building the same version at
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
import hashlib
import os
import re
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import IqkitError, StoreCorruptedError, StoreIOError
from ..cache import CacheStats, FileCache, PinnedFile, counted, is_disk_full
from ..integrity import KNOWN_DAMAGE, FileRef, check_file, damaged, remembering
from ..manifest import StoreManifest
from ..names import CACHE_DBS_DIR, CHAIN_SST_DIR
from ..objects import ObjectStore, check_key
from ..partitions import rocks
from ..partitions.builds import CachedDatabasePartition, KeptOpen, build_in_cache
from ..partitions.sst_reader import MISSING, SstFile
from .records import ChainFile, PartitionChain

__all__ = [
    "ChainPartition",
    "TwinMemo",
    "check_known_damage",
    "check_sst",
    "check_twins",
    "damage_key",
    "database_folder",
    "open_partition",
    "place_on_root",
    "plan_twin_scan",
]


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


class ChainPartition(CachedDatabasePartition):
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
        places: list[str],
    ) -> None:
        #: Whether it reads the database its build kept open (rocksdict's read-write
        #: handle: a few more descriptors, its write-ahead log, MANIFEST and lock).
        self._kept = db is not None
        super().__init__(path, chain.written_by, pins, db=db)
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
        #: The chain's files by their place on the root, oldest first (read errors).
        self._places = places

    def _error(self, exc: BaseException) -> Exception:
        """A read's error naming the chain file RocksDB names, as the root has it (the
        database's own folder, in the cache or a build's scratch folder, differs per
        reader and per run; fault injection found block checksum failures named so)."""
        error = super()._error(exc)
        if isinstance(error, StoreCorruptedError) and self._db is not None:
            return _read_error_on_root(error, self._db.path(), self._places)
        return error

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
        What the reader's bound on open partitions adds up (snapshot.py's ``OpenChains``)."""
        return len(self._pins) + len(self.chain.files) + 1 + (3 if self._kept else 0)


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
    kept: KeptOpen | None = None
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
            # writes to them. A build checks each for its size first (RocksDB checks its
            # blocks as it reads them; a database already built holds its own links of
            # the files as they were checked then, and outlives retention removing them).
            sources = [p for p in local if p is not None]
            if database is None:
                for f, path in zip(chain.files, sources, strict=True):
                    check_sst(objects, f, path, whole=False)
        else:
            for f in chain.files:
                if database is not None and not cache.path_of(objects, f.name).exists():
                    continue  # evicted, but the database holds its own link: no fetch
                pin = pin_checked(cache, objects, f.name, f.size, f.checksum)
                pins.append(pin)
                sources.append(pin.path)
        built = False
        if database is None:
            names = [place_on_root(objects, f.name) for f in chain.files]
            database, built, kept = build_in_cache(cache, folder, sources, names)
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
            places=[place_on_root(objects, f.name) for f in chain.files],
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


#: A table file RocksDB names in its error text: its number.
_TABLE_FILE = re.compile(r"\S*?(\d+)\.sst\b")


def _read_error_on_root(
    error: StoreCorruptedError, database: str, places: list[str]
) -> StoreCorruptedError:
    """``error`` (RocksDB found damage while reading a built database) naming the chain
    file it read, as the root has it. A build ingests the chain's files oldest first and
    RocksDB numbers each ingested file above the last, so while the database holds one
    table file per chain file (nothing compacted them) the n-th lowest number is the n-th
    chain file; otherwise the message keeps RocksDB's own words. Only the open
    database's own folder (``database``) is listed, never a path taken from the text."""
    text = str(error).splitlines()[0]
    if any(place in text for place in places):
        return error
    match = _TABLE_FILE.search(text)
    if match is None:
        return error
    number = int(match.group(1))
    try:
        numbers = sorted(
            int(n[:-4]) for n in os.listdir(database) if n[:-4].isdigit() and n.endswith(".sst")
        )
    except OSError:
        return error
    if len(numbers) != len(places) or number not in numbers:
        return error
    place = places[numbers.index(number)]
    detail = text.split(": ", 1)[-1].replace(f" in {match.group(0)}", "")
    detail = " ".join(detail.replace(match.group(0), "").split())
    return StoreCorruptedError(f"{place} is damaged: {detail}")


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
    if text.startswith(f"{where}/") or any(root_name in text for root_name in names.values()):
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


def read_key_in_place(objects: ObjectStore, chain: PartitionChain, key: bytes) -> bytes | None:
    """``key``'s value in ``chain`` (a local root's), read from its SST files themselves,
    newest first, without a database (``sst_reader``; each file opened through no link
    and closed after). ``UnsupportedSst`` when a file is not one the reader knows."""
    for f in reversed(chain.files):
        place = place_on_root(objects, f.name)
        # Each file checked for its size as it is opened, its blocks as they are read.
        with open_sst_in_place(objects, f) as fh, remembering(place, fh.fileno()):
            value = SstFile(fh, name=place).get(key)
        if value is not MISSING:
            return value  # type: ignore[return-value]
    return None


def place_on_root(objects: ObjectStore, key: str) -> str:
    """``key`` under the root as the user gave it (messages and traces: the same on every
    machine for a relative root, unlike the cache's folders)."""
    return f"{objects.root.text.rstrip('/')}/{key}"


@dataclass
class TwinMemo:
    """What a partition version's twin scans keep between queries (one per partition
    version): its twins' parsed footers, the layout they must match, and on a local
    root their paths, places and opener, found once (every open still goes through the
    root, refusing a link)."""

    footers: dict[str, Any] = field(default_factory=dict)
    layout: bytes | None = None
    in_place: tuple[list[str], list[str], Any] | None = None


def plan_twin_scan(
    cache: FileCache,
    objects: ObjectStore,
    chain: PartitionChain,
    manifest: StoreManifest,
    lower: bytes,
    upper: bytes | None,
    reverse: bool,
    memo: TwinMemo | None = None,
) -> Any:
    """A ``TwinScan`` of ``chain``'s columnar twins (every file has one) for
    ``[lower, upper)``: read in place on a local root, else from the cache (fetched if
    missing, pinned until the scan is gone). No database is opened or built. None when
    the twins were written for another layout than ``manifest``'s."""
    from ..columnar.scan import TwinScan  # pyarrow: imported once twins are read
    from ..columnar.twins import layout_of

    memo = memo or TwinMemo()
    if memo.layout is None:
        memo.layout = layout_of(manifest)
    before = None
    pins: list[PinnedFile] = []
    if memo.in_place is not None:
        paths, names, opener = memo.in_place
    else:
        before = cache.stats.copy()
        paths, names, pins = pin_twins(cache, objects, chain)
        # On a local root the root's own files, opened refusing a link; pinned cache
        # copies are opened as they are.
        opener = None if pins else _opener_by_key(objects, paths, chain)
        if not pins:
            memo.in_place = (paths, names, opener)
    try:
        scan = TwinScan(
            paths,
            lower,
            upper,
            reverse=reverse,
            names=names,
            layout=memo.layout,
            manifest=manifest,
            footers=memo.footers,
            opener=opener,
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
        assert before is not None
        twins = counted(len(pins), "columnar twin")
        scan.fetched = f"{cache.stats.since(before).line()}; {twins} read, no database"
    return scan


def _opener_by_key(objects: ObjectStore, paths: list[str], chain: PartitionChain) -> Any:
    """Opens each of ``paths`` (``chain``'s twins on a local root) through the root,
    by its key, so no link is followed whatever is on the path by then."""
    keys = dict(zip(paths, (f.twin_name for f in chain.files), strict=True))
    return lambda local: objects.open_local_file(keys[local])


def pin_twins(
    cache: FileCache, objects: ObjectStore, chain: PartitionChain, *, ssts: bool = True
) -> tuple[list[str], list[str], list[PinnedFile]]:
    """``chain``'s twins (every file has one) as local paths, oldest first: the root's
    own files on a local root, else the cache's copies (fetched if missing) and their
    pins, which the caller releases; and each twin's place on the root. ``ssts``: the
    SSTs beside them checked too (``check_twins``)."""
    keys = [f.twin_name for f in chain.files]
    local = [objects.local_file(k) for k in keys if k is not None]
    pins: list[PinnedFile] = []
    if len(local) == len(keys) and all(p is not None for p in local):
        paths = [os.fspath(p) for p in local if p is not None]
        check_twins(objects, chain.files, paths, ssts=ssts)
    else:
        try:
            for f in chain.files:
                assert f.twin_name is not None and f.twin is not None
                pins.append(pin_checked(cache, objects, f.twin_name, f.twin, f.twin_checksum))
            check_twins(objects, chain.files, [os.fspath(p.path) for p in pins], ssts=ssts)
        except BaseException:
            for pin in pins:
                pin.release()
            raise
        paths = [os.fspath(p.path) for p in pins]
    names = [place_on_root(objects, k) for k in keys if k is not None]
    return paths, names, pins


def damage_key(where: str, chain: PartitionChain) -> str:
    """What ``KNOWN_DAMAGE`` calls a partition version found damaged by a reader that
    could not say which file (RocksDB, mid-read): its place and the chain's version."""
    return f"{where} (the chain of version {chain.written_by})"


def check_known_damage(objects: ObjectStore, chain: PartitionChain, where: str) -> None:
    """Raise the damage this process found earlier in a file of ``chain`` (or in the
    partition version as a whole), so every query shape of the partition fails the same
    way whichever copy it would read (integrity.py)."""
    if not KNOWN_DAMAGE.any:
        return
    for f in chain.files:
        for key in f.object_keys():
            KNOWN_DAMAGE.check(place_on_root(objects, key), objects.local_file(key))
    KNOWN_DAMAGE.check(damage_key(where, chain), None)


@contextlib.contextmanager
def open_sst_in_place(objects: ObjectStore, f: ChainFile) -> Iterator[Any]:
    """The SST ``f`` of a local root open for the block, through no link, checked for
    its size on the descriptor opened (one open per file). A missing file is damage
    named by its place on the root, as ``check_sst`` names it."""
    with contextlib.ExitStack() as holds:
        try:
            fh = holds.enter_context(objects.open_local_file(f.name))
        except FileNotFoundError:
            damaged(place_on_root(objects, f.name), None, "the file is missing")
        check_sst(objects, f, fh.fileno(), whole=False)
        yield fh


def check_sst(objects: ObjectStore, f: ChainFile, path: FileRef | None, *, whole: bool) -> None:
    """Check the SST ``f`` at ``path`` (or open as that descriptor; integrity.py): its
    size, and with ``whole`` its checksum. ``StoreCorruptedError`` naming its place on
    the root when damaged."""
    if path is None:
        return  # not a local file: checked when fetched (pin_checked)
    check_file(path, place_on_root(objects, f.name), size=f.size, checksum=f.checksum, whole=whole)


def check_twins(
    objects: ObjectStore, files: Sequence[ChainFile], paths: Sequence[str], *, ssts: bool = True
) -> None:
    """Check the twins of ``files`` (a chain's) at ``paths`` whole before a Parquet
    reader sees them, and with ``ssts`` on a local root the SSTs beside them too
    (integrity.py: a twin never serves a partition whose SST is damaged; on object
    storage an SST is checked when fetched). ``ssts=False``: a reader that reads
    nothing but the twins (``iqkit.sql``'s DuckDB), whose answer a damaged SST cannot
    change: hashing the SSTs was three quarters of its first statement's checks."""
    for f, path in zip(files, paths, strict=True):
        assert f.twin_name is not None and f.twin is not None
        check_file(
            path,
            place_on_root(objects, f.twin_name),
            size=f.twin,
            checksum=f.twin_checksum,
            whole=True,
        )
    if ssts and objects.root.is_local:
        for f in files:
            check_sst(objects, f, objects.local_file(f.name), whole=True)


def pin_checked(
    cache: FileCache, objects: ObjectStore, key: str, size: int, checksum: str | None
) -> PinnedFile:
    """``cache.pin`` of a chain file, checked against its record: a copy fetched now is
    hashed before it is used, a copy already cached checked for its size; a damaged copy
    is discarded (the next read fetches it again) and its partition fails naming the
    root's file."""
    pin = cache.pin(objects, key, checksum=checksum)
    try:
        check_file(pin.path, place_on_root(objects, key), size=size, checksum=checksum, whole=False)
    except BaseException:
        pin.release()
        cache.discard(objects, [key])
        raise
    return pin
