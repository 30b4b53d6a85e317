"""The session's store snapshots: a complete scan of a store version kept in memory as
the Arrow batches DuckDB was streamed, so the next statement naming the same store at
the same version scans that table instead of decoding the store again.

Published versions are immutable, so a snapshot can never be stale (the engine's read
cache relies on the same fact); a new commit is a new version and is streamed afresh.
Least recently used snapshots go first; a scan bigger than the budget is not kept; a
budget of ``0`` turns the cache off."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import pyarrow as pa

from ..errors import IqkitError

if TYPE_CHECKING:
    from ..engine import StateEngine

#: (engine root, store, version): what a store snapshot holds.
SnapshotKey = tuple[str, str, int]


def snapshot_key(engine: StateEngine, store: str) -> SnapshotKey | None:
    """The version ``store`` is served at now, read *before* the scan opens: a commit in
    between makes the scan newer than its key, so the key is never asked for again (the
    engine only moves forward), and a snapshot is never older than its key says."""
    try:
        version = engine.version(store)
    except IqkitError:
        return None
    return None if version is None else (os.fspath(engine.root), store, version)


class SnapshotCache:
    """Snapshots by key within ``budget`` bytes; safe to use from DuckDB's threads."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._tables: OrderedDict[SnapshotKey, pa.Table] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: SnapshotKey | None) -> pa.Table | None:
        if key is None:
            return None
        with self._lock:
            table = self._tables.get(key)
            if table is not None:
                self._tables.move_to_end(key)
            return table

    def keep(self, key: SnapshotKey, table: pa.Table) -> None:
        with self._lock:
            # Older versions of the store can never be asked for again by this engine.
            for old in [k for k in self._tables if k[:2] == key[:2] and k != key]:
                del self._tables[old]
            self._tables[key] = table
            total = sum(t.nbytes for t in self._tables.values())
            while total > self.budget and self._tables:
                _, dropped = self._tables.popitem(last=False)
                total -= dropped.nbytes

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()
