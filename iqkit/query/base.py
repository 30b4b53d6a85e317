"""The base class of every query, and the machinery iqkit's own queries share.

KIP-796 keeps ``Query<R>`` an empty marker so that anyone can invent a query type; the
store decides whether it can run it.  :class:`Query` is that marker here, ``R`` being
the result type.  iqkit's built-in queries additionally derive from the private
``_ImmutableQuery``, which makes them immutable values: built only through their named
factories, compared and hashed by their fields, and copied (never changed) by their
builder methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Concatenate, Generic, NoReturn, ParamSpec, Self, TypeVar

from .order import ResultOrder

__all__ = ["Query"]

R = TypeVar("R")
Q = TypeVar("Q")
P = ParamSpec("P")
T = TypeVar("T")


class Query(Generic[R]):
    """A query a state store may know how to execute, producing a result of type ``R``.

    Subclass it for a custom query; iqkit's stores answer queries they do not know
    with :attr:`~iqkit.query.FailureReason.UNKNOWN_QUERY_TYPE`.
    """

    __slots__ = ()


def _rebuild(cls: type[_ImmutableQuery[Any]], values: tuple[object, ...]) -> Any:
    return cls._build(**dict(zip(cls._FIELDS, values, strict=True)))


class _ImmutableQuery(Query[R]):
    """Value semantics for the built-in queries.

    A subclass lists its field names in ``_FIELDS`` and stores each in the slot
    ``"_" + name``; ``_FACTORIES`` names its factory methods for the error raised when
    someone calls the constructor directly.
    """

    __slots__ = ()
    _FIELDS: ClassVar[tuple[str, ...]] = ()
    _FACTORIES: ClassVar[str] = ""

    def __init__(self) -> None:
        # Like Kafka's private constructors: the named factories validate and say what
        # the query means; a bare constructor would do neither.
        name = type(self).__name__
        raise TypeError(f"{name} has no public constructor; use {self._FACTORIES}")

    @classmethod
    def _build(cls, **values: object) -> Self:
        obj = object.__new__(cls)
        for name in cls._FIELDS:
            object.__setattr__(obj, "_" + name, values[name])
        return obj

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, "_" + name) for name in self._FIELDS)

    def _replace(self, **changes: object) -> Self:
        values = dict(zip(self._FIELDS, self._values(), strict=True))
        values.update(changes)
        return self._build(**values)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _ImmutableQuery)
        return self._values() == other._values()

    def __hash__(self) -> int:
        # Raises TypeError for unhashable keys (a JSON list key), like a tuple would.
        return hash((type(self), self._values()))

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(
            f"{type(self).__name__} is immutable; its with_* methods return new queries"
        )

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle and copy would otherwise restore the slots through __setattr__.
        return (_rebuild, (type(self), self._values()))


class _OrderedQuery(_ImmutableQuery[R]):
    """A query whose iterator result can be requested in ascending or descending order
    (KIP-617's backward iteration, KIP-985's ``withDescendingKeys``)."""

    __slots__ = ()
    _order: ResultOrder

    @property
    def result_order(self) -> ResultOrder:
        """The requested order; ``ANY`` is served ascending."""
        return self._order

    def with_descending_keys(self) -> Self:
        """A copy returning the largest key (or newest window) first."""
        return self._replace(order=ResultOrder.DESCENDING)

    def with_ascending_keys(self) -> Self:
        """A copy returning the smallest key (or oldest window) first."""
        return self._replace(order=ResultOrder.ASCENDING)


class factory_or_builder(Generic[Q, P, T]):
    """A method that is a factory on the class and a copying builder on an instance.

    Kafka's ``RangeQuery.withLowerBound(lo)`` is a static factory; in Java, calling it on
    a query silently starts from scratch.  With this descriptor
    ``RangeQuery.with_lower_bound(1)`` is still the factory, while
    ``query.with_lower_bound(1)`` copies ``query`` and changes only what the method
    names, so ``RangeQuery.with_lower_bound(1).with_upper_bound(5)`` means 1..5.

    The wrapped function receives ``(cls, instance_or_None, *args)``.
    """

    def __init__(self, func: Callable[Concatenate[type[Q], Q | None, P], T]) -> None:
        self._func = func
        self.__doc__ = func.__doc__
        self.__name__ = func.__name__
        self.__qualname__ = func.__qualname__

    def __set_name__(self, owner: type, name: str) -> None:
        # The implementation may live outside the class; report it under its public name.
        self.__name__ = name
        self.__qualname__ = f"{owner.__qualname__}.{name}"

    def __get__(self, instance: Q | None, owner: type[Q]) -> Callable[P, T]:
        func = self._func

        def bound(*args: P.args, **kwargs: P.kwargs) -> T:
            return func(owner, instance, *args, **kwargs)

        bound.__doc__ = self.__doc__
        bound.__name__ = self.__name__
        bound.__qualname__ = self.__qualname__
        return bound


def require_key(key: object, query_name: str, what: str = "key") -> None:
    """Reject a ``None`` key: stores never hold one, so it is always a caller bug."""
    if key is None:
        raise ValueError(f"{query_name}: {what} must not be None")
