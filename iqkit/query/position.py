"""Positions and position bounds (KIP-796).

A :class:`Position` records how far a store partition has processed its inputs: for
every input ``topic`` and ``partition``, the offset of the last record applied.  Query
results carry the position of the partition that served them, and a caller can feed
the merged position of one answer back as a :class:`PositionBound` of the next request
to make sure later reads never go back in time.

Both classes are immutable values: every "modifying" method returns a new object, they
compare by value and they are hashable, so they can be dictionary keys, set members
and safely shared between threads and notebook cells.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any, NoReturn

__all__ = ["Position", "PositionBound"]

# (topic, ((partition, offset), ...)) sorted by topic, then by partition.
_Components = tuple[tuple[str, tuple[tuple[int, int], ...]], ...]

#: The smallest offset a component may hold.  Kafka uses -1 for "nothing consumed yet"
#: (and iqkit's lag computation counts a missing offset as -1), so -1 is accepted.
MIN_OFFSET = -1


def _as_int(value: object, what: str) -> int:
    """Return ``value`` as a plain ``int``; accept anything with ``__index__`` (numpy ints
    coming out of Spark or pandas) but not ``bool`` or ``float``, which are mistakes."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{what} must be an int, got {value!r} ({type(value).__name__})")
    return operator.index(value)  # type: ignore[arg-type]


def _check_topic(topic: object) -> str:
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a str, got {topic!r} ({type(topic).__name__})")
    return topic


def _check_partition(partition: object) -> int:
    p = _as_int(partition, "partition")
    if p < 0:
        raise ValueError(f"partition must be >= 0, got {p}")
    return p


def _check_offset(offset: object) -> int:
    o = _as_int(offset, "offset")
    if o < MIN_OFFSET:
        raise ValueError(f"offset must be >= {MIN_OFFSET}, got {o}")
    return o


def _freeze(m: Mapping[str, Mapping[int, int]]) -> _Components:
    """Normalise a nested map into the sorted tuple form; empty topics are dropped so
    that two positions with the same offsets always compare equal."""
    return tuple(
        (topic, tuple(sorted(parts.items()))) for topic, parts in sorted(m.items()) if parts
    )


class Position:
    """The vector ``topic -> partition -> offset`` of the last input records a store
    partition has applied.

    Build one with :meth:`empty`, :meth:`from_map` or :meth:`with_component`; combine
    several with :meth:`merge`.  Offsets are ints ``>= -1`` (``-1`` is Kafka's "nothing
    read yet"); partitions are ints ``>= 0``.  A topic without partitions is not kept,
    so ``Position.from_map({"t": {}}) == Position.empty()``.
    """

    __slots__ = ("_components", "_hash")
    _components: _Components
    _hash: int

    def __init__(self) -> None:
        # Kafka's constructor is private too: the factories validate, the constructor
        # would not, and one obvious way to build a Position is enough.
        raise TypeError("use Position.empty() or Position.from_map({...}) to build a Position")

    @classmethod
    def _of(cls, components: _Components) -> Position:
        obj = object.__new__(cls)
        object.__setattr__(obj, "_components", components)
        object.__setattr__(obj, "_hash", hash(components))
        return obj

    # -- factories -------------------------------------------------------------------

    @classmethod
    def empty(cls) -> Position:
        """A position with no components: "has not seen any input"."""
        return cls._of(())

    @classmethod
    def from_map(cls, m: Mapping[str, Mapping[int, int]]) -> Position:
        """A position holding a deep copy of ``{topic: {partition: offset}}``.

        Later changes to ``m`` do not affect the position.  Topics must be ``str``,
        partitions ints ``>= 0`` and offsets ints ``>= -1``.
        """
        if not isinstance(m, Mapping):
            raise TypeError(
                f"Position.from_map expects a mapping topic -> {{partition: offset}}, "
                f"got {type(m).__name__}"
            )
        copied: dict[str, dict[int, int]] = {}
        for topic, parts in m.items():
            t = _check_topic(topic)
            if not isinstance(parts, Mapping):
                raise TypeError(
                    f"the partitions of topic {t!r} must be a mapping partition -> offset, "
                    f"got {type(parts).__name__}"
                )
            copied[t] = {_check_partition(p): _check_offset(o) for p, o in parts.items()}
        return cls._of(_freeze(copied))

    # -- builders (each returns a new Position) --------------------------------------

    def with_component(self, topic: str, partition: int, offset: int) -> Position:
        """A new position with ``(topic, partition)`` at ``offset``, unless this position
        is already further along for that component: positions only move forward, so
        replaying an old record never makes a store look less up to date."""
        t, p, o = _check_topic(topic), _check_partition(partition), _check_offset(offset)
        m = self.to_map()
        parts = m.setdefault(t, {})
        parts[p] = max(o, parts.get(p, o))
        return self._of(_freeze(m))

    def merge(self, other: Position | None) -> Position:
        """A new position with every component of both, keeping the larger offset where
        both have one.  ``None`` merges as an empty position (Kafka's no-op)."""
        if other is None:
            return self._of(self._components)
        if not isinstance(other, Position):
            raise TypeError(f"can only merge a Position, got {type(other).__name__}")
        m = self.to_map()
        for topic, parts in other._components:
            mine = m.setdefault(topic, {})
            for p, o in parts:
                mine[p] = max(o, mine.get(p, o))
        return self._of(_freeze(m))

    # -- accessors -------------------------------------------------------------------

    @property
    def topics(self) -> set[str]:
        """The topics this position has components for (a new set)."""
        return {topic for topic, _ in self._components}

    def partition_positions(self, topic: str) -> dict[int, int]:
        """``{partition: offset}`` for ``topic`` (a new dict; empty for an unknown topic).
        Kafka calls this ``getPartitionPositions``."""
        for t, parts in self._components:
            if t == topic:
                return dict(parts)
        return {}

    def offset(self, topic: str, partition: int) -> int | None:
        """The offset recorded for ``(topic, partition)``, or ``None`` if there is none."""
        for t, parts in self._components:
            if t == topic:
                for p, o in parts:
                    if p == partition:
                        return o
                return None
        return None

    def to_map(self) -> dict[str, dict[int, int]]:
        """A deep copy as ``{topic: {partition: offset}}``, safe to modify."""
        return {topic: dict(parts) for topic, parts in self._components}

    @property
    def is_empty(self) -> bool:
        """True when the position has no components."""
        return not self._components

    # -- value semantics -------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Position):
            return NotImplemented
        return self._components == other._components

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Position({self.to_map()!r})"

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("Position is immutable; with_component() and merge() return new ones")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("Position is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        # Needed because the default slot-state restore would go through __setattr__.
        return (Position.from_map, (self.to_map(),))


#: ``PositionBound.unbounded()``, made once per class.
_UNBOUNDED: dict[type, Any] = {}


class PositionBound:
    """The position a store partition must have reached to serve a query.

    For every component of the bound, the partition's offset must be ``>=`` the bound's
    offset (the engine decides which components bind a partition).  An empty bound
    places no restriction, so ``PositionBound.at(Position.empty()) ==
    PositionBound.unbounded()``.
    """

    __slots__ = ("_position",)
    _position: Position

    def __init__(self) -> None:
        raise TypeError("use PositionBound.unbounded() or PositionBound.at(position)")

    @classmethod
    def unbounded(cls) -> PositionBound:
        """A bound any partition satisfies, however far behind it is (one shared
        instance: bounds are immutable, and every request starts with this one)."""
        bound = _UNBOUNDED.get(cls)
        if bound is None:
            bound = _UNBOUNDED[cls] = cls.at(Position.empty())
        return bound

    @classmethod
    def at(cls, position: Position) -> PositionBound:
        """A bound requiring at least ``position`` (typically a previous result's)."""
        if not isinstance(position, Position):
            raise TypeError(f"PositionBound.at expects a Position, got {type(position).__name__}")
        obj = object.__new__(cls)
        object.__setattr__(obj, "_position", position)
        return obj

    @property
    def is_unbounded(self) -> bool:
        """True when the bound's position is empty: nothing to wait for."""
        return self._position.is_empty

    @property
    def position(self) -> Position:
        """The position to reach (empty when unbounded)."""
        return self._position

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PositionBound):
            return NotImplemented
        return self._position == other._position

    def __hash__(self) -> int:
        return hash((PositionBound, self._position))

    def __repr__(self) -> str:
        if self.is_unbounded:
            return "PositionBound(unbounded)"
        return f"PositionBound(at={self._position!r})"

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("PositionBound is immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("PositionBound is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (PositionBound.at, (self._position,))
