"""Query results as Arrow tables: what notebooks, pandas and DuckDB consume.

``collect`` turns one ``StateQueryResult`` into a ``pa.Table`` (closing every iterator it
holds); ``store_batches`` streams a full scan of a store as a ``pa.RecordBatchReader``
for DuckDB. Both pull rows a chunk at a time and leave turning them into columns to
:mod:`iqkit.store.columnar.shaping` (the row schema, type inference, the JSON-text
fallback and the bulk
decoding of stored bytes are described there), so a result and a scan of the same rows
give the same table.

Versions as data (``iqkit.query.versions``) have tables of their own, built by the same
shaper from records already decoded: ``history_table`` (one row per ``VersionedRecord``:
``partition``, the key's columns, the value's columns, ``timestamp`` and ``valid_to`` as
``timestamp[ms, tz=UTC]``, ``version``) and ``changes_table`` (one row per ``Change``:
``partition``, ``version``, ``kind``, the key's columns, the value's columns, then the
same columns for the old value, each prefixed ``old_``: values and old values are shaped
together, so both have the same columns of the same types). A value absent from a row (a
delete's value, an insert's old value) is nulls in its columns; a value column named like
one of the extra columns becomes ``value.<name>``, as the row schema renames a field named
like a key. A table without rows has the columns the serdes fix (``collect``'s rule): a
JSON store's fields are known from rows only.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from .errors import IqkitError
from .query import (
    Change,
    KeyQuery,
    KeyValue,
    KeyValueIterator,
    MultiKeyQuery,
    Query,
    RawKeyQuery,
    StateQueryRequest,
    StateQueryResult,
    VersionedRecord,
)
from .store.columnar.shaping import (  # the chunk shaper's parts both readers below drive
    _ARROW_ERRORS,
    _as_json,
    _assemble,
    _Column,
    _gc_paused,
    _loose_text,
    _Segments,
    _Shaper,
    _Stored,
    _unified_type,
    bulk_decode,
)
from .store.manifest import StoreManifest
from .store.rows import PARTITION, arrow_timestamp

if TYPE_CHECKING:
    import pandas as pd


__all__ = [
    "Collected",
    "bulk_decode",
    "changes_table",
    "collect",
    "history_table",
    "store_batches",
    "to_pandas",
]

#: Rows per Arrow chunk built by ``collect``: big enough that per-chunk overhead vanishes,
#: small enough that the Python objects of one chunk are all that is alive at once.
CHUNK_ROWS = 65_536
#: Rows pulled from an iterator between two ``progress`` calls (and limit checks).
PROGRESS_ROWS = 4_096


@dataclass(frozen=True)
class Collected:
    """The rows of one query result as Arrow, plus how reading them went."""

    #: The rows (schema in the module docstring).
    table: pa.Table
    #: Rows read per partition, for successful partitions only (0 when limit skipped it).
    rows_per_partition: dict[int, int] = field(default_factory=dict)
    #: Nanoseconds spent pulling each partition's rows from its iterator (and decoding
    #: them, also when they are decoded in bulk from stored bytes).
    read_ns: dict[int, int] = field(default_factory=dict)
    #: True when ``limit`` stopped reading while rows were still left.
    truncated: bool = False

    def __len__(self) -> int:
        return self.table.num_rows


# -- collect -------------------------------------------------------------------------------
_END = object()


def _has_rows(value: Any) -> bool:
    """Whether a not-yet-read partition result holds at least one row (consumes one)."""
    if isinstance(value, KeyValueIterator):
        return next(iter(value), _END) is not _END
    if isinstance(value, dict):
        return bool(value)
    return value is not None


def _non_iterator_rows(
    value: Any, query: Query[Any] | None, store: str
) -> list[KeyValue[Any, Any]]:
    """The rows of a key lookup: ``KeyQuery``/``RawKeyQuery`` → value or ``None``;
    ``MultiKeyQuery`` → dict key → value."""
    if value is None:  # a key that was not found (or not owned by this partition)
        return []
    if isinstance(query, MultiKeyQuery):
        return [KeyValue(k, v) for k, v in value.items()]
    if isinstance(query, KeyQuery | RawKeyQuery):
        return [KeyValue(query.key, value)]
    raise ValueError(
        f"store {store!r}: a {type(value).__name__} result is not rows by itself; pass "
        f"query= (the request's query) to collect() so a key lookup can be tabulated"
    )


def _in_context(exc: IqkitError, message: str) -> IqkitError:
    try:
        return type(exc)(message)
    except TypeError:  # a subclass with another constructor
        return IqkitError(message)


def _shape_timed(
    shaper: _Shaper, p: int, rows: list[Any], how: _Stored | None, read_ns: dict[int, int]
) -> dict[str, _Column]:
    """``shaper.shape`` of one partition's rows; when they are stored bytes, decoding
    them is part of reading them, so its time counts in ``read_ns``."""
    t0 = time.perf_counter_ns()
    cols = shaper.shape([(p, rows, how)])
    if how is not None:
        read_ns[p] += time.perf_counter_ns() - t0
    return cols


def collect(
    result: StateQueryResult[Any],
    manifest: StoreManifest,
    *,
    limit: int | None = None,
    progress: Callable[[int], None] | None = None,
    query: Query[Any] | StateQueryRequest[Any] | None = None,
) -> Collected:
    """The rows of ``result`` as an Arrow table, partitions ascending, rows in the
    engine's per-partition order.

    Every iterator in ``result`` is closed before this returns or raises (including on
    ``KeyboardInterrupt``), also those of partitions ``limit`` kept it from reading.
    ``limit`` caps the total rows; ``progress(rows_so_far)`` is called every few thousand
    rows. ``query`` (or the request) is needed to tabulate ``KeyQuery`` and
    ``MultiKeyQuery`` results, whose values do not carry their keys, and tells raw
    queries' bytes apart; iterator results need no ``query``.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be an int >= 0 or None, got {limit!r}")
    if isinstance(query, StateQueryRequest):
        query = query.query
    shaper = _Shaper(manifest, query)
    results = result.partition_results
    iterators = [
        r.result
        for r in results.values()
        if r.is_success and isinstance(r.result, KeyValueIterator)
    ]
    chunks: list[dict[str, _Column]] = []
    rows_per: dict[int, int] = {}
    read_ns: dict[int, int] = {}
    total = 0
    truncated = False
    try:
        with _gc_paused():
            for p, qr in results.items():
                if qr.is_failure:
                    continue
                value = qr.result
                rows_per[p] = read_ns[p] = 0
                if limit is not None and total >= limit:
                    truncated = truncated or _has_rows(value)
                    continue
                if not isinstance(value, KeyValueIterator):
                    rows = _non_iterator_rows(value, query, manifest.name)
                    if limit is not None and total + len(rows) > limit:
                        rows, truncated = rows[: limit - total], True
                    if rows:
                        chunks.append(shaper.columns([(p, rows)]))
                    rows_per[p] = len(rows)
                    total += len(rows)
                    continue
                twin = shaper.twin_take(value)
                if twin is not None:
                    total, left = _collect_twin(
                        shaper, p, twin, chunks, limit, total, rows_per, read_ns, progress
                    )
                    truncated = truncated or left
                    continue
                it, how = shaper.rows_of(value)
                buffer: list[Any] = []
                while True:
                    step = PROGRESS_ROWS if limit is None else min(PROGRESS_ROWS, limit - total)
                    if step <= 0:  # the limit is reached: is anything left?
                        truncated = truncated or next(it, _END) is not _END
                        break
                    before = len(buffer)
                    t0 = time.perf_counter_ns()
                    try:
                        buffer.extend(islice(it, step))
                    except IqkitError as exc:
                        raise _in_context(
                            exc,
                            f"store {manifest.name!r} partition {p}: reading rows failed: {exc}",
                        ) from exc
                    read_ns[p] += time.perf_counter_ns() - t0
                    got = len(buffer) - before
                    total += got
                    rows_per[p] += got
                    if progress is not None and got:
                        progress(total)
                    if len(buffer) >= CHUNK_ROWS:
                        chunks.append(_shape_timed(shaper, p, buffer, how, read_ns))
                        buffer = []
                    if got < step:
                        break
                if buffer:
                    chunks.append(_shape_timed(shaper, p, buffer, how, read_ns))
            table = _assemble(chunks or [shaper.empty_columns()])
    finally:
        for it in iterators:
            it.close()
    return Collected(table, rows_per, read_ns, truncated)


def _collect_twin(
    shaper: _Shaper,
    p: int,
    tables: Iterator[pa.Table],
    chunks: list[dict[str, _Column]],
    limit: int | None,
    total: int,
    rows_per: dict[int, int],
    read_ns: dict[int, int],
    progress: Callable[[int], None] | None,
) -> tuple[int, bool]:
    """``collect`` of one partition read from columnar twins: its tables as chunks, up
    to ``limit`` rows in all. Returns the new total and whether rows were left."""
    from .store.columnar.twins import twin_table_columns  # pyarrow.parquet: twins only

    while True:
        t0 = time.perf_counter_ns()
        try:
            table = next(tables, None)
        except IqkitError as exc:
            raise _in_context(
                exc, f"store {shaper.store!r} partition {p}: reading rows failed: {exc}"
            ) from exc
        read_ns[p] += time.perf_counter_ns() - t0
        if table is None:
            return total, False
        if limit is not None and total + table.num_rows > limit:
            table = table.slice(0, limit - total)
            left = True
        else:
            left = False
        if table.num_rows:
            chunks.append(twin_table_columns(p, table))
            total += table.num_rows
            rows_per[p] += table.num_rows
            if progress is not None:
                progress(total)
        if left:
            return total, True
        if limit is not None and total >= limit:
            return total, next(tables, None) is not None


# -- store_batches -------------------------------------------------------------------------
def _partitions_to_scan(manifest: StoreManifest, partitions: Iterable[int] | None) -> list[int]:
    n = manifest.partitions
    if partitions is None:
        return list(range(n))
    if isinstance(partitions, int | str | bytes):
        raise TypeError(f"partitions must be an iterable of ints, got {partitions!r}")
    chosen = set()
    for p in partitions:
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < n:
            raise ValueError(
                f"store {manifest.name!r} has partitions 0..{n - 1}; got partition {p!r}"
            )
        chosen.add(p)
    return sorted(chosen)


class _Conformer:
    """Makes every later batch of a stream match the schema fixed at its start."""

    def __init__(
        self,
        store: str,
        schema: pa.Schema,
        json_columns: set[str],
        loose_columns: set[str],
        origin: str,
    ) -> None:
        self.store = store
        self.schema = schema
        self.hints = {f.name: f.type for f in schema}
        self.json_columns = json_columns
        self.loose_columns = loose_columns
        #: Where the schema came from, for error messages.
        self.origin = origin

    def batch(self, cols: dict[str, _Column], partitions: list[int]) -> pa.RecordBatch:
        n = len(cols[PARTITION].array)
        where = f"partition{'s' if len(partitions) > 1 else ''} {', '.join(map(str, partitions))}"
        extra = [name for name in cols if name not in self.hints]
        if extra:
            raise IqkitError(
                f"store {self.store!r} {where}: field {extra[0]!r} is not in {self.origin} "
                f"({', '.join(self.hints)}); pass schema= to store_batches to include it"
            )
        arrays = []
        for f in self.schema:
            column = cols.get(f.name)
            if column is None or pa.types.is_null(column.array.type):
                arrays.append(pa.nulls(n, f.type))
            elif f.name in self.loose_columns:
                arrays.append(_loose_text(column))
            elif f.name in self.json_columns:
                arrays.append(_as_json(column))
            elif column.array.type == f.type:
                arrays.append(column.array)
            else:
                try:
                    arrays.append(column.array.cast(f.type))
                except _ARROW_ERRORS:
                    got = "mixed values (JSON text)" if column.json else str(column.array.type)
                    raise IqkitError(
                        f"store {self.store!r} {where}: field {f.name!r} holds {got} but "
                        f"{self.origin} says {f.type}; pass schema= to store_batches to "
                        f"set its type"
                    ) from None
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def store_batches(
    engine: Any,
    store: str,
    *,
    partitions: Iterable[int] | None = None,
    batch_size: int = 65_536,
    schema: pa.Schema | None = None,
    sample_rows: int = 2_048,
) -> pa.RecordBatchReader:
    """A full scan of ``store``, streamed as record batches of at most ``batch_size``
    rows with one schema (the row schema of ``collect``).

    One engine query covers every partition, so the scan reads one published version of
    the store even if commits land while it streams; partitions are streamed one after
    the other. Unless ``schema`` is given, it is inferred from a sample: the first
    ``sample_rows`` rows of *every* partition (read up front and kept until streamed, so
    a field that only some partitions have is seen). Every batch is made to fit it: a
    missing field is null, a type Arrow can safely cast is cast (int → double), a column
    that was JSON text in the sample stays JSON text, a column that was only null in the
    sample is a string column (later strings as they are, other values as JSON text); a
    field not in the schema, or a value that cannot be cast, raises ``IqkitError`` naming
    the store, partition and field: a scan never drops data silently (pass ``schema=``).

    An empty partition (one no commit has touched) contributes no rows; a failed
    partition (``STORE_EXCEPTION``: unreadable or corrupt; ``NOT_PRESENT``: its data is not
    here) raises ``IqkitError`` naming it: a scan missing a partition would be wrong.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if isinstance(sample_rows, bool) or not isinstance(sample_rows, int) or sample_rows < 1:
        raise ValueError(f"sample_rows must be an int >= 1, got {sample_rows!r}")
    if schema is not None and not isinstance(schema, pa.Schema):
        raise TypeError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
    manifest = engine.manifest(store)
    chosen = _partitions_to_scan(manifest, partitions)
    query = manifest.kind.scan_query()
    request = StateQueryRequest.in_store(store).with_query(query)
    if partitions is not None:
        request = request.with_partitions(chosen)
    result = engine.query(request)
    results = result.partition_results
    iterators = [(p, r.result) for p, r in results.items() if r.is_success]
    try:
        for p, r in results.items():
            if r.is_failure:
                raise IqkitError(
                    f"store {store!r} partition {p} failed ({r.failure_reason.name}): "
                    f"{r.failure_message}"
                )
    except BaseException:
        for _, it in iterators:
            it.close()
        raise
    shaper = _Shaper(manifest, query)
    if iterators and all(shaper.twin_ready(v) for _, v in iterators):
        twins = [(p, shaper.twin_take(v)) for p, v in iterators]
        return _twin_batches(engine, shaper, twins, [v for _, v in iterators], batch_size, schema)
    sources: list[tuple[int, Iterator[Any], _Stored | None]] = []
    try:
        with _gc_paused():
            sample: list[tuple[int, list[Any], _Stored | None]] = []
            for p, value in iterators:
                it, how = shaper.rows_of(value)
                head = [] if schema is not None else _read(store, p, it, sample_rows)
                if head:
                    sample.append((p, head, how))
                sources.append((p, chain(head, it), how))
            if schema is None:
                conformer = _infer(store, shaper, sample)
            else:
                conformer = _Conformer(store, schema, set(), set(), "the given schema")
    except BaseException:
        for _, value in iterators:
            value.close()
        raise
    del sample
    chunks = _scan_chunks(engine, store, sources, [v for _, v in iterators], batch_size)

    def batches() -> Iterator[pa.RecordBatch]:
        # The collector is paused while a batch is read and shaped, never across a
        # ``yield``: the consumer's code runs with it enabled.
        try:
            while True:
                with _gc_paused():
                    item = next(chunks, None)
                    if item is None:
                        return
                    cols = shaper.shape(item)
                    batch = conformer.batch(cols, list(dict.fromkeys(p for p, _, _ in item)))
                yield batch
        finally:
            chunks.close()

    return pa.RecordBatchReader.from_batches(conformer.schema, batches())


def _twin_batches(
    engine: Any,
    shaper: _Shaper,
    twins: list[tuple[int, Iterator[pa.Table] | None]],
    iterators: list[KeyValueIterator[Any, Any]],
    batch_size: int,
    schema: pa.Schema | None,
) -> pa.RecordBatchReader:
    """``store_batches`` of partitions read from columnar twins: the schema from each
    partition's first table (a whole twin file's columns, not a sample of rows), the
    batches its tables cut to ``batch_size``."""
    from .store.columnar.twins import twin_table_columns  # pyarrow.parquet: twins only

    store = shaper.store
    try:
        firsts = _first_tables(store, twins)
        if schema is None:
            # Columns of one type in every partition: that is the schema, whatever the
            # rows (no copy of them); else the rows decide where types meet (a value
            # no common type holds makes its column JSON text, ``_assemble``).
            tables = list(firsts.values())
            kinds = [t.schema.remove_metadata() for t in tables]  # fields' metadata kept
            same = all(k.equals(kinds[0], check_metadata=True) for k in kinds)
            samples = [
                twin_table_columns(p, t.slice(0, 0) if same else t) for p, t in firsts.items()
            ]
            rows = sum(t.num_rows for t in tables)
            conformer = _infer_columns(store, samples or [shaper.empty_columns()], rows)
        else:
            conformer = _Conformer(store, schema, set(), set(), "the given schema")
    except BaseException:
        for it in iterators:
            it.close()
        raise

    def batches() -> Iterator[pa.RecordBatch]:
        # Batches of exactly ``batch_size`` rows (fewer at the end), as the row path
        # cuts them: pieces of tables, across partitions, put together.
        pieces: list[pa.RecordBatch] = []
        filled = 0
        try:
            for p, tables in twins:
                assert tables is not None
                table = firsts.pop(p, None)
                while table is not None:
                    offset = 0
                    while offset < table.num_rows:
                        take = min(batch_size - filled, table.num_rows - offset)
                        piece = twin_table_columns(p, table.slice(offset, take))
                        pieces.append(conformer.batch(piece, [p]))
                        offset += take
                        filled += take
                        if filled == batch_size:
                            yield _one_batch(pieces)
                            pieces, filled = [], 0
                    table = _next_table(store, p, tables)
                if getattr(engine, "is_closed", False):
                    raise IqkitError(f"store {store!r}: the engine was closed during the scan")
            if pieces:
                yield _one_batch(pieces)
        finally:
            for it in iterators:
                it.close()

    return pa.RecordBatchReader.from_batches(conformer.schema, batches())


def _first_tables(
    store: str, twins: list[tuple[int, Iterator[pa.Table] | None]]
) -> dict[int, pa.Table]:
    """Each partition's first table (of a chain with several files, the whole
    partition merged), read on as many threads as there are cores: Parquet decoding and
    Arrow's take and filter release the GIL, and every one is needed before the first
    batch anyway (the schema is taken from them). A failure is raised in partition
    order, after every thread has stopped: no iterator is closed while a thread runs it."""
    from concurrent.futures import ThreadPoolExecutor

    for _, tables in twins:
        assert tables is not None
    workers = min(len(twins), os.cpu_count() or 1)
    if workers < 2:
        pairs = [(p, _next_table(store, p, tables)) for p, tables in twins]  # type: ignore[arg-type]
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="iqkit-scan") as pool:
            futures = [(p, pool.submit(_next_table, store, p, t)) for p, t in twins]
        pairs = [(p, future.result()) for p, future in futures]
    return {p: first for p, first in pairs if first is not None}


def _one_batch(pieces: list[pa.RecordBatch]) -> pa.RecordBatch:
    return pieces[0] if len(pieces) == 1 else pa.concat_batches(pieces)


def _next_table(store: str, p: int, tables: Iterator[pa.Table]) -> pa.Table | None:
    try:
        return next(tables, None)
    except IqkitError as exc:
        raise _in_context(
            exc, f"store {store!r} partition {p}: reading rows failed: {exc}"
        ) from exc


def _infer_columns(store: str, chunks: list[dict[str, _Column]], rows: int) -> _Conformer:
    """The stream's schema from columns already shaped (twin tables): as ``_infer``."""
    table = _assemble(chunks)
    json_cols = {n for c in chunks for n, col in c.items() if col.json}
    for name in table.column_names:  # no type fits every chunk: JSON text (``_assemble``)
        types = [c[name].array.type for c in chunks if name in c]
        if name not in json_cols and _unified_type(name, types) is None:
            json_cols.add(name)
    cols = {
        n: _Column(table.column(n).combine_chunks(), json=n in json_cols)
        for n in table.column_names
    }
    return _conformer_of(store, cols, rows)


def _read(store: str, p: int, it: Iterator[Any], n: int) -> list[Any]:
    """Up to ``n`` rows of partition ``p``; a read error names the store and partition."""
    try:
        return list(islice(it, n))
    except IqkitError as exc:
        raise _in_context(
            exc, f"store {store!r} partition {p}: reading rows failed: {exc}"
        ) from exc


def _infer(store: str, shaper: _Shaper, sample: _Segments) -> _Conformer:
    """The stream's schema, from the sampled rows (or the serdes when there are none)."""
    cols = shaper.shape(sample) if sample else shaper.empty_columns()
    return _conformer_of(store, cols, sum(len(r) for _, r, _ in sample))


def _conformer_of(store: str, cols: dict[str, _Column], rows: int) -> _Conformer:
    """A stream's conformer whose schema is that of ``cols`` (shaped from ``rows`` rows):
    JSON-text columns stay text, columns seen only as nulls are loose text."""
    json_cols = {n for n, c in cols.items() if c.json}
    # Only nulls seen: no type to infer, so text (later strings as is, others JSON).
    loose = {n for n, c in cols.items() if pa.types.is_null(c.array.type)}
    schema = pa.schema(
        [pa.field(n, pa.string() if n in loose else c.array.type) for n, c in cols.items()]
    )
    origin = f"the schema inferred from a sample of {rows} rows"
    return _Conformer(store, schema, json_cols, loose, origin)


def _scan_chunks(
    engine: Any,
    store: str,
    sources: list[tuple[int, Iterator[Any], _Stored | None]],
    iterators: list[KeyValueIterator[Any, Any]],
    batch_size: int,
) -> Iterator[list[tuple[int, list[Any], _Stored | None]]]:
    """Runs of ``(partition, rows, how)`` (see ``_Segments``) adding up to ``batch_size``
    rows (fewer at the end). Closes every iterator when done or closed early."""
    try:
        segments: list[tuple[int, list[Any], _Stored | None]] = []
        filled = 0
        for p, it, how in sources:
            while True:
                rows = _read(store, p, it, batch_size - filled)
                if rows:
                    segments.append((p, rows, how))
                    filled += len(rows)
                if filled < batch_size:
                    break  # the partition is exhausted
                yield segments
                segments, filled = [], 0
            if getattr(engine, "is_closed", False):
                # Closing the engine ends live iterators early (and quietly): the scan
                # would be silently short, so say so instead.
                raise IqkitError(f"store {store!r}: the engine was closed during the scan")
        if segments:
            yield segments
    finally:
        for value in iterators:
            value.close()


# -- versions as data ---------------------------------------------------------------------
#: The version tables' own columns (module docstring).
TIMESTAMP, VALID_TO, VERSION, KIND = "timestamp", "valid_to", "version", "kind"
#: What an old value's columns are prefixed with in ``changes_table``.
OLD = "old_"


def history_table(
    result: StateQueryResult[Any] | Iterable[VersionedRecord[Any]] | VersionedRecord[Any] | None,
    manifest: StoreManifest,
    *,
    key: Any,
) -> pa.Table:
    """The records of ``key`` as a table, one row per ``VersionedRecord`` (columns in the
    module docstring), partitions ascending, records in the order the engine gave them.

    ``result``: the engine's answer to a ``VersionedKeyQuery`` or ``MultiVersionedKeyQuery``
    (failed partitions are skipped, as ``collect`` skips them: the caller reports them),
    or records given bare (their ``partition`` is null). ``key`` is the query's key: a
    record does not carry it."""
    pairs = _version_rows(result, VersionedRecord)
    records = [r for _, r in pairs]
    shaper = _Shaper(manifest, None)
    cols = _key_part(shaper, [p for p, _ in pairs], [key] * len(pairs))
    (value,) = _value_parts(shaper, [[r.value for r in records]], cols)
    cols.update(_renamed(value, [*cols, TIMESTAMP, VALID_TO, VERSION], shaper.rows.field_column))
    ms = arrow_timestamp()
    cols[TIMESTAMP] = _Column(pa.array([r.timestamp for r in records], ms))
    cols[VALID_TO] = _Column(pa.array([r.valid_to for r in records], ms))
    cols[VERSION] = _Column(pa.array([r.version for r in records], pa.int64()))
    return _assemble([cols])


def changes_table(
    result: StateQueryResult[Any] | Iterable[Change[Any, Any]], manifest: StoreManifest
) -> pa.Table:
    """The changes of a ``ChangesQuery`` as a table, one row per ``Change`` (columns in the
    module docstring), partitions ascending, changes in the engine's order (version, then
    key). ``result`` as for ``history_table``: failed partitions skipped, bare changes
    with a null ``partition``."""
    pairs = _version_rows(result, Change)
    changes = [c for _, c in pairs]
    shaper = _Shaper(manifest, None)
    keyed = _key_part(shaper, [p for p, _ in pairs], [c.key for c in changes])
    cols = {
        PARTITION: keyed.pop(PARTITION),
        VERSION: _Column(pa.array([c.version for c in changes], pa.int64())),
        KIND: _Column(pa.array([c.kind for c in changes], pa.string())),
    }
    cols.update(keyed)
    fixed = {PARTITION: cols[PARTITION], **keyed}
    sides = [[c.value for c in changes], [c.old_value for c in changes]]
    value, old = _value_parts(shaper, sides, fixed)
    cols.update(_renamed(value, cols, shaper.rows.field_column))
    cols.update(_renamed(old, cols, _old_name))
    return _assemble([cols])


def _version_rows(result: Any, kind: type) -> list[tuple[int | None, Any]]:
    """``(partition, record)`` of each record in ``result``: a ``StateQueryResult``'s
    successful partitions ascending, or records given bare (partition ``None``)."""
    if isinstance(result, StateQueryResult):
        return [
            (p, record)
            for p, qr in sorted(result.partition_results.items())
            if qr.is_success
            for record in _records(qr.result, kind)
        ]
    return [(None, record) for record in _records(result, kind)]


def _records(value: Any, kind: type) -> list[Any]:
    """A partition's answer as a list: ``None`` (no record), one record, or several."""
    if value is None:
        return []
    records = [value] if isinstance(value, kind) else list(value)
    for record in records:
        if not isinstance(record, kind):
            raise TypeError(f"expected {kind.__name__} records, got {type(record).__name__}")
    return records


def _key_part(shaper: _Shaper, partitions: list[int | None], keys: list[Any]) -> dict[str, _Column]:
    """``partition`` and the key's columns, as ``collect`` makes them."""
    cols = {PARTITION: _Column(pa.array(partitions, pa.int32()))}
    shaper._key_columns(keys, cols)
    return cols


def _value_parts(
    shaper: _Shaper, sides: list[list[Any]], fixed: dict[str, _Column]
) -> list[dict[str, _Column]]:
    """The value's columns of each list of ``sides`` (a change's values and its old
    values), named as ``collect`` names them after the columns ``fixed``. The sides are
    shaped together, so each has the same columns of the same types; a row whose value
    is ``None`` (nothing there) is nulls."""
    values = [v for side in sides for v in side]
    present = [v for v in values if v is not None]
    scratch = dict(fixed)
    shaper._value_columns(present, scratch)
    shaped = {n: c for n, c in scratch.items() if n not in fixed}
    at = iter(range(len(present)))
    where = [None if v is None else next(at) for v in values]
    out, start = [], 0
    for side in sides:
        rows = pa.array(where[start : start + len(side)], pa.int64())
        out.append({n: _Column(c.array.take(rows), c.json) for n, c in shaped.items()})
        start += len(side)
    return out


def _renamed(
    cols: dict[str, _Column], taken: Iterable[str], clear: Callable[[str, set[str]], str]
) -> dict[str, _Column]:
    """``cols``, each renamed by ``clear(name, names taken so far)``."""
    names = set(taken)
    out: dict[str, _Column] = {}
    for name, column in cols.items():
        name = clear(name, names)
        names.add(name)
        out[name] = column
    return out


def _old_name(name: str, taken: set[str]) -> str:
    """An old value's column: the value's column prefixed ``old_`` (again while taken)."""
    name = OLD + name
    while name in taken:
        name = OLD + name
    return name


# -- pandas --------------------------------------------------------------------------------
@functools.cache
def _nullable_dtypes() -> dict[pa.DataType, Any]:
    # Built on first use: pandas is imported only where DataFrames are made (iqkit.sqlsession).
    import pandas as pd

    return {
        pa.int8(): pd.Int8Dtype(),
        pa.int16(): pd.Int16Dtype(),
        pa.int32(): pd.Int32Dtype(),
        pa.int64(): pd.Int64Dtype(),
        pa.uint8(): pd.UInt8Dtype(),
        pa.uint16(): pd.UInt16Dtype(),
        pa.uint32(): pd.UInt32Dtype(),
        pa.uint64(): pd.UInt64Dtype(),
        pa.bool_(): pd.BooleanDtype(),
    }


def to_pandas(table: pa.Table) -> pd.DataFrame:
    """``table`` as a DataFrame where integer and boolean columns are pandas' nullable
    dtypes (``Int64``…): with numpy dtypes one null would turn a whole int column into
    floats (``17`` shown as ``17.0``) and bools into objects."""
    return table.to_pandas(types_mapper=_nullable_dtypes().get)
