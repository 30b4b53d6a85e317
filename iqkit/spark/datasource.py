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
``root`` / path    the root holding the stores: ``.option("root", ...)`` or
                   ``.load(root)`` (both given and different is an error): a folder
                   (relative paths are made absolute on the driver; ``file:`` URIs are
                   accepted) or an object-storage URL (``s3://bucket/prefix``, ``gs://``,
                   ``abfs://``), whose stores are SST chains.
``as_of``          a version number to read instead of the latest published one (a version
                   that is not retained fails at planning, naming the retained ones).
``value_schema``   a DDL string (``"customer string, total bigint"``) for ``json`` values:
                   each JSON object is decoded into these top-level columns instead of one
                   ``value`` column. By default the store's own (its manifest's
                   ``properties["value_schema"]``, which the Spark writers record for a
                   record of columns); ``""`` reads the whole value as one ``value``
                   column of JSON text.
``partitions``, ``key``, ``keys``, ``prefix``, ``key_from``, ``key_to``, ``time_from``,
``time_to``        narrow the read to what an IQv2 query would return; a key lookup reads
                   only the partition that owns the key (:mod:`iqkit.spark.read_spec`).
``max_partition_bytes``  the most bytes (``"64m"``, ``"1g"``) one Spark task reads
                   before the read gets more tasks (default 128 MiB; ``1``: one task per
                   store partition).
``_trace_dir``     hidden, for tests and debugging: every partition read writes one JSON
                   file there (store, partition, version, the IQv2 query it ran, rows,
                   and ``path``: ``columnar`` or ``rows``).
``_twin_scans``    hidden, for tests and benchmarks: ``false`` makes the tasks read RocksDB
                   rows (``twin_scans(False)`` in each task: a flag set in the driver does
                   not reach Spark's Python workers, which are other processes).
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
Each Spark task opens ``iqkit.open(root)`` itself, on its executor, so ``root`` must be
either a file-system path that the driver and every executor see with the same contents
(one machine, or a shared POSIX file system such as NFS, EFS or a FUSE mount), or an
object-storage URL: then each executor fetches the SSTs of the partitions it reads into
its own ``FileCache`` (``IQKIT_CACHE``), with the credentials of its own environment, and
nothing is shared between the driver and the executors but the URL. The executors'
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
The store partitions read are spread over Spark tasks by their size, as Spark packs small
files (:mod:`iqkit.spark.read_tasks`: as many tasks as the driver has cores, more for
big stores; ``max_partition_bytes=1`` gives each store partition its own task). The
``partition`` column is always the store partition. A task runs each of its partitions'
queries with ``.with_partitions({p})``; a partition no commit has touched is empty (no
rows, as the engine answers it); any failure (``STORE_EXCEPTION``, ``NOT_PRESENT``,
``NOT_ACTIVE``, ...) fails the task with the failure reason and message, because the
query cannot be answered. The task's engine is closed when its partitions are done.

Schema rules
------------
``partition int`` first, then the key column(s), for window stores ``window_start
timestamp, window_end timestamp``, then the value column(s): the row schema of
:mod:`iqkit.store.rows`, which Arrow tables and SQL share; rows are built by
:mod:`iqkit.spark.read_rows`.

* A store with a value schema (one a Spark writer made from a record of columns) reads
  back typed: the key column under its written name, each value column with its own
  name and Spark type (a member named like ``partition`` or a window column becomes
  ``value.<name>``, as in Arrow tables).
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
* Full, range and prefix reads of partitions that have columnar twins yield Arrow record
  batches made from the twins' columns (:mod:`iqkit.spark.read_arrow`: which schemas it
  serves, and why its rows are the row path's); other reads yield tuples (Spark batches
  them into Arrow). Both keep memory flat for large partitions (a row group or a chunk
  at a time).
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.types import StructType

import iqkit
from iqkit.errors import IqkitError, StoreNotFoundError
from iqkit.query import (
    KeyQuery,
    MultiKeyQuery,
    Query,
    StateQueryRequest,
)
from iqkit.store.manifest import StoreManifest
from iqkit.store.partitions.layers import ScanIterator, twin_scans
from iqkit.store.roots import StoreRoot
from iqkit.store.rows import RowSchema

from .datasource_write import plan_write
from .read_arrow import ArrowRows
from .read_rows import SparkRows
from .read_spec import ReadSpec, parse_read_options
from .read_tasks import max_partition_bytes, spread
from .roots import driver_root, driver_store_root
from .worker_python import require_workers_can_import_iqkit
from .workers import keep_spark_archive_indexes

__all__ = ["IqkitDataSource", "IqkitReader", "register"]


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
def _store_root_from_options(options: Any) -> StoreRoot:
    """The root the options name (``root``, or the load/save path), parsed once."""
    root = options.get("root")
    path = options.get("path")
    if root and path and driver_root(root) != driver_root(path):
        raise ValueError(f"iqkit: option 'root' ({root!r}) and the load path ({path!r}) differ")
    chosen = root or path
    if not chosen:
        raise ValueError(
            "iqkit: the root folder is missing: use .load(root) or .option('root', root)"
        )
    return driver_store_root(chosen)


def _store_from_options(options: Any, root: str) -> str:
    store = options.get("store")
    if not store:
        known: list[str] = []
        # A local root folder not made yet holds none (the engine refuses to open it).
        with contextlib.suppress(StoreNotFoundError), iqkit.open(root) as engine:
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


def _value_schema_option(options: Any) -> str | None:
    """The ``value_schema`` option as given (``None``: absent, the manifest's is used)."""
    text = options.get("value_schema")
    return None if text is None else str(text)


def _read_manifest(root: str, store: str, as_of: int | None) -> tuple[StoreManifest, int | None]:
    """The store's manifest and the version to read (checked: an unknown store raises
    ``UnknownStoreError`` with a did-you-mean hint, an unretained ``as_of`` a
    ``ValueError`` naming the retained versions)."""
    pin = {store: as_of} if as_of is not None else None
    with iqkit.open(root, as_of=pin) as engine:
        return engine.manifest(store), engine.version(store)


@dataclass(frozen=True)
class _ReadFacts:
    """What the driver learns of the store before planning a read: the manifest, the
    version read, the bytes a scan of each partition reads (``StateEngine.scan_bytes``),
    the checked read options and, for key lookups, each key's owning partition (the
    engine's routing, which knows every format's: Spark's hash for a checkpoint)."""

    manifest: StoreManifest
    version: int | None
    scan_bytes: dict[int, int]
    spec: ReadSpec
    owners: tuple[tuple[Any, int | None], ...]

    def owner_of(self, key: Any) -> int | None:
        return next((owner for k, owner in self.owners if k == key), None)


def _read_facts(root: str, store: str, options: Mapping[str, str]) -> _ReadFacts:
    as_of = _as_of_from_options(options)
    pin = {store: as_of} if as_of is not None else None
    with iqkit.open(root, as_of=pin) as engine:
        manifest = engine.manifest(store)
        spec = parse_read_options(options, manifest)
        owners = tuple((k, engine.partition_for_key(store, k)) for k in spec.keys or ())
        return _ReadFacts(manifest, engine.version(store), engine.scan_bytes(store), spec, owners)


class IqkitDataSource(DataSource):
    """``spark.read.format("iqkit")`` — see the module docstring for options and rules."""

    @classmethod
    def name(cls) -> str:
        return "iqkit"

    # Spark calls these on the driver side in Python planner workers, which PySpark reuses:
    # each entry point keeps Spark's archive indexes (see iqkit.spark.workers).
    def schema(self) -> str:
        keep_spark_archive_indexes()
        root = driver_root(_store_root_from_options(self.options))
        store = _store_from_options(self.options, root)
        manifest, _ = _read_manifest(root, store, _as_of_from_options(self.options))
        parse_read_options(self.options, manifest)  # bad read options fail at load()
        rows = RowSchema(manifest)
        return rows.spark_ddl(rows.spark_value_schema(_value_schema_option(self.options)))

    def reader(self, schema: StructType) -> DataSourceReader:
        keep_spark_archive_indexes()
        return IqkitReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """``df.write.format("iqkit")``: ``.mode("append")`` upserts, ``.mode("overwrite")``
        replaces the store's contents (see :mod:`iqkit.spark.datasource_write`)."""
        keep_spark_archive_indexes()
        where = _store_root_from_options(self.options)
        store = _store_from_options(self.options, driver_root(where))
        return plan_write(self.options, where, store, schema, overwrite)


# -- input partitions ------------------------------------------------------------------------
@dataclass(frozen=True)
class _StorePartition:
    """One store partition a task reads; ``keys`` are the pushed point keys it owns
    (``None``: no point lookup)."""

    partition: int
    keys: tuple[Any, ...] | None = None


class _StorePartitions(InputPartition):
    """The store partitions one Spark task reads, in order (``read_tasks.spread``)."""

    def __init__(self, parts: list[_StorePartition]) -> None:
        super().__init__([p.partition for p in parts])
        self.parts = parts


# -- the reader ------------------------------------------------------------------------------
class IqkitReader(DataSourceReader):
    """Reads the store partitions the read options select (all by default), spread over
    Spark tasks by their size (:mod:`iqkit.spark.read_tasks`), at the version resolved
    when the reader is built (on the driver).

    Four jobs, four homes: what to read is planned here from the options
    (:mod:`iqkit.spark.read_spec`: which partitions, which IQv2 queries), which task
    reads which partition by ``read_tasks``, a task's partitions are read by
    ``_read_partitions``, and records become rows of the schema as
    :class:`iqkit.spark.read_rows.SparkRows` says (the layout is :mod:`iqkit.store.rows`').

    Deliberately no ``pushFilters``: see "Narrowing is by options" in the module
    docstring."""

    def __init__(self, options: Any, schema: StructType) -> None:
        self.root = driver_root(_store_root_from_options(options))
        self.store = _store_from_options(options, self.root)
        facts = _read_facts(self.root, self.store, options)
        manifest = facts.manifest
        #: What the options narrow the read to (checked here, on the driver).
        self.spec = facts.spec
        #: Which partition owns each key looked up (``None``: any may hold it).
        self.owner_of = facts.owner_of
        #: How the partitions are spread over tasks (``read_tasks``).
        self.scan_bytes = facts.scan_bytes
        self.max_partition_bytes = max_partition_bytes(options)
        self.manifest = manifest
        #: The version every partition reads (``None``: nothing committed yet).
        self.version = facts.version
        self.trace_dir = options.get("_trace_dir") or None
        #: How records become rows of ``schema`` (checked here too).
        rows = RowSchema(manifest)
        value_schema = rows.spark_value_schema(_value_schema_option(options))
        self.rows = SparkRows(rows, schema, value_schema=value_schema is not None)
        #: How twin tables become batches of ``schema`` (``None``: the row path only).
        self.arrow = ArrowRows.plan(rows, self.rows, schema)
        #: Whether the tasks read twins at all (hidden ``_twin_scans`` option).
        self.twin_scans = str(options.get("_twin_scans", "true")).strip().lower() != "false"

    # -- planning --------------------------------------------------------------------------
    def partitions(self) -> list[InputPartition]:
        """The store partitions to read, spread over Spark tasks by the bytes a scan of
        each reads (``read_tasks``; key lookups weigh nothing)."""
        keep_spark_archive_indexes()
        planned = self.spec.plan(self.manifest, self.owner_of)
        weights = {} if self.spec.keys is not None else self.scan_bytes
        groups = spread(planned, weights, cap=self.max_partition_bytes)
        return [_StorePartitions([_StorePartition(p, keys) for p, keys in g]) for g in groups]

    # -- execution (on the executors) -----------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[Any]:
        keep_spark_archive_indexes()
        if not isinstance(partition, _StorePartitions) or self.version is None:
            return iter(())  # nothing to read (everything pruned, or nothing committed)
        return _read_partitions(self, partition.parts)


def _read_partitions(reader: IqkitReader, parts: list[_StorePartition]) -> Iterator[Any]:
    """The rows of a task's store partitions at the reader's version, one after the
    other: Arrow record batches where a partition's scan reads columnar twins and the
    schema allows (``reader.arrow``), else tuples; a failed partition raises
    ``IqkitError`` (module docstring)."""
    twins = contextlib.nullcontext() if reader.twin_scans else twin_scans(False)
    with twins, iqkit.open(reader.root, as_of={reader.store: reader.version}) as engine:
        for part in parts:
            yield from _read_records(reader, part, engine)


def _read_records(
    reader: IqkitReader, part: _StorePartition, engine: iqkit.StateEngine
) -> Iterator[Any]:
    p, store, version = part.partition, reader.store, reader.version
    queries = reader.spec.queries(reader.manifest.kind, part.keys)
    split = reader.rows.splitter()
    build = reader.rows.builder(p)
    count, path = 0, "rows"
    try:
        for query in queries:
            request = StateQueryRequest.in_store(store).with_query(query).with_partitions({p})
            result = engine.query(request).partition_results[p]
            if result.is_failure:
                raise IqkitError(
                    f"iqkit: store {store!r} partition {p} at version {version} cannot "
                    f"be read: {result.failure_reason.name}: {result.failure_message}"
                )
            arrow = reader.arrow
            tables = None if arrow is None else _twin_tables(arrow, result.result)
            if arrow is not None and tables is not None:
                path = "columnar"
                for batch in arrow.batches(p, tables):
                    count += batch.num_rows
                    yield batch
                continue
            for key, window, value in _records(query, result.result):
                count += 1
                yield build(split(key), window, value)
    finally:
        if reader.trace_dir:
            _trace(reader.trace_dir, store, p, version, queries, count, path)


def _twin_tables(arrow: ArrowRows, value: Any) -> Iterator[Any] | None:
    """The twin tables of a scan result read from columnar twins (only the columns
    ``arrow`` needs), or ``None``: the result is read row by row."""
    if not isinstance(value, ScanIterator):
        return None
    return value.take_twin(arrow.columns())


def _trace(
    trace_dir: str,
    store: str,
    p: int,
    version: int | None,
    queries: Sequence[Query],
    rows: int,
    path: str,
) -> None:
    """One JSON file per partition read (the hidden ``_trace_dir`` option)."""
    os.makedirs(trace_dir, exist_ok=True)
    entry = {
        "store": store,
        "partition": p,
        "version": version,
        "queries": [repr(q) for q in queries],
        "rows": rows,
        "path": path,
    }
    name = f"{store}-p{p}-{uuid.uuid4().hex}.json"
    path = os.path.join(trace_dir, name)
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(entry, fh)
    os.replace(path + ".tmp", path)


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
