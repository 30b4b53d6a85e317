"""Query results as Arrow tables: what notebooks, pandas and DuckDB consume.

``collect`` turns one ``StateQueryResult`` into a ``pa.Table`` (closing every iterator it
holds); ``store_batches`` streams a full scan of a store as a ``pa.RecordBatchReader``
for DuckDB. Both build rows the same way:

* The columns are the row schema's (:mod:`iqkit.rows`, shared with the Spark reader):
  ``partition`` (int32), the key (one column ``key``, or for tuple keys one column per
  element), for window stores ``window_start`` and ``window_end``
  (``timestamp[ms, tz=UTC]``), then the value: dict values (JSON records) become one
  column per field in first-seen order, any other value is one column ``value``.
* Column types are inferred by Arrow from the Python values, with the serde's type when
  it has one (``int32`` keys stay int32, ``bytes`` become binary). A column Arrow cannot
  type (mixed types: ``1`` in one row, ``"a"`` in another; ints beyond 64 bits) becomes
  **JSON text** (strings are quoted, bytes are ``"0x…"`` hex) rather than failing: the
  data is still all there, and DuckDB's JSON functions can read it.

Why chunks: per-row Python work dominates a million-row scan, so rows are pulled from the
engine in C (``islice``) and turned into columns a chunk at a time — one ``pa.array`` per
column over a list, fields of records gathered with ``map(itemgetter(...))`` — never a
Python dict per row.

Why stored bytes: even so, decoding row by row (``json.loads`` per value, a ``KeyValue``
per row) was most of a big scan's time. A key-value scan's iterator (``ScanIterator``)
hands over its rows undecoded, and whole chunks are decoded by Arrow: keys and values of
the ``string``/``bytes``/``int32``/``int64``/``double`` serdes as one column each, JSON
records with ``pyarrow.json``. That is done only where it provably gives what the row
path gives (``_json_records`` lists the checks); any other chunk is decoded row by row by
the engine's own decoder, so values, types and errors never depend on which path ran.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, islice, repeat
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from .errors import IqkitError
from .query import (
    KeyQuery,
    KeyValue,
    KeyValueIterator,
    MultiKeyQuery,
    Query,
    RawKeyQuery,
    RawScanQuery,
    StateQueryRequest,
    StateQueryResult,
)
from .rows import KEY, PARTITION, VALUE, WINDOW_END, WINDOW_START, RowSchema, arrow_timestamp
from .store.layers import ScanIterator
from .store.manifest import StoreManifest

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Collected", "collect", "store_batches", "to_pandas"]

#: Rows per Arrow chunk built by ``collect``: big enough that per-chunk overhead vanishes,
#: small enough that the Python objects of one chunk are all that is alive at once.
CHUNK_ROWS = 65_536
#: Rows pulled from an iterator between two ``progress`` calls (and limit checks).
PROGRESS_ROWS = 4_096
#: Decode stored bytes a chunk at a time with Arrow where that is exact (the module
#: docstring); set only through ``bulk_decode``.
_BULK_DECODE = True


@contextlib.contextmanager
def bulk_decode(enabled: bool) -> Iterator[None]:
    """Within the block, decode stored bytes in bulk with Arrow (``True``, the default)
    or every row with the engine's decoder (``False``): tests and benchmarks compare
    the two. Process-wide rather than a context variable, so it also holds in the
    threads that collect for SQL; restored when the block ends, however it ends."""
    global _BULK_DECODE
    old, _BULK_DECODE = _BULK_DECODE, enabled
    try:
        yield
    finally:
        _BULK_DECODE = old


TIMESTAMP = arrow_timestamp()


#: What ``pa.array`` raises on Python values it cannot type consistently.
_ARROW_ERRORS = (pa.ArrowException, OverflowError, TypeError, ValueError)

#: Ints beyond this magnitude cannot share a column with floats in ``pa.array``.
_EXACT_DOUBLE_INT = 2**53


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


# -- building columns ----------------------------------------------------------------------
@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause CPython's cyclic garbage collector while rows are pulled and shaped.

    Quirk: each collection of the oldest generation traverses every live container, and
    building a million records (dicts, tuples) triggers many of them: measured, it made
    collecting 1,000,000 JSON records ~40% slower. Nothing built here is cyclic, so the
    pause loses nothing; the previous state is restored on the way out.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return "0x" + bytes(value).hex()
    return str(value)


def _json_texts(values: Iterable[Any]) -> pa.Array:
    """JSON text of each value (``None`` stays null): the fallback for untypable columns."""
    values = list(values)
    encode = json.JSONEncoder(ensure_ascii=False, default=_json_default).encode
    texts = [None if v is None else encode(v) for v in values]
    try:
        return pa.array(texts, pa.string())
    except _ARROW_ERRORS:
        # Lone surrogates (JSON allows "\ud800") are not UTF-8: escape everything.
        encode = json.JSONEncoder(ensure_ascii=True, default=_json_default).encode
        return pa.array([None if v is None else encode(v) for v in values], pa.string())


@dataclass
class _Column:
    array: pa.Array
    #: True when ``array`` holds JSON text because the values had no single Arrow type.
    json: bool = False


def _column(values: Sequence[Any], hint: pa.DataType | None) -> _Column:
    """An Arrow column of ``values``: of type ``hint`` (the serde's, so the values are of
    that type already), else inferred, else JSON text."""
    if hint is not None and not pa.types.is_null(hint):
        try:
            return _Column(pa.array(values, type=hint))
        except _ARROW_ERRORS:
            pass
    try:
        return _Column(pa.array(values))
    except _ARROW_ERRORS:
        return _Column(_json_texts(values), json=True)


# -- decoding stored JSON records in bulk ----------------------------------------------------
def _untimestamped(t: pa.DataType) -> pa.DataType:
    """``t`` with every timestamp (nested ones too) made a string."""
    if pa.types.is_timestamp(t):
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_untimestamped(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_untimestamped(t.value_type)))
    return t


def _as_pa_array_types(array: pa.Array) -> bool:
    """Whether ``array``, read by ``pyarrow.json``, is what ``pa.array`` makes of the
    same values decoded by ``json.loads``.

    Quirks of ``pyarrow.json`` that ``pa.array`` does not share, and which make this
    ``False``: it reads ints beyond 64 bits as doubles (``pa.array`` refuses them: JSON
    text), accepts ``Inf`` and ``-NaN`` (``json.loads`` refuses them); and ``pa.array``
    refuses ints beyond 2**53 in a column that also holds floats, which a double
    column read by ``pyarrow.json`` cannot tell. So every double must be finite and
    below 2**53 in magnitude; and only the types ``pa.array`` infers may occur.
    """
    t = array.type
    if pa.types.is_struct(t):
        return all(_as_pa_array_types(array.field(i)) for i in range(t.num_fields))
    if pa.types.is_list(t):
        return _as_pa_array_types(array.flatten())
    if pa.types.is_float64(t):
        if array.null_count == len(array):
            return True
        # Strictly below: 2**53 + 1 reads as the double 2**53. NaN compares false.
        within = pc.less(pc.abs(array), _EXACT_DOUBLE_INT)
        return bool(pc.all(within).as_py())
    return t in (pa.null(), pa.bool_(), pa.int64(), pa.string())


def _read_json(data: bytes, schema: pa.Schema | None = None) -> pa.Table:
    """``data`` (JSON objects, one per line) read by ``pyarrow.json`` as one block on one
    thread. Quirk: with several blocks on several threads, the order of the columns
    depends on which block is done first, while it must be the order fields are first
    seen in (and one block keeps type inference to the rules ``_json_records`` checks)."""
    return pa_json.read_json(
        pa.BufferReader(data),
        read_options=pa_json.ReadOptions(use_threads=False, block_size=len(data) + 1),
        parse_options=pa_json.ParseOptions(
            explicit_schema=schema, newlines_in_values=False, unexpected_field_behavior="infer"
        ),
    )


def _json_records(values: list[bytes]) -> list[tuple[str, pa.Array]] | None:
    """The fields of JSON records (``json`` serde values that are all objects), one
    Arrow column each in first-seen order, equal to what ``_value_columns`` makes of
    ``json.loads`` of each value — or ``None`` when that is not certain.

    The values are joined with newlines and read by ``pyarrow.json`` as one document per
    line; before that, the bytes are checked to be exactly ``len(values)`` lines each of
    one object. Quirks guarded against: ``pyarrow.json`` crashes the process on a line
    that is just ``null``, and reads ``null`` lines among objects as rows (so every line
    must start with ``{``); it reads two objects on one line as two rows (so it must
    return one row per value); it accepts invalid UTF-8 and raw control characters in
    strings, which ``json.loads`` refuses (so the bytes are checked first); it infers
    timestamps from ISO-8601 strings (those are read again as strings); it builds
    invalid arrays for some nested values (so nested columns are validated); and see
    ``_as_pa_array_types``. What it refuses (mixed types, duplicate keys, lone
    surrogates, numbers beyond a double) goes the row path, which decides.
    """
    n = len(values)
    joined = b"\n".join(values)
    if joined[:1] != b"{" or joined[-1:] != b"}" or len(joined) >= 2**31:
        return None
    buf = np.frombuffer(joined, np.uint8)
    breaks = np.flatnonzero(buf < 0x20)  # compact JSON has none but the separators
    if len(breaks) != n - 1:
        return None
    if n > 1 and not (
        (buf[breaks] == 0x0A).all()
        and (buf[breaks - 1] == 0x7D).all()  # "}" ends every value...
        and (buf[breaks + 1] == 0x7B).all()  # ...and "{" starts the next
    ):
        return None
    data = pa.py_buffer(joined)
    try:  # one UTF-8 check of everything, as str(data, "utf-8") of each value
        pa.Array.from_buffers(
            pa.binary(), 1, [None, pa.py_buffer(np.array([0, len(joined)], np.int32)), data]
        ).cast(pa.string())
    except _ARROW_ERRORS:
        return None
    try:
        table = _read_json(joined)
        if table.num_rows == n and any(_untimestamped(t) != t for t in table.schema.types):
            schema = pa.schema([f.with_type(_untimestamped(f.type)) for f in table.schema])
            table = _read_json(joined, schema)
    except _ARROW_ERRORS:
        return None
    if table.num_rows != n:
        return None
    out = []
    for name, column in zip(table.column_names, table.columns, strict=True):
        array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        if not _as_pa_array_types(array):
            return None
        if pa.types.is_nested(array.type):
            try:  # quirk: it reads [null, null] as an invalid list (one null child)
                array.validate(full=True)
            except _ARROW_ERRORS:
                return None
        out.append((name, array))
    return out


class _Stored:
    """How to read a partition's stored rows: ``ScanIterator.decode`` and the keys'
    prefix length."""

    __slots__ = ("decode", "key_offset")

    def __init__(self, decode: Callable[[list[Any]], list[KeyValue[Any, Any]]], key_offset: int):
        self.decode = decode
        self.key_offset = key_offset


#: Runs of rows: ``(partition, rows, how)``, rows being ``KeyValue``s when ``how`` is
#: ``None``, else stored ``(key, value)`` bytes to be decoded as ``how`` says.
_Segments = Sequence[tuple[int, Sequence[Any], _Stored | None]]


class _Shaper:
    """Turns lists of ``KeyValue``s into named Arrow columns for one store and query, in
    the row schema's layout (``iqkit.rows``)."""

    def __init__(self, manifest: StoreManifest, query: Query[Any] | None) -> None:
        self.store = manifest.name
        self.rows = RowSchema(manifest, raw=isinstance(query, RawKeyQuery | RawScanQuery))
        self.windowed = self.rows.windowed
        #: The serdes; their Arrow types are the columns' types, and those that have
        #: one decode in bulk (``decode_arrow``).
        self.key_serde = self.rows.key_serde
        self.value_serde = self.rows.value_serde
        self.key_hint = self.key_serde.arrow_type()
        self.value_hint = self.value_serde.arrow_type()
        #: Declared tuple keys: always one column per element, even for short keys.
        self.key_names = self.rows.tuple_key_columns
        #: JSON records are decoded in bulk by ``_json_records``.
        self.records = self.value_serde.name == "json"
        #: Whether to take stored bytes: only key-value scans hand them over, and only
        #: values some bulk decoding applies to are worth it.
        self.bulk = not manifest.kind.windowed and (self.value_hint is not None or self.records)

    def rows_of(self, value: KeyValueIterator[Any, Any]) -> tuple[Iterator[Any], _Stored | None]:
        """The rows of an iterator result: its stored bytes when it hands them over and
        they can be decoded in bulk (with how to decode them), else its ``KeyValue``s."""
        if _BULK_DECODE and self.bulk and isinstance(value, ScanIterator):
            chunks = value.take_chunks()
            if chunks is not None:
                return chain.from_iterable(chunks), _Stored(value.decode, value.key_offset)
        return iter(value), None

    def shape(self, segments: _Segments) -> dict[str, _Column]:
        """``columns`` of runs of rows, decoding stored bytes in bulk where exact, else
        row by row with the engine's decoder."""
        hows = [how for _, _, how in segments]
        if hows and all(hows) and len({h.key_offset for h in hows if h}) == 1:
            cols = self._bulk_columns([(p, rows) for p, rows, _ in segments], hows[0].key_offset)
            if cols is not None:
                return cols
        return self.columns(
            [(p, rows if how is None else how.decode(rows)) for p, rows, how in segments]
        )

    def _bulk_columns(
        self, segments: Sequence[tuple[int, Sequence[tuple[bytes, bytes]]]], key_offset: int
    ) -> dict[str, _Column] | None:
        """``columns`` of stored rows, decoded a column at a time by Arrow, or ``None``
        when that would not be exactly what the row path gives."""
        keys, values = _keys_and_values(segments)
        records = self.records
        fields = _json_records(values) if records else []
        value = None if records else self.value_serde.decode_arrow(values)
        if fields is None or (value is None and not records):
            return None
        cols = {PARTITION: _Column(self._partitions(segments))}
        if self.key_hint is not None:
            key = self.key_serde.decode_arrow(keys, key_offset)
            if key is None:
                return None
            cols[KEY] = _Column(key)
        else:  # ordered, json: the serde's own chunk decoder, then as the row path
            self._key_columns(self.key_serde.deserialize_many(keys, key_offset), cols)
        if value is not None:  # as the row path: not renamed (it is not a record field)
            cols[VALUE] = _Column(value)
            return cols
        for f, array in fields:
            cols[self.rows.field_column(f, cols)] = _Column(array)
        return cols

    @staticmethod
    def _partitions(segments: Sequence[tuple[int, Sequence[Any]]]) -> pa.Array:
        counts = [len(rows) for _, rows in segments]
        parts = np.repeat(
            np.array([p for p, _ in segments], dtype=np.int32), np.array(counts, dtype=np.int64)
        )
        return pa.array(parts, pa.int32())

    def empty_columns(self) -> dict[str, _Column]:
        """The columns of a result without rows (types from the serdes where known)."""
        types = self.rows.arrow_types().items()
        return {name: _Column(pa.array([], t or pa.null())) for name, t in types}

    def columns(
        self, segments: Sequence[tuple[int, Sequence[KeyValue[Any, Any]]]]
    ) -> dict[str, _Column]:
        """Columns of the rows of ``segments`` — runs of ``(partition, rows)`` — in order.

        Types come from the values, or from the serde where it fixes them; never from a
        wanted schema: ``pa.array(values, type=...)`` converts lossily (quirk: ``5.5``
        becomes ``5`` in an int64 column, ``str`` becomes binary), so a schema is applied
        afterwards with Arrow's safe ``cast``, which refuses to lose data."""
        cols = {PARTITION: _Column(self._partitions(segments))}
        keys, values = _keys_and_values(segments)
        starts: list[int] = []
        ends: list[int] = []
        if self.windowed:
            windows = keys
            keys = list(map(attrgetter("key"), windows))
            starts = list(map(attrgetter("start"), windows))
            ends = list(map(attrgetter("end"), windows))
        self._key_columns(keys, cols)
        if self.windowed:
            cols[WINDOW_START] = _column(starts, TIMESTAMP)
            cols[WINDOW_END] = _column(ends, TIMESTAMP)
        self._value_columns(values, cols)
        return cols

    def _key_columns(self, keys: list[Any], cols: dict[str, _Column]) -> None:
        is_tuple = list(map(isinstance, keys, repeat(tuple)))
        if not self.key_names and not any(is_tuple):
            cols[KEY] = _column(keys, self.key_hint)
            return
        if not all(is_tuple):
            keys = self.rows.key_parts(keys)  # a bare key is the 1-tuple (k,)
        lengths = set(map(len, keys))
        width = max(max(lengths, default=0), len(self.key_names), 1)
        for i in range(width):
            if min(lengths, default=0) > i:
                element = list(map(itemgetter(i), keys))
            else:
                element = [k[i] if len(k) > i else None for k in keys]
            cols[self.rows.key_element_column(i)] = _column(element, None)

    def _value_columns(self, values: list[Any], cols: dict[str, _Column]) -> None:
        if not values or not all(map(isinstance, values, repeat(dict))):
            cols[VALUE] = _column(values, self.value_hint)
            return
        fields = dict.fromkeys(chain.from_iterable(values))  # first-seen order, in C
        every_row_has_all = min(map(len, values)) == len(fields)
        for f in fields:
            name = self.rows.field_column(f, cols)
            if every_row_has_all:
                column = list(map(itemgetter(f), values))
            else:
                column = [v.get(f) for v in values]
            cols[name] = _column(column, None)


# -- putting chunks together ---------------------------------------------------------------
def _unified_type(name: str, types: list[pa.DataType]) -> pa.DataType | None:
    """The type every chunk's column can be cast to (Arrow's permissive promotion:
    int → double, null → anything, structs merged), or ``None`` when there is none."""
    distinct = list(dict.fromkeys(t for t in types if not pa.types.is_null(t)))
    if not distinct:
        return pa.null()
    if len(distinct) == 1:
        return distinct[0]
    try:
        schema = pa.unify_schemas(
            [pa.schema([pa.field(name, t)]) for t in distinct], promote_options="permissive"
        )
    except _ARROW_ERRORS:
        return None
    return schema.field(name).type


def _as_json(column: _Column) -> pa.Array:
    return column.array if column.json else _json_texts(column.array.to_pylist())


def _loose_text(column: _Column) -> pa.Array:
    """Text for a column whose type was unknown when a stream's schema was fixed:
    strings as they are, any other value as JSON text."""
    if not column.json:
        if pa.types.is_string(column.array.type):
            return column.array
        return _json_texts(column.array.to_pylist())
    texts = column.array.to_pylist()
    out = []
    for text in texts:
        value = None if text is None else json.loads(text)
        out.append(value if isinstance(value, str) else text)
    return pa.array(out, pa.string())


def _assemble(chunks: list[dict[str, _Column]]) -> pa.Table:
    """One table from chunks whose columns may differ (a field missing in one chunk, ints
    in one and floats in another): the union of columns in first-seen order."""
    names = list(dict.fromkeys(chain.from_iterable(chunks)))
    arrays: list[list[pa.Array]] = [[] for _ in chunks]
    fields = []
    for name in names:
        present = [c[name] for c in chunks if name in c]
        target = (
            None
            if any(c.json for c in present)
            else _unified_type(name, [c.array.type for c in present])
        )
        converted: list[pa.Array | None] = []
        if target is not None:
            try:
                converted = [c[name].array.cast(target) if name in c else None for c in chunks]
            except _ARROW_ERRORS:
                target = None
        if target is None:  # no common type: JSON text everywhere, as within one chunk
            target = pa.string()
            converted = [_as_json(c[name]) if name in c else None for c in chunks]
        fields.append(pa.field(name, target))
        for i, (chunk, array) in enumerate(zip(chunks, converted, strict=True)):
            n = len(chunk[PARTITION].array)
            arrays[i].append(array if array is not None else pa.nulls(n, target))
    schema = pa.schema(fields)
    return pa.Table.from_batches(
        [pa.RecordBatch.from_arrays(a, schema=schema) for a in arrays], schema=schema
    )


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
    json_cols = {n for n, c in cols.items() if c.json}
    # Only nulls seen: no type to infer, so text (later strings as is, others JSON).
    loose = {n for n, c in cols.items() if pa.types.is_null(c.array.type)}
    schema = pa.schema(
        [pa.field(n, pa.string() if n in loose else c.array.type) for n, c in cols.items()]
    )
    rows = sum(len(r) for _, r, _ in sample)
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


def _keys_and_values(segments: Sequence[tuple[int, Sequence[Any]]]) -> tuple[list, list]:
    """The keys and the values of the rows of ``segments`` (runs of ``(partition, rows)``;
    a row is a stored ``(key, value)`` pair or a ``KeyValue``), in order: two lists, so
    each column is built by one pass of C code."""
    rows = (
        segments[0][1] if len(segments) == 1 else list(chain.from_iterable(r for _, r in segments))
    )
    return list(map(itemgetter(0), rows)), list(map(itemgetter(1), rows))
