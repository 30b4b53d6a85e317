"""Creating stores and committing writes to them.

A ``StoreWriter`` buffers puts and deletes per partition (the last change per raw key)
and touches nothing until the ``with`` block ends. Then the root's format publishes them
(``format.StoreFormat.publisher``; the chain format's ``chain.stores.ChainPublisher``:
one delta SST per touched partition, then one exclusive create of the version record).
An exception in the block, or a failure at any step of the commit, publishes nothing:
readers keep seeing the previous version.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..query.position import Position
from ..query.request import validate_store_name
from ..query.window import LATEST_EPOCH_MS, to_epoch_millis
from .encoding import keyspace
from .encoding.partitioners import get_partitioner
from .encoding.serdes import Serde, get_serde
from .format import Publisher, StoreFormat
from .formats import format_for
from .inputs import store_partitions_fed_by
from .manifest import DEFAULT_RETENTION, STORE_SETTINGS, StoreManifest
from .roots import StoreRoot, parse_root

__all__ = ["STORE_SETTINGS", "StoreWriter", "create_store", "ensure_store", "store_format_of"]


def store_format_of(root: str | os.PathLike[str] | StoreRoot | StoreFormat) -> StoreFormat:
    """The format of ``root`` for the public entry points that take a root as the user
    gave it (parsed here, once) or an already chosen format (passed on)."""
    if isinstance(root, StoreFormat):
        return root
    return format_for(parse_root(root))


def create_store(
    root: str | os.PathLike[str] | StoreRoot | StoreFormat,
    name: str,
    *,
    partitions: int,
    kind: str = "kv",
    key_serde: str = "string",
    value_serde: str = "json",
    partitioner: str = "murmur2",
    window_size_ms: int | None = None,
    retention: int = DEFAULT_RETENTION,
    properties: Mapping[str, Any] | None = None,
) -> StoreManifest:
    """Create store ``name`` under ``root`` (creating ``root`` if needed).

    Creating a store that already exists with the same settings returns its manifest
    (like ``CREATE TABLE IF NOT EXISTS``); different settings raise ``StoreExistsError``
    naming them, since they would make the existing data unreadable or mis-routed.
    """
    manifest = StoreManifest(
        name=name,
        kind=kind,
        partitions=partitions,
        key_serde=key_serde,
        value_serde=value_serde,
        partitioner=partitioner,
        window_size_ms=window_size_ms,
        retention=retention,
        properties=dict(properties or {}),
    )
    return store_format_of(root).ensure_store(manifest, create=True)


def ensure_store(
    root: str | os.PathLike[str] | StoreRoot | StoreFormat,
    manifest: StoreManifest,
    *,
    settings: tuple[str, ...] = STORE_SETTINGS,
    asked: str = "asked",
    create: bool = False,
) -> StoreManifest:
    """The existing store's manifest when its ``settings`` equal ``manifest``'s, else
    ``StoreExistsError`` naming each difference (``asked`` says who wanted the other
    value, e.g. "the DataFrame needs"). A store that does not exist yet gets
    ``manifest``, written only when ``create``; the Spark writers create it when their
    job publishes, so a failed first write leaves no store. The one home of this check:
    ``create_store`` and every Spark writer call it.
    """
    return store_format_of(root).ensure_store(
        manifest, settings=settings, asked=asked, create=create
    )


class _PartitionBuffer:
    """One partition's buffered writes: the last change per raw key (``None``: a
    delete), in the order first written; every publisher reads them from here."""

    __slots__ = ("changes", "deletes", "position", "puts")

    def __init__(self) -> None:
        self.changes: dict[bytes, bytes | None] = {}
        self.position = Position.empty()
        self.puts = 0
        self.deletes = 0


class StoreWriter:
    """Buffers writes to one store and commits them atomically when the block ends.

    ``source=(topic, partition, offset)`` on a put or delete advances the position of
    the store partition the record lands in (offset = the last input record applied);
    ``record_applied({topic: {partition: offset}})`` says the store as a whole applied
    the input up to there (every partition the input feeds advances).
    A ``put`` of ``None`` is a delete, as in Kafka. ``writer.version`` is the version
    the commit published (``None`` before the commit, or when nothing was written).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | StoreRoot | StoreFormat,
        name: str,
        *,
        lock_timeout: float = 30.0,
        who: str | None = None,
    ) -> None:
        name = validate_store_name(name)
        self._publisher: Publisher = store_format_of(root).publisher(name)
        self.manifest = self._publisher.manifest
        self._key_serde: Serde = get_serde(self.manifest.key_serde)
        self._value_serde: Serde = get_serde(self.manifest.value_serde)
        self._partitioner = get_partitioner(self.manifest.partitioner)
        self._window = self.manifest.kind.windowed
        self._lock_timeout = lock_timeout
        self._who = who or "StoreWriter"
        self._buffers: dict[int, _PartitionBuffer] = {}
        self._source_end: Position | None = None
        self._metadata: dict[str, Any] = {}
        self._state = "open"
        self.version: int | None = None

    # -- the with-block ----------------------------------------------------------------
    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is not None:
            self.abort()
            return
        self.commit()

    # -- writing -------------------------------------------------------------------------
    def put(
        self,
        key: Any,
        value: Any,
        *,
        partition: int | None = None,
        source: tuple[str, int, int] | None = None,
        window_start: int | datetime | None = None,
    ) -> None:
        if value is None:
            self.delete(key, partition=partition, source=source, window_start=window_start)
            return
        key_bytes, _, buf = self._route(key, partition, source)
        value_bytes = self._serialize(self._value_serde, "value", value)
        if self._window:
            start = self._window_start(window_start)
            buf.changes[keyspace.window_key(key_bytes, start)] = value_bytes
            buf.changes[keyspace.window_time_key(key_bytes, start)] = b""
        else:
            self._no_window(window_start)
            buf.changes[keyspace.kv_key(key_bytes)] = value_bytes
        buf.puts += 1

    def delete(
        self,
        key: Any,
        *,
        partition: int | None = None,
        source: tuple[str, int, int] | None = None,
        window_start: int | datetime | None = None,
    ) -> None:
        key_bytes, _, buf = self._route(key, partition, source)
        if self._window:
            start = self._window_start(window_start)
            buf.changes[keyspace.window_key(key_bytes, start)] = None
            buf.changes[keyspace.window_time_key(key_bytes, start)] = None
        else:
            self._no_window(window_start)
            buf.changes[keyspace.kv_key(key_bytes)] = None
        buf.deletes += 1

    def advance(self, partition: int, source: tuple[str, int, int]) -> None:
        """Advance a store partition's position without writing data.

        For input records that changed nothing (filtered, or equal to the stored value):
        the store has still applied them, so bounds and lag should count them.
        """
        self._check_open()
        self._check_partition(partition)
        self._buffer(partition).position = self._advanced(self._buffer(partition).position, source)

    def record_applied(self, applied: Position | Mapping[str, Mapping[int, int]]) -> None:
        """Say that every input record up to these offsets is applied to the store:
        ``{topic: {partition: offset}}``, offset = the last record applied (Kafka
        Streams' ``Position`` convention, as ``source=``).

        ``source=`` on a put advances only the partition the record lands in; but in a
        ``murmur2`` store every partition reads every input partition, so a partition no
        record reached has still applied the input, and without this call bounds would
        fail on it and lag would count records that can never reach it. This advances the
        position of every store partition the input feeds (``store/inputs.py``): all
        partitions of a ``murmur2`` store, partition ``p`` of an ``explicit`` store for
        input partition ``p`` — the streaming sink does the same for each micro-batch.
        An input partition that feeds no store partition is refused (``ValueError``).
        """
        self._check_open()
        position = self._position(applied, "record_applied")
        n = self.manifest.partitions
        advanced: dict[int, Position] = {}
        for topic in sorted(position.topics):
            for in_p, offset in sorted(position.partition_positions(topic).items()):
                fed = store_partitions_fed_by(self._partitioner, in_p, n)
                if not fed:
                    raise ValueError(
                        f"store {self.manifest.name!r}: record_applied: input partition "
                        f"{in_p} of {topic!r} feeds no partition of this {n}-partition "
                        f"{self.manifest.partitioner} store"
                    )
                for p in fed:
                    advanced[p] = advanced.get(p, Position.empty()).with_component(
                        topic, in_p, offset
                    )
        for p, applied_here in advanced.items():  # checked everything first: all or nothing
            buf = self._buffer(p)
            buf.position = buf.position.merge(applied_here)

    def record_source_end(self, end: Position | Mapping[str, Mapping[int, int]]) -> None:
        """Record the source's log-end offsets (for ``engine.lags()``) with this commit."""
        self._check_open()
        position = self._position(end, "record_source_end")
        self._source_end = position.merge(self._source_end) if self._source_end else position

    def set_metadata(self, **facts: Any) -> None:
        """Attach JSON-able facts to this commit's version record (e.g. a batch id)."""
        self._check_open()
        self._metadata.update(facts)

    # -- committing ----------------------------------------------------------------------
    def abort(self) -> None:
        """Discard everything buffered; nothing is written."""
        self._buffers.clear()
        self._state = "aborted"

    def commit(self) -> int | None:
        """Publish the buffered writes as the store's next version; return its number.

        With nothing buffered (no data, no position, no source end, no metadata) nothing
        is published and the latest existing version is returned.
        """
        self._check_open()
        self._state = "committing"
        try:
            if not (self._buffers or self._source_end or self._metadata):
                self.version = self._publisher.latest_number()
            else:
                self.version = self._publisher.publish(
                    self._buffers,
                    source_end=self._source_end,
                    metadata=self._metadata,
                    who=self._who,
                    lock_timeout=self._lock_timeout,
                )
        except BaseException:
            self._state = "failed"
            self._buffers.clear()
            raise
        self._state = "committed"
        self._buffers.clear()
        return self.version

    # -- helpers -------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"StoreWriter for {self.manifest.name!r} is {self._state}")

    def _check_partition(self, partition: object) -> int:
        n = self.manifest.partitions
        if not isinstance(partition, int) or isinstance(partition, bool) or not 0 <= partition < n:
            raise ValueError(
                f"store {self.manifest.name!r}: partition must be an int in [0, {n}), "
                f"got {partition!r}"
            )
        return partition

    def _position(self, value: Position | Mapping[str, Mapping[int, int]], what: str) -> Position:
        if isinstance(value, Position):
            return value
        try:
            return Position.from_map(value)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"store {self.manifest.name!r}: {what}: {exc}") from None

    def _buffer(self, partition: int) -> _PartitionBuffer:
        buf = self._buffers.get(partition)
        if buf is None:
            buf = self._buffers[partition] = _PartitionBuffer()
        return buf

    def _serialize(self, serde: Serde, what: str, value: Any) -> bytes:
        try:
            return serde.serialize(value)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"store {self.manifest.name!r}: {what} {exc}") from None

    def _route(
        self, key: Any, partition: int | None, source: tuple[str, int, int] | None
    ) -> tuple[bytes, int, _PartitionBuffer]:
        self._check_open()
        if key is None:
            raise ValueError(f"store {self.manifest.name!r}: key must not be None")
        key_bytes = self._serialize(self._key_serde, "key", key)
        n = self.manifest.partitions
        if self._partitioner.routes_keys:
            owner = self._partitioner.partition(key_bytes, n)
            if partition is not None and partition != owner:
                raise ValueError(
                    f"store {self.manifest.name!r}: key {key!r} belongs to partition {owner} "
                    f"under murmur2, not {partition} "
                    "(use partitioner='explicit' to place keys yourself)"
                )
            p = owner
        else:
            if partition is None:
                raise ValueError(
                    f"store {self.manifest.name!r} uses the explicit partitioner: pass partition="
                )
            p = self._check_partition(partition)
        buf = self._buffer(p)
        if source is not None:
            buf.position = self._advanced(buf.position, source)
        return key_bytes, p, buf

    def _advanced(self, position: Position, source: tuple[str, int, int]) -> Position:
        try:
            topic, in_partition, offset = source
        except (TypeError, ValueError):
            raise ValueError(
                f"store {self.manifest.name!r}: source must be (topic, partition, offset), "
                f"got {source!r}"
            ) from None
        return position.with_component(topic, in_partition, offset)

    def _window_start(self, window_start: int | datetime | None) -> int:
        if window_start is None:
            raise ValueError(f"store {self.manifest.name!r} is a window store: pass window_start=")
        start = to_epoch_millis(window_start, f"store {self.manifest.name!r}: window_start")
        size = self.manifest.window_size_ms
        assert size is not None  # a window store's manifest always has one
        if start > LATEST_EPOCH_MS - size:
            # Its end (start + size, what queries return as Windowed.end) would not fit.
            raise ValueError(
                f"store {self.manifest.name!r}: window_start {start} with the store's "
                f"{size} ms windows ends after the last 64-bit epoch millisecond (2**63-1)"
            )
        return start

    def _no_window(self, window_start: object) -> None:
        if window_start is not None:
            raise ValueError(
                f"store {self.manifest.name!r} is a key-value store: window_start is not allowed"
            )

    def __repr__(self) -> str:
        touched = sorted(self._buffers)
        return f"StoreWriter({self.manifest.name!r}, {self._state}, partitions touched={touched})"
