"""How Spark columns map to iqkit serdes, checked before any data is written.

A key is one column (its serde follows its type) or several (a composite key, always the
``ordered`` serde, so byte order is value order and a shorter tuple is a prefix). A value
is one column, or — with ``value=None`` — every other column as a JSON record, encoded
by Spark's own ``to_json`` (timestamps, decimals and nested types included).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import types as T

#: The serde a single key or value column gets when none is named.
_DEFAULT_SERDE: dict[type[T.DataType], str] = {
    T.StringType: "string",
    T.IntegerType: "int32",
    T.ShortType: "int32",
    T.ByteType: "int32",
    T.LongType: "int64",
    T.DoubleType: "double",
    T.FloatType: "double",
    T.BinaryType: "bytes",
}

#: Spark types each serde accepts for a column (json and ordered take anything JSON-able).
_ACCEPTS: dict[str, tuple[type[T.DataType], ...]] = {
    "string": (T.StringType,),
    "bytes": (T.BinaryType,),
    "int32": (T.IntegerType, T.ShortType, T.ByteType),
    "int64": (T.LongType, T.IntegerType, T.ShortType, T.ByteType),
    "double": (T.DoubleType, T.FloatType, T.IntegerType, T.LongType),
}

KAFKA_COLUMNS = ("topic", "partition", "offset")


@dataclass(frozen=True)
class ColumnPlan:
    """What ``write_store`` will do with a DataFrame's columns."""

    key_columns: tuple[str, ...]
    key_serde: str
    value_column: str | None  # None: a JSON record of ``record_columns``
    record_columns: tuple[str, ...]
    value_serde: str
    window_column: str | None
    partition_column: str | None

    @property
    def composite_key(self) -> bool:
        return len(self.key_columns) > 1


def _field(df: DataFrame, name: str, store: str, role: str) -> T.StructField:
    fields = {f.name: f for f in df.schema.fields}
    if name not in fields:
        raise ValueError(
            f"store {store!r}: {role} column {name!r} is not in the DataFrame "
            f"(columns: {', '.join(fields)})"
        )
    return fields[name]


def _is_window_struct(dtype: T.DataType) -> bool:
    if not isinstance(dtype, T.StructType):
        return False
    kinds = {f.name: type(f.dataType) for f in dtype.fields}
    timestamp = (T.TimestampType, T.TimestampNTZType)
    return kinds.get("start") in timestamp and kinds.get("end") in timestamp


def plan_columns(
    df: DataFrame,
    store: str,
    *,
    key: str | Sequence[str],
    value: str | None,
    key_serde: str | None,
    value_serde: str | None,
    window: str | None,
    partition_column: str | None,
) -> ColumnPlan:
    """Check the DataFrame against the requested layout; raise ``ValueError`` naming the
    column and the store for anything that would not fit."""
    keys = (key,) if isinstance(key, str) else tuple(key)
    if not keys:
        raise ValueError(f"store {store!r}: key must name at least one column")
    key_fields = [_field(df, k, store, "key") for k in keys]
    if len(keys) > 1:
        if key_serde not in (None, "ordered"):
            raise ValueError(
                f"store {store!r}: a composite key {list(keys)} uses the 'ordered' serde, "
                f"not {key_serde!r}"
            )
        key_serde = "ordered"
    else:
        key_serde = key_serde or _DEFAULT_SERDE.get(type(key_fields[0].dataType), "ordered")
        _check_fits(key_fields[0], key_serde, store, "key")
    window_column = None
    if window is not None:
        wf = _field(df, window, store, "window")
        if not _is_window_struct(wf.dataType):
            raise ValueError(
                f"store {store!r}: window column {window!r} must be Spark's window struct "
                f"<start: timestamp, end: timestamp>, got {wf.dataType.simpleString()}"
            )
        window_column = window
    if partition_column is not None:
        pf = _field(df, partition_column, store, "partition")
        if not isinstance(pf.dataType, T.IntegerType | T.LongType | T.ShortType | T.ByteType):
            raise ValueError(
                f"store {store!r}: mark_as_partitioned column {partition_column!r} must hold "
                f"integers, got {pf.dataType.simpleString()}"
            )
    if value is not None:
        vf = _field(df, value, store, "value")
        simple = _DEFAULT_SERDE.get(type(vf.dataType))
        value_serde = value_serde or simple or "json"
        if value_serde != "json":
            _check_fits(vf, value_serde, store, "value")
        record: tuple[str, ...] = ()
    else:
        if value_serde not in (None, "json"):
            raise ValueError(
                f"store {store!r}: value=None stores the other columns as a JSON record; "
                f"value_serde must be 'json', not {value_serde!r}"
            )
        value_serde = "json"
        used = {*keys, window, partition_column}
        record = tuple(f.name for f in df.schema.fields if f.name not in used)
        if not record:
            raise ValueError(f"store {store!r}: no columns are left for the value")
    return ColumnPlan(
        key_columns=keys,
        key_serde=key_serde,
        value_column=value,
        record_columns=record,
        value_serde=value_serde,
        window_column=window_column,
        partition_column=partition_column,
    )


def _check_fits(field: T.StructField, serde: str, store: str, role: str) -> None:
    accepted = _ACCEPTS.get(serde)
    if accepted is None:  # json / ordered: Python values of any JSON-able type
        return
    if not isinstance(field.dataType, accepted):
        raise ValueError(
            f"store {store!r}: {role} column {field.name!r} of type "
            f"{field.dataType.simpleString()} does not fit the {serde!r} serde"
        )
