"""The IQv2 request: which store, which query, which partitions, how fresh (KIP-796).

Built with Kafka's progressive builder: ``StateQueryRequest.in_store(name)`` gives an
:class:`InStore`, whose ``with_query`` gives the request, so a request without a store
or a query cannot exist.  Optional settings are copying builder methods.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable
from typing import Any, Generic, NoReturn, TypeVar

from .base import Query
from .position import Position, PositionBound

__all__ = ["InStore", "StateQueryRequest", "validate_store_name"]

R = TypeVar("R")

#: A store name is one folder name: most file systems (ext4, XFS, APFS, NTFS) cap a
#: name at 255 bytes.
MAX_STORE_NAME_BYTES = 255


#: Path separators a store name must not contain, sorted (the first one found is named).
_SEPARATORS = tuple(sorted({"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())))
#: Names that passed ``validate_store_name``: a notebook loop builds a request per key,
#: and checking the same name each time was a fifth of a warm key lookup. Cleared when
#: full, so it stays small whatever a process names.
_VALID_NAMES: set[str] = set()
_VALID_NAMES_LIMIT = 1024


def validate_store_name(name: str) -> str:
    """Return ``name`` if it can safely be a store's folder name, else raise.

    A store name becomes a directory under the engine's root, so anything that could
    escape the root or name something else is refused with ``ValueError``: an empty
    name, a leading ``.`` (reserved), any ``..``, path separators (``/``, ``\\``, the
    OS's own), NUL, text that is not valid UTF-8 (a lone surrogate) and names over
    255 bytes (the longest folder name file systems take).
    A non-``str`` is a ``TypeError``.
    """
    if type(name) is str and name in _VALID_NAMES:
        return name
    if not isinstance(name, str):
        raise TypeError(f"store name must be a str, got {type(name).__name__}")
    if not name:
        raise ValueError("store name must not be empty")
    bad = [s for s in _SEPARATORS if s in name]
    if bad:
        raise ValueError(f"store name {name!r} must not contain a path separator ({bad[0]!r})")
    if ".." in name or name.startswith("."):
        # a leading dot is reserved for iqkit's own hidden files (staging folders)
        raise ValueError(f"store name {name!r} must not start with '.' or contain '..'")
    if "\x00" in name:
        raise ValueError(f"store name {name!r} must not contain a NUL character")
    try:
        # UTF-8, strictly: rocksdict takes paths as UTF-8 text, so a lone surrogate
        # (also what Python makes of a non-UTF-8 byte in a file name) cannot be opened.
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"store name {name!r} is not valid Unicode text") from None
    if size > MAX_STORE_NAME_BYTES:
        raise ValueError(
            f"store name {name[:20]!r}... is {size} bytes long; a folder name holds at most "
            f"{MAX_STORE_NAME_BYTES}"
        )
    if type(name) is str:  # not a str subclass: its == or hash could say anything
        if len(_VALID_NAMES) >= _VALID_NAMES_LIMIT:
            _VALID_NAMES.clear()
        _VALID_NAMES.add(name)
    return name


def _partition(value: object) -> int:
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise ValueError(f"partitions must be ints >= 0, got {value!r}")
    p = operator.index(value)  # type: ignore[arg-type]
    if p < 0:
        raise ValueError(f"partitions must be ints >= 0, got {p}")
    return p


class InStore:
    """First step of the builder: the store is named, the query is still missing."""

    __slots__ = ("_store_name",)
    _store_name: str

    def __init__(self, store_name: str) -> None:
        object.__setattr__(self, "_store_name", validate_store_name(store_name))

    @property
    def store_name(self) -> str:
        """The store the request will query."""
        return self._store_name

    def with_query(self, query: Query[R]) -> StateQueryRequest[R]:
        """The request running ``query`` on every partition of the store."""
        return StateQueryRequest._plain(self._store_name, query)

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("InStore is immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("InStore is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (InStore, (self._store_name,))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InStore):
            return NotImplemented
        return self._store_name == other._store_name

    def __hash__(self) -> int:
        return hash((InStore, self._store_name))

    def __repr__(self) -> str:
        return f"InStore({self._store_name!r})"


_FIELDS = (
    "store_name",
    "query",
    "partitions",
    "position_bound",
    "require_active",
    "execution_info",
)


class StateQueryRequest(Generic[R]):
    """An immutable request to run one :class:`Query` against one store.

    Defaults: all partitions, no position bound, any replica (here: any version),
    no execution info.  Each builder method returns a new request.
    """

    __slots__ = (*("_" + f for f in _FIELDS), "_uses_defaults")
    _store_name: str
    _query: Query[R]
    _partitions: frozenset[int] | None
    _position_bound: PositionBound
    _require_active: bool
    _execution_info: bool

    def __init__(self) -> None:
        raise TypeError("use StateQueryRequest.in_store(name).with_query(query)")

    @classmethod
    def _make(cls, **values: Any) -> StateQueryRequest[Any]:
        if not isinstance(values["query"], Query):
            raise TypeError(
                f"with_query expects a Query (e.g. KeyQuery.with_key(...)), "
                f"got {type(values['query']).__name__}"
            )
        obj = object.__new__(cls)
        for name in _FIELDS:
            object.__setattr__(obj, "_" + name, values[name])
        object.__setattr__(
            obj,
            "_uses_defaults",
            values["partitions"] is None
            and values["position_bound"].is_unbounded
            and not values["require_active"]
            and not values["execution_info"],
        )
        return obj

    @classmethod
    def _plain(cls, store_name: str, query: Query[R]) -> StateQueryRequest[R]:
        """``_make`` with every default (what ``with_query`` builds, once per key in a
        notebook loop): the same fields, set directly."""
        if not isinstance(query, Query):
            return cls._make(
                store_name=store_name,
                query=query,
                partitions=None,
                position_bound=PositionBound.unbounded(),
                require_active=False,
                execution_info=False,
            )  # raises the usual TypeError
        obj = object.__new__(cls)
        set_ = object.__setattr__
        set_(obj, "_store_name", store_name)
        set_(obj, "_query", query)
        set_(obj, "_partitions", None)
        set_(obj, "_position_bound", PositionBound.unbounded())
        set_(obj, "_require_active", False)
        set_(obj, "_execution_info", False)
        set_(obj, "_uses_defaults", True)
        return obj

    def _replace(self, **changes: Any) -> StateQueryRequest[R]:
        values = {name: getattr(self, "_" + name) for name in _FIELDS}
        values.update(changes)
        return self._make(**values)

    @staticmethod
    def in_store(name: str) -> InStore:
        """Start a request on the store called ``name`` (validated like a folder name)."""
        return InStore(name)

    # -- builders --------------------------------------------------------------------

    def with_partitions(self, partitions: Iterable[int]) -> StateQueryRequest[R]:
        """A copy querying only ``partitions`` (ints >= 0; an empty set queries none).

        Partitions the store does not have are answered with ``DOES_NOT_EXIST``.
        """
        if isinstance(partitions, str | bytes) or not isinstance(partitions, Iterable):
            raise TypeError(
                f"partitions must be a set of ints, got {type(partitions).__name__} {partitions!r}"
            )
        return self._replace(partitions=frozenset(_partition(p) for p in partitions))

    def with_all_partitions(self) -> StateQueryRequest[R]:
        """A copy querying every partition of the store (the default)."""
        return self._replace(partitions=None)

    def require_active(self) -> StateQueryRequest[R]:
        """A copy failing with ``NOT_ACTIVE`` on partitions not served from the latest
        published version (the analogue of a standby replica)."""
        return self._replace(require_active=True)

    def with_position_bound(self, bound: PositionBound | Position) -> StateQueryRequest[R]:
        """A copy that fails with ``NOT_UP_TO_BOUND`` on partitions behind ``bound``.

        A bare ``Position`` (e.g. a previous result's) is taken as
        ``PositionBound.at(position)``.
        """
        if isinstance(bound, Position):
            bound = PositionBound.at(bound)
        if not isinstance(bound, PositionBound):
            raise TypeError(f"expected a PositionBound, got {type(bound).__name__}")
        return self._replace(position_bound=bound)

    def enable_execution_info(self) -> StateQueryRequest[R]:
        """A copy asking every layer to record what it did and how long it took."""
        return self._replace(execution_info=True)

    # -- getters ---------------------------------------------------------------------

    @property
    def store_name(self) -> str:
        """The store to query."""
        return self._store_name

    @property
    def query(self) -> Query[R]:
        """The query to run."""
        return self._query

    @property
    def position_bound(self) -> PositionBound:
        """The bound partitions must have reached (unbounded by default)."""
        return self._position_bound

    @property
    def is_all_partitions(self) -> bool:
        """True when every partition of the store is queried."""
        return self._partitions is None

    @property
    def partitions(self) -> frozenset[int]:
        """The partitions to query; ``ValueError`` for an all-partitions request, whose
        partitions are only known once the store is opened."""
        if self._partitions is None:
            raise ValueError(
                "this request queries all partitions; check is_all_partitions before "
                "reading partitions"
            )
        return self._partitions

    @property
    def uses_defaults(self) -> bool:
        """True when the request asks nothing beyond its query: all partitions, no
        position bound, any version, no execution info (the engine's key-lookup path
        takes only such requests). Worked out once, when the request is built."""
        return self._uses_defaults

    @property
    def is_require_active(self) -> bool:
        """True when only partitions served from the latest version may answer."""
        return self._require_active

    @property
    def execution_info_enabled(self) -> bool:
        """True when execution info is collected."""
        return self._execution_info

    # -- value semantics -------------------------------------------------------------

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, "_" + name) for name in _FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StateQueryRequest):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((StateQueryRequest, self._values()))

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("StateQueryRequest is immutable; its builder methods return copies")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("StateQueryRequest is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle and copy would otherwise restore the slots through __setattr__.
        return (_rebuild_request, (self._values(),))

    def __repr__(self) -> str:
        partitions = "ALL" if self._partitions is None else repr(sorted(self._partitions))
        return (
            f"StateQueryRequest(store={self._store_name!r}, query={self._query!r}, "
            f"partitions={partitions}, bound={self._position_bound!r}, "
            f"require_active={self._require_active}, execution_info={self._execution_info})"
        )


def _rebuild_request(values: tuple[object, ...]) -> StateQueryRequest[Any]:
    return StateQueryRequest._make(**dict(zip(_FIELDS, values, strict=True)))
