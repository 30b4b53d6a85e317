"""``write_store``: a Spark DataFrame into an iqkit store, in one call.

The job, end to end:

1. Driver checks (cheap, before any data is written): columns and types against the
   serdes (``schema.plan_columns``), the store's settings, no null keys, a valid
   ``mark_as_partitioned`` column, one window size.
2. Encode (``mapInArrow``, per Arrow batch): serialize keys and values with the store's
   serdes, route each row to its store partition (Kafka's murmur2 of the serialized key,
   or the named column), emit (partition, RocksDB key, value, sequence).
3. One shuffle (``repartition`` by store partition; none with ``mark_as_partitioned``),
   then ``sortWithinPartitions`` by (partition, key, sequence): every store partition's
   rows arrive in one task, in key order, later rows of a key after earlier ones.
4. Write (``mapInArrow``): each task attempt stages its store partitions
   (``store.jobs.stage_partition``; fresh partitions are bulk-loaded from an SST file) and
   returns what it staged. Nothing is visible yet.
5. Driver: once the job succeeded, publish exactly one staged folder per partition as
   the store's next version (``JobCommit.publish``). A failed job publishes nothing; a
   retried or speculative attempt's folder is never published and is removed.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from itertools import groupby
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..query.position import Position
from ..store import keyspace
from ..store.jobs import JobCommit, JobSpec, StagedPartition, stage_partition
from ..store.layout import StoreLayout
from ..store.manifest import StoreManifest
from ..store.partitioners import get_partitioner
from ..store.serdes import get_serde
from ..store.writer import create_store
from .progress import WriteProgress
from .schema import KAFKA_COLUMNS, ColumnPlan, plan_columns

_ENCODED_SCHEMA = "__p int, __k binary, __v binary, __seq long"
_STAGED_SCHEMA = (
    "partition int, path string, attempt string, puts long, deletes long, spark_partition int"
)


def write_store(
    df: DataFrame,
    root: str | os.PathLike[str],
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
    ``root`` must be a path every executor can see (a shared or local filesystem).
    ``progress``: show a progress bar (tasks, then partitions and rows written).
    ``_fail_task_once``: tests only — a marker file whose presence makes one task attempt
    fail after staging its first partition (the marker is consumed).
    """
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
    manifest = _ensure_store(root, store, plan, partitions, window_size, retention)
    _check_no_null_keys(df, plan, store)
    if plan.partition_column is not None:
        _check_partition_column(df, plan.partition_column, partitions, store)
    position = _kafka_position(df)

    encoded = _encode(df, plan, manifest)
    if plan.partition_column is None:
        encoded = encoded.repartition(min(partitions, _parallelism(df)), "__p")
    ordered = encoded.sortWithinPartitions("__p", "__k", "__seq")
    sc = df.sparkSession.sparkContext
    with (
        WriteProgress(sc, store, enabled=progress) as bar,
        JobCommit(root, store, mode=mode, who=f"spark:{sc.appName}") as job,
    ):
        writer = _stage_partitions_fn(job.spec, position, _fail_task_once)
        rows = ordered.mapInArrow(writer, _STAGED_SCHEMA).collect()
        staged = _one_per_partition(rows, plan, store)
        # Partitions no row reached: an overwrite empties them; and in a murmur2 store,
        # whose every partition reads every input partition, they applied this input too,
        # so their positions advance (else bounds and lag would count records that could
        # never reach them).
        advance = position is not None and plan.partition_column is None
        if mode == "overwrite" or advance:
            for p in sorted(set(range(partitions)) - {s.partition for s in staged}):
                staged.append(stage_partition(job.spec, p, [], attempt="driver", position=position))
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


# -- driver-side checks ------------------------------------------------------------------------
def _ensure_store(
    root: str | os.PathLike[str],
    store: str,
    plan: ColumnPlan,
    partitions: int,
    window_size: int | None,
    retention: int | None,
) -> StoreManifest:
    layout = StoreLayout.of(root, store)
    if layout.manifest.exists():
        manifest = StoreManifest.read(layout)
        wanted = {
            "partitions": partitions,
            "kind": "window" if window_size else "kv",
            "key_serde": plan.key_serde,
            "value_serde": plan.value_serde,
            "partitioner": "explicit" if plan.partition_column else manifest.partitioner,
        }
        diffs = [
            f"{k}={getattr(manifest, k)!r} (the DataFrame needs {v!r})"
            for k, v in wanted.items()
            if getattr(manifest, k) != v
        ]
        if window_size and manifest.window_size_ms != window_size:
            diffs.append(
                f"window_size_ms={manifest.window_size_ms} (the DataFrame has {window_size})"
            )
        if diffs:
            raise ValueError(f"store {store!r} exists with other settings: {', '.join(diffs)}")
        return manifest
    return create_store(
        root,
        store,
        partitions=partitions,
        kind="window" if window_size else "kv",
        key_serde=plan.key_serde,
        value_serde=plan.value_serde,
        partitioner="explicit" if plan.partition_column else "murmur2",
        window_size_ms=window_size,
        **({"retention": retention} if retention else {}),
        properties={
            "key_columns": list(plan.key_columns),
            "value_column": plan.value_column,
            "record_columns": list(plan.record_columns),
            "written_by": "iqkit.spark.write_store",
        },
    )


def _check_no_null_keys(df: DataFrame, plan: ColumnPlan, store: str) -> None:
    for column in plan.key_columns:
        if df.where(F.col(column).isNull()).limit(1).count():
            raise ValueError(f"store {store!r}: key column {column!r} holds null keys")


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
    if lo is None:
        raise ValueError(f"store {store!r}: the DataFrame is empty, its window size is unknown")
    if lo != hi or lo <= 0:
        raise ValueError(
            f"store {store!r}: window column {w!r} must hold windows of one size, "
            f"found sizes from {lo} to {hi} ms"
        )
    return int(lo)


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


def _one_per_partition(rows: list[Any], plan: ColumnPlan, store: str) -> list[StagedPartition]:
    staged: dict[int, StagedPartition] = {}
    for r in rows:
        if r["partition"] in staged:
            raise ValueError(
                f"store {store!r}: store partition {r['partition']} arrived in more than one "
                f"Spark partition, so the input is not partitioned by "
                f"{plan.partition_column!r}; drop mark_as_partitioned to let iqkit shuffle"
            )
        staged[r["partition"]] = StagedPartition(
            partition=r["partition"],
            path=r["path"],
            attempt=r["attempt"],
            puts=r["puts"],
            deletes=r["deletes"],
        )
    return list(staged.values())


# -- executor-side functions -------------------------------------------------------------------
def _encode(df: DataFrame, plan: ColumnPlan, manifest: StoreManifest) -> DataFrame:
    """Project the columns the encoder needs, then serialize and route in Arrow batches."""
    cols = [F.col(k).alias(f"__key{i}") for i, k in enumerate(plan.key_columns)]
    if plan.value_column is None:
        record = F.struct(*[F.col(c) for c in plan.record_columns])
        cols.append(F.encode(F.to_json(record), "UTF-8").alias("__value"))
    elif plan.value_serde == "json":
        vc = F.col(plan.value_column)
        cols.append(
            F.when(vc.isNull(), None)
            .otherwise(F.encode(F.to_json(F.array(vc)), "UTF-8"))
            .alias("__value")
        )
    else:
        cols.append(F.col(plan.value_column).alias("__value"))
    if plan.window_column:
        cols.append(F.expr(f"unix_millis(`{plan.window_column}`.start)").alias("__wstart"))
    if plan.partition_column:
        cols.append(F.col(plan.partition_column).cast("int").alias("__pin"))
    seq = (
        F.col("offset")
        if set(KAFKA_COLUMNS) <= set(df.columns)
        else F.monotonically_increasing_id()
    )
    cols.append(seq.cast("long").alias("__seq"))
    fn = _encode_fn(manifest, plan)
    return df.select(*cols).mapInArrow(fn, _ENCODED_SCHEMA)


def _encode_fn(
    manifest: StoreManifest, plan: ColumnPlan
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    key_serde = get_serde(manifest.key_serde)
    value_serde = get_serde(manifest.value_serde)
    partitioner = get_partitioner(manifest.partitioner)
    n = manifest.partitions
    n_keys = len(plan.key_columns)
    window = plan.window_column is not None
    explicit = plan.partition_column is not None
    value_is_json_bytes = plan.value_serde == "json"
    single_json_value = plan.value_column is not None and value_is_json_bytes
    store = manifest.name

    def encode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            data = batch.to_pydict()
            keys = [data[f"__key{i}"] for i in range(n_keys)]
            key_values = keys[0] if n_keys == 1 else [tuple(t) for t in zip(*keys, strict=True)]
            values = data["__value"]
            out_p: list[int] = []
            out_k: list[bytes] = []
            out_v: list[bytes | None] = []
            out_s: list[int] = []
            starts = data.get("__wstart")
            pins = data.get("__pin")
            for i, k in enumerate(key_values):
                try:
                    kb = key_serde.serialize(k)
                except (TypeError, ValueError) as exc:
                    raise type(exc)(f"store {store!r}: key {exc}") from None
                v = values[i]
                if v is None:
                    vb = None
                elif value_is_json_bytes:
                    # Spark's to_json made the record; a single json column was wrapped
                    # in an array (to_json needs a struct/array/map): unwrap it.
                    vb = v[1:-1] if single_json_value else v
                else:
                    try:
                        vb = value_serde.serialize(v)
                    except (TypeError, ValueError) as exc:
                        raise type(exc)(f"store {store!r}: value {exc}") from None
                p = pins[i] if explicit else partitioner.partition(kb, n)
                seq = data["__seq"][i]
                if window:
                    start = starts[i]
                    out_p += (p, p)
                    out_k += (keyspace.window_key(kb, start), keyspace.window_time_key(kb, start))
                    out_v += (vb, None if vb is None else b"")
                    out_s += (seq, seq)
                else:
                    out_p.append(p)
                    out_k.append(keyspace.kv_key(kb))
                    out_v.append(vb)
                    out_s.append(seq)
            yield pa.RecordBatch.from_pydict(
                {"__p": out_p, "__k": out_k, "__v": out_v, "__seq": out_s},
                schema=pa.schema(
                    [
                        ("__p", pa.int32()),
                        ("__k", pa.binary()),
                        ("__v", pa.binary()),
                        ("__seq", pa.int64()),
                    ]
                ),
            )

    return encode


def _stage_partitions_fn(
    spec: JobSpec, position: Position | None, fail_marker: str | None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        spark_partition = ctx.partitionId() if ctx else 0
        attempt = f"{spark_partition}-{ctx.attemptNumber() if ctx else 0}-{uuid.uuid4().hex[:8]}"
        staged = []
        for p, group in groupby(_rows(batches), key=lambda row: row[0]):
            s = stage_partition(
                spec,
                p,
                _last_per_key(group),
                attempt=attempt,
                position=position,
                sorted_unique=True,
            )
            staged.append(s)
            if fail_marker is not None and _consume(fail_marker):
                raise RuntimeError(f"injected task failure after staging partition {p}")
        yield pa.RecordBatch.from_pydict(
            {
                "partition": [s.partition for s in staged],
                "path": [s.path for s in staged],
                "attempt": [s.attempt for s in staged],
                "puts": [s.puts for s in staged],
                "deletes": [s.deletes for s in staged],
                "spark_partition": [spark_partition] * len(staged),
            },
            schema=pa.schema(
                [
                    ("partition", pa.int32()),
                    ("path", pa.string()),
                    ("attempt", pa.string()),
                    ("puts", pa.int64()),
                    ("deletes", pa.int64()),
                    ("spark_partition", pa.int32()),
                ]
            ),
        )

    return write


def _rows(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, bytes, bytes | None]]:
    for batch in batches:
        cols = batch.to_pydict()
        yield from zip(cols["__p"], cols["__k"], cols["__v"], strict=True)


def _last_per_key(
    rows: Iterator[tuple[int, bytes, bytes | None]],
) -> Iterator[tuple[bytes, bytes | None]]:
    """Rows sorted by (key, sequence): keep the last row of each key (later wins)."""
    previous: tuple[int, bytes, bytes | None] | None = None
    for row in rows:
        if previous is not None and previous[1] != row[1]:
            yield previous[1], previous[2]
        previous = row
    if previous is not None:
        yield previous[1], previous[2]


def _consume(marker: str) -> bool:
    try:
        os.remove(marker)
    except FileNotFoundError:
        return False
    return True
