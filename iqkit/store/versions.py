"""Published store versions: records, the LATEST pointer, readers' leases, retention.

A store version is a JSON record ``versions/<n>.json`` naming, for each partition that
has data, the folder ``partitions/<p>/<m>/`` (``m <= n``) holding that partition as of
version n. A commit writes only the partitions it touched; the others keep pointing at
their older folders. Folders are immutable once published.

Publishing is two atomic renames: the record, then ``LATEST``. A crash between them
leaves an unpublished record that the next commit overwrites.

Readers take a *lease* on each version they read: a file ``leases/<reader>.<n>`` they
hold a shared ``flock`` on. Retention removes old versions only when no live lease names
them; a lease whose holder died has no lock, so it is recognised as stale and removed.
Order of operations (reader: lease, then re-check the record exists; collector: delete the
record, then read leases) guarantees a reader never opens a folder being deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import StoreCorruptedError
from .layout import StoreLayout, atomic_write_text
from .names import JOB_STAGING_PREFIX, STAGING_PREFIX


@dataclass(frozen=True)
class VersionRecord:
    version: int
    #: partition -> the version whose commit wrote that partition's current folder
    partitions: dict[int, int]
    created_at: float = field(default_factory=time.time)
    #: The end offsets of the store's source when this version was committed, as a
    #: ``Position`` map (topic -> partition -> log-end offset), if the writer knew them.
    source_end: dict[str, dict[int, int]] | None = None
    #: Free-form facts about the commit (writer host/pid, Spark batch id, ...).
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.version,
                "partitions": {str(p): v for p, v in sorted(self.partitions.items())},
                "created_at": self.created_at,
                "source_end": _position_map_to_json(self.source_end),
                "metadata": self.metadata,
            },
            indent=1,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> VersionRecord:
        data = json.loads(text)
        return cls(
            version=int(data["version"]),
            partitions={int(p): int(v) for p, v in data["partitions"].items()},
            created_at=float(data.get("created_at", 0.0)),
            source_end=_position_map_from_json(data.get("source_end")),
            metadata=dict(data.get("metadata") or {}),
        )


def _position_map_to_json(m: dict[str, dict[int, int]] | None) -> Any:
    if m is None:
        return None
    return {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in sorted(m.items())}


def _position_map_from_json(data: Any) -> dict[str, dict[int, int]] | None:
    if data is None:
        return None
    return {t: {int(p): int(o) for p, o in ps.items()} for t, ps in data.items()}


# -- reading -------------------------------------------------------------------------------
def read_latest_number(layout: StoreLayout) -> int | None:
    """The latest published version number, or None when nothing was ever committed."""
    try:
        text = layout.latest.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    try:
        return int(text)
    except ValueError as exc:
        raise StoreCorruptedError(f"store {layout.name!r}: unreadable LATEST {text!r}") from exc


def read_version(layout: StoreLayout, version: int) -> VersionRecord:
    path = layout.version_record(version)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LookupError(version) from None
    try:
        return VersionRecord.from_json(text)
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreCorruptedError(f"store {layout.name!r}: unreadable {path}: {exc}") from exc


def list_versions(layout: StoreLayout) -> list[int]:
    """Published version numbers still on disk (retained), ascending."""
    latest = read_latest_number(layout)
    if latest is None:
        return []
    out = []
    try:
        names = os.listdir(layout.versions_dir)
    except FileNotFoundError:
        return []
    for name in names:
        stem, _, ext = name.partition(".")
        if ext == "json" and stem.isdigit() and int(stem) <= latest:
            out.append(int(stem))
    return sorted(out)


# -- publishing ----------------------------------------------------------------------------
def publish(layout: StoreLayout, record: VersionRecord) -> None:
    """Make ``record`` the latest version: record first, then the LATEST pointer."""
    layout.versions_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(layout.version_record(record.version), record.to_json())
    atomic_write_text(layout.latest, f"{record.version}\n")


# -- readers' leases -----------------------------------------------------------------------
class Lease:
    """A claim held by a live process: a file it holds a shared ``flock`` on.

    The kernel drops the lock when the holder dies, so a collector tells live leases
    from stale ones by trying an exclusive lock (``live_lease_names``).
    """

    __slots__ = ("_fd", "path")

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd: int | None = None
        while True:
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(fd, fcntl.LOCK_SH)
            # Between create and lock, a collector may have seen the file unlocked and
            # removed it as stale: then our lock is on a file nobody can see. Retry
            # until the locked file is the one at the path.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return
            os.close(fd)

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None


class ReaderLease(Lease):
    """A reader's claim on one version: retention will not delete what it names."""

    __slots__ = ("version",)

    def __init__(self, layout: StoreLayout, version: int, reader_id: str) -> None:
        self.version = version
        super().__init__(layout.leases_dir / f"{reader_id}.{version}")


def live_lease_names(folder: Path) -> set[str]:
    """Names of the leases in ``folder`` whose holders are alive; stale ones are removed."""
    live: set[str] = set()
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return live
    for name in names:
        path = folder / name
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            live.add(name)  # a live holder has it
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # its holder died: the lease is stale
        finally:
            os.close(fd)
    return live


def new_reader_id() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def live_leased_versions(layout: StoreLayout) -> set[int]:
    """Versions some live reader holds a lease on; stale leases are removed on the way."""
    versions = (name.rpartition(".")[2] for name in live_lease_names(layout.leases_dir))
    return {int(v) for v in versions if v.isdigit()}


# -- retention -----------------------------------------------------------------------------
def collect_garbage(layout: StoreLayout, retain: int) -> list[int]:
    """Remove versions older than the newest ``retain`` that no live reader leases.

    Returns the version numbers whose records were removed. A partition folder is deleted
    once no retained version points at it and no live lease protects it. Runs under the
    writer's lock, so no commit is staging folders meanwhile.
    """
    versions = list_versions(layout)
    expired = versions[:-retain] if len(versions) > retain else []
    # Unpublish the expired records first, then read the leases (see module docstring).
    for v in expired:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(layout.version_record(v))
    _remove_stale_temp_files(layout)
    leased = live_leased_versions(layout)
    kept = [v for v in versions if v not in expired]
    _remove_unreferenced_folders(layout, kept, _leased_folders(layout, leased))
    return expired


def _remove_stale_temp_files(layout: StoreLayout) -> None:
    """Temp files of atomic writes killed mid-way (``.<name>.<pid>.tmp``); safe to remove
    under the writer lock, the only place such files are written."""
    for folder in (layout.store_dir, layout.versions_dir):
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            continue
        for name in names:
            if name.startswith(".") and name.endswith(".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(folder / name)


def _job_of(folder_name: str) -> str:
    """``.job-<job id>-<attempt>`` → ``<job id>``."""
    return folder_name[len(JOB_STAGING_PREFIX) :].partition("-")[0]


def _leased_folders(layout: StoreLayout, leased: set[int]) -> set[tuple[int, int]]:
    """Folders of leased versions whose records were already unpublished.

    Their records are gone, but a lease on version v protects every folder with
    ``version <= v`` in each partition (the one v pointed at is the newest such).
    """
    protected: set[tuple[int, int]] = set()
    if not leased or not layout.partitions_dir.exists():
        return protected
    for pname in os.listdir(layout.partitions_dir):
        if not pname.isdigit():
            continue
        folders = sorted(
            int(f) for f in os.listdir(layout.partition_dir(int(pname))) if f.isdigit()
        )
        for v in leased:
            older = [f for f in folders if f <= v]
            if older:
                protected.add((int(pname), older[-1]))
    return protected


def _remove_unreferenced_folders(
    layout: StoreLayout,
    kept_versions: list[int],
    protected: set[tuple[int, int]],
) -> None:
    referenced = set(protected)
    for v in kept_versions:
        try:
            rec = read_version(layout, v)
        except LookupError:
            continue
        referenced.update(rec.partitions.items())
    if not layout.partitions_dir.exists():
        return
    latest = read_latest_number(layout) or 0
    live_jobs = live_lease_names(layout.jobs_dir)
    for pname in os.listdir(layout.partitions_dir):
        if not pname.isdigit():
            continue
        p = int(pname)
        pdir = layout.partition_dir(p)
        for fname in os.listdir(pdir):
            stale_staging = fname.startswith(STAGING_PREFIX) or (
                fname.startswith(JOB_STAGING_PREFIX) and _job_of(fname) not in live_jobs
            )
            # Folders above LATEST were left by a commit that crashed before publishing.
            unreferenced = fname.isdigit() and (
                int(fname) > latest or (p, int(fname)) not in referenced
            )
            if stale_staging or unreferenced:
                target = pdir / fname
                if target.is_dir():
                    shutil.rmtree(target, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        target.unlink()
