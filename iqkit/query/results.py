"""Per-partition query results and the request-wide result that collects them (KIP-796).

Partitions succeed or fail independently: a failure is a value (:class:`QueryResult`
with a :class:`FailureReason`), not an exception, so one unreadable partition does not
hide the answers of the others.  Every result, failures included, carries the position
of the partition that produced it.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable
from enum import Enum
from typing import Any, Generic, NoReturn, TypeVar

from .position import Position, PositionBound

__all__ = ["FailureReason", "QueryResult", "StateQueryResult"]

R = TypeVar("R")
N = TypeVar("N")

_repr = reprlib.Repr()
_repr.maxstring = 80
_repr.maxother = 80


class FailureReason(Enum):
    """Why one partition could not answer a query."""

    UNKNOWN_QUERY_TYPE = "UNKNOWN_QUERY_TYPE"
    """The store cannot run this kind of query (e.g. a window query on a key-value store)."""

    NOT_ACTIVE = "NOT_ACTIVE"
    """``require_active()`` was asked, but the partition is served from an older version
    than the latest published one; retry on an engine reading the latest."""

    NOT_UP_TO_BOUND = "NOT_UP_TO_BOUND"
    """The partition has not reached the request's position bound yet; retry later."""

    NOT_PRESENT = "NOT_PRESENT"
    """The partition exists but has no published data yet."""

    DOES_NOT_EXIST = "DOES_NOT_EXIST"
    """The store has no such partition (e.g. partition 4 of a 4-partition store)."""

    STORE_EXCEPTION = "STORE_EXCEPTION"
    """Reading the partition failed (I/O error, corruption); the message has details."""


_set_attribute = object.__setattr__


def _lines(execution_info: str | Iterable[str]) -> tuple[str, ...]:
    """Execution info as a tuple of str; a single str is one line, not its characters."""
    if execution_info == ():  # the usual case (no execution info): nothing to check
        return ()
    if isinstance(execution_info, str):
        return (execution_info,)
    lines = tuple(execution_info)
    for line in lines:
        if not isinstance(line, str):
            raise TypeError(f"execution info lines must be str, got {type(line).__name__}")
    return lines


def _position(position: Position | None) -> Position:
    if type(position) is Position:  # the usual case, first
        return position
    if position is None:
        return Position.empty()
    if not isinstance(position, Position):
        raise TypeError(f"position must be a Position or None, got {type(position).__name__}")
    return position


def _describe_store(store: object) -> str:
    if isinstance(store, str):
        return repr(store)
    name = getattr(store, "name", None)
    if isinstance(name, str):
        return f"{name!r} ({type(store).__name__})"
    return type(store).__name__


class QueryResult(Generic[R]):
    """The answer of one store partition: a result of type ``R`` or a failure.

    Immutable: build with the ``for_*`` factories, derive copies with
    :meth:`with_position` and :meth:`with_execution_info` (which the store layers use to
    stamp their position and timing as the result travels up).
    """

    __slots__ = ("_execution_info", "_failure_message", "_failure_reason", "_position", "_result")
    _result: R | None
    _failure_reason: FailureReason | None
    _failure_message: str | None
    _position: Position
    _execution_info: tuple[str, ...]

    def __init__(self) -> None:
        raise TypeError(
            "use QueryResult.for_result(...), for_failure(...), for_unknown_query_type(...) "
            "or not_up_to_bound(...)"
        )

    @classmethod
    def _make(
        cls,
        result: Any,
        reason: FailureReason | None,
        message: str | None,
        position: Position | None,
        execution_info: str | Iterable[str],
    ) -> QueryResult[Any]:
        obj = object.__new__(cls)
        set_ = _set_attribute  # every key lookup makes one: bound once, not looked up
        set_(obj, "_result", result)
        set_(obj, "_failure_reason", reason)
        set_(obj, "_failure_message", message)
        set_(obj, "_position", _position(position))
        set_(obj, "_execution_info", _lines(execution_info))
        return obj

    # -- factories -------------------------------------------------------------------

    @classmethod
    def for_result(
        cls,
        result: N,
        *,
        position: Position | None = None,
        execution_info: str | Iterable[str] = (),
    ) -> QueryResult[N]:
        """A successful result (``None`` is a valid result: "key not found")."""
        if type(position) is Position and execution_info == ():
            # Every key lookup makes one: the checks below have nothing to check.
            obj = object.__new__(cls)
            set_ = _set_attribute
            set_(obj, "_result", result)
            set_(obj, "_failure_reason", None)
            set_(obj, "_failure_message", None)
            set_(obj, "_position", position)
            set_(obj, "_execution_info", ())
            return obj
        return cls._make(result, None, None, position, execution_info)

    @classmethod
    def for_failure(
        cls,
        reason: FailureReason,
        message: str,
        *,
        position: Position | None = None,
        execution_info: str | Iterable[str] = (),
    ) -> QueryResult[Any]:
        """A failed result: ``reason`` classifies it, ``message`` explains it to a human."""
        if not isinstance(reason, FailureReason):
            raise TypeError(f"reason must be a FailureReason, got {type(reason).__name__}")
        if not isinstance(message, str):
            raise TypeError(f"message must be a str, got {type(message).__name__}")
        return cls._make(None, reason, message, position, execution_info)

    @classmethod
    def for_unknown_query_type(
        cls,
        query: object,
        store: object,
        *,
        position: Position | None = None,
        execution_info: str | Iterable[str] = (),
    ) -> QueryResult[Any]:
        """``UNKNOWN_QUERY_TYPE``: ``store`` (a name or a store object) cannot run
        ``query``; the message names both."""
        message = (
            f"This store ({_describe_store(store)}) doesn't know how to execute "
            f"{type(query).__name__} queries (got {query!r})."
        )
        return cls.for_failure(
            FailureReason.UNKNOWN_QUERY_TYPE,
            message,
            position=position,
            execution_info=execution_info,
        )

    @classmethod
    def not_up_to_bound(
        cls,
        current_position: Position,
        bound: PositionBound | Position,
        partition: int,
        *,
        execution_info: str | Iterable[str] = (),
    ) -> QueryResult[Any]:
        """``NOT_UP_TO_BOUND``: the partition, at ``current_position``, has not reached
        ``bound`` yet.  The result's position is the current one, so the caller sees how
        far behind it is."""
        if isinstance(bound, Position):
            bound = PositionBound.at(bound)
        if not isinstance(bound, PositionBound):
            raise TypeError(f"bound must be a PositionBound, got {type(bound).__name__}")
        message = (
            f"For store partition {partition}, the current position {current_position!r} "
            f"is not yet up to the bound {bound!r}"
        )
        return cls.for_failure(
            FailureReason.NOT_UP_TO_BOUND,
            message,
            position=current_position,
            execution_info=execution_info,
        )

    # -- copies ----------------------------------------------------------------------

    def with_position(self, position: Position | None) -> QueryResult[R]:
        """A copy carrying ``position`` (``None`` = empty)."""
        return self._make(
            self._result, self._failure_reason, self._failure_message, position,
            self._execution_info,
        )  # fmt: skip

    def with_execution_info(self, lines: str | Iterable[str]) -> QueryResult[R]:
        """A copy with ``lines`` appended to the execution info (a str is one line)."""
        return self._make(
            self._result, self._failure_reason, self._failure_message, self._position,
            self._execution_info + _lines(lines),
        )  # fmt: skip

    def swap_result(self, new_result: N) -> QueryResult[N]:
        """A copy of this success with another result and the same position and
        execution info (KIP-796's ``swapResult``: a layer translating bytes to typed
        values).  A failure has no result to swap: ``ValueError``."""
        if self.is_failure:
            raise ValueError(
                f"cannot swap the result of a failed query ({self._describe_failure()})"
            )
        return self._make(new_result, None, None, self._position, self._execution_info)

    # -- accessors -------------------------------------------------------------------

    @property
    def is_success(self) -> bool:
        """True when the partition answered."""
        return self._failure_reason is None

    @property
    def is_failure(self) -> bool:
        """True when the partition could not answer."""
        return self._failure_reason is not None

    def _describe_failure(self) -> str:
        assert self._failure_reason is not None
        return f"{self._failure_reason.name}: {self._failure_message}"

    @property
    def result(self) -> R:
        """The result of a success; ``ValueError`` (with reason and message) on a failure."""
        if self._failure_reason is not None:
            raise ValueError(
                f"Cannot get result for failed query. Failure is {self._describe_failure()}"
            )
        return self._result  # type: ignore[return-value]

    @property
    def failure_reason(self) -> FailureReason:
        """Why the query failed; ``ValueError`` on a success."""
        if self._failure_reason is None:
            raise ValueError("Cannot get failure reason because this query did not fail.")
        return self._failure_reason

    @property
    def failure_message(self) -> str:
        """The human explanation of the failure; ``ValueError`` on a success."""
        if self._failure_message is None:
            raise ValueError("Cannot get failure message because this query did not fail.")
        return self._failure_message

    @property
    def execution_info(self) -> list[str]:
        """The execution trace lines (a new list; empty unless execution info was
        enabled on the request)."""
        return list(self._execution_info)

    @property
    def position(self) -> Position:
        """The position of the partition that produced this result (may be empty)."""
        return self._position

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("QueryResult is immutable; with_position() etc. return copies")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("QueryResult is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle and copy would otherwise restore the slots through __setattr__.
        return (
            QueryResult._make,
            (self._result, self._failure_reason, self._failure_message, self._position,
             self._execution_info),
        )  # fmt: skip

    def __repr__(self) -> str:
        if self._failure_reason is None:
            head = f"result={_repr.repr(self._result)}"
        else:
            head = f"failure={self._failure_reason.name}, message={self._failure_message!r}"
        info = f", execution_info={len(self._execution_info)} lines" if self._execution_info else ""
        return f"QueryResult({head}, position={self._position!r}{info})"


class StateQueryResult(Generic[R]):
    """The answer to a :class:`~iqkit.query.StateQueryRequest`: one :class:`QueryResult`
    per partition that ran the query.

    ``add_result`` is its only mutator; the engine fills it, and tests may build one by
    hand.  Adding a partition twice replaces the earlier result, as in Kafka.
    """

    __slots__ = ("_results",)

    def __init__(self) -> None:
        self._results: dict[int, QueryResult[R]] = {}

    @classmethod
    def _of_one(cls, partition: int, query_result: QueryResult[R]) -> StateQueryResult[R]:
        """The answer of one partition, for a caller whose ``partition`` is a plain int
        ``>= 0`` and ``query_result`` a ``QueryResult`` (the engine's key lookups): what
        ``add_result`` would check, known already."""
        obj = object.__new__(cls)
        obj._results = {partition: query_result}
        return obj

    def add_result(self, partition: int, query_result: QueryResult[R]) -> None:
        """Record ``query_result`` as the answer of store partition ``partition``."""
        is_int = type(partition) is int or (  # the plain int first: the usual case
            isinstance(partition, int) and not isinstance(partition, bool)
        )
        if not is_int or partition < 0:
            raise ValueError(f"partition must be an int >= 0, got {partition!r}")
        if type(query_result) is not QueryResult and not isinstance(query_result, QueryResult):
            raise TypeError(f"expected a QueryResult, got {type(query_result).__name__}")
        self._results[partition] = query_result

    @property
    def partition_results(self) -> dict[int, QueryResult[R]]:
        """``{partition: QueryResult}`` in partition order (a new dict)."""
        return dict(sorted(self._results.items()))

    @property
    def position(self) -> Position:
        """The merge of every partition's position: feed it to
        ``PositionBound.at`` to make a later query at least this up to date."""
        merged = Position.empty()
        for result in self._results.values():
            merged = merged.merge(result.position)
        return merged

    def only_partition_result(self) -> QueryResult[R] | None:
        """The single meaningful partition result, for queries that expect one (a key
        query runs on the owning partition only).

        Meaningful means a failure, or a success with a non-``None`` result.  ``None``
        when there is none; ``ValueError`` naming the partitions when there are several.
        """
        meaningful = {
            p: r for p, r in sorted(self._results.items()) if r.is_failure or r.result is not None
        }
        if len(meaningful) > 1:
            raise ValueError(
                f"The query did not return exactly one partition result: partitions "
                f"{sorted(meaningful)} all returned a result or a failure"
            )
        return next(iter(meaningful.values()), None)

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{p}: {'success' if r.is_success else r.failure_reason.name}"
            for p, r in sorted(self._results.items())
        )
        return f"StateQueryResult({{{parts}}}, position={self.position!r})"
