"""How Spark columns map to iqkit serdes, checked before any data is written.

A key is one column (its serde follows its type) or several (a composite key, always the
``ordered`` serde, so byte order is value order and a shorter tuple is a prefix). A value
is one column, or — with ``value=None`` — every other column as a JSON record, encoded
by Spark's own ``to_json`` (timestamps, decimals and nested types included).

JSON has no NaN or infinities: the ``json`` serde refuses them (``StoreWriter`` raises),
and Spark's ``to_json`` would write them as the strings ``"NaN"``/``"Infinity"`` (the
number silently becomes text). So a JSON-encoded value holding one, at any depth, is
refused naming the column and the store (``non_finite_message``), by every Spark writer:
``write_store``/``store_sink`` check in the JVM (``spark_non_finite``), the data source in
its tasks (``store.encoding.arrow_encode.arrow_has_non_finite``). A ``double`` value
column keeps them (the ``double`` serde stores NaN and infinities).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..errors import StoreExistsError
from ..store.encoding.serdes import all_serdes
from ..store.format import StoreFormat
from ..store.kinds import StoreKind
from ..store.manifest import STORE_SETTINGS, StoreManifest
from ..store.rows import ddl_text, parse_ddl_columns, quote_ddl

#: The serde a single key or value column gets when none is named, by the column's
#: Spark type name (``DataType.typeName()``); the serdes say which types are theirs.
_DEFAULT_SERDE: dict[str, str] = {
    spark_type: serde.name for serde in all_serdes() for spark_type in serde.spark_default_for
}

#: Spark type names each serde accepts for a column (json and ordered, absent, take
#: anything JSON-able).
_ACCEPTS: dict[str, tuple[str, ...]] = {
    serde.name: serde.spark_accepts for serde in all_serdes() if serde.spark_accepts
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
    #: The columns written as JSON text (the record's, or a ``json`` value column) whose
    #: type holds floating-point numbers: checked for NaN and infinities.
    float_json_columns: tuple[str, ...] = ()
    #: The record's columns with their Spark types (DDL), recorded as the store's value
    #: schema (``properties["value_schema"]``, read back by :mod:`iqkit.store.rows`).
    value_schema: str | None = None

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
        key_serde = key_serde or _DEFAULT_SERDE.get(key_fields[0].dataType.typeName(), "ordered")
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
        simple = _DEFAULT_SERDE.get(vf.dataType.typeName())
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
    json_columns = record if value is None else (value,) if value_serde == "json" else ()
    return ColumnPlan(
        key_columns=keys,
        key_serde=key_serde,
        value_column=value,
        record_columns=record,
        value_serde=value_serde,
        window_column=window_column,
        partition_column=partition_column,
        float_json_columns=tuple(
            c for c in json_columns if _holds_floats(_field(df, c, store, "value").dataType)
        ),
        value_schema=", ".join(
            f"{quote_ddl(c)} {_field(df, c, store, 'value').dataType.simpleString()}"
            for c in record
        )
        or None,
    )


def _check_fits(field: T.StructField, serde: str, store: str, role: str) -> None:
    accepted = _ACCEPTS.get(serde)
    if accepted is None:  # json / ordered: Python values of any JSON-able type
        return
    if field.dataType.typeName() not in accepted:
        raise ValueError(
            f"store {store!r}: {role} column {field.name!r} of type "
            f"{field.dataType.simpleString()} does not fit the {serde!r} serde"
        )


# -- NaN and infinities in JSON values (see the module docstring) ---------------------------
def spark_non_finite(column: Column, dtype: T.DataType) -> Column:
    """A Spark expression, true where ``column`` (of a ``dtype`` that holds floats, see
    ``ColumnPlan.float_json_columns``) holds NaN or an infinity at any depth (struct
    fields, array elements, map values), false elsewhere, nulls included."""
    return F.coalesce(_non_finite(column, dtype), F.lit(False))


def _holds_floats(dtype: T.DataType) -> bool:
    if isinstance(dtype, T.DoubleType | T.FloatType):
        return True
    if isinstance(dtype, T.ArrayType):
        return _holds_floats(dtype.elementType)
    if isinstance(dtype, T.MapType):
        return _holds_floats(dtype.valueType)
    if isinstance(dtype, T.StructType):
        return any(_holds_floats(f.dataType) for f in dtype.fields)
    return False


def _non_finite(column: Column, dtype: T.DataType) -> Column:
    """``spark_non_finite``, but null where the value is null."""
    if isinstance(dtype, T.DoubleType | T.FloatType):
        return F.isnan(column) | (F.abs(column) == F.lit(float("inf")))
    if isinstance(dtype, T.ArrayType | T.MapType):
        inner = dtype.elementType if isinstance(dtype, T.ArrayType) else dtype.valueType
        items = column if isinstance(dtype, T.ArrayType) else F.map_values(column)
        return F.exists(items, lambda x: spark_non_finite(x, inner))
    assert isinstance(dtype, T.StructType)
    parts = [
        spark_non_finite(column.getField(f.name), f.dataType)
        for f in dtype.fields
        if _holds_floats(f.dataType)
    ]
    out = parts[0]
    for part in parts[1:]:
        out = out | part
    return out


def ensure_spark_store(
    fmt: StoreFormat,
    store: str,
    plan: ColumnPlan,
    *,
    partitions: int,
    partitioner: str | None,
    window_size: int | None,
    retention: int | None,
    key_types: Sequence[str],
    written_by: str,
    settings: tuple[str, ...] | None = None,
) -> StoreManifest:
    """The manifest a Spark write uses: the existing store's, whose settings must fit the
    DataFrame (``StoreExistsError`` naming each difference, via ``fmt.ensure_store``), or
    the one a new store gets when the job publishes (``open_job_commit(create=...)``: a write that
    fails creates no store). By default the partitioner is checked only when the DataFrame
    marks its partitions (else the store's own routes the keys), and the window size
    only once it is known. ``key_types`` (DDL types) let the reader type a composite key's
    columns."""
    explicit = plan.partition_column is not None
    if settings is None:
        settings = tuple(
            s
            for s in STORE_SETTINGS
            if (s != "partitioner" or explicit) and (s != "window_size_ms" or window_size)
        )
    size = window_size
    if plan.window_column and size is None:
        # A window manifest must name its size, which the data source learns only from
        # its tasks: before then a stand-in, never compared (not in ``settings``) and
        # never written (the data source checks an existing store only at that point).
        assert "window_size_ms" not in settings, "a window size to check is needed"
        size = 1
    wanted = StoreManifest(
        name=store,
        partitions=partitions,
        kind=StoreKind.WINDOW if plan.window_column else StoreKind.KEY_VALUE,
        key_serde=plan.key_serde,
        value_serde=plan.value_serde,
        partitioner="explicit" if explicit else (partitioner or "murmur2"),
        window_size_ms=size,
        **({"retention": retention} if retention else {}),
        properties={
            "key_columns": list(plan.key_columns),
            "key_types": list(key_types),
            "value_column": plan.value_column,
            "record_columns": list(plan.record_columns),
            **({"value_schema": plan.value_schema} if plan.value_schema else {}),
            "written_by": written_by,
        },
    )
    got = fmt.ensure_store(wanted, settings=settings, asked="the DataFrame needs")
    _check_value_schema(got, plan)
    return got


def _check_value_schema(existing: StoreManifest, plan: ColumnPlan) -> None:
    """A store with a value schema takes only DataFrames whose record has the same
    columns and types (in any order): its manifest never changes, so a column it does not
    declare could not be read back typed, and one of another type would not fit."""
    declared = existing.properties.get("value_schema")
    if not declared or existing.value_serde != "json":
        return  # a store without a schema (made before, or by Python) stays as it is
    have = dict(parse_ddl_columns(str(declared)))
    want = dict(parse_ddl_columns(plan.value_schema)) if plan.value_schema else {}
    if have != want:
        diffs = [
            f"{n} {_ddl(want[n])} (store: {_ddl(have.get(n))})"
            for n in want
            if want[n] != have.get(n)
        ]
        diffs += [f"no {n}" for n in have if n not in want]
        raise StoreExistsError(
            f"store {existing.name!r} exists with value schema {declared!r}; the DataFrame's "
            f"record differs: {', '.join(diffs) or 'a single value column'}"
        )


def _ddl(t: tuple | None) -> str:
    return "absent" if t is None else ddl_text(t)


def one_window_size(store: str, column: str | None, lo: int | None, hi: int | None) -> int:
    """The one window size of the smallest (``lo``) and largest (``hi``) windows a
    DataFrame's window column holds (``None``: no rows), refused unless they agree."""
    if lo is None or hi is None:
        raise ValueError(f"store {store!r}: the DataFrame is empty, its window size is unknown")
    if lo != hi or lo <= 0:
        raise ValueError(
            f"store {store!r}: window column {column!r} must hold windows of one size, "
            f"found sizes from {lo} to {hi} ms"
        )
    return int(lo)
