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
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from ..cache import FileCache, PinnedFile
from ..names import CACHE_BUILDING_PREFIX
from ..objects import ObjectStore, check_key
from ..partitions import rocks
from ..partitions.builds import CachedDatabasePartition, build_in_cache

__all__ = ["StatePartition", "open_state_partition"]

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


def open_state_partition(
    cache: FileCache,
    folder: Path,
    version: int,
    rows: Callable[[], Iterable[tuple[bytes, bytes]]],
    where: str,
) -> StatePartition:
    """The database ``folder`` (``state_folder_in_cache``), built first from ``rows``
    (iqkit's stored key and value bytes, any order; called only when no process has
    built it) when it is not in the cache."""
    pin = cache.pin_database(folder)
    if pin is not None:
        return StatePartition(folder, version, [pin], built=False, where=where)
    ordered = sorted(rows())  # an SST takes its keys in byte order
    cache.make_folder(folder.parent)
    with tempfile.TemporaryDirectory(prefix=CACHE_BUILDING_PREFIX, dir=folder.parent) as tmp:
        sst = Path(tmp) / "state.sst"
        rocks.write_sst(sst, iter(ordered))
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
