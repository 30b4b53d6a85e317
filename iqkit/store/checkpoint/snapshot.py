"""One checkpoint store as one reader sees it: ``format.StoreSnapshot`` over Spark's state.

The version served is the pinned one (``as_of``) or the newest committed batch's state
(``layout``: state version N is the state after batch N - 1); a batch without a commit
file is never served, so a running query's half-written batch stays invisible. A
partition of a version is Spark's state files for it replayed (``providers``), decoded
and turned into iqkit's row layout (``shape``: a whole column at a time where its shape
allows, else row by row), then built into a database in the cache (``materialize``) and
served through the same query layers as every store; it is kept for the snapshot's life,
so each (partition, version) is read once per reader (an unpinned reader lets go of a
version's partitions when it moves on to a newer one). While a partition is built, a
helper process builds the next one (``prebuild``).

A running query keeps committing while a reader reads, and Spark's maintenance deletes
old versions' files meanwhile (the state files below the newest ``minBatchesToRetain``
versions, and the offsets and commit log entries of old batches). A reader never
serves part of a version: every partition of a query is read at the one version it
listed, from the files one listing of its folder names. A file listed and then deleted
before it is read, or a log entry gone, is checked against a new listing: when the
version is no longer retained the answer is ``VersionGoneError``, one line naming the
version and the newest committed one (a partition's failure, or ``iqkit.open``'s error
for ``as_of``), never the file that happened to go first; an unpinned reader that lists
a version whose log entry goes before it reads it lists again and serves the newest.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ...errors import IqkitError, ObjectMissingError, StoreCorruptedError
from ...query.position import Position
from ..cache import FileCache
from ..format import OpenPartition, close_unread
from ..manifest import StoreManifest
from ..names import DATA_PREFIX
from ..objects import ObjectStore
from ..partitions.layers import ReadCache, build_layers
from ..partitions.partition import encode_commit_record
from ..versions import OpenedVersionsWalk
from . import prebuild
from .codecs import StateFileError
from .layout import OperatorStore, batch_metadata, committed_batches, state_partitions
from .materialize import open_partition
from .positions import BatchSources, batch_sources
from .providers import StateReader
from .shape import StateShape, UnsupportedStateError
from .spark_release import attributed

__all__ = ["CheckpointSnapshot", "CheckpointVersion", "VersionGoneError", "newest_record"]


@dataclass(frozen=True)
class CheckpointVersion:
    """A committed state version (``format.PublishedVersion``): ``batch`` is the
    micro-batch whose commit made it (``version - 1``); ``sources`` what it had read."""

    version: int
    #: The store's partitions at this version (its batch's count: a repartition changes
    #: it, ``layout.state_partitions``): every one holds state (Spark commits each
    #: partition's store every batch).
    partitions: tuple[int, ...] = ()
    sources: BatchSources | None = None
    created_at: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def batch(self) -> int:
        return self.version - 1

    @property
    def position(self) -> Position:
        """Every partition's position: where the batch had read its sources to."""
        return self.sources.position if self.sources is not None else Position.empty()

    @property
    def source_end(self) -> dict[str, dict[int, int]] | None:
        """The sources' end offsets *now* (local stand-in topics; ``None`` for a Kafka
        broker's, which the checkpoint does not record): lag is measured against them."""
        end = self.sources.end_position() if self.sources is not None else None
        return end.to_map() if end is not None else None


class VersionGoneError(IqkitError, ValueError):
    """A state version Spark no longer keeps: its maintenance deleted the version's files,
    or its batch's offsets and commit log entries, since the version was listed (module
    docstring). A ``ValueError`` too: ``as_of`` of such a version fails ``iqkit.open``
    as any version it cannot serve does."""


def version_gone(objects: ObjectStore, store: str, version: int) -> VersionGoneError:
    """``version`` of ``store`` gone, in one line naming the newest committed version."""
    versions = committed_versions(objects)
    newest = f"the newest is {versions[-1]}" if versions else "no version is committed now"
    return VersionGoneError(
        f"store {store!r} version {version} is gone (Spark's maintenance deleted it); {newest}"
    )


def committed_versions(objects: ObjectStore) -> list[int]:
    """Every committed state version, ascending (module docstring)."""
    return [b + 1 for b in committed_batches(objects)]


def version_record(
    objects: ObjectStore, version: int, partitions: int | OperatorStore
) -> CheckpointVersion:
    """Version ``version`` of a store of ``partitions`` partitions, or of ``store`` with
    the count its batch recorded (``layout.state_partitions``); its batch's sources read
    from the offsets log."""
    metadata = batch_metadata(objects, version - 1)
    stamp = metadata.get("batchTimestampMs")
    if not isinstance(partitions, int):
        partitions = state_partitions(objects, partitions, version, metadata=metadata)
    return CheckpointVersion(
        version,
        tuple(range(partitions)),
        batch_sources(objects, version - 1),
        # The batch's own timestamp from the offsets log: when Spark ran it (the
        # versions' times for the version queries).
        created_at=stamp / 1000 if isinstance(stamp, int | float) else 0.0,
        metadata={"spark_batch_id": version - 1},
    )


#: How many times an unpinned reader lists the commits again when the newest version it
#: listed lost its offsets log entry before it was read (``newest_record``): each time,
#: Spark committed ``minBatchesToRetain`` batches in between.
_RELISTS = 3


def newest_record(objects: ObjectStore, store: OperatorStore) -> CheckpointVersion | None:
    """The newest committed version's record (``None``: nothing committed). Quirk: Spark
    purges old batches' offsets log entries while a query runs, so a reader slower than
    ``minBatchesToRetain`` batches finds the entry of the version it listed gone; it lists
    again and takes the newest then (a re-pin), and only after ``_RELISTS`` such races
    says the version is gone."""
    for _ in range(_RELISTS):
        versions = committed_versions(objects)
        if not versions:
            return None
        try:
            return version_record(objects, versions[-1], store)
        except ObjectMissingError:
            continue
    raise version_gone(objects, store.name, versions[-1])


class CheckpointSnapshot:
    """``store`` of the checkpoint ``objects`` for one reader; ``pinned``: serve that
    version (``ValueError`` naming the committed ones if it is not one yet,
    ``VersionGoneError`` if Spark no longer keeps it)."""

    def __init__(
        self,
        objects: ObjectStore,
        store: OperatorStore,
        manifest: StoreManifest,
        shape: StateShape,
        reader: StateReader,
        cache: FileCache,
        pinned: int | None,
    ) -> None:
        self.objects = objects
        self.store = store
        self.manifest = manifest
        self.shape = shape
        self.reader = reader
        self.cache = cache
        self.pinned = pinned
        self.record: CheckpointVersion | None = None
        self._open: dict[tuple[int, int], OpenPartition] = {}
        #: Partitions of versions an unpinned reader moved on from, closed once no scan
        #: of theirs still reads (``_retire``).
        self._retired: list[OpenPartition] = []
        #: Partitions the helper process was asked to build (``prebuild``), by version.
        self._ahead: dict[tuple[int, int], prebuild.Ahead] = {}
        if pinned is not None:
            versions = self.versions()
            if pinned not in versions:
                newest = self.latest_number()
                if newest is not None and pinned < newest:
                    raise version_gone(objects, manifest.name, pinned)
                listing = _describe(versions)
                raise ValueError(
                    f"store {manifest.name!r} has no committed version {pinned} "
                    f"(committed: {listing})"
                )
            try:
                self.record = self.published(pinned)
            except ObjectMissingError:  # its offsets log entry purged since the listing
                raise version_gone(objects, manifest.name, pinned) from None
        else:
            self.record = newest_record(objects, store)
        if self.record is not None:
            # The served version's own partition count, not the operator metadata's (a
            # repartition leaves that as it was): routing and fan-out use it.
            self.manifest = replace(manifest, partitions=len(self.record.partitions))

    # -- the served version ----------------------------------------------------------------
    def current(self) -> CheckpointVersion | None:
        if self._retired:
            self._close_retired()
        if self.pinned is not None:
            return self.record
        versions = committed_versions(self.objects)
        if versions and (self.record is None or self.record.version != versions[-1]):
            record = newest_record(self.objects, self.store)
            assert record is not None  # commits are purged oldest first, never all
            if len(record.partitions) != self.manifest.partitions:
                raise StoreCorruptedError(
                    f"store {self.manifest.name!r}: the checkpoint was repartitioned from "
                    f"{self.manifest.partitions} to {len(record.partitions)} partitions "
                    f"(version {record.version}) since it was opened; open it again"
                )
            self.record = record
            self._retire(record.version)
        return self.record

    def _retire(self, served: int) -> None:
        """Let go of the partitions of versions before ``served``: a reader kept open on a
        running query moves on every batch, and must not hold every version it served
        (their databases stay in the cache, for whoever asks for them again)."""
        for key in [key for key in self._open if key[0] != served]:
            self._retired.append(self._open.pop(key))
        self._ahead = {key: ahead for key, ahead in self._ahead.items() if key[0] == served}
        self._close_retired()

    def _close_retired(self) -> None:
        self._retired = close_unread(self._retired)

    def served(self) -> CheckpointVersion | IqkitError | None:
        try:
            return self.current()
        except IqkitError as exc:
            return exc

    def latest_number(self) -> int | None:
        versions = committed_versions(self.objects)
        return versions[-1] if versions else None

    def versions(self) -> list[int]:
        """Committed versions whose state Spark still keeps (``providers``: partition 0's
        files say), ascending."""
        oldest = self.reader.oldest_version(self.store)
        return [v for v in committed_versions(self.objects) if oldest is None or v >= oldest]

    # -- partitions ------------------------------------------------------------------------
    def partition(self, record: CheckpointVersion, p: int) -> OpenPartition:
        entry = self._open.get((record.version, p))
        if entry is None:
            ahead = self._ahead.pop((record.version, p), None)
            if ahead is not None:
                ahead.wait()  # the helper's build of it, if it has begun: found in the cache
            commit = encode_commit_record({"position": record.position, "version": record.version})
            with attributed(self.objects):  # a refusal names the Spark that wrote it
                try:
                    files = self.reader.version_files(self.store, p, record.version)
                except StateFileError:
                    if self._gone(record.version, p):
                        gone = version_gone(self.objects, self.manifest.name, record.version)
                        raise gone from None
                    raise
                try:
                    part = open_partition(
                        self.reader, self.shape, self.store, self.cache, record.version, p, commit,
                        building=lambda: self._build_ahead(record, p + 1, commit), files=files,
                    )  # fmt: skip
                except (StateFileError, ObjectMissingError):
                    if self._gone(record.version, p) or any(
                        not self.objects.exists(key) for key in files.keys
                    ):  # a file listed above, deleted since: only Spark's maintenance deletes
                        gone = version_gone(self.objects, self.manifest.name, record.version)
                        raise gone from None
                    raise
            entry = OpenPartition(part, build_layers(self.manifest, part, ReadCache()))
            entry.fetched = self.reader.trace_line(
                self.store, p, record.version, part.built, part.base_version
            )
            self._open[(record.version, p)] = entry
        return entry

    def _gone(self, version: int, p: int) -> bool:
        """Whether ``version``, which a file of partition ``p`` failed to read, is gone
        (module docstring), by a new listing: its batch's commit purged, or its state
        deleted, in partition ``p`` and in partition 0 (the one ``versions`` lists), as
        Spark's maintenance deletes every partition's. A file missing from a version
        Spark still keeps is damage, and its error says which file."""
        if version not in committed_versions(self.objects):
            return True
        for q in {0, p}:
            oldest = self.reader.oldest_version(self.store, q)
            if oldest is None or version >= oldest:
                return False
        return True

    def _build_ahead(self, record: CheckpointVersion, p: int, commit: bytes) -> None:
        """Have the helper process build partition ``p`` of ``record`` while this one
        builds the partition before it (``prebuild``): queries that read every partition
        ask for them in turn."""
        key = (record.version, p)
        if p < len(record.partitions) and key not in self._open and key not in self._ahead:
            ahead = prebuild.ask(
                self.objects, self.store.name, self.cache, record.version, p, commit
            )
            if ahead is not None:
                self._ahead[key] = ahead

    def position(self, record: CheckpointVersion, p: int) -> Position:
        return record.position

    def published(self, version: int, partition: int | None = None) -> CheckpointVersion:
        if self.record is not None and self.record.version == version:
            return self.record
        return version_record(self.objects, version, self.store)

    def version_walk(self, p: int, records: Mapping[int, Any]) -> OpenedVersionsWalk:
        """Each version's partition opened as a query of it opens it (replayed once per
        reader, the next built on the one before: ``materialize``); a version of another
        partition count than the one served is read through ``_RepartitionedWalk``."""
        return _RepartitionedWalk(self, p, dict(records))

    def reading(self) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext()

    @property
    def serves_key_lookups(self) -> bool:
        return False  # every query lists the commits first (``current``)

    def hot_partition(self, p: int) -> OpenPartition | None:
        return None

    def twin_files(self, record: Any) -> None:
        return None  # Spark's state has no columnar twins

    def scan_bytes(self, record: Any) -> dict[int, int]:
        return {}

    def close(self) -> None:
        self._ahead.clear()  # the helper's builds land in the cache, for whoever opens them
        entries, self._open = [*self._open.values(), *self._retired], {}
        self._retired = []
        for entry in entries:
            entry.partition.close()


def _describe(versions: list[int]) -> str:
    if not versions:
        return "none"
    if versions == list(range(versions[0], versions[-1] + 1)) and len(versions) > 3:
        return f"{versions[0]}-{versions[-1]}"
    return ", ".join(str(v) for v in versions)


class _RepartitionedWalk(OpenedVersionsWalk):
    """``OpenedVersionsWalk`` over versions whose partition count may differ from the one
    served (Spark 4.2+'s offline repartitioning): partition ``p`` of such a version is
    the keys its partitions held that Spark's hash with the served count puts in ``p``,
    each key read where that version's count put it. Versions of the served count are
    read as they are."""

    def __init__(self, snapshot: CheckpointSnapshot, partition: int, records: dict) -> None:
        super().__init__(snapshot, partition, records)
        self._served = snapshot.manifest.partitions
        self._partitioner = snapshot.shape.partitioner()
        self._store = snapshot.manifest.name

    def _count(self, version: int) -> int:
        count = len(self._records[version].partitions)
        if count != self._served and not self._partitioner.routes_keys:
            raise UnsupportedStateError(
                f"not supported yet: store {self._store!r} version {version} has {count} "
                f"partitions and the version served {self._served} (the checkpoint was "
                "repartitioned), and its keys cannot be routed (a window store): read "
                f"version {version} with as_of={version}"
            )
        return count

    def _own(self, version: int, q: int) -> Any:
        self._opened.add(version)
        return self._snapshot.partition(self._records[version], q).partition

    def _route(self, key: bytes, count: int) -> int | None:
        """The partition Spark's hash with ``count`` partitions puts the partition key
        ``key`` in (``None``: not a key-value row's key)."""
        if not key.startswith(DATA_PREFIX):
            return None
        return self._partitioner.partition(key[len(DATA_PREFIX) :], count)

    def get(self, version: int, key: bytes) -> bytes | None:
        count = self._count(version)
        if count == self._served:
            return super().get(version, key)
        if self._route(key, self._served) != self._p:
            return None  # not this partition's key in the layout served
        owner = self._route(key, count)
        return None if owner is None else self._own(version, owner).get(key)  # type: ignore[no-any-return]

    def get_many(self, version: int, keys: list[bytes]) -> list[bytes | None]:
        if self._count(version) == self._served:
            return super().get_many(version, keys)
        return [self.get(version, key) for key in keys]

    def scan(self, version: int, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
        count = self._count(version)
        if count == self._served:
            yield from super().scan(version, lower, upper)
            return
        mine = self._route
        scans = [
            (kv for chunk in self._own(version, q).scan_chunks(lower, upper) for kv in chunk)
            for q in range(count)
        ]
        # Each partition scans in key order: merged, the keys stay in order.
        for key, value in heapq.merge(*scans, key=lambda kv: kv[0]):
            if mine(key, self._served) == self._p:
                yield key, value
