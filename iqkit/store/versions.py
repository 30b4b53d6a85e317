"""Version queries run on one partition: a key's record at a version, its history, and
the changes between two versions (iqkit/query/versions.py has the queries).

Every format hands the engine a ``VersionWalk`` for a partition over a run of retained
versions: the partition's bytes at any of them (``get``), the keys a version's commit
wrote when its files say so (``written_keys``: the chain format's delta files), and a
whole version's rows (``scan``) for the steps whose commit left no delta (a compaction,
an overwrite, a format that keeps none). ``OpenedVersionsWalk`` is the walk any format
has: each version's partition opened as a query of that version would open it. A
format with cheaper means gives its own walk (the chain format: store/chain/versions.py).

``VersionReader`` turns what a walk reads into the queries' typed results, the one
place their semantics live:

* a *record* is a run of consecutive retained versions holding the same value bytes;
  its ``timestamp`` is the commit time of the run's first version, its ``valid_to`` that
  of the version after its last (``None`` when the run reaches the newest version read);
* a *change* is a key whose value bytes differ between a version and the one before it
  (``insert`` from none, ``delete`` to none, else ``update``): writing the same value
  again is none, whether the step is read from a delta or compared whole.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Protocol

from ..query.versions import (
    Change,
    ChangesQuery,
    MultiVersionedKeyQuery,
    VersionedKeyQuery,
    VersionedRecord,
)
from .encoding import keyspace
from .encoding.serdes import get_serde
from .manifest import StoreManifest

__all__ = [
    "VERSION_QUERIES",
    "OpenedVersionsWalk",
    "Timeline",
    "VersionNotRetained",
    "VersionReader",
    "VersionWalk",
    "describe_retained",
]

#: The query types this module runs (the engine sends them here).
VERSION_QUERIES = (VersionedKeyQuery, MultiVersionedKeyQuery, ChangesQuery)


class VersionNotRetained(LookupError):
    """A query asked for a version the store no longer retains (or never published):
    the partition's ``DOES_NOT_EXIST`` failure, with this message."""


class VersionWalk(Protocol):
    """One partition across a run of retained versions (module docstring)."""

    def get(self, version: int, key: bytes) -> bytes | None:
        """``key``'s stored bytes in ``version`` (``None``: no value)."""

    def get_many(self, version: int, keys: list[bytes]) -> list[bytes | None]:
        """``get`` of each of ``keys``, in order."""

    def written_keys(self, version: int, lower: bytes, upper: bytes) -> list[bytes] | None:
        """The keys in ``[lower, upper)`` the commit of ``version`` wrote (puts and
        deletes; sorted), read from what that commit added; ``None`` when that is not
        known (the step is then compared whole)."""

    def scan(self, version: int, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every row of ``version`` in ``[lower, upper)``, in key order."""

    def notes(self) -> list[str]:
        """What the walk read, for the execution trace."""

    def close(self) -> None: ...


class OpenedVersionsWalk:
    """Any format's walk: each version's partition opened through the store's snapshot
    (``StoreSnapshot.partition``), as a query pinned to that version would. Correct for
    every format; its cost is a version's open per version read."""

    def __init__(self, snapshot: Any, partition: int, records: dict[int, Any]) -> None:
        self._snapshot = snapshot
        self._p = partition
        self._records = records
        self._opened: set[int] = set()

    def _partition(self, version: int) -> Any:
        self._opened.add(version)
        return self._snapshot.partition(self._records[version], self._p).partition

    def get(self, version: int, key: bytes) -> bytes | None:
        return self._partition(version).get(key)  # type: ignore[no-any-return]

    def get_many(self, version: int, keys: list[bytes]) -> list[bytes | None]:
        return self._partition(version).multi_get(keys)  # type: ignore[no-any-return]

    def written_keys(self, version: int, lower: bytes, upper: bytes) -> list[bytes] | None:
        return None

    def scan(self, version: int, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
        for chunk in self._partition(version).scan_chunks(lower, upper):
            yield from chunk

    def notes(self) -> list[str]:
        return [f"{len(self._opened)} versions opened one by one"]

    def close(self) -> None:
        self._records = {}


@dataclass(frozen=True)
class Timeline:
    """The retained versions a query reads (ascending) and each one's commit time."""

    versions: list[int]
    #: version -> epoch ms of its commit.
    times: dict[int, int]

    def at_or_before(self, millis: int) -> int | None:
        """The newest version committed at or before ``millis`` (None: none was)."""
        best = None
        for v in self.versions:
            if self.times[v] <= millis:
                best = v
        return best


def describe_retained(versions: Sequence[int]) -> str:
    """The retained versions in words, for failures."""
    if not versions:
        return "none"
    if len(versions) == 1:
        return f"version {versions[0]}"
    return f"versions {versions[0]}..{versions[-1]}"


class VersionReader:
    """Runs the version queries for one key-value store (module docstring)."""

    def __init__(self, manifest: StoreManifest) -> None:
        self.store = manifest.name
        self.key_serde = get_serde(manifest.key_serde)
        self.value_serde = get_serde(manifest.value_serde)

    def _key(self, key: Any, what: str = "key") -> bytes:
        try:
            return self.key_serde.serialize(key)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"store {self.store!r}: {what} {exc}") from None

    def _value(self, data: bytes | None) -> Any:
        return None if data is None else self.value_serde.deserialize(data)

    # -- which versions a query reads ------------------------------------------------------
    def versions_for(self, query: Any, retained: list[int], served: int) -> list[int]:
        """The retained versions ``query`` reads (ascending), up to ``served`` for the key
        queries; ``VersionNotRetained`` when it names one that is not retained."""
        upto = [v for v in retained if v <= served]
        if isinstance(query, ChangesQuery):
            start = query.from_version
            end = query.to_version if query.to_version is not None else served
            for v in (start, end):
                self._check_retained(v, retained)
            return [v for v in retained if start <= v <= end]
        if isinstance(query, VersionedKeyQuery) and query.version is not None:
            self._check_retained(query.version, upto, served)
        return upto

    def _check_retained(self, version: int, retained: list[int], served: int | None = None) -> None:
        if version in retained:
            return
        newest = retained[-1] if retained else 0
        if served is not None and version > served:
            why = f"version {version} is newer than the version served ({served})"
        elif version > newest:
            why = f"version {version} is not published"
        else:
            why = f"version {version} is no longer retained"
        raise VersionNotRetained(
            f"store {self.store!r}: {why}; retained: {describe_retained(retained)}"
        )

    # -- queries ---------------------------------------------------------------------------
    def execute(self, query: Any, walk: VersionWalk, timeline: Timeline) -> Any:
        if isinstance(query, VersionedKeyQuery):
            return self.versioned(query, walk, timeline)
        if isinstance(query, MultiVersionedKeyQuery):
            return self.history(query, walk, timeline)
        return self.changes(query, walk, timeline)

    def versioned(
        self, query: VersionedKeyQuery[Any, Any], walk: VersionWalk, timeline: Timeline
    ) -> VersionedRecord[Any] | None:
        versions = timeline.versions
        if not versions:
            return None
        if query.version is not None:
            target = query.version
        elif query.as_of_time is not None:
            found = timeline.at_or_before(query.as_of_time)
            if found is None:
                if versions[0] == 1:  # nothing was committed yet at that time
                    return None
                raise VersionNotRetained(
                    f"store {self.store!r}: no retained version was committed at or before "
                    f"{query.as_of_time} (epoch ms); retained: {describe_retained(versions)}, "
                    f"the oldest committed at {timeline.times[versions[0]]}"
                )
            target = found
        else:
            target = versions[-1]
        key = keyspace.kv_key(self._key(query.key))
        i = versions.index(target)
        value = walk.get(target, key)
        if value is None:
            return None
        first = i
        while first > 0 and walk.get(versions[first - 1], key) == value:
            first -= 1
        last = i
        while last + 1 < len(versions) and walk.get(versions[last + 1], key) == value:
            last += 1
        return self._record(value, versions, timeline, first, last)

    def _record(
        self, value: bytes, versions: list[int], timeline: Timeline, first: int, last: int
    ) -> VersionedRecord[Any]:
        ends = versions[last + 1] if last + 1 < len(versions) else None
        return VersionedRecord(
            value=self._value(value),
            timestamp=timeline.times[versions[first]],
            valid_to=None if ends is None else timeline.times[ends],
            version=versions[first],
        )

    def history(
        self, query: MultiVersionedKeyQuery[Any, Any], walk: VersionWalk, timeline: Timeline
    ) -> list[VersionedRecord[Any]]:
        versions = timeline.versions
        key = keyspace.kv_key(self._key(query.key))
        lo, hi = 0, len(versions) - 1
        # Only the versions the time bounds can reach are read, plus the runs around
        # them (a record valid at ``from_time`` may have been written long before).
        if query.to_time_ms is not None:
            newest = timeline.at_or_before(query.to_time_ms)
            hi = -1 if newest is None else versions.index(newest)
        if query.from_time_ms is not None:
            oldest = timeline.at_or_before(query.from_time_ms)
            lo = 0 if oldest is None else versions.index(oldest)
        records: list[VersionedRecord[Any]] = []
        if hi < lo:
            return records
        values = {i: walk.get(versions[i], key) for i in range(lo, hi + 1)}
        while lo > 0 and values[lo] is not None:
            before = walk.get(versions[lo - 1], key)
            if before != values[lo]:
                break
            lo -= 1
            values[lo] = before
        while hi + 1 < len(versions) and values[hi] is not None:
            after = walk.get(versions[hi + 1], key)
            if after != values[hi]:
                break  # the version after ``hi`` ends the last run: ``_record`` says when
            hi += 1
            values[hi] = after
        i = lo
        while i <= hi:
            value = values[i]
            if value is None:
                i += 1
                continue
            first = i
            while i + 1 <= hi and values[i + 1] == value:
                i += 1
            record = self._record(value, versions, timeline, first, i)
            if query.keeps(record):
                records.append(record)
            i += 1
        if not query.is_ascending:
            records.reverse()
        return records

    def changes(
        self, query: ChangesQuery[Any, Any], walk: VersionWalk, timeline: Timeline
    ) -> list[Change[Any, Any]]:
        lower, upper = self._bounds(query)
        versions = timeline.versions
        out: list[Change[Any, Any]] = []
        for before, version in pairwise(versions):
            keys = walk.written_keys(version, lower, upper)
            if keys is None:
                steps = _compare(walk.scan(before, lower, upper), walk.scan(version, lower, upper))
            else:
                old, new = walk.get_many(before, keys), walk.get_many(version, keys)
                steps = zip(keys, old, new, strict=True)
            changed = [step for step in steps if step[1] != step[2]]
            out.extend(self._changes(changed, version))
        return out

    def _changes(
        self, changed: list[tuple[bytes, bytes | None, bytes | None]], version: int
    ) -> list[Change[Any, Any]]:
        """``Change``s of one version's changed ``(key, old, new)`` stored rows: keys
        decoded in one call (a change feed of a 1% commit at 10M keys has 110,000)."""
        if not changed:
            return []
        keys = self.key_serde.deserialize_many([k for k, _, _ in changed], keyspace.RAW_PREFIX_LEN)
        value = self.value_serde.deserialize
        return [
            Change(
                key=key,
                kind="insert" if old is None else "delete" if new is None else "update",
                value=None if new is None else value(new),
                old_value=None if old is None else value(old),
                version=version,
            )
            for key, (_, old, new) in zip(keys, changed, strict=True)
        ]

    def _bounds(self, query: ChangesQuery[Any, Any]) -> tuple[bytes, bytes]:
        if query.prefix is not None:
            return keyspace.kv_prefix_range(self._key(query.prefix, "prefix"))
        lo = None if query.lower_bound is None else self._key(query.lower_bound, "lower bound")
        hi = None if query.upper_bound is None else self._key(query.upper_bound, "upper bound")
        if lo is not None and hi is not None and lo > hi:
            return keyspace.KV_LOWER, keyspace.KV_LOWER  # nothing: an empty success
        return keyspace.kv_range(lo, hi)


def _compare(
    older: Iterator[tuple[bytes, bytes]], newer: Iterator[tuple[bytes, bytes]]
) -> Iterator[tuple[bytes, bytes | None, bytes | None]]:
    """Merge two key-ordered scans: (key, old, new) for every key in either."""
    left = next(older, None)
    right = next(newer, None)
    while left is not None or right is not None:
        if right is None or (left is not None and left[0] < right[0]):
            assert left is not None
            yield left[0], left[1], None
            left = next(older, None)
        elif left is None or right[0] < left[0]:
            yield right[0], None, right[1]
            right = next(newer, None)
        else:
            yield left[0], left[1], right[1]
            left, right = next(older, None), next(newer, None)
