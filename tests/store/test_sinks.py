"""Streaming sinks' progress in version records (iqkit.store.sinks): per sink and query."""

from __future__ import annotations

from iqkit.store.sinks import (
    UNIDENTIFIED,
    SinkBatch,
    carry_forward,
    last_batch,
    latest_batch,
    sink_progress,
)


def test_progress_is_kept_per_query_and_carried_forward():
    v1 = {"sinks": carry_forward(None, {"s": {"query-a": 7}}, 1)}
    v2 = {"sinks": carry_forward(v1, {"s": {"query-b": 0}}, 2)}
    assert last_batch(v2, "s", "query-a") == 7
    assert last_batch(v2, "s", "query-b") == 0
    assert last_batch(v2, "s", "query-c") is None
    assert last_batch(v2, "other", "query-a") is None
    assert latest_batch(v2, "s") == SinkBatch("query-b", 0, 2)
    v3 = {"sinks": carry_forward(v2, {"s": {"query-a": 8}}, 3)}
    assert latest_batch(v3, "s") == SinkBatch("query-a", 8, 3)
    assert latest_batch(v3, "other") is None


def test_old_records_read_as_the_unidentified_writer():
    old = {"sinks": {"s": 5, "t": 2}}
    assert sink_progress(old, "s") == {UNIDENTIFIED: SinkBatch(UNIDENTIFIED, 5, None)}
    assert latest_batch(old, "s") == SinkBatch(UNIDENTIFIED, 5, None)
    new = {"sinks": carry_forward(old, {"s": {"query-a": 0}}, 4)}
    assert last_batch(new, "s", UNIDENTIFIED) == 5
    assert last_batch(new, "t", UNIDENTIFIED) == 2
    assert latest_batch(new, "s") == SinkBatch("query-a", 0, 4)
    # an old-style {sink: batch id} handed to a commit is the unidentified writer's too
    assert carry_forward(None, {"s": 3}, 1) == {"s": {UNIDENTIFIED: {"batch": 3, "version": 1}}}
