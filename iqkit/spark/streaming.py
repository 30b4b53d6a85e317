"""Structured Streaming into iqkit stores: a ``foreachBatch`` sink, exactly once.

``store_sink(root, store, key=..., partitions=...)`` returns a function for
``writeStream.foreachBatch``. Each micro-batch is one job commit (see ``batch.py``) whose
version record remembers the sink's batch id; a replayed batch id (Spark re-runs the last
batch after a crash and restart from its checkpoint) is recognised and changes nothing.
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
from ..store.layout import StoreLayout
from ..store.versions import read_latest_number, read_version
from ..store.writer import StoreWriter
from .batch import write_store
from .roots import driver_root
from .worker_python import require_workers_can_import_iqkit

EndOffsets = Callable[[], Position | None]


def last_committed_batch(root: str | os.PathLike[str], store: str, sink: str) -> int | None:
    """The highest batch id ``sink`` committed to ``store`` (None: never)."""
    layout = StoreLayout.of(root, store)
    latest = read_latest_number(layout)
    if latest is None:
        return None
    sinks = read_version(layout, latest).metadata.get("sinks", {})
    value = sinks.get(sink)
    return int(value) if value is not None else None


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
    ``SourceEndOffsetsListener.end_position``. ``sink_name`` distinguishes several
    streaming queries writing one store (default: the store name).
    """
    name = sink_name or store
    root = driver_root(root)  # the folder meant when the sink was made, whatever cwd later
    active = SparkSession.getActiveSession()
    if active is not None:  # fail before the stream starts, not at its first batch
        require_workers_can_import_iqkit(active)

    def sink(batch_df: DataFrame, batch_id: int) -> None:
        require_workers_can_import_iqkit(batch_df.sparkSession)
        done = last_committed_batch(root, store, name)
        if done is not None and batch_id <= done:
            return  # a replay of a committed batch: exactly once means nothing to do
        end = end_offsets() if end_offsets is not None else None
        if batch_df.isEmpty():
            _record_empty_batch(root, store, name, batch_id, end)
            return
        write_store(
            batch_df,
            root,
            store,
            key=key,
            value=value,
            partitions=partitions,
            key_serde=key_serde,
            value_serde=value_serde,
            window=window,
            mark_as_partitioned=mark_as_partitioned,
            metadata={"sinks": {name: batch_id}, "spark_batch_id": batch_id},
            source_end=end,
            progress=False,  # one bar per micro-batch would flood the output
        )

    return sink


def _record_empty_batch(
    root: str | os.PathLike[str], store: str, sink: str, batch_id: int, end: Position | None
) -> None:
    """An empty micro-batch changes no data; record its id (and the source's end offsets,
    for lag) once the store exists, so a replay is still recognised."""
    if not StoreLayout.of(root, store).manifest.exists():
        return
    with StoreWriter(root, store, who=f"sink:{sink}") as writer:
        writer.set_metadata(sinks={sink: batch_id}, spark_batch_id=batch_id)
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
