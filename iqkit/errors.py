"""iqkit's own exceptions.

Request-level problems (an unknown store, a closed engine, bad arguments) are raised;
partition-level problems are reported as failed ``QueryResult``s, never raised
(KIP-796: "partitions' responses can succeed or fail independently").
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class IqkitError(Exception):
    """Base class of every exception iqkit raises on purpose."""


class UnknownStoreError(IqkitError, KeyError):
    """A request named a store that does not exist under the engine's root."""

    def __init__(self, name: str, known: Iterable[str] = ()) -> None:
        self.name = name
        self.known = sorted(known)
        super().__init__(name)

    def __str__(self) -> str:
        msg = f"unknown store {self.name!r}"
        close = difflib.get_close_matches(self.name, self.known, n=1)
        if close:
            msg += f"; did you mean {close[0]!r}?"
        elif self.known:
            msg += f"; stores: {', '.join(self.known)}"
        else:
            msg += "; there are no stores yet"
        return msg


class EngineClosedError(IqkitError):
    """The engine was closed; open a new one with ``iqkit.open``."""


class StoreExistsError(IqkitError, ValueError):
    """A store was asked for (``create_store``, a Spark write) with settings other than
    the existing store's. A ``ValueError`` too: the Spark writers raised that before they
    shared ``ensure_store``, and callers catching it keep working."""


class StoreLockedError(IqkitError):
    """Another writer holds the store's commit lock."""


class StoreCorruptedError(IqkitError):
    """RocksDB reported corruption in a partition, or a version record is unreadable."""


class StoreNotFoundError(IqkitError):
    """A path that should hold a store, partition or root holds nothing."""


class StoreIOError(IqkitError):
    """Any other RocksDB or file-system failure, with RocksDB's own message."""


class StoreCleanupWarning(UserWarning):
    """A commit was published, but removing what it made obsolete (old versions, debris)
    failed; the store is consistent and the next commit tries again."""
