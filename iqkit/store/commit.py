"""The two halves of every commit, shared by ``StoreWriter`` (one process) and job commits
(Spark tasks build partitions, the driver publishes):

* ``build_partition``: a new partition folder, as a copy (hard links) of the
  partition's current folder or empty, plus one atomic ``WriteBatch`` (or ingested SST
  files) holding the data *and* the partition's commit record, flushed.
* ``publish_partitions``: under the store's commit lock, move built folders into place
  and publish the version record, then ``LATEST``; on any failure before that, undo
  everything; after it, the commit has succeeded (cleanup problems are warnings).
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import StoreCleanupWarning, StoreNotFoundError
from ..query.position import Position
from . import rocks
from .layout import StoreLayout, remove_if_exists, remove_tree_or_file
from .manifest import StoreManifest
from .names import COMMIT_KEY
from .partition import encode_commit_record, parse_commit_record
from .versions import VersionRecord, collect_garbage, next_record, publish, read_latest_number

__all__ = [
    "build_partition",
    "publish_partitions",
    "remove_if_exists",
    "remove_tree_or_file",
    "warn_cleanup_failed",
]

#: Compact a partition after a commit once level 0 holds this many files: every commit
#: adds one small SST, and many L0 files slow every read (Kafka's bulk-loading lesson).
L0_COMPACTION_TRIGGER = 8


def build_partition(
    source_dir: Path | None,
    staging: Path,
    *,
    version: int,
    batch: rocks.WriteBatch | None = None,
    sst_files: Sequence[str] = (),
    position: Position | None = None,
    counts: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Build ``staging`` from ``source_dir`` (or empty) plus the data; return the
    partition's commit record. ``position`` is merged into the previous one."""
    if source_dir is not None:
        if not rocks.database_exists(source_dir):
            raise StoreNotFoundError(f"no RocksDB database at {os.fspath(source_dir)}")
        rocks.checkpoint(source_dir, staging)
    db = rocks.open_for_write(staging, create=source_dir is None)
    try:
        if sst_files:
            rocks.ingest(db, sst_files)
        previous = parse_commit_record(db.get(COMMIT_KEY), os.fspath(staging))
        merged = (position or Position.empty()).merge(previous.get("position"))
        record = {"version": version, "position": merged, "committed_at": time.time()}
        record.update(counts or {})
        batch = batch if batch is not None else rocks.new_write_batch()
        # The commit record rides in the same WriteBatch as the data: both or neither.
        batch.put(COMMIT_KEY, encode_commit_record(record))
        db.write(batch)
        # Durable at commit: an offset recorded next to the data must not survive a crash
        # that loses the data it vouches for (a memtable not yet flushed).
        db.flush(True)
        l0 = db.property_int_value("rocksdb.num-files-at-level0") or 0
        if l0 >= L0_COMPACTION_TRIGGER:
            db.compact_range(None, None)
        return record
    except Exception as exc:
        raise rocks.classify(exc, staging) from exc
    finally:
        rocks.close_quietly(db)


def publish_partitions(
    layout: StoreLayout,
    manifest: StoreManifest,
    *,
    previous: VersionRecord | None,
    version: int,
    built: Mapping[int, Path],
    source_end: Position | None,
    metadata: Mapping[str, Any],
    who: str,
    replace_all: bool = False,
) -> VersionRecord:
    """Move ``built`` (partition → staging folder) into place and publish ``version``.

    Must run under the commit lock with ``version == LATEST + 1``. ``replace_all``
    (an overwrite) publishes only the built partitions; otherwise untouched partitions
    keep their folders. Source end offsets only grow: they merge with the previous ones.
    """
    moved: list[Path] = []
    try:
        for p, staging in sorted(built.items()):
            target = layout.partition_version_dir(p, version)
            if target.exists():  # left by a commit that crashed before publishing
                shutil.rmtree(target)
            os.rename(staging, target)
            moved.append(target)
        partitions, end, facts = next_record(
            previous,
            version,
            {p: version for p in built},
            source_end=source_end,
            metadata=metadata,
            who=who,
            replace_all=replace_all,
        )
        record = VersionRecord(
            version=version, partitions=partitions, source_end=end, metadata=facts
        )
        publish(layout, record)
    except BaseException:
        if not _published(layout, version):  # undo it all
            remove_if_exists(layout.version_record(version))
            for path in [*built.values(), *moved]:
                shutil.rmtree(path, ignore_errors=True)
        raise
    # Published: the commit has succeeded. Cleaning up is a chore that must not turn it
    # into a reported failure (a caller would retry and apply the write twice).
    try:
        problems = collect_garbage(layout, manifest.retention).problems
    except Exception as exc:
        problems = [f"{type(exc).__name__}: {exc}"]
    warn_cleanup_failed(layout, version, problems)
    return record


def _published(layout: StoreLayout, version: int) -> bool:
    """Did ``LATEST`` reach ``version``? When that cannot be read, assume it did: undoing a
    published version would lose it, leaving debris only costs disk until retention."""
    try:
        return read_latest_number(layout) == version
    except Exception:
        return True


def warn_cleanup_failed(layout: StoreLayout, version: int, problems: Sequence[str]) -> None:
    """One ``StoreCleanupWarning`` for what a published commit could not clean up."""
    if problems:
        warnings.warn(
            StoreCleanupWarning(
                f"store {layout.name!r}: version {version} was published, but cleaning up "
                f"failed (the next commit retries): {'; '.join(problems)}"
            ),
            stacklevel=2,
        )
