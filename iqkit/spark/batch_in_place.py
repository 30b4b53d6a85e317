"""``write_store`` without a shuffle: each Spark task writes its own rows where they are,
as the data source's tasks do (``write_tasks``: encoded, sorted, one fragment per store
partition, SST and columnar twin), and the driver chains the fragments into one new
version (``write_commit``). One task and commit path for both Spark writers.

Why: routing rows to their store partitions costs a shuffle, and on a DataFrame of few
Spark partitions (a notebook's, a small cluster's) that shuffle costs more than the few
extra chain files it saves: measured on 2M rows in 2 Spark partitions (local[2]), the
shuffle alone took about 1.2 s of a write that ``df.write.parquet`` does in 1.3-1.6 s.
Each store partition gets at most one fragment per Spark partition, and the chain is
compacted when it grows long (``COMPACT_AFTER_DELTAS``), so ``write_store`` writes in place
only when the DataFrame has at most ``IN_PLACE_MAX_PARTITIONS`` partitions; more, and the
shuffle bounds the files to one per store partition (``batch.py``).

Same store either way (tests/spark/test_write_store_in_place.py): the same serdes, key
bytes, JSON records, partitions and duplicate-key rule (the later row wins: input order
within a Spark partition, the higher Spark partition across them, which is
``monotonically_increasing_id``'s order). Kafka-shaped input, where the highest offset
must win, and ``mark_as_partitioned`` input, whose co-partitioning ``write_store``
checks, keep the shuffle path.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from ..query.position import Position
from ..store.roots import StoreRoot
from .progress import WriteProgress
from .schema import KAFKA_COLUMNS, ColumnPlan
from .write_commit import commit_job, remove_job_fragments
from .write_options import WriteJob, plan_job
from .write_tasks import write_task

__all__ = ["IN_PLACE_MAX_PARTITIONS", "planned_partitions", "writes_in_place", "write_in_place"]

#: The most Spark partitions a DataFrame may have for ``write_store`` to write it in
#: place (module docstring): each is up to one more chain file per store partition.
IN_PLACE_MAX_PARTITIONS = 4
_MESSAGE_SCHEMA = pa.schema([("message", pa.binary()), ("refused", pa.string())])
_MESSAGE_DDL = "message binary, refused string"


def writes_in_place(df: DataFrame, plan: ColumnPlan) -> bool:
    """Whether ``write_store`` writes ``df`` in place (module docstring)."""
    if plan.partition_column is not None or set(KAFKA_COLUMNS) <= set(df.columns):
        return False
    partitions = planned_partitions(df)
    return partitions is not None and partitions <= IN_PLACE_MAX_PARTITIONS


def planned_partitions(df: DataFrame) -> int | None:
    """How many partitions the write's tasks would read, if planning alone tells; ``None``
    when it does not. Quirk: under adaptive query execution (on by default) a plan with a
    shuffle is an ``AdaptiveSparkPlan``, whose partitions are only known once its
    upstream stages ran: ``df.rdd.getNumPartitions()`` would run them (a whole Spark job)
    just to answer, and the write would run them again. Such a DataFrame (a
    ``groupBy`` result, say) takes the shuffle path without asking; so does one without
    a JVM plan to look at (Spark Connect)."""
    try:
        root = df._jdf.queryExecution().executedPlan()  # classic PySpark only
        if root.nodeName() == "AdaptiveSparkPlan":
            return None
    except AttributeError:
        return None
    return int(df.rdd.getNumPartitions())  # no job runs for a plan without AQE stages


def write_in_place(
    df: DataFrame,
    where: StoreRoot,
    store: str,
    plan: ColumnPlan,
    *,
    partitions: int,
    mode: str,
    retention: int | None,
    metadata: dict[str, Any] | None,
    source_end: Position | None,
    progress: bool,
    fail_marker: str | None,
    arrow_batches: Callable[[], Any],
) -> int:
    """Write ``df`` in place (module docstring); the published version. ``arrow_batches``:
    the context ``write_store`` runs its Spark job in (Spark's Arrow batch size)."""
    options = {
        "key": ",".join(plan.key_columns),
        "partitions": str(partitions),
        "key_serde": plan.key_serde,
        "value_serde": plan.value_serde,
        **({"value": plan.value_column} if plan.value_column else {}),
        **({"window": plan.window_column} if plan.window_column else {}),
        **({"retention": str(retention)} if retention else {}),
        **({"_fail_task_once": fail_marker} if fail_marker else {}),
    }
    job = plan_job(
        options, where, store, df.schema, mode == "overwrite", written_by="iqkit.spark.write_store"
    )
    sc = df.sparkSession.sparkContext
    with WriteProgress(sc, store, enabled=progress) as bar:
        try:
            with arrow_batches():
                rows = df.mapInArrow(_task_fn(job), _MESSAGE_DDL).collect()
        except Exception:
            # A task failed in Spark (its input, or its process): what the other tasks
            # uploaded is not known here; no version lists it, and retention removes it.
            remove_job_fragments(job, [])  # a never-created store's empty folders
            raise
        messages = [pickle.loads(r["message"]) for r in rows if r["message"] is not None]
        refused = [r["refused"] for r in rows if r["refused"] is not None]
        if refused:  # bad input: nothing is published, nothing written is left
            remove_job_fragments(job, messages)
            raise ValueError(refused[0])
        version = commit_job(
            job,
            messages,
            metadata={**(metadata or {}), "spark_app_id": sc.applicationId},
            source_end=source_end,
        )
        written = sum(f.puts for m in messages for f in m.fragments)
        parts = len({f.partition for m in messages for f in m.fragments})
        records = job.uploads.manifest.kind.records_in(written)
        bar.finish(partitions=parts, rows=records, version=version)
    return version


def _task_fn(job: WriteJob) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: the data source's task, its message sent back
    pickled (a commit message is a small dataclass of names and counts). Input the
    encoding refuses (a null key, NaN in a JSON value, a value its serde cannot hold:
    ``ValueError``/``TypeError``, whose text names the store and column) is sent back as
    the refusal, not raised: no retry could help, and the driver then knows every
    fragment the other tasks wrote, so it removes them all (``write_task`` already
    removed the refusing task's own)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        try:
            message: bytes | None = pickle.dumps(write_task(job, batches))
            refused = None
        except (ValueError, TypeError) as exc:
            message, refused = None, str(exc)
        yield pa.RecordBatch.from_arrays(
            [pa.array([message], pa.binary()), pa.array([refused], pa.string())],
            schema=_MESSAGE_SCHEMA,
        )

    return run
