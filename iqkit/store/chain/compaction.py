"""Compaction off the commit path: a chain's files rewritten as one base by a version of
its own, not inside the commit that made the chain too long.

Why: compacting inside a commit costs the whole partition (10 s at 1M keys, minutes at
50M) in a commit that changed 1% of it. With ``StoreWriter(..., compaction="background")``
a commit publishes its delta and, when a chain is past ``COMPACT_AFTER_DELTAS``, starts
``compact_store`` on a thread (``start_background``); ``iqkit.compact`` runs it in the
foreground for every chain with deltas. Such a commit still compacts inline past
``INLINE_COMPACT_AFTER`` deltas, so a store whose compactions never finish (a writer
process that always exits first) keeps bounded chains. The default stays inline: the
contract numbers versions one per commit, and a compaction's version is not one.

How, as Delta Lake's ``OPTIMIZE`` does it: read the latest version; for each over-long
chain, build its files into one base SST and twin (``write.compact_files``) and upload
them under fresh names; then publish the next version in which every partition whose
chain still *starts with* those files has them replaced by the base (files a commit
added meanwhile stay on top). Nothing a reader sees changes: the same rows, commit
records, positions and ``written_by`` (so the version's change feed is empty). A commit
that raced it is rebased, not lost: the publish re-reads the latest version (under the
commit lock on a local root, else retried on ``VersionConflictError``). Uploaded bases
that no published version lists (a chain compacted by someone else first, a failure)
are removed, or left for retention.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterable
from pathlib import Path

from ...errors import IqkitError, StoreCleanupWarning, VersionConflictError
from ..cache import FileCache
from ..manifest import StoreManifest
from ..objects import ObjectStore
from .records import ChainFile, ChainVersion, PartitionChain, latest_version
from .write import (
    COMPACT_AFTER_DELTAS,
    chain_commit_lock,
    compact_files,
    overlong,
    publish_next,
    sst_key,
    upload_file,
    work_folder,
)

__all__ = ["INLINE_COMPACT_AFTER", "compact_store", "start_background"]

#: Deltas past which a commit compacts a chain itself (a safety net: background
#: compactions normally keep chains at most ``1 + COMPACT_AFTER_DELTAS`` files long).
INLINE_COMPACT_AFTER = 3 * COMPACT_AFTER_DELTAS

#: Publish attempts on an object root before giving up (each lost one to a racing commit).
_ATTEMPTS = 5


def compact_store(
    objects: ObjectStore,
    store: str,
    manifest: StoreManifest,
    *,
    who: str = "compaction",
    lock_timeout: float = 30.0,
    compact_after: int = COMPACT_AFTER_DELTAS,
    partitions: Iterable[int] | None = None,
) -> int | None:
    """Compact the chains of the latest version longer than ``compact_after`` deltas
    (``partitions``: only these, and any length over 0) and publish the result as the
    next version; its number, or None when there was nothing to compact (or every
    chain was compacted by another writer first)."""
    start = latest_version(objects, store, partitions=manifest.partitions)
    if start is None:
        return None
    if partitions is None:
        targets = overlong(start, compact_after)
    else:
        chains = start.partitions
        targets = sorted(p for p in set(partitions) if p in chains and chains[p].deltas > 0)
    if not targets:
        return None
    cache = FileCache()
    bases: dict[int, tuple[tuple[ChainFile, ...], ChainFile]] = {}
    listed: set[str] = set()  # bases a published version lists
    try:
        with work_folder() as tmp:
            for p in targets:
                chain = start.partitions[p]
                base = _compacted(objects, store, p, chain, start, cache, tmp, manifest)
                bases[p] = (chain.files, base)
        for _ in range(_ATTEMPTS):
            with chain_commit_lock(objects, store, who=who, timeout=lock_timeout):
                latest = latest_version(objects, store, partitions=manifest.partitions)
                written = _rebased(latest, bases)
                if latest is None or not written:
                    return None
                try:
                    record = publish_next(
                        objects,
                        store,
                        latest,
                        latest.version + 1,
                        written,
                        metadata={"compacted": sorted(written)},
                        who=who,
                    )
                except VersionConflictError:
                    continue  # a commit landed first: rebase on it
            listed = {chain.files[0].name for chain in written.values()}
            return record.version
        return None
    finally:
        _remove_unlisted(objects, [b for _, b in bases.values() if b.name not in listed])


def _compacted(
    objects: ObjectStore,
    store: str,
    partition: int,
    chain: PartitionChain,
    start: ChainVersion,
    cache: FileCache,
    tmp: Path,
    manifest: StoreManifest,
) -> ChainFile:
    """Partition ``partition``'s ``chain`` built into one base SST and twin, uploaded."""
    work = tmp / str(partition)
    work.mkdir()
    base = work / "base.sst"
    twin = work / "base.parquet" if manifest.kind.has_twins else None
    compact_files(cache, objects, chain.files, base, work / "db", manifest, twin)
    return upload_file(objects, sst_key(store, partition, start.version + 1), base, twin)


def _rebased(
    latest: ChainVersion | None, bases: dict[int, tuple[tuple[ChainFile, ...], ChainFile]]
) -> dict[int, PartitionChain]:
    """The chains of ``latest`` that still start with the files a base replaces, with
    them replaced (what was added on top stays; commit record and ``written_by`` as
    they are)."""
    if latest is None:
        return {}
    written = {}
    for p, (files, base) in bases.items():
        chain = latest.partitions.get(p)
        if chain is None or chain.files[: len(files)] != files:
            continue  # overwritten or compacted since
        written[p] = PartitionChain(
            files=(base, *chain.files[len(files) :]),
            commit=chain.commit,
            written_by=chain.written_by,
        )
    return written


def _remove_unlisted(objects: ObjectStore, files: list[ChainFile]) -> None:
    """Best effort: what is left is an orphan retention removes after its grace."""
    for f in files:
        for key in f.object_keys():
            with contextlib.suppress(OSError, IqkitError):
                objects.delete(key)


def start_background(
    objects: ObjectStore, store: str, manifest: StoreManifest, *, who: str, lock_timeout: float
) -> threading.Thread:
    """``compact_store`` on a thread of its own (not a daemon: a process that ends waits
    for it, so its work is not thrown away). A failure is one ``StoreCleanupWarning``:
    the commit that started it has succeeded, and the next commit tries again."""

    def run() -> None:
        try:
            compact_store(
                objects,
                store,
                manifest,
                who=f"{who} (background compaction)",
                lock_timeout=lock_timeout,
            )
        except Exception as exc:
            warnings.warn(
                StoreCleanupWarning(
                    f"store {store!r}: background compaction failed (the next commit tries "
                    f"again): {exc}"
                ),
                stacklevel=1,
            )

    thread = threading.Thread(target=run, name=f"iqkit-compaction-{store}", daemon=False)
    thread.start()
    return thread
