"""Versions as data: a key's value at a time, its history, and what changed between two
versions (Kafka's KIP-960 ``VersionedKeyQuery`` and KIP-968 ``MultiVersionedKeyQuery``,
and a change feed like Spark's state reader's ``readChangeFeed``).

Every commit to a store publishes an immutable version, stamped with its commit time.
These queries read the versions a store still retains:

* ``VersionedKeyQuery``: the record of one key in one version (the latest served, the
  newest committed at or before a time, or a numbered one);
* ``MultiVersionedKeyQuery``: every distinct value one key had, each with the times it
  was valid from and to;
* ``ChangesQuery``: per partition, each key a version changed between two versions.

A value's ``timestamp`` is the commit time of the version that wrote it, ``valid_to``
that of the version that replaced or deleted it. History begins at the oldest retained
version: a value already there then carries that version's commit time (older commits'
records are gone). Writing a key's current value again changes nothing, so it starts no
new record and is no ``Change``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, NamedTuple, TypeVar

from .base import _ImmutableQuery, factory_or_builder, require_key
from .window import to_epoch_millis

__all__ = [
    "Change",
    "ChangesQuery",
    "MultiVersionedKeyQuery",
    "VersionedKeyQuery",
    "VersionedRecord",
]

K = TypeVar("K")
V = TypeVar("V")

#: What a ``Change`` did to its key.
ChangeKind = Literal["insert", "update", "delete"]
CHANGE_KINDS: tuple[str, ...] = ("insert", "update", "delete")


class VersionedRecord(NamedTuple, Generic[V]):
    """One value a key held, and when (Kafka's ``VersionedRecord``). A tuple, like
    ``KeyValue``: cheap to build by the thousand, and ``value, since, until, version =
    record`` unpacks it.

    ``timestamp``: epoch ms of the commit that wrote the value; ``valid_to``: epoch ms
    of the commit that replaced or deleted it (``None``: still the value in the newest
    version read); ``version``: the version whose commit wrote it (the oldest retained
    version when the value was already there then)."""

    value: V
    timestamp: int
    valid_to: int | None
    version: int

    def valid_at(self, millis: int) -> bool:
        """Whether the record was the key's value at epoch ms ``millis``."""
        return self.timestamp <= millis and (self.valid_to is None or millis < self.valid_to)


class Change(NamedTuple, Generic[K, V]):
    """One key changed by one version (a change feed's row; a tuple, like ``KeyValue``).

    ``kind``: ``"insert"`` (no value before), ``"update"`` or ``"delete"`` (no value
    after); ``value`` is the value after the change (``None`` for a delete) and
    ``old_value`` the one before (``None`` for an insert); ``version`` is the version
    that made it."""

    key: K
    kind: ChangeKind
    value: V | None
    old_value: V | None
    version: int


def _version_number(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be a version number (int), got {value!r}")
    if value < 1:
        raise ValueError(f"{what} must be a version number >= 1, got {value}")
    return value


class VersionedKeyQuery(_ImmutableQuery["VersionedRecord[V] | None"], Generic[K, V]):
    """The record of one key in one version; ``None`` when the key had no value there.

    By default the version served (the latest, or the engine's ``as_of``);
    ``.as_of(t)`` the newest retained version committed at or before ``t`` (a
    ``datetime`` or epoch ms), ``.as_of_version(n)`` version ``n``. A version
    retention removed is the partition's failure, naming the versions retained.

    >>> VersionedKeyQuery.with_key("alice").as_of_version(3)
    VersionedKeyQuery(key='alice', as_of_version=3)
    """

    __slots__ = ("_as_of_time", "_as_of_version", "_key")
    _FIELDS = ("key", "as_of_time", "as_of_version")
    _FACTORIES = "VersionedKeyQuery.with_key(key)"
    _key: K
    _as_of_time: int | None
    _as_of_version: int | None

    @classmethod
    def with_key(cls, key: K) -> VersionedKeyQuery[K, Any]:
        """The record of ``key`` in the version served (``None`` raises ``ValueError``)."""
        require_key(key, "VersionedKeyQuery")
        return cls._build(key=key, as_of_time=None, as_of_version=None)

    def as_of(self, time: int | datetime) -> VersionedKeyQuery[K, V]:
        """A copy reading the newest retained version committed at or before ``time``."""
        return self._replace(as_of_time=to_epoch_millis(time, "as_of"), as_of_version=None)

    def as_of_version(self, version: int) -> VersionedKeyQuery[K, V]:
        """A copy reading version ``version``."""
        number = _version_number(version, "as_of_version")
        return self._replace(as_of_version=number, as_of_time=None)

    @property
    def key(self) -> K:
        return self._key

    @property
    def as_of_time(self) -> int | None:
        """Epoch ms asked for with ``as_of`` (else ``None``)."""
        return self._as_of_time

    @property
    def version(self) -> int | None:
        """The version asked for with ``as_of_version`` (else ``None``)."""
        return self._as_of_version

    def __repr__(self) -> str:
        extra = ""
        if self._as_of_time is not None:
            extra = f", as_of={self._as_of_time}"
        elif self._as_of_version is not None:
            extra = f", as_of_version={self._as_of_version}"
        return f"VersionedKeyQuery(key={self._key!r}{extra})"


class MultiVersionedKeyQuery(_ImmutableQuery["list[VersionedRecord[V]]"], Generic[K, V]):
    """Every distinct value one key had across the retained versions, as
    ``VersionedRecord``s, newest first unless ``with_ascending_timestamps()``.

    ``from_time`` / ``to_time`` (epoch ms or ``datetime``, both inclusive) keep the
    records valid at some time between them, as Kafka's KIP-968 does: written at or
    before ``to_time`` and not replaced before ``from_time``. A delete ends a record's
    validity and adds no record.

    >>> MultiVersionedKeyQuery.with_key("alice").from_time(0).with_ascending_timestamps()
    MultiVersionedKeyQuery(key='alice', from_time=0, ascending=True)
    """

    __slots__ = ("_ascending", "_from_time", "_key", "_to_time")
    _FIELDS = ("key", "from_time", "to_time", "ascending")
    _FACTORIES = "MultiVersionedKeyQuery.with_key(key)"
    _key: K
    _from_time: int | None
    _to_time: int | None
    _ascending: bool

    @classmethod
    def with_key(cls, key: K) -> MultiVersionedKeyQuery[K, Any]:
        """Every record of ``key`` (``None`` raises ``ValueError``)."""
        require_key(key, "MultiVersionedKeyQuery")
        return cls._build(key=key, from_time=None, to_time=None, ascending=False)

    def from_time(self, time: int | datetime | None) -> MultiVersionedKeyQuery[K, V]:
        """A copy keeping records still valid at or after ``time`` (``None``: no bound)."""
        millis = None if time is None else to_epoch_millis(time, "from_time")
        return self._replace(from_time=millis)

    def to_time(self, time: int | datetime | None) -> MultiVersionedKeyQuery[K, V]:
        """A copy keeping records written at or before ``time`` (``None``: no bound)."""
        millis = None if time is None else to_epoch_millis(time, "to_time")
        return self._replace(to_time=millis)

    def with_ascending_timestamps(self) -> MultiVersionedKeyQuery[K, V]:
        """A copy returning the oldest record first."""
        return self._replace(ascending=True)

    def with_descending_timestamps(self) -> MultiVersionedKeyQuery[K, V]:
        """A copy returning the newest record first (the default, as in Kafka)."""
        return self._replace(ascending=False)

    @property
    def key(self) -> K:
        return self._key

    @property
    def from_time_ms(self) -> int | None:
        return self._from_time

    @property
    def to_time_ms(self) -> int | None:
        return self._to_time

    @property
    def is_ascending(self) -> bool:
        return self._ascending

    def keeps(self, record: VersionedRecord[Any]) -> bool:
        """Whether ``record`` falls within the query's time bounds."""
        if self._to_time is not None and record.timestamp > self._to_time:
            return False
        return not (
            self._from_time is not None
            and record.valid_to is not None
            and record.valid_to <= self._from_time
        )

    def __repr__(self) -> str:
        extra = ""
        if self._from_time is not None:
            extra += f", from_time={self._from_time}"
        if self._to_time is not None:
            extra += f", to_time={self._to_time}"
        if self._ascending:
            extra += ", ascending=True"
        return f"MultiVersionedKeyQuery(key={self._key!r}{extra})"


def _between(cls: type, query: Any, from_version: int, to_version: int | None = None) -> Any:
    """Changes made by the versions after ``from_version`` up to ``to_version`` (``None``:
    the version served)."""
    start = _version_number(from_version, "from_version")
    end = None if to_version is None else _version_number(to_version, "to_version")
    if end is not None and end < start:
        raise ValueError(f"ChangesQuery: to_version {end} is before from_version {start}")
    if query is None:
        return cls._build(from_version=start, to_version=end, lower=None, upper=None, prefix=None)
    return query._replace(from_version=start, to_version=end)


class ChangesQuery(_ImmutableQuery["list[Change[K, V]]"], Generic[K, V]):
    """Per partition, every key whose value the versions after ``from_version`` up to
    ``to_version`` changed, one ``Change`` per version that changed it, in version
    order then key order.

    ``with_range(lower, upper)`` (both inclusive, ``None`` open) or ``with_prefix(p)``
    keep the keys within them. Its cost follows the size of the changes: on the chain
    format it reads each version's delta files; where a compaction or an overwrite left
    none, it compares the two versions whole, and the trace says so.

    >>> ChangesQuery.between(3, 5).with_prefix("eu-")
    ChangesQuery(from_version=3, to_version=5, prefix='eu-')
    """

    __slots__ = ("_from_version", "_lower", "_prefix", "_to_version", "_upper")
    _FIELDS = ("from_version", "to_version", "lower", "upper", "prefix")
    _FACTORIES = "ChangesQuery.between(from_version, to_version)"
    _from_version: int
    _to_version: int | None
    _lower: Any
    _upper: Any
    _prefix: Any

    between = factory_or_builder(_between)

    def with_range(self, lower: K | None, upper: K | None) -> ChangesQuery[K, V]:
        """A copy keeping keys from ``lower`` to ``upper`` (inclusive; ``None`` open)."""
        return self._replace(lower=lower, upper=upper, prefix=None)

    def with_prefix(self, prefix: Any) -> ChangesQuery[K, V]:
        """A copy keeping keys whose serialized form starts with ``prefix``'s."""
        require_key(prefix, "ChangesQuery", "prefix")
        return self._replace(prefix=prefix, lower=None, upper=None)

    @property
    def from_version(self) -> int:
        return self._from_version

    @property
    def to_version(self) -> int | None:
        return self._to_version

    @property
    def lower_bound(self) -> Any:
        return self._lower

    @property
    def upper_bound(self) -> Any:
        return self._upper

    @property
    def prefix(self) -> Any:
        return self._prefix

    def __repr__(self) -> str:
        extra = ""
        if self._lower is not None or self._upper is not None:
            extra += f", lower={self._lower!r}, upper={self._upper!r}"
        if self._prefix is not None:
            extra += f", prefix={self._prefix!r}"
        return (
            f"ChangesQuery(from_version={self._from_version}, to_version={self._to_version}{extra})"
        )
