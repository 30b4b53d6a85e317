"""The store layers a query passes through, outermost first (as in Kafka Streams):

``TypedKeyValueLayer`` / ``TypedWindowLayer``
    turn typed queries into byte-level reads: serialize keys and bounds with the
    store's serdes, deserialize what comes back, build window results;
``CachingLayer``
    a read cache for key lookups. Published versions are immutable, so a cached answer
    never goes stale; ``KeyQuery.skip_cache()`` bypasses it for both reading and filling;
``RocksDBLayer``
    the partition's RocksDB: ``get``, batched multi-get, bounded iterators.

With execution info enabled, each layer appends ``"Handled in <layer> in <N>ns: ..."``
with what it did (rows, bytes, cache hit or miss, version served). Lines are appended
innermost first, because a layer knows its own time only when the layers below return.
Without execution info the layers do no timing and build no strings.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import chain, repeat
from typing import Any

from ...errors import IqkitError, StoreCorruptedError
from ...query import (
    KeyQuery,
    KeyValue,
    KeyValueIterator,
    MultiKeyQuery,
    PrefixScanQuery,
    Query,
    RangeQuery,
    RawKeyQuery,
    RawScanQuery,
    ResultOrder,
    Windowed,
    WindowKeyQuery,
    WindowRangeQuery,
)
from ..encoding import keyspace
from ..encoding.serdes import Serde, get_serde
from ..kinds import StoreKind
from ..manifest import StoreManifest
from ..rows import value_decoders
from .partition import BytesPartition

#: Rows per chunk of a scan read from twins: what a RocksDB scan's chunks grow to
#: (``rocks.MAX_CHUNK_ROWS``; not imported, so this module never imports rocksdict).
TWIN_CHUNK_ROWS = 1024

_MISSING = object()


class Trace:
    """Execution-info lines of one partition's execution; inert when disabled."""

    __slots__ = ("enabled", "lines")

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.lines: list[str] = []

    def add(self, layer: str, started_ns: int, detail: str) -> None:
        self.lines.append(
            f"Handled in {layer} in {time.perf_counter_ns() - started_ns}ns: {detail}"
        )


#: The disabled trace of untraced lookups (inert: it records nothing).
_UNTRACED = Trace(False)


def _clock(trace: Trace) -> int:
    return time.perf_counter_ns() if trace.enabled else 0


# -- bytes layers --------------------------------------------------------------------------
#: Whether scans read columnar twins where a partition has them; set only through
#: ``twin_scans``.
_TWIN_SCANS = True


@contextlib.contextmanager
def twin_scans(enabled: bool) -> Iterator[None]:
    """Within the block, key-value scans read the partitions' columnar twins where they
    have them (``True``, the default) or RocksDB always (``False``): tests and
    benchmarks compare the two. Process-wide, like ``shaping.bulk_decode``; restored
    when the block ends, however it ends."""
    global _TWIN_SCANS
    old, _TWIN_SCANS = _TWIN_SCANS, enabled
    try:
        yield
    finally:
        _TWIN_SCANS = old


def twin_scans_enabled() -> bool:
    """Whether scans read columnar twins now (``twin_scans``): what the SQL layer's
    twin-backed tables follow too, so one switch compares every path."""
    return _TWIN_SCANS


class RocksDBLayer:
    """The bottom layer: reads the partition's published RocksDB version."""

    name = "RocksDBLayer"

    def __init__(self, partition: BytesPartition) -> None:
        self.partition = partition
        self._where = f"version {partition.written_by_version} ({partition.location})"

    def get(self, key: bytes, trace: Trace) -> bytes | None:
        if not trace.enabled:
            return self.partition.get(key)
        t0 = time.perf_counter_ns()
        value = self.partition.get(key)
        found = f"found, {len(value)} bytes" if value is not None else "not found"
        trace.add(self.name, t0, f"get 1 key ({found}) from {self._where}")
        return value

    def multi_get(self, keys: Sequence[bytes], trace: Trace) -> list[bytes | None]:
        t0 = _clock(trace)
        values = self.partition.multi_get(keys)
        if trace.enabled:
            found = [v for v in values if v is not None]
            trace.add(
                self.name,
                t0,
                f"multi-get {len(keys)} keys ({len(found)} found, "
                f"{sum(map(len, found))} bytes) from {self._where}",
            )
        return values

    def scan_chunks(
        self, lower: bytes, upper: bytes | None, reverse: bool, trace: Trace
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        t0 = _clock(trace)
        rows = self.partition.scan_chunks(lower, upper, reverse=reverse)
        if trace.enabled:
            direction = "reverse" if reverse else "forward"
            trace.add(
                self.name,
                t0,
                f"opened {direction} bounded iterator [{lower.hex()}, "
                f"{upper.hex() if upper is not None else '∞'}) on {self._where}",
            )
        return rows

    def database_open(self) -> bool:
        """Whether the partition's RocksDB is open now (a partition without twins is
        always read through it)."""
        return bool(getattr(self.partition, "is_open", True))

    def twinned(self) -> bool:
        """Whether scans may read the partition's columnar twins (it has them, and twin
        scans are on)."""
        return _TWIN_SCANS and bool(getattr(self.partition, "twinned", False))

    def twin_scan(
        self,
        lower: bytes,
        upper: bytes | None,
        reverse: bool,
        trace: Trace,
        *,
        rows_from_twins: bool = True,
    ) -> Any:
        """A planned scan of the partition's columnar twins (``store/columnar/scan.py``
        ``TwinScan``) for ``[lower, upper)``, or None when it has none (then scans read
        RocksDB). Planning reads the twins' footers, never the database.
        ``rows_from_twins``: whether iterated rows come from them too (else the trace
        says they come from RocksDB, and only table readers read the twins)."""
        plan = getattr(self.partition, "twin_scan", None)
        if plan is None or not _TWIN_SCANS:
            return None
        t0 = _clock(trace)
        scan = plan(lower, upper, reverse)
        if scan is not None and trace.enabled:
            rows = "" if rows_from_twins else "; rows iterated are read from RocksDB"
            trace.add("ColumnarScan", t0, f"{scan.trace_line()} of {self._where}{rows}")
        return scan


class ReadCache:
    """LRU of key bytes → value bytes (or a remembered miss) for one partition version."""

    __slots__ = ("_entries", "capacity", "hits", "misses")

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[bytes, Any] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def lookup(self, key: bytes) -> Any:
        value = self._entries.get(key, _MISSING)
        if value is _MISSING:
            self.misses += 1
        else:
            self.hits += 1
            self._entries.move_to_end(key)
        return value

    def store(self, key: bytes, value: bytes | None) -> None:
        self._entries[key] = value
        if len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class CachingLayer:
    """Key lookups answered from ``ReadCache`` when possible."""

    name = "CachingLayer"

    def __init__(self, inner: RocksDBLayer, cache: ReadCache) -> None:
        self.inner = inner
        self.cache = cache

    def get(self, key: bytes, trace: Trace, skip_cache: bool) -> bytes | None:
        t0 = _clock(trace)
        if skip_cache:
            value = self.inner.get(key, trace)
            if trace.enabled:
                trace.add(self.name, t0, "skipped (skip_cache)")
            return value
        value = self.cache.lookup(key)
        if value is not _MISSING:
            if trace.enabled:
                trace.add(self.name, t0, "cache hit")
            return value
        value = self.inner.get(key, trace)
        self.cache.store(key, value)
        if trace.enabled:
            trace.add(self.name, t0, "cache miss")
        return value

    def multi_get(
        self, keys: Sequence[bytes], trace: Trace, skip_cache: bool
    ) -> list[bytes | None]:
        t0 = _clock(trace)
        if skip_cache:
            values = self.inner.multi_get(keys, trace)
            if trace.enabled:
                trace.add(self.name, t0, "skipped (skip_cache)")
            return values
        cached = [self.cache.lookup(k) for k in keys]
        missing = [k for k, v in zip(keys, cached, strict=True) if v is _MISSING]
        if missing:
            fetched = dict(zip(missing, self.inner.multi_get(missing, trace), strict=True))
            for k, v in fetched.items():
                self.cache.store(k, v)
            cached = [fetched[k] if v is _MISSING else v for k, v in zip(keys, cached, strict=True)]
        if trace.enabled:
            trace.add(
                self.name, t0, f"{len(keys) - len(missing)} cache hits, {len(missing)} misses"
            )
        return cached

    def scan_chunks(
        self, lower: bytes, upper: bytes | None, reverse: bool, trace: Trace
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        t0 = _clock(trace)
        rows = self.inner.scan_chunks(lower, upper, reverse, trace)
        if trace.enabled:
            trace.add(self.name, t0, "passed through (scans are not cached)")
        return rows

    def twin_scan(self, *args: Any, **kwargs: Any) -> Any:
        """``RocksDBLayer.twin_scan`` of the partition (scans are not cached)."""
        return self.inner.twin_scan(*args, **kwargs)


# -- typed layers --------------------------------------------------------------------------
class _TypedLayer:
    """Shared by the key-value and window typed layers: serdes and dispatch."""

    name = "TypedLayer"
    query_types: tuple[type[Query], ...] = ()

    def __init__(self, manifest: StoreManifest, inner: CachingLayer) -> None:
        self.store = manifest.name
        self.inner = inner
        self.key_serde: Serde = get_serde(manifest.key_serde)
        self.value_serde: Serde = get_serde(manifest.value_serde)
        #: How stored values are decoded: by the serde, except a typed store's declared
        #: decimal members, kept exact (``RowSchema.exact_value_decoder``).
        self.value_de, self.values_de = value_decoders(manifest)
        self._serdes = f"{manifest.key_serde}→{manifest.value_serde}"
        self._handlers: dict[type[Query], Callable[[Any, Trace], Any]] = {}

    def supports(self, query: Query) -> bool:
        return isinstance(query, self.query_types)

    def execute(self, query: Query, trace: Trace) -> Any:
        """Run ``query``; return the result value (a value, dict or KeyValueIterator)."""
        t0 = _clock(trace)
        handler = self._handlers[type(query)]
        result = handler(query, trace)
        if trace.enabled:
            trace.add(self.name, t0, f"{type(query).__name__} with serdes {self._serdes}")
        return result

    def serialize_key(self, key: Any, serde: Serde | None = None) -> bytes:
        serde = serde or self.key_serde
        try:
            return serde.serialize(key)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"store {self.store!r}: key {exc}") from None

    def _kv_chunk(
        self, strip: int
    ) -> Callable[[list[tuple[bytes, bytes]]], list[KeyValue[Any, Any]]]:
        """Decoder of one chunk of key-value rows: the serdes decode whole columns
        (``deserialize_many``) and ``KeyValue``s are built in C (``map``/``zip``), so the
        per-row Python work is one key slice."""
        return kv_chunk_decoder(self.key_serde.deserialize_many, self.values_de, strip)


def kv_chunk_decoder(
    keys_de: Callable[..., list[Any]], values_de: Callable[..., list[Any]], strip: int
) -> Callable[[Sequence[tuple[bytes, bytes]]], list[KeyValue[Any, Any]]]:
    """Decoder of one chunk of stored key-value rows into ``KeyValue``s, with the serdes'
    column decoders (keys after ``strip`` bytes of keyspace prefix): what a scan of
    RocksDB yields, and what a columnar twin's columns are shaped from."""

    def convert(chunk: Sequence[tuple[bytes, bytes]]) -> list[KeyValue[Any, Any]]:
        if not chunk:
            return []
        raw_keys, raw_values = zip(*chunk, strict=True)
        pairs = zip(keys_de(raw_keys, strip), values_de(raw_values), strict=True)
        return list(map(_tuple_new, _KEY_VALUE_TYPE, pairs))

    return convert


def _stream(
    chunks: Iterator[list[tuple[bytes, bytes]]],
    convert: Callable[[list[tuple[bytes, bytes]]], list[Any]],
) -> KeyValueIterator[Any, Any]:
    """A lazy ``KeyValueIterator`` over converted chunks, iterated in C (``chain``);
    closing or exhausting it closes ``chunks``, which releases the RocksDB iterator."""
    close = getattr(chunks, "close", None)
    return KeyValueIterator.of_key_values(chain.from_iterable(map(convert, chunks)), close)


class _ScanRows:
    """The source of a ``ScanIterator``: its chunks, decoded when first iterated, or
    nothing once they were handed over undecoded."""

    __slots__ = ("chunks", "convert", "started", "taken")

    def __init__(
        self,
        chunks: Iterator[list[tuple[bytes, bytes]]],
        convert: Callable[[list[tuple[bytes, bytes]]], list[Any]],
    ) -> None:
        self.chunks = chunks
        self.convert = convert
        self.started = False
        self.taken = False

    def __iter__(self) -> Iterator[KeyValue[Any, Any]]:
        self.started = True
        if self.taken:
            return iter(())
        return chain.from_iterable(map(self.convert, self.chunks))


class ScanIterator(KeyValueIterator[Any, Any]):
    """The iterator of a key-value store scan (range, prefix, raw scan), which can also
    hand its rows over as the bytes RocksDB holds.

    Why: decoding row by row (a ``json.loads`` and a ``KeyValue`` per row) is most of
    the cost of a big scan, and a reader that decodes whole columns at once
    (``iqkit.tables``, with Arrow) needs only the bytes. It still runs the same query
    (same bounds, order and version), so it cannot disagree with the rows it skips.
    """

    __slots__ = ("_plan_twin", "_rows", "_twin_scan", "decode", "key_offset", "twin")

    #: Turns a list of stored ``(key, value)`` bytes into the ``KeyValue`` rows this
    #: iterator yields for them (same values, same errors).
    decode: Callable[[list[tuple[bytes, bytes]]], list[KeyValue[Any, Any]]]
    #: Bytes of keyspace prefix before the serialized key in every stored key.
    key_offset: int

    @classmethod
    def over(
        cls,
        chunks: Iterator[list[tuple[bytes, bytes]]],
        convert: Callable[[list[tuple[bytes, bytes]]], list[KeyValue[Any, Any]]],
        key_offset: int,
    ) -> ScanIterator:
        """What ``_stream(chunks, convert)`` returns (rows decoded a chunk at a time,
        iterated in C, ``chunks`` closed with it), able to hand the chunks over."""
        rows = _ScanRows(chunks, convert)
        it = cls.of_key_values(rows, getattr(chunks, "close", None))
        assert isinstance(it, ScanIterator)
        it._rows, it.decode, it.key_offset, it.twin = rows, convert, key_offset, None
        it._twin_scan = it._plan_twin = None
        return it

    def plan_twin_when_taken(self, plan: Callable[[], Any]) -> None:
        """Leave the twins of this scan (read from RocksDB) to be planned by ``plan`` (a
        ``TwinScan`` or None) only if a reader takes them (``take_twin``): a scan whose
        rows are iterated then pays nothing for them."""
        self._plan_twin = plan

    def attach_twin(self, scan: Any) -> None:
        """Give this scan (read from RocksDB) the planned twin scan ``scan`` (a
        ``TwinScan``) for a reader that takes the rows as tables."""
        tables = scan.batches()
        rocks_close = self._on_close

        def close() -> None:  # the RocksDB chunks (never started) and the twin tables
            try:
                if rocks_close is not None:
                    rocks_close()
            finally:
                tables.close()

        self._on_close = close
        self.twin, self._twin_scan = tables, scan

    def has_twin(self) -> bool:
        """Whether ``take_twin`` would give the rows as twin tables (planning them now
        if they were left for a reader that takes them)."""
        plan, self._plan_twin = self._plan_twin, None
        if self.twin is None and plan is not None and not self._rows.started:
            scan = None if self.is_closed else plan()
            if scan is not None:  # else no twins to read: the rows come from the database
                self.attach_twin(scan)
        return self.twin is not None

    @classmethod
    def over_twins(
        cls,
        scan: Any,
        convert: Callable[[list[tuple[bytes, bytes]]], list[KeyValue[Any, Any]]],
        key_offset: int,
        stored: Callable[[Any], list[tuple[bytes, bytes]]] | None,
        rocksdb: Callable[[], Iterator[list[tuple[bytes, bytes]]]],
    ) -> ScanIterator:
        """A scan of the partition's columnar twins (``scan``, a ``TwinScan``): through
        ``take_twin``, the typed tables themselves; iterated, ``KeyValue`` rows decoded
        by ``convert`` exactly as RocksDB's would be, from the bytes the twins' columns
        give back (``stored`` of each table) or, where they cannot (``stored`` None:
        json and ordered values), from RocksDB (``rocksdb()``, opened when first read)."""
        tables = scan.batches()

        def chunks() -> Iterator[list[tuple[bytes, bytes]]]:
            if stored is None:
                yield from rocksdb()
                return
            # A RocksDB scan's chunk size: a reader that stops early (or whose engine
            # closes) decodes no more than that past where it stopped.
            for table in tables:
                for lo in range(0, table.num_rows, TWIN_CHUNK_ROWS):
                    if scan.closed:
                        return
                    yield stored(table.slice(lo, TWIN_CHUNK_ROWS))

        rows = chunks()

        def close() -> None:  # a generator not started ignores close(): close both
            rows.close()
            tables.close()

        it = cls.over(rows, convert, key_offset)
        it._on_close = close
        it.twin, it._twin_scan = tables, scan
        return it

    def take_twin(
        self, columns: Sequence[str] | None = None, *, keys: bool = True
    ) -> Iterator[Any] | None:
        """The rows as the twins' tables (``TwinScan.batches``: row columns plus the
        twin's own), when the scan reads twins and was not read from or closed; the
        iterator then yields nothing (as after ``take_chunks``). ``columns``: only these
        of the twins' columns are read (and ``__deleted``; ``__key`` too, except where
        the scan needs no keys, unless ``columns`` names it), for a reader that needs few
        of them (the Spark data source); ``keys`` False: a reader that drops ``__key``
        (it is then derived only where the scan needs it, ``TwinScan.keys``)."""
        if not self.has_twin() or self.take_chunks() is None:
            return None
        if columns is not None:
            self._twin_scan.columns = list(columns)  # read lazily: no table is read yet
        self._twin_scan.keys = keys
        return self.twin  # type: ignore[no-any-return]

    def take_chunks(self) -> Iterator[list[tuple[bytes, bytes]]] | None:
        """The rows, undecoded: lists of stored ``(key, value)`` bytes, in this
        iterator's order; ``None`` when it was read from or closed already.

        Afterwards the iterator itself yields nothing; closing it still closes the
        chunks (releasing the RocksDB iterator), so the taker can keep relying on it.
        """
        rows = self._rows
        if rows.started or self.is_closed:
            return None
        rows.started = rows.taken = True
        return rows.chunks


#: ``KeyValue`` without NamedTuple's Python-level ``__new__`` (hot in scans):
#: ``map(_tuple_new, _KEY_VALUE_TYPE, pairs)`` builds them in C.
_tuple_new = tuple.__new__
_KEY_VALUE_TYPE = repeat(KeyValue)
_new_kv = partial(tuple.__new__, KeyValue)


class TypedKeyValueLayer(_TypedLayer):
    name = "TypedKeyValueLayer"
    query_types = StoreKind.KEY_VALUE.query_types

    def __init__(self, manifest: StoreManifest, inner: CachingLayer) -> None:
        super().__init__(manifest, inner)
        self._handlers = {
            KeyQuery: self._key,
            MultiKeyQuery: self._multi_key,
            RangeQuery: self._range,
            PrefixScanQuery: self._prefix,
            RawKeyQuery: self._raw_key,
            RawScanQuery: self._raw_scan,
        }

    def execute_key(self, key_bytes: bytes, skip_cache: bool) -> Any:
        """An untraced KeyQuery whose key the engine already serialized (to route it): the
        engine's key-lookup path."""
        key = keyspace.DATA_PREFIX + key_bytes
        caching = self.inner
        if skip_cache:
            # What the caching and RocksDB layers do here, without their calls: a skipped
            # cache passes the key down and an untraced RocksDB layer only reads; else
            # the cache answers, or the partition's value is read and remembered.
            raw = caching.inner.partition.get(key)
        else:
            cache = caching.cache
            raw = cache.lookup(key)
            if raw is _MISSING:
                raw = caching.inner.partition.get(key)
                cache.store(key, raw)
        return None if raw is None else self.value_de(raw)

    def _key(self, query: KeyQuery, trace: Trace) -> Any:
        raw = self.inner.get(
            keyspace.kv_key(self.serialize_key(query.key)), trace, query.is_skip_cache
        )
        return None if raw is None else self.value_de(raw)

    def _multi_key(self, query: MultiKeyQuery, trace: Trace) -> dict[Any, Any]:
        keys = list(query.keys)
        physical = [keyspace.kv_key(self.serialize_key(k)) for k in keys]
        values = self.inner.multi_get(physical, trace, query.is_skip_cache)
        value_de = self.value_de
        return {k: value_de(v) for k, v in zip(keys, values, strict=True) if v is not None}

    def _range(self, query: RangeQuery, trace: Trace) -> KeyValueIterator[Any, Any]:
        lo = None if query.lower_bound is None else self.serialize_key(query.lower_bound)
        hi = None if query.upper_bound is None else self.serialize_key(query.upper_bound)
        if lo is not None and hi is not None and lo > hi:
            return KeyValueIterator.empty()  # lo > hi is an empty success (Kafka)
        lower, upper = keyspace.kv_range(lo, hi)
        return self._scan(lower, upper, query.result_order is ResultOrder.DESCENDING, trace)

    def _scan(self, lower: bytes, upper: bytes, reverse: bool, trace: Trace) -> ScanIterator:
        """Rows of ``[lower, upper)``: from the columnar twins when the partition has
        them (no database is opened), else from RocksDB."""
        strip = keyspace.RAW_PREFIX_LEN
        base = self.inner.inner
        exact = self.value_serde.arrow_type() is not None
        database_open = base.twinned() and base.database_open()
        if database_open:
            # An open database iterates a range faster than row groups are read: the
            # rows come from it, and the twins are planned only for a reader that takes
            # them whole (``take_twin``: tables, SQL, Spark), not for every scan. With a
            # trace they are planned now: a result's trace is final when it is returned,
            # and must name what a table reader will read; its ColumnarScan line then
            # says where iterated rows come from (the RocksDB iterator is traced only
            # when there are no twins to read, as it opens only if the rows are read).
            plan = partial(self._twins_beside_database, lower, upper, reverse, trace)
            planned = plan() if trace.enabled else None
            chunks = self.inner.scan_chunks(
                lower, upper, reverse, _UNTRACED if planned is not None else trace
            )
            it = ScanIterator.over(chunks, self._kv_chunk(strip), strip)
            if not trace.enabled:
                it.plan_twin_when_taken(plan)
            elif planned is not None:
                it.attach_twin(planned)
            return it
        # The database is not open: KeyValue rows from the twins where their value
        # column gives the stored value back (``exact``); else from RocksDB.
        twins = self.inner.twin_scan(lower, upper, reverse, trace, rows_from_twins=exact)
        if twins is not None:
            return ScanIterator.over_twins(
                twins,
                self._kv_chunk(strip),
                strip,
                partial(twins.stored_rows, value_serde=self.value_serde) if exact else None,
                partial(self.inner.scan_chunks, lower, upper, reverse, _UNTRACED),
            )
        chunks = self.inner.scan_chunks(lower, upper, reverse, trace)
        return ScanIterator.over(chunks, self._kv_chunk(strip), strip)

    def _twins_beside_database(
        self, lower: bytes, upper: bytes | None, reverse: bool, trace: Trace
    ) -> Any:
        """The planned twin scan of a partition whose database is open, or None when its
        twins cannot be fetched from object storage: its tables then come from the
        database's rows too, which the open database has. A damaged twin is the
        partition's verdict (``StoreCorruptedError``, store/integrity.py): the database
        beside it must not hide it."""
        t0 = _clock(trace)
        try:
            return self.inner.twin_scan(lower, upper, reverse, trace, rows_from_twins=False)
        except StoreCorruptedError:
            raise
        except IqkitError as exc:
            if trace.enabled:
                trace.add("ColumnarScan", t0, f"not read ({exc}); rows are read from RocksDB")
            return None

    def _prefix(self, query: PrefixScanQuery, trace: Trace) -> KeyValueIterator[Any, Any]:
        serde = get_serde(query.prefix_serde) if query.prefix_serde else None
        prefix = self.serialize_key(query.prefix, serde)
        lower, upper = keyspace.kv_prefix_range(prefix)
        return self._scan(lower, upper, query.result_order is ResultOrder.DESCENDING, trace)

    def _raw_key(self, query: RawKeyQuery, trace: Trace) -> bytes | None:
        return self.inner.get(keyspace.kv_key(query.key), trace, True)

    def _raw_scan(self, query: RawScanQuery, trace: Trace) -> KeyValueIterator[bytes, bytes]:
        chunks = self.inner.scan_chunks(keyspace.KV_LOWER, keyspace.KV_UPPER, False, trace)
        strip = keyspace.RAW_PREFIX_LEN

        def convert(chunk: list[tuple[bytes, bytes]]) -> list[KeyValue[bytes, bytes]]:
            return [_new_kv((k[strip:], v)) for k, v in chunk]

        return ScanIterator.over(chunks, convert, strip)


class TypedWindowLayer(_TypedLayer):
    """Window stores: results are ``KeyValue(Windowed(key, start, end), value)``."""

    name = "TypedWindowLayer"
    query_types = StoreKind.WINDOW.query_types

    def __init__(self, manifest: StoreManifest, inner: CachingLayer) -> None:
        super().__init__(manifest, inner)
        assert manifest.window_size_ms is not None
        self.window_size = manifest.window_size_ms
        self._handlers = {
            WindowKeyQuery: self._window_key,
            WindowRangeQuery: self._window_range,
            RawKeyQuery: self._raw_key,
            RawScanQuery: self._raw_scan,
        }

    def _window_key(self, query: WindowKeyQuery, trace: Trace) -> KeyValueIterator[Any, Any]:
        if query.time_from > query.time_to:
            return KeyValueIterator.empty()
        key_bytes = self.serialize_key(query.key)
        lower, upper = keyspace.window_key_range(key_bytes, query.time_from, query.time_to)
        reverse = query.result_order is ResultOrder.DESCENDING
        chunks = self.inner.scan_chunks(lower, upper, reverse, trace)
        key, size, value_de = query.key, self.window_size, self.value_de
        decode_time = keyspace.decode_time
        time_at = -keyspace.TIME_LEN

        def convert(chunk: list[tuple[bytes, bytes]]) -> list[KeyValue[Any, Any]]:
            out = []
            for raw_key, raw_value in chunk:
                start = decode_time(raw_key[time_at:])
                out.append(_new_kv((Windowed(key, start, start + size), value_de(raw_value))))
            return out

        return _stream(chunks, convert)

    def _window_range(self, query: WindowRangeQuery, trace: Trace) -> KeyValueIterator[Any, Any]:
        """Every key's windows starting in the range, by (start, key) — newest first
        when descending — read from the time index, values fetched in batches."""
        if query.time_from > query.time_to:
            return KeyValueIterator.empty()
        lower, upper = keyspace.window_time_range(query.time_from, query.time_to)
        reverse = query.result_order is ResultOrder.DESCENDING
        index_chunks = self.inner.scan_chunks(lower, upper, reverse, trace)
        size, inner = self.window_size, self.inner
        key_de, value_de = self.key_serde.deserialize, self.value_de
        split = keyspace.split_window_time_key

        def convert(chunk: list[tuple[bytes, bytes]]) -> list[KeyValue[Any, Any]]:
            windows = [split(raw_index_key) for raw_index_key, _ in chunk]
            values = inner.multi_get(
                [keyspace.window_key(k, s) for k, s in windows], Trace(False), True
            )
            return [
                _new_kv((Windowed(key_de(k), s, s + size), value_de(v)))
                for (k, s), v in zip(windows, values, strict=True)
                if v is not None
            ]

        return _stream(index_chunks, convert)

    def _raw_key(self, query: RawKeyQuery, trace: Trace) -> bytes | None:
        return self.inner.get(keyspace.WINDOW_PREFIX + query.key, trace, True)

    def _raw_scan(self, query: RawScanQuery, trace: Trace) -> KeyValueIterator[bytes, bytes]:
        chunks = self.inner.scan_chunks(keyspace.WINDOW_LOWER, keyspace.WINDOW_UPPER, False, trace)
        strip = len(keyspace.WINDOW_PREFIX)
        return _stream(chunks, lambda chunk: [_new_kv((k[strip:], v)) for k, v in chunk])


def build_layers(
    manifest: StoreManifest, partition: BytesPartition, cache: ReadCache
) -> TypedKeyValueLayer | TypedWindowLayer:
    """The full stack for one partition version: typed → caching → RocksDB."""
    stack = CachingLayer(RocksDBLayer(partition), cache)
    if manifest.kind.windowed:
        return TypedWindowLayer(manifest, stack)
    return TypedKeyValueLayer(manifest, stack)
