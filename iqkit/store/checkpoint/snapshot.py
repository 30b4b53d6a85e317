"""One checkpoint store as one reader sees it: ``format.StoreSnapshot`` over Spark's state.

The version served is the pinned one (``as_of``) or the newest committed batch's state
(``layout``: state version N is the state after batch N - 1); a batch without a commit
file is never served, so a running query's half-written batch stays invisible. A
partition of a version is Spark's state files for it replayed (``providers``), decoded
and turned into iqkit's row layout (``shape``: a whole column at a time where its shape
allows, else row by row), then built into a database in the cache (``materialize``) and
served through the same query layers as every store; it is kept for the snapshot's life,
so each (partition, version) is read once per reader. While a partition is built, a
helper process builds the next one (``prebuild``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import IqkitError
from ...query.position import Position
from ..cache import FileCache
from ..format import OpenPartition
from ..manifest import StoreManifest
from ..objects import ObjectStore
from ..partitions.layers import ReadCache, build_layers
from ..partitions.partition import encode_commit_record
from ..versions import OpenedVersionsWalk
from . import prebuild
from .layout import OperatorStore, batch_metadata, committed_batches
from .materialize import open_partition
from .positions import BatchSources, batch_sources
from .providers import StateReader
from .shape import StateShape

__all__ = ["CheckpointSnapshot", "CheckpointVersion"]


@dataclass(frozen=True)
class CheckpointVersion:
    """A committed state version (``format.PublishedVersion``): ``batch`` is the
    micro-batch whose commit made it (``version - 1``); ``sources`` what it had read."""

    version: int
    #: The store's partitions: every one holds state in every version (Spark commits
    #: each partition's store every batch).
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


def committed_versions(objects: ObjectStore) -> list[int]:
    """Every committed state version, ascending (module docstring)."""
    return [b + 1 for b in committed_batches(objects)]


def version_record(objects: ObjectStore, version: int, partitions: int) -> CheckpointVersion:
    """Version ``version`` of a store of ``partitions`` partitions (its batch's sources
    read from the offsets log)."""
    stamp = batch_metadata(objects, version - 1).get("batchTimestampMs")
    return CheckpointVersion(
        version,
        tuple(range(partitions)),
        batch_sources(objects, version - 1),
        # The batch's own timestamp from the offsets log: when Spark ran it (the
        # versions' times for the version queries).
        created_at=stamp / 1000 if isinstance(stamp, int | float) else 0.0,
        metadata={"spark_batch_id": version - 1},
    )


class CheckpointSnapshot:
    """``store`` of the checkpoint ``objects`` for one reader; ``pinned``: serve that
    version (``ValueError`` naming the committed ones if it is not one)."""

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
        #: Partitions the helper process was asked to build (``prebuild``), by version.
        self._ahead: dict[tuple[int, int], prebuild.Ahead] = {}
        if pinned is not None:
            versions = self.versions()
            if pinned not in versions:
                listing = _describe(versions)
                raise ValueError(
                    f"store {manifest.name!r} has no committed version {pinned} "
                    f"(committed: {listing})"
                )
            self.record = version_record(objects, pinned, manifest.partitions)

    # -- the served version ----------------------------------------------------------------
    def current(self) -> CheckpointVersion | None:
        if self.pinned is not None:
            return self.record
        versions = committed_versions(self.objects)
        if versions and (self.record is None or self.record.version != versions[-1]):
            self.record = version_record(self.objects, versions[-1], self.manifest.partitions)
        return self.record

    def served(self) -> CheckpointVersion | IqkitError | None:
        try:
            return self.current()
        except IqkitError as exc:
            return exc

    def latest_number(self) -> int | None:
        versions = committed_versions(self.objects)
        return versions[-1] if versions else None

    def versions(self) -> list[int]:
        """Committed versions whose state Spark still keeps (``providers``), ascending."""
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
            part = open_partition(
                self.reader, self.shape, self.store, self.cache, record.version, p, commit,
                building=lambda: self._build_ahead(record, p + 1, commit),
            )  # fmt: skip
            entry = OpenPartition(part, build_layers(self.manifest, part, ReadCache()))
            entry.fetched = self.reader.trace_line(
                self.store, p, record.version, part.built, part.base_version
            )
            self._open[(record.version, p)] = entry
        return entry

    def _build_ahead(self, record: CheckpointVersion, p: int, commit: bytes) -> None:
        """Have the helper process build partition ``p`` of ``record`` while this one
        builds the partition before it (``prebuild``): queries that read every partition
        ask for them in turn."""
        key = (record.version, p)
        if p < self.manifest.partitions and key not in self._open and key not in self._ahead:
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
        return version_record(self.objects, version, self.manifest.partitions)

    def version_walk(self, p: int, records: Mapping[int, Any]) -> OpenedVersionsWalk:
        """Each version's partition opened as a query of it opens it (replayed once per
        reader, the next built on the one before: ``materialize``)."""
        return OpenedVersionsWalk(self, p, dict(records))

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
        entries, self._open = list(self._open.values()), {}
        for entry in entries:
            entry.partition.close()


def _describe(versions: list[int]) -> str:
    if not versions:
        return "none"
    if versions == list(range(versions[0], versions[-1] + 1)) and len(versions) > 3:
        return f"{versions[0]}-{versions[-1]}"
    return ", ".join(str(v) for v in versions)
