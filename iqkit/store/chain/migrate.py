"""``python -m iqkit migrate``: a folder-format store turned into a chain store, in place.

The folder format of earlier iqkits keeps, per store, ``LATEST`` (the latest version's
number), one record per version in ``versions/<n>.json`` (``{p: m}``: partition ``p``
as of version ``n`` is the RocksDB folder ``partitions/<p>/<m>/``, written by version
``m``; plus ``created_at``, ``source_end`` and ``metadata``) and each partition folder's
commit record under ``COMMIT_KEY``. This module reads just that, by itself (the folder
format's own modules are gone), and writes every retained version as a chain version:

* each partition folder becomes one SST holding all its keys (its commit record
  included), so a folder several versions share is one SST their chains share;
* each version keeps its number, ``created_at``, ``source_end`` and ``metadata`` (sink
  progress included), and each partition its commit record, byte for byte, and the
  version that wrote it (``written_by``).

The order of the steps is what makes it safe against a kill at any point:

1. under the store's commit lock, taken without waiting (a writer holding it is named,
   and nothing is done), the folder store is read and checked whole;
2. the chain's files (``sst/``, then ``chain/``) are written beside the folder files,
   while the manifest still says format 1: every iqkit reads the store as a folder store
   meanwhile (its ``LATEST`` says so), never a chain written half-way;
3. one ``os.replace`` of ``manifest.json`` (format 2) switches the store;
4. only then are the folder format's files removed.

A run killed before 3 left chain files nobody reads: the next run removes them and
starts again. A run killed after 3 left a chain store with folder files beside it: the
next run only removes those. A chain store is left as it is.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...errors import (
    StoreCorruptedError,
    StoreIOError,
    StoreLockedError,
    StoreNotFoundError,
    UnknownStoreError,
)
from ...query.request import validate_store_name
from ..integrity import checksum_file, seal_json
from ..manifest import StoreManifest
from ..names import (
    CHAIN_FORMAT_VERSION,
    CHAIN_RECORDS_DIR,
    CHAIN_SST_DIR,
    COMMIT_KEY,
    MANIFEST_FILE,
)
from ..objects import ObjectStore, open_objects
from ..partitions import rocks
from ..roots import parse_root
from .records import ChainFile, ChainVersion, PartitionChain, publish_version
from .stores import chain_commit_lock, chain_store_names
from .write import sst_key, work_folder

__all__ = ["MigrationReport", "migrate_root", "migrate_store", "store_names"]

# The folder format's names (it is gone; this module alone still reads them).
_LATEST = "LATEST"
_VERSIONS = "versions"
_PARTITIONS = "partitions"
_LEASES = "leases"
_JOBS = "jobs"
#: Everything the folder format keeps in a store's folder, removed once it is a chain
#: store (``writer.lock`` stays: chain writers on a local root lock it too).
_FOLDER_FILES = (_PARTITIONS, _VERSIONS, _LEASES, _JOBS, _LATEST)
_FOLDER_FORMAT_VERSION = 1
#: Who the commit lock's holder line names while a migration holds it.
_WHO = "python -m iqkit migrate"

#: Test-only: called with the name of each step as it is done (``"read"``,
#: ``"sst <p>/<m>"``, ``"record <n>"``, ``"switched"``, ``"removed <name>"``), so a
#: test can kill the process at each one. None in normal runs.
step_hook: Callable[[str], None] | None = None


def _step(name: str) -> None:
    if step_hook is not None:
        step_hook(name)


@dataclass(frozen=True)
class MigrationReport:
    """What ``migrate_store`` did to one store."""

    store: str
    #: ``"migrated"``, or ``"chain"`` (it was in the chain format already).
    outcome: str
    #: The versions migrated, ascending (none for a chain store).
    versions: tuple[int, ...] = ()
    #: Folder files removed from a store that was already switched (a run killed then).
    finished_cleanup: bool = False
    #: Versions an old-format reader still has open: their folder files stay (for now).
    leased: tuple[int, ...] = ()

    def line(self) -> str:
        """One line for people: ``totals: 4 versions migrated (3..6)``."""
        if self.outcome == "chain":
            text = f"{self.store}: already in the chain format"
            if self.finished_cleanup:
                text += " (the folder format's files left by an interrupted run removed)"
        else:
            n = len(self.versions)
            span = _span(self.versions)
            text = f"{self.store}: {n} version{'' if n == 1 else 's'} migrated" + (
                f" ({span})" if span else " (nothing was published)"
            )
        if self.leased:
            text += (
                f"; the folder format's files stay while a reader of version "
                f"{_span(self.leased)} has it open: run migrate again to remove them"
            )
        return text


def _span(numbers: tuple[int, ...]) -> str:
    if not numbers:
        return ""
    return f"{numbers[0]}..{numbers[-1]}" if len(numbers) > 1 else str(numbers[0])


# -- reading the folder format -----------------------------------------------------------
@dataclass(frozen=True)
class _FolderVersion:
    version: int
    partitions: dict[int, int]
    created_at: float
    source_end: dict[str, dict[int, int]] | None
    metadata: dict[str, Any]


def _damaged(store: str, what: str) -> StoreCorruptedError:
    return StoreCorruptedError(f"store {store!r} was not migrated: {what}")


def _no_link_below(store: str, folder: Path, path: Path) -> None:
    """Refuse ``path`` when it, or a folder between it and the store's ``folder``, is a
    symbolic link: the migration copies what it reads into the store, and a link could
    make it copy files from outside (iqkit never follows one below a root)."""
    while path != folder and path != path.parent:
        if path.is_symlink():
            raise _damaged(store, f"{path} is a symbolic link, which iqkit never follows")
        path = path.parent


def _read_text(store: str, path: Path) -> str | None:
    """``path``'s text, None when it is missing; unreadable or not UTF-8 is damage."""
    _no_link_below(store, path.parent.parent, path)  # the store's files, one level down
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise _damaged(store, f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise StoreIOError(f"store {store!r}: cannot read {path}: {exc.strerror or exc}") from None


def _read_manifest(store: str, folder: Path) -> dict[str, Any]:
    text = _read_text(store, folder / MANIFEST_FILE)
    if text is None:
        raise UnknownStoreError(store, chain_store_names(open_objects(folder.parent)))
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise _damaged(store, f"unreadable manifest {folder / MANIFEST_FILE}: {exc}") from None
    if not isinstance(data, dict):
        raise _damaged(store, f"unreadable manifest {folder / MANIFEST_FILE}")
    return data


def _chain_manifest(store: str, folder: Path, data: dict[str, Any]) -> str:
    """The manifest's text as a chain store's (format 2), all its settings kept;
    checked to be a manifest this iqkit reads."""
    text = seal_json(
        json.dumps({**data, "format_version": CHAIN_FORMAT_VERSION}, indent=2, sort_keys=True)
    )
    StoreManifest.parse(text, store, folder / MANIFEST_FILE)
    return text


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _read_folder_versions(store: str, folder: Path, partitions: int) -> list[_FolderVersion]:
    """The retained versions of the folder store in ``folder``, checked whole: every
    record readable, naming only partitions of the store and folders that hold a
    database (anything else is one line of ``StoreCorruptedError``)."""
    latest_text = _read_text(store, folder / _LATEST)
    try:
        names = os.listdir(folder / _VERSIONS)
    except (FileNotFoundError, NotADirectoryError):
        names = []
    numbers = sorted(
        int(stem)
        for stem, _, ext in (n.partition(".") for n in names)
        if ext == "json" and _is_number(stem)
    )
    if latest_text is None:
        if numbers:
            raise _damaged(store, f"{folder / _LATEST} is missing but version records are there")
        return []
    if not _is_number(latest_text.strip()):
        raise _damaged(store, f"{folder / _LATEST} is damaged: {latest_text[:40]!r}")
    latest = int(latest_text.strip())
    if latest and latest not in numbers:
        raise _damaged(store, f"LATEST names version {latest}, which has no record")
    return [_read_record(store, folder, n, partitions) for n in numbers if n <= latest]


def _read_record(store: str, folder: Path, version: int, partitions: int) -> _FolderVersion:
    path = folder / _VERSIONS / f"{version}.json"
    text = _read_text(store, path)
    if text is None:
        raise _damaged(store, f"{path} vanished while it was read")
    try:
        data = json.loads(text)
        record = _FolderVersion(
            version=int(data["version"]),
            partitions={int(p): int(m) for p, m in data["partitions"].items()},
            created_at=float(data.get("created_at", 0.0)),
            source_end=(
                None
                if data.get("source_end") is None
                else {
                    t: {int(p): int(o) for p, o in ps.items()}
                    for t, ps in data["source_end"].items()
                }
            ),
            metadata=dict(data.get("metadata") or {}),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _damaged(store, f"{path} is damaged: {exc}") from None
    if record.version != version:
        raise _damaged(store, f"{path} is damaged: it says version {record.version}")
    for p, m in record.partitions.items():
        if not 0 <= p < partitions or not 1 <= m <= version:
            raise _damaged(store, f"{path} is damaged: it lists partition {p} at version {m}")
        database = _partition_dir(folder, p, m)
        _no_link_below(store, folder, database)
        for entry in os.scandir(database) if database.is_dir() else ():
            _no_link_below(store, folder, Path(entry.path))
        if not rocks.database_exists(database):
            raise _damaged(
                store, f"{_partition_dir(folder, p, m)} (named by {path.name}) holds no database"
            )
    return record


def _partition_dir(folder: Path, partition: int, version: int) -> Path:
    return folder / _PARTITIONS / str(partition) / str(version)


# -- writing the chain ---------------------------------------------------------------------
def _write_partition_sst(
    objects: ObjectStore, store: str, folder: Path, partition: int, version: int, work: Path
) -> PartitionChain:
    """Partition folder ``partitions/<partition>/<version>`` as one SST on the root (all
    its keys, the commit record included); returns the one-file chain naming it.
    The folder is opened through ``rocks.open_for_read``'s private view: rocksdict
    writes its config into any folder it opens, and the folder must stay as it was
    until the switch."""
    source = _partition_dir(folder, partition, version)
    local = work / f"{partition}-{version}.sst"
    db = rocks.open_for_read(source)
    try:
        commit = db.get(COMMIT_KEY)
        if commit is None:
            raise _damaged(store, f"{source} has no commit record")
        try:
            rocks.write_sst(local, rocks.scan(db, b"", None))
        except Exception as exc:
            raise rocks.classify(exc, source) from exc
    finally:
        rocks.close_quietly(db)
    key = sst_key(store, partition, version)
    checksum = checksum_file(local)  # of the bytes uploaded (integrity.py)
    objects.put_immutable(key, local)
    size = local.stat().st_size
    local.unlink()
    chain = PartitionChain(
        files=(ChainFile(key, size, checksum=checksum),), commit=commit, written_by=version
    )
    chain.commit_record()  # a commit record the chain reader cannot parse is damage
    return chain


def _write_chain(
    objects: ObjectStore, store: str, folder: Path, versions: list[_FolderVersion]
) -> None:
    """Every version in ``versions`` as a chain version: SSTs first, then the records,
    oldest first (module docstring)."""
    needed = sorted({(p, m) for v in versions for p, m in v.partitions.items()})
    chains: dict[tuple[int, int], PartitionChain] = {}
    with work_folder() as work:
        for p, m in needed:
            chains[p, m] = _write_partition_sst(objects, store, folder, p, m, work)
            _step(f"sst {p}/{m}")
    for v in versions:
        record = ChainVersion(
            version=v.version,
            partitions={p: chains[p, m] for p, m in sorted(v.partitions.items())},
            created_at=v.created_at,
            source_end=v.source_end,
            metadata=v.metadata,
        )
        publish_version(objects, store, record)
        _step(f"record {v.version}")


def _remove_chain_files(folder: Path) -> None:
    """The chain files an interrupted run wrote before the switch (nobody reads them)."""
    for name in (CHAIN_RECORDS_DIR, CHAIN_SST_DIR):
        _remove(folder / name)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _switch(folder: Path, manifest_text: str) -> None:
    """Replace the manifest with the chain store's in one ``os.replace``, after both the
    new file and everything written before are on disk."""
    target = folder / MANIFEST_FILE
    tmp = folder / f".{MANIFEST_FILE}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(manifest_text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    _fsync_folder(folder)


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- after the switch ------------------------------------------------------------------------
def _leftovers(folder: Path) -> list[str]:
    """The folder format's files still in a chain store's folder, and temporary files
    of a manifest switch that was killed (``.manifest.json.<pid>.tmp``)."""
    names = [n for n in _FOLDER_FILES if os.path.lexists(folder / n)]
    with contextlib.suppress(OSError):
        names += sorted(
            n
            for n in os.listdir(folder)
            if n.startswith(f".{MANIFEST_FILE}.") and n.endswith(".tmp")
        )
    return names


def _leased_versions(folder: Path) -> tuple[int, ...]:
    """Versions an old-format reader has open: its lease is a shared ``flock`` on the
    version's record, so an exclusive one that cannot be taken means a live reader,
    whose partition folders must stay until it is done."""
    leased = []
    try:
        names = os.listdir(folder / _VERSIONS)
    except (FileNotFoundError, NotADirectoryError):
        return ()
    for name in names:
        stem, _, ext = name.partition(".")
        if ext != "json" or not _is_number(stem):
            continue
        try:
            fd = os.open(folder / _VERSIONS / name, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                leased.append(int(stem))
        finally:
            os.close(fd)
    return tuple(sorted(leased))


def _clean(folder: Path, names: Iterable[str]) -> None:
    for name in names:
        _remove(folder / name)
        _step(f"removed {name}")


# -- the entry points ------------------------------------------------------------------------
def _local_root(root: str | os.PathLike[str]) -> Path | None:
    """The root's folder (``StoreNotFoundError`` when there is none); None for an object
    root, which holds chain stores only (the folder format needs a POSIX file system)."""
    parsed = parse_root(root)
    if parsed.local is None:
        return None
    folder = Path(os.path.abspath(parsed.local))
    if not folder.is_dir():
        raise StoreNotFoundError(f"no iqkit root folder at {os.fspath(root)!r}")
    return folder


def migrate_store(root: str | os.PathLike[str], store: str) -> MigrationReport:
    """Turn folder store ``store`` under ``root`` into a chain store in place (module
    docstring); a chain store is left as it is. Raises ``StoreLockedError`` naming the
    holder while a writer holds the store's commit lock, ``UnknownStoreError`` /
    ``StoreNotFoundError`` for a store or root that is not there, and
    ``StoreCorruptedError`` for a damaged folder store; then nothing was changed."""
    store = validate_store_name(store)
    local = _local_root(root)
    if local is None:
        objects = open_objects(root)
        if not objects.exists(f"{store}/{MANIFEST_FILE}"):
            raise UnknownStoreError(store, chain_store_names(objects))
        return MigrationReport(store, "chain")
    folder = local / store
    data = _read_manifest(store, folder)
    if data.get("format_version") == CHAIN_FORMAT_VERSION and not _leftovers(folder):
        return MigrationReport(store, "chain")  # nothing to do, nothing touched
    objects = open_objects(local)
    try:
        lock = chain_commit_lock(objects, store, who=_WHO, timeout=0.0)
        with lock:
            return _migrate_locked(objects, store, folder)
    except StoreLockedError as exc:
        raise StoreLockedError(f"cannot migrate: {exc}") from None


def _migrate_locked(objects: ObjectStore, store: str, folder: Path) -> MigrationReport:
    data = _read_manifest(store, folder)  # again, under the lock
    version = data.get("format_version")
    if version == CHAIN_FORMAT_VERSION:
        return _finish(store, folder, MigrationReport(store, "chain", finished_cleanup=True))
    if version != _FOLDER_FORMAT_VERSION:
        raise _damaged(store, f"its manifest says format {version!r}, which is neither 1 nor 2")
    manifest_text = _chain_manifest(store, folder, data)
    folder_files = any(os.path.lexists(folder / n) for n in (_LATEST, _VERSIONS))
    if not folder_files and any((folder / d).is_dir() for d in (CHAIN_RECORDS_DIR, CHAIN_SST_DIR)):
        # A chain store an earlier iqkit wrote on object storage (format 1), copied down.
        return MigrationReport(store, "chain")
    partitions = json.loads(manifest_text)["partitions"]
    versions = _read_folder_versions(store, folder, partitions)
    _step("read")
    _remove_chain_files(folder)  # a killed run's, never read (module docstring)
    try:
        _write_chain(objects, store, folder, versions)
    except BaseException:
        with contextlib.suppress(OSError):
            _remove_chain_files(folder)
        raise
    _switch(folder, manifest_text)
    _step("switched")
    report = MigrationReport(store, "migrated", tuple(v.version for v in versions))
    return _finish(store, folder, report)


def _finish(store: str, folder: Path, report: MigrationReport) -> MigrationReport:
    """Remove the folder format's files from a switched store, unless an old-format
    reader still has a version open (then they stay, and the report says so)."""
    leased = _leased_versions(folder)
    if leased:
        return replace(report, leased=leased)
    try:
        _clean(folder, _leftovers(folder))
    except OSError as exc:
        raise StoreIOError(
            f"store {store!r} is in the chain format now, but removing the folder format's "
            f"files failed ({exc.strerror or exc}): run migrate again"
        ) from None
    return report


def migrate_root(
    root: str | os.PathLike[str], stores: Iterable[str] | None = None
) -> list[MigrationReport]:
    """``migrate_store`` for each of ``stores`` (default: every store under ``root``), in
    order; the first error stops it (stores before it are migrated)."""
    names = store_names(root) if stores is None else list(stores)
    return [migrate_store(root, s) for s in names]


def store_names(root: str | os.PathLike[str]) -> list[str]:
    """Every store under ``root`` (what ``migrate_root`` goes through by default)."""
    local = _local_root(root)
    return chain_store_names(open_objects(root if local is None else local))
