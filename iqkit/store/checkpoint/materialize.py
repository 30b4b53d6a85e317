"""A replayed state version kept in the file cache: each (partition, version) of a
checkpoint's store is replayed and decoded once, on any machine, then served from a
RocksDB in the cache that chain stores use (``IQKIT_CACHE``).

The database's folder is named after the state files the version was rebuilt from (the
query's id and the snapshot and deltas, by name): Spark never changes a committed
version's files, so the same names are the same state, and a checkpoint deleted and
started again under the same path (a new query id) never meets an old database. A
second open of the version, in this process or another, pins the folder and reads it;
nothing in the checkpoint is read again. Building goes through ``partitions.builds``
(a temporary folder, one rename), so two processes opening the same version at once
both end up reading one database, and a build cut short is never served.

``open_partition`` is the one build path of a version's partition, for a reader
(``snapshot``) and for the helper process that builds ahead of it (``prebuild``): the
state replayed (``providers``), shaped a whole column at a time where the shape allows
(``shape.stored_columns``, the rows then written with no Python object per row) or row by
row, and sorted into one SST.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..cache import FileCache, PinnedFile
from ..names import CACHE_BUILDING_PREFIX, COMMIT_KEY
from ..objects import ObjectStore, check_key
from ..partitions import rocks
from ..partitions.builds import CachedDatabasePartition, build_in_cache, remove_stale_builds
from .layout import OperatorStore
from .providers import StateReader
from .shape import StateShape

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "StatePartition",
    "StoredColumns",
    "open_partition",
    "open_state_partition",
    "scratch_folder",
]

#: The cache's folder (under ``dbs/<root id>/``) holding checkpoint state databases.
_STATE_DIR = "spark-state"


class StatePartition(CachedDatabasePartition):
    """A state version's partition read from its database in the cache."""

    def __init__(
        self,
        folder: Path,
        version: int,
        pins: list[PinnedFile],
        *,
        built: bool,
        where: str,
        db: rocks.Rdict | None = None,
    ) -> None:
        super().__init__(folder, version, pins, db=db)
        #: Where the state is in the checkpoint (traces name it, not the cache's folder).
        self.location = where
        #: True when this open replayed the state and built the database.
        self.built = built


@dataclass(frozen=True)
class StoredColumns:
    """Rows to store: ``head`` (pairs of bytes, keys increasing), then ``keys`` and
    ``values``, Arrow ``binary`` columns of one length, keys strictly increasing and
    above ``head``'s."""

    head: list[tuple[bytes, bytes]]
    keys: pa.Array
    values: pa.Array


@contextlib.contextmanager
def scratch_folder(cache: FileCache, objects: ObjectStore) -> Iterator[Path]:
    """A private folder in ``cache`` for reading ``objects``' state outside a build (a
    RocksDB snapshot is restored in it while it is read), removed after. One a killed
    process left is named as a build in progress, and cleared as builds are."""
    root_id = cache.path_of(objects, "metadata").relative_to(cache.objects_dir).parts[0]
    parent = cache.dbs_dir / root_id / _STATE_DIR
    cache.make_folder(parent)
    remove_stale_builds(parent)
    with tempfile.TemporaryDirectory(prefix=CACHE_BUILDING_PREFIX, dir=parent) as tmp:
        yield Path(tmp)


def state_folder_in_cache(
    cache: FileCache, objects: ObjectStore, store: str, partition: int, version: int, files: str
) -> Path:
    """Where partition ``partition`` of ``store`` at ``version`` lives in ``cache``;
    ``files`` names the state files it is rebuilt from (hashed into the name)."""
    root_id = cache.path_of(objects, "metadata").relative_to(cache.objects_dir).parts[0]
    digest = hashlib.sha256(files.encode()).hexdigest()[:16]
    return (
        cache.dbs_dir
        / root_id
        / _STATE_DIR
        / check_key(store)
        / str(partition)
        / f"{version}-{digest}"
    )


def open_partition(
    reader: StateReader,
    shape: StateShape,
    store: OperatorStore,
    cache: FileCache,
    version: int,
    p: int,
    commit: bytes,
    *,
    building: Callable[[], object] = lambda: None,
) -> StatePartition:
    """Partition ``p`` of ``store`` at ``version``, from its database in ``cache``, built
    first if no process has built it; the database holds ``commit`` as its commit
    record. ``building`` is called first when this call is the one that builds."""
    files = reader.version_files(store, p, version)
    where = f"Spark state {reader.where(store, p, version)}"

    def rows(work_dir: Path) -> Iterable[tuple[bytes, bytes]] | StoredColumns:
        state = reader.state_rows(store, version, files, work_dir)
        head = [(COMMIT_KEY, commit)]
        columns = shape.stored_columns(state)
        if columns is not None:
            return StoredColumns(head, *columns)
        return itertools.chain(head, shape.store_rows(state))

    folder = state_folder_in_cache(cache, reader.objects, store.name, p, version, files.names)
    return open_state_partition(cache, folder, version, rows, where, building=building)


def open_state_partition(
    cache: FileCache,
    folder: Path,
    version: int,
    rows: Callable[[Path], Iterable[tuple[bytes, bytes]] | StoredColumns],
    where: str,
    *,
    building: Callable[[], object] = lambda: None,
) -> StatePartition:
    """The database ``folder`` (``state_folder_in_cache``), built first from ``rows``
    (iqkit's stored key and value bytes, any order; called only when no process has
    built it, with a private scratch folder of the cache) when it is not in the cache;
    ``building`` is called before a build."""
    pin = cache.pin_database(folder)
    if pin is not None:
        return StatePartition(folder, version, [pin], built=False, where=where)
    building()
    cache.make_folder(folder.parent)
    with tempfile.TemporaryDirectory(prefix=CACHE_BUILDING_PREFIX, dir=folder.parent) as tmp:
        sst = Path(tmp) / "state.sst"
        _write_sorted(sst, rows(Path(tmp) / "replay"))
        pin, built, kept = build_in_cache(cache, folder, [sst], [where])
    pins = [pin]
    db = None
    if kept is not None:
        # The build's scratch folder stays locked (and goes with the database handle)
        # while the partition reads through the handle the build kept open.
        pins.append(PinnedFile(kept.scratch, 0, kept.lock))
        rocks.remove_on_close(kept.db, kept.scratch)
        db = kept.db
    if built:
        cache.added(pin.size)
    return StatePartition(folder, version, pins, built=built, where=where, db=db)


def _write_sorted(sst: Path, rows: Iterable[tuple[bytes, bytes]] | StoredColumns) -> None:
    """``rows`` in key order (an SST takes its keys in byte order) into the SST ``sst``."""
    if isinstance(rows, StoredColumns):
        rocks.write_arrow_sst(sst, [(rows.keys, rows.values)], head=rows.head)
    else:
        rocks.write_sst(sst, iter(sorted(rows)))
