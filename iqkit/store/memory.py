"""An in-memory partition behind the same ``BytesPartition`` interface as RocksDB.

The reference model a RocksDB partition must agree with: the engine's query tests run
over both backends (``StateEngine(root, partition_opener=MemoryPartition.load)`` serves
every published partition from an in-memory copy), so a query that answers differently
over the two fails there. The engine also serves a partition no commit has touched
from an empty one (store/snapshot.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..query.position import Position
from .names import COMMIT_KEY, END_OF_USER_KEYSPACE, META_PREFIX
from .partition import RocksDBPartition, parse_commit_record


class MemoryPartition:
    """``location`` is what execution info names as the rows' origin."""

    def __init__(
        self,
        items: Iterable[tuple[bytes, bytes]] = (),
        *,
        written_by_version: int = 1,
        position: Position | None = None,
        location: str = "memory",
    ) -> None:
        self.location = location
        data = dict(items)
        #: Every key held, the commit record's included, as RocksDB's estimate counts.
        self._stored = len(data)
        self._commit = parse_commit_record(data.pop(COMMIT_KEY, None), self.location)
        if position is not None:
            self._commit = {**self._commit, "position": position}
        self._keys = sorted(data)
        self._data = data
        self.written_by_version = written_by_version

    @classmethod
    def load(cls, path: Path, written_by_version: int) -> MemoryPartition:
        """An in-memory copy of a published partition folder, commit record included
        (a ``PartitionOpener``: what the engine opens instead of the folder itself)."""
        source = RocksDBPartition(path, written_by_version)
        try:
            chunks = source.scan_chunks(META_PREFIX, END_OF_USER_KEYSPACE)
            rows = [row for chunk in chunks for row in chunk]
        finally:
            source.close()
        return cls(rows, written_by_version=written_by_version, location=f"memory copy of {path}")

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def multi_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return [self._data.get(k) for k in keys]

    def scan_chunks(
        self, lower: bytes, upper: bytes | None, *, reverse: bool = False
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        lo = bisect.bisect_left(self._keys, lower)
        hi = len(self._keys) if upper is None else bisect.bisect_left(self._keys, upper)
        keys = self._keys[lo:hi]
        if reverse:
            keys = keys[::-1]
        rows = [(k, self._data[k]) for k in keys]
        return iter([rows] if rows else [])

    @property
    def open_iterators(self) -> int:
        """Always 0: a scan reads a list of its own, which stays valid after ``close``, so
        nothing ever waits for it to end."""
        return 0

    def commit_record(self) -> dict[str, Any]:
        return self._commit

    def approximate_rows(self) -> int:
        return self._stored

    def close(self) -> None:
        """Nothing to release."""

    def __repr__(self) -> str:
        return f"MemoryPartition({len(self._keys)} keys)"
