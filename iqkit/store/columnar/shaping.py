"""Rows into Arrow columns: how ``iqkit.tables`` shapes a chunk of a query result or of a
store scan (``collect`` and ``store_batches`` build rows the same way, here):

* The columns are the row schema's (:mod:`iqkit.store.rows`, shared with the Spark reader):
  ``partition`` (int32), the key (one column ``key``, or for tuple keys one column per
  element), for window stores ``window_start`` and ``window_end``
  (``timestamp[ms, tz=UTC]``), then the value: dict values (JSON records) become one
  column per field in first-seen order, any other value is one column ``value``; a store
  with a value schema (``RowSchema.value_arrow_schema``) has its declared columns, of
  its declared types, whatever the rows hold.
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
records with ``pyarrow.json`` (a typed store's with its value schema as the explicit
schema, ``_typed_records``: decimals exact, as the engine's decoder gives them). That is
done only where it provably gives what the row path gives (``_json_records`` and
``_typed_records`` list the checks); any other chunk is decoded row by row by the
engine's own decoder, so values, types and errors never depend on which path ran.
"""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from ...errors import IqkitError
from ...query import (
    KeyValue,
    KeyValueIterator,
    Query,
    RawKeyQuery,
    RawScanQuery,
)
from ..encoding.serde_arrow import binary_array, numbers_array, utf8_array
from ..manifest import StoreManifest
from ..partitions.layers import ScanIterator
from ..rows import (
    PARTITION,
    VALUE,
    WINDOW_END,
    WINDOW_START,
    RowSchema,
    arrow_timestamp,
    value_decoders,
)

if TYPE_CHECKING:
    pass

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
    return all(map(_leaf_as_pa_array_type, _leaves(array)))


def _leaf_as_pa_array_type(leaf: pa.Array) -> bool:
    t = leaf.type
    if pa.types.is_float64(t):
        if leaf.null_count == len(leaf):
            return True
        import pyarrow.compute as pc  # here, not on top: a commit of no doubles skips it

        # Strictly below: 2**53 + 1 reads as the double 2**53. NaN compares false.
        # The bound as an Arrow scalar made from a buffer: pa.scalar imports pandas.
        bound = numbers_array(np.array([_EXACT_DOUBLE_INT], np.float64), pa.float64())[0]
        within = pc.less(pc.abs(leaf), bound)
        return bool(pc.all(within).as_py())
    return t in (pa.null(), pa.bool_(), pa.int64(), pa.string())


def _leaves(array: pa.Array) -> Iterator[pa.Array]:
    """The arrays of ``array``'s values that hold no others: a struct's fields and a
    list's items, all the way down, else ``array`` itself."""
    t = array.type
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            yield from _leaves(array.field(i))
    elif pa.types.is_list(t):
        yield from _leaves(array.flatten())
    else:
        yield array


def _read_json(data: bytes, schema: pa.Schema | None = None, unexpected: str = "infer") -> pa.Table:
    """``data`` (JSON objects, one per line) read by ``pyarrow.json`` as one block on one
    thread. Quirk: with several blocks on several threads, the order of the columns
    depends on which block is done first, while it must be the order fields are first
    seen in (and one block keeps type inference to the rules ``_json_records`` checks)."""
    return pa_json.read_json(
        pa.BufferReader(data),
        read_options=pa_json.ReadOptions(use_threads=False, block_size=len(data) + 1),
        parse_options=pa_json.ParseOptions(
            explicit_schema=schema, newlines_in_values=False, unexpected_field_behavior=unexpected
        ),
    )


def _joined_objects(values: list[bytes]) -> bytes | None:
    """``values`` joined with newlines when that is exactly one JSON object per line of
    valid UTF-8 without raw control characters (what ``pyarrow.json`` must be given to
    read what ``json.loads`` reads: ``_json_records`` says why), else ``None``."""
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
    # One UTF-8 check of everything, as str(data, "utf-8") of each value (the newlines
    # joining them are ASCII).
    return joined if utf8_array(binary_array([joined])) is not None else None


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
    joined = _joined_objects(values)
    if joined is None:
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


# -- decoding a typed store's stored records in bulk -----------------------------------------
def _readable(t: pa.DataType, top: bool) -> pa.DataType | None:
    """The type ``pyarrow.json`` reads a declared column of type ``t`` as, so that it
    accepts exactly what the row path (``RowSchema.value_arrow_arrays``) accepts; then
    ``_typed_fix`` makes ``t`` of it. ``None``: no such type (maps, which it cannot read;
    binary inside another type).

    Quirks: it reads dates only from numbers of days (Spark writes ``2024-02-29``) and
    binary as the text itself (Spark writes base64): both are read as strings; a naive
    timestamp as a string too, since it would move one with an offset to UTC where the
    row path drops the offset; float32 as a double (the row path rounds the double)."""
    if pa.types.is_map(t) or (pa.types.is_binary(t) and not top):
        return None
    if pa.types.is_date(t) or pa.types.is_binary(t):
        return pa.string()
    if pa.types.is_timestamp(t) and t.tz is None:
        return pa.string()
    if pa.types.is_float32(t):
        return pa.float64()
    if pa.types.is_list(t):
        item = _readable(t.value_type, False)
        return None if item is None else pa.list_(t.value_field.with_type(item))
    if pa.types.is_struct(t):
        members = [_readable(f.type, False) for f in t]
        if any(m is None for m in members):
            return None
        return pa.struct([f.with_type(m) for f, m in zip(t, members, strict=True)])
    return t


def _all_finite(array: pa.Array) -> bool:
    """Whether every double of ``array`` (nested too) is finite: ``pyarrow.json`` reads
    ``Inf`` and ``-NaN``, which the row path refuses as JSON."""
    floats = [leaf for leaf in _leaves(array) if pa.types.is_floating(leaf.type)]
    if not floats:
        return True
    import pyarrow.compute as pc  # here, not on top: a commit of no doubles skips it

    return all(pc.all(pc.fill_null(pc.is_finite(f), True)).as_py() is not False for f in floats)


def _typed_fix(array: pa.Array, t: pa.DataType) -> pa.Array:
    """A column read as ``_readable(t)`` made ``t`` (``ValueError`` where it does not
    fit: the row path then decides)."""
    if array.type == t:
        return array
    if pa.types.is_binary(t):
        import base64

        texts = array.to_pylist()
        return pa.array(
            [None if v is None else base64.b64decode(v, validate=True) for v in texts], t
        )
    if pa.types.is_float32(t):
        return array.cast(t, safe=False)  # as pa.array does with a double
    return array.cast(t)


def _typed_records(values: list[bytes], schema: pa.Schema) -> list[pa.Array] | None:
    """The declared columns of a typed store's stored records read by ``pyarrow.json``
    with the value schema as its explicit schema, equal to what the row path makes of
    them (``RowSchema.value_arrow_arrays``), or ``None`` when that is not certain.

    Exact where ``json.loads`` is not: decimals are parsed from their digits. Strict as
    the row path: ``pyarrow.json`` with an explicit schema refuses a string in a number
    column, a number in a string or boolean column, an int beyond its width, a fraction
    in an int column and a member the schema does not declare (each goes the row path,
    which names it); ``_readable`` and ``_all_finite`` cover the rest."""
    read = [_readable(f.type, True) for f in schema]
    if any(r is None for r in read):
        return None
    joined = _joined_objects(values)
    if joined is None:
        return None
    read_schema = pa.schema([f.with_type(r) for f, r in zip(schema, read, strict=True)])
    try:
        table = _read_json(joined, read_schema, unexpected="error")
        if table.num_rows != len(values):
            return None
        out = []
        for f in schema:
            column = table.column(f.name)
            array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
            if not _all_finite(array):
                return None
            if pa.types.is_nested(array.type):
                array.validate(full=True)  # quirk: see _json_records
            out.append(_typed_fix(array, f.type))
    except (*_ARROW_ERRORS, ValueError):
        return None
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
    the row schema's layout (``iqkit.store.rows``)."""

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
        #: Stored values decoded row by row as the engine decodes them (a typed store's
        #: decimals exact).
        self.values_de = value_decoders(manifest)[1]
        #: Declared tuple keys: always one column per element, even for short keys.
        self.key_names = self.rows.tuple_key_columns
        #: The one key column's name (``key``, or a typed store's written name).
        self.key_column = self.rows.key_column
        #: A typed store's value columns (member → column); empty: types are inferred.
        self.value_names = self.rows.value_column_names()
        #: JSON records are decoded in bulk by ``_json_records`` (a typed store's by
        #: ``_typed_values``).
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
        records = self.records and not self.value_names
        fields = _json_records(values) if records else []
        value = None if records or self.value_names else self.value_serde.decode_arrow(values)
        if fields is None or (value is None and not records and not self.value_names):
            return None
        cols = {PARTITION: _Column(self._partitions(segments))}
        if self.key_hint is not None:
            key = self.key_serde.decode_arrow(keys, key_offset)
            if key is None:
                return None
            cols[self.key_column] = _Column(key)
        else:  # ordered, json: the serde's own chunk decoder, then as the row path
            self._key_columns(self.key_serde.deserialize_many(keys, key_offset), cols)
        if self.value_names:
            schema = self.rows.value_arrow_schema()
            arrays = _typed_records(values, schema) if values else None
            if arrays is None:  # the row path decides (and names what does not fit)
                self._typed_values(self.values_de(values), cols)
                return cols
            for member, array in zip(self.value_names, arrays, strict=True):
                cols[self.value_names[member]] = _Column(array)
            return cols
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
        return numbers_array(parts, pa.int32())

    @staticmethod
    def twin_ready(value: Any) -> bool:
        """Whether ``twin_take`` of ``value`` would give its twin tables."""
        return bool(_BULK_DECODE and isinstance(value, ScanIterator) and value.has_twin())

    def twin_take(self, value: KeyValueIterator[Any, Any]) -> Iterator[pa.Table] | None:
        """The tables of a scan read from columnar twins (``ScanIterator.take_twin``),
        or None when ``value`` is not one (or bulk decoding is off: then every path
        decodes the stored bytes, which tests compare against). Without ``__key`` where
        the scan derives it for nothing: tables leave the twin's own columns out."""
        if not (_BULK_DECODE and isinstance(value, ScanIterator)):
            return None
        return value.take_twin(keys=False)  # type: ignore[no-any-return]

    def empty_columns(self) -> dict[str, _Column]:
        """The columns of a result without rows (types from the serdes where known)."""
        types = self.rows.arrow_types().items()
        return {name: _Column(pa.nulls(0, t or pa.null())) for name, t in types}

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
            cols[self.key_column] = _column(keys, self.key_hint)
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

    def _typed_values(self, values: list[Any], cols: dict[str, _Column]) -> None:
        """A typed store's value columns, of its declared types (``RowSchema``); a value
        that does not fit them raises ``IqkitError`` naming the store and column."""
        try:
            arrays = self.rows.value_arrow_arrays(values)
        except ValueError as exc:
            raise IqkitError(str(exc)) from None
        for member, array in zip(self.value_names, arrays, strict=True):
            cols[self.value_names[member]] = _Column(array)

    def _value_columns(self, values: list[Any], cols: dict[str, _Column]) -> None:
        if self.value_names:
            self._typed_values(values, cols)
            return
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
            n = len(next(iter(chunk.values())).array)
            arrays[i].append(array if array is not None else pa.nulls(n, target))
    schema = pa.schema(fields)
    return pa.Table.from_batches(
        [pa.RecordBatch.from_arrays(a, schema=schema) for a in arrays], schema=schema
    )


def _keys_and_values(segments: Sequence[tuple[int, Sequence[Any]]]) -> tuple[list, list]:
    """The keys and the values of the rows of ``segments`` (runs of ``(partition, rows)``;
    a row is a stored ``(key, value)`` pair or a ``KeyValue``), in order: two lists, so
    each column is built by one pass of C code."""
    rows = (
        segments[0][1] if len(segments) == 1 else list(chain.from_iterable(r for _, r in segments))
    )
    return list(map(itemgetter(0), rows)), list(map(itemgetter(1), rows))
