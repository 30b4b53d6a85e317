"""``write_store``: a Spark DataFrame into an iqkit store, in one call.

The job, end to end:

1. Driver checks (cheap, before any data is written): columns and types against the
   serdes (``schema.plan_columns``), the store's settings, a valid
   ``mark_as_partitioned`` column, one window size, and no null keys — for JVM-routed
   writes (step 2) the write tasks count null keys instead, which saves a pass over the
   input, and the driver refuses the job with the same error before publishing. NaN and
   infinities in JSON values are caught in the JVM, in the projection of step 2
   (``_refuse_non_finite``). A new store is not created yet (see step 5).
2. Route each row to its store partition. In the JVM when it can be done byte-exactly
   there (``_jvm_partition``): the named column (``mark_as_partitioned``), Kafka's murmur2
   of an ``int32``/``int64`` key as plain integer arithmetic, or of a ``string`` key by
   commons-codec's ``MurmurHash2.hash32(String)`` (Kafka's function over the UTF-8 bytes,
   checked once per session against Kafka's test vectors). Otherwise in Python
   (``_encode_fn``, ``mapInArrow``, with ``store.encoding.arrow_encode``'s encoder, which
   every bulk write shares): keys and values serialized, murmur2 over the key bytes,
   RocksDB key bytes made — whole Arrow columns at a time where the serdes allow, row
   by row for the others.
3. One shuffle (``repartitionById``: store partition ``p`` goes to Spark partition
   ``p % tasks``; none with ``mark_as_partitioned``). No Spark sort: keys sharing a long
   prefix defeat Spark's prefix sort, and ``pyarrow`` sorts them several times faster.
4. Write (``mapInArrow``): each task serializes what is still raw (vectorized), sorts
   each store partition's rows by key and keeps the last row per key
   (``store.sorted_rows.SortedRows``, spilling runs to local disk past a memory budget),
   stages its store partitions through the job's spec (the root's format's
   ``open_job_commit``) and returns what it staged, as text: one SST built in the
   executor's local folder and uploaded under a unique name (``iqkit.store.chain.jobs``), so
   executors and driver need share no files. Nothing is visible yet.
5. Driver: once the job succeeded, publish exactly one staged partition per store
   partition as the store's next version (one exclusive create of its version record),
   creating the store if it is new. A failed job publishes nothing and creates no store
   (a chain job that fails after its tasks ran removes what they uploaded and sent back,
   and, under a local root, the empty folders of a store never created); a retried or
   speculative attempt's output is never published (retention removes it after its
   grace period).

A DataFrame of few Spark partitions (``batch_in_place.IN_PLACE_MAX_PARTITIONS``), unless
Kafka-shaped or ``mark_as_partitioned``, skips steps 2-5: each task writes its own rows
in place as the data source's tasks do, and the driver chains them (``batch_in_place``).

Duplicate keys: the row with the highest sequence wins (Kafka's ``offset`` for
Kafka-shaped input, else ``monotonically_increasing_id``, i.e. input order).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..query.position import Position
from ..store.encoding.arrow_encode import (
    encoded_batch,
    non_finite_message,
    null_keys_error,
    route,
    serialize_column,
    serialize_keys,
)
from ..store.encoding.json_arrow import JSON_OPTIONS
from ..store.encoding.partitioners import get_partitioner, murmur2
from ..store.encoding.serdes import Serde, get_serde
from ..store.format import StoreFormat, check_job_mode
from ..store.formats import format_for
from ..store.manifest import StoreManifest
from ..store.roots import StoreRoot
from ..store.sorted_rows import SortedRows
from .batch_in_place import write_in_place, writes_in_place
from .progress import WriteProgress
from .roots import driver_store_root
from .schema import (
    KAFKA_COLUMNS,
    ColumnPlan,
    ensure_spark_store,
    one_window_size,
    plan_columns,
    spark_non_finite,
)
from .worker_python import require_workers_can_import_iqkit
from .workers import consume_marker, keep_spark_archive_indexes, spill_dir

#: ``arrow_encode.ENCODED`` as Spark's schema of the encoding ``mapInArrow``.
_ENCODED_SCHEMA = "__p int, __k binary, __v binary, __seq long"
#: Arrow bytes of rows a write task holds before it spills them, sorted, to local disk
#: (see ``SortedRows``).
_SPILL_BYTES = 256 * 1024 * 1024
#: Rows per Arrow batch Spark hands the write's ``mapInArrow`` functions (Spark's
#: default is 10,000): with 50,000, a write_store of 2M short rows took 6.1-6.5 s against
#: 8.9-11 s on a loaded 2-core machine (per-batch costs on both sides of Spark's Arrow
#: stream).
_BATCH_ROWS = 50_000
_ROWS_KEY = "spark.sql.execution.arrow.maxRecordsPerBatch"
_STAGED_FIELDS = pa.schema(
    [
        ("partition", pa.int32()),
        ("staged", pa.string()),  # the spec's staged partition, as text (to_text)
        ("attempt", pa.string()),
        ("puts", pa.int64()),
        ("deletes", pa.int64()),
        ("spark_partition", pa.int32()),
        ("null_keys", pa.int64()),  # rows refused for a null key (partition -1)
    ]
)
_STAGED_SCHEMA = (
    "partition int, staged string, attempt string, puts long, deletes long, spark_partition int, "
    "null_keys long"
)


def write_store(
    df: DataFrame,
    root: str | os.PathLike[str] | StoreRoot,
    store: str,
    *,
    key: str | Sequence[str],
    value: str | None = None,
    partitions: int,
    key_serde: str | None = None,
    value_serde: str | None = None,
    window: str | None = None,
    mode: str = "upsert",
    mark_as_partitioned: str | None = None,
    retention: int | None = None,
    metadata: dict[str, Any] | None = None,
    source_end: Position | None = None,
    progress: bool = True,
    _fail_task_once: str | None = None,
    _spill_bytes: int | None = None,
    _shuffle: bool | None = None,
) -> int:
    """Write ``df`` into store ``store`` under ``root``; return the published version.

    ``key``: a column, or a list of columns (a composite key, ``ordered`` serde).
    ``value``: a column, or ``None`` to store every other column as a JSON record.
    ``window``: Spark's ``window`` struct column (``groupBy(window(...), key)``): the
    store becomes a window store keyed by (key, window start).
    ``mode``: ``"upsert"`` (keys not in ``df`` keep their values) or ``"overwrite"``
    (the store holds exactly ``df`` afterwards).
    ``mark_as_partitioned``: KIP-759 — ``df`` is already partitioned by this integer
    column, which names each row's store partition: no shuffle, and the store uses the
    ``explicit`` partitioner so key queries fan out instead of routing by hash.
    Kafka-shaped input (``topic``, ``partition``, ``offset`` columns) advances the
    positions of the written partitions to the highest offsets in ``df``.
    ``root``: a folder every executor can see (a shared or local filesystem), or an
    object-storage URL (``s3://bucket/prefix``, ``gs://``, ``abfs://``) that every
    executor reaches with the credentials of its own environment.
    ``progress``: show a progress bar (tasks, then partitions and rows written).
    ``_fail_task_once``: tests only — a marker file whose presence makes one task attempt
    fail after staging its first partition (the marker is consumed).
    ``_spill_bytes``: tests only — a write task's memory budget (default 256 MiB) on the
    shuffle path, which it chooses.
    ``_shuffle``: tests only — ``True``/``False`` choose the shuffle or the in-place path
    (default: chosen by ``writes_in_place``).

    A DataFrame of few Spark partitions is written in place, with no shuffle
    (``batch_in_place``); the store is the same.
    """
    check_job_mode(mode)  # both paths take it; the in-place one never asks the format
    require_workers_can_import_iqkit(df.sparkSession)
    fmt = format_for(driver_store_root(root))
    plan = plan_columns(
        df,
        store,
        key=key,
        value=value,
        key_serde=key_serde,
        value_serde=value_serde,
        window=window,
        partition_column=mark_as_partitioned,
    )
    window_size = _window_size(df, plan, store) if plan.window_column else None
    manifest = _store_manifest(fmt, store, df, plan, partitions, window_size, retention)
    in_place = writes_in_place(df, plan) if _shuffle is None else not _shuffle
    if in_place and _spill_bytes is None:
        return write_in_place(
            df,
            driver_store_root(root),
            store,
            plan,
            partitions=partitions,
            mode=mode,
            retention=retention,
            metadata={**(metadata or {}), "spark_write": "write_store"},
            source_end=source_end,
            progress=progress,
            fail_marker=_fail_task_once,
            arrow_batches=lambda: _arrow_batches(df.sparkSession),
        )
    encoded, raw = _encode(df, plan, manifest)
    if not raw:  # raw (JVM-routed) writes count null keys in the job itself: one pass less
        _check_no_null_keys(df, plan, store)
    if plan.partition_column is not None:
        _check_partition_column(df, plan.partition_column, partitions, store)
    position = _kafka_position(df)
    if plan.partition_column is None:
        encoded = encoded.repartitionById(min(partitions, _parallelism(df)), "__p")
    sc = df.sparkSession.sparkContext
    with (
        WriteProgress(sc, store, enabled=progress) as bar,
        fmt.open_job_commit(store, mode=mode, who=f"spark:{sc.appName}", create=manifest) as job,
    ):
        writer = _stage_partitions_fn(
            job.spec,
            position,
            _fail_task_once,
            finish=_finish_fn(manifest, plan, raw=raw),
            spill_bytes=_spill_bytes or _SPILL_BYTES,
        )
        try:
            with _arrow_batches(df.sparkSession):
                rows = encoded.mapInArrow(writer, _STAGED_SCHEMA).collect()
        except Exception as exc:
            refused = _refusal(exc, plan, store)
            if refused is not None:
                raise refused from None
            raise
        # What the tasks staged is the job's to remove if it publishes nothing (the
        # context's abort on any error below).
        job.adopt(
            job.spec.staged_from_text(r["staged"])
            for r in rows
            if r["partition"] is not None and r["partition"] >= 0 and r["staged"]
        )
        if any(r["null_keys"] for r in rows):  # nothing is published: the job aborts
            raise null_keys_error(store, plan.key_columns[0])
        staged = _one_per_partition(job.spec, rows, plan, store)
        # Partitions no row reached: an overwrite empties them; and in a murmur2 store,
        # whose every partition reads every input partition, they applied this input
        # too, so their positions advance (else bounds and lag would count records
        # that could never reach them).
        advance = position is not None and plan.partition_column is None
        if mode == "overwrite" or advance:
            for p in sorted(set(range(partitions)) - {s.partition for s in staged}):
                staged.append(job.spec.stage(p, [], attempt="driver", position=position))
        written = sum(s.puts for s in staged)
        version = job.publish(
            staged,
            source_end=source_end,
            metadata={
                **(metadata or {}),
                "spark_app_id": sc.applicationId,
                "rows_written": written,
            },
        )
        bar.finish(partitions=len(staged), rows=written, version=version)
        return version


@contextlib.contextmanager
def _arrow_batches(spark: SparkSession) -> Iterator[None]:
    """Spark's Arrow batches for the write's Python functions at least ``_BATCH_ROWS``
    rows, for the one job that runs inside. Spark reads the setting when the job is
    planned (at ``collect``) and has no per-call option for ``mapInArrow``: the
    session's value is set, then put back. Wide rows stay small batches anyway: Spark
    also cuts a batch at ``spark.sql.execution.arrow.maxBytesPerBatch`` (64 MiB)."""
    conf = spark.conf
    before = conf.get(_ROWS_KEY)
    if 0 < int(before or 0) < _BATCH_ROWS:  # 0 or less: no limit, kept
        conf.set(_ROWS_KEY, str(_BATCH_ROWS))
    try:
        yield
    finally:
        if before is not None:
            conf.set(_ROWS_KEY, before)


# -- driver-side checks ------------------------------------------------------------------------
def _store_manifest(
    fmt: StoreFormat,
    store: str,
    df: DataFrame,
    plan: ColumnPlan,
    partitions: int,
    window_size: int | None,
    retention: int | None,
) -> StoreManifest:
    """The existing store's manifest (its settings must fit the DataFrame), or the one a
    new store will get when the job publishes (see ``ensure_spark_store``)."""
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    return ensure_spark_store(
        fmt,
        store,
        plan,
        partitions=partitions,
        partitioner=None,
        window_size=window_size,
        retention=retention,
        key_types=[types[k] for k in plan.key_columns],
        written_by="iqkit.spark.write_store",
    )


def _check_no_null_keys(df: DataFrame, plan: ColumnPlan, store: str) -> None:
    for column in plan.key_columns:
        if df.where(F.col(column).isNull()).limit(1).count():
            raise null_keys_error(store, column)


def _check_partition_column(df: DataFrame, column: str, partitions: int, store: str) -> None:
    """KIP-759's claim, checked cheaply: every row names a partition in range."""
    c = F.col(column)
    bad = df.where(c.isNull() | (c < 0) | (c >= partitions)).select(column).limit(1).collect()
    if bad:
        raise ValueError(
            f"store {store!r}: mark_as_partitioned column {column!r} must hold integers in "
            f"[0, {partitions}); found {bad[0][0]!r}"
        )


def _window_size(df: DataFrame, plan: ColumnPlan, store: str) -> int:
    w = plan.window_column
    size = F.expr(f"unix_millis(`{w}`.end) - unix_millis(`{w}`.start)")
    lo, hi = df.select(F.min(size), F.max(size)).first()
    return one_window_size(store, w, lo, hi)


def _kafka_position(df: DataFrame) -> Position | None:
    """The highest offset per (topic, partition) of Kafka-shaped input, else None."""
    if not set(KAFKA_COLUMNS) <= set(df.columns):
        return None
    rows = df.groupBy("topic", "partition").agg(F.max("offset").alias("o")).collect()
    position = Position.empty()
    for r in rows:
        if r["topic"] is not None and r["o"] is not None:
            position = position.with_component(r["topic"], int(r["partition"]), int(r["o"]))
    return position


def _parallelism(df: DataFrame) -> int:
    return max(1, df.sparkSession.sparkContext.defaultParallelism)


def _one_per_partition(spec: Any, rows: list[Any], plan: ColumnPlan, store: str) -> list[Any]:
    staged: dict[int, Any] = {}
    for r in rows:
        if r["partition"] in staged:
            raise ValueError(
                f"store {store!r}: store partition {r['partition']} arrived in more than one "
                f"Spark partition, so the input is not partitioned by "
                f"{plan.partition_column!r}; drop mark_as_partitioned to let iqkit shuffle"
            )
        staged[r["partition"]] = spec.staged_from_text(r["staged"])
    return list(staged.values())


# -- routing in the JVM --------------------------------------------------------------------------
#: Kafka's murmur2 over a Java String's UTF-8 bytes (commons-codec ships with Spark).
_MURMUR2_CLASS = "org.apache.commons.codec.digest.MurmurHash2"
#: Strings whose murmur2 the JVM must reproduce before it routes a session's writes:
#: Kafka's test vectors plus multi-byte UTF-8 (2-, 3- and 4-byte sequences, NUL).
_MURMUR2_CHECKS = ("21", "foobar", "a-little-bit-long-string", "abc", "", "é中😀\x00x")
_jvm_murmur2_checked: dict[str, bool] = {}
_M = 0x5BD1E995
_U32 = 0xFFFFFFFF


def _jvm_partition(df: DataFrame, plan: ColumnPlan, manifest: StoreManifest) -> Column | None:
    """The store partition as a Spark expression, when the JVM computes it exactly as
    ``iqkit.store.encoding.partitioners`` would; ``None`` otherwise (Python routes)."""
    if plan.window_column or plan.composite_key:
        return None
    if plan.partition_column is not None:
        return F.col(plan.partition_column).cast("int")
    if manifest.partitioner != "murmur2":
        return None
    key = F.col(plan.key_columns[0])
    dtype = df.schema[plan.key_columns[0]].dataType
    ints = (T.IntegerType, T.ShortType, T.ByteType)
    if manifest.key_serde == "int32" and isinstance(dtype, ints):
        h = _murmur2_big_endian(key.cast("long"), 4)
    elif manifest.key_serde == "int64" and isinstance(dtype, (*ints, T.LongType)):
        h = _murmur2_big_endian(key.cast("long"), 8)
    elif (
        manifest.key_serde == "string"
        and isinstance(dtype, T.StringType)
        and _string_murmur2_in_jvm(df.sparkSession)
    ):
        # Null keys (counted and refused by the write tasks) must not reach reflect().
        h = F.when(key.isNotNull(), _reflect_murmur2(key)).cast("long")
    else:
        return None
    return (h.bitwiseAND(F.lit(0x7FFFFFFF)) % F.lit(manifest.partitions)).cast("int")


def _reflect_murmur2(text: Column) -> Column:
    # reflect() returns the int as a decimal string, and needs literal class/method names.
    return F.call_function("reflect", F.lit(_MURMUR2_CLASS), F.lit("hash32"), text).cast("int")


def _string_murmur2_in_jvm(spark: SparkSession) -> bool:
    """Whether this Spark application's JVM has commons-codec's ``MurmurHash2`` and it
    matches Kafka's murmur2 (checked once per application, through py4j: no Spark job)."""
    sc = spark.sparkContext
    app = sc.applicationId
    if app not in _jvm_murmur2_checked:
        try:
            cls = getattr(sc._jvm, _MURMUR2_CLASS)
            got = [int(cls.hash32(t)) for t in _MURMUR2_CHECKS]
        except Exception:  # no such class on a custom classpath (py4j error): Python routes
            got = None
        _jvm_murmur2_checked[app] = got == [murmur2(t.encode()) for t in _MURMUR2_CHECKS]
    return _jvm_murmur2_checked[app]


def _mul32(x: Column) -> Column:
    """``x * m`` modulo 2**32 (Java ``int`` overflow): ``x`` < 2**32 and ``m`` < 2**31, so
    the long product never overflows (ANSI mode would raise if it did)."""
    return (x * F.lit(_M)).bitwiseAND(F.lit(_U32))


def _murmur2_big_endian(value: Column, width: int) -> Column:
    """Kafka's murmur2 of a ``width``-byte big-endian integer (what the ``int32``/``int64``
    serdes write), unrolled into long arithmetic: each 4-byte word is read little-endian
    (a byte swap of the big-endian half), there is no tail. Unsigned 32-bit result."""
    halves = [value] if width == 4 else [F.shiftright(value, 32), value]
    h = F.lit((0x9747B28C ^ width) & _U32)
    for half in halves:
        u = half.bitwiseAND(F.lit(_U32))
        word = (
            F.shiftleft(u.bitwiseAND(F.lit(0xFF)), 24)
            .bitwiseOR(F.shiftleft(F.shiftright(u, 8).bitwiseAND(F.lit(0xFF)), 16))
            .bitwiseOR(F.shiftleft(F.shiftright(u, 16).bitwiseAND(F.lit(0xFF)), 8))
            .bitwiseOR(F.shiftright(u, 24).bitwiseAND(F.lit(0xFF)))
        )
        k = _mul32(word)
        k = _mul32(k.bitwiseXOR(F.shiftright(k, 24)))
        h = _mul32(h).bitwiseXOR(k)
    h = _mul32(h.bitwiseXOR(F.shiftright(h, 13)))
    return h.bitwiseXOR(F.shiftright(h, 15))


# -- executor-side functions -------------------------------------------------------------------
def _encode(df: DataFrame, plan: ColumnPlan, manifest: StoreManifest) -> tuple[DataFrame, bool]:
    """Project ``__p`` (store partition), ``__k``, ``__v``, ``__seq`` (duplicate keys: the
    highest wins). ``raw``: ``__k``/``__v`` still hold the key and value columns, which the
    write tasks serialize; else they hold RocksDB keys and value bytes (``_encode_fn``)."""
    seq = (
        F.col("offset")
        if set(KAFKA_COLUMNS) <= set(df.columns)
        else F.monotonically_increasing_id()
    ).cast("long")
    value = _value_column(df, plan, manifest.name)
    p = _jvm_partition(df, plan, manifest)
    if p is not None:
        cols = [p.alias("__p"), F.col(plan.key_columns[0]).alias("__k"), value.alias("__v")]
        return df.select(*cols, seq.alias("__seq")), True
    cols = [F.col(k).alias(f"__key{i}") for i, k in enumerate(plan.key_columns)]
    cols.append(value.alias("__value"))
    if plan.window_column:
        cols.append(F.expr(f"unix_millis(`{plan.window_column}`.start)").alias("__wstart"))
    if plan.partition_column:
        cols.append(F.col(plan.partition_column).cast("int").alias("__pin"))
    cols.append(seq.alias("__seq"))
    fn = _encode_fn(manifest, plan)
    return df.select(*cols).mapInArrow(fn, _ENCODED_SCHEMA), False


def _value_column(df: DataFrame, plan: ColumnPlan, store: str) -> Column:
    """The value as the write needs it: JSON text made by Spark's ``to_json`` (a record
    of the other columns, or one column wrapped in an array — ``to_json`` needs a
    struct/array/map; the brackets are cut off later), else the column itself; timestamps
    to the microsecond (``to_json.JSON_OPTIONS``, as the data source writes them). The JSON
    stays a Spark string: Arrow hands its UTF-8 bytes over as they are, where Spark's
    ``encode()`` would decode and re-encode every value."""
    if plan.value_column is None:
        value = F.to_json(F.struct(*[F.col(c) for c in plan.record_columns]), JSON_OPTIONS)
    elif plan.value_serde == "json":
        vc = F.col(plan.value_column)
        value = F.when(vc.isNull(), None).otherwise(F.to_json(F.array(vc), JSON_OPTIONS))
    else:
        return F.col(plan.value_column)
    return _refuse_non_finite(df, plan, store, value)


def _refuse_non_finite(df: DataFrame, plan: ColumnPlan, store: str, value: Column) -> Column:
    """``value``, or Spark's ``raise_error`` (which fails the job) where a JSON-encoded
    column holds NaN or an infinity (``schema.spark_non_finite``). Evaluated in the JVM
    with the rest of the projection, so the check costs no pass over the input of its
    own; ``_refusal`` turns the failure back into the ``ValueError`` it stands for."""
    guarded = None
    for name in plan.float_json_columns:
        bad = spark_non_finite(F.col(name), df.schema[name].dataType)
        error = F.raise_error(F.lit(non_finite_message(store, name)))
        guarded = F.when(bad, error) if guarded is None else guarded.when(bad, error)
    return value if guarded is None else guarded.otherwise(value)


def _refusal(exc: Exception, plan: ColumnPlan, store: str) -> ValueError | None:
    """The ``ValueError`` a job failed by ``_refuse_non_finite`` stands for, else None."""
    # A raise_error that fails a task reaches the driver as a SparkRuntimeException whose
    # condition is USER_RAISED_EXCEPTION, the raised text in its errorMessage parameter.
    condition = getattr(exc, "getCondition", None)
    if condition is None or condition() != "USER_RAISED_EXCEPTION":
        return None
    message = (exc.getMessageParameters() or {}).get("errorMessage")  # type: ignore[attr-defined]
    if message in {non_finite_message(store, c) for c in plan.float_json_columns}:
        return ValueError(message)
    return None


def _values_fn(plan: ColumnPlan, serde: Serde, store: str) -> Callable[[pa.Array], pa.Array]:
    """Value bytes (``binary``, null = delete) of a ``_value_column`` Arrow column."""
    if plan.value_serde == "json":
        if plan.value_column is None:
            return lambda values: values.cast(pa.binary())  # UTF-8 text: no copy
        return lambda values: pc.binary_slice(values.cast(pa.binary()), 1, -1)  # "[v]" -> "v"
    name = plan.value_column
    assert name is not None  # only JSON values are records
    return lambda values: serialize_column(serde, values, store, "value", name)


def _encode_fn(
    manifest: StoreManifest, plan: ColumnPlan
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function that serializes and routes each Arrow batch in Python
    (``store.encoding.arrow_encode``): ``(__p, __k, __v, __seq)`` batches, ``__k`` the
    RocksDB key."""
    key_serde = get_serde(manifest.key_serde)
    partitioner = get_partitioner(manifest.partitioner)
    n = manifest.partitions
    key_names = [f"__key{i}" for i in range(len(plan.key_columns))]
    store = manifest.name
    values_bytes = _values_fn(plan, get_serde(manifest.value_serde), store)

    def encode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        keep_spark_archive_indexes()
        for batch in batches:
            keys = [batch.column(name) for name in key_names]
            kb = serialize_keys(key_serde, keys, plan.key_columns, store)
            if plan.partition_column is not None:
                p = batch.column("__pin").cast(pa.int32())
            else:
                p = route(partitioner, kb, n)
            starts = batch.column("__wstart").to_pylist() if plan.window_column else None
            v = values_bytes(batch.column("__value"))
            yield encoded_batch(p, kb, v, batch.column("__seq"), starts)

    return encode


_Finished = tuple[pa.Array, pa.Array, pa.Array, pa.Array]


def _finish_fn(
    manifest: StoreManifest, plan: ColumnPlan, *, raw: bool
) -> Callable[[pa.RecordBatch], _Finished]:
    """What a write task does to each batch it receives: ``(partitions, RocksDB keys,
    value bytes, sequences)``. With ``raw`` input (JVM-routed: one key column, a
    key-value store) the key and value columns are serialized here
    (``store.encoding.arrow_encode``)."""
    if not raw:
        return lambda b: (b.column(0), b.column(1), b.column(2), b.column(3))
    store = manifest.name
    key_serde = get_serde(manifest.key_serde)
    values_bytes = _values_fn(plan, get_serde(manifest.value_serde), store)
    key_column = plan.key_columns[0]

    def finish(b: pa.RecordBatch) -> _Finished:
        kb = serialize_column(key_serde, b.column(1), store, "key", key_column)
        encoded = encoded_batch(b.column(0), kb, values_bytes(b.column(2)), b.column(3))
        p, k, v, seq = encoded.columns
        return p, k, v, seq

    return finish


def _stage_partitions_fn(
    spec: Any,
    position: Position | None,
    fail_marker: str | None,
    *,
    finish: Callable[[pa.RecordBatch], _Finished],
    spill_bytes: int = _SPILL_BYTES,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of the write: buffer, sort and stage every store
    partition the task receives; return one row per staged partition. Rows with a null
    key (JVM-routed input is not checked beforehand) are counted, not written: a task
    that saw any stages nothing and reports the count, and the driver refuses the job."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        keep_spark_archive_indexes()
        ctx = TaskContext.get()
        spark_partition = ctx.partitionId() if ctx else 0
        attempt = f"{spark_partition}-{ctx.attemptNumber() if ctx else 0}-{uuid.uuid4().hex[:8]}"
        # One buffer for every store partition the task holds: it groups each batch by
        # partition as it arrives and sorts each partition once, at the end.
        buffer = SortedRows(spill_bytes=spill_bytes, spill_dir=spill_dir())
        parts = buffer.partitions()
        staged = []
        null_keys = 0
        try:
            for batch in batches:
                keys = batch.column(1)
                if keys.null_count:
                    null_keys += keys.null_count
                    batch = batch.filter(pc.is_valid(keys))
                if batch.num_rows and not null_keys:
                    ps, k, v, seq = finish(batch)
                    buffer.add(k, v, seq, partitions=ps)
            for p, rows in parts if not null_keys else ():
                s = spec.stage(
                    p,
                    rows,
                    attempt=attempt,
                    position=position,
                    sorted_unique=True,
                    work=spill_dir(),
                )
                staged.append(s)
                if fail_marker is not None and consume_marker(fail_marker):
                    raise RuntimeError(f"injected task failure after staging partition {p}")
        finally:
            parts.close()  # releases the run files' memory maps
            buffer.close()
        out = [
            (s.partition, s.to_text(), s.attempt, s.puts, s.deletes, spark_partition, 0)
            for s in staged
        ]
        if null_keys:
            out.append((-1, "", attempt, 0, 0, spark_partition, null_keys))
        yield pa.RecordBatch.from_pylist(
            [dict(zip(_STAGED_FIELDS.names, r, strict=True)) for r in out],
            schema=_STAGED_FIELDS,
        )

    return write
