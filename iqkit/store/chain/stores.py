"""Stores on an object root (``s3://``, ``gs://``, ``abfs://``): their manifests, their
names, and the publish step of a ``StoreWriter`` commit in the SST-chain format.

A store on an object root is ``<root>/<store>/manifest.json`` (written once, by one
``create_exclusive``: two creators racing cannot both write it, and the loser gets the
same ``StoreExistsError`` / "same settings: fine" rules as a local root) plus the
chain's records and SSTs (store/chain/records.py). The stores of a root are the prefixes holding a
manifest. A local store folder still in the folder format of earlier iqkits is refused
when its manifest is read, for readers and writers alike (``format.is_folder_store``).

``ChainPublisher`` is what ``StoreWriter`` hands its buffered partitions to on such a
root: each partition's changes, sorted, become one delta SST (store/chain/write.py), and the
next version is published with one exclusive create — a writer that lost the race gets
``VersionConflictError`` naming the version and nothing of its commit is visible. On a
local root it first takes the store's commit lock (``locking.CommitLock``, the store's
``writer.lock``), so local writers wait for each other as they always have
(``lock_timeout``; a writer that gives up gets ``StoreLockedError`` naming the holder)
instead of one losing the race: only writers that cannot share a lock race.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from ...errors import (
    IqkitError,
    ObjectExistsError,
    ObjectMissingError,
    StoreCleanupWarning,
    StoreCorruptedError,
    UnknownStoreError,
)
from ...query.position import Position
from ...query.request import validate_store_name
from ..cache import FileCache
from ..format import folder_store_error, is_folder_store
from ..manifest import STORE_SETTINGS, StoreManifest, check_same_settings
from ..names import CHAIN_FORMAT_VERSION, MANIFEST_FILE
from ..objects import ObjectStore
from .compaction import INLINE_COMPACT_AFTER, compact_store, start_background
from .records import ChainVersion, latest_version, list_versions
from .retention import collect_chain_garbage
from .write import COMPACT_AFTER_DELTAS, chain_commit_lock, commit_version, overlong

__all__ = [
    "ChainPublisher",
    "as_chain_manifest",
    "chain_commit_lock",  # write.py's, re-exported: migrate and jobs take it from here
    "chain_store_names",
    "clean_after_publish",
    "ensure_chain_store",
    "manifest_key",
    "read_chain_manifest",
]


def manifest_key(store: str) -> str:
    return f"{validate_store_name(store)}/{MANIFEST_FILE}"


def as_chain_manifest(manifest: StoreManifest) -> StoreManifest:
    """``manifest`` as a chain store records it (its format version says so)."""
    return dataclasses.replace(manifest, format_version=CHAIN_FORMAT_VERSION)


def chain_store_names(objects: ObjectStore) -> list[str]:
    """Names of the stores on ``objects``' root: the prefixes holding a manifest.

    On object storage one listing of the whole root (it has no folders to list one level
    of); its cost grows with the files on the root, which is why the engine lists once.
    A local root lists one level: its store folders holding a manifest."""
    local = objects.root.local
    if local is not None:
        try:
            entries = os.listdir(local)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(e for e in entries if _holds_manifest(objects, e))
    names = []
    for key in objects.list():
        store, _, rest = key.partition("/")
        if rest == MANIFEST_FILE:
            names.append(store)
    return sorted(names)


def _holds_manifest(objects: ObjectStore, entry: str) -> bool:
    """Whether the local root's entry ``entry`` is a store folder holding a manifest (a
    name no store can have, a link or a folder in the manifest's place: not a store)."""
    try:
        return objects.exists(manifest_key(entry))
    except (ValueError, IqkitError):
        return False


def read_chain_manifest(objects: ObjectStore, store: str) -> StoreManifest:
    """``store``'s manifest; ``UnknownStoreError`` (naming the stores there) if none;
    ``FolderFormatStoreError`` for a local store still in the folder format (one line
    naming the command that converts it: ``format.folder_store_error``)."""
    key = manifest_key(store)
    try:
        text = objects.read_bytes(key)
    except ObjectMissingError:
        raise UnknownStoreError(store, chain_store_names(objects)) from None
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StoreCorruptedError(
            f"store {store!r}: {objects.where(key)} is damaged: byte {exc.start} "
            f"({text[exc.start : exc.start + 1]!r}) is not UTF-8 text"
        ) from None
    manifest = StoreManifest.parse(decoded, store, objects.where(key))
    local = objects.root.local
    if (
        local is not None
        and manifest.format_version != CHAIN_FORMAT_VERSION
        and is_folder_store(os.path.join(local, store))
    ):
        raise folder_store_error(objects.root, store)
    return manifest


def ensure_chain_store(
    objects: ObjectStore,
    manifest: StoreManifest,
    *,
    settings: tuple[str, ...] = STORE_SETTINGS,
    asked: str = "asked",
) -> StoreManifest:
    """Create ``manifest``'s store on ``objects`` (one exclusive create), or return the
    existing one when its settings match (``manifest.check_same_settings``)."""
    manifest = as_chain_manifest(manifest)
    try:
        objects.create_exclusive(manifest_key(manifest.name), manifest.to_json().encode())
        return manifest
    except ObjectExistsError:
        existing = read_chain_manifest(objects, manifest.name)
    return check_same_settings(existing, manifest, settings=settings, asked=asked)


class Buffered(Protocol):
    """What a writer buffered for one partition (``writer._PartitionBuffer``): its
    changes sorted by raw key, each key once (``None``: a delete)."""

    changes: Iterable[tuple[bytes, bytes | None]]
    position: Position
    puts: int
    deletes: int


class ChainPublisher:
    """The publish step of ``StoreWriter`` on an object root (module docstring)."""

    def __init__(self, objects: ObjectStore, store: str) -> None:
        self.objects = objects
        self.store = store
        self.manifest = read_chain_manifest(objects, store)
        self.background: threading.Thread | None = None

    def latest_number(self) -> int | None:
        numbers = list_versions(self.objects, self.store)
        return numbers[-1] if numbers else None

    def publish(
        self,
        buffers: Mapping[int, Buffered],
        *,
        source_end: Position | None,
        metadata: Mapping[str, Any],
        who: str,
        lock_timeout: float,
        compaction: str = "inline",
    ) -> int:
        """Commit ``buffers`` as the next version; returns its number. On an object
        root the exclusive create of the version record decides a race; on a local root
        the store's commit lock (waited for up to ``lock_timeout`` seconds) serializes
        writers first (module docstring). Chains this version leaves longer than
        ``COMPACT_AFTER_DELTAS`` are compacted by a version of their own on a thread
        (``compaction.start_background``; ``compaction="inline"``: by this commit)."""
        inline = compaction == "inline"
        with chain_commit_lock(self.objects, self.store, who=who, timeout=lock_timeout):
            record = self._publish(
                buffers,
                source_end=source_end,
                metadata=metadata,
                who=who,
                compact_after=COMPACT_AFTER_DELTAS if inline else INLINE_COMPACT_AFTER,
            )
        self.background = None
        if not inline and overlong(record):
            self.background = start_background(
                self.objects, self.store, self.manifest, who=who, lock_timeout=lock_timeout
            )
        return record.version

    def compact(self, *, who: str, lock_timeout: float) -> int | None:
        """Every chain with deltas compacted into one base (``compaction.compact_store``)."""
        return compact_store(
            self.objects,
            self.store,
            self.manifest,
            who=who,
            lock_timeout=lock_timeout,
            partitions=range(self.manifest.partitions),
        )

    def _publish(
        self,
        buffers: Mapping[int, Buffered],
        *,
        source_end: Position | None,
        metadata: Mapping[str, Any],
        who: str,
        compact_after: int,
    ) -> ChainVersion:
        previous = latest_version(self.objects, self.store, partitions=self.manifest.partitions)
        record = commit_version(
            self.objects,
            self.store,
            previous,
            {p: buf.changes for p, buf in buffers.items()},
            cache=FileCache(),
            positions={p: buf.position for p, buf in buffers.items()},
            counts={p: {"puts": buf.puts, "deletes": buf.deletes} for p, buf in buffers.items()},
            source_end=source_end,
            metadata=metadata,
            who=who,
            manifest=self.manifest,
            compact_after=compact_after,
        )
        clean_after_publish(self.objects, self.store, record.version, self.manifest.retention)
        return record


def clean_after_publish(objects: ObjectStore, store: str, version: int, retain: int) -> None:
    """Retention after ``version`` was published: what it cannot remove (or an error while
    it lists) is one ``StoreCleanupWarning``, never an error — the commit has succeeded, and the
    next commit's retention tries again."""
    try:
        problems = collect_chain_garbage(objects, store, retain=retain).problems
    except IqkitError as exc:
        problems = [str(exc)]
    if problems:
        warnings.warn(
            StoreCleanupWarning(
                f"store {store!r}: version {version} was published, but cleaning up "
                f"failed (the next commit retries): {'; '.join(problems)}"
            ),
            stacklevel=3,
        )
