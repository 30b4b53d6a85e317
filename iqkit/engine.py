"""The query engine: ``iqkit.open(root)`` → ``StateEngine``, the analogue of ``KafkaStreams``.

``engine.query(request)`` runs an IQv2 request against the published versions of a
store's partitions. Request-level problems (unknown store, closed engine) raise;
everything that concerns one partition is that partition's ``QueryResult``, and every
result, failures included, carries the partition's position.

Per partition, checks run in this order: ``DOES_NOT_EXIST`` (partition out of range),
``UNKNOWN_QUERY_TYPE`` (the store kind cannot run the query: checked before the bound),
``NOT_ACTIVE`` (``require_active`` on a version older than the latest),
``NOT_UP_TO_BOUND``, then execution (``STORE_EXCEPTION`` when the partition cannot be
read). A partition that no commit has touched is an *empty partition*, not a failure: it
answers every query with no rows and an empty position, and bounds still apply to it.
``NOT_PRESENT`` is kept for a partition whose data cannot be read from here right now;
a root on the local file system always has its published partitions at hand.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .errors import EngineClosedError, IqkitError
from .query import (
    ChangesQuery,
    FailureReason,
    KeyQuery,
    LagInfo,
    MultiKeyQuery,
    Position,
    QueryResult,
    StateQueryRequest,
    StateQueryResult,
    VersionedKeyQuery,
)
from .query.request import validate_store_name
from .store.encoding.partitioners import Partitioner
from .store.encoding.serdes import get_serde
from .store.format import (
    NEVER_WRITTEN,
    OpenPartition,
    PublishedVersion,
    StoreSnapshot,
    TwinFiles,
)
from .store.formats import format_for
from .store.inputs import is_up_to, offset_lag
from .store.manifest import StoreManifest
from .store.partitions.layers import Trace, twin_scans_enabled
from .store.roots import parse_root
from .store.versions import VERSION_QUERIES, Timeline, VersionNotRetained, VersionReader

#: What a query runs against: the served version, None (nothing published), or why the
#: published version cannot be established (every partition then fails with it).
Served = PublishedVersion | IqkitError | None

#: How a partition's ``StateEngine`` trace line names the version it read, written in
#: :meth:`StateEngine._run_partition` and read back by :func:`served_version` (one home
#: for the text format, so notebooks never parse it themselves).
_SERVED_AT = "at version"
_SERVED_VERSION = re.compile(rf"\b{_SERVED_AT} (\d+)\b")


class _StoreView:
    """One store as the engine routes to it: the facts requests are checked and routed
    with, and the store's snapshot (served version, open partitions)."""

    def __init__(self, snapshot: StoreSnapshot, partitioner: Partitioner) -> None:
        self.snapshot = snapshot
        self.manifest = snapshot.manifest
        self.key_serde = get_serde(self.manifest.key_serde)
        self.partitions = self.manifest.partitions
        self.partitioner = partitioner
        self.routes_keys = self.partitioner.routes_keys
        self.query_types = self.manifest.kind.query_types
        #: Routed KeyQueries with default options take ``StateEngine._look_up``: a
        #: key-value store whose partitioner routes keys, on a snapshot that serves them.
        self.looks_up_keys = (
            self.routes_keys and KeyQuery in self.query_types and snapshot.serves_key_lookups
        )  # and so its open partitions' layers are ``TypedKeyValueLayer``s


class StateEngine:
    """Runs IQv2 requests against the stores under one root: a local folder, or an
    object-storage URL (``s3://``, ``gs://``, ``abfs://``), read through the root's
    storage format (``store.formats.format_for``; chain stores' files through the local
    file cache, ``IQKIT_CACHE``).

    Use ``iqkit.open(root)``. Without ``as_of`` every query reads each store's latest
    published version; with ``as_of`` (an int for every store, or a dict store → version)
    the engine is pinned to those versions.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        as_of: int | Mapping[str, int] | None = None,
    ) -> None:
        parsed = parse_root(root)  # a URL is never a folder "s3:"
        #: The root's format: the one thing the engine asks about stores.
        self._format = format_for(parsed)
        self.root: Path | str = parsed.local if parsed.local is not None else parsed.url
        self._format.check_root()
        self._as_of = as_of
        self._stores: dict[str, _StoreView] = {}
        self._closed = False
        if isinstance(as_of, Mapping):
            for name in as_of:
                self._view(name)  # validates names and versions up front
        elif as_of is not None:
            if not isinstance(as_of, int) or isinstance(as_of, bool) or as_of < 1:
                raise ValueError(f"as_of must be a version number >= 1 or a dict, got {as_of!r}")
            for name in self.store_names():
                self._view(name)

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> StateEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every open partition (ending live iterators first)."""
        if self._closed:
            return
        self._closed = True
        for view in self._stores.values():
            view.snapshot.close()
        self._stores.clear()

    @property
    def is_closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine is closed; open a new one with iqkit.open(root)")

    # -- metadata ------------------------------------------------------------------------
    def store_names(self) -> list[str]:
        """Names of the stores under the root, sorted."""
        self._check_open()
        return self._format.store_names()

    def manifest(self, store: str) -> StoreManifest:
        return self._view(store).manifest

    def version(self, store: str) -> int | None:
        """The version of ``store`` this engine serves (``None``: nothing published)."""
        record = self._view(store).snapshot.current()
        return record.version if record is not None else None

    def versions(self, store: str) -> list[int]:
        """Versions of ``store`` still on disk (retained), ascending."""
        return self._view(store).snapshot.versions()

    def approximate_rows(self, store: str) -> int:
        """RocksDB's own estimate of the rows of the version served (``0``: nothing
        published), read from the partitions the engine keeps open anyway: what a
        notebook's ``%iq stores`` shows without scanning.

        An estimate (``rocksdb.estimate-num-keys``): it counts keys deleted but not yet
        compacted away. iqkit's own keys are taken out: one commit record per partition,
        and a window store keeps two keys per window (the data and the time index).
        Raises ``IqkitError`` when the store cannot be read.
        """
        view = self._view(store)
        record = view.snapshot.current()
        if record is None:
            return 0
        total = 0
        for p in sorted(record.partitions):
            keys = view.snapshot.partition(record, p).partition.approximate_rows()
            total += max(0, keys - 1)
        return view.manifest.kind.records_in(total)

    def twin_files(self, store: str) -> TwinFiles | None:
        """The columnar twins of the version of ``store`` served now, as local files
        pinned until the caller's ``release()`` (``TwinFiles``): what ``iqkit.sql``
        hands DuckDB's own Parquet reader. None when that version has no twins for some
        partition (an older store, a window store), when nothing is published, or
        within ``twin_scans(False)``: then read the store's rows instead. Raises
        ``IqkitError`` when the version or a file cannot be read."""
        if not twin_scans_enabled():
            return None
        view = self._view(store)
        record = view.snapshot.current()
        if record is None:
            return None
        with view.snapshot.reading():
            return view.snapshot.twin_files(record)

    def scan_bytes(self, store: str) -> dict[int, int]:
        """Per partition of the version of ``store`` served now, the bytes a full scan
        reads (twins, else SSTs), from its version record: nothing is fetched or built.
        Empty when nothing is published."""
        view = self._view(store)
        return view.snapshot.scan_bytes(view.snapshot.current())

    def partition_for_key(self, store: str, key: Any) -> int | None:
        """The partition that owns ``key`` (KIP-535 ``queryMetadataForKey``).

        ``None`` for a store written with the ``explicit`` partitioner: the writer chose
        partitions, so no function of the key can say (key queries fan out instead).
        """
        view = self._view(store)
        if key is None:
            raise ValueError("key must not be None")
        if not view.routes_keys:
            return None
        key_bytes = _serialize_key(view, key)
        return view.partitioner.partition(key_bytes, view.manifest.partitions)

    def _view(self, store: str) -> _StoreView:
        self._check_open()
        view = self._stores.get(store)
        if view is not None:
            return view
        validate_store_name(store)
        pinned = self._as_of.get(store) if isinstance(self._as_of, Mapping) else self._as_of
        snapshot = self._format.open_snapshot(store, pinned)
        view = _StoreView(snapshot, self._format.partitioner(snapshot.manifest))
        self._stores[store] = view
        return view

    # -- queries -------------------------------------------------------------------------
    def query(self, request: StateQueryRequest) -> StateQueryResult:
        """Execute ``request`` on each targeted partition; results stand alone."""
        view = self._stores.get(request.store_name)
        if view is None or self._closed:
            view = self._view(request.store_name)
        query = request.query
        if view.looks_up_keys and type(query) is KeyQuery and request.uses_defaults:
            result = self._look_up(view, query)
            if result is not None:
                return result
        with view.snapshot.reading():
            return self._query(view, request)

    def _look_up(self, view: _StoreView, query: KeyQuery) -> StateQueryResult | None:
        """A routed KeyQuery with default options, on the path that runs most often in a
        notebook: the served version's freshness check, the key serialized once (for the
        owner and the read), the owner's open partition by number, its layers' key
        lookup. ``None`` whenever anything is not the plain case (the partition not yet
        opened by this engine, a key the serde refuses, a read that fails): ``_query``
        then runs it and makes any failure the partition's result."""
        snapshot = view.snapshot
        try:
            if snapshot.current() is None:
                return None
            key_bytes = view.key_serde.serialize(query.key)
            p = view.partitioner.partition(key_bytes, view.partitions)
            entry = snapshot.hot_partition(p)
            if entry is None:
                return None
            value = entry.layers.execute_key(key_bytes, query.is_skip_cache)
        except (IqkitError, TypeError, ValueError):
            return None
        return StateQueryResult._of_one(p, QueryResult.for_result(value, position=entry.position))

    def _query(self, view: _StoreView, request: StateQueryRequest) -> StateQueryResult:
        record = view.snapshot.served()
        query = request.query
        if isinstance(query, VERSION_QUERIES):
            return self._query_versions(view, record, request)
        n = view.manifest.partitions
        result = StateQueryResult()

        if request.is_all_partitions:
            targets: Iterable[int] = range(n)
            if view.routes_keys and isinstance(query, KeyQuery):
                owner = view.partitioner.partition(_serialize_key(view, query.key), n)
                result.add_result(owner, self._run_partition(view, record, owner, query, request))
                return result
            if view.routes_keys and isinstance(query, MultiKeyQuery):
                for p, keys in _group_by_owner(view, query.keys).items():
                    sub = MultiKeyQuery.with_keys(keys)
                    if query.is_skip_cache:
                        sub = sub.skip_cache()
                    result.add_result(p, self._run_partition(view, record, p, sub, request))
                return result
        else:
            targets = sorted(request.partitions)
        for p in targets:
            result.add_result(p, self._run_partition(view, record, p, query, request))
        return result

    def _run_partition(
        self,
        view: _StoreView,
        record: Served,
        p: int,
        query: Any,
        request: StateQueryRequest,
    ) -> QueryResult[Any]:
        """Checks, then execution through the partition's layers (every request the
        key-lookup path, ``_look_up``, does not take)."""
        started = time.perf_counter_ns()
        entry, failure = self._prepare(view, record, p, query, request)
        if failure is not None:
            return failure
        assert entry is not None
        trace = Trace(request.execution_info_enabled)
        try:
            value = entry.layers.execute(query, trace)
        except IqkitError as exc:
            return self._store_exception(view, p, entry.position, exc, trace)
        if trace.enabled:
            version = record.version if record is not None else None  # type: ignore[union-attr]
            if entry.fetched is not None:  # what opening the partition cost
                for line in entry.fetched.split("\n"):  # and why the cache is elsewhere
                    trace.add("FileCache", started, line)
            detail = f"store {view.manifest.name!r} partition {p} {_SERVED_AT} {version}"
            if entry.never_written:
                detail += f" ({NEVER_WRITTEN})"
            trace.add("StateEngine", started, detail)
            return QueryResult.for_result(
                value, position=entry.position, execution_info=trace.lines
            )
        return QueryResult.for_result(value, position=entry.position)

    def _prepare(
        self,
        view: _StoreView,
        record: Served,
        p: int,
        query: Any,
        request: StateQueryRequest,
    ) -> tuple[OpenPartition | None, QueryResult[Any] | None]:
        """Open partition ``p`` and run the checks; return (partition, None) or
        (None, failure)."""
        manifest = view.manifest
        n = manifest.partitions
        store = manifest.name
        if p >= n:
            return None, QueryResult.for_failure(
                FailureReason.DOES_NOT_EXIST,
                f"store {store!r} has {n} partitions (0..{n - 1}); partition {p} does not exist",
            )
        if not isinstance(query, view.query_types):
            return None, QueryResult.for_unknown_query_type(query, store)
        if isinstance(record, IqkitError):  # a damaged store: corruption, never "empty"
            return None, self._store_exception(view, p, Position.empty(), record, Trace(False))
        try:
            entry = view.snapshot.partition(record, p)  # never written: an empty partition
        except IqkitError as exc:
            return None, self._store_exception(view, p, Position.empty(), exc, Trace(False))
        if request.is_require_active and record is not None:
            latest = view.snapshot.latest_number()
            if latest is not None and record.version < latest:
                return None, QueryResult.for_failure(
                    FailureReason.NOT_ACTIVE,
                    f"store {store!r} partition {p} is served from version {record.version}, "
                    f"older than the latest published version {latest}",
                    position=entry.position,
                )
        bound = request.position_bound
        if not bound.is_unbounded and not is_up_to(
            entry.position, bound.position, p, view.partitioner
        ):
            return None, QueryResult.not_up_to_bound(entry.position, bound, p)
        return entry, None

    # -- version queries ---------------------------------------------------------------------
    def _query_versions(
        self, view: _StoreView, record: Served, request: StateQueryRequest
    ) -> StateQueryResult:
        """A version query (store/versions.py): a key's on its owner partition (when the
        partitioner routes keys), changes on every partition asked for. Which versions
        it reads is worked out once for all partitions."""
        query = request.query
        n = view.manifest.partitions
        targets: Iterable[int]
        if not request.is_all_partitions:
            targets = sorted(request.partitions)
        elif view.routes_keys and not isinstance(query, ChangesQuery):
            targets = [view.partitioner.partition(_serialize_key(view, query.key), n)]
        else:
            targets = range(n)
        plan: list[Any] = []  # (reader, timeline, records) or the failure, once
        result = StateQueryResult()
        targets = list(targets)
        # One partition asked: its records need hold its chain alone (cheaper to read).
        only = targets[0] if len(targets) == 1 else None
        for p in targets:
            result.add_result(p, self._run_versions(view, record, p, request, plan, only))
        return result

    def _plan_versions(
        self, view: _StoreView, record: PublishedVersion, query: Any, only: int | None
    ) -> tuple[VersionReader, Timeline, dict[int, PublishedVersion]]:
        reader = VersionReader(view.manifest)
        retained = view.snapshot.versions()
        numbers = reader.versions_for(query, retained, record.version)
        records = {v: view.snapshot.published(v, only) for v in numbers}
        times = {v: int(r.created_at * 1000) for v, r in records.items()}
        return reader, Timeline(numbers, times), records

    def _run_versions(
        self,
        view: _StoreView,
        record: Served,
        p: int,
        request: StateQueryRequest,
        plan: list[Any],
        only: int | None = None,
    ) -> QueryResult[Any]:
        started = time.perf_counter_ns()
        query = request.query
        manifest = view.manifest
        n = manifest.partitions
        if p >= n:
            return QueryResult.for_failure(
                FailureReason.DOES_NOT_EXIST,
                f"store {manifest.name!r} has {n} partitions (0..{n - 1}); "
                f"partition {p} does not exist",
            )
        if not isinstance(query, view.query_types):
            return QueryResult.for_failure(
                FailureReason.UNKNOWN_QUERY_TYPE,
                f"{type(query).__name__} is not for {manifest.kind.label}s, and store "
                f"{manifest.name!r} is one",
            )
        if isinstance(record, IqkitError):
            return self._store_exception(view, p, Position.empty(), record, Trace(False))
        if record is None:  # nothing published: no record, no history, no change
            empty: Any = [] if not isinstance(query, VersionedKeyQuery) else None
            return QueryResult.for_result(empty, position=Position.empty())
        position = view.snapshot.position(record, p)
        bound = request.position_bound
        if not bound.is_unbounded and not is_up_to(position, bound.position, p, view.partitioner):
            return QueryResult.not_up_to_bound(position, bound, p)
        trace = Trace(request.execution_info_enabled)
        try:
            if not plan:
                try:
                    plan.append(self._plan_versions(view, record, query, only))
                except VersionNotRetained as exc:
                    plan.append(exc)
            if isinstance(plan[0], VersionNotRetained):
                return QueryResult.for_failure(
                    FailureReason.DOES_NOT_EXIST, str(plan[0]), position=position
                )
            reader, timeline, records = plan[0]
            if timeline.versions:
                position = view.snapshot.position(records[timeline.versions[-1]], p)
            walk = view.snapshot.version_walk(p, records)
            try:
                value = reader.execute(query, walk, timeline)
                notes = walk.notes()
            finally:
                walk.close()
        except VersionNotRetained as exc:
            return QueryResult.for_failure(
                FailureReason.DOES_NOT_EXIST, str(exc), position=position
            )
        except IqkitError as exc:
            return self._store_exception(view, p, position, exc, trace)
        if trace.enabled:
            span = timeline.versions
            read = f"versions {span[0]}..{span[-1]}" if span else "no version"
            trace.add("VersionWalk", started, f"{read}: " + "; ".join(notes))
            trace.add(
                "StateEngine",
                started,
                f"store {manifest.name!r} partition {p} {_SERVED_AT} {record.version}",
            )
            return QueryResult.for_result(value, position=position, execution_info=trace.lines)
        return QueryResult.for_result(value, position=position)

    @staticmethod
    def _store_exception(
        view: _StoreView, p: int, position: Position, exc: Exception, trace: Trace
    ) -> QueryResult[Any]:
        return QueryResult.for_failure(
            FailureReason.STORE_EXCEPTION,
            f"store {view.manifest.name!r} partition {p}: {type(exc).__name__}: {exc}",
            position=position,
            execution_info=trace.lines,
        )

    # -- lag -----------------------------------------------------------------------------
    def lags(
        self,
        end: Position | Mapping[str, Any] | None = None,
        *,
        stores: Iterable[str] | None = None,
    ) -> dict[str, dict[int, LagInfo]]:
        """Per store and partition, how far the store is behind its source.

        ``end`` (one Position for every store, or a dict store → Position) gives log-end
        offsets; otherwise each store's recorded source end offsets are used. A store
        whose end is unknown reports ``end_position=None`` and ``offset_lag=None``.
        ``stores`` limits the answer to those stores (an unknown name raises
        ``UnknownStoreError``); by default every store is reported.
        """
        self._check_open()
        out: dict[str, dict[int, LagInfo]] = {}
        names = self.store_names() if stores is None else list(stores)
        for name in names:
            view = self._view(name)
            record = view.snapshot.current()
            store_end = _end_for_store(end, name, record)
            out[name] = {}
            for p in range(view.manifest.partitions):
                current = view.snapshot.position(record, p)
                lag = (
                    None
                    if store_end is None
                    else offset_lag(current, store_end, p, view.partitioner)
                )
                out[name][p] = LagInfo(
                    store=name,
                    partition=p,
                    current_position=current,
                    end_position=store_end,
                    offset_lag=lag,
                )
        return out

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        pin = f", as_of={self._as_of!r}" if self._as_of is not None else ""
        return f"StateEngine({os.fspath(self.root)!r}{pin}, {state})"


def open(
    root: str | os.PathLike[str], *, as_of: int | Mapping[str, int] | None = None
) -> StateEngine:
    """Open the stores under ``root`` for queries (see ``StateEngine``)."""
    return StateEngine(root, as_of=as_of)


# -- helpers -------------------------------------------------------------------------------
def served_version(result: StateQueryResult) -> int | None:
    """The store version a query result was read from, as its partitions' traces name it
    (``None``: the query ran without ``enable_execution_info``, or read nothing
    published). KIP-796's result carries no version, so the engine's trace line does."""
    for qr in result.partition_results.values():
        for line in qr.execution_info:
            if line.startswith("Handled in StateEngine"):
                m = _SERVED_VERSION.search(line)
                if m:
                    return int(m.group(1))
    return None


def _serialize_key(view: _StoreView, key: Any) -> bytes:
    try:
        return view.key_serde.serialize(key)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"store {view.manifest.name!r}: key {exc}") from None


def _group_by_owner(view: _StoreView, keys: Iterable[Any]) -> dict[int, list[Any]]:
    groups: dict[int, list[Any]] = {}
    n = view.manifest.partitions
    for key in keys:
        p = view.partitioner.partition(_serialize_key(view, key), n)
        groups.setdefault(p, []).append(key)
    return dict(sorted(groups.items()))


def _end_for_store(
    end: Position | Mapping[str, Any] | None, store: str, record: PublishedVersion | None
) -> Position | None:
    """``end`` is one Position for every store, or a dict store → Position (or map)."""
    if end is None:
        if record is None or record.source_end is None:
            return None
        return Position.from_map(record.source_end)
    if isinstance(end, Position):
        return end
    value = end.get(store)
    if value is None:
        return None
    return value if isinstance(value, Position) else Position.from_map(value)
