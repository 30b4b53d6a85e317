"""Published store versions: records, the LATEST pointer, readers' leases, retention.

A store version is a JSON record ``versions/<n>.json`` naming, for each partition that
has data, the folder ``partitions/<p>/<m>/`` (``m <= n``) holding that partition as of
version n. A commit writes only the partitions it touched; the others keep pointing at
their older folders. Folders are immutable once published.

Publishing is two atomic renames: the record, then ``LATEST``. A crash between them
leaves an unpublished record (above ``LATEST``) that the next commit overwrites. The
first publish writes ``LATEST`` = 0 before anything else, so once a store has data a
missing ``LATEST`` can only mean damage: then, and when ``LATEST`` names a record that is
not there, which version is published cannot be established. Readers report that
(``StoreCorruptedError`` naming the file) and writers refuse to commit, because
publishing "version 1" on top would garbage-collect every folder the lost versions named.

Readers lease the versions they read without writing anything into the store: a lease is
a shared ``flock`` on the version's record. ``flock`` needs only a read-only descriptor
(it works on read-only files and mounts), changes no byte and no mtime, and the kernel
drops it when the holder dies, so a dead reader's lease expires by itself. Retention
takes an exclusive, non-blocking ``flock`` on an expired record and unlinks it while
holding it; a record it cannot lock is leased, and stays, with every folder it names. A
reader locks, then checks the path still names the file it locked (retention may have
unlinked it in between), and reads the record through the locked descriptor: so a reader
never opens a folder that retention is deleting.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Self, TypeVar

from ..errors import IqkitError, StoreCorruptedError, StoreIOError
from ..query.position import Position
from .layout import (
    StoreLayout,
    atomic_write_text,
    decode_store_text,
    read_store_text,
    remove_tree_or_file,
)
from .names import JOB_STAGING_PREFIX, STAGING_PREFIX
from .sinks import carry_forward as carry_sinks_forward

T = TypeVar("T")
P = TypeVar("P")


@dataclass(frozen=True)
class PublishedVersion(Generic[P]):
    """What every store version record holds, whatever the format: the version, one
    entry per partition that has data (its type is the format's: a folder's version
    number here, an SST chain on object roots, ``chain.ChainVersion``), when, the
    source's end offsets and free-form facts. One JSON layout for all of them."""

    version: int
    partitions: dict[int, P]
    created_at: float = field(default_factory=time.time)
    #: The end offsets of the store's source when this version was committed, as a
    #: ``Position`` map (topic -> partition -> log-end offset), if the writer knew them.
    source_end: dict[str, dict[int, int]] | None = None
    #: Free-form facts about the commit (writer host/pid, Spark batch id, ...).
    metadata: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def partition_to_json(entry: P) -> Any:
        """One partition's entry as JSON (the format's subclass says how)."""
        raise NotImplementedError

    @staticmethod
    def partition_from_json(data: Any) -> P:
        raise NotImplementedError

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.version,
                "partitions": {
                    str(p): self.partition_to_json(e) for p, e in sorted(self.partitions.items())
                },
                "created_at": self.created_at,
                "source_end": _position_map_to_json(self.source_end),
                "metadata": self.metadata,
            },
            indent=1,
            sort_keys=True,
        )

    @classmethod
    def parse(cls, text: str | bytes, version: int, where: str) -> Self:
        """The record of ``version`` read from ``where`` (a file or an object key):
        ``StoreCorruptedError`` when it cannot be parsed or names another version."""
        try:
            record = cls.from_json(text)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise StoreCorruptedError(f"{where} is damaged: {exc}") from exc
        if record.version != version:
            raise StoreCorruptedError(f"{where} is damaged: it says version {record.version}")
        return record

    def check_partitions(self, partitions: int, where: str) -> Self:
        """This record, when every partition it lists is one of the store's
        (``0 .. partitions - 1``, the manifest's count); else ``StoreCorruptedError``
        naming ``where``: a record listing partition 10**9 of a two-partition store is
        damage, which readers report and never open or iterate over. Readers check each
        record they serve (the record alone does not know the manifest)."""
        for p in self.partitions:
            if not 0 <= p < partitions:
                raise StoreCorruptedError(
                    f"{where} is damaged: it lists partition {p}, and the store has "
                    f"{partitions} (0..{partitions - 1})"
                )
        return self

    @classmethod
    def from_json(cls, text: str | bytes) -> Self:
        data = json.loads(text)
        return cls(
            version=int(data["version"]),
            partitions={int(p): cls.partition_from_json(e) for p, e in data["partitions"].items()},
            created_at=float(data.get("created_at", 0.0)),
            source_end=_position_map_from_json(data.get("source_end")),
            metadata=dict(data.get("metadata") or {}),
        )


def next_record(
    previous: PublishedVersion[P] | None,
    version: int,
    written: Mapping[int, P],
    *,
    source_end: Position | None,
    metadata: Mapping[str, Any],
    who: str,
    replace_all: bool = False,
) -> tuple[dict[int, P], dict[str, dict[int, int]] | None, dict[str, Any]]:
    """What the record of ``version`` holds, in every format: its partitions, source end
    offsets and metadata, given the ``previous`` record and the partitions this commit
    ``written``. The one home of what a version carries forward:

    * partitions the commit did not write keep their entries (an overwrite,
      ``replace_all``, keeps none);
    * source end offsets only grow: they merge with the previous ones;
    * streaming sinks' last batch ids carry forward (``sinks.carry_forward``), so any
      later version still recognises a replayed batch;
    * the writer (``who``, pid, host) and the partitions written are recorded.
    """
    if previous is not None and previous.source_end is not None:
        source_end = Position.from_map(previous.source_end).merge(source_end)
    kept = {} if replace_all or previous is None else previous.partitions
    sinks = carry_sinks_forward(
        previous.metadata if previous else None, metadata.get("sinks", {}), version
    )
    return (
        {**kept, **written},
        source_end.to_map() if source_end is not None else None,
        {
            **metadata,
            **({"sinks": sinks} if sinks else {}),
            "writer": {"who": who, "pid": os.getpid(), "host": socket.gethostname()},
            "partitions_written": sorted(written),
        },
    )


@dataclass(frozen=True)
class VersionRecord(PublishedVersion[int]):
    """A local store's version: partition -> the version whose commit wrote that
    partition's current folder."""

    partition_to_json = staticmethod(int)
    partition_from_json = staticmethod(int)


def _position_map_to_json(m: dict[str, dict[int, int]] | None) -> Any:
    if m is None:
        return None
    return {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in sorted(m.items())}


def _position_map_from_json(data: Any) -> dict[str, dict[int, int]] | None:
    if data is None:
        return None
    return {t: {int(p): int(o) for p, o in ps.items()} for t, ps in data.items()}


# -- reading -------------------------------------------------------------------------------
def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _record_numbers(layout: StoreLayout) -> list[int]:
    """Numbers of the version records on disk (published or not), ascending."""
    try:
        names = os.listdir(layout.versions_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    stems = (name.partition(".") for name in names)
    return sorted(int(stem) for stem, _, ext in stems if ext == "json" and _is_number(stem))


def _published_data(layout: StoreLayout) -> str | None:
    """What shows a store has published data (for when ``LATEST`` is missing)."""
    records = _record_numbers(layout)
    if records:
        return f"version records ({describe_versions(records)}) in {layout.versions_dir}"
    try:
        partitions = os.listdir(layout.partitions_dir)
    except (FileNotFoundError, NotADirectoryError):
        return None
    for pname in partitions:
        with contextlib.suppress(OSError):
            if any(_is_number(f) for f in os.listdir(layout.partitions_dir / pname)):
                return f"partition folders in {layout.partitions_dir}"
    return None


def describe_versions(numbers: list[int]) -> str:
    """``6..8``, ``3`` or ``none``: version numbers (ascending) in messages."""
    if not numbers:
        return "none"
    return f"{numbers[0]}..{numbers[-1]}" if len(numbers) > 1 else str(numbers[0])


def no_such_version(store: str, version: int, retained: list[int]) -> str:
    """The message for a version that is not there (never published, or removed by
    retention), the same in every format: ``store 's' has no version 2 (retained: 6..8)``."""
    return f"store {store!r} has no version {version} (retained: {describe_versions(retained)})"


def read_latest_number(layout: StoreLayout) -> int | None:
    """The latest published version number, or None when nothing was ever published.

    ``LATEST`` holds it (``0``: nothing yet). Without ``LATEST`` nothing was published
    only if no record and no partition folder exists either (a store nobody committed
    to); otherwise this raises ``StoreCorruptedError`` naming the file.
    """
    try:
        text = read_store_text(layout, layout.latest).strip()
    except FileNotFoundError:
        evidence = _published_data(layout)
        if evidence is None:
            return None
        raise StoreCorruptedError(
            f"store {layout.name!r}: {layout.latest} is missing but the store has {evidence}: "
            "which version is published cannot be established (restore LATEST: it holds the "
            "latest version's number)"
        ) from None
    if not _is_number(text):
        raise StoreCorruptedError(
            f"store {layout.name!r}: {layout.latest} is damaged: {text[:40]!r} is not a version"
        )
    return int(text) or None


def _no_such_version(layout: StoreLayout, version: int) -> LookupError:
    return LookupError(f"store {layout.name!r} has no version {version} (no {version}.json)")


def _parse_record(layout: StoreLayout, version: int, path: Path, text: str) -> VersionRecord:
    return VersionRecord.parse(text, version, f"store {layout.name!r}: {path}")


def read_version(layout: StoreLayout, version: int) -> VersionRecord:
    """Version ``version``'s record; ``LookupError`` when it is not on disk."""
    path = layout.version_record(version)
    try:
        text = read_store_text(layout, path)
    except FileNotFoundError:
        raise _no_such_version(layout, version) from None
    return _parse_record(layout, version, path, text)


def _follow_latest(layout: StoreLayout, fetch: Callable[[int], T]) -> T | None:
    """``fetch(LATEST)``; None when nothing is published.

    A record that vanished is fine if ``LATEST`` moved meanwhile (retention removed the
    old version after a newer one was published): follow it. A record missing while
    ``LATEST`` still names it is damage.
    """
    number = read_latest_number(layout)
    while number is not None:
        try:
            return fetch(number)
        except LookupError:
            again = read_latest_number(layout)
            if again is None or again == number:
                raise StoreCorruptedError(
                    f"store {layout.name!r}: LATEST names version {number} but "
                    f"{layout.version_record(number)} is missing: which version is published "
                    "cannot be established"
                ) from None
            number = again
    return None


def read_latest(layout: StoreLayout) -> VersionRecord | None:
    """The latest published version's record (None: nothing published yet); raises
    ``StoreCorruptedError`` when it cannot be established (see the module docstring)."""
    return _follow_latest(layout, lambda n: read_version(layout, n))


def list_versions(layout: StoreLayout) -> list[int]:
    """Published version numbers still on disk (retained), ascending."""
    latest = read_latest_number(layout)
    if latest is None:
        return []
    return [v for v in _record_numbers(layout) if v <= latest]


# -- publishing ----------------------------------------------------------------------------
def publish(layout: StoreLayout, record: VersionRecord) -> None:
    """Make ``record`` the latest version: record first, then the LATEST pointer.

    A store's first publish writes ``LATEST`` = 0 first, so a crash before ``LATEST``
    names the record leaves debris above ``LATEST``, never a record without ``LATEST``.
    """
    layout.versions_dir.mkdir(parents=True, exist_ok=True)
    if not layout.latest.exists():
        atomic_write_text(layout.latest, "0\n")
    atomic_write_text(layout.version_record(record.version), record.to_json())
    atomic_write_text(layout.latest, f"{record.version}\n")


# -- readers' leases -----------------------------------------------------------------------
def _names_this_file(path: Path, fd: int) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def _read_fd(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


class VersionLease:
    """A reader's lease on one published version: a shared ``flock`` on its record,
    which retention will not remove while it is held (see the module docstring).

    ``record`` is read through the locked descriptor. Raises ``LookupError`` when the
    record is gone (retention removed it: follow a newer ``LATEST``).
    """

    __slots__ = ("_fd", "record")

    def __init__(self, layout: StoreLayout, version: int) -> None:
        path = layout.version_record(version)
        self._fd: int | None = None
        while True:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise _no_such_version(layout, version) from None
            except OSError as exc:
                raise StoreIOError(f"store {layout.name!r}: cannot read {path}: {exc}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                if _names_this_file(path, fd):
                    text = decode_store_text(layout, path, _read_fd(fd))
                    self.record = _parse_record(layout, version, path, text)
                    self._fd = fd
                    return
            except OSError as exc:  # e.g. a folder where the record should be
                os.close(fd)
                raise StoreIOError(f"store {layout.name!r}: cannot read {path}: {exc}") from None
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # retention unlinked it between open and lock: look again

    @property
    def version(self) -> int:
        return self.record.version

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def lease_latest(layout: StoreLayout) -> VersionLease | None:
    """A lease on the latest published version (None: nothing published yet)."""
    return _follow_latest(layout, lambda n: VersionLease(layout, n))


@contextlib.contextmanager
def _unless_leased(path: Path) -> Iterator[bool | None]:
    """Hold an exclusive ``flock`` on a record while nobody leases it: yields True (held),
    False (a live reader leases it) or None (no such record)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(fd)


def live_leased_versions(layout: StoreLayout) -> set[int]:
    """Retained versions that some live reader holds a lease on."""
    leased = set()
    for v in list_versions(layout):
        with _unless_leased(layout.version_record(v)) as free:
            if free is False:
                leased.add(v)
    return leased


# -- writers' leases -----------------------------------------------------------------------
class Lease:
    """A claim held by a live process: a file it holds a shared ``flock`` on (a running
    job commit's, in ``jobs/``; writers only, who write into the store anyway).

    The kernel drops the lock when the holder dies, so a collector tells live leases
    from stale ones by trying an exclusive lock (``live_lease_names``).
    """

    __slots__ = ("_fd", "path")

    def __init__(self, path: Path) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StoreCorruptedError(
                f"{path.parent} is not a folder (iqkit keeps leases there): remove it"
            ) from None
        self.path = path
        self._fd: int | None = None
        while True:
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(fd, fcntl.LOCK_SH)
            # Between create and lock, a collector may have seen the file unlocked and
            # removed it as stale: then our lock is on a file nobody can see. Retry
            # until the locked file is the one at the path.
            if _names_this_file(self.path, fd):
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


def live_lease_names(folder: Path) -> set[str]:
    """Names of the leases in ``folder`` whose holders are alive; stale ones are removed
    (anything that is not a lease file is left alone)."""
    live: set[str] = set()
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return live
    for name in names:
        path = folder / name
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:  # gone, or not a lease (a folder)
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


# -- retention -----------------------------------------------------------------------------
@dataclass
class Cleanup:
    """What one retention pass did: versions whose records it removed, and what it could
    not clean (left for the next commit to retry)."""

    removed: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def collect_garbage(layout: StoreLayout, retain: int) -> Cleanup:
    """Remove versions older than the newest ``retain`` that no live reader leases, then
    every partition folder no remaining version names, and debris of dead commits.

    Runs under the writer's lock, after a publish, so no commit is staging folders
    meanwhile. What cannot be removed is recorded in ``Cleanup.problems`` and skipped:
    the version is published whatever happens here.
    """
    cleanup = Cleanup()
    versions = list_versions(layout)
    expired = versions[:-retain] if len(versions) > retain else []
    for v in expired:
        path = layout.version_record(v)
        try:
            if _unpublish_unless_leased(path):
                cleanup.removed.append(v)
        except OSError as exc:
            cleanup.problems.append(f"cannot remove {path}: {exc.strerror or exc}")
    _remove_stale_temp_files(layout, cleanup)
    kept = [v for v in versions if v not in cleanup.removed]
    _remove_unreferenced_folders(layout, kept, cleanup)
    return cleanup


def _unpublish_unless_leased(path: Path) -> bool:
    """Unlink an expired record unless a live reader leases it (then it stays, and so do
    its folders); True when it is gone."""
    with _unless_leased(path) as free:
        if free:
            os.unlink(path)  # while locked: a reader that locks next finds the path gone
        return free is not False


def _remove_stale_temp_files(layout: StoreLayout, cleanup: Cleanup) -> None:
    """Temp files of atomic writes killed mid-way (``.<name>.<pid>.tmp``); safe to remove
    under the writer lock, the only place such files are written."""
    for folder in (layout.store_dir, layout.versions_dir):
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            if name.startswith(".") and name.endswith(".tmp"):
                _remove(folder / name, cleanup)


def _job_of(folder_name: str) -> str:
    """``.job-<job id>-<attempt>`` → ``<job id>``."""
    return folder_name[len(JOB_STAGING_PREFIX) :].partition("-")[0]


def _remove_unreferenced_folders(
    layout: StoreLayout, kept_versions: list[int], cleanup: Cleanup
) -> None:
    referenced: set[tuple[int, int]] = set()
    for v in kept_versions:
        try:
            referenced.update(read_version(layout, v).partitions.items())
        except LookupError:
            continue
        except IqkitError as exc:  # what it names is unknown: delete nothing
            cleanup.problems.append(f"{exc}; no partition folder was removed")
            return
    latest = read_latest_number(layout) or 0
    live_jobs = live_lease_names(layout.jobs_dir)
    try:
        pnames = os.listdir(layout.partitions_dir)
    except (FileNotFoundError, NotADirectoryError):
        return
    for pname in pnames:
        if not _is_number(pname):
            continue
        p = int(pname)
        pdir = layout.partition_dir(p)
        try:
            fnames = os.listdir(pdir)
        except OSError as exc:
            cleanup.problems.append(f"cannot list {pdir}: {exc.strerror or exc}")
            continue
        for fname in fnames:
            stale_staging = fname.startswith(STAGING_PREFIX) or (
                fname.startswith(JOB_STAGING_PREFIX) and _job_of(fname) not in live_jobs
            )
            # Folders above LATEST were left by a commit that crashed before publishing.
            unreferenced = _is_number(fname) and (
                int(fname) > latest or (p, int(fname)) not in referenced
            )
            if stale_staging or unreferenced:
                _remove(pdir / fname, cleanup)


def _remove(target: Path, cleanup: Cleanup) -> None:
    """Remove a folder tree or a file; what stays is recorded as a problem."""
    try:
        remove_tree_or_file(target)
    except OSError as exc:
        cleanup.problems.append(f"cannot remove {target}: {exc.strerror or exc}")
        return
    if os.path.lexists(target):
        cleanup.problems.append(f"cannot remove {target}")
