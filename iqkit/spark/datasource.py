"""The ``iqkit`` Spark Python data source (Spark 4): read a store as a DataFrame, and
write one with ``df.write.format("iqkit")`` (options and rules of the write side:
:mod:`iqkit.spark.datasource_write`).

    from iqkit.spark.datasource import register
    register(spark)        # also enables spark.sql.python.filterPushdown.enabled, see below
    df = (spark.read.format("iqkit").option("store", "totals")
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
``pushdown``       ``"false"`` gives a reader without ``pushFilters`` (every filter is then
                   Spark's), for sessions that keep filter pushdown disabled (see below).
``_trace_dir``     hidden, for tests and debugging: every partition read writes one JSON
                   file there (store, partition, version, the IQv2 query it ran, rows).

Layout requirement for distributed reads
----------------------------------------
Each Spark task opens ``iqkit.open(root)`` itself, on its executor, so ``root`` must be a
file-system path that the driver and every executor see with the same contents (one
machine, or a shared POSIX file system such as NFS, EFS or a FUSE mount). Object-store
URIs (``s3://``, ``abfss://``) are not supported: RocksDB needs a file system. The
executors' Python must also be able to import ``iqkit`` (installed, or on ``PYTHONPATH``).

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
One Spark input partition per store partition (``_StorePartition.partition`` is the store
partition number), so ``df.rdd.getNumPartitions()`` is the store's partition count when
nothing is pruned. A task runs its query with ``.with_partitions({p})``; a partition no
commit has touched is empty (no rows, as the engine answers it); any failure
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
  ``"0x<hex>"`` strings): readable and exact for equality, but its text order is not the
  key order, so no key filter is pushed for it (Spark applies them). ``ordered`` values
  likewise become JSON text. Decision: a tuple's shape can vary from key to key, and
  inventing ``key_1..key_n`` columns would silently null out the odd ones.
* A user-specified schema (``spark.read.schema(...)``) is honoured the same way: fields
  named ``partition``, the key column(s) and ``window_start``/``window_end`` are filled
  from the record, a lone ``value`` field holds the value, and any other fields are
  decoded from JSON-object values as with ``value_schema``.

Filter pushdown
---------------
Spark 4.1 only calls ``DataSourceReader.pushFilters`` when
``spark.sql.python.filterPushdown.enabled`` is ``true`` (default ``false``), and a reader
that implements ``pushFilters`` while it is ``false`` fails planning with
``DATA_SOURCE_PUSHDOWN_DISABLED``. Hence :func:`register` sets it to ``true`` (pass
``enable_filter_pushdown=False`` to leave the session alone, then either set it yourself
or read with ``.option("pushdown", "false")``).

Pushed (an AND of these; each is also re-checked exactly per row, so a pushed filter is
never returned to Spark and results never depend on how narrow the query was):

* ``partition``: ``=``, ``IN``, ``<``, ``<=``, ``>``, ``>=`` prune input partitions.
* key ``=`` / ``IN`` (``string``, ``bytes``, ``int32``, ``int64`` keys, and ``ordered`` key
  columns declared string, int, bigint, smallint, tinyint, binary or boolean; not
  double/float, since ``1`` and ``1.0`` are different ordered keys) →
  ``KeyQuery`` / ``MultiKeyQuery``; on a ``murmur2`` store only the partitions owning
  those keys are read at all (``partitions()`` returns only them, each with its keys). On
  window stores → one ``WindowKeyQuery`` per key. For multi-column ordered keys, ``=`` on
  every column is a point lookup and ``=`` on leading columns a tuple ``PrefixScanQuery``.
* ``key LIKE 'abc%'`` (``StringStartsWith``) on a ``string`` key → ``PrefixScanQuery``.
* key ``<``, ``<=``, ``>``, ``>=`` → ``RangeQuery`` only when the key serde is
  order-preserving (``string``, ``bytes``, one-column ``ordered`` with a string, integer,
  or binary column); on ``int32``/``int64``/``double`` keys (two's-complement/IEEE byte
  order) they are left to Spark.
* ``window_start`` ``=``, ``<``, ``<=``, ``>``, ``>=`` narrow the window start range of
  ``WindowKeyQuery``/``WindowRangeQuery``.
* ``IS NOT NULL`` on ``partition`` or a key column.

Everything else (value columns, ``window_end``, ``NOT``, ``double`` and JSON-text keys,
literals whose Python type does not match the column) is returned to Spark, which applies
it. When several narrowing filters apply, points beat prefixes beat ranges; the remaining
ones are applied per row. Where pushdown shows: ``df.rdd.getNumPartitions()`` (the input
partitions ``partitions()`` planned) and the ``_trace_dir`` files.

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
import itertools
import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceWriter,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
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
    PrefixScanQuery,
    Query,
    RangeQuery,
    StateQueryRequest,
    WindowKeyQuery,
    WindowRangeQuery,
)
from iqkit.store.manifest import StoreManifest
from iqkit.store.partitioners import get_partitioner
from iqkit.store.serdes import get_serde

from .datasource_write import plan_write
from .workers import keep_spark_archive_indexes

__all__ = ["FILTER_PUSHDOWN_CONF", "IqkitDataSource", "IqkitReader", "register"]

#: The session conf Spark 4.1 requires for ``pushFilters`` (default ``false``).
FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"

PARTITION_COLUMN = "partition"
KEY_COLUMN = "key"
VALUE_COLUMN = "value"
WINDOW_START_COLUMN = "window_start"
WINDOW_END_COLUMN = "window_end"

#: Spark DDL type of each serde's values; ``json``/``ordered`` are their JSON text.
_SERDE_DDL = {
    "string": "STRING",
    "int32": "INT",
    "int64": "BIGINT",
    "double": "DOUBLE",
    "bytes": "BINARY",
    "json": "STRING",
    "ordered": "STRING",
}
_SCALAR_SERDES = ("string", "int32", "int64", "double", "bytes")

_MIN_MS, _MAX_MS = -(2**63), 2**63 - 1
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_ONE_US = _dt.timedelta(microseconds=1)
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def register(spark: Any, *, enable_filter_pushdown: bool = True) -> None:
    """Register the ``iqkit`` format with ``spark`` (``spark.read.format("iqkit")`` and
    ``df.write.format("iqkit")``).

    With ``enable_filter_pushdown`` (the default) also sets
    ``spark.sql.python.filterPushdown.enabled=true`` on the session: Spark 4.1 refuses to
    plan a reader that implements ``pushFilters`` while it is off.
    """
    spark.dataSource.register(IqkitDataSource)
    if enable_filter_pushdown:
        spark.conf.set(FILTER_PUSHDOWN_CONF, "true")


# -- options and the store's shape ---------------------------------------------------------
def _root_from_options(options: Any) -> str:
    root = options.get("root")
    path = options.get("path")
    if root and path and _normalize_root(root) != _normalize_root(path):
        raise ValueError(f"iqkit: option 'root' ({root!r}) and the load path ({path!r}) differ")
    chosen = root or path
    if not chosen:
        raise ValueError(
            "iqkit: the root folder is missing: use .load(root) or .option('root', root)"
        )
    return _normalize_root(chosen)


def _normalize_root(text: str) -> str:
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif text.startswith("file:"):
        text = text[len("file:") :]
    elif "://" in text:
        raise ValueError(
            f"iqkit: root {text!r} is not a file-system path; every executor must see the "
            "root as a local or shared POSIX path"
        )
    return os.path.abspath(os.path.expanduser(text))


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


def _flag(options: Any, name: str, default: bool) -> bool:
    text = options.get(name)
    if text is None:
        return default
    value = str(text).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"iqkit: option {name!r} must be true or false, got {text!r}")


def _read_manifest(root: str, store: str, as_of: int | None) -> tuple[StoreManifest, int | None]:
    """The store's manifest and the version to read (checked: an unknown store raises
    ``UnknownStoreError`` with a did-you-mean hint, an unretained ``as_of`` a
    ``ValueError`` naming the retained versions)."""
    pin = {store: as_of} if as_of is not None else None
    with iqkit.open(root, as_of=pin) as engine:
        return engine.manifest(store), engine.version(store)


def _key_columns(manifest: StoreManifest) -> list[tuple[str, str]] | None:
    """``(name, DDL type)`` of an ordered key's declared columns, or ``None``."""
    if manifest.key_serde != "ordered":
        return None
    names = manifest.properties.get("key_columns")
    types = manifest.properties.get("key_types")
    if not names or not types:
        return None
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if isinstance(types, str):
        types = [t.strip() for t in _split_ddl_list(types)]
    if len(names) != len(types):
        raise ValueError(
            f"iqkit: store {manifest.name!r}: properties key_columns {names!r} and "
            f"key_types {types!r} differ in length"
        )
    return [(str(n), str(t)) for n, t in zip(names, types, strict=True)]


def _split_ddl_list(text: str) -> list[str]:
    """Split ``"string, decimal(10,2)"`` on top-level commas."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "(<":
            depth += 1
        elif ch in ")>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def _ddl_names(ddl: str) -> list[str]:
    """Column names of a DDL column list (``"a string, `b c` map<string,int>"``)."""
    names = []
    for part in _split_ddl_list(ddl):
        part = part.strip()
        if part.startswith("`"):
            end = part.find("`", 1)
            while end != -1 and part[end + 1 : end + 2] == "`":
                end = part.find("`", end + 2)
            names.append(part[1:end].replace("``", "`") if end != -1 else part)
        else:
            names.append(part.split(None, 1)[0].rstrip(":"))
    return names


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _schema_ddl(manifest: StoreManifest, value_schema: str | None) -> str:
    key_cols = _key_columns(manifest)
    if key_cols is None:
        key_cols = [(KEY_COLUMN, _SERDE_DDL[manifest.key_serde])]
    fixed = [(PARTITION_COLUMN, "INT"), *key_cols]
    if manifest.kind == "window":
        fixed += [(WINDOW_START_COLUMN, "TIMESTAMP"), (WINDOW_END_COLUMN, "TIMESTAMP")]
    fixed_names = [n for n, _ in fixed]
    cols = [f"{_quote(n)} {t}" for n, t in fixed]
    if value_schema is not None:
        if manifest.value_serde != "json":
            raise ValueError(
                f"iqkit: option 'value_schema' needs a store with json values; store "
                f"{manifest.name!r} has {manifest.value_serde!r} values"
            )
        taken = [n.lower() for n in fixed_names]
        names = [n.lower() for n in _ddl_names(value_schema)]
        clash = sorted({n for n in names if names.count(n) > 1 or n in taken})
        if clash:
            raise ValueError(
                f"iqkit: option 'value_schema' repeats column(s) {', '.join(clash)}: value "
                f"columns may not repeat each other, the partition, key or window columns"
            )
        cols.append(value_schema)
    else:
        cols.append(f"{_quote(VALUE_COLUMN)} {_SERDE_DDL[manifest.value_serde]}")
    return ", ".join(cols)


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
        value_schema = self.options.get("value_schema")
        if value_schema is not None and not str(value_schema).strip():
            value_schema = None
        return _schema_ddl(manifest, value_schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        keep_spark_archive_indexes()
        cls = IqkitReader if _flag(self.options, "pushdown", True) else IqkitScanReader
        return cls(self.options, schema)

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
class IqkitScanReader(DataSourceReader):
    """Reads every row of the store, one input partition per store partition, at the
    version resolved when the reader is built (on the driver). Subclassed by
    :class:`IqkitReader`, which adds filter pushdown."""

    def __init__(self, options: Any, schema: StructType) -> None:
        self.root = _root_from_options(options)
        self.store = _store_from_options(options, self.root)
        as_of = _as_of_from_options(options)
        manifest, version = _read_manifest(self.root, self.store, as_of)
        #: The version every partition reads (``None``: nothing committed yet).
        self.version = version
        self.kind = manifest.kind
        self.num_partitions = manifest.partitions
        self.key_serde = manifest.key_serde
        self.value_serde = manifest.value_serde
        self.partitioner = manifest.partitioner
        self.trace_dir = options.get("_trace_dir") or None
        self.schema = schema

        declared = _key_columns(manifest)
        if declared is not None:
            self.key_mode = "columns"
            self.key_names = [n for n, _ in declared]
        else:
            self.key_mode = "value" if self.key_serde in _SCALAR_SERDES else "json"
            self.key_names = [KEY_COLUMN]
        fixed = {PARTITION_COLUMN, *self.key_names}
        if self.kind == "window":
            fixed |= {WINDOW_START_COLUMN, WINDOW_END_COLUMN}
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
            options.get("value_schema") in (None, "") and value_fields in ([VALUE_COLUMN], [])
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

        # Pushdown state (filled by IqkitReader.pushFilters; empty = full scan).
        self.partition_preds: list[tuple[str, Any]] = []
        self.key_preds: list[tuple[int, str, Any]] = []
        self.time_preds: list[tuple[str, int]] = []

    # -- planning --------------------------------------------------------------------------
    def partitions(self) -> list[InputPartition]:
        keep_spark_archive_indexes()
        allowed = [
            p
            for p in range(self.num_partitions)
            if all(_compare(op, p, operand) for op, operand in self.partition_preds)
        ]
        points = self._points()
        if points is None:
            return [_StorePartition(p) for p in allowed]
        partitioner = get_partitioner(self.partitioner)
        serde = get_serde(self.key_serde)
        if not partitioner.routes_keys:
            return [_StorePartition(p, tuple(points)) for p in allowed] if points else []
        owned: dict[int, list[Any]] = {}
        for key in points:
            try:
                key_bytes = serde.serialize(key)
            except (TypeError, ValueError):
                continue  # a key the serde cannot hold is in no partition
            owned.setdefault(partitioner.partition(key_bytes, self.num_partitions), []).append(key)
        return [_StorePartition(p, tuple(owned[p])) for p in allowed if p in owned]

    def _points(self) -> list[Any] | None:
        """The store keys an AND of ``=``/``IN`` on every key column allows, or ``None``."""
        sets: list[list[Any] | None] = [None] * len(self.key_names)
        for col, op, operand in self.key_preds:
            if op not in ("eq", "in"):
                continue
            values = [operand] if op == "eq" else list(operand)
            current = sets[col]
            sets[col] = values if current is None else [v for v in current if v in values]
        if any(s is None for s in sets):
            return None
        dedup = [list(dict.fromkeys(s or ())) for s in sets]
        if self.key_mode != "columns" or len(dedup) == 1:
            return dedup[0]
        if _product_size(dedup) > 10_000:
            return None  # too many combinations: scan and filter instead
        return [tuple(combo) for combo in itertools.product(*dedup)]

    def _key_query(self) -> Query | None:
        """The narrowing query for a key-value partition (no points): prefix or range."""
        if self.key_mode == "value" and self.key_serde == "string":
            prefixes = [v for c, op, v in self.key_preds if op == "prefix" and c == 0]
            if prefixes:
                longest = max(prefixes, key=len)
                if longest:
                    return PrefixScanQuery.with_prefix(longest)
        if self.key_mode == "columns" and len(self.key_names) > 1:
            lead = []
            for col in range(len(self.key_names) - 1):
                eqs = {v for c, op, v in self.key_preds if c == col and op == "eq"}
                if len(eqs) != 1:
                    break
                lead.append(next(iter(eqs)))
            if lead:
                return PrefixScanQuery.with_prefix(tuple(lead))
            return None
        lo = hi = None
        for col, op, operand in self.key_preds:
            if col != 0 or op not in ("gt", "ge", "lt", "le"):
                continue
            if op in ("gt", "ge") and (lo is None or operand > lo):
                lo = operand
            if op in ("lt", "le") and (hi is None or operand < hi):
                hi = operand
        if lo is None and hi is None:
            return None
        return RangeQuery.with_range(lo, hi)

    def _time_range(self) -> tuple[int, int]:
        """Window-start bounds in epoch ms (inclusive) from the pushed ``window_start``
        filters (microseconds; the per-row check keeps strictness exact)."""
        lo, hi = _MIN_MS, _MAX_MS
        for op, us in self.time_preds:
            if op in ("gt", "ge", "eq"):
                lo = max(lo, -(-us // 1000))  # ceil
            if op in ("lt", "le", "eq"):
                hi = min(hi, us // 1000)  # floor
        return lo, hi

    def _queries(self, part: _StorePartition) -> list[Query]:
        if self.kind == "window":
            lo, hi = self._time_range()
            if part.keys is not None:
                return [
                    WindowKeyQuery.with_key_and_window_start_range(k, lo, hi) for k in part.keys
                ]
            return [WindowRangeQuery.with_window_start_range(lo, hi)]
        if part.keys is not None:
            if len(part.keys) == 1:
                return [KeyQuery.with_key(part.keys[0])]
            return [MultiKeyQuery.with_keys(list(part.keys))]
        return [self._key_query() or RangeQuery.with_no_bounds()]

    # -- execution (on the executors) -----------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        keep_spark_archive_indexes()
        if not isinstance(partition, _StorePartition) or self.version is None:
            return iter(())  # nothing to read (everything pruned, or nothing committed)
        return self._read(partition)

    def _read(self, part: _StorePartition) -> Iterator[tuple[Any, ...]]:
        p = part.partition
        queries = self._queries(part)
        split = self._key_splitter()
        build = self._row_builder(p)
        keep = self._row_filter()
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
                        cols = split(key)
                        if keep is None or keep(cols, window):
                            count += 1
                            yield build(cols, window, value)
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
            if name == PARTITION_COLUMN:
                getters.append(lambda k, w, v, p=p: p)
            elif name in self.key_names:
                i = self.key_names.index(name)
                getters.append(lambda k, w, v, i=i: k[i])
            elif self.kind == "window" and name == WINDOW_START_COLUMN:
                getters.append(lambda k, w, v: _ms_to_datetime(w[0]))
            elif self.kind == "window" and name == WINDOW_END_COLUMN:
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
        if self.value_serde in ("json", "ordered"):
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

    def _row_filter(self) -> Callable[[tuple[Any, ...], Any], bool] | None:
        """The exact per-row check of every pushed key and window_start filter (``None``
        when nothing was pushed)."""
        key_preds = list(self.key_preds)
        time_preds = list(self.time_preds)
        if not key_preds and not time_preds:
            return None

        def keep(cols: tuple[Any, ...], window: Any) -> bool:
            for col, op, operand in key_preds:
                if not _compare(op, cols[col], operand):
                    return False
            if time_preds:
                start_us = window[0] * 1000
                for op, us in time_preds:
                    if not _compare(op, start_us, us):
                        return False
            return True

        return keep


class IqkitReader(IqkitScanReader):
    """:class:`IqkitScanReader` plus ``pushFilters`` (see "Filter pushdown" above)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        keep_spark_archive_indexes()
        rejected = []
        for f in filters:
            if not self._accept(f):
                rejected.append(f)
        return rejected

    def _accept(self, f: Filter) -> bool:
        op = _op_of(f)
        if op is None:
            return False
        column = f.attribute
        if len(column) != 1:
            return False
        name = column[0]
        if op == "notnull":
            # partition and scalar keys are never null; ordered key elements are checked
            # per row like every other pushed key filter.
            if name in self.key_names:
                self.key_preds.append((self.key_names.index(name), op, None))
            return name == PARTITION_COLUMN or name in self.key_names
        operand = f.value
        if name == PARTITION_COLUMN:
            operand = _typed_operand(op, operand, IntegerType())
            if operand is _REJECT or op == "prefix":
                return False
            self.partition_preds.append((op, operand))
            return True
        if self.kind == "window" and name == WINDOW_START_COLUMN:
            if op not in ("eq", "gt", "ge", "lt", "le"):
                return False
            us = _datetime_to_us(operand)
            if us is None:
                return False
            self.time_preds.append((op, us))
            return True
        if name not in self.key_names:
            return False
        col = self.key_names.index(name)
        if not self._key_op_allowed(col, op):
            return False
        operand = _typed_operand(op, operand, self.key_types[col])
        if operand is _REJECT:
            return False
        self.key_preds.append((col, op, operand))
        return True

    def _key_op_allowed(self, col: int, op: str) -> bool:
        dtype = self.key_types[col]
        if self.key_mode == "json":
            return False
        if self.key_mode == "value":
            if self.key_serde == "double":
                return False
            if op == "prefix":
                return self.key_serde == "string"
            if op in ("gt", "ge", "lt", "le"):
                return get_serde(self.key_serde).order_preserving
            return True
        # ordered key columns
        if not isinstance(
            dtype, (StringType, IntegerType, LongType, ShortType, ByteType, BinaryType, BooleanType)
        ):
            return False
        if op == "prefix":
            return False
        if op in ("gt", "ge", "lt", "le"):
            return len(self.key_names) == 1 and not isinstance(dtype, BooleanType)
        return True


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


def _datetime_to_us(value: Any) -> int | None:
    if not isinstance(value, _dt.datetime):
        return None
    aware = value if value.tzinfo is not None else value.replace(tzinfo=_dt.UTC)
    return (aware - _EPOCH) // _ONE_US


# -- filters ---------------------------------------------------------------------------------
_OPS: dict[type, str] = {
    EqualTo: "eq",
    In: "in",
    GreaterThan: "gt",
    GreaterThanOrEqual: "ge",
    LessThan: "lt",
    LessThanOrEqual: "le",
    StringStartsWith: "prefix",
    IsNotNull: "notnull",
}
_REJECT: Any = object()


def _op_of(f: Filter) -> str | None:
    return _OPS.get(type(f))


def _typed_operand(op: str, operand: Any, dtype: DataType | None) -> Any:
    """The literal in the column's Python type, or ``_REJECT`` when it does not match
    (Spark then keeps the filter)."""
    if op == "in":
        if not isinstance(operand, (list, tuple)):
            return _REJECT
        values = [_typed_literal(v, dtype) for v in operand if v is not None]
        if any(v is _REJECT for v in values):
            return _REJECT
        return tuple(values)
    if operand is None:
        return _REJECT
    if op == "prefix":
        return operand if isinstance(operand, str) and isinstance(dtype, StringType) else _REJECT
    return _typed_literal(operand, dtype)


def _typed_literal(value: Any, dtype: DataType | None) -> Any:
    if isinstance(dtype, StringType):
        return value if isinstance(value, str) else _REJECT
    if isinstance(dtype, BinaryType):
        return bytes(value) if isinstance(value, (bytes, bytearray)) else _REJECT
    if isinstance(dtype, (IntegerType, LongType, ShortType, ByteType)):
        return value if isinstance(value, int) and not isinstance(value, bool) else _REJECT
    if isinstance(dtype, BooleanType):
        return value if isinstance(value, bool) else _REJECT
    return _REJECT


def _compare(op: str, value: Any, operand: Any) -> bool:
    """SQL semantics of one pushed filter on one value (``NULL`` never matches)."""
    if op == "notnull":
        return value is not None
    if value is None:
        return False
    if op == "eq":
        return bool(value == operand)
    if op == "in":
        return value in operand
    if op == "gt":
        return bool(value > operand)
    if op == "ge":
        return bool(value >= operand)
    if op == "lt":
        return bool(value < operand)
    if op == "le":
        return bool(value <= operand)
    if op == "prefix":
        return isinstance(value, str) and value.startswith(operand)
    raise ValueError(f"unknown filter op {op!r}")


def _product_size(sets: Sequence[Sequence[Any]]) -> int:
    size = 1
    for s in sets:
        size *= len(s)
    return size


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
