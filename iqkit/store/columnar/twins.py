"""The columnar twin of an SST: the same rows as one Parquet file, in the row layout.

Every SST a commit writes to a key-value store's chain (a delta, a compacted base, a
Spark task's fragment) gets a twin uploaded beside it, ``<same name>.parquet``
(``twin_key``), and the chain record lists its size (``ChainFile.twin``). A twin holds
the SST's user rows, sorted by their RocksDB key like the SST, as columns:

* ``__key`` (binary): the RocksDB key. Merging a chain's files (newest wins) and the
  bounds of range and prefix scans compare it, and each row group's min/max statistics
  of it let a bounded scan skip row groups without reading them.
* ``__deleted`` (bool): a tombstone. It hides the key's rows in older files and is not
  a row itself; its other columns are null.
* the row layout's columns without ``partition`` (:mod:`iqkit.store.rows`): the key
  (``key``, or one column per tuple element) and the value (``value``, or one column per
  field of a JSON record), typed. They are made by the same code that shapes a scan of
  the SST (:mod:`iqkit.store.columnar.shaping`), so both paths give the same columns; a
  column that code keeps as JSON text is marked in its field metadata (``JSON_TEXT``).
* ``__value`` (binary), only for value serdes whose typed columns cannot give the stored
  value back exactly (``json``, ``ordered``): the stored bytes, so a scan that hands out
  ``KeyValue`` rows decodes them exactly as it would from RocksDB.

The commit record and iqkit's other reserved keys are not rows and are not in a twin.
Window stores have no twins yet: their scans read RocksDB (docs/DECISIONS.md).

pyarrow is imported here, so this module is imported only where twins are written or
read (never by ``import iqkit``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import IqkitError
from ..encoding.keyspace import KV_LOWER, KV_UPPER, RAW_PREFIX_LEN
from ..encoding.serdes import get_serde
from ..manifest import StoreManifest
from ..names import TWIN_SUFFIX, twin_key
from ..rows import PARTITION, VALUE, value_decoders
from .shaping import _Shaper, _Stored

__all__ = [
    "DELETED",
    "HIDDEN",
    "JSON_TEXT",
    "KEY_BYTES",
    "LAYOUT",
    "ROW_GROUP_ROWS",
    "TWIN_SUFFIX",
    "VALUE_BYTES",
    "keeps_value_bytes",
    "layout_of",
    "twin_key",
    "try_write",
    "twin_table",
    "write_twin",
    "write_twin_of_arrays",
]

KEY_BYTES = "__key"
DELETED = "__deleted"
VALUE_BYTES = "__value"
#: The twin's own columns, never shown as row columns.
HIDDEN = (KEY_BYTES, DELETED, VALUE_BYTES)
#: Field metadata marking a column of JSON text (values without one Arrow type).
JSON_TEXT = b"iqkit.json_text"
#: Schema metadata: the layout the twin was written for (``layout_of``).
LAYOUT = b"iqkit.layout"
#: Rows per row group: small enough that a 1% prefix scan of a 1M-row store skips most of
#: a file by statistics, big enough that a full scan is not dominated by per-group work.
ROW_GROUP_ROWS = 16_384


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


def keeps_value_bytes(manifest: StoreManifest) -> bool:
    """Whether twins of this store hold ``__value``: the value serde has no Arrow type
    whose column gives the stored value back exactly (``json``, ``ordered``)."""
    return get_serde(manifest.value_serde).arrow_type() is None


def _kv_decoder(manifest: StoreManifest) -> Any:
    """What a key-value scan's ``ScanIterator`` decodes stored rows with (the row path)."""
    from ...query import KeyValue

    keys_de = get_serde(manifest.key_serde).deserialize_many
    _, values_de = value_decoders(manifest)

    def decode(chunk: Sequence[tuple[bytes, bytes]]) -> list[Any]:
        if not chunk:
            return []
        raw_keys, raw_values = zip(*chunk, strict=True)
        pairs = zip(keys_de(raw_keys, RAW_PREFIX_LEN), values_de(raw_values), strict=True)
        return [KeyValue(k, v) for k, v in pairs]

    return decode


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
    else:
        cols = shaper.empty_columns()
    cols.pop(PARTITION)
    arrays: list[pa.Array] = [pa.array([k for k, _ in live], pa.binary())]
    fields = [pa.field(KEY_BYTES, pa.binary(), nullable=False)]
    arrays.append(pa.array([False] * len(live), pa.bool_()))
    fields.append(pa.field(DELETED, pa.bool_(), nullable=False))
    if keeps_value_bytes(manifest):
        arrays.append(pa.array([v for _, v in live], pa.binary()))
        fields.append(pa.field(VALUE_BYTES, pa.binary()))
    for name, column in cols.items():
        arrays.append(column.array)
        metadata = {JSON_TEXT: b"1"} if column.json else None
        fields.append(pa.field(name, column.array.type, metadata=metadata))
    schema = pa.schema(fields, metadata={LAYOUT: layout_of(manifest)})
    table = pa.Table.from_arrays(arrays, schema=schema)
    if dead:
        tombstones = pa.Table.from_arrays(
            [
                pa.array(dead, pa.binary()) if f.name == KEY_BYTES
                else pa.array([True] * len(dead)) if f.name == DELETED
                else pa.nulls(len(dead), f.type)
                for f in schema
            ],
            schema=schema,
        )
        table = pa.concat_tables([table, tombstones]).sort_by(KEY_BYTES)
    return table


def write_twin(path: str | os.PathLike[str], table: pa.Table) -> int:
    """Write ``table`` (``twin_table``'s) as Parquet at ``path``; its size in bytes.

    zstd; ``__key`` unencoded by dictionary (keys are unique) and with statistics (row
    groups are skipped by them); ``ROW_GROUP_ROWS`` rows per row group."""
    pq.write_table(
        table,
        os.fspath(path),
        row_group_size=ROW_GROUP_ROWS,
        compression="zstd",
        use_dictionary=[c for c in table.column_names if c not in (KEY_BYTES, VALUE_BYTES)],
        write_statistics=True,
        # Quirk: by default nested lists are written with Parquet's child name
        # "element", and read back so: the columns would not equal a scan's ("item").
        use_compliant_nested_type=False,
    )
    return os.path.getsize(path)


def write_twin_of_rows(
    path: str | os.PathLike[str],
    manifest: StoreManifest,
    rows: Sequence[tuple[bytes, bytes | None]],
) -> int:
    """Write the twin of an SST holding ``rows`` (``twin_table``) at ``path``."""
    return write_twin(path, twin_table(manifest, rows))


def write_merged_twin(
    path: str | os.PathLike[str],
    manifest: StoreManifest,
    older: Sequence[str | os.PathLike[str]],
    delta_rows: Sequence[tuple[bytes, bytes | None]],
) -> int:
    """Write at ``path`` the twin of a compacted base: the live rows of the twins
    ``older`` (oldest first) with the delta ``delta_rows`` on top, merged in C
    (``TwinScan``) rather than decoded again from the base's bytes."""
    from .scan import TwinScan

    delta = f"{os.fspath(path)}.delta"
    write_twin(delta, twin_table(manifest, delta_rows))
    try:
        table = TwinScan([*older, delta], KV_LOWER, KV_UPPER).table()
    finally:
        os.unlink(delta)
    return write_twin(path, table)


def stored_rows(table: pa.Table, value_serde: Any) -> list[tuple[bytes, bytes]]:
    """The rows of a twin table as the ``(key, value)`` bytes RocksDB holds for them:
    ``__value`` when the twin keeps it, else the ``value`` column serialized back
    (exact for the serdes whose twins have no ``__value``: ``keeps_value_bytes``)."""
    keys = table.column(KEY_BYTES).to_pylist()
    if VALUE_BYTES in table.column_names:
        values = table.column(VALUE_BYTES).to_pylist()
    else:
        column = table.column(VALUE).combine_chunks()
        encoded = value_serde.serialize_arrow(column)
        values = (
            encoded.to_pylist()
            if encoded is not None
            else [value_serde.serialize(v) for v in column.to_pylist()]
        )
    return list(zip(keys, values, strict=True))


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
