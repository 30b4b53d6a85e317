"""``SQLSession``: one private DuckDB connection and the query loop over it, putting the
package's pieces together (connection, registration, resolution, parameters, the
interrupt worker, store snapshots); and ``iqkit.sql``, a session for one query."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..errors import IqkitError
from .connection import cache_footers, check_access, connect
from .errors import SQLError, check_unicode, short_message
from .params import bind_parameters
from .registry import Registry, check_name, scannable
from .resolve import MAX_RESOLVE_ROUNDS, Resolver, missing_table, referenced_tables
from .snapshots import SnapshotCache, snapshot_key
from .stores import StoreStream
from .twins import TwinPlans, TwinView, twin_view
from .versions import bad_arguments
from .versions import install as install_version_functions
from .worker import QueryWorker, interrupted

# duckdb and pandas are imported where they are used, not here: `import iqkit` (which
# imports this module) runs in every Spark Python worker that unpickles an iqkit
# function, and those two cost ~0.35 s per worker there for nothing.
if TYPE_CHECKING:
    import duckdb
    import pandas as pd

    from ..engine import StateEngine

#: Default memory for store snapshots (``SQLSession(cache_bytes=...)``).
DEFAULT_CACHE_BYTES = 256 * 2**20

EngineSource = Callable[[], "StateEngine | None"]


class SQLSession:
    """One private DuckDB connection (``duckdb.connect(":memory:")``) with replacement
    scans off (``SET python_enable_replacements=false``) so nothing is ever found by
    frame scanning.

    ``engine`` is a :class:`~iqkit.StateEngine`, or a function returning the current one
    (the magic's engine changes with ``%iq open``; it is asked only when a statement
    names a table nothing else provides), or ``None`` (no stores). ``namespace`` is the
    default namespace for :meth:`query` (the notebook's ``user_ns``). ``progress`` is
    called as ``progress(store, rows)`` after each batch a store scan streams to DuckDB;
    it may be called from one of DuckDB's threads.

    ``cache_bytes`` bounds the memory kept for *store snapshots*: a complete scan of a
    store version is kept as the Arrow batches DuckDB was streamed (no copy), and the
    next statement naming the same store at the same version scans that table instead
    of decoding the store again. Published versions are immutable, so a snapshot can
    never be stale; a new commit is a new version and is streamed afresh. Least recently
    used snapshots go first; a scan bigger than the budget is streamed and not kept;
    ``0`` turns the cache off.

    ``access``: ``"files"`` (default) or ``"none"``, and ``directories``: the folders
    SQL may still read and write under ``"none"`` — what SQL can touch besides iqkit's
    own tables (see the package docstring).
    """

    def __init__(
        self,
        *,
        engine: EngineSource | StateEngine | None = None,
        namespace: Mapping[str, Any] | None = None,
        progress: Callable[[str, int], None] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        access: str = "files",
        directories: Sequence[str | os.PathLike[str]] = (),
    ) -> None:
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise ValueError(f"cache_bytes must be an int >= 0, got {cache_bytes!r}")
        self.directories = check_access(access, directories)
        self.access = access
        self._snapshots = SnapshotCache(cache_bytes)
        self._plans = TwinPlans()  # twin views' plans, by the files they read
        #: ``parquet_metadata_cache`` as it was before this query's statements over
        #: twins turned it on (``connection.cache_footers``); None: not turned on.
        self._footers_before: bool | None = None
        self._engine = engine
        self._namespace = namespace
        self.progress = progress
        self._con: duckdb.DuckDBPyConnection | None = connect(access, self.directories)
        install_version_functions(self._con)
        self._registry = Registry()
        self._stream_errors: list[tuple[str, BaseException]] = []  # raised in store scans
        self._lock = threading.Lock()  # one query at a time (interrupt() excepted)
        self._worker = QueryWorker()

    @property
    def cache_bytes(self) -> int:
        """The memory budget for store snapshots (class docstring)."""
        return self._snapshots.budget

    @cache_bytes.setter
    def cache_bytes(self, value: int) -> None:
        self._snapshots.budget = value

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> SQLSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the DuckDB connection (registered names go with it). Idempotent; a
        query running on another thread is interrupted first."""
        if self._con is None:
            return
        self.interrupt()
        with self._lock:
            con, self._con = self._con, None
            if con is not None:
                self._registry.clear(con)
                self._snapshots.clear()
                self._plans.clear()
                con.close()

    @property
    def is_closed(self) -> bool:
        return self._con is None

    def _connection(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            raise SQLError("the SQL session is closed")
        return self._con

    def interrupt(self) -> None:
        """Stop the query running on this session (call it from another thread); the
        query raises ``KeyboardInterrupt`` and the session stays usable."""
        con = self._con
        if con is not None:
            self._worker.interrupt(con)

    # -- registration --------------------------------------------------------------------
    def register(self, name: str, obj: Any) -> None:
        """Make ``obj`` queryable as table ``name`` until :meth:`unregister` (replacing
        an earlier registration of that name). ``obj``: a pandas DataFrame, a pyarrow
        Table, RecordBatch or RecordBatchReader (read once), an object with
        ``__arrow_c_stream__`` (polars, ...), or anything with ``.arrow()`` returning one
        of those (``IQResult``). Nothing is copied."""
        check_name(name)
        source = scannable(name, obj)
        with self._lock:  # never while a query runs on the worker thread
            self._registry.register(self._connection(), name, source)

    def unregister(self, name: str) -> None:
        """Forget a name given to :meth:`register`."""
        with self._lock:
            self._registry.unregister(self._connection(), name)

    def registered(self) -> list[str]:
        """Names given to :meth:`register`, sorted."""
        return self._registry.names()

    # -- queries -------------------------------------------------------------------------
    def query(
        self,
        sql: str,
        params: Mapping[str, Any] | Sequence[Any] | None = None,
        *,
        namespace: Mapping[str, Any] | None = None,
    ) -> pd.DataFrame:
        """Run ``sql`` and return the last statement's result as a pandas DataFrame."""
        return self._run(sql, params, namespace, _fetch_df)

    def query_arrow(
        self,
        sql: str,
        params: Mapping[str, Any] | Sequence[Any] | None = None,
        *,
        namespace: Mapping[str, Any] | None = None,
    ) -> pa.Table:
        """Run ``sql`` and return the last statement's result as a pyarrow Table."""
        return self._run(sql, params, namespace, _fetch_arrow)

    def _run(
        self,
        sql: str,
        params: Mapping[str, Any] | Sequence[Any] | None,
        namespace: Mapping[str, Any] | None,
        fetch: Callable[[duckdb.DuckDBPyRelation | None], Any],
    ) -> Any:
        """Run the statements on the worker thread (``worker.QueryWorker``: why)."""
        con = self._connection()
        if not isinstance(sql, str):
            raise SQLError(f"SQL must be a string, got {type(sql).__name__}")
        check_unicode(sql)
        ns = namespace if namespace is not None else self._namespace
        with self._lock:
            return self._worker.run(con, lambda: self._execute(con, sql, params, ns, fetch))

    def _execute(
        self,
        con: duckdb.DuckDBPyConnection,
        sql: str,
        params: Mapping[str, Any] | Sequence[Any] | None,
        ns: Mapping[str, Any] | None,
        fetch: Callable[[duckdb.DuckDBPyRelation | None], Any],
    ) -> Any:
        """The statements of one ``query`` call, run on the worker thread."""
        import duckdb

        self._registry.drop_temporary(con)  # left behind if something failed in a cleanup
        self._stream_errors.clear()
        try:
            with self._worker.executing():
                statements = self._statements(con, sql)
                bound = bind_parameters(statements, params, ns)
                result: Any = None
                for i, (statement, values) in enumerate(zip(statements, bound, strict=True)):
                    self._worker.check_cancel()
                    last = i == len(statements) - 1
                    result = self._statement(con, statement, values, ns, last, fetch)
                return result
        except duckdb.Error as e:
            raise self._translate(e) from None
        finally:
            self._registry.drop_temporary(self._con)
            before, self._footers_before = self._footers_before, None
            if before is False and self._con is not None:
                cache_footers(self._con, False)

    def _statements(self, con: duckdb.DuckDBPyConnection, sql: str) -> list[Any]:
        if not sql.strip():
            raise SQLError("no SQL given")
        statements = con.extract_statements(sql)
        if not statements:
            raise SQLError("no SQL statement given (only comments or ';')")
        return statements

    def _statement(
        self,
        con: duckdb.DuckDBPyConnection,
        statement: Any,
        values: Mapping[str, Any] | Sequence[Any] | None,
        ns: Mapping[str, Any] | None,
        last: bool,
        fetch: Callable[[duckdb.DuckDBPyRelation | None], Any],
    ) -> Any:
        """Register what ``statement`` references, run it, fetch the result if ``last``."""
        import duckdb

        text = statement.query
        resolver = Resolver(
            self._registry, con, ns, engine=self._engine_now, store_table=self._store_table
        )
        has_params = bool(statement.named_parameters)
        for name in referenced_tables(con, text, has_params=has_params):
            resolver.provide(name)
        for _ in range(MAX_RESOLVE_ROUNDS):
            try:
                if not last:
                    con.execute(text, values)
                    return None
                # con.sql, not con.execute: Arrow output from an execute() result makes an
                # extra copy of every row (duckdb 1.5 warns so); a relation streams.
                return fetch(con.sql(text, params=values))
            except duckdb.CatalogException as e:
                # Fallback for statements get_table_names cannot read (USING joins,
                # parameters): DuckDB names the first table it cannot find; provide it
                # and bind again. Binding fails before anything runs, so a retry is safe.
                missing = missing_table(e)
                if missing is None:
                    raise
                if not resolver.provide(missing):
                    raise resolver.unknown_table(missing) from None
        raise SQLError(f"statement references too many tables: {text[:60]!r}")

    def _store_table(self, engine: StateEngine, store: str) -> Any:
        """What DuckDB scans for ``store``: a view over its columnar twins when the
        version served now has them (``twins.py``); else its snapshot at that version,
        else a stream that becomes that snapshot if it reads the whole store.

        Twin-backed stores are not kept as snapshots: DuckDB reads their files about as
        fast as a table in memory, and keeping one would hold the whole store in memory.
        Without file access (``access="none"``) DuckDB's Parquet reader is off, so
        stores are streamed there."""
        if self.access == "files":
            view = self._twin_view(engine, store)
            if view is not None:
                return view
        key = snapshot_key(engine, store)
        snapshot = self._snapshots.get(key)
        if snapshot is not None:
            return snapshot
        return StoreStream(
            engine,
            store,
            key,
            cache=self._snapshots,
            check_cancel=self._worker.check_cancel,
            failed=lambda name, exc: self._stream_errors.append((name, exc)),
            progress=self.progress,
        )

    def _twin_view(self, engine: StateEngine, store: str) -> TwinView | None:
        try:
            files = engine.twin_files(store)
        except IqkitError as exc:
            detail = str(exc).splitlines()[0] if str(exc) else ""
            raise SQLError(
                f"reading store {store!r} failed: {type(exc).__name__}: {detail}"
            ) from None
        if files is None:
            return None
        con = self._connection()
        if self._footers_before is None:  # before DuckDB reads a twin (connection.py)
            self._footers_before = cache_footers(con, True)
        try:
            return twin_view(con, store, files, self._plans)
        except IqkitError as exc:  # a twin's footer that cannot be read
            raise SQLError(f"reading store {store!r} failed: {exc}") from None

    def _translate(self, error: duckdb.Error) -> BaseException:
        """DuckDB's error as one short ``SQLError`` (or the store scan's own failure)."""
        for _, raised in self._stream_errors:
            if isinstance(raised, KeyboardInterrupt):
                # SIGINT landed inside a store scan (Python code DuckDB was calling):
                # DuckDB reports it as a failed stream read.
                return interrupted()
        message = str(error)
        for view in self._registry.twin_views():
            named = view.failure(message)
            if named is not None:
                return SQLError(named)
        if self._stream_errors:
            store, raised = self._stream_errors[0]
            detail = str(raised).splitlines()[0] if str(raised) else ""
            return SQLError(f"reading store {store!r} failed: {type(raised).__name__}: {detail}")
        return SQLError(bad_arguments(message) or short_message(error))

    def _engine_now(self) -> StateEngine | None:
        from ..engine import StateEngine

        source = self._engine
        if source is None or isinstance(source, StateEngine):
            return source
        return source()

    def __repr__(self) -> str:
        state = "closed" if self._con is None else "open"
        return f"SQLSession({state}, registered={self.registered()})"


def _fetch_df(rel: duckdb.DuckDBPyRelation | None) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame() if rel is None else rel.df()


def _fetch_arrow(rel: duckdb.DuckDBPyRelation | None) -> pa.Table:
    if rel is None:
        return pa.table({})
    to_table = getattr(rel, "to_arrow_table", None)
    if to_table is not None:  # duckdb >= 1.5
        return to_table()
    # Quirk: before 1.4 relation.arrow() returned a Table, from 1.4 a RecordBatchReader.
    out = rel.arrow()
    return out.read_all() if isinstance(out, pa.RecordBatchReader) else out


def sql(
    query: str,
    params: Mapping[str, Any] | Sequence[Any] | None = None,
    *,
    root: str | os.PathLike[str] | None = None,
    engine: StateEngine | None = None,
    **tables: Any,
) -> pd.DataFrame:
    """Run one SQL query over stores and the tables passed by keyword, on a fresh
    private DuckDB connection; ``$name``/``?`` values come from ``params`` only.

        iqkit.sql('SELECT c.region, sum(t.total) FROM "orders-totals" t '
                  "JOIN customers c USING (key) GROUP BY 1", root="stores",
                  customers=customers_df)

    Stores come from ``engine`` or, with ``root``, from an engine opened and closed for
    this call (not both)."""
    if root is not None and engine is not None:
        raise SQLError("pass root= or engine=, not both")
    opened = None
    if root is not None:
        from ..engine import open as open_engine

        opened = engine = open_engine(root)
    try:
        with SQLSession(engine=engine) as session:
            for name, obj in tables.items():
                session.register(name, obj)
            return session.query(query, params)
    finally:
        if opened is not None:
            opened.close()
