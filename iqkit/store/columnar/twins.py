"""The columnar twin of an SST: the same rows as one Parquet file, in the row layout.

Every SST a commit writes to a key-value store's chain (a delta, a compacted base, a
Spark task's fragment) gets a twin uploaded beside it, ``<same name>.parquet``
(``twin_key``), and the chain record lists its size (``ChainFile.twin``). A twin holds
the SST's user rows, sorted by their RocksDB key like the SST, as columns:

* ``__key`` (binary): the RocksDB key, for keys whose column cannot give it back
  (``ordered`` and ``json`` keys, ``double`` keys). Merging a chain's files (newest wins)
  and the bounds of range and prefix scans compare RocksDB keys; for the other serdes
  (string, bytes, int32, int64: ``key_column_of``) a reader derives them from the key
  column (``key_bytes``), whose row group statistics also let a bounded scan skip row
  groups without reading them.
* ``__deleted`` (bool): a tombstone. It hides the key's rows in older files and is not
  a row itself; its key columns are set, its value columns null.
* the row layout's columns without ``partition`` (:mod:`iqkit.store.rows`): the key
  (``key``, or one column per tuple element) and the value (``value``, or one column per
  field of a JSON record), typed. They are made by the same code that shapes a scan of
  the SST (:mod:`iqkit.store.columnar.shaping`), so both paths give the same columns; a
  column that code keeps as JSON text is marked in its field metadata (``JSON_TEXT``).

A twin holds no stored value bytes: where the typed columns cannot give a stored value
back exactly (``json`` and ``ordered`` values), a scan's ``KeyValue`` rows are read from
RocksDB and only its tables (``collect``, ``store_batches``, SQL, Spark) from the twin;
that keeps a twin well under the size of its SST. Keys sorted and unique are written
with Parquet's delta encoding; a column takes a dictionary only when it repeats values.

The commit record and iqkit's other reserved keys are not rows and are not in a twin.
Window stores have no twins yet: their scans read RocksDB (docs/DECISIONS.md "Twins beside SSTs").

pyarrow is imported here, so this module is imported only where twins are written or
read (never by ``import iqkit``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import IqkitError
from ..encoding.keyspace import KV_LOWER, KV_UPPER, RAW_PREFIX_LEN, kv_key, kv_keys_arrow
from ..encoding.serde_arrow import binary_array, bools_array
from ..encoding.serdes import get_serde
from ..manifest import StoreManifest
from ..names import TWIN_SUFFIX, twin_key
from ..partitions.layers import kv_chunk_decoder
from ..rows import PARTITION, RowSchema, ddl_arrow_type, value_decoders
from .shaping import _Column, _Shaper, _Stored

__all__ = [
    "DELETED",
    "HIDDEN",
    "JSON_TEXT",
    "KEY_BYTES",
    "LAYOUT",
    "ROW_GROUP_ROWS",
    "TWIN_SUFFIX",
    "KEY_FROM",
    "key_bounds",
    "key_bytes",
    "serialized_keys",
    "key_column_of",
    "values_from_columns",
    "layout_of",
    "twin_key",
    "try_write",
    "twin_table",
    "twin_table_columns",
    "TwinWriter",
    "write_twin",
    "write_twin_of_arrays",
    "twin_of_columns",
    "twin_source_columns",
    "twin_table_of_columns",
    "twin_table_of_records",
    "write_twin_of_columns",
]

KEY_BYTES = "__key"
DELETED = "__deleted"
#: The twin's own columns, never shown as row columns.
HIDDEN = (KEY_BYTES, DELETED)
#: Field metadata marking a column of JSON text (values without one Arrow type).
JSON_TEXT = b"iqkit.json_text"
#: Schema metadata: the layout the twin was written for (``layout_of``).
LAYOUT = b"iqkit.layout"
#: Schema metadata: the column ``__key`` is derived from when the twin does not hold it.
KEY_FROM = b"iqkit.key_from"
#: Rows per row group: small enough that a 1% prefix scan of a 1M-row store skips most of
#: a file by statistics, big enough that a full scan is not dominated by per-group work.
ROW_GROUP_ROWS = 16_384
#: Rows a ``TwinWriter`` shapes at a time (a multiple of ``ROW_GROUP_ROWS``).
TWIN_CHUNK_ROWS = 4 * ROW_GROUP_ROWS
#: Twins with fewer rows take no dictionary in their non-boolean columns (``_repeats``).
DICTIONARY_MIN_ROWS = 1_024


def layout_of(manifest: StoreManifest) -> bytes:
    """What a twin's columns depend on: the serdes and the manifest's properties (key
    column names, value schema). A twin whose recorded layout differs from its store's
    manifest (only a manifest edited by hand can make one) is not read: scans of its
    partition read RocksDB."""
    import json

    facts = {
        "key_serde": manifest.key_serde,
        "value_serde": manifest.value_serde,
        "properties": manifest.properties,
    }
    return json.dumps(facts, sort_keys=True, default=str).encode()


def key_column_of(manifest: StoreManifest) -> str | None:
    """The twin column whose values give ``__key`` back (the twin then has no
    ``__key``), or None (it has one)."""
    rows = RowSchema(manifest)
    if rows.tuple_key_columns or not get_serde(manifest.key_serde).keys_from_column:
        return None
    return rows.key_column


def values_from_columns(manifest: StoreManifest) -> bool:
    """Whether a twin's value column gives the stored values back exactly (the value
    serde has an Arrow type): a scan's ``KeyValue`` rows can then come from the twin."""
    return get_serde(manifest.value_serde).arrow_type() is not None


def key_bytes(table: pa.Table, column: str, key_serde: Any) -> pa.Array:
    """The RocksDB keys of a twin table without ``__key``: its key column serialized
    (vectorized) behind the key-value prefix."""
    return kv_keys_arrow(_serialized(table.column(column).combine_chunks(), key_serde))


def serialized_keys(values: pa.Array, key_serde: Any) -> pa.Array:
    """Values of a twin's key column serialized, without the prefix every key of a kv
    store has: what ordering them and finding them by bytes (``key_order``) needs.
    String keys are their UTF-8 bytes as they are (no validation pass)."""
    if key_serde.name == "string" and pa.types.is_string(values.type):
        return values.cast(pa.binary())
    return _serialized(values, key_serde)


def _serialized(values: pa.Array, key_serde: Any) -> pa.Array:
    encoded = key_serde.serialize_arrow(values)
    if encoded is None:
        encoded = pa.array([key_serde.serialize(v) for v in values.to_pylist()], pa.binary())
    return encoded


def key_bounds(stats: Any, key_serde: Any) -> tuple[bytes, bytes] | None:
    """The smallest and largest RocksDB key of a row group whose key column has the
    Parquet statistics ``stats``, or None when they do not bound it (then it is read).
    Integers bound it only within one sign (their stored bytes put negatives after)."""
    if stats is None or not stats.has_min_max:
        return None
    lo, hi = stats.min, stats.max
    if isinstance(lo, int) and (lo < 0) != (hi < 0):
        return None
    try:
        return kv_key(key_serde.serialize(lo)), kv_key(key_serde.serialize(hi))
    except (TypeError, ValueError, OverflowError):
        return None


def _kv_decoder(manifest: StoreManifest) -> Any:
    """What a key-value scan's ``ScanIterator`` decodes stored rows with (the row path)."""
    _, values_de = value_decoders(manifest)
    keys_de = get_serde(manifest.key_serde).deserialize_many
    return kv_chunk_decoder(keys_de, values_de, RAW_PREFIX_LEN)


def twin_table(manifest: StoreManifest, rows: Sequence[tuple[bytes, bytes | None]]) -> pa.Table:
    """The twin of an SST holding ``rows`` (its sorted ``(key, value)`` pairs; ``None``
    for a delete; reserved keys are skipped). Values that do not decode raise what a
    scan of them would (``ValueError``)."""
    user = [(k, v) for k, v in rows if KV_LOWER <= k < KV_UPPER]
    live = [(k, v) for k, v in user if v is not None]
    dead = [k for k, v in user if v is None]
    shaper = _Shaper(manifest, None)
    if live:
        cols = shaper.shape([(0, live, _Stored(_kv_decoder(manifest), RAW_PREFIX_LEN))])
    else:  # tombstones only: the columns the serdes fix (a JSON value has none)
        empty = shaper.empty_columns().items()
        cols = {n: c for n, c in empty if not pa.types.is_null(c.array.type)}
    cols.pop(PARTITION)
    derived = key_column_of(manifest)
    arrays: list[pa.Array] = []
    fields = []
    if derived is None:
        arrays.append(binary_array([k for k, _ in live]))
        fields.append(pa.field(KEY_BYTES, pa.binary(), nullable=False))
    arrays.append(bools_array(len(live), False))
    fields.append(pa.field(DELETED, pa.bool_(), nullable=False))
    for name, column in cols.items():
        arrays.append(column.array)
        metadata = {JSON_TEXT: b"1"} if column.json else None
        fields.append(pa.field(name, column.array.type, metadata=metadata))
    metadata = {LAYOUT: layout_of(manifest)}
    if derived is not None:
        metadata[KEY_FROM] = derived.encode()
    schema = pa.schema(fields, metadata=metadata)
    table = pa.Table.from_arrays(arrays, schema=schema)
    if dead:
        table = _with_tombstones(table, manifest, derived, dead)
    return table


def _with_tombstones(
    table: pa.Table, manifest: StoreManifest, derived: str | None, dead: list[bytes]
) -> pa.Table:
    """``table`` (live rows, sorted) with tombstones for the keys ``dead``, in key order.
    A tombstone's key is in the key column when ``__key`` is derived from it."""
    schema = table.schema
    n = len(dead)
    key_values = None
    if derived is not None:
        serde = get_serde(manifest.key_serde)
        key_values = serde.decode_arrow(dead, RAW_PREFIX_LEN)
        if key_values is None:
            key_values = pa.array(serde.deserialize_many(dead, RAW_PREFIX_LEN))
        key_values = key_values.cast(schema.field(derived).type)
    tombstones = pa.Table.from_arrays(
        [
            binary_array(dead) if f.name == KEY_BYTES
            else bools_array(n, True) if f.name == DELETED
            else key_values if f.name == derived
            else pa.nulls(n, f.type)
            for f in schema
        ],
        schema=schema,
    )
    import pyarrow.compute as pc  # here, not on top: a commit of no deletes skips it

    merged = pa.concat_tables([table, tombstones])
    keys = merged.column(KEY_BYTES) if derived is None else key_bytes(
        merged, derived, get_serde(manifest.key_serde)
    )
    return merged.take(pc.sort_indices(keys))


def write_twin(path: str | os.PathLike[str], table: pa.Table) -> int:
    """Write ``table`` (``twin_table``'s) as Parquet at ``path``; its size in bytes.

    zstd; ``__key`` unencoded by dictionary (keys are unique) and with statistics (row
    groups are skipped by them); ``ROW_GROUP_ROWS`` rows per row group; a CRC32 in every
    page header, which iqkit's pyarrow reads verify (``columnar.scan``): a damaged page
    is an error there, not wrong rows. The footer has no CRC (the chain record's
    checksum of the whole file covers it)."""
    pq.write_table(table, os.fspath(path), row_group_size=ROW_GROUP_ROWS, **_parquet_options(table))
    return os.path.getsize(path)


def _parquet_options(table: pa.Table) -> dict[str, Any]:
    """``write_twin``'s Parquet options for ``table`` (module docstring)."""
    delta = [
        f.name for f in table.schema
        if (f.name == KEY_BYTES or f.name.encode() == (table.schema.metadata or {}).get(KEY_FROM))
        and (pa.types.is_binary(f.type) or pa.types.is_string(f.type))
    ]  # fmt: skip
    dictionary = [c for c in table.column_names if c not in delta and _repeats(table, c)]
    # Floats that take no dictionary are split into a stream per byte: the sign and
    # exponent bytes repeat where the mantissa's do not, and zstd then finds them
    # (random doubles: 7.0 B a value against 7.5 unsplit; scans as fast or faster).
    split = [
        f.name for f in table.schema
        if pa.types.is_floating(f.type) and f.name not in dictionary
    ]  # fmt: skip
    return {
        "compression": "zstd",
        # Sorted unique keys: delta encoding (shared prefixes) beats a dictionary; other
        # columns take one only when they repeat values (a dictionary of unique
        # numbers costs more than the numbers).
        "use_dictionary": dictionary,
        "column_encoding": dict.fromkeys(delta, "DELTA_BYTE_ARRAY")
        | dict.fromkeys(split, "BYTE_STREAM_SPLIT")
        or None,
        "write_statistics": True,
        "write_page_checksum": True,
        # Quirk: by default nested lists are written with Parquet's child name
        # "element", and read back so: the columns would not equal a scan's ("item").
        "use_compliant_nested_type": False,
    }


class TwinWriter:
    """The twin of an SST written from a stream of sorted Arrow chunks (a commit's rows
    that went through ``SortedRows``), a piece at a time: rows are gathered to at least
    ``TWIN_CHUNK_ROWS``, shaped (``twin_table``) and appended as row groups, so memory
    holds one piece, not the SST.

    The first piece fixes the file's schema and encodings, so it waits for a live row
    (tombstones alone have no value columns). A later piece whose shaped columns differ
    is conformed to it where Arrow casts exactly (a field absent or all null in that
    piece, an integer column where the file has floats); otherwise the SST gets no twin
    (``try_write``'s rule: a commit never fails for want of a twin, and that SST's scans
    read RocksDB)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        manifest: StoreManifest,
        columns_of: Callable[[pa.Array], pa.Table | None] | None = None,
        *,
        keep_keys: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        #: The keys streamed by (``keep_keys``), for the delta's position deletes.
        self._keys: list[Any] | None = [] if keep_keys else None
        self.manifest = manifest
        #: The writer's own columns of rows by sequence number (``ArrowRows.twin_columns``):
        #: a piece of puts they cover is taken from them (``twin_of_columns``), not shaped.
        #: Chunks that carry those columns themselves need no look-up (``tee``).
        self.columns_of = columns_of
        self._writer: pq.ParquetWriter | None = None
        #: ``(keys, values, seqs, columns or None)`` not written yet.
        self._pending: list[tuple[Any, Any, Any, Any]] = []
        self._rows = 0
        self._live = 0
        self.failed = False

    def tee(self, chunks: Any) -> Any:
        """``chunks`` (``ArrowRows.sequenced_chunks``: ``(keys, values, seqs)``, with the
        writer's own columns of those rows as a fourth element where it kept them) passed
        on as ``(keys, values)`` pairs, each one added to the twin on the way."""
        for chunk in chunks:
            keys, values, seqs = chunk[:3]
            if self._keys is not None:
                self._keys.append(keys)
            if not self.failed:
                self._pending.append((keys, values, seqs, chunk[3] if len(chunk) > 3 else None))
                self._rows += len(keys)
                self._live += len(values) - values.null_count
                if self._rows >= TWIN_CHUNK_ROWS and (self._live or self._writer is not None):
                    self._write_pending()
            yield keys, values

    def _write_pending(self) -> None:
        pending, self._pending = self._pending, []
        deletes = self._rows - self._live
        self._rows, self._live = 0, 0
        try:
            table = self._of_columns(pending) if not deletes else self._with_deletes(pending)
            if table is None:
                rows = [
                    pair
                    for keys, values, *_ in pending
                    for pair in zip(keys.to_pylist(), values.to_pylist(), strict=True)
                ]
                table = twin_table(self.manifest, rows)
                del rows
            if self._writer is None:
                options = _parquet_options(table)
                self._writer = pq.ParquetWriter(self.path, table.schema, **options)
            elif table.schema != self._writer.schema:
                table = _conformed(table, self._writer.schema)
            self._writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        # What try_write takes as "no twin" (a value a scan could not decode, ...).
        except (pa.ArrowException, ValueError, TypeError, OverflowError, RecursionError,
                IqkitError):  # fmt: skip
            self._give_up()

    def _of_columns(self, pending: list[tuple[Any, Any, Any, Any]]) -> pa.Table | None:
        """The twin of a piece of puts from the writer's own columns, when it has them
        for every row of the piece (carried by the chunks, or looked up by sequence)."""
        if all(own is not None for *_, own in pending):
            columns = pa.concat_tables([own for *_, own in pending])
            return twin_of_columns(self.manifest, columns)
        if self.columns_of is None or any(seqs is None for _, _, seqs, _ in pending):
            return None
        seqs = pa.concat_arrays([s.combine_chunks() if isinstance(s, pa.ChunkedArray) else s
                                 for _, _, s, _ in pending])  # fmt: skip
        columns = self.columns_of(seqs)
        return None if columns is None else twin_of_columns(self.manifest, columns)

    def _with_deletes(self, pending: list[tuple[Any, Any, Any, Any]]) -> pa.Table | None:
        """The twin of a piece of puts and deletes as ``twin_table`` makes it (the live
        rows, then tombstones added in key order: ``_with_tombstones``), the puts taken
        from the writer's own columns (``_of_columns``); None when it has none for some
        put, or the piece has no put (the shaped path fixes its columns)."""
        import pyarrow.compute as pc  # here, not on top: a commit of no deletes skips it

        live, dead = [], []
        for keys, values, seqs, own in pending:
            if seqs is None and own is None:
                return None
            valid = values.is_valid()
            dead.extend(pc.filter(keys, pc.invert(valid)).to_pylist())
            live.append(
                (
                    pc.filter(keys, valid),
                    pc.filter(values, valid),
                    None if seqs is None else pc.filter(seqs, valid),
                    None if own is None else own.filter(valid),
                )
            )
        dead = [k for k in dead if KV_LOWER <= k < KV_UPPER]  # twin_table's rows
        if not any(len(keys) for keys, *_ in live):
            return None
        table = self._of_columns([piece for piece in live if len(piece[0])])
        if table is None or not dead:
            return table
        return _with_tombstones(table, self.manifest, key_column_of(self.manifest), dead)

    def _give_up(self) -> None:
        self.failed = True
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def keys(self) -> pa.Array:
        """The keys streamed by (``keep_keys``), in order, as one ``binary`` array."""
        chunks = [k.combine_chunks() if isinstance(k, pa.ChunkedArray) else k
                  for k in self._keys or []]  # fmt: skip
        return pa.concat_arrays(chunks) if chunks else pa.array([], pa.binary())

    def close(self, metadata: dict[bytes, bytes] | None = None) -> bool:
        """Finish the file, ``metadata`` added to its footer's (a delta's position
        deletes); False when the SST has no twin (nothing is left at ``path``)."""
        if not self.failed and (self._pending or self._writer is None):
            self._write_pending()  # the rest, or every row (even none) when few
        if self.failed:
            return False
        assert self._writer is not None
        if metadata:
            self._writer.add_key_value_metadata(metadata)
        try:
            self._writer.close()
        except (pa.ArrowException, OSError):
            self._give_up()
            return False
        self._writer = None
        return True


def _conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns, in its order and types: a column ``table``
    lacks is null; a column only ``table`` has, or a type Arrow cannot cast safely,
    raises ``ValueError`` (the SST then has no twin)."""
    extra = set(table.column_names) - set(schema.names)
    if extra:
        raise ValueError(f"twin chunk has columns the file lacks: {sorted(extra)}")
    arrays = []
    for field in schema:
        if field.name not in table.column_names:
            arrays.append(pa.nulls(table.num_rows, field.type))
            continue
        got = table.schema.field(field.name)
        if got.metadata != field.metadata:  # JSON text in one chunk, typed in another
            raise ValueError(f"twin chunk column {field.name!r} is shaped differently")
        arrays.append(table.column(field.name).cast(field.type, safe=True))
    return pa.Table.from_arrays(arrays, schema=schema)


def _repeats(table: pa.Table, name: str) -> bool:
    """Whether column ``name`` holds each value at least twice on average. Below
    ``DICTIONARY_MIN_ROWS`` rows no column but a boolean one is taken to: a dictionary
    there saves a few bytes at most, and counting would import ``pyarrow.compute``,
    which a small commit otherwise never needs (docs/DECISIONS.md "Start-up")."""
    column = table.column(name)
    if pa.types.is_boolean(column.type):
        return True
    if len(column) < DICTIONARY_MIN_ROWS or pa.types.is_nested(column.type):
        return False
    import pyarrow.compute as pc  # here, not on top: see above

    try:
        distinct = pc.count_distinct(column, mode="all").as_py()
    except pa.ArrowException:
        return False
    return 2 * distinct <= len(column)


def write_twin_of_rows(
    path: str | os.PathLike[str],
    manifest: StoreManifest,
    rows: Sequence[tuple[bytes, bytes | None]],
    metadata: dict[bytes, bytes] | None = None,
) -> int:
    """Write the twin of an SST holding ``rows`` (``twin_table``) at ``path``, with
    ``metadata`` added to its schema's (a delta's position deletes, ``deletes.py``)."""
    table = twin_table(manifest, rows)
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    return write_twin(path, table)


def twin_table_columns(p: int, table: pa.Table) -> dict[str, _Column]:
    """A twin table of partition ``p`` as shaped columns (the ``_Shaper.columns`` form
    ``iqkit.tables`` assembles): its row columns as they are (the twin was shaped by
    :mod:`iqkit.store.columnar.shaping` when it was written), its own left out."""
    n = table.num_rows
    cols = {PARTITION: _Column(pa.array(np.full(n, p, dtype=np.int32), pa.int32()))}
    for name, field in zip(table.column_names, table.schema, strict=True):
        if name in HIDDEN:
            continue
        column = table.column(name)
        array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        json_text = bool(field.metadata and field.metadata.get(JSON_TEXT))
        cols[name] = _Column(array, json=json_text)
    return cols


def row_columns(table: pa.Table) -> list[str]:
    """The row layout's columns of a twin table (its own columns left out)."""
    return [n for n in table.column_names if n not in HIDDEN]


def try_write(write: Any, path: str | os.PathLike[str], *args: Any) -> bool:
    """``write(path, *args)``, or False when the rows have no twin: values a scan could
    not decode, or columns Parquet cannot hold (a record field that is an empty object).
    Such an SST is published without a twin and its partition's scans read RocksDB; a
    commit never fails for want of a twin."""
    try:
        write(path, *args)
    # IqkitError: a typed store's value that does not fit its value schema (shaping).
    except (pa.ArrowException, ValueError, TypeError, OverflowError, RecursionError, IqkitError):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return False
    return True


def write_twin_of_arrays(
    path: str | os.PathLike[str], manifest: StoreManifest, keys: pa.Array, values: pa.Array
) -> bool:
    """Write at ``path`` the twin of an SST written from Arrow arrays (keys sorted,
    values aligned, null a delete: a Spark task's fragment); False when it has none
    (``try_write``)."""
    rows = list(zip(keys.to_pylist(), values.to_pylist(), strict=True))
    return try_write(write_twin_of_rows, path, manifest, rows)


def _copied_as_written(t: pa.DataType) -> bool:
    """Whether a typed store's member of Arrow type ``t`` can be copied into its twin as
    written: its JSON text reads back to the very same value (nested types are shaped
    from the stored rows)."""
    return (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_string(t)
        or pa.types.is_decimal(t)
        or pa.types.is_date32(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_binary(t)
    )


def twin_source_columns(manifest: StoreManifest) -> tuple[str, ...] | None:
    """The writer's own columns a twin of ``manifest``'s store can be made of directly
    (``twin_table_of_columns``): its key column and its value schema's members, under
    the names the writer gave them; ``None`` when a twin must be shaped from the stored
    rows instead (no value schema, a tuple key, a key serde whose column does not give
    the key back, a nested member)."""
    if not manifest.kind.has_twins:
        return None
    rows = RowSchema(manifest)
    if rows.value_schema is None or key_column_of(manifest) is None:
        return None
    try:
        members = rows.value_columns()
    except ValueError:
        return None
    if not all(_copied_as_written(ddl_arrow_type(t)) for _, t in members):
        return None
    return (rows.declared_key_columns[0], *(m for m, _ in members))


def twin_table_of_columns(manifest: StoreManifest, columns: pa.Table) -> pa.Table | None:
    """The twin of a fragment a Spark writer made from ``columns`` (the
    ``twin_source_columns`` of its rows, sorted by key, each key once, no deletes), taken
    as they are: a typed store's twin *is* its key column and its members, typed as
    declared, so nothing is encoded and decoded again. ``None`` when a column's type is
    not exactly its layout's (the caller then shapes the stored rows, ``twin_table``).

    Equal to ``twin_table`` of the fragment's stored rows (tests/store/test_twin_sources.py):
    each member's JSON text, as both Spark writers spell it, reads back to the value
    written."""
    names = twin_source_columns(manifest)
    if names is None or tuple(columns.column_names) != names:
        return None
    rows = RowSchema(manifest)
    key_type = rows.key_serde.arrow_type()
    targets = [(rows.key_column, key_type)]
    renamed = rows.value_column_names()
    targets += [(renamed[m], ddl_arrow_type(t)) for m, t in rows.value_columns()]
    arrays = [bools_array(columns.num_rows, False)]
    fields = [pa.field(DELETED, pa.bool_(), nullable=False)]
    for (name, target), column in zip(targets, columns.columns, strict=True):
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        if array.type != target:
            if not _same_instants(array.type, target):
                return None
            array = array.cast(target)  # the zone is metadata: the instants stay
        arrays.append(array)
        fields.append(pa.field(name, target))
    if arrays[1].null_count:  # a null key is refused before this; never a twin of one
        return None
    metadata = {LAYOUT: layout_of(manifest), KEY_FROM: rows.key_column.encode()}
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata))


def twin_of_columns(manifest: StoreManifest, columns: pa.Table) -> pa.Table | None:
    """The twin of puts made from a table's columns (``StoreWriter.put_table``: its key
    column, then its record's columns), taken as they are where that is exactly the
    twin of the stored rows: a typed store's (``twin_table_of_columns``), or a JSON
    store's without a value schema (``twin_table_of_records``); else None (shaped)."""
    if RowSchema(manifest).value_schema is not None:
        return twin_table_of_columns(manifest, columns)
    return twin_table_of_records(manifest, columns)


def _record_type(t: pa.DataType) -> pa.DataType | None:
    """The type shaping gives a JSON record field written from an Arrow column of type
    ``t`` (Spark's ``to_json`` spellings read back): integers up to 64 bits as ``int64``,
    doubles, strings, booleans; None for the others (a ``float32``'s text is not the
    double it widens to; nested and temporal values are shaped)."""
    if pa.types.is_signed_integer(t) or t in (pa.uint8(), pa.uint16(), pa.uint32()):
        return pa.int64()
    if t == pa.float64() or t == pa.bool_():
        return t
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.string()
    return None


def twin_table_of_records(manifest: StoreManifest, columns: pa.Table) -> pa.Table | None:
    """The twin of puts into a JSON store without a value schema made from the table they
    came from: ``columns`` is the key column, then the record's columns in order, rows
    sorted by key, each key once. None unless that is exactly what shaping the stored
    records gives (``twin_table``; tests/store/test_writer_buffer.py checks it): one key
    column of the key serde's own type, record columns of ``_record_type``s with no
    nulls (a null field is left out of its record, which changes the order fields are
    first seen in) or all nulls (such a field is never seen: no column)."""
    rows = RowSchema(manifest)
    derived = key_column_of(manifest)
    if manifest.value_serde != "json" or derived is None or columns.num_columns < 2:
        return None
    n = columns.num_rows
    key = _one_array(columns.column(0))
    key_type = rows.key_serde.arrow_type()
    if key_type is None or key.null_count:
        return None
    if key.type != key_type:
        if not (pa.types.is_large_string(key.type) and key_type == pa.string()):
            return None
        key = key.cast(key_type)
    arrays = [bools_array(n, False), key]
    fields = [pa.field(DELETED, pa.bool_(), nullable=False), pa.field(derived, key_type)]
    taken = {PARTITION, derived}
    for name, column in zip(columns.column_names[1:], columns.columns[1:], strict=True):
        array = _one_array(column)
        if n and array.null_count == n:
            continue
        target = _record_type(array.type)
        if target is None or array.null_count:
            return None
        field = RowSchema.field_column(name, taken)
        taken.add(field)
        arrays.append(array.cast(target))
        fields.append(pa.field(field, target))
    if len(arrays) == 2:  # records with no field: shaped (an empty object's twin)
        return None
    metadata = {LAYOUT: layout_of(manifest), KEY_FROM: derived.encode()}
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata))


def _one_array(column: Any) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def _same_instants(got: pa.DataType, want: pa.DataType) -> bool:
    """Timestamps of one unit, both with a zone: Spark hands Arrow its session's zone,
    a typed store declares UTC; the values (instants) are the same."""
    return (
        pa.types.is_timestamp(got)
        and pa.types.is_timestamp(want)
        and got.unit == want.unit
        and got.tz is not None
        and want.tz is not None
    )


def write_twin_of_columns(
    path: str | os.PathLike[str],
    manifest: StoreManifest,
    keys: pa.Array,
    values: pa.Array,
    columns: pa.Table | None,
) -> bool:
    """Write at ``path`` the twin of a Spark fragment: from the writer's own ``columns``
    where ``twin_table_of_columns`` takes them, else shaped from its stored rows
    (``write_twin_of_arrays``); False when it has none (``try_write``)."""
    table = None
    if columns is not None and not values.null_count:  # columns never stand for deletes
        table = twin_table_of_columns(manifest, columns)
    if table is None:
        return write_twin_of_arrays(path, manifest, keys, values)
    return try_write(write_twin, path, table)
