"""The driver's side of ``df.write.format("iqkit")``: once every task succeeded,
``commit()`` opens the store's job commit (``store.jobs.open_job_commit``: a
``JobCommit`` for a folder store, a ``ChainJobCommit`` for a chain store, which every
store on an object root is). If any commit landed
since planning the job publishes nothing: ``StoreConflictError``, as for ``write_store``;
here also because planning, the tasks and the commit run in different Python workers, so
no job lease spans the job, and another commit's retention may have removed its
fragments. Each store partition is then built from its fragments, in task order:

* folders: ingested into a checkpoint of the base partition (an empty one for a new
  partition or an overwrite) — RocksDB's bulk-load path, no Python per row on the driver;
* SST chains: the uploaded runs chained on top of the base chain (none for an overwrite)
  with one small SST holding the commit record (``ChainJobCommit.stage_runs``; compacted
  into one base when the chain gets long) — no row is read on the driver;

and exactly one version is published, creating the store if it is new.

Whatever the outcome, and on ``abort()``, what the job's tasks wrote is removed: every
fragment of the job and the empty folders of a store that was never created (folders);
the uploaded runs the tasks' messages name that no published version lists (chains:
runs of a task attempt that died sent no message, and chain retention removes them)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..query.position import Position
from ..store import rocks
from ..store.chain import latest_version
from ..store.chain_jobs import ChainJobCommit, StagedChain, remove_uncreated_chain_store
from ..store.commit import build_partition, remove_tree_or_file
from ..store.jobs import (
    JobSpec,
    StagedPartition,
    StoreConflictError,
    open_job_commit,
    remove_job_staging,
    remove_uncreated_store,
    stage_partition,
)
from ..store.layout import StoreLayout
from ..store.manifest import StoreManifest
from ..store.roots import parse_root
from ..store.writer import STORE_SETTINGS
from .schema import ensure_spark_store, one_window_size
from .write_options import WriteJob, format_of
from .write_tasks import Fragment, IqkitCommitMessage, read_deletes, remove_fragments

#: Builds one store partition from its fragments (in order; none: an empty partition).
_Stage = Callable[[int, list[Fragment]], StagedPartition | StagedChain]


def commit_job(job: WriteJob, messages: list[IqkitCommitMessage]) -> int:
    """Publish what the tasks wrote as the store's next version; its number. What the
    tasks wrote is removed afterwards, whatever the outcome (module docstring)."""
    published: frozenset[str] = frozenset()
    try:
        version, published = _publish(job, messages)
    finally:
        remove_job_fragments(job, messages, keep=published)
    return version


def _publish(job: WriteJob, messages: list[IqkitCommitMessage]) -> tuple[int, frozenset[str]]:
    """Publish; the version and the SST keys its staged chains list (chain stores)."""
    assert job.plan is not None
    plan = job.plan
    window_size = _window_size(job, messages) if plan.window_column else None
    manifest = _store_manifest(job, window_size)
    position = _merge_offsets(messages) if job.kafka else None
    by_partition: dict[int, list[Fragment]] = {}
    for m in messages:
        for f in m.fragments:
            by_partition.setdefault(f.partition, []).append(f)
    with open_job_commit(
        job.root, job.store, mode=job.mode, who="spark:iqkit-datasource", create=manifest
    ) as commit:
        spec = commit.spec
        if spec.base_version != job.base_version:
            raise StoreConflictError(
                f"store {job.store!r} changed while the job ran (version "
                f"{job.base_version} -> {spec.base_version}); nothing was published, "
                "run the job again"
            )
        if isinstance(commit, ChainJobCommit) != (job.uploads is not None):
            raise StoreConflictError(  # never seen: the tasks wrote the other format
                f"store {job.store!r} changed format while the job ran; nothing was "
                "published, run the job again"
            )
        stage: _Stage
        if isinstance(commit, ChainJobCommit):
            stage = _chain_stage(commit, position)
        else:
            stage = _folder_stage(commit.spec, position)
        # As write_store: an overwrite empties the partitions no row reached, and with
        # Kafka input every partition of a murmur2 store applied the input (its position
        # advances even when no row landed in it).
        advance = position is not None and plan.partition_column is None
        empty = set(range(job.partitions)) - set(by_partition)
        todo = sorted(by_partition) + sorted(empty if job.mode == "overwrite" or advance else ())
        # Partitions build independently, mostly inside RocksDB (ingest, flush,
        # compaction, which release the GIL) or in uploads: one thread per core.
        with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
            staged = list(
                pool.map(
                    lambda p: stage(p, sorted(by_partition.get(p, []), key=lambda f: f.order)),
                    todo,
                )
            )
        version = commit.publish(
            staged,  # type: ignore[arg-type]  # the staged kind of this commit's format
            metadata={
                "rows_written": sum(s.puts for s in staged),
                "rows_in": sum(m.rows for m in messages),
                "spark_write": "datasource",
            },
        )
    listed = frozenset(f.name for s in staged if isinstance(s, StagedChain) for f in s.chain.files)
    return version, listed


def _folder_stage(spec: JobSpec, position: Position | None) -> _Stage:
    def stage(p: int, fragments: list[Fragment]) -> StagedPartition:
        if not fragments:
            return stage_partition(spec, p, [], attempt="driver", position=position)
        return _stage_fragments(spec, p, fragments, position)

    return stage


def _chain_stage(commit: ChainJobCommit, position: Position | None) -> _Stage:
    # Records, not RocksDB keys (a window is two keys), as every writer counts them.
    kind = commit.spec.manifest.kind

    def stage(p: int, fragments: list[Fragment]) -> StagedChain:
        return commit.stage_runs(
            p,
            [f.run for f in fragments if f.run is not None],
            position=position,
            puts=kind.records_in(sum(f.puts for f in fragments)),
            deletes=kind.records_in(sum(f.deletes for f in fragments)),
        )

    return stage


def remove_job_fragments(
    job: WriteJob, messages: list[IqkitCommitMessage], *, keep: frozenset[str] = frozenset()
) -> None:
    """What this job's tasks wrote and no published version lists.

    Folders: every file or folder of the job (any attempt, any partition: the job's
    hidden names), and the folders they were made in when the store was never created.
    Chains: the runs ``messages`` name, except ``keep`` (the commit's) and whatever the
    store's latest version lists — so an ``abort()`` that Spark might call after a
    publish could never remove published data — and, under a local root, the empty
    folders of a store that was never created."""
    if job.uploads is None:
        layout = StoreLayout.of(job.root, job.store)
        remove_job_staging(layout, job.job_id)
        remove_uncreated_store(layout)
        return
    fragments = [f for m in messages for f in m.fragments]
    if any(f.run is not None and f.run.name not in keep for f in fragments):
        objects = job.uploads.objects()
        if not keep:
            latest = latest_version(objects, job.store)
            keep = frozenset(latest.files()) if latest is not None else frozenset()
        remove_fragments(job, fragments, keep=keep, objects=objects)
    remove_uncreated_chain_store(parse_root(job.root), job.store)


def _window_size(job: WriteJob, messages: list[IqkitCommitMessage]) -> int | None:
    """The window size the tasks saw (one size, and the existing store's): only known
    once they read the rows."""
    sizes = [m.window_sizes for m in messages if m.window_sizes is not None]
    if not sizes:  # no rows: an existing window store keeps its size
        existing = format_of(job.root, job.store).manifest()
        if existing is not None:
            return existing.window_size_ms
        return one_window_size(job.store, None, None, None)
    lo, hi = min(s[0] for s in sizes), max(s[1] for s in sizes)
    return one_window_size(job.store, job.plan.window_column if job.plan else None, lo, hi)


def _store_manifest(job: WriteJob, window_size: int | None) -> StoreManifest:
    """The existing store's manifest, which must still match (the store may have been
    created since planning, or its window size was unknown until now), or the one a
    new store gets when the job publishes (see ``ensure_spark_store``)."""
    assert job.plan is not None
    return ensure_spark_store(
        job.root,
        job.store,
        job.plan,
        partitions=job.partitions,
        partitioner=job.partitioner,
        window_size=window_size,
        retention=job.retention,
        key_types=job.key_types,
        written_by="iqkit.spark data source",
        settings=STORE_SETTINGS,
    )


def _stage_fragments(
    spec: JobSpec, partition: int, fragments: list[Fragment], position: Position | None
) -> StagedPartition:
    """Build ``partition`` from its base (upsert) or empty (overwrite, new partition) plus
    ``fragments`` in order, through ``commit.build_partition`` (checkpoint + ingest + one
    WriteBatch with the commit record).

    One ``ingest`` call takes every fragment in order (RocksDB gives overlapping files
    increasing sequence numbers in list order: a later file wins). Deletes cannot ride in
    an SST through ``rocks.write_sst``, so they go in the WriteBatch, which RocksDB
    applies after the ingested files: a fragment with deletes therefore ends a step, and
    the next step builds on a checkpoint of the previous one (rare: tombstones only).
    """
    layout = StoreLayout.of(spec.root, spec.store)
    steps: list[list[Fragment]] = [[]]
    for f in fragments:
        steps[-1].append(f)
        if f.deletes_file is not None:
            steps.append([])
    steps = [s for s in steps if s]
    source: Path | None = None
    if spec.mode == "upsert" and partition in spec.base_partitions:
        source = layout.partition_version_dir(partition, spec.base_partitions[partition])
    # Records, not RocksDB keys (a window is two keys), as every writer counts them.
    kind = spec.manifest.kind
    puts = kind.records_in(sum(f.puts for f in fragments))
    deletes = kind.records_in(sum(f.deletes for f in fragments))
    previous: Path | None = None
    record: dict[str, Any] = {}
    staging = layout.job_staging_dir(partition, spec.job_id, "driver")
    try:
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            staging = layout.job_staging_dir(
                partition, spec.job_id, "driver" if last else f"driver-step{i}"
            )
            batch = rocks.new_write_batch()
            for f in step:
                if f.deletes_file is not None:
                    for key in read_deletes(f.deletes_file):
                        batch.delete(key)
            record = build_partition(
                previous or source,
                staging,
                version=spec.planned_version,
                batch=batch,
                sst_files=[f.sst for f in step if f.sst is not None],
                position=position,
                counts={"puts": puts, "deletes": deletes},
            )
            if previous is not None:
                remove_tree_or_file(previous)
            previous = staging
    except BaseException:
        if previous is not None:
            remove_tree_or_file(previous)
        remove_tree_or_file(staging)
        raise
    return StagedPartition(
        partition=partition,
        path=os.fspath(staging),
        attempt="driver",
        puts=puts,
        deletes=deletes,
        position=record["position"].to_map(),
    )


def _merge_offsets(messages: list[IqkitCommitMessage]) -> Position:
    position = Position.empty()
    for m in messages:
        for topic, parts in m.offsets.items():
            for p, o in parts.items():
                position = position.with_component(topic, p, o)
    return position
