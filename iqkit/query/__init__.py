"""iqkit's query model: Kafka Streams IQv2 (KIP-796) requests, queries and results.

Pure Python, no I/O: everything here is an immutable value (except the
``StateQueryResult`` the engine fills and ``KeyValueIterator``, which is consumed), so
requests can be built, compared and stored freely in a notebook before an engine
runs them.
"""

from .base import Query
from .iterators import KeyValue, KeyValueIterator, Windowed
from .key import KeyQuery, MultiKeyQuery
from .lag import LagInfo
from .order import ResultOrder
from .position import Position, PositionBound
from .range import PrefixScanQuery, RangeQuery
from .raw import RawKeyQuery, RawScanQuery
from .request import InStore as InStore
from .request import StateQueryRequest
from .request import validate_store_name as validate_store_name
from .results import FailureReason, QueryResult, StateQueryResult
from .versions import (
    Change,
    ChangesQuery,
    MultiVersionedKeyQuery,
    VersionedKeyQuery,
    VersionedRecord,
)
from .window import WindowKeyQuery, WindowRangeQuery
from .window import to_epoch_millis as to_epoch_millis

# __all__ is the query model's public API and its one list: ``iqkit`` re-exports exactly
# these names (a star import, and ``__all__ += query.__all__``). ``InStore``,
# ``to_epoch_millis`` and ``validate_store_name`` stay importable from here (the ``as``
# form marks them re-exported) but serve iqkit's own layers, so they are not listed.
__all__ = [
    "Change",
    "ChangesQuery",
    "FailureReason",
    "KeyQuery",
    "KeyValue",
    "KeyValueIterator",
    "LagInfo",
    "MultiKeyQuery",
    "MultiVersionedKeyQuery",
    "Position",
    "PositionBound",
    "PrefixScanQuery",
    "Query",
    "QueryResult",
    "RangeQuery",
    "RawKeyQuery",
    "RawScanQuery",
    "ResultOrder",
    "StateQueryRequest",
    "StateQueryResult",
    "VersionedKeyQuery",
    "VersionedRecord",
    "WindowKeyQuery",
    "WindowRangeQuery",
    "Windowed",
]
