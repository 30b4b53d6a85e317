"""What a store's versions should say, worked out from the commits a test made (shared by
the version table and SQL tests; imported as ``version_model``).

``Commits`` writes each commit to a real store with ``StoreWriter`` and keeps the state
every version leaves, so a test derives the changes between two versions and a key's
history from what it wrote, never from what a reader returned."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import iqkit
from iqkit.store.chain.records import read_version
from iqkit.store.objects import open_objects


@dataclass(frozen=True)
class Expected:
    """One change: ``version`` changed ``key`` from ``old`` to ``value`` (None: none)."""

    version: int
    kind: str
    key: Any
    value: Any
    old: Any


class Commits:
    """Commits to ``store`` under ``root`` (created by the caller), and their states."""

    def __init__(self, root: Any, store: str) -> None:
        self.root = root
        self.store = store
        #: Version -> {key: value} after it (version 0: nothing).
        self.states: dict[int, dict[Any, Any]] = {0: {}}
        #: Version -> its commit time, epoch ms, as its record holds it.
        self.times: dict[int, int] = {}

    @property
    def latest(self) -> int:
        return max(self.states)

    def commit(self, writes: dict[Any, Any]) -> int:
        """One commit of ``writes`` (a value of ``None`` deletes the key); its version."""
        started = time.time()
        with iqkit.StoreWriter(self.root, self.store) as w:
            for key, value in writes.items():
                w.put(key, value)
        version = w.version
        assert version == self.latest + 1
        state = dict(self.states[self.latest])
        for key, value in writes.items():
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
        self.states[version] = state
        created = read_version(open_objects(self.root), self.store, version).created_at
        assert started <= created <= time.time()  # the record's time is this commit's
        self.times[version] = int(created * 1000)
        return version

    def changes(self, after: int, upto: int | None = None) -> list[Expected]:
        """Every key each version after ``after`` up to ``upto`` (default: the latest)
        changed, in version order then key order."""
        out = []
        for v in range(after + 1, (upto or self.latest) + 1):
            before, now = self.states[v - 1], self.states[v]
            for key in sorted(set(before) | set(now)):
                old, value = before.get(key), now.get(key)
                if old == value:
                    continue
                kind = "insert" if old is None else "delete" if value is None else "update"
                out.append(Expected(v, kind, key, value, old))
        return out

    def history(self, key: Any, oldest: int = 1) -> list[tuple[Any, int, int | None, int]]:
        """``(value, timestamp, valid_to, version)`` of each value ``key`` had from
        version ``oldest`` on, oldest first (a value already there at ``oldest`` carries
        ``oldest``'s time and number)."""
        records: list[list[Any]] = []
        for v in range(oldest, self.latest + 1):
            value = self.states[v].get(key)
            current = records[-1] if records and records[-1][2] is None else None
            if current is not None and current[0] == value:
                continue
            if current is not None:
                current[2] = self.times[v]
            if value is not None:
                records.append([value, self.times[v], None, v])
        return [tuple(r) for r in records]
