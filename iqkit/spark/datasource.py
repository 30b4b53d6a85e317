"""The ``iqkit`` Spark Python data source (Spark 4): read a store as a DataFrame, and
write one with ``df.write.format("iqkit")`` (options and rules of the write side:
:mod:`iqkit.spark.datasource_write`).

Installing iqkit registers the format in every new Spark session (the ``pyspark_iqkit``
package, which Spark 4 looks up at session start); :func:`register` does it explicitly.

    df = (spark.read.format("iqkit").option("store", "totals")
          .option("key", "alice")                                    # optional: narrows
          .option("value_schema", "customer string, total bigint")   # optional
          .option("as_of", 3)                                        # optional
          .load("/shared/stores"))

Options
-------
``store``          the store name (required; an unknown name fails at ``load()`` with
                   ``unknown store 'totls'; did you mean 'totals'?``).
``root`` / path    the root folder holding the stores: ``.option("root", ...)`` or
                   ``.load(root)`` (both given and different is an error). Relative paths
                   are made absolute on the driver; ``file:`` URIs are accepted.
``as_of``          a version number to read instead of the latest published one (a version
                   that is not retained fails at planning, naming the retained ones).
``value_schema``   a DDL string (``"customer string, total bigint"``) for ``json`` values:
                   each JSON object is decoded into these top-level columns instead of one
                   ``value`` column.
``partitions``, ``key``, ``keys``, ``prefix``, ``key_from``, ``key_to``, ``time_from``,
``time_to``        narrow the read to what an IQv2 query would return; a key lookup reads
                   only the partition that owns the key (:mod:`iqkit.spark.read_spec`).
``_trace_dir``     hidden, for tests and debugging: every partition read writes one JSON
                   file there (store, partition, version, the IQv2 query it ran, rows).
Any other option is refused by name (a typo must not silently read the whole store).

Narrowing is by options, never by Spark's filter pushdown
----------------------------------------------------------
PySpark 4.1–4.3 keeps the read plan a Python data source's ``pushFilters`` produced on
the data source object shared by every DataFrame from one ``load()``; a later scan with
no pushable filter reuses it, so ``df.count()`` after ``df.where("key = 'a'").count()``
counted only ``a``. The reader therefore does not implement ``pushFilters`` (and iqkit
sets no session conf): ``where()`` filters are applied by Spark to the rows read, always
right; the read options narrow what is read, and belong to the ``load()`` alone.

Layout requirement for distributed reads
----------------------------------------
Each Spark task opens ``iqkit.open(root)`` itself, on its executor, so ``root`` must be a
file-system path that the driver and every executor see with the same contents (one
machine, or a shared POSIX file system such as NFS, EFS or a FUSE mount). The executors'
Python must also be able to import ``iqkit`` (installed, or on ``PYTHONPATH``).

Consistency: one version per query
----------------------------------
The driver (the planning Python worker) resolves the version to read ONCE, as
``engine.version(store)`` (or the ``as_of`` version), and every input partition reads
exactly that version (``iqkit.open(root, as_of={store: version})``), so a commit that
lands while the job runs is not seen by some partitions and missed by others. Between
planning and the tasks nothing holds a lease on that version: a job slower than the
store's retention (``retention`` commits) fails with "store ... has no version N" rather
than mixing versions. A store with nothing committed reads as an empty DataFrame.

Partitions
----------
One Spark input partition per store partition read (``_StorePartition.partition`` is the
store partition number), so ``df.rdd.getNumPartitions()`` is the store's partition count
when nothing is narrowed. A task runs its queries with ``.with_partitions({p})``; a
partition no commit has touched is empty (no rows, as the engine answers it); any failure
(``STORE_EXCEPTION``, ``NOT_PRESENT``, ``NOT_ACTIVE``, ...) fails the task with the
failure reason and message, because the query cannot be answered. The engine is closed
when the partition's rows are done.

Schema rules
------------
``partition int`` first, then the key column(s), for window stores ``window_start
timestamp, window_end timestamp``, then the value column(s).

* Scalar serdes map to Spark types: ``string`` → string, ``int32`` → int, ``int64`` →
  bigint, ``double`` → double, ``bytes`` → binary; ``json`` → string holding the compact
  JSON text (as iqkit's json serde writes it).
* ``value_schema`` (json values only): a JSON object's members fill the named columns;
  a missing member, a value that does not fit the column type, or a value that is not a
  JSON object gives ``null`` (Spark's ``from_json`` PERMISSIVE behaviour). String columns
  receive non-string JSON values as their JSON text; timestamps and dates are parsed from
  ISO-8601 strings (naive = UTC); arrays, maps and structs are decoded recursively.
  Column names may not repeat each other, ``partition``, the key columns or the window
  columns (checked case-insensitively at ``load()``).
* ``ordered`` keys: when the manifest's ``properties`` has ``key_columns`` (list of names)
  and ``key_types`` (list of DDL types, or one comma-separated string), the key is exposed
  as those columns (a one-column key is the bare value, a longer one a tuple of that
  length; anything else fails the task naming the key). Otherwise the key is ONE string
  column ``key`` holding its compact JSON text (tuples as arrays, ``bytes`` as
  ``"0x<hex>"`` strings). ``ordered`` values likewise become JSON text. Decision: a
  tuple's shape can vary from key to key, and inventing ``key_1..key_n`` columns would
  silently null out the odd ones.
* A user-specified schema (``spark.read.schema(...)``) is honoured the same way: fields
  named ``partition``, the key column(s) and ``window_start``/``window_end`` are filled
  from the record, a lone ``value`` field holds the value, and any other fields are
  decoded from JSON-object values as with ``value_schema``.

Other decisions
---------------
* A partition read that fails for any reason raises ``IqkitError``
  ("store 'x' partition 1 at version 3 cannot be read: STORE_EXCEPTION: ..."): a
  DataFrame silently missing a partition would be a wrong answer, not a partial one.
* ``json`` values are re-encoded compactly (``ensure_ascii=False``), which equals the stored
  text for everything iqkit wrote; timestamps are yielded as UTC-aware datetimes, so the
  session time zone only affects how Spark displays them.
* Rows are yielded as tuples (Spark batches them into Arrow); the engine's chunked scans
  keep memory flat for large partitions.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import decimal
import json
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceWriter,
    InputPartition,
)
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

import iqkit
from iqkit.errors import IqkitError
from iqkit.query import (
    KeyQuery,
    MultiKeyQuery,
    Query,
    StateQueryRequest,
)
from iqkit.rows import KEY, PARTITION, VALUE, WINDOW_END, WINDOW_START, RowSchema
from iqkit.store.manifest import StoreManifest
from iqkit.store.serdes import get_serde

from .datasource_write import plan_write
from .read_spec import parse_read_options
from .roots import driver_root
from .worker_python import require_workers_can_import_iqkit
from .workers import keep_spark_archive_indexes

__all__ = ["IqkitDataSource", "IqkitReader", "register"]

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


def register(spark: Any) -> None:
    """Register the ``iqkit`` format with ``spark`` (``spark.read.format("iqkit")`` and
    ``df.write.format("iqkit")``).

    Installing iqkit already registers it in every session started afterwards (Spark 4
    looks up ``pyspark_<name>`` packages at session start); this is for sessions that
    started before iqkit was installed, or to be explicit. It first checks that Spark's
    Python workers can import iqkit (one line saying how to fix it when they cannot), and
    changes no session setting.
    """
    require_workers_can_import_iqkit(spark)
    spark.dataSource.register(IqkitDataSource)


# -- options and the store's shape ---------------------------------------------------------
def _root_from_options(options: Any) -> str:
    root = options.get("root")
    path = options.get("path")
    if root and path and driver_root(root) != driver_root(path):
        raise ValueError(f"iqkit: option 'root' ({root!r}) and the load path ({path!r}) differ")
    chosen = root or path
    if not chosen:
        raise ValueError(
            "iqkit: the root folder is missing: use .load(root) or .option('root', root)"
        )
    return driver_root(chosen)


def _store_from_options(options: Any, root: str) -> str:
    store = options.get("store")
    if not store:
        known: list[str] = []
        if os.path.isdir(root):
            with iqkit.open(root) as engine:
                known = engine.store_names()
        listing = ", ".join(known) if known else "none"
        raise ValueError(f"iqkit: option 'store' is required (stores under {root}: {listing})")
    return str(store)


def _as_of_from_options(options: Any) -> int | None:
    text = options.get("as_of")
    if text is None or str(text).strip() == "":
        return None
    try:
        version = int(str(text).strip())
    except ValueError:
        raise ValueError(f"iqkit: option 'as_of' must be a version number, got {text!r}") from None
    if version < 1:
        raise ValueError(f"iqkit: option 'as_of' must be >= 1, got {version}")
    return version


def _read_manifest(root: str, store: str, as_of: int | None) -> tuple[StoreManifest, int | None]:
    """The store's manifest and the version to read (checked: an unknown store raises
    ``UnknownStoreError`` with a did-you-mean hint, an unretained ``as_of`` a
    ``ValueError`` naming the retained versions)."""
    pin = {store: as_of} if as_of is not None else None
    with iqkit.open(root, as_of=pin) as engine:
        return engine.manifest(store), engine.version(store)


class IqkitDataSource(DataSource):
    """``spark.read.format("iqkit")`` — see the module docstring for options and rules."""

    @classmethod
    def name(cls) -> str:
        return "iqkit"

    # Spark calls these on the driver side in Python planner workers, which PySpark reuses:
    # each entry point keeps Spark's archive indexes (see iqkit.spark.workers).
    def schema(self) -> str:
        keep_spark_archive_indexes()
        root = _root_from_options(self.options)
        store = _store_from_options(self.options, root)
        manifest, _ = _read_manifest(root, store, _as_of_from_options(self.options))
        parse_read_options(self.options, manifest)  # bad read options fail at load()
        value_schema = self.options.get("value_schema")
        if value_schema is not None and not str(value_schema).strip():
            value_schema = None
        return RowSchema(manifest).spark_ddl(value_schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        keep_spark_archive_indexes()
        return IqkitReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """``df.write.format("iqkit")``: ``.mode("append")`` upserts, ``.mode("overwrite")``
        replaces the store's contents (see :mod:`iqkit.spark.datasource_write`)."""
        keep_spark_archive_indexes()
        root = _root_from_options(self.options)
        store = _store_from_options(self.options, root)
        return plan_write(self.options, root, store, schema, overwrite)


# -- input partitions ------------------------------------------------------------------------
class _StorePartition(InputPartition):
    """One store partition; ``keys`` are the pushed point keys it owns (``None``: no
    point lookup)."""

    def __init__(self, partition: int, keys: tuple[Any, ...] | None = None) -> None:
        super().__init__(partition)
        self.partition = partition
        self.keys = keys


# -- the reader ------------------------------------------------------------------------------
class IqkitReader(DataSourceReader):
    """Reads the store partitions the read options select (all by default), one input
    partition each, at the version resolved when the reader is built (on the driver).

    Deliberately no ``pushFilters``: see "Narrowing is by options" in the module
    docstring."""

    def __init__(self, options: Any, schema: StructType) -> None:
        self.root = _root_from_options(options)
        self.store = _store_from_options(options, self.root)
        as_of = _as_of_from_options(options)
        manifest, version = _read_manifest(self.root, self.store, as_of)
        #: What the options narrow the read to (checked here, on the driver).
        self.spec = parse_read_options(options, manifest)
        self.manifest = manifest
        #: The version every partition reads (``None``: nothing committed yet).
        self.version = version
        self.kind = manifest.kind
        self.num_partitions = manifest.partitions
        self.key_serde = manifest.key_serde
        self.value_serde = manifest.value_serde
        self.partitioner = manifest.partitioner
        self.trace_dir = options.get("_trace_dir") or None
        self.schema = schema

        declared = RowSchema(manifest).typed_key_columns()
        if declared is not None:
            self.key_mode = "columns"
            self.key_names = [n for n, _ in declared]
        else:
            self.key_mode = "json" if get_serde(self.key_serde).json_text else "value"
            self.key_names = [KEY]
        fixed = {PARTITION, *self.key_names}
        if self.kind == "window":
            fixed |= {WINDOW_START, WINDOW_END}
        if len(fixed) != 1 + len(self.key_names) + (2 if self.kind == "window" else 0):
            raise ValueError(
                f"iqkit: store {self.store!r}: key columns {self.key_names} clash with the "
                "partition or window columns"
            )
        # Key column types as the (possibly user-given) schema states them.
        by_name = {f.name: f.dataType for f in schema.fields}
        self.key_types: list[DataType | None] = [by_name.get(n) for n in self.key_names]
        value_fields = [f.name for f in schema.fields if f.name not in fixed]
        self.value_fields_mode = not (
            options.get("value_schema") in (None, "") and value_fields in ([VALUE], [])
        )
        if self.value_fields_mode and self.value_serde != "json":
            raise ValueError(
                f"iqkit: store {self.store!r} has {self.value_serde!r} values; columns "
                f"{value_fields} can only be decoded from json values"
            )
        names = [f.name for f in schema.fields]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(
                f"iqkit: store {self.store!r}: column(s) {repeated} appear twice (value_schema "
                f"may not reuse {sorted(fixed)})"
            )

    # -- planning --------------------------------------------------------------------------
    def partitions(self) -> list[InputPartition]:
        keep_spark_archive_indexes()
        return [_StorePartition(p, keys) for p, keys in self.spec.plan(self.manifest)]

    # -- execution (on the executors) -----------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        keep_spark_archive_indexes()
        if not isinstance(partition, _StorePartition) or self.version is None:
            return iter(())  # nothing to read (everything pruned, or nothing committed)
        return self._read(partition)

    def _read(self, part: _StorePartition) -> Iterator[tuple[Any, ...]]:
        p = part.partition
        queries = self.spec.queries(self.kind, part.keys)
        split = self._key_splitter()
        build = self._row_builder(p)
        count = 0
        try:
            with iqkit.open(self.root, as_of={self.store: self.version}) as engine:
                for query in queries:
                    request = (
                        StateQueryRequest.in_store(self.store)
                        .with_query(query)
                        .with_partitions({p})
                    )
                    result = engine.query(request).partition_results[p]
                    if result.is_failure:
                        raise IqkitError(
                            f"iqkit: store {self.store!r} partition {p} at version "
                            f"{self.version} cannot be read: {result.failure_reason.name}: "
                            f"{result.failure_message}"
                        )
                    for key, window, value in _records(query, result.result):
                        count += 1
                        yield build(split(key), window, value)
        finally:
            if self.trace_dir:
                self._trace(p, queries, count)

    def _trace(self, p: int, queries: Sequence[Query], rows: int) -> None:
        os.makedirs(self.trace_dir, exist_ok=True)
        entry = {
            "store": self.store,
            "partition": p,
            "version": self.version,
            "queries": [repr(q) for q in queries],
            "rows": rows,
        }
        name = f"{self.store}-p{p}-{uuid.uuid4().hex}.json"
        path = os.path.join(self.trace_dir, name)
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(entry, fh)
        os.replace(path + ".tmp", path)

    def _row_builder(self, p: int) -> Callable[[tuple[Any, ...], Any, Any], tuple[Any, ...]]:
        """``(key columns, window, value) -> row`` in the order of the reader's schema."""
        getters: list[Callable[[tuple[Any, ...], Any, Any], Any]] = []
        for field in self.schema.fields:
            name, dtype = field.name, field.dataType
            if name == PARTITION:
                getters.append(lambda k, w, v, p=p: p)
            elif name in self.key_names:
                i = self.key_names.index(name)
                getters.append(lambda k, w, v, i=i: k[i])
            elif self.kind == "window" and name == WINDOW_START:
                getters.append(lambda k, w, v: _ms_to_datetime(w[0]))
            elif self.kind == "window" and name == WINDOW_END:
                getters.append(lambda k, w, v: _ms_to_datetime(w[1]))
            elif not self.value_fields_mode:
                getters.append(self._value_getter())
            else:
                getters.append(
                    lambda k, w, v, name=name, dtype=dtype: (
                        _coerce(v.get(name), dtype) if isinstance(v, dict) else None
                    )
                )

        def build(cols: tuple[Any, ...], window: Any, value: Any) -> tuple[Any, ...]:
            return tuple([g(cols, window, value) for g in getters])

        return build

    def _value_getter(self) -> Callable[[Any, Any, Any], Any]:
        if get_serde(self.value_serde).json_text:
            return lambda k, w, v: _json_text(v)
        return lambda k, w, v: v

    def _key_splitter(self) -> Callable[[Any], tuple[Any, ...]]:
        if self.key_mode == "value":
            return lambda key: (key,)
        if self.key_mode == "json":
            return lambda key: (_json_text(key),)
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
                value = part if dtype is None else _coerce(part, dtype)
                if value is None and part is not None:
                    raise IqkitError(
                        f"iqkit: store {store!r}: key {key!r}: {part!r} does not fit the "
                        f"declared key type {dtype.simpleString() if dtype else '?'}"
                    )
                out.append(value)
            return tuple(out)

        return split


# -- rows ------------------------------------------------------------------------------------
def _records(query: Query, result: Any) -> Iterator[tuple[Any, Any, Any]]:
    """``(key, (start, end) | None, value)`` from the result of ``query``."""
    if isinstance(query, KeyQuery):
        if result is not None:
            yield query.key, None, result
        return
    if isinstance(query, MultiKeyQuery):
        for key, value in result.items():
            yield key, None, value
        return
    with result as it:  # a KeyValueIterator: closed even when the task stops early
        for kv in it:
            key = kv.key
            if isinstance(key, iqkit.Windowed):
                yield key.key, (key.start, key.end), kv.value
            else:
                yield key, None, kv.value


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "0x" + bytes(value).hex()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _json_text(value: Any) -> str:
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


def _coerce(value: Any, dtype: DataType) -> Any:
    """``value`` (decoded JSON or a key element) as a Python value Spark accepts for
    ``dtype``, or ``None`` when it does not fit (PERMISSIVE, like ``from_json``)."""
    if value is None:
        return None
    if isinstance(dtype, StringType):
        return value if isinstance(value, str) else _json_text(value)
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
        return [_coerce(v, dtype.elementType) for v in value]
    if isinstance(dtype, MapType):
        if not isinstance(value, dict) or not isinstance(dtype.keyType, StringType):
            return None
        return {k: _coerce(v, dtype.valueType) for k, v in value.items()}
    if isinstance(dtype, StructType):
        if not isinstance(value, dict):
            return None
        return {f.name: _coerce(value.get(f.name), f.dataType) for f in dtype.fields}
    return None
