"""Job commits: partitions built by many processes, published once by one.

A distributed write (a Spark job) cannot use one ``StoreWriter``: each task builds the
store partitions it owns, in its own process, and only the driver knows when the whole
job has succeeded. So the commit is split the way Spark's own state store checkpoint v2
splits it:

1. The driver opens a ``JobCommit``: it pins the base version, picks a job id and takes
   a *job lease* (``jobs/<id>``), which keeps retention away from the job's folders. A
   job may write a store that does not exist yet (``create=``, its manifest): the store
   is created when the job publishes, so a job that fails creates no store.
2. Each task attempt calls ``stage_partition(spec, p, rows, attempt=...)``: it builds
   ``partitions/<p>/.job-<id>-<attempt>`` (a checkpoint of the base folder, or empty
   for an overwrite; plus the rows and the partition's commit record) and returns a
   ``StagedPartition``. Failed, retried or speculative attempts leave folders nobody
   will ever publish.
3. The driver, once the job succeeded, calls ``publish(staged)`` with exactly one staged
   folder per partition: under the commit lock it checks nothing else was committed
   since the base version, moves the folders into place and publishes the version.
   Everything else the job built is removed; a job that dies leaves folders that
   retention removes once its lease is gone.

The rows a task hands ``stage_partition(..., sorted_unique=True)`` come sorted and
key-unique from ``store.sorted_rows`` (the external sort), which knows nothing of commits.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import StoreConflictError, StoreNotFoundError, UnknownStoreError
from ..query.position import Position
from . import rocks
from .chain import latest_version
from .chain_jobs import MODES, ChainJobCommit
from .chain_store import read_chain_manifest
from .commit import build_partition, publish_partitions, warn_cleanup_failed
from .formats import StoreFormat, store_format
from .layout import StoreLayout, list_store_names, remove_if_exists, remove_tree_or_file
from .locking import CommitLock
from .manifest import StoreManifest
from .names import JOB_STAGING_PREFIX
from .objects import open_objects
from .roots import parse_root
from .sorted_rows import ArrowRows
from .versions import Lease, PublishedVersion, read_latest, read_latest_number
from .writer import create_store


@dataclass(frozen=True)
class JobSpec:
    """What a task needs to build its partitions (picklable, sent to executors)."""

    root: str
    store: str
    job_id: str
    mode: str
    #: The version the job builds on (None: the store had no version).
    base_version: int | None
    #: partition -> folder version in the base version (upsert builds on these).
    base_partitions: dict[int, int]
    manifest: StoreManifest

    @property
    def planned_version(self) -> int:
        return (self.base_version or 0) + 1

    def stage(
        self,
        partition: int,
        rows: Iterable[tuple[bytes, bytes | None]],
        *,
        attempt: str,
        position: Position | None = None,
        sorted_unique: bool = False,
        work: str | os.PathLike[str] | None = None,
    ) -> StagedPartition:
        """``stage_partition`` (the same call as ``ChainJobSpec.stage`` on object roots;
        ``work`` is unused: the partition is built in the store's own folder)."""
        del work
        return stage_partition(
            self, partition, rows, attempt=attempt, position=position, sorted_unique=sorted_unique
        )

    @staticmethod
    def staged_from_text(text: str) -> StagedPartition:
        """A staged partition back from ``StagedPartition.to_text`` (what a task sent)."""
        return StagedPartition.from_text(text)


@dataclass(frozen=True)
class StagedPartition:
    """One partition a task built, waiting for the driver to publish it."""

    partition: int
    path: str
    attempt: str
    puts: int = 0
    deletes: int = 0
    position: dict[str, dict[int, int]] = field(default_factory=dict)

    def to_text(self) -> str:
        """The staged partition as one JSON text (how a Spark task returns it)."""
        return json.dumps(
            {
                "partition": self.partition,
                "path": self.path,
                "attempt": self.attempt,
                "puts": self.puts,
                "deletes": self.deletes,
            },
            sort_keys=True,
        )

    @classmethod
    def from_text(cls, text: str) -> StagedPartition:
        data = json.loads(text)
        return cls(
            partition=int(data["partition"]),
            path=str(data["path"]),
            attempt=str(data["attempt"]),
            puts=int(data["puts"]),
            deletes=int(data["deletes"]),
        )


def stage_partition(
    spec: JobSpec,
    partition: int,
    rows: Iterable[tuple[bytes, bytes | None]],
    *,
    attempt: str,
    position: Position | None = None,
    sorted_unique: bool = False,
) -> StagedPartition:
    """Build partition ``partition`` from ``rows`` of (RocksDB key, value or None=delete).

    ``sorted_unique``: the keys arrive strictly increasing with no deletes, and the
    partition is built from empty (an overwrite or a new partition) — then the rows go
    through an SST file ingested into the new database, RocksDB's bulk-load path, instead
    of a write batch.
    """
    layout = StoreLayout.of(spec.root, spec.store)
    staging = layout.job_staging_dir(partition, spec.job_id, attempt)
    if staging.exists():
        shutil.rmtree(staging)
    staging.parent.mkdir(parents=True, exist_ok=True)
    source_dir = None
    if spec.mode == "upsert" and partition in spec.base_partitions:
        source_dir = layout.partition_version_dir(partition, spec.base_partitions[partition])
    try:
        if sorted_unique and source_dir is None:
            sst = staging.with_name(staging.name + ".sst")
            puts = rocks.write_sst(
                sst,
                rows.puts()
                if isinstance(rows, ArrowRows)
                else ((k, v) for k, v in rows if v is not None),
            )
            try:
                record = build_partition(
                    None,
                    staging,
                    version=spec.planned_version,
                    sst_files=[os.fspath(sst)] if puts else [],
                    position=position,
                    counts=_record_counts(spec, puts, 0),
                )
            finally:
                remove_if_exists(sst)
        else:
            batch = rocks.new_write_batch()
            puts = deletes = 0
            for key, value in rows:
                if value is None:
                    batch.delete(key)
                    deletes += 1
                else:
                    batch.put(key, value)
                    puts += 1
            record = build_partition(
                source_dir,
                staging,
                version=spec.planned_version,
                batch=batch,
                position=position,
                counts=_record_counts(spec, puts, deletes),
            )
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return StagedPartition(
        partition=partition,
        path=os.fspath(staging),
        attempt=attempt,
        puts=record.get("puts", 0),
        deletes=record.get("deletes", 0),
        position=record["position"].to_map(),
    )


def _record_counts(spec: JobSpec, puts: int, deletes: int) -> dict[str, int]:
    """The commit record's counts: records, not RocksDB keys (a window is two keys)."""
    kind = spec.manifest.kind
    return {"puts": kind.records_in(puts), "deletes": kind.records_in(deletes)}


class JobCommit:
    """The driver's side of a job commit (see the module docstring).

    ``create``: the manifest a store that does not exist yet gets when the job publishes
    (``create_store``, so a store created meanwhile must have the same settings). Until
    then nothing but the job's own hidden folders exists, and a job that fails or is
    aborted removes those and the empty folders they were made in.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        store: str,
        *,
        mode: str = "upsert",
        who: str = "job",
        lock_timeout: float = 60.0,
        create: StoreManifest | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self._layout = StoreLayout.of(root, store)
        self._create: StoreManifest | None = None
        try:
            manifest = StoreManifest.read(self._layout)
        except StoreNotFoundError:
            if create is None:
                raise UnknownStoreError(store, list_store_names(root)) from None
            manifest = self._create = create
        record = read_latest(self._layout)
        base = record.version if record is not None else None
        self.job_id = uuid.uuid4().hex[:16]
        self._lease: Lease | None = Lease(self._layout.jobs_dir / self.job_id)
        self._who = who
        self._lock_timeout = lock_timeout
        self.spec = JobSpec(
            root=os.fspath(root),
            store=store,
            job_id=self.job_id,
            mode=mode,
            base_version=base,
            base_partitions=dict(record.partitions) if record else {},
            manifest=manifest,
        )
        self.version: int | None = None

    def __enter__(self) -> JobCommit:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is not None or self.version is None:
            self.abort()

    def publish(
        self,
        staged: Iterable[StagedPartition],
        *,
        metadata: Mapping[str, Any] | None = None,
        source_end: Position | None = None,
    ) -> int:
        """Publish one staged folder per partition as the store's next version."""
        if self._lease is None:
            raise RuntimeError(f"job {self.job_id} on store {self.spec.store!r} is finished")
        chosen: dict[int, Path] = {}
        for s in staged:
            if s.partition in chosen:
                raise ValueError(f"job {self.job_id}: partition {s.partition} staged twice")
            chosen[s.partition] = Path(s.path)
        missing = [os.fspath(p) for p in chosen.values() if not p.is_dir()]
        if missing:
            raise StoreNotFoundError(f"job {self.job_id}: staged folders are missing: {missing}")
        layout = self._layout
        try:
            if self._create is not None:
                _create_store(self.spec.root, self._create)
            with CommitLock(layout, who=self._who, timeout=self._lock_timeout):
                latest = read_latest_number(layout)
                if latest != self.spec.base_version:
                    raise StoreConflictError(
                        f"store {self.spec.store!r} changed while the job ran (version "
                        f"{self.spec.base_version} -> {latest}); nothing was published, "
                        "run the job again"
                    )
                version = self.spec.planned_version
                remove_if_exists(layout.version_record(version))  # debris, never published
                previous = read_latest(layout)
                publish_partitions(
                    layout,
                    self.spec.manifest,
                    previous=previous,
                    version=version,
                    built=chosen,
                    source_end=source_end,
                    metadata={**(metadata or {}), "job": self.job_id, "mode": self.spec.mode},
                    who=self._who,
                    replace_all=self.spec.mode == "overwrite",
                )
        except BaseException:
            self.abort()  # the job's folders, and its lease
            raise
        self.version = version
        # Published: removing the job's other folders and its lease is cleanup, and its
        # problems are warnings (a failed-looking job would be run again).
        try:
            self.abort()
        except Exception as exc:
            warn_cleanup_failed(layout, version, [f"{type(exc).__name__}: {exc}"])
        return version

    def adopt(self, staged: Iterable[StagedPartition]) -> None:
        """Nothing to do: ``abort`` removes every folder staged under this job's id,
        whether or not the driver was handed it (``ChainJobCommit.adopt``'s twin)."""
        del staged

    def abort(self) -> None:
        """Remove every folder this job built that was not published; drop the lease."""
        layout = self._layout
        remove_job_staging(layout, self.job_id)
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        if self._create is not None:
            remove_uncreated_store(layout)

    def __repr__(self) -> str:
        state = "open" if self._lease is not None else "finished"
        return f"JobCommit({self.spec.store!r}, job={self.job_id}, {self.spec.mode}, {state})"


def open_job_commit(
    root: str | os.PathLike[str],
    store: str,
    *,
    mode: str = "upsert",
    who: str = "job",
    lock_timeout: float = 60.0,
    create: StoreManifest | None = None,
) -> JobCommit | ChainJobCommit:
    """The job commit for ``root``'s format: ``JobCommit`` (folders) on a local root,
    ``chain_jobs.ChainJobCommit`` on an object-storage URL. Both have ``spec`` (whose
    ``stage`` a task calls), ``publish``, ``abort`` and ``version``."""
    parsed = parse_root(root)
    if store_format(parsed, store) is StoreFormat.CHAIN:
        return ChainJobCommit(
            parsed.url, store, mode=mode, who=who, create=create, lock_timeout=lock_timeout
        )
    return JobCommit(
        parsed.local, store, mode=mode, who=who, lock_timeout=lock_timeout, create=create
    )


def store_exists(root: str | os.PathLike[str], store: str) -> bool:
    """Whether ``store`` has a manifest under ``root``, in the root's format."""
    parsed = parse_root(root)
    if store_format(parsed, store) is StoreFormat.CHAIN:
        try:
            read_chain_manifest(open_objects(parsed), store)
        except UnknownStoreError:
            return False
        return True
    return StoreLayout.of(parsed.local, store).manifest.exists()


def latest_published(root: str | os.PathLike[str], store: str) -> PublishedVersion[Any] | None:
    """``store``'s latest version record in the root's format (its ``metadata``,
    ``source_end``, ``version``: what every format's record carries), or None when
    nothing was published (or there is no such store)."""
    parsed = parse_root(root)
    if store_format(parsed, store) is StoreFormat.CHAIN:
        return latest_version(open_objects(parsed), store)
    layout = StoreLayout.of(parsed.local, store)
    if not layout.manifest.exists():
        return None
    return read_latest(layout)


def _create_store(root: str, manifest: StoreManifest) -> None:
    m = manifest
    create_store(
        root,
        m.name,
        partitions=m.partitions,
        kind=m.kind,
        key_serde=m.key_serde,
        value_serde=m.value_serde,
        partitioner=m.partitioner,
        window_size_ms=m.window_size_ms,
        retention=m.retention,
        properties=m.properties,
    )


def remove_job_staging(layout: StoreLayout, job_id: str) -> None:
    """Remove every file or folder job ``job_id`` staged under the store's partitions (any
    attempt, any partition: the hidden ``.job-<id>-`` names), whether a task built it
    (``stage_partition``, the Spark data source's fragments) or the driver. A partition
    folder removed meanwhile is not an error."""
    prefix = f"{JOB_STAGING_PREFIX}{job_id}-"
    try:
        pnames = os.listdir(layout.partitions_dir)
    except FileNotFoundError:
        pnames = []
    for pname in pnames:
        pdir = layout.partitions_dir / pname
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for fname in os.listdir(pdir):
                if fname.startswith(prefix):
                    remove_tree_or_file(pdir / fname)


def remove_uncreated_store(layout: StoreLayout) -> None:
    """Remove the empty folders a failed first write left for a store that was never
    created (no manifest): ``partitions/<p>/``, ``partitions/``, ``jobs/`` and the store
    folder. Only empty folders are removed (``rmdir``), so whatever another writer has
    put there meanwhile stays."""
    if layout.manifest.exists():
        return
    try:
        folders = [layout.partitions_dir / name for name in os.listdir(layout.partitions_dir)]
    except (FileNotFoundError, NotADirectoryError):
        folders = []
    for folder in [*folders, layout.partitions_dir, layout.jobs_dir, layout.store_dir]:
        with contextlib.suppress(OSError):
            os.rmdir(folder)
