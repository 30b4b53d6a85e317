"""Helpers shared by the tests (imported as ``helpers``; conftest files are not modules
to import from: several of them share the name ``conftest``)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import iqkit


def request(store: str, query: iqkit.Query) -> iqkit.StateQueryRequest:
    return iqkit.StateQueryRequest.in_store(store).with_query(query)


def tree_digest(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file below ``folder`` (to prove nothing changed)."""
    out = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = Path(dirpath) / name
            out[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def rows(result: iqkit.QueryResult) -> list[tuple]:
    """Drain an iterator result into (key, value) tuples."""
    with result.result as it:
        return [(kv.key, kv.value) for kv in it]


def kv_rows(engine: iqkit.StateEngine, store: str) -> list[tuple[int, object, object]]:
    """(partition, key, value) of every row of a key-value store."""
    r = engine.query(request(store, iqkit.RangeQuery.with_no_bounds()))
    out = []
    for p, qr in sorted(r.partition_results.items()):
        if qr.is_success:
            with qr.result as it:
                out.extend((p, kv.key, kv.value) for kv in it)
    return out
