"""iqkit's own exceptions.

Request-level problems (an unknown store, a closed engine, bad arguments) are raised;
partition-level problems are reported as failed ``QueryResult``s, never raised
(KIP-796: "partitions' responses can succeed or fail independently").
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping


class IqkitError(Exception):
    """Base class of every exception iqkit raises on purpose."""


class UnknownStoreError(IqkitError, KeyError):
    """A request named a store that does not exist under the engine's root."""

    def __init__(
        self,
        name: str,
        known: Iterable[str] = (),
        *,
        where: str = "",
        notes: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.known = sorted(known)
        #: Where the stores were looked for, as the user wrote it ("" to leave it out).
        self.where = where
        #: A known store's note, shown after its name in the listing (why it may not be
        #: the store the user expects: an operator a damaged metadata file names).
        self.notes = dict(notes or {})
        super().__init__(name)

    def __str__(self) -> str:
        msg = f"unknown store {self.name!r}"
        if self.where:
            msg += f" in {self.where}"
        close = difflib.get_close_matches(self.name, self.known, n=1)
        if close:
            msg += f"; did you mean {close[0]!r}?"
        elif self.known:
            listed = (f"{n} ({self.notes[n]})" if n in self.notes else n for n in self.known)
            msg += f"; stores: {', '.join(listed)}"
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


class RootError(IqkitError, ValueError):
    """A store root that cannot be used as given: an unknown URL scheme, a scheme whose
    filesystem package is not installed (the message names the extra), a malformed URL,
    or an object-storage root where only local folders work yet. A ``ValueError`` too:
    it is bad input, and the CLI and ``%iq`` report those in one line."""


class ObjectExistsError(IqkitError, FileExistsError):
    """An exclusive create found the object already there (another writer published it
    first). Its own class so a writer can tell losing a race from an I/O failure."""


class VersionConflictError(ObjectExistsError):
    """Another writer published the same version number first. The loser's uploaded
    files stay on the root as orphans (unique names, listed by no record) for retention
    to remove; the winner's version is untouched."""


class StoreConflictError(IqkitError):
    """Another commit landed while a job (a Spark write: many tasks, one publish) was
    writing; the job published nothing and can simply be run again."""


class ObjectMissingError(StoreNotFoundError, FileNotFoundError):
    """An object that should be on a store root is not there."""


class VersionLimitError(IqkitError):
    """A chain store's version numbers are used up: its record names have a fixed number
    of digits (so a listing's order is numeric order), and a version past the highest
    would be published under a name no reader lists. The commit publishes nothing."""


class ReadOnlyStoreError(IqkitError):
    """A write (a commit, a new store, a job) was asked of a store whose format can only
    be read (a format that reads what another program writes: iqkit never changes it)."""


class FolderFormatStoreError(IqkitError):
    """The store is in the folder format of earlier iqkit versions, which this iqkit no
    longer reads or writes; the message names the command that converts it."""
