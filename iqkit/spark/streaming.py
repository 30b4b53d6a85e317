"""Structured Streaming into iqkit stores: a ``foreachBatch`` sink, exactly once.

``store_sink(root, store, key=..., partitions=...)`` returns a function for
``writeStream.foreachBatch``. Each micro-batch is one job commit (see ``batch.py``) whose
version record remembers the batch id under the sink's name and the streaming query's id
(``iqkit.store.sinks``); a replayed batch id of the same query (Spark re-runs the last
batch after a crash and restart from its checkpoint) is recognised and changes nothing,
while another query's batches (a new checkpoint) are never mistaken for replays.
With Kafka's source schema the written partitions' positions advance to the batch's
highest offsets, and the source's end offsets are recorded with every commit so
``engine.lags()`` works without the user passing end offsets.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQueryListener

from ..query.position import Position
from ..store.format import StoreFormat
from ..store.formats import format_for
from ..store.roots import StoreRoot
from ..store.sinks import UNIDENTIFIED, last_batch, latest_batch
from ..store.writer import StoreWriter, store_format_of
from .batch import write_store
from .roots import driver_store_root
from .worker_python import require_workers_can_import_iqkit

EndOffsets = Callable[[], Position | None]

#: The local property Spark sets, on the thread running a streaming query's batches, to
#: the query's id (kept in its checkpoint, so the same across restarts)...
_QUERY_ID_PROPERTY = "sql.streaming.queryId"
#: ... and to the id of the batch being run.
_BATCH_ID_PROPERTY = "streaming.sql.batchId"


def last_committed_batch(
    root: str | os.PathLike[str] | StoreRoot | StoreFormat,
    store: str,
    sink: str,
    query_id: str | None = None,
) -> int | None:
    """The highest batch id ``sink`` committed to ``store`` for streaming query
    ``query_id`` (Spark's ``StreamingQuery.id``); without ``query_id``, that of the query
    that committed through ``sink`` last. None: never."""
    latest = store_format_of(root).latest_published(store)
    if latest is None:
        return None
    metadata = latest.metadata
    if query_id is not None:
        return last_batch(metadata, sink, str(query_id))
    entry = latest_batch(metadata, sink)
    return entry.batch if entry is not None else None


def _streaming_query_id(batch_df: DataFrame, batch_id: int) -> str:
    """The id of the streaming query whose batch ``batch_id`` this is, or ``UNIDENTIFIED``
    when the function was not called by a streaming query for that batch (a direct call).

    Spark sets the query id as a local property of the thread that runs the query's
    batches; PySpark's pinned-thread mode (the default) makes the ``foreachBatch``
    callback's calls into the JVM run on that thread, so each of several concurrent
    queries reads its own id. The batch id property must match ``batch_id`` too, so a
    call that is not Spark's own call for this batch is never attributed to a query.
    """
    sc = batch_df.sparkSession.sparkContext
    query = sc.getLocalProperty(_QUERY_ID_PROPERTY)
    if query and sc.getLocalProperty(_BATCH_ID_PROPERTY) == str(batch_id):
        return query
    return UNIDENTIFIED


def store_sink(
    root: str | os.PathLike[str],
    store: str,
    *,
    key: str | Sequence[str],
    partitions: int,
    value: str | None = None,
    key_serde: str | None = None,
    value_serde: str | None = None,
    window: str | None = None,
    mark_as_partitioned: str | None = None,
    sink_name: str | None = None,
    end_offsets: EndOffsets | None = None,
) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function writing each micro-batch to ``store`` exactly once.

    ``end_offsets``: returns the source's log-end offsets (a ``Position``), recorded with
    each commit for lag — e.g. ``LocalKafkaTopic.end_position`` or
    ``SourceEndOffsetsListener.end_position``. ``sink_name`` names the sink in the
    store's version records (default: the store name). Batch ids are remembered per sink
    name and per streaming query (Spark's query id, kept in the checkpoint): a batch id
    at or below the last one the same query committed is a replay and changes nothing; a
    new query (a new checkpoint) starts afresh. Called directly rather than by a
    streaming query, the function remembers the caller's batch ids under the sink name.
    """
    name = sink_name or store
    where = driver_store_root(root)  # the root meant when the sink was made, whatever cwd later
    fmt = format_for(where)
    active = SparkSession.getActiveSession()
    if active is not None:  # fail before the stream starts, not at its first batch
        require_workers_can_import_iqkit(active)

    def sink(batch_df: DataFrame, batch_id: int) -> None:
        require_workers_can_import_iqkit(batch_df.sparkSession)
        query = _streaming_query_id(batch_df, batch_id)
        done = last_committed_batch(fmt, store, name, query)
        if done is not None and batch_id <= done:
            return  # this query's replay of a committed batch: exactly once, nothing to do
        end = end_offsets() if end_offsets is not None else None
        progress = {
            "sinks": {name: {query: batch_id}},
            "spark_batch_id": batch_id,
            "spark_query_id": None if query == UNIDENTIFIED else query,
        }
        if batch_df.isEmpty():
            _record_empty_batch(fmt, store, name, progress, end)
            return
        write_store(
            batch_df,
            where,
            store,
            key=key,
            value=value,
            partitions=partitions,
            key_serde=key_serde,
            value_serde=value_serde,
            window=window,
            mark_as_partitioned=mark_as_partitioned,
            metadata=progress,
            source_end=end,
            progress=False,  # one bar per micro-batch would flood the output
        )

    return sink


def _record_empty_batch(
    fmt: StoreFormat,
    store: str,
    sink: str,
    progress: dict[str, Any],
    end: Position | None,
) -> None:
    """An empty micro-batch changes no data; record its id (and the source's end offsets,
    for lag) once the store exists, so a replay is still recognised."""
    if not fmt.store_exists(store):
        return
    with StoreWriter(fmt, store, who=f"sink:{sink}") as writer:
        writer.set_metadata(**progress)
        if end is not None:
            writer.record_source_end(end)


class SourceEndOffsetsListener(StreamingQueryListener):
    """Records each trigger's ``latestOffset`` of Kafka-style sources (Spark's own
    progress report), so a sink can record end offsets for lag without asking Kafka.

    Kafka reports offsets as ``{"topic": {"0": 42}}``: the next offset to read, i.e. the
    log-end offset at that trigger — Kafka's convention for lag.
    """

    def __init__(self) -> None:
        self._latest: Position | None = None

    def onQueryStarted(self, event: Any) -> None:
        """Nothing to record until progress arrives."""

    def onQueryProgress(self, event: Any) -> None:
        for source in event.progress.sources:
            position = _parse_kafka_offsets(source.latestOffset)
            if position is not None:
                self._latest = position.merge(self._latest)

    def onQueryIdle(self, event: Any) -> None:
        """Idle triggers carry no new offsets."""

    def onQueryTerminated(self, event: Any) -> None:
        """Keep the last offsets seen."""

    def end_position(self) -> Position | None:
        return self._latest


def _parse_kafka_offsets(text: str | None) -> Position | None:
    if not text:
        return None
    try:
        data = json.loads(text)
        return Position.from_map(
            {t: {int(p): int(o) for p, o in ps.items()} for t, ps in data.items()}
        )
    except (ValueError, TypeError, AttributeError):
        return None  # not a Kafka-style offset (e.g. a file source's log offset)
