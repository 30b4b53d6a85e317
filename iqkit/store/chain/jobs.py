"""Job commits: partitions built and uploaded by many processes (Spark tasks on
executors that may share no filesystem), published once by the driver.

A distributed write cannot use one ``StoreWriter``: each task builds the store
partitions it owns, in its own process, and only the driver knows when the whole job has
succeeded. So the commit is split the way Spark's own state store checkpoint v2 splits
it, in the SST-chain format (store/chain/records.py, store/chain/write.py):

1. The driver opens a ``ChainJobCommit``: it pins the store's latest version (the *base*)
   and picks a job id. A job may write a store that does not exist yet (``create=``, its
   manifest): the manifest is created only when the job publishes, so a job that fails
   creates no store.
2. Each task, on whatever executor holds the partition's rows, calls
   ``spec.stage(partition, rows, ...)``: the rows become one SST (a delta on top of the
   base chain for an upsert, tombstones for deletes; the whole partition for an
   overwrite), uploaded under a unique name, and the task returns a ``StagedChain`` (the
   partition's new chain: small, sent back to the driver as text). Tasks that write many
   sorted runs (the data source) upload them with ``spec.upload_runs`` and the driver
   chains them (``ChainJobCommit.stage_runs``). The executor's ``FileCache`` serves the
   base files when a chain is long enough to compact.
3. The driver, once the job succeeded, calls ``publish(staged)`` with exactly one staged
   chain per partition: one exclusive create of the next version record (an upsert also
   compacts the base's over-long chains it does not touch, as every commit does). If any commit
   landed since the base, or another writer wins the create, the job publishes nothing
   (``StoreConflictError``) and its SSTs are removed.

What a failed, retried or speculative task attempt uploaded is listed by no record:
retention (store/chain/retention.py) removes such orphans once they are older than its grace
period. The driver removes what the staged chains it was handed uploaded when it does not
publish them.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import (
    IqkitError,
    StoreConflictError,
    UnknownStoreError,
    VersionConflictError,
)
from ...query.position import Position
from ..cache import FileCache
from ..format import JOB_MODES, check_job_mode
from ..integrity import checksum_file
from ..manifest import StoreManifest
from ..names import CHAIN_RECORDS_DIR, CHAIN_SST_DIR, MANIFEST_FILE, twin_key
from ..objects import ObjectStore, open_objects
from ..roots import StoreRoot
from ..sorted_rows import ArrowRows
from .records import (
    ChainFile,
    ChainVersion,
    PartitionChain,
    check_next_version,
    latest_version,
    list_versions,
)
from .stores import (
    chain_commit_lock,
    chain_store_names,
    clean_after_publish,
    ensure_chain_store,
    read_chain_manifest,
)
from .write import Change, commit_partition, overlong, publish_next, sst_key

__all__ = [
    "ChainJobCommit",
    "ChainJobSpec",
    "StagedChain",
    "remove_uncreated_chain_store",
    "upload_runs",
]


#: A job's write modes (the format interface's).
MODES = JOB_MODES


@dataclass(frozen=True)
class StagedChain:
    """One partition a task built and uploaded, waiting for the driver to publish it."""

    partition: int
    chain: PartitionChain
    attempt: str
    puts: int = 0
    deletes: int = 0
    position: dict[str, dict[int, int]] = field(default_factory=dict)

    def files(self) -> set[str]:
        """The keys its chain lists (SSTs and their twins)."""
        return self.chain.object_keys()

    def to_text(self) -> str:
        """The staged chain as one JSON text (how a task returns it in a DataFrame)."""
        import json

        return json.dumps(
            {
                "partition": self.partition,
                "chain": self.chain.to_json(),
                "attempt": self.attempt,
                "puts": self.puts,
                "deletes": self.deletes,
            },
            sort_keys=True,
        )

    @classmethod
    def from_text(cls, text: str) -> StagedChain:
        import json

        data = json.loads(text)
        chain = PartitionChain.from_json(data["chain"])
        return cls(
            partition=int(data["partition"]),
            chain=chain,
            attempt=str(data["attempt"]),
            puts=int(data["puts"]),
            deletes=int(data["deletes"]),
            position=chain.commit_record()["position"].to_map(),
        )


@dataclass(frozen=True)
class ChainJobSpec:
    """What a task needs to build and upload its partitions (picklable, sent to
    executors, which open the root themselves: its URL, credentials from their own
    environment)."""

    root: StoreRoot
    store: str
    job_id: str
    mode: str
    #: The version the job builds on (None: the store had no version).
    base_version: int | None
    #: partition -> its chain in the base version (an upsert builds on these).
    base_partitions: dict[int, PartitionChain]
    manifest: StoreManifest

    @property
    def planned_version(self) -> int:
        return (self.base_version or 0) + 1

    def objects(self) -> ObjectStore:
        return open_objects(self.root)

    def base_of(self, partition: int) -> PartitionChain | None:
        """The chain a partition's commit builds on: the base's (upsert), or none."""
        return self.base_partitions.get(partition) if self.mode == "upsert" else None

    def stage(
        self,
        partition: int,
        rows: Iterable[Change],
        *,
        attempt: str,
        position: Position | None = None,
        sorted_unique: bool = False,
        work: str | os.PathLike[str] | None = None,
    ) -> StagedChain:
        """Upload ``partition``'s ``rows`` (sorted by key, each key once: (key, value or
        None for a delete)) as one SST on top of the base chain; return the new chain.
        ``sorted_unique``: the caller's promise, which chain rows always keep
        (write.py checks it)."""
        del sorted_unique
        # Arrow rows (a Spark task's) go to the SST writer as they are, counting
        # themselves; other rows are counted on their way through.
        counter = rows if isinstance(rows, ArrowRows) else _Counter(rows)
        chain = commit_partition(
            self.objects(),
            self.store,
            partition,
            self.base_of(partition),
            counter,
            version=self.planned_version,
            cache=FileCache(),
            position=position,
            work=work,
            manifest=self.manifest,
        )
        puts, deletes = (
            (counter.puts_seen, counter.deletes_seen)
            if isinstance(counter, ArrowRows)
            else (counter.puts, counter.deletes)
        )
        return StagedChain(
            partition=partition,
            chain=chain,
            attempt=attempt,
            puts=self.manifest.kind.records_in(puts),
            deletes=self.manifest.kind.records_in(deletes),
            position=chain.commit_record()["position"].to_map(),
        )

    @staticmethod
    def staged_from_text(text: str) -> StagedChain:
        """A staged chain back from ``StagedChain.to_text`` (what a task sent)."""
        return StagedChain.from_text(text)

    def upload_runs(
        self,
        runs: Iterable[tuple[int, str | os.PathLike[str]]],
        *,
        objects: ObjectStore | None = None,
    ) -> list[ChainFile]:
        """Upload a task's sorted runs (SSTs of puts and tombstones, written with
        ``rocks.write_changes_sst``), each for its partition, through one connection; the
        driver chains them (``ChainJobCommit.stage_runs``)."""
        return upload_runs(self, runs, objects=objects)

    def discard(
        self,
        names: Iterable[str],
        *,
        keep: frozenset[str] = frozenset(),
        objects: ObjectStore | None = None,
        unpublished: bool = True,
    ) -> None:
        """Remove the uploaded runs ``names`` except ``keep``; ``unpublished``: also
        except what the store's latest version lists (so a cleanup that runs after a
        publish never removes published data), and, under a local root, the empty folders
        of a store that was never created. Best effort: what cannot be removed now is an
        orphan that chain retention removes after its grace period."""
        doomed = set(names) - keep
        if doomed:
            objects = objects if objects is not None else self.objects()
            with contextlib.suppress(IqkitError, OSError):
                if unpublished:
                    latest = latest_version(objects, self.store)
                    doomed -= latest.files() if latest is not None else set()
                for name in sorted(doomed):
                    with contextlib.suppress(IqkitError, OSError):
                        objects.delete(name)
        if unpublished:
            remove_uncreated_chain_store(self.root, self.store)


class _Counter:
    """Passes rows through, counting puts and deletes (RocksDB keys). The commit record
    is written before the rows stream into the SST, so it carries no counts here; the
    staged chain (and the version's metadata) carries them."""

    def __init__(self, rows: Iterable[Change]) -> None:
        self._rows = rows
        self.puts = 0
        self.deletes = 0

    def __iter__(self) -> Iterator[Change]:
        for key, value in self._rows:
            if value is None:
                self.deletes += 1
            else:
                self.puts += 1
            yield key, value


class ChainJobCommit:
    """The driver's side of a job commit on an object root (see the module docstring).

    ``create``: the manifest a store that does not exist yet gets when the job publishes
    (one exclusive create; a store created meanwhile must have the same settings).
    """

    def __init__(
        self,
        objects: ObjectStore,
        store: str,
        *,
        mode: str = "upsert",
        who: str = "job",
        create: StoreManifest | None = None,
        lock_timeout: float = 60.0,
    ) -> None:
        check_job_mode(mode)
        self._objects = objects
        self._lock_timeout = lock_timeout
        self._create: StoreManifest | None = None
        try:
            manifest = read_chain_manifest(self._objects, store)
        except UnknownStoreError:
            if create is None:
                raise UnknownStoreError(store, chain_store_names(self._objects)) from None
            manifest = self._create = create
        self._base: ChainVersion | None = latest_version(
            self._objects, store, partitions=manifest.partitions
        )
        # Past the highest version number: refused before any task uploads a file.
        check_next_version(store, self._base.version + 1 if self._base is not None else 1)
        self._who = who
        self._uploaded: list[StagedChain] = []
        self.job_id = uuid.uuid4().hex[:16]
        self.spec = ChainJobSpec(
            root=objects.root,
            store=store,
            job_id=self.job_id,
            mode=mode,
            base_version=self._base.version if self._base is not None else None,
            base_partitions=dict(self._base.partitions) if self._base is not None else {},
            manifest=manifest,
        )
        self.version: int | None = None
        self._finished = False

    def __enter__(self) -> ChainJobCommit:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is not None or self.version is None:
            self.abort()

    def stage_runs(
        self,
        partition: int,
        runs: Iterable[ChainFile],
        *,
        position: Position | None = None,
        puts: int = 0,
        deletes: int = 0,
    ) -> StagedChain:
        """On the driver: ``partition``'s new chain from the runs tasks uploaded (in the
        order they apply) on top of the base chain (upsert) plus one small SST with the
        commit record; compacted into one base here when the chain gets too long."""
        spec = self.spec
        chain = commit_partition(
            self._objects,
            spec.store,
            partition,
            spec.base_of(partition),
            [],
            version=spec.planned_version,
            cache=FileCache(),
            position=position,
            counts={"puts": puts, "deletes": deletes},
            uploaded=tuple(runs),
            manifest=spec.manifest,
        )
        staged = StagedChain(
            partition=partition,
            chain=chain,
            attempt="driver",
            puts=puts,
            deletes=deletes,
            position=chain.commit_record()["position"].to_map(),
        )
        self._uploaded.append(staged)
        return staged

    def publish(
        self,
        staged: Iterable[StagedChain],
        *,
        metadata: Mapping[str, Any] | None = None,
        source_end: Position | None = None,
    ) -> int:
        """Publish one staged chain per partition as the store's next version."""
        if self._finished:
            raise RuntimeError(f"job {self.job_id} on store {self.spec.store!r} is finished")
        chosen: dict[int, StagedChain] = {}
        for s in staged:
            if s.partition in chosen:
                raise ValueError(f"job {self.job_id}: partition {s.partition} staged twice")
            chosen[s.partition] = s
        self._uploaded.extend(chosen.values())
        spec = self.spec
        try:
            if spec.mode == "upsert":  # the base's over-long chains this job leaves alone
                for p in overlong(self._base):
                    if p not in chosen:
                        chosen[p] = self.stage_runs(p, [])
            if self._create is not None:
                ensure_chain_store(self._objects, self._create)
            with chain_commit_lock(
                self._objects, spec.store, who=self._who, timeout=self._lock_timeout
            ):
                numbers = list_versions(self._objects, spec.store)
                latest = numbers[-1] if numbers else None
                if latest != spec.base_version:
                    raise _conflict(spec, latest)
                try:
                    record = publish_next(
                        self._objects,
                        spec.store,
                        self._base,
                        spec.planned_version,
                        {p: s.chain for p, s in chosen.items()},
                        source_end=source_end,
                        metadata={**(metadata or {}), "job": self.job_id, "mode": spec.mode},
                        who=self._who,
                        replace_all=spec.mode == "overwrite",
                    )
                except VersionConflictError:
                    raise _conflict(spec, spec.planned_version) from None
        except BaseException:
            self.abort()
            raise
        self.version = record.version
        self._finished = True
        self._uploaded.clear()
        try:
            retain = read_chain_manifest(self._objects, spec.store).retention
        except IqkitError:  # published; retention runs again after the next commit
            retain = None
        if retain is not None:
            clean_after_publish(self._objects, spec.store, record.version, retain)
        return record.version

    def adopt(self, staged: Iterable[StagedChain]) -> None:
        """Take charge of ``staged``: chains tasks built and sent back (the driver reads
        them from the job's result rows), so that ``abort`` removes their SSTs if the job
        publishes nothing — including staged chains a failed check never lets reach
        ``publish``."""
        self._uploaded.extend(staged)

    def abort(self) -> None:
        """Remove the SSTs of the staged chains this driver was handed (``adopt``,
        ``publish``) or built, except any the base or the store's latest version lists;
        under a local root, remove the empty folders of a store the job was to create
        (``remove_uncreated_chain_store``). Best effort: what a failed task attempt
        uploaded without sending it back, or what cannot be removed now, is an orphan
        that chain retention removes after its grace period."""
        self._finished = True
        uploaded, self._uploaded = self._uploaded, []
        doomed = {k for s in uploaded for k in s.chain.object_keys()}
        doomed -= {k for c in self.spec.base_partitions.values() for k in c.object_keys()}
        with contextlib.suppress(IqkitError, OSError):
            if doomed:
                latest = latest_version(self._objects, self.spec.store)
                doomed -= latest.files() if latest is not None else set()
            for name in sorted(doomed):
                with contextlib.suppress(IqkitError, OSError):
                    self._objects.delete(name)
        if self._create is not None:
            remove_uncreated_chain_store(self._objects.root, self.spec.store)

    def __repr__(self) -> str:
        state = "finished" if self._finished else "open"
        return f"ChainJobCommit({self.spec.store!r}, job={self.job_id}, {self.spec.mode}, {state})"


def _conflict(spec: ChainJobSpec, latest: int | None) -> StoreConflictError:
    return StoreConflictError(
        f"store {spec.store!r} changed while the job ran (version {spec.base_version} -> "
        f"{latest}); nothing was published, run the job again"
    )


def upload_runs(
    spec: ChainJobSpec,
    runs: Iterable[tuple[int, str | os.PathLike[str]]],
    *,
    objects: ObjectStore | None = None,
) -> list[ChainFile]:
    """``spec.upload_runs``: several ``(partition, sst)`` runs, through one connection
    to the root: ``objects`` (``spec.objects()``, kept by a task for all its runs), or a
    new one. Connecting costs about as much as uploading a small SST."""
    objects = objects if objects is not None else spec.objects()
    uploaded = []
    for partition, sst in runs:
        key = sst_key(spec.store, partition, spec.planned_version)
        checksum = checksum_file(sst)  # of the bytes uploaded (integrity.py)
        objects.put_immutable(key, sst)
        twin = twin_key(os.fspath(sst))  # its columnar twin, when the task wrote one
        twin_size = twin_checksum = None
        if os.path.exists(twin):
            twin_checksum = checksum_file(twin)
            objects.put_immutable(twin_key(key), twin)
            twin_size = os.path.getsize(twin)
        uploaded.append(ChainFile(key, os.path.getsize(sst), twin_size, checksum, twin_checksum))
    return uploaded


def remove_uncreated_chain_store(root: StoreRoot, store: str) -> None:
    """After a failed first write of a chain store under a local root: remove the empty
    folders its uploads left (``<store>/sst/<p>/``, ``<store>/sst/``, ``<store>/chain/``
    and ``<store>/``), so a job that created no store leaves no folder of one. Only
    empty folders go (``rmdir``), and nothing once the store has a manifest; an object
    root has no folders to remove."""
    local = root.local
    if local is None:
        return
    folder = os.path.join(local, store)
    if os.path.exists(os.path.join(folder, MANIFEST_FILE)):
        return
    ssts = os.path.join(folder, CHAIN_SST_DIR)
    try:
        partitions = [os.path.join(ssts, name) for name in os.listdir(ssts)]
    except (FileNotFoundError, NotADirectoryError):
        partitions = []
    for path in [*partitions, ssts, os.path.join(folder, CHAIN_RECORDS_DIR), folder]:
        with contextlib.suppress(OSError):
            os.rmdir(path)
