"""Store kinds: what a key-value store and a window store each are, in one place.

A manifest names its store's kind: ``"kv"`` (one value per key) or ``"window"`` (one
value per key and window start, windows of the manifest's ``window_size_ms``). Everything that
behaves differently per kind asks the :class:`StoreKind` rather than comparing that name:
the IQv2 query types the store runs (anything else is ``UNKNOWN_QUERY_TYPE``), the ``%iq``
commands that read it (the magic's kind check, the panel's buttons, completion), the
query that reads all of it, and how many RocksDB keys one record takes.

``StoreKind`` is a ``str`` enum so that ``manifest.kind`` still equals ``"kv"`` /
``"window"``, prints as it and is written to ``manifest.json`` as it: stores written
before it existed open unchanged, and users who compare the kind with a string keep
working.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..query import (
    ChangesQuery,
    KeyQuery,
    MultiKeyQuery,
    MultiVersionedKeyQuery,
    PrefixScanQuery,
    Query,
    RangeQuery,
    RawKeyQuery,
    RawScanQuery,
    VersionedKeyQuery,
    WindowKeyQuery,
    WindowRangeQuery,
)
from ..query.window import EARLIEST_EPOCH_MS, LATEST_EPOCH_MS

__all__ = [
    "EARLIEST_WINDOW_START_MS",
    "LATEST_WINDOW_START_MS",
    "QUERY_COMMANDS",
    "SCAN_COMMAND",
    "StoreKind",
]

#: Every window start a window store can hold: its time index keeps starts as 64-bit
#: signed epoch milliseconds (``keyspace.encode_time``), so "all time" is this range.
EARLIEST_WINDOW_START_MS = EARLIEST_EPOCH_MS
LATEST_WINDOW_START_MS = LATEST_EPOCH_MS

#: The ``%iq`` command that reads a whole store of either kind.
SCAN_COMMAND = "scan"


class StoreKind(StrEnum):
    """The kind of a store; its value is the name the manifest stores."""

    KEY_VALUE = "kv"
    WINDOW = "window"

    @classmethod
    def of(cls, value: Any, store: str) -> StoreKind:
        """The kind named ``value`` (a ``StoreKind`` or its name); ``ValueError`` naming
        ``store`` and the known kinds otherwise."""
        try:
            return cls(value)
        except ValueError:
            known = tuple(k.value for k in cls)
            message = f"store {store!r}: kind must be one of {known}, got {value!r}"
            raise ValueError(message) from None

    @property
    def windowed(self) -> bool:
        """Whether records are windows (a key, a window start and a value)."""
        return self is StoreKind.WINDOW

    @property
    def has_twins(self) -> bool:
        """Whether commits to stores of this kind write columnar twins of their SSTs
        (store/columnar/twins.py): key-value stores; window stores not yet."""
        return not self.windowed

    @property
    def label(self) -> str:
        """What users call a store of this kind ("key-value store", "window store")."""
        return _TRAITS[self].label

    @property
    def query_types(self) -> tuple[type[Query[Any]], ...]:
        """The IQv2 query types a store of this kind runs; others are refused."""
        return _TRAITS[self].query_types

    @property
    def own_commands(self) -> tuple[str, ...]:
        """The ``%iq`` query commands only stores of this kind answer."""
        return _TRAITS[self].own_commands

    @property
    def commands(self) -> tuple[str, ...]:
        """Every ``%iq`` query command a store of this kind answers, in the order the
        panel offers them (``scan``, which reads either kind, last)."""
        return (*self.own_commands, SCAN_COMMAND)

    def scan_query(self) -> Query[Any]:
        """The query that reads every record: all keys, or every window of all time."""
        if self.windowed:
            return WindowRangeQuery.with_window_start_range(
                EARLIEST_WINDOW_START_MS, LATEST_WINDOW_START_MS
            )
        return RangeQuery.with_no_bounds()

    def records_in(self, rocksdb_keys: int) -> int:
        """How many records ``rocksdb_keys`` keys of a store of this kind hold: one key
        per record in a key-value store, two per window in a window store (the window
        key and its time-index key, written and deleted together; see store/encoding/keyspace.py).
        Counts of what a write wrote (commit records, progress) are records, as
        ``StoreWriter`` counts them."""
        return rocksdb_keys // _TRAITS[self].keys_per_record


@dataclass(frozen=True)
class _Traits:
    label: str
    query_types: tuple[type[Query[Any]], ...]
    own_commands: tuple[str, ...]
    keys_per_record: int


_RAW = (RawKeyQuery, RawScanQuery)
_TRAITS = {
    StoreKind.KEY_VALUE: _Traits(
        label="key-value store",
        query_types=(
            KeyQuery,
            MultiKeyQuery,
            RangeQuery,
            PrefixScanQuery,
            *_RAW,
            # Versions as data (store/versions.py): not for window stores, whose keys
            # are (key, window) pairs with a time index beside them.
            VersionedKeyQuery,
            MultiVersionedKeyQuery,
            ChangesQuery,
        ),
        own_commands=("get", "range", "prefix", "history", "changes"),
        keys_per_record=1,
    ),
    StoreKind.WINDOW: _Traits(
        label="window store",
        query_types=(WindowKeyQuery, WindowRangeQuery, *_RAW),
        own_commands=("window", "windows"),
        keys_per_record=2,
    ),
}

#: Every ``%iq`` command that runs a state query, in the order ``%iq help`` lists them.
QUERY_COMMANDS = (*(c for kind in StoreKind for c in kind.own_commands), SCAN_COMMAND)
