"""Arrow columns as the rows a store holds: serialized keys and values, store
partitions, RocksDB keys. The one home of that encoding for every bulk write:
``StoreWriter.put_table``, ``write_store`` (Spark's ``mapInArrow``) and
``df.write.format("iqkit")`` (``spark.write_encode.RowEncoder``), so a row reads back the
same whichever wrote it.

Whole Arrow columns at a time where the serde has a vectorized path
(``Serde.serialize_arrow``, ``Partitioner.partition_many``, ``keyspace.kv_keys_arrow``);
value by value otherwise, each error prefixed with the store. JSON values and records are
written as Spark's ``to_json`` writes them (``json_arrow``). NaN and infinities cannot be
JSON: a value column holding one is refused naming it (``non_finite_message``)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from . import keyspace
from .partitioners import Partitioner
from .serdes import Serde

__all__ = [
    "ENCODED",
    "arrow_has_non_finite",
    "encoded_batch",
    "explicit_partitions",
    "non_finite_message",
    "null_keys_error",
    "route",
    "serialize_column",
    "serialize_keys",
]


#: An encoded batch: store partition, RocksDB key, value bytes (null: a delete), sequence
#: (duplicate keys: the highest wins). ``write_store``'s Spark schema spells the same.
ENCODED = pa.schema(
    [("__p", pa.int32()), ("__k", pa.binary()), ("__v", pa.binary()), ("__seq", pa.int64())]
)


# -- the encoding both writes share ----------------------------------------------------------
def null_keys_error(store: str, column: str) -> ValueError:
    return ValueError(f"store {store!r}: key column {column!r} holds null keys")


def serialize_column(serde: Serde, col: pa.Array, store: str, role: str, name: str) -> pa.Array:
    """``serde.serialize`` of every value of column ``name`` (nulls stay null), as a
    ``binary`` array: the serde's vectorized ``serialize_arrow`` when it has one for the
    column's type, else value by value (which raises the serde's message, prefixed with
    the store). ``role``: ``"key"`` or ``"value"``, for the messages."""
    out = serde.serialize_arrow(col)
    if out is not None:
        return out
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        # Spark strings may hold bytes that are not UTF-8 (a cast from binary); Arrow
        # takes them as they are, and only a full validation finds them.
        try:
            col.validate(full=True)
        except pa.ArrowInvalid:
            raise ValueError(
                f"store {store!r}: {role} column {name!r} holds a string that is not valid UTF-8"
            ) from None
    serialize = serde.serialize
    try:
        return pa.array([None if v is None else serialize(v) for v in col.to_pylist()], pa.binary())
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"store {store!r}: {role} {exc}") from None


def serialize_keys(
    serde: Serde, columns: Sequence[pa.Array], names: Sequence[str], store: str
) -> pa.Array:
    """The serialized keys of a batch (a ``binary`` array): one key column through
    :func:`serialize_column`, a composite key as tuples of its columns; null keys are
    refused."""
    for name, col in zip(names, columns, strict=True):
        if col.null_count:
            raise null_keys_error(store, name)
    if len(columns) == 1:
        return serialize_column(serde, columns[0], store, "key", names[0])
    tuples = zip(*(c.to_pylist() for c in columns), strict=True)
    serialize = serde.serialize
    try:
        return pa.array([serialize(k) for k in tuples], pa.binary())
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"store {store!r}: key {exc}") from None


def route(partitioner: Partitioner, key_bytes: pa.Array, n: int) -> pa.Array:
    """The store partition of every serialized key (an ``int32`` array)."""
    return pa.array(partitioner.partition_many(key_bytes, n), pa.int32())


def explicit_partitions(column: pa.Array, label: str, n: int, store: str) -> pa.Array:
    """An explicit store's partition column (``label`` names it in errors) as ``int32``:
    integers in ``[0, n)``, no nulls."""
    if not pa.types.is_integer(column.type):
        raise ValueError(
            f"store {store!r}: {label} must hold integers in [0, {n}); it holds {column.type}"
        )
    lo_hi = pc.min_max(column)
    lo, hi = lo_hi["min"].as_py(), lo_hi["max"].as_py()
    if column.null_count or (lo is not None and (lo < 0 or hi >= n)):
        bad = None if column.null_count else (lo if lo < 0 else hi)
        raise ValueError(f"store {store!r}: {label} must hold integers in [0, {n}); found {bad!r}")
    return column.cast(pa.int32())


def encoded_batch(
    parts: pa.Array,
    key_bytes: pa.Array,
    values: pa.Array,
    seq: pa.Array,
    window_starts: Sequence[int] | None = None,
) -> pa.RecordBatch:
    """An ``ENCODED`` batch: a key-value row per key, or for a window store (its windows'
    starts in epoch ms given) two rows per key, the window's and its time index entry
    (``b""``, a delete when the window's value is deleted)."""
    if window_starts is None:
        arrays = [parts, keyspace.kv_keys_arrow(key_bytes), values, seq]
        return pa.RecordBatch.from_arrays(arrays, schema=ENCODED)
    wk, tk = keyspace.window_key, keyspace.window_time_key
    kbs = key_bytes.to_pylist()
    keys = [wk(kb, s) for kb, s in zip(kbs, window_starts, strict=True)]
    keys += [tk(kb, s) for kb, s in zip(kbs, window_starts, strict=True)]
    index_values = pc.if_else(pc.is_null(values), pa.scalar(None, pa.binary()), b"")
    arrays = [
        pa.concat_arrays([parts, parts]),
        pa.array(keys, pa.binary()),
        pa.concat_arrays([values, index_values]),
        pa.concat_arrays([seq, seq]),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ENCODED)


def non_finite_message(store: str, column: str) -> str:
    return (
        f"store {store!r}: value column {column!r} holds NaN or an infinity, which JSON "
        "cannot hold (StoreWriter refuses them too): make them null or finite first, or "
        "store a double column with the 'double' serde"
    )


def arrow_has_non_finite(values: pa.Array) -> bool:
    """Whether an Arrow column holds NaN or an infinity at any depth (nulls do not)."""
    t = values.type
    if pa.types.is_floating(t):
        return bool(pc.any(pc.or_(pc.is_nan(values), pc.is_inf(values))).as_py())
    if pa.types.is_map(t):  # Arrow cannot flatten a map: take its values' range
        lo, hi = values.offsets[0].as_py(), values.offsets[-1].as_py()
        return arrow_has_non_finite(values.items.slice(lo, hi - lo))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return arrow_has_non_finite(values.flatten())
    if pa.types.is_struct(t):
        return any(arrow_has_non_finite(f) for f in values.flatten())
    return False
