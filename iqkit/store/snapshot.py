"""A store as one reader sees it: the version it serves, the leases that keep that
version on disk, and the partitions it has opened for reading.

``StoreSnapshot`` is one store's: the manifest, the served version (pinned with
``as_of``, or the latest published one, noticed with one ``stat`` of ``LATEST``) and the
reader's leases on it (versions.py). ``PartitionCache`` is the reader's, shared by its
snapshots: the partition versions it keeps open (least recently used closed beyond a
cap), and the ones a newer version no longer names, kept until the scans reading them
end. A reader asks a snapshot for its version and for a partition of it, and never
handles leases or open databases itself; the engine validates, routes and executes.

How a published partition folder is opened is one function, the cache's
``PartitionOpener``: read-only RocksDB by default; the engine tests also run over
``MemoryPartition.load`` (an in-memory copy: the model RocksDB must agree with).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from ..errors import IqkitError
from ..query.position import Position
from .layers import ReadCache, TypedKeyValueLayer, TypedWindowLayer, build_layers
from .layout import StoreLayout
from .manifest import StoreManifest
from .memory import MemoryPartition
from .partition import BytesPartition, RocksDBPartition
from .versions import (
    VersionLease,
    VersionRecord,
    lease_latest,
    list_versions,
    no_such_version,
    read_latest_number,
)

Layers = TypedKeyValueLayer | TypedWindowLayer

#: Opens one published partition folder (its path, the version whose commit wrote it).
PartitionOpener = Callable[[Path, int], BytesPartition]

#: Partition versions a reader keeps open at once (each is a read-only RocksDB).
MAX_OPEN_PARTITIONS = 512

#: Where the trace says an empty partition's (absent) rows come from.
NEVER_WRITTEN = "never written: empty"

#: What a query runs against: the served version, None (nothing published), or why the
#: published version cannot be established (every partition then fails with it).
Served = VersionRecord | IqkitError | None


class OpenPartition:
    """A partition version opened for queries: its layers, its position, and the version
    whose lease keeps its folder on disk (the served one, or 0: never written)."""

    __slots__ = ("fetched", "layers", "lease_version", "never_written", "partition", "position")

    def __init__(
        self,
        partition: BytesPartition,
        layers: Layers,
        lease_version: int,
        *,
        never_written: bool = False,
    ) -> None:
        self.partition = partition
        self.layers = layers
        self.lease_version = lease_version
        self.never_written = never_written
        self.position: Position = partition.commit_record().get("position") or Position.empty()
        #: What opening it cost (files fetched, cache hits, a database built), for the
        #: trace; None when there is nothing to say (a folder store, or a chain store's
        #: partition on a local root that this reader already had open).
        self.fetched: str | None = None


def empty_partition(manifest: StoreManifest) -> OpenPartition:
    """What a partition no commit has touched reads as: no rows, an empty position.

    One per store snapshot (it holds nothing, so every such partition can share it); it
    is not a published folder, so it takes no lease and is never evicted.
    """
    empty = MemoryPartition(written_by_version=0, location=NEVER_WRITTEN)
    return OpenPartition(empty, build_layers(manifest, empty, ReadCache()), 0, never_written=True)


class _HeldVersion:
    """A version's lease plus its number of users (the snapshot's served version, open
    partitions): released when the last one lets go."""

    __slots__ = ("lease", "users")

    def __init__(self, lease: VersionLease) -> None:
        self.lease = lease
        self.users = 0


class PartitionCache:
    """The partition versions one reader keeps open, across its stores' snapshots.

    Keyed by (store, partition, version that wrote its folder): the folder is immutable,
    so an entry (with its read cache) stays valid across the versions that name it.
    Every entry counts as a user of its snapshot's served version, so retention keeps
    what is open; ``retire`` moves entries to a newer version or lets them go.
    ``opener`` opens a published folder (default: ``RocksDBPartition``, read-only).
    """

    def __init__(
        self,
        opener: PartitionOpener | None = None,
        *,
        capacity: int = MAX_OPEN_PARTITIONS,
    ) -> None:
        self._opener: PartitionOpener = opener or RocksDBPartition
        self._capacity = capacity
        self._open: OrderedDict[tuple[str, int, int], tuple[StoreSnapshot, OpenPartition]] = (
            OrderedDict()
        )
        #: Partitions of versions no longer served whose scans are still being read.
        self._retired: list[tuple[StoreSnapshot, OpenPartition]] = []
        self._caches: dict[tuple[str, int, int], ReadCache] = {}

    def open(self, snapshot: StoreSnapshot, record: VersionRecord, p: int) -> OpenPartition:
        """Partition ``p`` as ``record`` (served by ``snapshot``) names it, opened once."""
        written_by = record.partitions[p]
        key = (snapshot.manifest.name, p, written_by)
        found = self._open.get(key)
        if found is not None:
            self._open.move_to_end(key)
            return found[1]
        partition = self._opener(snapshot.layout.partition_version_dir(p, written_by), written_by)
        cache = self._caches.setdefault(key, ReadCache())
        entry = OpenPartition(
            partition, build_layers(snapshot.manifest, partition, cache), record.version
        )
        snapshot.acquire_partition_lease(record.version)
        self._open[key] = (snapshot, entry)
        self._evict()
        return entry

    def retire(self, snapshot: StoreSnapshot, record: VersionRecord) -> None:
        """``snapshot`` now serves ``record``. Open partitions it still names move to its
        version's lease; the others are closed, or retired until the scans still reading
        them end, so retention can collect every version this reader no longer serves:
        a long-lived reader holds what it serves, not what it ever read."""
        store = snapshot.manifest.name
        for key in [k for k in self._open if k[0] == store]:
            _, entry = self._open[key]
            if record.partitions.get(key[1]) == key[2]:
                if entry.lease_version != record.version:
                    snapshot.acquire_partition_lease(record.version)
                    snapshot.release_partition_lease(entry.lease_version)
                    entry.lease_version = record.version
            else:
                del self._open[key]
                self._caches.pop(key, None)
                self._retired.append((snapshot, entry))
        self.close_retired()

    def close_retired(self) -> None:
        """Close retired partitions whose scans have ended; release their versions."""
        if not self._retired:
            return
        reading = []
        for snapshot, entry in self._retired:
            if entry.partition.open_iterators:
                reading.append((snapshot, entry))
                continue
            entry.partition.close()
            snapshot.release_partition_lease(entry.lease_version)
        self._retired = reading

    def _evict(self) -> None:
        """Close least-recently-used partitions beyond the cap (not ones mid-iteration)."""
        if len(self._open) <= self._capacity:
            return
        for key in list(self._open):
            if len(self._open) <= self._capacity:
                break
            snapshot, entry = self._open[key]
            if entry.partition.open_iterators:
                continue
            entry.partition.close()
            del self._open[key]
            self._caches.pop(key, None)
            snapshot.release_partition_lease(entry.lease_version)

    def close(self) -> None:
        """Close every open and retired partition (ending live iterators first); the
        snapshots' ``close`` drops the leases."""
        for _, entry in [*self._open.values(), *self._retired]:
            entry.partition.close()
        self._open.clear()
        self._retired.clear()
        self._caches.clear()


class StoreSnapshot:
    """One store for one reader: manifest, served version (and its leases), partitions.

    ``pinned``: serve that version (``as_of``; ``ValueError`` naming the retained ones if
    it is not there); ``None``: the latest published one, followed as it moves.
    """

    def __init__(self, layout: StoreLayout, pinned: int | None, partitions: PartitionCache) -> None:
        self.layout = layout
        self.manifest = StoreManifest.read(layout)
        self._partitions = partitions
        self._latest_path = os.fspath(layout.latest)  # stat'ed on every query: keep a str
        self.pinned = pinned
        self.record: VersionRecord | None = None
        self._latest_stamp: tuple[int, int] | None = None
        self._held: dict[int, _HeldVersion] = {}
        self._empty: OpenPartition | None = None
        if pinned is not None:
            self._switch_to(pinned)

    # -- the served version ----------------------------------------------------------------
    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self._latest_path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns)

    def current(self) -> VersionRecord | None:
        """The version served: pinned, or the latest published one (``None``: nothing
        published). Partitions retired earlier whose scans have ended are closed first.

        Costs one ``stat`` per query when nothing changed: ``LATEST`` is replaced (new
        inode) on every publish, so a long-lived reader sees new commits at once. Without
        ``LATEST`` it looks every time: nothing was published, or the store is damaged
        (``StoreCorruptedError``, see versions.py), which must not read as "empty".
        """
        self._partitions.close_retired()
        if self.pinned is not None:
            return self.record
        stamp = self._stamp()
        if stamp is None or stamp != self._latest_stamp:
            latest = read_latest_number(self.layout)
            if latest is not None and (self.record is None or self.record.version != latest):
                lease = lease_latest(self.layout)
                if lease is not None:
                    self._serve(lease)
            self._latest_stamp = stamp
        return self.record

    def served(self) -> Served:
        """What a query runs against: ``current()``, or why the published version cannot
        be established (a damaged store: every partition then fails with it)."""
        try:
            return self.current()
        except IqkitError as exc:
            return exc

    def latest_number(self) -> int | None:
        """The latest published version (what ``require_active`` compares with)."""
        return read_latest_number(self.layout)

    def versions(self) -> list[int]:
        """Versions still on disk (retained), ascending."""
        return list_versions(self.layout)

    def _switch_to(self, version: int) -> None:
        """Pin ``version``. A record above LATEST is a commit that never published (it
        crashed between the record and LATEST): not a version, and may be rebuilt."""
        latest = read_latest_number(self.layout)
        try:
            if latest is None or version > latest:
                raise LookupError(version)
            lease = VersionLease(self.layout, version)
        except LookupError:
            retained = list_versions(self.layout)
            raise ValueError(no_such_version(self.layout.name, version, retained)) from None
        self._serve(lease)

    def _serve(self, lease: VersionLease) -> None:
        """Serve the leased version from now on and let go of the previous one: open
        partitions it no longer names are closed (see ``PartitionCache.retire``)."""
        try:
            where = f"store {self.layout.name!r}: {self.layout.version_record(lease.version)}"
            lease.record.check_partitions(self.manifest.partitions, where)
        except BaseException:
            lease.release()  # a damaged record is not served
            raise
        old = self.record
        held = self._held.get(lease.version)
        if held is None:
            held = self._held[lease.version] = _HeldVersion(lease)
        else:
            lease.release()  # one lease per version is enough
        held.users += 1
        self.record = held.lease.record
        self._partitions.retire(self, self.record)
        if old is not None:
            self.release_partition_lease(old.version)

    # -- partitions --------------------------------------------------------------------------
    def partition(self, record: VersionRecord | None, p: int) -> OpenPartition:
        """Partition ``p`` as ``record`` (from ``current()``) has it; raises ``IqkitError``
        when it cannot be read.

        A partition no commit has touched is an empty partition, not a failure: it answers
        every query with no rows. A Kafka Streams user reads NOT_PRESENT as "not hosted
        here"; this one is here.
        """
        if record is None or p not in record.partitions:
            return self._empty_partition()
        return self._partitions.open(self, record, p)

    def _empty_partition(self) -> OpenPartition:
        if self._empty is None:
            self._empty = empty_partition(self.manifest)
        return self._empty

    # -- leases ------------------------------------------------------------------------------
    def acquire_partition_lease(self, version: int) -> None:
        """Count one more user of ``version``, which this snapshot holds (it serves it)."""
        self._held[version].users += 1

    def release_partition_lease(self, version: int) -> None:
        held = self._held.get(version)
        if held is None:
            return
        held.users -= 1
        if held.users <= 0:
            held.lease.release()
            del self._held[version]

    def close(self) -> None:
        """Drop every lease (the cache closes the partitions)."""
        for held in self._held.values():
            held.lease.release()
        self._held.clear()
