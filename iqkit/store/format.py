"""One storage format behind one interface: what a format does, whatever its files.

A store's bytes are laid out by one *format*. ``StoreFormat`` is everything the rest of
iqkit asks of one: the engine (reading), ``StoreWriter`` and ``create_store`` (a commit,
a new store), the Spark writers (a job commit: many tasks, one publish) and the data
source. Nothing outside a format's own modules asks which format a store is in; it asks
the format object for the root (``formats.format_for``), chosen once per root, the way
Spark picks one ``StateStoreProvider`` per query and then only calls its interface.

What every format hands back is format-neutral:

* a reader's ``StoreSnapshot`` of one store: the version served (pinned with ``as_of``
  or the latest), the retained versions, and a partition of a version as an
  ``OpenPartition`` (its query layers and position);
* ``PublishedVersion`` records: a version's number, when, its source's end offsets and
  its free-form facts (streaming sinks' batch ids live there);
* a ``Publisher`` (``StoreWriter``'s publish step) and a ``JobCommit`` whose ``spec``
  travels to the tasks.

A format may be read-only (``read_only``: one that reads what another program writes,
such as a Spark streaming checkpoint): every write, new store and job commit is then
refused in one line (``ReadOnlyStoreError``), here, before the format is asked.

Stores in the folder format of earlier iqkits are no longer read or written: opening
one (reader or writer) is one line naming the command that converts it
(``is_folder_store``, ``folder_store_error``).
"""

from __future__ import annotations

import contextlib
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Protocol

from ..errors import FolderFormatStoreError, IqkitError, ReadOnlyStoreError, UnknownStoreError
from ..query.position import Position
from .encoding.partitioners import Partitioner, get_partitioner
from .manifest import STORE_SETTINGS, StoreManifest
from .names import (
    FORMAT_VERSION,
    LATEST_FILE,
    MANIFEST_FILE,
    PARTITIONS_DIR,
    VERSIONS_DIR,
)
from .partitions.layers import ReadCache, TypedKeyValueLayer, TypedWindowLayer, build_layers
from .partitions.memory import MemoryPartition
from .partitions.partition import BytesPartition
from .roots import StoreRoot

__all__ = [
    "JOB_MODES",
    "MAX_OPEN_PARTITIONS",
    "NEVER_WRITTEN",
    "JobCommit",
    "check_job_mode",
    "close_unread",
    "OpenPartition",
    "PublishedVersion",
    "Publisher",
    "StoreFormat",
    "StoreSnapshot",
    "TwinFile",
    "TwinFiles",
    "empty_partition",
    "folder_store_error",
    "is_folder_store",
]

Layers = TypedKeyValueLayer | TypedWindowLayer

#: Partition versions a reader keeps open at once (each is a read-only RocksDB).
MAX_OPEN_PARTITIONS = 512

#: A job commit's modes: ``upsert`` keeps the keys the job does not write, ``overwrite``
#: leaves the store holding exactly what the job wrote.
JOB_MODES = ("upsert", "overwrite")


def check_job_mode(mode: str) -> None:
    """``ValueError`` unless ``mode`` is one of ``JOB_MODES``."""
    if mode not in JOB_MODES:
        raise ValueError(f"mode must be one of {JOB_MODES}, got {mode!r}")


#: Where the trace says an empty partition's (absent) rows come from.
NEVER_WRITTEN = "never written: empty"


class OpenPartition:
    """A partition of a version opened for queries: its layers and its position."""

    __slots__ = ("fetched", "layers", "never_written", "partition", "position")

    def __init__(
        self, partition: BytesPartition, layers: Layers, *, never_written: bool = False
    ) -> None:
        self.partition = partition
        self.layers = layers
        self.never_written = never_written
        self.position: Position = partition.commit_record().get("position") or Position.empty()
        #: What opening it cost (files fetched, cache hits, a database built), for the
        #: trace; None when there is nothing to say (a partition on a local root that
        #: this reader already had open).
        self.fetched: str | None = None


def close_unread(entries: list[OpenPartition]) -> list[OpenPartition]:
    """Close each of ``entries`` (partitions a reader moved on from) that no scan reads
    any more; the ones still read, to close later."""
    reading = []
    for entry in entries:
        if entry.partition.open_iterators:
            reading.append(entry)
        else:
            entry.partition.close()
    return reading


def empty_partition(manifest: StoreManifest) -> OpenPartition:
    """What a partition no commit has touched reads as: no rows, an empty position (one
    per store snapshot: it holds nothing, so every such partition can share it)."""
    empty = MemoryPartition(written_by_version=0, location=NEVER_WRITTEN)
    return OpenPartition(empty, build_layers(manifest, empty, ReadCache()), never_written=True)


class TwinFile:
    """One columnar twin of a version as a local file: ``path`` to read (the root's own
    file on a local root, else the cache's pinned copy), ``name`` its place on the root
    (what messages say: the cache's folders differ per machine)."""

    __slots__ = ("name", "path")

    def __init__(self, path: str, name: str) -> None:
        self.path = path
        self.name = name

    def __repr__(self) -> str:
        return f"TwinFile({self.name!r})"


class TwinFiles:
    """Every columnar twin of one version of a key-value store, as local files pinned
    until ``release`` (``StoreSnapshot.twin_files``): what a reader with its own Parquet
    reader (DuckDB) scans instead of asking for rows.

    ``partitions``: partition -> its twins, oldest first (the newest file holding a key
    has its row; a ``__deleted`` row there means none); partitions known to hold no rows
    are left out. ``layout``: what every file must record to be read
    (``columnar.twins.layout_of``)."""

    def __init__(
        self,
        version: int,
        partitions: dict[int, list[TwinFile]],
        layout: bytes,
        release: Callable[[], None] = lambda: None,
    ) -> None:
        self.version = version
        self.partitions = partitions
        self.layout = layout
        self._release: Callable[[], None] | None = release

    def release(self) -> None:
        """Unpin the files (idempotent): they may be evicted from the cache after this."""
        release, self._release = self._release, None
        if release is not None:
            release()


class PublishedVersion(Protocol):
    """What every format's version record says of itself."""

    version: int
    created_at: float
    #: The source's end offsets when the version was committed (a ``Position`` map).
    source_end: dict[str, dict[int, int]] | None
    #: Free-form facts about the commit (writer, Spark batch ids, the job).
    metadata: dict[str, Any]


class StoreSnapshot(Protocol):
    """One store as one reader sees it (``StoreFormat.open_snapshot``)."""

    manifest: StoreManifest

    def current(self) -> PublishedVersion | None:
        """The version served: pinned, or the latest (``None``: nothing published);
        raises ``IqkitError`` when it cannot be established."""

    def served(self) -> PublishedVersion | IqkitError | None:
        """``current()``, or why it cannot be read (every partition then fails with it)."""

    def latest_number(self) -> int | None: ...

    def versions(self) -> list[int]:
        """Versions still retained, ascending."""

    def partition(self, record: Any, p: int) -> OpenPartition:
        """Partition ``p`` as ``record`` (from ``current``) has it; never written: an
        empty partition. Raises ``IqkitError`` when it cannot be read."""

    def published(self, version: int, partition: int | None = None) -> PublishedVersion:
        """The record of retained version ``version`` (what ``partition`` takes); with
        ``partition``, one that may hold that partition alone (all a query of one key
        reads); raises ``IqkitError`` when it cannot be read."""

    def version_walk(self, p: int, records: Mapping[int, Any]) -> Any:
        """Partition ``p`` across ``records`` (version -> record from ``published``) for
        the version queries: a ``store.versions.VersionWalk``, closed by the caller."""

    def position(self, record: Any, p: int) -> Position:
        """Partition ``p``'s position in ``record`` (for lag: opens nothing if it can)."""

    def reading(self) -> contextlib.AbstractContextManager[object]:
        """What one query runs inside (e.g. failing fast once the root is unreachable)."""

    @property
    def serves_key_lookups(self) -> bool:
        """Whether routed key lookups may skip ``reading`` and take ``hot_partition``:
        the freshness check in ``current`` is cheap and an open partition's read needs
        no network (the engine's key-lookup path)."""

    def hot_partition(self, p: int) -> OpenPartition | None:
        """Partition ``p`` of the served version if a query already opened it through
        ``partition`` (else ``None``)."""

    def twin_files(self, record: Any) -> TwinFiles | None:
        """``record``'s columnar twins as local files, pinned (fetched into the cache if
        missing), when every partition with rows has them; else ``None`` (a store
        without twins, a window store). Raises ``IqkitError`` naming the partition when
        a file cannot be fetched."""

    def scan_bytes(self, record: Any) -> dict[int, int]:
        """Per partition of ``record``, the bytes a full scan of it reads (its twins
        where it has them, else its SSTs), from the version record alone: what a reader
        that spreads partitions over tasks weighs them by."""

    def close(self) -> None: ...


class Publisher(Protocol):
    """``StoreWriter``'s publish step for one store (``StoreFormat.publisher``)."""

    manifest: StoreManifest

    def latest_number(self) -> int | None: ...

    def publish(
        self,
        buffers: Mapping[int, Any],
        *,
        source_end: Position | None,
        metadata: Mapping[str, Any],
        who: str,
        lock_timeout: float,
        compaction: str = "inline",
    ) -> int:
        """Commit ``buffers`` (partition -> its changes, position and counts) as the next
        version; its number. ``compaction``: ``"background"`` (a chain made too long is
        compacted by a version of its own, on a thread: ``background`` is that thread)
        or ``"inline"`` (inside this commit)."""

    @property
    def background(self) -> Any:
        """The compaction the last publish started (a ``threading.Thread``), or None."""

    def compact(self, *, who: str, lock_timeout: float) -> int | None:
        """Compact every chain of the latest version that has deltas, as a version of its
        own (``iqkit.compact``); its number, or None when there was nothing to do."""


class JobCommit(Protocol):
    """The driver's side of a job commit (``StoreFormat.open_job_commit``): ``spec`` is
    picklable and goes to the tasks (``spec.stage``, ``spec.upload_runs``)."""

    spec: Any
    job_id: str
    version: int | None

    def __enter__(self) -> JobCommit: ...

    def __exit__(self, *exc_info: object) -> None: ...

    def stage_runs(self, partition: int, runs: Iterable[Any], **facts: Any) -> Any: ...

    def publish(
        self,
        staged: Iterable[Any],
        *,
        metadata: Mapping[str, Any] | None = None,
        source_end: Position | None = None,
    ) -> int: ...

    def adopt(self, staged: Iterable[Any]) -> None: ...

    def abort(self) -> None: ...


class StoreFormat(ABC):
    """One storage format on one root (module docstring). Subclasses implement the
    underscored write steps; the public ones refuse writes when ``read_only``."""

    #: The format's name in the registry (``formats.FORMATS``).
    name: ClassVar[str]
    #: A format iqkit only reads: writes, new stores and job commits are refused.
    read_only: ClassVar[bool] = False

    def __init__(self, root: StoreRoot) -> None:
        self.root = root

    # -- reading ---------------------------------------------------------------------------
    @abstractmethod
    def check_root(self) -> None:
        """For a reader: raise in one line when the root cannot be read at all (a local
        folder that is not there, a missing credential), so it is said once at open."""

    @abstractmethod
    def store_names(self) -> list[str]:
        """Names of the stores on the root, sorted."""

    @abstractmethod
    def read_manifest(self, store: str) -> StoreManifest:
        """``store``'s manifest; ``UnknownStoreError`` naming the stores when none."""

    def store_exists(self, store: str) -> bool:
        try:
            self.read_manifest(store)
        except UnknownStoreError:
            return False
        return True

    def partitioner(self, manifest: StoreManifest) -> Partitioner:
        """The partitioner that routes ``manifest``'s keys: by default the one its name
        gives; a format whose partitioner needs more than a name (Spark's hash needs the
        key's column types) returns one built for the store."""
        return get_partitioner(manifest.partitioner)

    @abstractmethod
    def open_snapshot(self, store: str, pinned: int | None) -> StoreSnapshot:
        """A reader's snapshot of ``store`` (``pinned``: serve that version, else
        ``ValueError`` naming the retained ones)."""

    @abstractmethod
    def latest_published(self, store: str) -> PublishedVersion | None:
        """``store``'s latest version record (None: nothing published, or no store)."""

    def verify(self, stores: list[str] | None, *, repair: bool = False) -> Any:
        """Check every file of every retained version of ``stores`` (default: all) against
        its checksum (``iqkit.verify``); a report with one entry per damaged file. A
        format that keeps no checksums of its own refuses in one line."""
        raise IqkitError(
            f"{self.root.text}: verify checks iqkit's own stores; this is a {self.name} "
            f"root, whose files its readers check as they read them"
        )

    # -- writing ---------------------------------------------------------------------------
    def ensure_store(
        self,
        manifest: StoreManifest,
        *,
        settings: tuple[str, ...] = STORE_SETTINGS,
        asked: str = "asked",
        create: bool = False,
    ) -> StoreManifest:
        """The existing store's manifest when its ``settings`` equal ``manifest``'s, else
        ``StoreExistsError`` naming each difference; a store not there yet gets
        ``manifest``, written only when ``create``."""
        self._refuse_writes(manifest.name, "create")
        return self._ensure_store(manifest, settings=settings, asked=asked, create=create)

    def publisher(self, store: str) -> Publisher:
        """``StoreWriter``'s publish step for ``store``."""
        self._refuse_writes(store, "commit to")
        return self._publisher(store)

    def open_job_commit(
        self,
        store: str,
        *,
        mode: str = "upsert",
        who: str = "job",
        lock_timeout: float = 60.0,
        create: StoreManifest | None = None,
    ) -> JobCommit:
        """A job commit on ``store`` (``create``: the manifest a store not there yet gets
        when the job publishes)."""
        self._refuse_writes(store, "run a job on")
        return self._open_job_commit(
            store, mode=mode, who=who, lock_timeout=lock_timeout, create=create
        )

    def collect_garbage(self, store: str, retain: int) -> list[str]:
        """Retention: remove what ``store``'s newest ``retain`` versions (and readers
        still within their grace) no longer need; what could not be removed, in words."""
        self._refuse_writes(store, "clean up")
        return self._collect_garbage(store, retain)

    def _refuse_writes(self, store: str, action: str) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(
                f"store {store!r} is in the {self.name} format, which iqkit only reads: "
                f"cannot {action} it"
            )

    @abstractmethod
    def _ensure_store(
        self, manifest: StoreManifest, *, settings: tuple[str, ...], asked: str, create: bool
    ) -> StoreManifest: ...

    @abstractmethod
    def _publisher(self, store: str) -> Publisher: ...

    @abstractmethod
    def _collect_garbage(self, store: str, retain: int) -> list[str]: ...

    @abstractmethod
    def _open_job_commit(
        self, store: str, *, mode: str, who: str, lock_timeout: float, create: StoreManifest | None
    ) -> JobCommit: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root.text!r})"


# -- the retired folder format ---------------------------------------------------------------
#: What only a folder-format store holds beside its manifest.
_FOLDER_MARKS = (LATEST_FILE, VERSIONS_DIR, PARTITIONS_DIR)


def is_folder_store(folder: str | os.PathLike[str]) -> bool:
    """Whether the local store folder ``folder`` is in the folder format of earlier
    iqkits: its manifest says ``format_version`` 1 and it holds the folder format's
    ``LATEST``, ``versions/`` or ``partitions/``, whether or not the chain format's
    ``chain/`` and ``sst/`` are there too (``python -m iqkit migrate`` writes those
    before it switches the manifest: until then the store is the folder store, whole).
    A format-1 manifest beside the chain's folders alone is a chain store an earlier
    iqkit made on object storage, copied down. Links are not followed."""
    path = os.fspath(folder)
    try:
        with open(os.path.join(path, MANIFEST_FILE), "rb") as fh:
            version = json.loads(fh.read()).get("format_version")
    except (OSError, ValueError, AttributeError):
        return False
    if version != FORMAT_VERSION:
        return False
    return any(os.path.lexists(os.path.join(path, m)) for m in _FOLDER_MARKS)


def folder_store_error(root: StoreRoot, store: str) -> FolderFormatStoreError:
    """The one line a folder store gets, naming the command that converts it."""
    return FolderFormatStoreError(
        f"store {store!r} is in the folder format of earlier iqkit versions; convert it "
        f"with: python -m iqkit migrate {root.text} {store}"
    )
