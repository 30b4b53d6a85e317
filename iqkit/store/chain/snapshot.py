"""A chain store as one reader sees it: the chain format's ``format.StoreSnapshot``.

The served version is a ``ChainVersion`` record: pinned with ``as_of``, or the latest
one, noticed by one listing of the store's records per query (an object root has no
``LATEST`` file to ``stat``; records are never rewritten, so a version read once stays
valid). Partitions are opened through ``read.open_partition``: the chain's files
come from the reader's ``FileCache`` (``IQKIT_CACHE``), fetched only when missing, and
each open partition's ``fetched`` says what that cost, for the execution trace.

An open partition is keyed by its chain's file names, so a new version that left a
partition unchanged keeps it open; the ones a newer version no longer names are closed
once the scans reading them end. Nothing is leased: the root's retention keeps files
for a grace period instead (store/chain/retention.py), and the cache pins what is open.

How many partitions are open at once is bounded (``OpenChains``, one per reader, shared
by its stores): each open partition holds a few file descriptors (its pins, its
RocksDB's files), and a fan-out over a store of 1,000 partitions ran out of them under
the usual limit of 1,024. Past the bound the least recently used partitions are closed,
never one a started scan is still reading; a closed one opens again, from its database
in the cache, when it is next read (``ReopenablePartition``).
"""

from __future__ import annotations

import contextlib
import os
import resource
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, NoReturn

from ...errors import IqkitError, StoreCorruptedError
from ...query.position import Position
from ..cache import FileCache
from ..format import (
    MAX_OPEN_PARTITIONS,
    OpenPartition,
    TwinFile,
    TwinFiles,
    close_unread,
    empty_partition,
)
from ..integrity import KNOWN_DAMAGE, remembering
from ..names import CHAIN_SST_DIR
from ..objects import ObjectStore
from ..partitions.layers import ReadCache, build_layers
from ..partitions.memory import MemoryPartition
from ..partitions.partition import ScanTracker, closed_partition_error
from ..partitions.rocks import FIRST_CHUNK_ROWS, MAX_CHUNK_ROWS, database_exists
from ..partitions.sst_reader import UnsupportedSst
from ..versions import VersionNotRetained
from .read import (
    ChainPartition,
    TwinMemo,
    check_known_damage,
    check_twins,
    damage_key,
    database_folder,
    open_partition,
    pin_twins,
    place_on_root,
    plan_twin_scan,
    read_key_in_place,
)
from .records import (
    MAX_CHAIN_VERSION,
    ChainVersion,
    PartitionChain,
    checked_partitions,
    latest_version,
    list_versions,
    read_version,
    read_version_of_partition,
    record_key,
    record_name,
)
from .stores import read_chain_manifest
from .versions import ChainVersionWalk, LayeredDatabases

__all__ = ["ChainSnapshot", "OpenChains", "ReopenablePartition", "descriptor_budget"]

# Bound once: the freshness check runs on every query.
_exists = os.access
_F_OK = os.F_OK

#: The share of the process's file-descriptor limit a reader's open partitions may hold
#: (the rest is for everything else the process opens: sockets, Spark, Jupyter).
DESCRIPTOR_SHARE = 4
#: The budget never goes below this many descriptors (a few partitions stay open).
MIN_DESCRIPTORS = 16
#: A chain this small (its SSTs' bytes) is read into memory when opened and its RocksDB
#: closed at once: with many partitions of few rows, opening RocksDB again each time a
#: fan-out reads one (past the descriptor bound) cost ~5 ms a partition.
SMALL_CHAIN_BYTES = 64 * 1024
#: Bytes of rows a reader keeps in memory copies of small chains (least recently used
#: dropped first, read again from the cache's database when next needed).
MEMORY_BUDGET = 64 * 2**20
#: What one row of a memory copy costs beyond its key and value bytes (Python objects).
_ROW_OVERHEAD = 100


def descriptor_budget() -> int:
    """File descriptors a reader's open partitions may hold: a quarter of the soft
    ``RLIMIT_NOFILE`` (read when the reader starts), at least ``MIN_DESCRIPTORS``."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(MIN_DESCRIPTORS, soft // DESCRIPTOR_SHARE)


class OpenChains:
    """The chain partitions one reader has open, across its stores: least recently used
    first, bounded by ``descriptors`` (their summed ``ChainPartition.descriptors``) and
    by ``count``. Opening or reading a partition marks it used; past either bound the
    least recently used idle ones (no started scan) are closed until both hold again, or
    until only busy ones are left."""

    def __init__(
        self,
        descriptors: int | None = None,
        count: int = MAX_OPEN_PARTITIONS,
        memory: int = MEMORY_BUDGET,
    ):
        self.descriptors = descriptor_budget() if descriptors is None else descriptors
        self.count = count
        self.memory = memory
        self._lru: OrderedDict[int, ReopenablePartition] = OrderedDict()
        self._held = 0  # descriptors of the open partitions, as counted when they opened
        self._databases = 0  # open partitions reading a RocksDB (the rest: memory copies)
        self._bytes = 0  # bytes of the memory copies

    @property
    def held(self) -> int:
        """Descriptors the open partitions hold (counted high)."""
        return self._held

    def __len__(self) -> int:
        return len(self._lru)

    def opened(self, part: ReopenablePartition) -> None:
        self._lru[id(part)] = part
        self._count(part, 1)
        self._shrink(part)

    def used(self, part: ReopenablePartition) -> None:
        self._lru.move_to_end(id(part))

    def closed(self, part: ReopenablePartition) -> None:
        if self._lru.pop(id(part), None) is not None:
            self._count(part, -1)

    def _count(self, part: ReopenablePartition, sign: int) -> None:
        self._held += sign * part.descriptors
        self._bytes += sign * part.memory_bytes
        if not part.memory_bytes:
            self._databases += sign

    def _within(self) -> bool:
        return (
            self._held <= self.descriptors
            and self._databases <= self.count
            and self._bytes <= self.memory
        )

    def _shrink(self, keep: ReopenablePartition) -> None:
        if self._within():
            return
        for part in list(self._lru.values()):
            if self._within():
                return
            if part is not keep and part.idle:
                part.suspend()


class ReopenablePartition:
    """A chain partition as the query layers read it (a ``BytesPartition``), whose
    RocksDB ``OpenChains`` may close while nothing reads it: the next read opens it
    again (``opener``: from its database in the cache, built again if evicted).

    Scans handed out before a suspension are generators that have not started: they open
    the partition when first read. A started scan keeps it open until it ends."""

    def __init__(
        self,
        opener: Callable[[], ChainPartition],
        chain: PartitionChain,
        bound: OpenChains,
        where: str,
        twins: Callable[[bytes, bytes | None, bool], Any] | None = None,
        first_read: Callable[[bytes], object] | None = None,
    ) -> None:
        self._opener = opener
        #: Reads one key from the chain's files themselves (``read.read_key_in_place``),
        #: or says ``DECLINED`` (its database is in the cache already: opening that is
        #: as cheap): the first key lookup of a partition not yet opened takes it, so
        #: the first query of a version builds no database; the next lookup builds it.
        self._first_read = first_read
        #: Plans a scan of the chain's columnar twins (``read.plan_twin_scan``) when
        #: every file has one: scans then read those and never open the database.
        self._twins = twins
        self._twin_scans: weakref.WeakSet[Any] = weakref.WeakSet()
        #: Told what each open of the database cost (``trace_line``): a partition
        #: opened by a query, not when it was made, reports it to that query's trace.
        self.on_open: Callable[[str | None], None] | None = None
        self._bound = bound
        self._part: ChainPartition | MemoryPartition | None = None
        self._opened_once = False
        self._small = chain.size <= SMALL_CHAIN_BYTES
        self._scans = 0  # started scans not yet ended
        self._tracked = ScanTracker()
        self._closed = False
        self._commit = chain.commit_record()
        self._trace: str | None = None
        #: Descriptors counted for it while open, and the bytes of its memory copy (a
        #: small chain's: ``SMALL_CHAIN_BYTES``), for ``OpenChains``.
        self.descriptors = 0
        self.memory_bytes = 0
        self.written_by_version = chain.written_by
        self.location = where
        #: What ``KNOWN_DAMAGE`` calls this partition version (``read.damage_key``).
        self.damage = damage_key(where, chain)

    def open(self) -> ChainPartition | MemoryPartition:
        """The open partition (opened now if it was not); raises ``IqkitError`` when it
        cannot be."""
        if self._closed:
            raise closed_partition_error(self.location)
        part = self._part
        if part is None:
            opened = self._opener()
            self._opened_once = True
            self._trace = opened.trace_line()
            if self.on_open is not None:
                self.on_open(self._trace)
            if self._small:
                part = self._part = _memory_copy(opened)
                self.descriptors, self.memory_bytes = 0, _copy_bytes(part)
            else:
                part = self._part = opened
                self.descriptors, self.memory_bytes = opened.descriptors, 0
            self._bound.opened(self)
        else:
            self._bound.used(self)
        return part

    @property
    def is_open(self) -> bool:
        return self._part is not None

    @property
    def idle(self) -> bool:
        """Open, and no started scan reads it (closing it loses nothing; a memory copy's
        scans read lists of their own)."""
        return self._part is not None and (self._scans == 0 or self.memory_bytes > 0)

    def suspend(self) -> None:
        """Close the RocksDB and unpin its files until the next read."""
        part, self._part = self._part, None
        self._bound.closed(self)
        if part is not None:
            part.close()

    @property
    def twinned(self) -> bool:
        """Whether its chain has columnar twins (scans may read them)."""
        return self._twins is not None

    def twin_scan(self, lower: bytes, upper: bytes | None, reverse: bool) -> Any:
        """A planned ``TwinScan`` of ``[lower, upper)``, or None (no twins)."""
        if self._twins is None:
            return None
        if self._closed:
            raise closed_partition_error(self.location)
        scan = self._twins(lower, upper, reverse)
        if scan is not None:
            self._twin_scans.add(scan)  # closing the partition ends them (``close``)
            if self.on_open is not None and scan.fetched is not None:
                self.on_open(scan.fetched)  # what the scan fetched, in its query's trace
        return scan

    # -- BytesPartition ------------------------------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        part = self._part
        if part is None:
            first, self._first_read = self._first_read, None
            if first is not None and not self._opened_once and not self._closed:
                try:
                    value = first(key)
                except StoreCorruptedError:
                    raise  # damage (integrity.py): never read from another copy instead
                except (UnsupportedSst, OSError, IqkitError):
                    # Not a file the reader knows, or one it cannot read: the database
                    # reads it (and a damaged or missing file fails there, by its name).
                    pass
                else:
                    if value is not DECLINED:
                        if self.on_open is not None:
                            self.on_open(FIRST_READ_LINE)
                        return value  # type: ignore[return-value]
            try:
                return self.open().get(key)
            except StoreCorruptedError as exc:
                self._damaged(exc)
        self._bound._lru.move_to_end(id(self))  # OpenChains.used, one call less per key
        try:
            return part.get(key)
        except StoreCorruptedError as exc:
            self._damaged(exc)

    def multi_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        try:
            return self.open().multi_get(keys)
        except StoreCorruptedError as exc:
            self._damaged(exc)

    def _damaged(self, exc: StoreCorruptedError) -> NoReturn:
        """Remember that this partition version is damaged (integrity.py: its other
        query shapes then fail the same way, whichever copy they read), and re-raise."""
        with remembering(self.damage, None):
            raise exc

    def scan_chunks(
        self, lower: bytes, upper: bytes | None, *, reverse: bool = False
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        if self._twins is not None and not self._opened_once:
            # A chain with twins has not opened its database yet (scans read the twins).
            # A scan of RocksDB all the same (a raw scan, ``twin_scans(False)``, twins of
            # another layout) opens it now, as a chain without twins did when it was
            # first read: a failure to fetch or build is this query's result, not an
            # error out of its iterator, and the cost is in this query's trace.
            self.open()
        return self._tracked.track(self._scan(lower, upper, reverse))

    def _scan(
        self, lower: bytes, upper: bytes | None, reverse: bool
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        try:
            part = self.open()
        except StoreCorruptedError as exc:
            self._damaged(exc)
        self._scans += 1
        try:
            if isinstance(part, MemoryPartition):
                for rows in part.scan_chunks(lower, upper, reverse=reverse):
                    yield from _as_rocks_chunks(rows)
            else:
                yield from part.scan_chunks(lower, upper, reverse=reverse)
        except StoreCorruptedError as exc:
            self._damaged(exc)
        finally:
            self._scans -= 1

    @property
    def open_iterators(self) -> int:
        return self._tracked.live

    def commit_record(self) -> dict[str, Any]:
        return self._commit

    def approximate_rows(self) -> int:
        return self.open().approximate_rows()

    def close(self) -> None:
        for scan in list(self._twin_scans):
            scan.close()
        self._tracked.end_all(self.location)  # scans end before their database closes
        self._closed = True
        self.suspend()

    def trace_line(self) -> str | None:
        """What the last open cost (the ``ChainPartition``'s line)."""
        return self._trace


def _release_all(pins: list[Any]) -> None:
    for pin in pins:
        pin.release()


def _memory_copy(part: ChainPartition) -> MemoryPartition:
    """Every row of the small chain ``part`` (commit record included) in memory; ``part``
    is closed (its database unpinned: eviction may take it, a later open builds it)."""
    try:
        rows = [row for chunk in part.scan_chunks(b"", None) for row in chunk]
    finally:
        part.close()
    return MemoryPartition(rows, written_by_version=part.written_by_version, location=part.location)


def _as_rocks_chunks(rows: list[tuple[bytes, bytes]]) -> Iterator[list[tuple[bytes, bytes]]]:
    """``rows`` in the chunks a RocksDB scan hands out (``rocks.scan_chunks``): a small
    first one, so "the first rows" and a scan closed early stay cheap with a memory copy."""
    size, start = FIRST_CHUNK_ROWS, 0
    while start < len(rows):
        yield rows[start : start + size]
        start += size
        size = min(size * 2, MAX_CHUNK_ROWS)


def _copy_bytes(part: MemoryPartition) -> int:
    return sum(len(k) + len(v) + _ROW_OVERHEAD for chunk in part.scan_chunks(b"", None)
               for k, v in chunk)  # fmt: skip


#: Chains whose twins' local paths a snapshot keeps (``ChainSnapshot._twin_paths``).
_TWIN_PATHS_KEPT = 4096

#: What a partition's first read says when it leaves the key to the database.
DECLINED = object()

#: The trace's line for a key lookup read from the chain's files (``read_key_in_place``).
FIRST_READ_LINE = (
    "read in place from the chain's SST files, no database built (the next key lookup "
    "of this partition builds it)"
)

#: The trace's line for a partition the version record says holds no rows.
KNOWN_EMPTY = "version record: no rows (its commits put none); nothing fetched or opened"


def already_open_line(objects: ObjectStore) -> str | None:
    """The trace's line for a partition this reader already has open: on an object root
    that nothing was fetched (what the trace promises to say of every read there); on a
    local root none (the first open's line said what was built)."""
    if objects.root.local is not None:
        return None
    return "cache: fetched 0 files; partition already open in this reader"


class ChainSnapshot:
    """One store of an object root for one reader (module docstring); ``pinned``: serve
    that version (``ValueError`` naming the versions on the root if it is not there)."""

    def __init__(
        self,
        objects: ObjectStore,
        store: str,
        pinned: int | None,
        cache: FileCache,
        bound: OpenChains | None = None,
    ) -> None:
        self.objects = objects
        self.name = store
        self.manifest = read_chain_manifest(objects, store)
        self.cache = cache
        #: The reader's bound on open partitions (shared by its stores).
        self.bound = bound if bound is not None else OpenChains()
        self.pinned = pinned
        self._local = objects.root.is_local
        self.record: ChainVersion | None = None
        self._open: dict[tuple[int, tuple[str, ...]], OpenPartition] = {}
        #: Partitions of versions no longer served whose scans are still being read.
        self._retired: list[OpenPartition] = []
        self._empty: OpenPartition | None = None
        #: The local root's records folder (``_still_latest``), once known, and the paths
        #: of the served record and the next one (built once per served version).
        self._records_folder: str | None = None
        self._latest_paths: tuple[str, str | None] | None = None
        #: The served version's partitions already opened, by number: the key-lookup
        #: path's one dict lookup (``hot_partition``).
        self._hot: dict[int, OpenPartition] = {}
        #: A local root's twins as ``pin_twins`` found them through no link, by their
        #: names: later statements over them check each by a ``stat`` (``check_twins``:
        #: its identity, found whole, or hashed again) instead of walking the root.
        self._twin_paths: dict[tuple[str | None, ...], tuple[list[str], list[str]]] = {}
        #: Version records read for the version queries (``published``), by number.
        self._records: dict[tuple[int, int | None], ChainVersion] = {}
        #: The layered databases the version queries keep (store/chain/versions.py).
        self.layered = LayeredDatabases(self)
        if pinned is not None:
            try:
                self.record = self._checked(read_version(objects, store, pinned))
            except LookupError as exc:
                raise ValueError(str(exc)) from None

    # -- the served version ----------------------------------------------------------------
    def current(self) -> ChainVersion | None:
        """The version served: pinned, or the latest published one (``None``: nothing
        published); raises ``IqkitError`` when the root cannot be read."""
        if self._retired:
            self._close_retired()
        if self.pinned is not None:
            return self.record
        if self.record is not None and self._local and self._still_latest():
            return self.record
        numbers = list_versions(self.objects, self.name)
        if numbers and (self.record is None or self.record.version != numbers[-1]):
            record = latest_version(self.objects, self.name)
            if record is not None:
                self._serve(self._checked(record))
        return self.record

    def _still_latest(self) -> bool:
        """Whether the record served is still the latest, from two existence checks (a
        local root).

        Versions are published consecutively and retention removes records oldest first,
        never the newest: when the next record is not there *and* the served one still
        is, no newer version exists. Both are needed: an engine idle for longer than the
        grace while newer versions came and went would find the next record removed too,
        and must not take that for "nothing newer" (it would serve a removed version for
        good). Every query pays this, so the two paths are built once per served version
        and checked with ``os.access`` (one ``faccessat`` each, no ``stat`` result built:
        about 0.8 µs against 2.3 µs for ``os.path.isfile``). Not on object storage: there
        a missing key costs fsspec a HEAD and then a LIST (it looks for a "folder" of that
        name), more than the one LIST of the records (measured on the S3 bench: 7.6 ms
        against 4.1 ms)."""
        paths = self._latest_paths
        if paths is None:
            paths = self._latest_paths = self._record_paths()
        served, following = paths
        if following is None:  # no version can follow the highest number
            return _exists(served, _F_OK)
        return not _exists(following, _F_OK) and _exists(served, _F_OK)

    def _record_paths(self) -> tuple[str, str | None]:
        """The served record's path and the next one's (``None`` past the bound)."""
        assert self.record is not None
        served = self.record.version
        if self._records_folder is None:
            folder = self.objects.local_file(record_key(self.name, served))
            assert folder is not None  # a local root
            self._records_folder = os.fspath(folder.parent)
        records = self._records_folder
        following = None if served == MAX_CHAIN_VERSION else f"{records}/{record_name(served + 1)}"
        return f"{records}/{record_name(served)}", following

    def served(self) -> ChainVersion | IqkitError | None:
        """``current()``, or why it cannot be read (every partition then fails with it)."""
        try:
            return self.current()
        except IqkitError as exc:
            return exc

    def latest_number(self) -> int | None:
        numbers = list_versions(self.objects, self.name)
        return numbers[-1] if numbers else None

    def versions(self) -> list[int]:
        """Versions still on the root (retained), ascending."""
        return list_versions(self.objects, self.name)

    def _checked(self, record: ChainVersion) -> ChainVersion:
        """``record`` if it lists only the manifest's partitions (else damage)."""
        return checked_partitions(self.objects, self.name, record, self.manifest.partitions)

    def _serve(self, record: ChainVersion) -> None:
        self.record = record
        self._latest_paths = None
        self._hot = {}
        for key in list(self._open):
            p, files = key
            chain = record.partitions.get(p)
            if chain is None or tuple(f.name for f in chain.files) != files:
                self._retired.append(self._open.pop(key))
        self._close_retired()

    def _close_retired(self) -> None:
        self._retired = close_unread(self._retired)

    @property
    def serves_key_lookups(self) -> bool:
        """A local root's: there the freshness check is two existence checks and an open
        partition reads local files. On an object root every query lists the records
        anyway, and a fetch must fail fast inside ``reading``."""
        return self._local

    def reading(self) -> contextlib.AbstractContextManager[object]:
        """What a query runs inside: once one partition finds the root's endpoint
        unreachable, the others fail at once (``ObjectStore.failing_fast``)."""
        return self.objects.failing_fast()

    # -- partitions --------------------------------------------------------------------------
    def position(self, record: ChainVersion | None, p: int) -> Position:
        """Partition ``p``'s position in ``record`` (empty when it has none or cannot be
        read): the record carries each partition's commit record, so lag never opens a
        partition (no database built, nothing fetched)."""
        chain = record.partitions.get(p) if record is not None else None
        if chain is None:
            return Position.empty()
        try:
            return chain.commit_record().get("position") or Position.empty()
        except IqkitError:
            return Position.empty()

    def partition(self, record: ChainVersion | None, p: int) -> OpenPartition:
        """Partition ``p`` as ``record`` has it (never written: the shared empty
        partition); raises ``IqkitError`` when its files cannot be fetched."""
        entry = self._partition(record, p)
        if record is not None and record is self.record:
            self._hot[p] = entry
        return entry

    def published(self, version: int, partition: int | None = None) -> ChainVersion:
        """Version ``version``'s record (read once per reader: records never change);
        with ``partition``, a record holding that partition's chain alone (cheaper to
        read; what a query of one key needs). ``VersionNotRetained`` when retention
        removed it."""
        key = (version, partition)
        record = self._records.get(key) or self._records.get((version, None))
        if record is None:
            if self.record is not None and self.record.version == version:
                record = self.record
            else:
                try:
                    if partition is None:
                        record = read_version(self.objects, self.name, version)
                    else:
                        record = read_version_of_partition(
                            self.objects, self.name, version, partition
                        )
                    record = self._checked(record)
                except LookupError as exc:  # removed by retention since it was listed
                    raise VersionNotRetained(str(exc)) from None
            self._records[key] = record
        return record

    def version_walk(self, p: int, records: Mapping[int, Any]) -> Any:
        """Partition ``p`` across ``records`` (store/chain/versions.py); a file of theirs
        this process found damaged fails it at once (integrity.py)."""
        if KNOWN_DAMAGE.any:
            for record in records.values():
                chain = record.partitions.get(p)
                if chain is not None:
                    check_known_damage(self.objects, chain, self._where(p))
        return ChainVersionWalk(self, p, dict(records))

    def _where(self, p: int) -> str:
        """Partition ``p``'s place on the root (messages, traces, ``KNOWN_DAMAGE``)."""
        return place_on_root(self.objects, f"{self.name}/{CHAIN_SST_DIR}/{p}")

    def hot_partition(self, p: int) -> OpenPartition | None:
        """Partition ``p`` of the served version when a query already opened it through
        ``partition`` (else ``None``): the key-lookup path's one dict lookup. It may have
        been closed since to stay under the bound; reading it opens it again, and a
        failure to do so raises ``IqkitError`` (the caller then takes ``partition``).
        None once this process found any file damaged: ``partition`` checks that."""
        if KNOWN_DAMAGE.any:
            return None
        return self._hot.get(p)

    def _partition(self, record: ChainVersion | None, p: int) -> OpenPartition:
        if record is None or p not in record.partitions:
            if self._empty is None:
                self._empty = empty_partition(self.manifest)
            return self._empty
        chain = record.partitions[p]
        if KNOWN_DAMAGE.any:
            check_known_damage(self.objects, chain, self._where(p))
        key = (p, tuple(f.name for f in chain.files))
        entry = self._open.get(key)
        if entry is not None:
            handle = entry.partition
            if not isinstance(handle, ReopenablePartition):
                return entry  # known to hold no rows (below): nothing to open
            if handle.on_open is not None:
                # Twins: scans never open the database, and a key lookup opens it
                # (its failure is that query's result, its cost in that query's trace).
                # Open already: on an object root the trace says nothing was fetched
                # (a scan of the twins then says what it fetched instead).
                entry.fetched = already_open_line(self.objects) if handle.is_open else None
                return entry
            if not handle.is_open and not database_exists(
                database_folder(self.cache, self.objects, self.name, p, chain)
            ):
                # Closed to stay under the bound and its database evicted since: open it
                # now, so a failure to fetch or build is this query's result.
                handle.open()
            entry.fetched = already_open_line(self.objects)
            return entry
        commit = chain.commit_record()
        if PartitionChain.holds_no_rows(commit):
            # Its commits put nothing (deletes only): no rows, nothing to fetch or build;
            # its position still counts for bounds and lag.
            empty = MemoryPartition(
                written_by_version=chain.written_by,
                position=commit.get("position"),
                location=self._where(p),
            )
            entry = OpenPartition(empty, build_layers(self.manifest, empty, ReadCache()))
            entry.fetched = KNOWN_EMPTY
            self._open[key] = entry
            return entry
        cache, objects, manifest = self.cache, self.objects, self.manifest
        twins = None
        if chain.twinned:
            memo = TwinMemo()  # footers parsed once per partition version

            def twins(lower: bytes, upper: bytes | None, reverse: bool) -> Any:
                return plan_twin_scan(cache, objects, chain, manifest, lower, upper, reverse, memo)

        first_read = None
        if twins is not None and objects.root.is_local:
            # A chain with twins builds its database only for a key lookup: on a local
            # root, its first one reads the files in place instead (no fetch, no build),
            # unless the database is in the cache already.
            folder = database_folder(cache, objects, self.name, p, chain)

            def first_read(key: bytes) -> object:
                if database_exists(folder):
                    return DECLINED
                return read_key_in_place(objects, chain, key)

        handle = ReopenablePartition(
            lambda: open_partition(cache, objects, self.name, p, chain),
            chain,
            self.bound,
            self._where(p),
            twins,
            first_read,
        )
        if twins is None:
            # The first open: its cost is in the trace, its failure a result. A chain
            # with twins opens its database only when a key lookup needs it (its scans
            # read the twins), so a scan of a version builds no database.
            handle.open()
        try:
            entry = OpenPartition(handle, build_layers(self.manifest, handle, ReadCache()))
        except BaseException:
            handle.close()
            raise
        if twins is None:
            entry.fetched = handle.trace_line()
        else:
            handle.on_open = partial(setattr, entry, "fetched")
        self._open[key] = entry
        return entry

    def scan_bytes(self, record: ChainVersion | None) -> dict[int, int]:
        """format.py's ``StoreSnapshot.scan_bytes``: each chain's twin bytes where every
        file has a twin, else its SST bytes."""
        if record is None:
            return {}
        return {
            p: sum(f.twin or 0 for f in chain.files) if chain.twinned else chain.size
            for p, chain in record.partitions.items()
        }

    def twin_files(self, record: ChainVersion | None) -> TwinFiles | None:
        """``record``'s twins as local files, pinned until ``release`` (format.py's
        ``StoreSnapshot.twin_files``): None unless every partition with rows has a
        twin for each of its files. A partition known to hold no rows is left out (it
        has nothing to read); nothing is opened or built."""
        from ..columnar.twins import layout_of  # pyarrow: imported once twins are read

        if record is None or any(not chain.twinned for chain in record.partitions.values()):
            return None
        pins: list[Any] = []
        partitions: dict[int, list[TwinFile]] = {}
        try:
            for p, chain in sorted(record.partitions.items()):
                if PartitionChain.holds_no_rows(chain.commit_record()):
                    continue
                try:
                    check_known_damage(self.objects, chain, self._where(p))
                    # Only the twins: SQL reads nothing else (check_twins).
                    paths, names, pinned = self._local_twins(chain)
                except IqkitError as exc:
                    raise type(exc)(f"partition {p}: {exc}") from None
                pins.extend(pinned)
                partitions[p] = [
                    TwinFile(os.path.abspath(a), b) for a, b in zip(paths, names, strict=True)
                ]
        except BaseException:
            _release_all(pins)
            raise
        return TwinFiles(
            record.version, partitions, layout_of(self.manifest), partial(_release_all, pins)
        )

    def _local_twins(self, chain: PartitionChain) -> tuple[list[str], list[str], list[Any]]:
        """``pin_twins`` of ``chain`` for SQL (``ssts=False``), its local paths found once
        per snapshot (``_twin_paths``) and checked again each time."""
        key = tuple(f.twin_name for f in chain.files)
        found = self._twin_paths.get(key)
        if found is not None:
            check_twins(self.objects, chain.files, found[0], ssts=False)
            return found[0], found[1], []
        paths, names, pinned = pin_twins(self.cache, self.objects, chain, ssts=False)
        if not pinned:  # the root's own files (a local root)
            if len(self._twin_paths) >= _TWIN_PATHS_KEPT:
                self._twin_paths.clear()
            self._twin_paths[key] = (paths, names)
        return paths, names, pinned

    def close(self) -> None:
        """Close every open partition (their cached files are unpinned) and the layered
        databases the version queries kept."""
        self.layered.close()
        for entry in [*self._open.values(), *self._retired]:
            entry.partition.close()
        self._open.clear()
        self._retired.clear()
