"""Row building for the ``iqkit`` Spark reader: a store's records as rows of the
DataFrame's schema.

The layout (which columns, in which order, of which types) is the row schema's
(:mod:`iqkit.store.rows`), shared with Arrow tables and SQL; this module only makes Spark
values of a record ``(key, window, value)`` for the columns a schema asks for (the
reader's own, or a user-given ``spark.read.schema(...)``): key elements and
``value_schema`` members coerced to the declared Spark types (PERMISSIVE, like
``from_json``: what does not fit is ``null``), window bounds as UTC datetimes, ``json``
and ``ordered`` values as their compact JSON text.

Built on the driver, pickled into every task; the per-row functions are made in the task
(:meth:`SparkRows.builder`), so nothing but data crosses the wire.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import decimal
import json
from collections.abc import Callable
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from iqkit.errors import IqkitError
from iqkit.store.rows import WIDE_DECIMALS, RowSchema

__all__ = ["SparkRows", "coerce", "json_text"]

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)

#: ``(key columns, window, value) -> column value``.
_Getter = Callable[[tuple[Any, ...], Any, Any], Any]


class SparkRows:
    """How the records of one store fill the rows of ``schema`` (see the module
    docstring); checks the schema against the store's row schema on construction
    (``ValueError`` naming what is wrong, at ``load()``)."""

    def __init__(self, rows: RowSchema, schema: StructType, *, value_schema: bool) -> None:
        self.store = rows.store
        declared = rows.typed_key_columns()
        if declared is not None:
            self.key_mode = "columns"
            self.key_names = [n for n, _ in declared]
        else:
            self.key_mode = "json" if rows.key_serde.json_text else "value"
            self.key_names = [rows.key_column]
        fixed = rows.fixed_columns(self.key_names)
        if len(set(fixed)) != len(fixed):
            raise ValueError(
                f"iqkit: store {self.store!r}: key columns {self.key_names} clash with the "
                "partition or window columns"
            )
        names = [f.name for f in schema.fields]
        #: Key column types as the (possibly user-given) schema states them.
        by_name = {f.name: f.dataType for f in schema.fields}
        self.key_types: list[DataType | None] = [by_name.get(n) for n in self.key_names]
        self.slots = rows.slots(names, self.key_names, value_schema=value_schema)
        fields = rows.value_fields(names, self.key_names, value_schema=value_schema)
        value_serde = rows.value_serde.name
        if fields is not None and value_serde != "json":
            raise ValueError(
                f"iqkit: store {self.store!r} has {value_serde!r} values; columns "
                f"{fields} can only be decoded from json values"
            )
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(
                f"iqkit: store {self.store!r}: column(s) {repeated} appear twice (value_schema "
                f"may not reuse {sorted(set(fixed))})"
            )
        #: Field columns' Spark types, in schema order.
        self.types = [f.dataType for f in schema.fields]
        #: Whether the whole value is shown as its JSON text (``json``, ``ordered``).
        self.value_json = rows.value_serde.json_text

    def builder(self, p: int) -> Callable[[tuple[Any, ...], Any, Any], tuple[Any, ...]]:
        """``(key columns, window, value) -> row`` for store partition ``p``."""
        getters: list[_Getter] = []
        for (kind, where), dtype in zip(self.slots, self.types, strict=True):
            if kind == "partition":
                getters.append(lambda k, w, v, p=p: p)
            elif kind == "key":
                getters.append(lambda k, w, v, i=where: k[i])
            elif kind == "window":
                getters.append(lambda k, w, v, i=where: _ms_to_datetime(w[i]))
            elif kind == "value":
                getters.append(
                    (lambda k, w, v: json_text(v)) if self.value_json else (lambda k, w, v: v)
                )
            else:
                getters.append(
                    lambda k, w, v, name=where, dtype=dtype: (
                        coerce(v.get(name), dtype) if isinstance(v, dict) else None
                    )
                )

        def build(cols: tuple[Any, ...], window: Any, value: Any) -> tuple[Any, ...]:
            return tuple([g(cols, window, value) for g in getters])

        return build

    def splitter(self) -> Callable[[Any], tuple[Any, ...]]:
        """``key -> key columns``: the key itself, its JSON text, or its declared
        elements coerced to their Spark types (a key that does not fit fails the task,
        naming it: a key is never silently null)."""
        if self.key_mode == "value":
            return lambda key: (key,)
        if self.key_mode == "json":
            return lambda key: (json_text(key),)
        n = len(self.key_names)
        types = self.key_types
        store, names = self.store, self.key_names

        def split(key: Any) -> tuple[Any, ...]:
            parts = (key,) if n == 1 else key
            if not isinstance(parts, tuple) or len(parts) != n:
                raise IqkitError(
                    f"iqkit: store {store!r}: key {key!r} does not match its key_columns {names}"
                )
            out = []
            for part, dtype in zip(parts, types, strict=True):
                value = part if dtype is None else coerce(part, dtype)
                if value is None and part is not None:
                    raise IqkitError(
                        f"iqkit: store {store!r}: key {key!r}: {part!r} does not fit the "
                        f"declared key type {dtype.simpleString() if dtype else '?'}"
                    )
                out.append(value)
            return tuple(out)

        return split


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "0x" + bytes(value).hex()
    if isinstance(value, decimal.Decimal):
        # A typed store's decimal member (``RowSchema.exact_value_decoder``): JSON text
        # has no exact spelling through json.dumps; the double, as the serde decodes it.
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def json_text(value: Any) -> str:
    """``value`` as compact JSON text (``bytes`` as ``"0x<hex>"``)."""
    return json.dumps(
        value, ensure_ascii=False, separators=(",", ":"), default=_json_default, allow_nan=True
    )


def _ms_to_datetime(ms: int) -> _dt.datetime:
    return _EPOCH + _dt.timedelta(milliseconds=ms)


# -- JSON → Spark values (value_schema columns, declared key columns) ------------------------
_INT_RANGES = {
    ByteType: (-(2**7), 2**7 - 1),
    ShortType: (-(2**15), 2**15 - 1),
    IntegerType: (-(2**31), 2**31 - 1),
    LongType: (-(2**63), 2**63 - 1),
}


def coerce(value: Any, dtype: DataType) -> Any:
    """``value`` (decoded JSON or a key element) as a Python value Spark accepts for
    ``dtype``, or ``None`` when it does not fit (PERMISSIVE, like ``from_json``)."""
    if value is None:
        return None
    if isinstance(dtype, StringType):
        return value if isinstance(value, str) else json_text(value)
    if isinstance(dtype, BooleanType):
        return value if isinstance(value, bool) else None
    for cls, (lo, hi) in _INT_RANGES.items():
        if isinstance(dtype, cls):
            ok = isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi
            return value if ok else None
    if isinstance(dtype, (DoubleType, FloatType)):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        return None
    if isinstance(dtype, DecimalType):
        if isinstance(value, decimal.Decimal):  # a typed store's decimal member: exact
            fits = value.is_finite() and value.adjusted() < dtype.precision - dtype.scale
            quantum = decimal.Decimal(1).scaleb(-dtype.scale)
            return value.quantize(quantum, context=WIDE_DECIMALS) if fits else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return decimal.Decimal(str(value))
            except decimal.InvalidOperation:
                return None
        return None
    if isinstance(dtype, BinaryType):
        if isinstance(value, (bytes, bytearray)):
            return bytes(value)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return base64.b64decode(value, validate=True)
        return None
    if isinstance(dtype, (TimestampType, TimestampNTZType)):
        if not isinstance(value, str):
            return None
        try:
            parsed = _dt.datetime.fromisoformat(value)
        except ValueError:
            return None
        if isinstance(dtype, TimestampNTZType):
            return parsed.replace(tzinfo=None)
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=_dt.UTC)
    if isinstance(dtype, DateType):
        if not isinstance(value, str):
            return None
        try:
            return _dt.date.fromisoformat(value)
        except ValueError:
            return None
    if isinstance(dtype, ArrayType):
        if not isinstance(value, (list, tuple)):
            return None
        return [coerce(v, dtype.elementType) for v in value]
    if isinstance(dtype, MapType):
        if not isinstance(value, dict) or not isinstance(dtype.keyType, StringType):
            return None
        return {k: coerce(v, dtype.valueType) for k, v in value.items()}
    if isinstance(dtype, StructType):
        if not isinstance(value, dict):
            return None
        return {f.name: coerce(value.get(f.name), f.dataType) for f in dtype.fields}
    return None
