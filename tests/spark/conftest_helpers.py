"""Small helpers shared by the Spark tests."""

from __future__ import annotations

import iqkit


def kv_rows(engine: iqkit.StateEngine, store: str) -> list[tuple[int, object, object]]:
    """(partition, key, value) of every row of a key-value store."""
    r = engine.query(
        iqkit.StateQueryRequest.in_store(store).with_query(iqkit.RangeQuery.with_no_bounds())
    )
    out = []
    for p, qr in sorted(r.partition_results.items()):
        if qr.is_success:
            with qr.result as it:
                out.extend((p, kv.key, kv.value) for kv in it)
    return out
