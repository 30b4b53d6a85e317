"""Executing :class:`IQCommand`s: what one notebook has open, and how a command runs.

An ``IQSession`` holds the root, its engine (opened lazily, reopened by ``open``), the
last result (for ``%iq trace``), results named with ``--as``, and a private DuckDB
session. The magic owns one; the panel shares it. Nothing here is class-level state:
two shells get two sessions.

Decisions (see docs/DECISIONS.md, "Jupyter"):
* The engine always records the execution trace (about a microsecond per layer), so
  ``%iq trace`` and per-partition timings work for every result; ``--trace`` only opens
  the trace section in the output.
* Results are materialised (rows read into Arrow) and iterators closed before the
  command returns, so nothing keeps a partition open between cells. ``autolimit``
  (default 100,000 rows) keeps an accidental ``scan`` of a huge store from filling the
  kernel's memory; the result says it was truncated, and ``--limit 0`` reads everything.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from IPython.core.error import UsageError

from ..engine import StateEngine
from ..engine import open as open_engine
from ..errors import IqkitError, RootError
from ..query import (
    ChangesQuery,
    KeyQuery,
    MultiKeyQuery,
    MultiVersionedKeyQuery,
    PrefixScanQuery,
    Query,
    RangeQuery,
    StateQueryRequest,
    VersionedKeyQuery,
    WindowKeyQuery,
    WindowRangeQuery,
)
from ..sqlsession import SQL_ACCESS
from ..store.encoding.ordered import short_repr
from ..store.kinds import QUERY_COMMANDS, StoreKind
from ..store.manifest import StoreManifest
from ..store.roots import parse_root
from .command import IQCommand
from .messages import Message
from .parse import command_help, overview
from .values import bound_value, key_value, time_value, variable

__all__ = ["DEFAULT_ROOT", "VIEWS", "IQSession", "default_root", "usage_errors"]

DEFAULT_ROOT = "stores"
#: The commands that are views built on a session (the panel, a watch's display): the
#: magic builds them (magic.py); a session runs every other command, the queries those
#: views run included.
VIEWS = ("panel", "watch")


def default_root() -> str:
    """``$IQKIT_ROOT``, else ``./stores``."""
    return os.environ.get("IQKIT_ROOT") or DEFAULT_ROOT


@contextmanager
def usage_errors(action: str) -> Iterator[None]:
    """An ``IqkitError`` raised in the block as a ``UsageError`` naming the ``%iq``
    action: one line in a notebook (``UnknownStoreError``'s did-you-mean included)."""
    try:
        yield
    except IqkitError as exc:
        raise UsageError(f"%iq {action}: {exc}") from None


class IQSession:
    """The state behind ``%iq`` in one notebook (see the module docstring)."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        display_limit: int = 10,
        autolimit: int = 100_000,
        progress: bool = True,
    ) -> None:
        self._root = os.fspath(root) if root is not None else None
        self._engine: StateEngine | None = None
        self._sql: Any = None
        self.display_limit = display_limit
        self.autolimit = autolimit
        self.progress = progress
        self.last: Any = None
        self.named: dict[str, Any] = {}
        self.sql_access = "files"
        self.sql_directories: tuple[str, ...] = ()

    # -- root and engine -------------------------------------------------------------------
    @property
    def root(self) -> str:
        return self._root if self._root is not None else default_root()

    @property
    def engine(self) -> StateEngine:
        if self._engine is None or self._engine.is_closed:
            root = self.root
            folder = parse_root(root).local  # None: an object-storage URL
            if folder is not None and not folder.is_dir():
                raise UsageError(
                    f"%iq: no stores folder at {root!r}: %iq open PATH, or set IQKIT_ROOT"
                )
            self._engine = open_engine(root)
        return self._engine

    def set_root(self, root: str | os.PathLike[str] | None) -> None:
        """Use ``root`` from the next command on (``None``: the default root)."""
        self.close()
        self._root = os.fspath(root) if root is not None else None

    def open(self, path: str | os.PathLike[str] | None) -> Message:
        root = os.fspath(path) if path is not None else default_root()
        try:
            folder = parse_root(root).local  # None: an object-storage URL (never a folder)
        except RootError as exc:
            raise UsageError(f"%iq open: {exc}") from None
        if folder is not None and not folder.is_dir():
            raise UsageError(f"%iq open: no such folder {root!r}")
        # Opened before the root changes: an unreachable or unauthorized object root is
        # one line (execute's IqkitError) and the notebook keeps the root it had.
        engine = open_engine(root)
        self.set_root(root)
        self._engine = engine
        names = engine.store_names()
        listed = ", ".join(names) if names else "none yet"
        return Message(f"iqkit: {root} — {len(names)} store(s): {listed}")

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        if self._sql is not None:
            self._sql.close()
            self._sql = None

    def manifest(self, store: str, engine: StateEngine | None = None) -> StoreManifest:
        """``store``'s manifest; a name that cannot be a store is a usage error.

        ``validate_store_name`` refuses ``''``, ``.``, ``../x`` and NUL with
        ``ValueError``; the filesystem may refuse what it lets through (``OSError``, e.g.
        a name longer than the filesystem allows). Either is one line in a notebook.
        Anything else (an unknown store, a corrupt manifest) is ``IqkitError``, which
        ``execute`` turns into one line too."""
        engine = engine if engine is not None else self.engine
        try:
            return engine.manifest(store)
        except (ValueError, TypeError) as exc:
            raise UsageError(f"%iq: {exc}") from None
        except OSError as exc:
            raise UsageError(
                f"%iq: store {short_repr(store)}: {exc.strerror or type(exc).__name__}"
            ) from None

    # -- dispatch ----------------------------------------------------------------------------
    def execute(self, command: IQCommand, namespace: Mapping[str, Any] | None = None) -> Any:
        """Run one command; user mistakes raise ``UsageError`` (one line in a notebook)."""
        ns = namespace if namespace is not None else {}
        with usage_errors(command.action):
            return self._dispatch(command, ns)

    def _dispatch(self, command: IQCommand, ns: Mapping[str, Any]) -> Any:
        action = command.action
        if command.is_query:
            result = self.query(command, ns)
            self.last = result
            if command.as_name:
                self.name_result(command.as_name, result)
            return result
        if action == "open":
            path = command.path
            if path is not None and path.startswith(":") and path[1:].isidentifier():
                path = os.fspath(variable(path, ns, "open"))  # %iq open :root
            return self.open(path)
        if action == "stores":
            from .stores_table import stores_frame

            return stores_frame(self.engine)
        if action == "lag":
            return self.lag(command.store)
        if action == "trace":
            if self.last is None:
                raise UsageError("%iq trace: no result yet; run a query first")
            return self.last.trace
        if action == "sql":
            return self.sql(command, ns)
        if action == "help":
            return Message(command_help(command.path) if command.path else overview())
        if action in VIEWS:
            raise UsageError(
                f"%iq {action}: shown by the %iq magic, not run by a session"
                + (" (outside it: iqkit.panel())" if action == "panel" else "")
            )
        raise UsageError(f"%iq: {action!r} is not implemented")  # pragma: no cover

    def name_result(self, name: str, result: Any) -> None:
        """Keep ``result`` as ``name`` (``--as``): for ``%iq sql`` and ``--bound :name``."""
        self.named[name] = result
        if self._sql is not None:
            self._sql.register(name, result)

    # -- queries ---------------------------------------------------------------------------
    def request(
        self, command: IQCommand, namespace: Mapping[str, Any], manifest: StoreManifest
    ) -> StateQueryRequest[Any]:
        """The IQv2 request a query command stands for (typed with the store's serdes)."""
        request = StateQueryRequest.in_store(manifest.name).with_query(
            self._query(command, namespace, manifest)
        )
        if command.partitions is not None:
            request = request.with_partitions(command.partitions)
        if command.bounds:
            request = request.with_position_bound(bound_value(command.bounds, namespace))
        if command.active:
            request = request.require_active()
        return request.enable_execution_info()

    def _query(
        self, command: IQCommand, ns: Mapping[str, Any], manifest: StoreManifest
    ) -> Query[Any]:
        action = command.action
        _check_kind(action, manifest)
        query: Any
        if action == "get":
            keys = [key_value(k, manifest, ns) for k in command.keys]
            if command.as_of_time is not None:  # the key's record as of a time
                when = time_value(command.as_of_time, ns)
                return VersionedKeyQuery.with_key(keys[0]).as_of(when)
            query = KeyQuery.with_key(keys[0]) if len(keys) == 1 else MultiKeyQuery.with_keys(keys)
            return query.skip_cache() if command.skip_cache else query
        if action == "history":
            query = MultiVersionedKeyQuery.with_key(key_value(command.keys[0], manifest, ns))
            if command.lower is not None:
                query = query.from_time(time_value(command.lower, ns))
            if command.upper is not None:
                query = query.to_time(time_value(command.upper, ns))
            return query.with_ascending_timestamps() if command.asc else query
        if action == "changes":
            query = ChangesQuery.between(command.from_version or 1, command.to_version)
            if command.prefix is not None:
                query = query.with_prefix(key_value(command.prefix, manifest, ns))
            return query
        if action == "range":
            lo = None if command.lower is None else key_value(command.lower, manifest, ns)
            hi = None if command.upper is None else key_value(command.upper, manifest, ns)
            query = RangeQuery.with_range(lo, hi)
        elif action == "prefix":
            query = PrefixScanQuery.with_prefix(key_value(command.prefix or "", manifest, ns))
        elif action == "window":
            query = WindowKeyQuery.with_key_and_window_start_range(
                key_value(command.keys[0], manifest, ns),
                time_value(command.lower or "", ns),
                time_value(command.upper or "", ns),
            )
        elif action == "windows":
            query = WindowRangeQuery.with_window_start_range(
                time_value(command.lower or "", ns), time_value(command.upper or "", ns)
            )
        else:  # scan: every record (of a window store: every window of all time)
            query = manifest.kind.scan_query()
        return query.with_descending_keys() if command.desc else query

    def query(self, command: IQCommand, namespace: Mapping[str, Any]) -> Any:
        """Run a query command and collect its rows into an ``IQResult``."""
        from ..tables import collect
        from .history import VERSION_QUERIES, version_rows
        from .result import IQResult

        store = command.store or ""
        pinned = command.as_of is not None
        engine: StateEngine | None = None
        try:
            try:
                # The query model and the serdes report a value of the wrong type or shape
                # (a ``:var`` key the key serde cannot take, an unretained --as-of version)
                # as ValueError / TypeError: to a notebook user those are usage errors.
                # Only this step is guarded, so a bug elsewhere keeps its traceback.
                engine = (
                    open_engine(self.root, as_of={store: command.as_of}) if pinned else self.engine
                )
                manifest = self.manifest(store, engine)
                request = self.request(command, namespace, manifest)
                started = time.perf_counter_ns()
                result = engine.query(request)
                engine_ns = time.perf_counter_ns() - started
            except (ValueError, TypeError) as exc:
                raise UsageError(f"%iq {command.action}: {exc}") from None
            limit = self.autolimit if command.limit is None else command.limit
            if isinstance(request.query, VERSION_QUERIES):  # records, not key-value rows
                collected = version_rows(result, manifest, request.query, limit=limit or None)
            else:
                with self._progress_bar(store) as advance:
                    collected = collect(
                        result, manifest, limit=limit or None, progress=advance, query=request
                    )
            lags = self._lags_getter(store) if not pinned else None
            version = engine.version(store)
        finally:
            if pinned and engine is not None:
                engine.close()
        return IQResult(
            request,
            result,
            manifest,
            collected,
            engine_ns=engine_ns,
            lags=lags,
            line=command.to_line(),
            display_limit=self.display_limit,
            show_trace=command.trace,
            version=version,
        )

    def _lags_getter(self, store: str) -> Callable[[], Any]:
        engine = self.engine

        def lags() -> Any:
            return engine.lags(stores=[store])[store]

        return lags

    def _progress_bar(self, store: str) -> AbstractContextManager[Callable[[int], None] | None]:
        from .render import stable_timings

        # The bar appears only when reading takes half a second: output that depends on
        # the wall clock, which stable timings promise to keep out.
        if not self.progress or stable_timings():
            return nullcontext(None)
        return _RowsProgress(store)

    # -- other commands ----------------------------------------------------------------------
    def lag(self, store: str | None) -> Any:
        """``%iq lag [STORE]``: one frame for the named store or every store. A store
        that cannot be read does not hide the others: it gets one row whose ``error``
        says why (the partitions of a store are results, and so are stores here)."""
        from .result import STORE_PROBLEMS, lag_frame, problem

        engine = self.engine
        if store is not None:
            self.manifest(store)  # an unknown or impossible name is a usage error
        names = [store] if store is not None else engine.store_names()
        # lag_frame needs each store's partitioner to count only the inputs that feed a
        # partition (an explicit store's partition p reads input partition p only).
        manifests, lags, errors = {}, {}, {}
        for name in names:
            try:
                manifests[name] = engine.manifest(name)
                lags[name] = engine.lags(stores=[name])[name]
            except STORE_PROBLEMS as exc:
                errors[name] = problem(exc)
        return lag_frame(lags, manifests=manifests, errors=errors)

    def set_sql_access(self, access: str, directories: Sequence[str] = ()) -> None:
        """What ``%iq sql`` may touch (``SQLSession``'s ``access``/``directories``). Takes
        effect from the next SQL statement, on a fresh DuckDB connection (DuckDB cannot
        give back access it took away): tables made in SQL go, named results stay."""
        if access not in SQL_ACCESS:
            raise UsageError(f"%iq: sql_access must be one of {', '.join(SQL_ACCESS)}")
        if (access, tuple(directories)) == (self.sql_access, self.sql_directories):
            return
        self.sql_access, self.sql_directories = access, tuple(directories)
        if self._sql is not None:
            self._sql.close()
            self._sql = None

    @property
    def sql_session(self) -> Any:
        if self._sql is None:
            from ..sqlsession import SQLSession

            self._sql = SQLSession(
                engine=lambda: self.engine,
                access=self.sql_access,
                directories=self.sql_directories if self.sql_access == "none" else (),
            )
            for name, value in self.named.items():
                self._sql.register(name, value)
        return self._sql

    def sql(self, command: IQCommand, namespace: Mapping[str, Any]) -> Any:
        frame = self.sql_session.query(command.sql or "", namespace=namespace)
        if command.as_name:
            self.name_result(command.as_name, frame)
        return frame

    def __repr__(self) -> str:
        state = "open" if self._engine is not None and not self._engine.is_closed else "idle"
        return f"IQSession(root={self.root!r}, {state}, named={sorted(self.named)})"


class _RowsProgress:
    """A tqdm bar (a widget in Jupyter, text elsewhere) that appears only when reading
    takes longer than half a second, so quick lookups print nothing."""

    def __init__(self, store: str) -> None:
        self.store = store
        self._bar: Any = None
        self._done = 0

    def __enter__(self) -> Callable[[int], None]:
        from tqdm.auto import tqdm

        self._bar = tqdm(desc=f"reading {self.store}", unit=" rows", delay=0.5, leave=False)
        return self._advance

    def _advance(self, rows_so_far: int) -> None:
        self._bar.update(rows_so_far - self._done)
        self._done = rows_so_far

    def __exit__(self, *exc_info: object) -> None:
        self._bar.close()


def _check_kind(action: str, manifest: StoreManifest) -> None:
    """A command the store's kind cannot answer is a usage error in a notebook: the
    engine (like Kafka Streams) would fail every partition with ``UNKNOWN_QUERY_TYPE``,
    a result that reads like a store problem when the command was simply the wrong one."""
    kind = manifest.kind
    if action not in QUERY_COMMANDS or action in kind.commands:
        return
    other = next(k for k in StoreKind if action in k.own_commands)
    fits = kind.commands
    theirs = other.own_commands
    raise UsageError(
        f"%iq {action}: {manifest.name!r} is a {kind.label}; "
        f"use {', '.join(fits[:-1])} or {fits[-1]} "
        f"({', '.join(theirs[:-1])} and {theirs[-1]} read {other.label}s)"
    )
