"""A Structured Streaming checkpoint as a root of read-only stores: ``format.StoreFormat``
for Spark's own state.

``iqkit.open("<checkpoint folder>")`` (local or object storage) serves each stateful
operator's state store as a store named by ``layout``'s rule, shaped by ``shape`` and
read through ``providers``. Nothing is ever written to the checkpoint: every write, new
store and job commit is refused in one line by ``StoreFormat`` before this class is
asked, and reading opens no file for writing.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

from ...errors import StoreNotFoundError, UnknownStoreError
from ..cache import FileCache, reader_cache
from ..encoding.partitioners import Partitioner
from ..format import StoreFormat
from ..manifest import StoreManifest
from ..objects import open_objects
from ..roots import StoreRoot
from .joins import StoreReader, open_store
from .layout import OperatorStore, operator_stores
from .materialize import scratch_folder
from .providers import StateReader
from .shape import StateShape, UnsupportedStateError
from .snapshot import CheckpointSnapshot, CheckpointVersion, committed_versions, newest_record
from .spark_release import attributed

__all__ = ["CheckpointFormat"]


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _naming_spark(method: _Method) -> _Method:
    """A public entry point whose refusals of something unknown name the Spark that
    wrote the checkpoint (``spark_release.attributed``)."""

    @functools.wraps(method)
    def wrapper(self: CheckpointFormat, *args: Any, **kwargs: Any) -> Any:
        with attributed(self.objects):
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class CheckpointFormat(StoreFormat):
    """A checkpoint folder's stores (module docstring). Stores, shapes and manifests are
    read once per format object: an engine's view of a checkpoint is one query's."""

    name = "spark-checkpoint"
    read_only = True

    def __init__(self, root: StoreRoot) -> None:
        super().__init__(root)
        self.objects = open_objects(root)
        self._stores: dict[str, OperatorStore] | None = None
        self._reader: StateReader | None = None
        self._shapes: dict[str, StateShape] = {}
        #: What reads each store (a join side's own reader), chosen with its shape.
        self._readers: dict[str, StoreReader] = {}
        self._manifests: dict[str, StoreManifest] = {}
        #: The reader's file cache (``IQKIT_CACHE``), made at its first snapshot: where
        #: replayed state versions are kept as databases (``materialize``).
        self._cache: FileCache | None = None

    # -- reading ---------------------------------------------------------------------------
    @_naming_spark
    def check_root(self) -> None:
        local = self.root.local
        if local is not None and not os.path.isdir(local):
            raise StoreNotFoundError(f"no checkpoint folder at {self.root.text!r}")
        self._operator_stores()

    def _operator_stores(self) -> dict[str, OperatorStore]:
        if self._stores is None:
            self._stores = {s.name: s for s in operator_stores(self.objects)}
        return self._stores

    def _state_reader(self) -> StateReader:
        if self._reader is None:
            self._reader = StateReader(self.objects)
        return self._reader

    def _reader_cache(self) -> FileCache:
        if self._cache is None:
            self._cache = reader_cache()
        return self._cache

    def _store(self, name: str) -> OperatorStore:
        stores = self._operator_stores()
        store = stores.get(name)
        if store is None:
            notes = {n: s.note for n, s in stores.items() if s.note}
            where = f"the checkpoint at {self.root.text}"
            raise UnknownStoreError(name, stores, where=where, notes=notes)
        return store

    @_naming_spark
    def store_names(self) -> list[str]:
        return sorted(self._operator_stores())

    def _shape(self, store: OperatorStore) -> StateShape:
        shape = self._shapes.get(store.name)
        if shape is None:
            self._readers[store.name], shape = open_store(self._state_reader(), store)
            self._shapes[store.name] = shape
        return shape

    def _reader_for(self, store: OperatorStore) -> StoreReader:
        """What reads ``store``'s state, chosen with its shape (``joins.open_store``)."""
        self._shape(store)
        return self._readers[store.name]

    @_naming_spark
    def read_manifest(self, store: str) -> StoreManifest:
        manifest = self._manifests.get(store)
        if manifest is None:
            found = self._store(store)
            if found.not_supported is not None:
                raise UnsupportedStateError(found.not_supported)
            shape = self._shape(found)
            window_size = None
            if shape.window_index is not None:
                versions = committed_versions(self.objects)
                if versions:
                    with scratch_folder(self._reader_cache(), self.objects) as work_dir:
                        rows = self._state_reader().first_key_rows(found, versions[-1], work_dir)
                        window_size = shape.window_size_ms(rows)
            provider = self._state_reader().provider_name
            # The operator metadata's partition count: a snapshot serves its version's
            # own (``layout.state_partitions``: a repartition does not update the metadata).
            manifest = self._manifests[store] = shape.manifest(found, window_size, provider)
        return manifest

    def partitioner(self, manifest: StoreManifest) -> Partitioner:
        return self._shape(self._store(manifest.name)).partitioner()

    @_naming_spark
    def open_snapshot(self, store: str, pinned: int | None) -> CheckpointSnapshot:
        manifest = self.read_manifest(store)
        found = self._store(store)
        return CheckpointSnapshot(
            self.objects,
            found,
            manifest,
            self._shape(found),
            self._reader_for(found),
            self._reader_cache(),
            pinned,
        )

    @_naming_spark
    def latest_published(self, store: str) -> CheckpointVersion | None:
        found = self._operator_stores().get(store)
        if found is None:
            return None
        return newest_record(self.objects, found)

    # -- writing: refused before these are reached (``read_only``) ---------------------------
    def _ensure_store(self, manifest, *, settings, asked, create):  # type: ignore[no-untyped-def]
        raise AssertionError("unreachable: a read-only format")

    def _publisher(self, store):  # type: ignore[no-untyped-def]
        raise AssertionError("unreachable: a read-only format")

    def _collect_garbage(self, store, retain):  # type: ignore[no-untyped-def]
        raise AssertionError("unreachable: a read-only format")

    def _open_job_commit(self, store, *, mode, who, lock_timeout, create):  # type: ignore[no-untyped-def]
        raise AssertionError("unreachable: a read-only format")
