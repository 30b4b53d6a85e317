"""The SST-chain format behind ``format.StoreFormat``: every root's format.

Immutable SSTs under unique names plus one small record per version, published with one
exclusive create (store/chain/records.py); nothing is renamed or rewritten, so it serves object
storage (``s3://``, ``gs://``, ``abfs://``) and local folders alike. Readers go through
``snapshot.ChainSnapshot``, ``StoreWriter`` through ``stores.ChainPublisher``, Spark
jobs through ``jobs.ChainJobCommit`` (modules of this package); this class is the one
place that puts them together for a root.
"""

from __future__ import annotations

import os

from ...errors import IqkitError, StoreNotFoundError, UnknownStoreError
from ..cache import FileCache, reader_cache
from ..format import StoreFormat
from ..manifest import StoreManifest, check_same_settings
from ..objects import open_objects
from ..roots import StoreRoot
from .jobs import ChainJobCommit
from .records import ChainVersion, latest_version
from .retention import collect_chain_garbage
from .snapshot import ChainSnapshot, OpenChains
from .stores import (
    ChainPublisher,
    chain_store_names,
    ensure_chain_store,
    read_chain_manifest,
)
from .verify import VerifyReport, verify_chain_stores

__all__ = ["ChainFormat"]


class ChainFormat(StoreFormat):
    """The chain format on one root (module docstring). A reader's file cache and its
    bound on open partitions are made at its first snapshot and shared by its stores."""

    name = "chain"

    def __init__(self, root: StoreRoot) -> None:
        super().__init__(root)
        self.objects = open_objects(root)
        self._cache: FileCache | None = None
        self._bound: OpenChains | None = None

    def check_root(self) -> None:
        local = self.root.local
        if local is not None:
            if not os.path.isdir(local):
                # Never create anything for a reader: a typo must not make an empty root.
                raise StoreNotFoundError(f"no iqkit root folder at {self.root.text!r}")
            return
        # One listing now: a missing credential or an unreachable endpoint is one line
        # at open, not a failure of every later query.
        chain_store_names(self.objects)

    def store_names(self) -> list[str]:
        return chain_store_names(self.objects)

    def read_manifest(self, store: str) -> StoreManifest:
        return read_chain_manifest(self.objects, store)

    def open_snapshot(self, store: str, pinned: int | None) -> ChainSnapshot:
        if self._cache is None or self._bound is None:
            self._cache, self._bound = reader_cache(), OpenChains()
        return ChainSnapshot(self.objects, store, pinned, self._cache, self._bound)

    def latest_published(self, store: str) -> ChainVersion | None:
        try:
            read_chain_manifest(self.objects, store)
        except UnknownStoreError:
            return None
        return latest_version(self.objects, store)

    def verify(self, stores: list[str] | None, *, repair: bool = False) -> VerifyReport:
        return verify_chain_stores(self.objects, stores, repair=repair)

    def _ensure_store(
        self, manifest: StoreManifest, *, settings: tuple[str, ...], asked: str, create: bool
    ) -> StoreManifest:
        if create:
            return ensure_chain_store(self.objects, manifest, settings=settings, asked=asked)
        try:
            existing = read_chain_manifest(self.objects, manifest.name)
        except UnknownStoreError:
            return manifest
        return check_same_settings(existing, manifest, settings=settings, asked=asked)

    def _publisher(self, store: str) -> ChainPublisher:
        return ChainPublisher(self.objects, store)

    def _open_job_commit(
        self, store: str, *, mode: str, who: str, lock_timeout: float, create: StoreManifest | None
    ) -> ChainJobCommit:
        return ChainJobCommit(
            self.objects, store, mode=mode, who=who, create=create, lock_timeout=lock_timeout
        )

    def _collect_garbage(self, store: str, retain: int) -> list[str]:
        try:
            return collect_chain_garbage(self.objects, store, retain=retain).problems
        except IqkitError as exc:
            return [str(exc)]
