"""Ordered scans of a key-value store: key ranges and key prefixes (KIP-614)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from .base import _OrderedQuery, factory_or_builder, require_key
from .iterators import KeyValueIterator
from .order import ResultOrder

__all__ = ["PrefixScanQuery", "RangeQuery"]

K = TypeVar("K")
V = TypeVar("V")


def _make_range(
    cls: type[RangeQuery[Any, Any]], query: RangeQuery[Any, Any] | None, **bounds: object
) -> RangeQuery[Any, Any]:
    """A fresh query with ``bounds`` (class call) or a copy of ``query`` with them."""
    if query is None:
        return cls._build(**{"lower": None, "upper": None, **bounds}, order=ResultOrder.ANY)
    return query._replace(**bounds)


def _with_range(
    cls: type[RangeQuery[Any, Any]], query: RangeQuery[Any, Any] | None, lower: Any, upper: Any
) -> RangeQuery[Any, Any]:
    """Keys from ``lower`` to ``upper``, both inclusive (``None`` = open)."""
    return _make_range(cls, query, lower=lower, upper=upper)


def _with_lower_bound(
    cls: type[RangeQuery[Any, Any]], query: RangeQuery[Any, Any] | None, lower: Any
) -> RangeQuery[Any, Any]:
    """Keys from ``lower`` (inclusive) on; called on a query, keeps its upper bound."""
    return _make_range(cls, query, lower=lower)


def _with_upper_bound(
    cls: type[RangeQuery[Any, Any]], query: RangeQuery[Any, Any] | None, upper: Any
) -> RangeQuery[Any, Any]:
    """Keys up to ``upper`` (inclusive); called on a query, keeps its lower bound."""
    return _make_range(cls, query, upper=upper)


def _with_no_bounds(
    cls: type[RangeQuery[Any, Any]], query: RangeQuery[Any, Any] | None
) -> RangeQuery[Any, Any]:
    """Every key in the store; called on a query, drops both bounds."""
    return _make_range(cls, query, lower=None, upper=None)


class RangeQuery(_OrderedQuery[KeyValueIterator[K, V]], Generic[K, V]):
    """Records whose key lies between two bounds, both inclusive; ``None`` leaves that
    side open.

    A lower bound above the upper bound is not an error: the result is an empty
    iterator.  The default order is ``ANY``, as in Kafka; iqkit serves it ascending.

    ``with_range``, ``with_lower_bound``, ``with_upper_bound`` and ``with_no_bounds``
    are factories when called on the class (Kafka's static methods).  Called on a query
    they return a copy changing only the bounds they name, so
    ``RangeQuery.with_lower_bound(1).with_upper_bound(5)`` covers 1..5.
    """

    __slots__ = ("_lower", "_order", "_upper")
    _FIELDS = ("lower", "upper", "order")
    _FACTORIES = (
        "RangeQuery.with_range(lower, upper), RangeQuery.with_lower_bound(lower), "
        "RangeQuery.with_upper_bound(upper) or RangeQuery.with_no_bounds()"
    )
    _lower: K | None
    _upper: K | None

    with_range = factory_or_builder(_with_range)
    with_lower_bound = factory_or_builder(_with_lower_bound)
    with_upper_bound = factory_or_builder(_with_upper_bound)
    with_no_bounds = factory_or_builder(_with_no_bounds)

    @property
    def lower_bound(self) -> K | None:
        """The smallest key included, or ``None`` for no lower limit."""
        return self._lower

    @property
    def upper_bound(self) -> K | None:
        """The largest key included, or ``None`` for no upper limit."""
        return self._upper

    def __repr__(self) -> str:
        return f"RangeQuery(lower={self._lower!r}, upper={self._upper!r}, order={self._order.name})"


class PrefixScanQuery(_OrderedQuery[KeyValueIterator[K, V]], Generic[K, V]):
    """Records whose serialized key starts with the serialized prefix (KIP-614).

    ``serde`` names the serde used to serialize the prefix when it differs from the
    store's key serde (a ``string`` prefix over keys of another type); ``None`` uses the
    key serde.  For tuple keys under the ``ordered`` serde a shorter tuple is a prefix.
    The default order is ``ANY`` (served ascending), like :class:`RangeQuery`.
    """

    __slots__ = ("_order", "_prefix", "_prefix_serde")
    _FIELDS = ("prefix", "prefix_serde", "order")
    _FACTORIES = "PrefixScanQuery.with_prefix(prefix, serde=None)"
    _prefix: Any
    _prefix_serde: str | None

    @classmethod
    def with_prefix(cls, prefix: Any, serde: str | None = None) -> PrefixScanQuery[Any, Any]:
        """Keys starting with ``prefix``; ``serde`` is a serde name such as
        ``"string"`` (checked against the known serdes when the query runs)."""
        require_key(prefix, "PrefixScanQuery", "prefix")
        if serde is not None and not isinstance(serde, str):
            raise TypeError(
                f"PrefixScanQuery: serde must be a serde name (str) or None, "
                f"got {type(serde).__name__}"
            )
        return cls._build(prefix=prefix, prefix_serde=serde, order=ResultOrder.ANY)

    @property
    def prefix(self) -> Any:
        """The prefix keys must start with (before serialization)."""
        return self._prefix

    @property
    def prefix_serde(self) -> str | None:
        """Name of the serde for the prefix, or ``None`` for the store's key serde."""
        return self._prefix_serde

    def __repr__(self) -> str:
        serde = f", serde={self._prefix_serde!r}" if self._prefix_serde is not None else ""
        return f"PrefixScanQuery(prefix={self._prefix!r}{serde}, order={self._order.name})"
