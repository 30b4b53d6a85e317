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
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cache import FileCache, PinnedFile
from ..names import CACHE_BUILDING_PREFIX, COMMIT_KEY
from ..objects import ObjectStore, check_key
from ..partitions import rocks
from ..partitions.builds import CachedDatabasePartition, build_in_cache, remove_stale_builds
from .codecs import StateFileError
from .layout import OperatorStore
from .providers import StateReader, VersionFiles
from .shape import StateShape
from .state_records import StateRows
from .unsafe_row import RowDecodeError

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
#: The rows iqkit stores for a state version depend on its files and on how iqkit shapes
#: them: bump this when the stored rows of any shape change, so a newer iqkit never
#: serves a database an older one built (the shape itself is in the name too).
_STORED_LAYOUT = 1
#: The commit record's entry saying how the rows were shaped (``stored_as``).
_STORED_AS = "stored_as"


def stored_as(shape: StateShape) -> str:
    """What a state database's rows were made by: the layout and the shape (its class,
    schemas and parts), as a short digest."""
    text = f"{_STORED_LAYOUT}\n{shape!r}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
        #: The older version whose database the build started from (``None``: none).
        self.base_version: int | None = None


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
    cache: FileCache,
    objects: ObjectStore,
    store: str,
    partition: int,
    version: int,
    files: str,
    shape: StateShape,
) -> Path:
    """Where partition ``partition`` of ``store`` at ``version`` lives in ``cache``;
    ``files`` names the state files it is rebuilt from and ``shape`` shapes its rows
    (both hashed into the name)."""
    root_id = cache.path_of(objects, "metadata").relative_to(cache.objects_dir).parts[0]
    digest = hashlib.sha256(f"{stored_as(shape)}\n{files}".encode()).hexdigest()[:16]
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
    files: VersionFiles | None = None,
) -> StatePartition:
    """Partition ``p`` of ``store`` at ``version``, from its database in ``cache``, built
    first if no process has built it; the database holds ``commit`` as its commit
    record, with the state files it was rebuilt from (``STATE_FILES``). ``building`` is
    called first when this call is the one that builds; ``files``: the version's files,
    when the caller listed them already (``StateReader.version_files``).

    A build starts from an older version's database in the cache where one was rebuilt
    from the same files as the start of this version's (the same snapshot and deltas,
    and this version only adds deltas): only the files added since are read, and only
    the keys they touch are decoded (``StateReader.changed_state``), in bulk where the
    shape allows."""
    files = files if files is not None else reader.version_files(store, p, version)
    where = f"Spark state {reader.where(store, p, version)}"
    folder = state_folder_in_cache(
        cache, reader.objects, store.name, p, version, files.names, shape
    )
    record = json.loads(commit)
    record[STATE_FILES] = files.names.split("\n")
    record[_STORED_AS] = stored_as(shape)
    head = [(COMMIT_KEY, json.dumps(record, sort_keys=True).encode())]
    base_version: list[int] = []

    def rows(work_dir: Path) -> Iterable[tuple[bytes, bytes]] | StoredColumns | OnOlderBuild:
        on_older = _on_older_build(reader, shape, store, cache, folder, version, files)
        if on_older is not None:
            base_version.append(on_older.version)
            on_older.changes.head = head
            return on_older
        state = reader.state_rows(store, version, files, work_dir)
        columns = shape.stored_columns(state)
        if columns is not None:
            return StoredColumns(head, *columns)
        return itertools.chain(head, shape.store_rows(state))

    try:
        part = open_state_partition(cache, folder, version, rows, where, building=building)
    except RowDecodeError as exc:
        # Bytes that came through a codec without a checksum (snappy, lzf, Spark's zstd)
        # and framed as records, but are no row of the schema: a damaged file, named.
        raise StateFileError(
            f"{where}: a row of {', '.join(files.keys)} does not decode (damaged?): {exc}"
        ) from None
    part.base_version = base_version[0] if base_version else None
    return part


@dataclass
class OnOlderBuild:
    """A version built on an older version's database: that database's table files
    (``ssts``, in the order they were ingested, pinned by ``pin`` until the build is
    done), then ``changes`` on top, as the SST chain layers its deltas."""

    version: int
    ssts: list[Path]
    changes: StoredChanges
    pin: PinnedFile


@dataclass
class StoredChanges:
    """What a version changes on top of an older one's database: stored keys and values
    (``None``: removed) as Arrow ``binary`` columns, any order (the bulk path's), or as a
    dict; ``head``: rows below every key (the commit record)."""

    keys: pa.Array | None = None
    values: pa.Array | None = None
    rows: dict[bytes, bytes | None] | None = None
    head: list[tuple[bytes, bytes]] = field(default_factory=list)

    def write(self, sst: Path) -> None:
        """The changes in key order into the SST ``sst`` (a removal as a tombstone)."""
        if self.rows is not None:
            rows = [*self.head, *sorted(self.rows.items())]
            rocks.write_changes_sst(sst, iter(rows))
            return
        import pyarrow.compute as pc

        assert self.keys is not None and self.values is not None
        order = pc.sort_indices(self.keys)
        rocks.write_arrow_sst(
            sst, [(self.keys.take(order), self.values.take(order))], head=self.head
        )


def _changes(shape: StateShape, puts: StateRows, removed: list[tuple[Any, ...]]) -> StoredChanges:
    """``puts`` and ``removed`` (key rows) as stored keys and values."""
    removed_keys = [key for row in removed for key in shape.stored_keys(row)]
    columns = shape.stored_columns(puts)
    if columns is not None:
        import pyarrow as pa
        import pyarrow.compute as pc

        keys, values = columns
        gone = pa.array(removed_keys, pa.binary())
        if not pc.any(pc.is_in(gone, keys)).as_py():  # each stored key once
            return StoredChanges(
                pa.concat_arrays([keys.cast(pa.binary()), gone]),
                pa.concat_arrays([values.cast(pa.binary()), pa.nulls(len(gone), pa.binary())]),
            )
    rows: dict[bytes, bytes | None] = dict(shape.store_rows(puts))
    rows.update(dict.fromkeys(removed_keys))
    return StoredChanges(rows=rows)


#: The commit record's field listing the state files a database was rebuilt from (the
#: query's id first): what tells a later version whether it can start from it.
STATE_FILES = "state_files"
#: How many older databases of a partition a build looks at before replaying in full.
_OLDER_BUILDS_TRIED = 3
#: A database of more table files than this is not built on (its reads would look in
#: every file); the version is replayed in full, into one.
_MOST_LAYERS = 8


def _on_older_build(
    reader: StateReader,
    shape: StateShape,
    store: OperatorStore,
    cache: FileCache,
    folder: Path,
    version: int,
    files: VersionFiles,
) -> OnOlderBuild | None:
    """How to build this version on an older version's database in the cache, where one
    was rebuilt from the start of this version's files; ``None`` otherwise."""
    if not shape.replays_changes:
        return None
    wanted = files.names.split("\n")
    older = []
    with contextlib.suppress(OSError), os.scandir(folder.parent) as entries:
        for entry in entries:
            number, _, _ = entry.name.partition("-")
            if number.isdigit() and int(number) < version and entry.is_dir():
                older.append((int(number), Path(entry.path)))
    for number, candidate in sorted(older, reverse=True)[:_OLDER_BUILDS_TRIED]:
        pin = cache.pin_database(candidate)
        if pin is None:
            continue
        keep = False
        try:
            read_pin = cache.pin_database(candidate)
            if read_pin is None:
                continue
            part = StatePartition(candidate, number, [read_pin], built=False, where=str(candidate))
            try:
                base_record = part.commit_record()
            finally:
                part.close()
            base_files = base_record.get(STATE_FILES)
            # RocksDB numbers table files in the order they were ingested.
            ssts = sorted(
                (f for f in candidate.glob("*.sst") if f.stem.isdigit()), key=lambda f: int(f.stem)
            )
            if (
                not isinstance(base_files, list)
                or not 0 < len(ssts) < _MOST_LAYERS
                or len(base_files) >= len(wanted)
                or wanted[: len(base_files)] != base_files
                or base_record.get(_STORED_AS) != stored_as(shape)
            ):
                continue
            changed = reader.changed_state(store, files, len(base_files) - 1)
            if changed is None:
                return None
            puts, removed = changed
            changes = _changes(shape, puts, removed)
            keep = True
            return OnOlderBuild(number, ssts, changes, pin)
        finally:
            if not keep:
                pin.release()
    return None


def open_state_partition(
    cache: FileCache,
    folder: Path,
    version: int,
    rows: Callable[[Path], Iterable[tuple[bytes, bytes]] | StoredColumns | OnOlderBuild],
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
        to_store = rows(Path(tmp) / "replay")
        if isinstance(to_store, OnOlderBuild):
            try:
                to_store.changes.write(sst)
                base = f"{where}: version {to_store.version}'s database"
                files = [*to_store.ssts, sst]
                names = [f"{base} ({f.name})" for f in to_store.ssts] + [where]
                pin, built, kept = build_in_cache(cache, folder, files, names)
            finally:
                to_store.pin.release()
        else:
            _write_sorted(sst, to_store)
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
