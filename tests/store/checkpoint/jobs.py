"""Real Structured Streaming queries on the tests' local Spark session, leaving real
checkpoints for the checkpoint readers' tests (not a test file itself).

``run_stream`` feeds each batch of records to a query as one new JSON file of a file
source and runs the query once per batch with ``trigger(availableNow=True)``, on the same
checkpoint, so every batch is exactly one micro-batch (state version N is the state after
batch N - 1). No-data batches are turned off, so a watermark's evictions happen in the next
batch that has data, not in a batch of their own.

Records are dicts with ``id`` (long), ``user`` (string), ``amount`` (long) and ``ts`` (a
timestamp as ISO text, e.g. ``"2024-01-01T00:00:05Z"``); a kind reads the fields it needs.

``state_rows`` is the oracle: Spark's own state reader (``format("statestore")``), its rows
turned into the Python values iqkit's decoder gives, partition by partition.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC
from pathlib import Path
from typing import Any

# The frozen checkpoints' generator (tests/data/checkpoints/spark_jobs.py) runs in PySpark
# venvs of its own, so it cannot import from here: the applyInPandasWithState function
# (running total and count; a negative amount removes the state) lives there, for both.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "data" / "checkpoints"))
from spark_jobs import running_total_fn

INPUT_SCHEMA = "id long, user string, amount long, ts timestamp"
KINDS = ("agg", "window", "dedup", "dedup-watermark", "flatmap")
PROVIDERS = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "rocksdb-changelog": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
}
WATERMARK_DELAY = "10 seconds"


@contextmanager
def session_conf(spark, settings: Mapping[str, str]) -> Iterator[None]:
    """``settings`` on the shared session for the block, then each key's earlier value
    back (or unset, where it had none): the session serves the whole test run."""
    before = {key: spark.conf.get(key, None) for key in settings}  # None: not set
    try:
        for key, value in settings.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def restart_state_store_maintenance(spark) -> None:
    """Quirk: Spark schedules its state store maintenance task once per executor (local
    mode: this JVM), with the interval and shutdown timeouts of the first query that
    needed it, and never reschedules it; an earlier test's query may have fixed the 60 s
    default. Stopping the task lets the next query start it again with the session's
    current settings."""
    spark._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stopMaintenanceTask()


def _query(kind: str, source):
    """(the DataFrame of ``kind``'s query over ``source``, its output mode)."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    if kind == "agg":
        return source.groupBy("user").agg(F.sum("amount"), F.count("*")), "update"
    if kind == "window":
        windowed = source.withWatermark("ts", WATERMARK_DELAY).groupBy(
            F.window("ts", "10 seconds"), "user"
        )
        return windowed.count(), "update"
    if kind == "dedup":
        return source.dropDuplicates(["id"]), "append"
    if kind == "dedup-watermark":
        return source.withWatermark("ts", WATERMARK_DELAY).dropDuplicates(["id", "ts"]), "append"
    if kind == "flatmap":
        grouped = source.groupBy("user").applyInPandasWithState(
            running_total_fn(),
            "user string, total long, count long",
            "total long, count long",
            "Update",
            GroupStateTimeout.NoTimeout,
        )
        return grouped, "update"
    raise ValueError(f"unknown kind {kind!r}; kinds: {', '.join(KINDS)}")


def run_stream(
    spark,
    kind: str,
    checkpoint: str | Path,
    batches: Sequence[Sequence[Mapping[str, Any]]],
    *,
    provider: str = "hdfs",
    partitions: int = 3,
    conf: Mapping[str, str] | None = None,
) -> Path:
    """Run ``kind``'s query (``KINDS``) over ``batches``, one micro-batch each, on
    ``checkpoint`` (continued if it has batches already), with state store ``provider``
    ("hdfs", "rocksdb" or "rocksdb-changelog") and ``partitions`` shuffle partitions;
    ``conf`` adds session settings for the run. Returns the checkpoint folder. The input
    files live in a folder beside it (``<checkpoint>-input``)."""
    if provider not in PROVIDERS:
        raise ValueError(f"unknown provider {provider!r}; providers: {', '.join(PROVIDERS)}")
    checkpoint = Path(checkpoint)
    inputs = checkpoint.parent / f"{checkpoint.name}-input"
    inputs.mkdir(parents=True, exist_ok=True)
    settings = {
        "spark.sql.streaming.stateStore.providerClass": PROVIDERS[provider],
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": str(
            provider == "rocksdb-changelog"
        ).lower(),
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        **(conf or {}),
    }
    with session_conf(spark, settings):
        for records in batches:
            number = len(list(inputs.glob("batch-*.json")))
            text = "".join(json.dumps(record) + "\n" for record in records)
            (inputs / f"batch-{number:05d}.json").write_text(text, encoding="utf-8")
            source = spark.readStream.schema(INPUT_SCHEMA).json(str(inputs))
            frame, mode = _query(kind, source)
            query = (
                frame.writeStream.format("noop")
                .outputMode(mode)
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
    return checkpoint


def python_value(value: Any, data_type) -> Any:
    """A value PySpark collected, as iqkit's decoder gives it: structs as dicts, binaries
    as bytes, timestamps as UTC datetimes (PySpark gives naive local ones), map keys that
    are structs or arrays as tuples."""
    from pyspark.sql import types as T

    if value is None:
        return None
    if isinstance(data_type, T.StructType):
        return {
            field.name: python_value(value[i], field.dataType)
            for i, field in enumerate(data_type.fields)
        }
    if isinstance(data_type, T.ArrayType):
        return [python_value(item, data_type.elementType) for item in value]
    if isinstance(data_type, T.MapType):
        return {
            _hashable(python_value(k, data_type.keyType)): python_value(v, data_type.valueType)
            for k, v in value.items()
        }
    if isinstance(data_type, T.BinaryType):
        return bytes(value)
    if isinstance(data_type, T.TimestampType):
        return value.astimezone(UTC)
    return value


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(_hashable(v) for v in value.values())
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def state_rows(
    spark, checkpoint: str | Path, batch_id: int, *, operator_id: int = 0
) -> dict[int, list[tuple[tuple, tuple]]]:
    """Spark's reading of the state after batch ``batch_id`` (state version
    ``batch_id + 1``): partition → its (key, value) rows, each a tuple of Python values
    (``python_value``), sorted by ``repr``. Partitions without rows are absent."""
    frame = (
        spark.read.format("statestore")
        .option("batchId", batch_id)
        .option("operatorId", operator_id)
        .load(str(checkpoint))
    )
    key_fields = frame.schema["key"].dataType.fields
    value_fields = frame.schema["value"].dataType.fields
    rows: dict[int, list[tuple[tuple, tuple]]] = defaultdict(list)
    for row in frame.collect():
        key = tuple(python_value(row.key[i], f.dataType) for i, f in enumerate(key_fields))
        value = tuple(python_value(row.value[i], f.dataType) for i, f in enumerate(value_fields))
        rows[row.partition_id].append((key, value))
    return {partition: sorted(found, key=repr) for partition, found in rows.items()}
