"""An in-memory partition behind the same ``BytesPartition`` interface as RocksDB.

What a reader serves a partition no commit has touched from (an empty one,
``format.empty_partition``), a partition its version record says holds no rows, and a
small chain read into memory once (``iqkit.store.chain.snapshot``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ...query.position import Position
from ..names import COMMIT_KEY
from .partition import parse_commit_record


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
