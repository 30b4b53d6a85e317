"""Window-store queries (KIP-806): one key's windows, or all keys' windows, by window
start time.

Times are epoch milliseconds, Kafka's unit.  ``datetime`` values are accepted for
convenience in notebooks and converted exactly (no float rounding); a naive
``datetime`` is taken to be UTC, never the machine's local time zone, so the same
notebook gives the same answer everywhere.
"""

from __future__ import annotations

import operator
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from .base import _OrderedQuery, require_key
from .iterators import KeyValueIterator, Windowed
from .order import ResultOrder

__all__ = [
    "EARLIEST_EPOCH_MS",
    "LATEST_EPOCH_MS",
    "WindowKeyQuery",
    "WindowRangeQuery",
    "to_epoch_millis",
]

K = TypeVar("K")
V = TypeVar("V")
R = TypeVar("R")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)

#: Every time iqkit takes is a signed 64-bit count of epoch milliseconds, Kafka's
#: ``long`` timestamps: a window store keeps window starts in 8 bytes
#: (``store.encoding.keyspace.encode_time``), so nothing outside this range can be stored
#: or found.
EARLIEST_EPOCH_MS = -(2**63)
LATEST_EPOCH_MS = 2**63 - 1


def to_epoch_millis(value: int | datetime, what: str = "time") -> int:
    """Epoch milliseconds from an int (returned as is) or a ``datetime`` (naive = UTC;
    sub-millisecond parts are floored).  ``None`` and an int outside 64-bit epoch
    milliseconds (``EARLIEST_EPOCH_MS`` .. ``LATEST_EPOCH_MS``) raise ``ValueError``;
    floats, dates and strings raise ``TypeError`` because their meaning is ambiguous.
    The one check of every time iqkit takes: writers' window starts, window queries'
    bounds, the Spark reader's time options."""
    if value is None:
        raise ValueError(f"{what} must not be None")
    if isinstance(value, datetime):
        # datetime's years 1..9999 always fit in 64-bit milliseconds
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return (aware - _EPOCH) // _ONE_MS
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(
            f"{what} must be epoch milliseconds (int) or a datetime, "
            f"got {value!r} ({type(value).__name__})"
        )
    ms = operator.index(value)
    if not EARLIEST_EPOCH_MS <= ms <= LATEST_EPOCH_MS:
        raise ValueError(f"{what} {ms} is outside 64-bit epoch milliseconds (-2**63 .. 2**63-1)")
    return ms


class _WindowStartRange(_OrderedQuery[R]):
    """A window query's window-start range ``[time_from, time_to]``, epoch ms."""

    __slots__ = ()
    _time_from: int
    _time_to: int

    @property
    def time_from(self) -> int:
        """Earliest window start included, epoch ms."""
        return self._time_from

    @property
    def time_to(self) -> int:
        """Latest window start included, epoch ms."""
        return self._time_to


class WindowKeyQuery(_WindowStartRange[KeyValueIterator[Windowed[K], V]], Generic[K, V]):
    """The windows of one key whose start time lies in ``[time_from, time_to]``.

    Results are ``KeyValue(Windowed(key, start, end), value)``, oldest window first by
    default; :meth:`with_descending_keys` returns the newest first (KIP-617's "last N
    in a time range").  ``time_from > time_to`` gives an empty result, not an error.
    """

    __slots__ = ("_key", "_order", "_time_from", "_time_to")
    _FIELDS = ("key", "time_from", "time_to", "order")
    _FACTORIES = "WindowKeyQuery.with_key_and_window_start_range(key, time_from, time_to)"
    _key: K
    _time_from: int
    _time_to: int

    @classmethod
    def with_key_and_window_start_range(
        cls, key: K, time_from: int | datetime, time_to: int | datetime
    ) -> WindowKeyQuery[K, Any]:
        """Windows of ``key`` starting between ``time_from`` and ``time_to`` inclusive
        (epoch ms or ``datetime``; naive = UTC)."""
        require_key(key, "WindowKeyQuery")
        return cls._build(
            key=key,
            time_from=to_epoch_millis(time_from, "WindowKeyQuery: time_from"),
            time_to=to_epoch_millis(time_to, "WindowKeyQuery: time_to"),
            order=ResultOrder.ASCENDING,
        )

    @property
    def key(self) -> K:
        """The key whose windows are returned."""
        return self._key

    def __repr__(self) -> str:
        return (
            f"WindowKeyQuery(key={self._key!r}, time_from={self._time_from}, "
            f"time_to={self._time_to}, order={self._order.name})"
        )


class WindowRangeQuery(_WindowStartRange[KeyValueIterator[Windowed[Any], V]], Generic[V]):
    """The windows of every key whose start time lies in ``[time_from, time_to]``.

    Ascending (oldest window first) by default; :meth:`with_descending_keys` returns
    the newest first.  ``time_from > time_to`` gives an empty result.
    """

    __slots__ = ("_order", "_time_from", "_time_to")
    _FIELDS = ("time_from", "time_to", "order")
    _FACTORIES = "WindowRangeQuery.with_window_start_range(time_from, time_to)"
    _time_from: int
    _time_to: int

    @classmethod
    def with_window_start_range(
        cls, time_from: int | datetime, time_to: int | datetime
    ) -> WindowRangeQuery[Any]:
        """Windows of all keys starting between ``time_from`` and ``time_to`` inclusive
        (epoch ms or ``datetime``; naive = UTC)."""
        return cls._build(
            time_from=to_epoch_millis(time_from, "WindowRangeQuery: time_from"),
            time_to=to_epoch_millis(time_to, "WindowRangeQuery: time_to"),
            order=ResultOrder.ASCENDING,
        )

    def __repr__(self) -> str:
        return (
            f"WindowRangeQuery(time_from={self._time_from}, time_to={self._time_to}, "
            f"order={self._order.name})"
        )
