"""Streaming sinks' progress, carried in version records: the last micro-batch id each
streaming query committed through each sink, so that a replayed batch is recognised.

Progress is kept per sink name *and* per query, because Spark numbers a query's
micro-batches from 0 in its own checkpoint: the ids of two queries (a new checkpoint
writing to an existing store) say nothing about each other, and comparing them would
skip a new query's batches as if they were replays. In a version record's metadata::

    "sinks": {sink name: {query id: {"batch": last batch id, "version": v}}}

The query id is Spark's streaming query id, which the checkpoint keeps across restarts;
``version`` is the version that recorded the batch (so the query that committed last is
known). ``UNIDENTIFIED`` stands for a writer Spark did not identify (the sink function
called directly, with the caller's own batch ids). Records written before query ids were
kept hold ``{sink name: last batch id}``; they read as that unidentified writer's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The query key of a writer with no Spark streaming query id (and of old records).
UNIDENTIFIED = "unidentified"


@dataclass(frozen=True)
class SinkBatch:
    """The last batch one query committed through one sink."""

    query: str
    batch: int
    #: The version that recorded it (None: an old record, which did not say).
    version: int | None


def sink_progress(metadata: Mapping[str, Any], sink: str) -> dict[str, SinkBatch]:
    """Query id → its last committed batch, for ``sink``, from a version record's
    metadata (either shape)."""
    return _entries(metadata.get("sinks", {}).get(sink))


def last_batch(metadata: Mapping[str, Any], sink: str, query: str) -> int | None:
    """The highest batch id ``query`` committed through ``sink`` (None: never)."""
    entry = sink_progress(metadata, sink).get(query)
    return entry.batch if entry is not None else None


def latest_batch(metadata: Mapping[str, Any], sink: str) -> SinkBatch | None:
    """The last batch of whichever query committed through ``sink`` most recently."""
    entries = sink_progress(metadata, sink).values()
    return max(entries, key=lambda e: -1 if e.version is None else e.version, default=None)


def carry_forward(
    previous: Mapping[str, Any] | None, committed: Mapping[str, Any], version: int
) -> dict[str, dict[str, dict[str, int | None]]]:
    """The ``sinks`` value of a new version record: every sink's and query's progress
    from the ``previous`` record's metadata, updated with what this commit ``committed``
    (``{sink: {query: batch id}}``, or an old-style ``{sink: batch id}``) at ``version``."""
    merged: dict[str, dict[str, SinkBatch]] = {}
    for sink, value in (previous or {}).get("sinks", {}).items():
        merged[sink] = _entries(value)
    for sink, value in committed.items():
        for query, entry in _entries(value).items():
            merged.setdefault(sink, {})[query] = SinkBatch(query, entry.batch, version)
    return {
        sink: {q: {"batch": e.batch, "version": e.version} for q, e in entries.items()}
        for sink, entries in merged.items()
    }


def _entries(value: Any) -> dict[str, SinkBatch]:
    """One sink's progress in any of its shapes: an old record's bare batch id, a
    commit's ``{query: batch id}``, or a record's ``{query: {"batch", "version"}}``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        return {UNIDENTIFIED: SinkBatch(UNIDENTIFIED, int(value), None)}
    out = {}
    for query, entry in value.items():
        if isinstance(entry, Mapping):
            version = entry.get("version")
            out[query] = SinkBatch(
                query, int(entry["batch"]), int(version) if version is not None else None
            )
        else:
            out[query] = SinkBatch(query, int(entry), None)
    return out
