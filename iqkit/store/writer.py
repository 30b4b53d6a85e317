"""Creating stores and committing writes to them.

A ``StoreWriter`` buffers puts and deletes (the last change per raw key wins) and
touches nothing of the store until the ``with`` block ends. Then the root's format
publishes them (``format.StoreFormat.publisher``; the chain format's
``chain.stores.ChainPublisher``: one delta SST per touched partition, then one exclusive
create of the version record). An exception in the block, or a failure at any step of
the commit, publishes nothing: readers keep seeing the previous version.

Why puts are buffered as they are (docs/DECISIONS.md "Writers"): a put only serializes
and appends to three lists; a key-value store's murmur2 partition is computed later, for
many keys at once (``murmur2_partition_many``), unless the put names a partition or a
source. Past ``FLUSH_ROWS`` pending puts, they go to a ``SortedRows`` as Arrow columns
(about a third of the bytes of Python objects), which spills runs to local disk past
``memory_budget`` bytes: a commit of any size fits a fixed budget, and its rows reach the
SST and the twin from Arrow, each partition sorted (and its runs merged) as it is read.
A small commit never imports pyarrow's compute functions: its rows are routed and sorted
in Python.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..query.position import Position
from ..query.request import validate_store_name
from ..query.window import LATEST_EPOCH_MS, to_epoch_millis
from .encoding import keyspace
from .encoding.partitioners import get_partitioner
from .encoding.serde_arrow import binary_array
from .encoding.serdes import Serde, get_serde
from .format import Publisher, StoreFormat
from .formats import format_for
from .inputs import store_partitions_fed_by
from .manifest import DEFAULT_RETENTION, STORE_SETTINGS, StoreManifest
from .roots import StoreRoot, parse_root
from .table_plan import TablePlan, arrow_table

if TYPE_CHECKING:
    import pyarrow as pa

    from .sorted_rows import SortedRows

__all__ = [
    "STORE_SETTINGS",
    "StoreWriter",
    "compact",
    "create_store",
    "ensure_store",
    "store_format_of",
]


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


def compact(
    root: str | os.PathLike[str] | StoreRoot | StoreFormat,
    name: str,
    *,
    lock_timeout: float = 30.0,
    who: str = "iqkit.compact",
) -> int | None:
    """Compact every partition of store ``name`` whose chain has deltas into one base,
    published as the store's next version (the same rows, positions and change feed:
    Delta Lake's ``OPTIMIZE``); its number, or None when there was nothing to compact.
    Commits compact on their own, in the background; this is for doing it now."""
    name = validate_store_name(name)
    publisher = store_format_of(root).publisher(name)
    return publisher.compact(who=who, lock_timeout=lock_timeout)


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


#: How a commit that makes a chain too long has it compacted: inside the commit (the
#: default: every version is a commit's), or by a version of its own on a thread
#: (docs/DECISIONS.md "Compaction").
COMPACTION_MODES = ("inline", "background")

#: Pending puts handed to the Arrow buffer (``SortedRows``) at a time.
FLUSH_ROWS = 65_536

#: Default bytes of Arrow rows a writer holds in memory before it spills a run.
DEFAULT_MEMORY_BUDGET = 256 * 1024 * 1024

#: A pending put's partition when it is routed by the store's partitioner at flush time.
_ROUTE_LATER = -1


class _PartitionBuffer:
    """What a commit hands the publisher for one partition (``chain.stores.Buffered``):
    its changes (sorted by raw key, each key once; ``None``: a delete; a list, or
    ``ArrowRows`` for rows that went through the Arrow buffer), its position and its
    counts."""

    __slots__ = ("changes", "deletes", "position", "puts")

    def __init__(self) -> None:
        self.changes: Iterable[tuple[bytes, bytes | None]] = ()
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
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        compaction: str = "inline",
    ) -> None:
        name = validate_store_name(name)
        self._publisher: Publisher = store_format_of(root).publisher(name)
        self.manifest = self._publisher.manifest
        self._key_serde: Serde = get_serde(self.manifest.key_serde)
        self._value_serde: Serde = get_serde(self.manifest.value_serde)
        self._partitioner = get_partitioner(self.manifest.partitioner)
        self._window = self.manifest.kind.windowed
        self._lock_timeout = lock_timeout
        if compaction not in COMPACTION_MODES:
            raise ValueError(
                f"store {name!r}: compaction must be one of {list(COMPACTION_MODES)}, "
                f"got {compaction!r}"
            )
        self._compaction = compaction
        #: The background compaction this writer's commit started (a ``threading.Thread``;
        #: ``join()`` waits for it), or None.
        self.compacting: Any = None
        self._who = who or "StoreWriter"
        self._buffers: dict[int, _PartitionBuffer] = {}
        # Pending puts and deletes, in the order written: raw keys, values (None: a
        # delete) and partitions (_ROUTE_LATER: routed at flush).
        self._keys: list[bytes] = []
        self._values: list[bytes | None] = []
        self._parts: list[int] = []
        self._route_later = self._partitioner.routes_keys and not self._window
        self._memory_budget = memory_budget
        self._sorted: SortedRows | None = None  # once more than FLUSH_ROWS were pending
        #: put_table's own columns a twin can be made of: (first sequence number, batch).
        self._twin_sources: list[tuple[int, pa.RecordBatch]] = []
        self._twin_bytes: int | None = 0  # None: over the budget, none kept
        self._twin_table: tuple[pa.Table, Any, Any, Any] | None = None  # _twin_index
        self._seq = 0
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
        if (
            self._route_later
            and partition is None
            and source is None
            and window_start is None
            and value is not None
            and key is not None
            and self._state == "open"
        ):
            # The common put (a key-value store's row, routed at the flush): one call per
            # serde, three appends; anything refused falls through to say why, below.
            try:
                key_bytes = self._key_serde.serialize(key)
                value_bytes = self._value_serde.serialize(value)
            except (TypeError, ValueError):
                pass
            else:
                self._keys.append(keyspace.kv_key(key_bytes))
                self._values.append(value_bytes)
                self._parts.append(_ROUTE_LATER)
                if len(self._keys) >= FLUSH_ROWS:
                    self._flush()
                return
        if value is None:
            self.delete(key, partition=partition, source=source, window_start=window_start)
            return
        key_bytes, p = self._route(key, partition, source)
        value_bytes = self._serialize(self._value_serde, "value", value)
        if self._window:
            start = self._window_start(window_start)
            self._pend(keyspace.window_key(key_bytes, start), value_bytes, p)
            self._pend(keyspace.window_time_key(key_bytes, start), b"", p)
        else:
            self._no_window(window_start)
            self._pend(keyspace.kv_key(key_bytes), value_bytes, p)

    def delete(
        self,
        key: Any,
        *,
        partition: int | None = None,
        source: tuple[str, int, int] | None = None,
        window_start: int | datetime | None = None,
    ) -> None:
        key_bytes, p = self._route(key, partition, source)
        if self._window:
            start = self._window_start(window_start)
            self._pend(keyspace.window_key(key_bytes, start), None, p)
            self._pend(keyspace.window_time_key(key_bytes, start), None, p)
        else:
            self._no_window(window_start)
            self._pend(keyspace.kv_key(key_bytes), None, p)

    def put_table(
        self,
        data: Any,
        *,
        key: str | Sequence[str],
        value: str | None = None,
        partition: str | None = None,
    ) -> int:
        """Put every row of ``data`` — a pyarrow ``Table`` or ``RecordBatch``, or a pandas
        ``DataFrame`` — with no Python work per row; returns the number of rows.

        ``key``: the key column, or several (a composite key: an ``ordered`` store's
        tuples). ``value``: the value column (a null value deletes the key, as a ``None``
        put does); ``None``: every other column as one JSON record per row (a ``json``
        store; null fields left out), written as ``df.write.format("iqkit")`` writes it.
        ``partition``: an ``explicit`` store's partition column. Later rows win, over
        earlier rows and earlier puts alike. Key-value stores only (a window store's
        rows name their windows: ``put(..., window_start=)``).
        """
        self._check_open()
        name = self.manifest.name
        if self._window:
            raise ValueError(
                f"store {name!r} is a window store: put_table writes key-value stores "
                "(put each window with put(..., window_start=))"
            )
        table = arrow_table(data, name)
        keys = (key,) if isinstance(key, str) else tuple(key)
        plan = TablePlan.of(self.manifest, table, keys, value, partition)
        self._flush()
        for batch in table.to_batches(max_chunksize=FLUSH_ROWS):
            encoded = plan.encode(batch)
            if plan.twin_names is not None:  # the twin is made of these columns (commit)
                self._keep_twin_source(batch.select(list(plan.twin_names)))
            self._add_encoded(*encoded)
        return table.num_rows

    def _keep_twin_source(self, columns: pa.RecordBatch) -> None:
        """Keep ``columns`` (of the rows about to be added) for the twin, while all that is
        kept fits the memory budget; past it, none are (a commit's memory stays bounded:
        its twins are shaped from the stored rows instead, more slowly)."""
        if self._twin_bytes is None:
            return
        self._twin_bytes += columns.nbytes
        if self._twin_bytes > self._memory_budget:
            self._twin_sources, self._twin_bytes = [], None
            return
        self._twin_sources.append((self._seq, columns))

    def _twin_columns(self, seqs: pa.Array) -> pa.Table | None:
        """The columns ``put_table`` kept of the rows with sequence numbers ``seqs`` (a
        twin is made of them: ``twins.TwinWriter``), or None when a row has none (it
        was a ``put``)."""
        import numpy as np
        import pyarrow as pa

        index = self._twin_index()
        if index is None or not len(seqs):
            return None
        table, starts, sizes, offsets = index
        wanted = np.asarray(seqs, dtype=np.int64)
        source = np.searchsorted(starts, wanted, side="right") - 1
        if (source < 0).any():
            return None
        within = wanted - starts[source]
        if (within >= sizes[source]).any():
            return None
        return table.take(pa.array(offsets[source] + within))

    def _twin_index(self) -> tuple[pa.Table, Any, Any, Any] | None:
        """The kept columns as one table, with each kept batch's first sequence number,
        size and first row in that table: built once, at the commit's first look-up
        (None: nothing kept, or batches of different columns)."""
        import numpy as np
        import pyarrow as pa

        if self._twin_table is None and self._twin_sources:
            sources, self._twin_sources = self._twin_sources, []
            if len({t.schema for _, t in sources}) == 1:
                starts = np.array([start for start, _ in sources], dtype=np.int64)
                sizes = np.array([t.num_rows for _, t in sources], dtype=np.int64)
                offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
                table = pa.Table.from_batches([t for _, t in sources])
                self._twin_table = (table, starts, sizes, offsets)
        return self._twin_table

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
        self._discard()
        self._state = "aborted"

    def commit(self) -> int | None:
        """Publish the buffered writes as the store's next version; return its number.

        With nothing buffered (no data, no position, no source end, no metadata) nothing
        is published and the latest existing version is returned.
        """
        self._check_open()
        self._state = "committing"
        try:
            with self._sorted_changes():
                if not (self._buffers or self._source_end or self._metadata):
                    self.version = self._publisher.latest_number()
                else:
                    self.version = self._publisher.publish(
                        self._buffers,
                        source_end=self._source_end,
                        metadata=self._metadata,
                        who=self._who,
                        lock_timeout=self._lock_timeout,
                        compaction=self._compaction,
                    )
                    self.compacting = self._publisher.background
        except BaseException:
            self._state = "failed"
            self._discard()
            raise
        self._state = "committed"
        self._discard()
        return self.version

    # -- the buffer ----------------------------------------------------------------------
    def _pend(self, raw_key: bytes, value: bytes | None, partition: int) -> None:
        self._keys.append(raw_key)
        self._values.append(value)
        self._parts.append(partition)
        if len(self._keys) >= FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        """Hand the pending puts to the Arrow buffer (module docstring), routed and
        counted per partition there, column by column."""
        if not self._keys:
            return
        import numpy as np
        import pyarrow as pa

        keys = binary_array(self._keys)
        values = pa.array(self._values, pa.binary())
        parts = np.fromiter(self._parts, dtype=np.int32, count=len(self._parts))
        later = parts == _ROUTE_LATER
        if later.any():
            routed = keys if later.all() else keys.filter(pa.array(later))
            # a kv store's raw key is its prefix byte and the serialized key
            routed = keyspace.unprefixed_arrow(routed, keyspace.RAW_PREFIX_LEN)
            parts[later] = self._partitioner.partition_many(routed, self.manifest.partitions)
        self._keys, self._values, self._parts = [], [], []
        self._add_encoded(pa.array(parts), keys, values)

    def _add_encoded(
        self, parts: pa.Array, keys: pa.Array, values: pa.Array, order: Any = None
    ) -> None:
        """Rows with their partitions, RocksDB keys and value bytes (null: a delete), in
        the order written, or ``order`` (their places in it: ``TablePlan.encode``),
        counted and handed to the Arrow buffer."""
        import numpy as np
        import pyarrow as pa

        from .sorted_rows import SortedRows  # pyarrow compute: a big commit's only

        n = len(keys)
        deletes = np.asarray(values.is_null())
        self._count(np.asarray(parts), deletes)
        if self._sorted is None:
            self._sorted = SortedRows(spill_bytes=self._memory_budget)
        placed = np.arange(n, dtype=np.int64) if order is None else order.astype(np.int64)
        self._sorted.add(keys, values, pa.array(placed + self._seq), parts)
        self._seq += n

    def _count(self, parts: Any, deletes: Any) -> None:
        """Add puts and deletes per partition (a window store writes two rows a put)."""
        import numpy as np

        n = self.manifest.partitions
        per_put = 2 if self._window else 1
        put_counts = np.bincount(parts[~deletes], minlength=n) // per_put
        delete_counts = np.bincount(parts[deletes], minlength=n) // per_put
        for p in np.flatnonzero(put_counts + delete_counts).tolist():
            buf = self._buffer(p)
            buf.puts += int(put_counts[p])
            buf.deletes += int(delete_counts[p])

    @contextlib.contextmanager
    def _sorted_changes(self) -> Iterator[None]:
        """Each touched partition's changes, sorted, in its buffer (``_PartitionBuffer``)
        while the block runs: from the Arrow buffer when puts reached it, else routed and
        sorted here."""
        if self._sorted is None:
            self._sort_pending()
            yield
            return
        self._flush()
        with self._sorted.by_partition() as parts:
            for p, rows in parts.items():
                rows.twin_columns = self._twin_columns
                self._buffer(p).changes = rows
            yield

    def _sort_pending(self) -> None:
        changes: dict[int, dict[bytes, bytes | None]] = {}
        per_put = 2 if self._window else 1
        route = self._partitioner.partition
        n = self.manifest.partitions
        for raw, value, p in zip(self._keys, self._values, self._parts, strict=True):
            if p == _ROUTE_LATER:
                p = route(raw[keyspace.RAW_PREFIX_LEN :], n)  # the serialized key
            rows = changes.get(p)
            if rows is None:
                rows = changes[p] = {}
                buf = self._buffer(p)
            else:
                buf = self._buffers[p]
            rows[raw] = value
            if value is None:
                buf.deletes += 1
            else:
                buf.puts += 1
        if per_put == 2:
            for p in changes:
                buf = self._buffers[p]
                buf.puts //= 2
                buf.deletes //= 2
        for p, rows in changes.items():
            self._buffers[p].changes = sorted(rows.items())
        self._keys, self._values, self._parts = [], [], []

    def _discard(self) -> None:
        self._buffers.clear()
        self._twin_sources, self._twin_bytes, self._twin_table = [], 0, None
        self._keys, self._values, self._parts = [], [], []
        if self._sorted is not None:
            self._sorted.close()
            self._sorted = None

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
    ) -> tuple[bytes, int]:
        """The key's bytes and its partition (``_ROUTE_LATER`` when the flush routes it:
        nothing here needs to know it)."""
        self._check_open()
        if key is None:
            raise ValueError(f"store {self.manifest.name!r}: key must not be None")
        key_bytes = self._serialize(self._key_serde, "key", key)
        if self._route_later and partition is None and source is None:
            return key_bytes, _ROUTE_LATER
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
        if source is not None:
            buf = self._buffer(p)
            buf.position = self._advanced(buf.position, source)
        return key_bytes, p

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
