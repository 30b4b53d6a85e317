"""The driver's side of ``df.write.format("iqkit")``: once every task succeeded,
``commit()`` opens the store's job commit (``StoreFormat.open_job_commit``). If any
commit landed since planning the job publishes nothing: ``StoreConflictError``, as for
``write_store``; here also because planning, the tasks and the commit run in different
Python workers, so nothing spans the job, and another commit's retention may have
removed its fragments. Each store partition is then its uploaded runs chained on top of
the base chain (none for an overwrite) with one small SST holding the commit record
(``stage_runs``; compacted into one base when the chain gets long) — no row is read on
the driver — and exactly one version is published, creating the store if it is new.

Whatever the outcome, and on ``abort()``, what the job's tasks wrote is removed: the
uploaded runs the tasks' messages name that no published version lists (runs of a task
attempt that died sent no message, and retention removes them), and the empty folders of
a store that was never created."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import StoreConflictError
from ..query.position import Position
from ..store.format import StoreFormat
from ..store.manifest import StoreManifest
from ..store.writer import STORE_SETTINGS
from .schema import ensure_spark_store, one_window_size
from .write_options import WriteJob, existing_manifest
from .write_tasks import Fragment, IqkitCommitMessage, remove_fragments


def commit_job(
    job: WriteJob,
    messages: list[IqkitCommitMessage],
    *,
    metadata: dict[str, Any] | None = None,
    source_end: Position | None = None,
) -> int:
    """Publish what the tasks wrote as the store's next version; its number. What the
    tasks wrote is removed afterwards, whatever the outcome (module docstring).
    ``metadata`` and ``source_end``: as ``write_store`` takes them (it commits here when it
    writes in place)."""
    published: frozenset[str] = frozenset()
    try:
        version, published = _publish(job, messages, metadata or {}, source_end)
    finally:
        remove_job_fragments(job, messages, keep=published)
    return version


def _publish(
    job: WriteJob,
    messages: list[IqkitCommitMessage],
    metadata: dict[str, Any],
    source_end: Position | None,
) -> tuple[int, frozenset[str]]:
    """Publish; the version and the SST keys its staged chains list."""
    assert job.plan is not None
    plan = job.plan
    fmt = job.root_format()
    window_size = _window_size(job, fmt, messages) if plan.window_column else None
    manifest = _store_manifest(job, fmt, window_size)
    position = _merge_offsets(messages) if job.kafka else None
    by_partition: dict[int, list[Fragment]] = {}
    for m in messages:
        for f in m.fragments:
            by_partition.setdefault(f.partition, []).append(f)
    with fmt.open_job_commit(
        job.store, mode=job.mode, who="spark:iqkit-datasource", create=manifest
    ) as commit:
        spec = commit.spec
        if spec.base_version != job.base_version:
            raise StoreConflictError(
                f"store {job.store!r} changed while the job ran (version "
                f"{job.base_version} -> {spec.base_version}); nothing was published, "
                "run the job again"
            )
        # Records, not RocksDB keys (a window is two keys), as every writer counts them.
        kind = spec.manifest.kind

        def stage(p: int) -> object:
            fragments = sorted(by_partition.get(p, []), key=lambda f: f.order)
            return commit.stage_runs(
                p,
                [f.run for f in fragments if f.run is not None],
                position=position,
                puts=kind.records_in(sum(f.puts for f in fragments)),
                deletes=kind.records_in(sum(f.deletes for f in fragments)),
            )

        # As write_store: an overwrite empties the partitions no row reached, and with
        # Kafka input every partition of a murmur2 store applied the input (its position
        # advances even when no row landed in it).
        advance = position is not None and plan.partition_column is None
        empty = set(range(job.partitions)) - set(by_partition)
        todo = sorted(by_partition) + sorted(empty if job.mode == "overwrite" or advance else ())
        # Partitions build independently (uploads, and compaction inside RocksDB, which
        # releases the GIL): one thread per core.
        with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
            staged = list(pool.map(stage, todo))
        version = commit.publish(
            staged,
            source_end=source_end,
            metadata={
                **metadata,
                "rows_written": sum(s.puts for s in staged),  # type: ignore[attr-defined]
                "rows_in": sum(m.rows for m in messages),
                "spark_write": metadata.get("spark_write", "datasource"),
            },
        )
    listed = frozenset(name for s in staged for name in s.files())  # type: ignore[attr-defined]
    return version, listed


def remove_job_fragments(
    job: WriteJob, messages: list[IqkitCommitMessage], *, keep: frozenset[str] = frozenset()
) -> None:
    """What this job's tasks wrote and no published version lists: the runs ``messages``
    name, except ``keep`` (the commit's) and whatever the store's latest version lists —
    so an ``abort()`` that Spark might call after a publish could never remove published
    data — and, under a local root, the empty folders of a store that was never
    created."""
    fragments = [f for m in messages for f in m.fragments]
    remove_fragments(job, fragments, keep=keep, unpublished=not keep)


def _window_size(job: WriteJob, fmt: StoreFormat, messages: list[IqkitCommitMessage]) -> int | None:
    """The window size the tasks saw (one size, and the existing store's): only known
    once they read the rows."""
    sizes = [m.window_sizes for m in messages if m.window_sizes is not None]
    if not sizes:  # no rows: an existing window store keeps its size
        existing = existing_manifest(fmt, job.store)
        if existing is not None:
            return existing.window_size_ms
        return one_window_size(job.store, None, None, None)
    lo, hi = min(s[0] for s in sizes), max(s[1] for s in sizes)
    return one_window_size(job.store, job.plan.window_column if job.plan else None, lo, hi)


def _store_manifest(job: WriteJob, fmt: StoreFormat, window_size: int | None) -> StoreManifest:
    """The existing store's manifest, which must still match (the store may have been
    created since planning, or its window size was unknown until now), or the one a
    new store gets when the job publishes (see ``ensure_spark_store``)."""
    assert job.plan is not None
    return ensure_spark_store(
        fmt,
        job.store,
        job.plan,
        partitions=job.partitions,
        partitioner=job.partitioner,
        window_size=window_size,
        retention=job.retention,
        key_types=job.key_types,
        written_by=job.written_by,
        settings=STORE_SETTINGS,
    )


def _merge_offsets(messages: list[IqkitCommitMessage]) -> Position:
    position = Position.empty()
    for m in messages:
        for topic, parts in m.offsets.items():
            for p, o in parts.items():
                position = position.with_component(topic, p, o)
    return position
