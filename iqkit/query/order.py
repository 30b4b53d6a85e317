"""The order in which an iterator query returns its records (KIP-617, KIP-985)."""

from __future__ import annotations

from enum import Enum

__all__ = ["ResultOrder"]


class ResultOrder(Enum):
    """Requested order of an iterator result, by serialized key bytes within one partition.

    Kafka's ``RangeQuery`` defaults to ``ANY`` so a store may return whatever order is
    cheapest; iqkit's stores are RocksDB, whose natural order is ascending, so the engine
    serves ``ANY`` exactly like ``ASCENDING``.  The values are the member names so a
    request typed in a notebook (``ResultOrder("DESCENDING")``) parses back.
    """

    ANY = "ANY"
    """No preference: the store returns its natural (ascending) order."""

    ASCENDING = "ASCENDING"
    """Smallest serialized key first; oldest window first for window queries."""

    DESCENDING = "DESCENDING"
    """Largest serialized key first; newest window first for window queries (KIP-617)."""
