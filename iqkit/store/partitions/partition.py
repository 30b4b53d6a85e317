"""Bytes-level access to one partition of one store, as one published version has it.

``BytesPartition`` is the interface the query layers use; ``RocksDBPartition`` serves it
from a published RocksDB folder (read-only, no lock), ``MemoryPartition`` (memory.py)
from a sorted list: the empty partition, and the model the RocksDB one must agree with
(the engine's query tests run over both).
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from ...errors import EngineClosedError, StoreCorruptedError
from ...query.position import Position
from ..names import COMMIT_KEY
from . import rocks

#: What a scan yields: rows in key order (or reversed), in lists.
Chunk = list[tuple[bytes, bytes]]


def closed_partition_error(location: str) -> EngineClosedError:
    """The error for reading a closed partition: the one way to meet one is a result
    read after its engine was closed."""
    return EngineClosedError(
        f"partition {location} is closed: its engine was closed before this result was "
        "read (read a result before closing its engine)"
    )


class _TrackedScan:
    """A partition's scan that the partition can end when it closes (its RocksDB
    iterator must go before the database does). Read after that, it raises instead of
    ending quietly: a result read after its engine closed would otherwise look like a
    short, successful one."""

    __slots__ = ("__weakref__", "_ended", "_inner")

    def __init__(self, inner: Iterator[list[tuple[bytes, bytes]]]) -> None:
        self._inner: Iterator[list[tuple[bytes, bytes]]] | None = inner
        self._ended: str | None = None

    def __iter__(self) -> _TrackedScan:
        return self

    def __next__(self) -> list[tuple[bytes, bytes]]:
        inner = self._inner
        if inner is None:
            if self._ended is not None:
                raise EngineClosedError(self._ended)
            raise StopIteration
        try:
            return next(inner)
        except BaseException:
            self._inner = None  # finished or failed: nothing more comes
            raise

    def close(self) -> None:
        inner, self._inner = self._inner, None
        close = getattr(inner, "close", None)
        if close is not None:
            close()

    @property
    def live(self) -> bool:
        """Neither finished nor closed (started or not)."""
        return self._inner is not None

    def end(self, location: str) -> None:
        """Close it for the partition's sake: a later read raises ``EngineClosedError``."""
        if self._inner is not None:
            self.close()
            self._ended = (
                f"the scan of {location} was cut short: its engine was closed before the "
                "result was read to the end (read a result before closing its engine)"
            )


class ScanTracker:
    """The scans a partition has handed out and not seen end (``_TrackedScan``)."""

    __slots__ = ("_scans",)

    def __init__(self) -> None:
        self._scans: weakref.WeakSet[_TrackedScan] = weakref.WeakSet()

    def track(
        self, scan: Iterator[list[tuple[bytes, bytes]]]
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        tracked = _TrackedScan(scan)
        self._scans.add(tracked)
        return tracked

    @property
    def live(self) -> int:
        """Scans that may still read."""
        return sum(1 for scan in self._scans if scan.live)

    def end_all(self, location: str) -> None:
        """End every live scan (before the database closes); reading one later raises."""
        for scan in list(self._scans):
            scan.end(location)
        self._scans = weakref.WeakSet()


class BytesPartition(Protocol):
    """What a partition offers the layers above it: bytes in, bytes out."""

    #: The version whose commit wrote this partition's data.
    written_by_version: int
    #: Where the data lives (for traces); "memory" for in-memory partitions.
    location: str

    def get(self, key: bytes) -> bytes | None: ...
    def multi_get(self, keys: Sequence[bytes]) -> list[bytes | None]: ...
    def scan_chunks(
        self, lower: bytes, upper: bytes | None, *, reverse: bool = False
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        """Rows with ``lower <= key < upper`` in key order (or reversed), in lists."""
        ...

    @property
    def open_iterators(self) -> int:
        """Scans still reading (a partition is closed only once they end)."""
        ...

    def commit_record(self) -> dict[str, Any]: ...
    def approximate_rows(self) -> int: ...
    def close(self) -> None: ...


def parse_commit_record(raw: bytes | None, where: str) -> dict[str, Any]:
    """Decode the commit record; ``{}`` when the partition has none."""
    if raw is None:
        return {}
    try:
        record = json.loads(raw)
        record["position"] = Position.from_map(
            {
                t: {int(p): int(o) for p, o in ps.items()}
                for t, ps in record.get("position", {}).items()
            }
        )
        return record
    except (ValueError, TypeError, AttributeError) as exc:
        raise StoreCorruptedError(f"unreadable commit record in {where}: {exc}") from exc


def encode_commit_record(record: dict[str, Any]) -> bytes:
    position: Position = record["position"]
    out = dict(record)
    out["position"] = {
        t: {str(p): o for p, o in sorted(ps.items())} for t, ps in sorted(position.to_map().items())
    }
    return json.dumps(out, sort_keys=True).encode()


class RocksDBPartition:
    """One published partition folder opened read-only.

    Iterators handed out are tracked, so ``close`` can end them first: a live rocksdict
    iterator keeps the database open (quirk), and reading from one after ``close`` would
    touch freed memory.
    """

    def __init__(
        self, path: Path, written_by_version: int, *, db: rocks.Rdict | None = None
    ) -> None:
        """``db``: the database of ``path`` already open (one its builder kept open:
        ``iqkit.store.chain.read.open_partition``), closed with this partition; else
        ``path`` is opened read-only."""
        self.location = os.fspath(path)
        self.written_by_version = written_by_version
        self._db: rocks.Rdict | None = db if db is not None else rocks.open_for_read(path)
        self._scans = ScanTracker()
        try:
            self._commit = parse_commit_record(self._db.get(COMMIT_KEY), self.location)
        except BaseException:
            self.close()
            raise

    def _error(self, exc: BaseException) -> Exception:
        """``exc`` (raised by a read of the database) as iqkit's error; a subclass that
        knows what the database's files are on its root names them (chain.read)."""
        return rocks.classify(exc, self.location)

    @property
    def _open_db(self) -> rocks.Rdict:
        if self._db is None:
            raise closed_partition_error(self.location)
        return self._db

    def get(self, key: bytes) -> bytes | None:
        db = self._db  # not ``_open_db``: a key lookup's every step counts
        if db is None:
            raise closed_partition_error(self.location)
        try:
            return db.get(key)
        except Exception as exc:
            raise self._error(exc) from exc

    def multi_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        try:
            return self._open_db.get(list(keys))
        except Exception as exc:
            raise self._error(exc) from exc

    def scan_chunks(
        self, lower: bytes, upper: bytes | None, *, reverse: bool = False
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        return self._scans.track(self._guarded_scan(lower, upper, reverse))

    def _guarded_scan(
        self, lower: bytes, upper: bytes | None, reverse: bool
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        try:
            yield from rocks.scan_chunks(self._open_db, lower, upper, reverse=reverse)
        except GeneratorExit:
            raise
        except Exception as exc:
            raise self._error(exc) from exc

    @property
    def open_iterators(self) -> int:
        """Scans that may still read: started or not, but neither finished nor closed
        (a finished generator has no frame, even while a result object holds it)."""
        return self._scans.live

    def commit_record(self) -> dict[str, Any]:
        return self._commit

    def approximate_rows(self) -> int:
        try:
            return int(self._open_db.property_int_value("rocksdb.estimate-num-keys") or 0)
        except Exception as exc:
            raise self._error(exc) from exc

    def close(self) -> None:
        self._scans.end_all(self.location)  # rocksdict iterators go before the database
        db, self._db = self._db, None
        rocks.close_quietly(db)

    def __repr__(self) -> str:
        state = "closed" if self._db is None else "open"
        return f"RocksDBPartition({self.location!r}, {state})"
