"""DuckDB SQL over stores, named results and notebook DataFrames (``%iq sql``, ``iqkit.sql``).

A :class:`SQLSession` owns one private in-memory DuckDB connection, so nothing a user does
with ``duckdb.sql`` (the module's default connection) and nothing iqkit does can clobber
the other. DuckDB's *replacement scans* are switched off: since duckdb 1.1 they only look
at the calling Python frame (duckdb #13836, #13977), which from inside a magic is never
the notebook, and they resolve names by accident (duckdb #12228: ``df`` once meant
``duckdb.df``). Instead every table a statement references is resolved explicitly, in
this order:

1. names registered with :meth:`SQLSession.register` (``%iq ... --as x`` results);
2. tables and views created in the session's own SQL (``CREATE TABLE t AS ...``);
3. objects of a supported type in the namespace (the notebook's ``user_ns``), registered
   for this statement only and unregistered afterwards;
4. a store of that name in the engine, registered as an Arrow stream: DuckDB pulls
   ``iqkit.tables.store_batches`` batches as it scans, so a store is never
   materialised in pandas first.

Anything else is one short :class:`SQLError` naming the table, with a "did you mean" over
all four kinds of names. Values are bound as parameters (``$name`` with a dict, ``?``
with a list); when no parameters are given, ``$name`` placeholders are bound from the
namespace. Names are found with DuckDB's own parser (``Statement.named_parameters``), so
placeholders inside string literals, comments and quoted identifiers are never touched,
and no value is ever spliced into SQL text.

Registration is zero-copy: DuckDB scans pandas DataFrames in place (numpy columns are
read directly, Arrow-backed columns through Arrow) and Arrow tables and streams through
the Arrow C stream interface with projection pushdown.

Decisions:

* **What SQL can touch** is decided here, per session (``access=``, in the magic
  ``%config IQMagics.sql_access``), not left to DuckDB's defaults:

  - ``"files"`` (the default): iqkit's tables, plus the files the kernel's user can
    read and write, through DuckDB's own functions (``read_csv``, ``read_parquet``,
    ``COPY ... TO``, ``ATTACH``): joining a scan with a local CSV is a notebook's daily
    work. Nothing from the network by itself: DuckDB would otherwise download and load
    an extension (``httpfs``) the moment a query names an ``https://`` or ``s3://``
    path (``autoinstall_known_extensions``, ``autoload_known_extensions``); here those
    are off, so such a query fails. ``INSTALL``/``LOAD`` typed on purpose still work.
  - ``"none"``: only iqkit's tables (stores, named results, notebook DataFrames):
    ``enable_external_access=false`` turns off every file, network and extension
    access, except under ``directories`` (DuckDB's ``allowed_directories``), and
    ``lock_configuration`` keeps SQL from changing any setting back.

* DuckDB's own progress bar is switched **off** on the private connection. A store
  scan is an Arrow stream of unknown length, so DuckDB cannot say how far it is; in
  Jupyter the bar is an ipywidget that appears only for queries slower than
  ``progress_bar_time`` (2 s), so notebook output would depend on machine speed (nbval);
  and interrupting a query after the bar appeared used to kill kernels (duckdb #10216).
  Progress of store scans is reported through the ``progress`` callback instead
  (store name, rows in the batch just read), which the magic can feed to tqdm.
* An interrupted query (the kernel's stop button, Ctrl-C, or :meth:`SQLSession.interrupt`
  from another thread) raises ``KeyboardInterrupt``, never a DuckDB error: that is what
  stops "Run all". The connection stays usable and per-query registrations are removed.
* A complete scan of a store version is kept in memory as Arrow (bounded by
  ``cache_bytes``, 256 MiB by default), so re-running or refining a query over the same
  store version costs what DuckDB on Arrow costs, not another decode of the store.
  Versions are immutable, so this cannot serve stale rows (the engine's read cache
  relies on the same fact).
* A statement that returns no rows (``CREATE``, ``SET``) returns DuckDB's one-column
  status frame (``Count`` or ``Success``). Several statements separated by ``;`` run in
  order and the last one's result is returned (DuckDB's ``execute`` convention); dict
  parameters are handed to each statement that names them.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .errors import IqkitError

# duckdb and pandas are imported where they are used, not here: `import iqkit` (which
# imports this module) runs in every Spark Python worker that unpickles an iqkit
# function, and those two cost ~0.35 s per worker there for nothing.
if TYPE_CHECKING:
    import duckdb
    import pandas as pd

    from .engine import StateEngine

__all__ = ["SQL_ACCESS", "SQLError", "SQLSession", "sql"]

#: What a session's SQL may reach besides iqkit's tables (module docstring).
SQL_ACCESS = ("files", "none")

#: Default memory for store snapshots (``SQLSession(cache_bytes=...)``).
DEFAULT_CACHE_BYTES = 256 * 2**20

#: How many missing tables one statement may resolve through DuckDB's catalog errors
#: (the fallback when ``get_table_names`` cannot read the statement). A bound, not a
#: limit anyone should meet: each round resolves one more distinct table.
_MAX_RESOLVE_ROUNDS = 64

#: DuckDB's message for a table it cannot find (stable since 0.x: "Catalog Error: Table
#: with name X does not exist!"). X is the name as written, unquoted.
_MISSING_TABLE = re.compile(r"Table with name (.+?) does not exist!")

#: DuckDB's message when a Python interrupt (SIGINT) stops a query it is executing: the
#: client turns the pending ``KeyboardInterrupt`` into ``RuntimeError("Query interrupted")``.
_SIGINT_MESSAGE = "Query interrupted"


class SQLError(IqkitError):
    """A SQL statement failed: unknown table, bad parameters, or DuckDB's own error
    (syntax, binder, catalog, conversion), shortened to its first lines."""


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
    own tables (see the module docstring).
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
        if access not in SQL_ACCESS:
            raise ValueError(f"access must be one of {', '.join(SQL_ACCESS)}, got {access!r}")
        if directories and access != "none":
            raise ValueError("directories only apply with access='none' ('files' reaches all)")
        self.access = access
        self.directories = tuple(os.path.abspath(d) for d in directories)
        self.cache_bytes = cache_bytes
        self._snapshots: OrderedDict[_SnapshotKey, pa.Table] = OrderedDict()
        self._snapshot_lock = threading.Lock()
        self._engine = engine
        self._namespace = namespace
        self.progress = progress
        import duckdb

        self._con: duckdb.DuckDBPyConnection | None = duckdb.connect(":memory:")
        # Explicit resolution only (see the module docstring); and no DuckDB progress bar.
        self._con.execute("SET python_enable_replacements = false")
        self._con.execute("SET enable_progress_bar = false")
        _limit_access(self._con, access, self.directories)
        self._registered: dict[str, Any] = {}  # name → the object DuckDB scans
        self._temporary: dict[str, Any] = {}  # per-statement registrations still in DuckDB
        self._stream_errors: list[tuple[str, BaseException]] = []  # raised in store scans
        self._lock = threading.Lock()  # one query at a time (interrupt() excepted)
        self._cancel = threading.Event()  # set when the waiting caller was interrupted
        self._executing = False  # the worker is running statements (not cleaning up)

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> SQLSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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
                self._close(con)

    def _close(self, con: duckdb.DuckDBPyConnection) -> None:
        # Unregister first: DuckDB keeps the Python objects alive through the views.
        self._drop_temporary(con)
        import duckdb

        for name in self._registered:
            with contextlib.suppress(duckdb.Error):  # a view the user's SQL dropped
                con.unregister(name)
        self._registered.clear()
        self._snapshots.clear()
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
            self._cancel.set()
            con.interrupt()

    # -- registration --------------------------------------------------------------------
    def register(self, name: str, obj: Any) -> None:
        """Make ``obj`` queryable as table ``name`` until :meth:`unregister` (replacing
        an earlier registration of that name). ``obj``: a pandas DataFrame, a pyarrow
        Table, RecordBatch or RecordBatchReader (read once), an object with
        ``__arrow_c_stream__`` (polars, ...), or anything with ``.arrow()`` returning one
        of those (``IQResult``). Nothing is copied."""
        _check_name(name)
        source = _scannable(name, obj)
        with self._lock:  # never while a query runs on the worker thread
            con = self._connection()
            for old in [n for n in self._registered if n.casefold() == name.casefold()]:
                # DuckDB names are case-insensitive: 'X' would replace the view 'x'.
                con.unregister(old)
                del self._registered[old]
            con.register(name, source)
            self._registered[name] = source

    def unregister(self, name: str) -> None:
        """Forget a name given to :meth:`register`."""
        with self._lock:
            con = self._connection()
            if name not in self._registered:
                raise SQLError(f"no registered table {name!r}" + _hint(name, self._registered))
            con.unregister(name)
            del self._registered[name]

    def registered(self) -> list[str]:
        """Names given to :meth:`register`, sorted."""
        return sorted(self._registered)

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
        """Run the statements on a worker thread while this thread waits.

        Quirk: DuckDB notices a pending SIGINT only when the calling thread checks for
        signals between the tasks it executes itself, and with the pool's threads busy
        that may not happen until the query ends (measured with duckdb 2.0: about half
        of the Ctrl-Cs during a long scan were ignored; duckdb #10216, #3742, PR #10545
        runs queries on a sub-thread for the same reason). Here the calling thread only
        waits, which Python interrupts at once; it then interrupts DuckDB, waits for the
        worker to clean up, and raises ``KeyboardInterrupt``."""
        con = self._connection()
        if not isinstance(sql, str):
            raise SQLError(f"SQL must be a string, got {type(sql).__name__}")
        _check_unicode(sql)
        ns = namespace if namespace is not None else self._namespace
        with self._lock:
            outcome: list[tuple[bool, Any]] = []
            done = threading.Event()
            cancel = self._cancel = threading.Event()

            def work() -> None:
                try:
                    outcome.append((True, self._execute(con, sql, params, ns, fetch)))
                except BaseException as e:
                    outcome.append((False, e))
                finally:
                    done.set()

            threading.Thread(target=work, name="iqkit-sql", daemon=True).start()
            try:
                done.wait()
            except KeyboardInterrupt:
                cancel.set()
                while not done.is_set():
                    if self._executing:  # not once the worker is cleaning up
                        con.interrupt()  # a no-op between statements: `cancel` stops those
                    # Pressed again: still let the worker finish cleaning up.
                    with contextlib.suppress(KeyboardInterrupt):
                        done.wait(0.05)
                raise KeyboardInterrupt("SQL query interrupted") from None
            ok, value = outcome[0]
            if ok:
                return value
            raise value

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

        self._drop_temporary()  # left behind if something failed in a cleanup
        self._stream_errors.clear()
        self._executing = True
        try:
            statements = self._statements(con, sql)
            bound = _bind_parameters(statements, params, ns)
            result: Any = None
            for i, (statement, values) in enumerate(zip(statements, bound, strict=True)):
                self._check_cancel()
                last = i == len(statements) - 1
                result = self._statement(con, statement, values, ns, last, fetch)
            return result
        except duckdb.InterruptException:
            # con.interrupt() stopped the query (SQLSession.interrupt or a Ctrl-C).
            raise KeyboardInterrupt("SQL query interrupted") from None
        except RuntimeError as e:
            # DuckDB's reaction to a SIGINT it noticed itself. It cannot from this worker
            # thread (Python hands signals to the main thread only); mapped all the same.
            if str(e) != _SIGINT_MESSAGE:
                raise
            raise KeyboardInterrupt("SQL query interrupted") from None
        except duckdb.Error as e:
            raise self._translate(e) from None
        finally:
            self._executing = False
            self._drop_temporary()

    def _check_cancel(self) -> None:
        if self._cancel.is_set():
            raise KeyboardInterrupt("SQL query interrupted")

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
        resolver = _Resolver(self, con, ns)
        has_params = bool(statement.named_parameters)
        for name in _referenced_tables(con, text, has_params=has_params):
            resolver.provide(name)
        for _ in range(_MAX_RESOLVE_ROUNDS):
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
                missing = _missing_table(e)
                if missing is None:
                    raise
                if not resolver.provide(missing):
                    raise resolver.unknown_table(missing) from None
        raise SQLError(f"statement references too many tables: {text[:60]!r}")

    def _translate(self, error: duckdb.Error) -> BaseException:
        """DuckDB's error as one short ``SQLError`` (or the store scan's own failure)."""
        for _, raised in self._stream_errors:
            if isinstance(raised, KeyboardInterrupt):
                # SIGINT landed inside a store scan (Python code DuckDB was calling):
                # DuckDB reports it as a failed stream read.
                return KeyboardInterrupt("SQL query interrupted")
        if self._stream_errors:
            store, raised = self._stream_errors[0]
            detail = str(raised).splitlines()[0] if str(raised) else ""
            return SQLError(f"reading store {store!r} failed: {type(raised).__name__}: {detail}")
        return SQLError(_short_message(error))

    # -- per-statement registrations ------------------------------------------------------
    def _register_temporary(self, con: duckdb.DuckDBPyConnection, name: str, obj: Any) -> None:
        self._temporary[name] = obj
        con.register(name, obj)

    def _drop_temporary(self, con: duckdb.DuckDBPyConnection | None = None) -> None:
        con = con if con is not None else self._con
        for name in list(self._temporary):
            if con is not None and not _unregister(con, name):
                continue  # still there: the next query's cleanup tries again
            obj = self._temporary.pop(name)
            if isinstance(obj, _StoreStream):
                obj.close()

    # -- store snapshots (see the class docstring) ----------------------------------------
    def _snapshot(self, key: _SnapshotKey | None) -> pa.Table | None:
        if key is None:
            return None
        with self._snapshot_lock:
            table = self._snapshots.get(key)
            if table is not None:
                self._snapshots.move_to_end(key)
            return table

    def _keep_snapshot(self, key: _SnapshotKey, table: pa.Table) -> None:
        with self._snapshot_lock:
            # Older versions of the store can never be asked for again by this engine.
            for old in [k for k in self._snapshots if k[:2] == key[:2] and k != key]:
                del self._snapshots[old]
            self._snapshots[key] = table
            total = sum(t.nbytes for t in self._snapshots.values())
            while total > self.cache_bytes and self._snapshots:
                _, dropped = self._snapshots.popitem(last=False)
                total -= dropped.nbytes

    def _engine_now(self) -> StateEngine | None:
        from .engine import StateEngine

        source = self._engine
        if source is None or isinstance(source, StateEngine):
            return source
        return source()

    def __repr__(self) -> str:
        state = "closed" if self._con is None else "open"
        return f"SQLSession({state}, registered={self.registered()})"


class _Resolver:
    """Finds and registers the tables one statement references (module docstring order).

    Store names and catalog names are read once per statement, and only when a name is
    not registered already."""

    def __init__(
        self, session: SQLSession, con: duckdb.DuckDBPyConnection, ns: Mapping[str, Any] | None
    ) -> None:
        self.session = session
        self.con = con
        self.ns = ns
        self._catalog: dict[str, str] | None = None
        self._stores: list[str] | None = None
        self._engine: StateEngine | None = None
        self._engine_error: str | None = None

    def provide(self, name: str) -> bool:
        """Make ``name`` resolvable; ``True`` if this registered something for it."""
        folded = name.casefold()
        session = self.session
        if any(n.casefold() == folded for n in (*session._registered, *session._temporary)):
            return False
        if folded in self.catalog():
            return False  # DuckDB finds it (the session's own tables and views)
        frame = _lookup(name, self.frames())
        if frame is not None:
            session._register_temporary(self.con, frame, _scannable(frame, self.ns[frame]))
            return True
        store = _lookup(name, self.stores())
        if store is not None:
            assert self._engine is not None
            key = _snapshot_key(self._engine, store)
            snapshot = session._snapshot(key)
            source = (
                snapshot
                if snapshot is not None
                else _StoreStream(session, self._engine, store, key)
            )
            session._register_temporary(self.con, store, source)
            return True
        return False

    def catalog(self) -> dict[str, str]:
        """Tables and views DuckDB knows (the session's own SQL made them, or they are
        registered), case-folded name → name."""
        if self._catalog is None:
            rows = self.con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE NOT internal "
                "UNION ALL SELECT view_name FROM duckdb_views() WHERE NOT internal"
            ).fetchall()
            self._catalog = {str(r[0]).casefold(): str(r[0]) for r in rows}
        return self._catalog

    def frames(self) -> list[str]:
        """Namespace names holding something :func:`_scannable` accepts."""
        if not self.ns:
            return []
        return [k for k, v in self.ns.items() if not k.startswith("_") and _is_table_like(v)]

    def stores(self) -> list[str]:
        if self._stores is None:
            self._stores = []
            try:
                self._engine = self.session._engine_now()
                if self._engine is not None:
                    self._stores = self._engine.store_names()
            except Exception as e:  # the engine getter's own error, kept for the message
                self._engine_error = str(e).splitlines()[0] if str(e) else type(e).__name__
        return self._stores

    def unknown_table(self, name: str) -> SQLError:
        known = {*self.frames(), *self.stores(), *self.catalog().values()}
        msg = f"unknown table {name!r}" + _hint(name, known)
        if self._engine_error is not None:
            msg += f" (stores unavailable: {self._engine_error})"
        return SQLError(msg)


class _StoreStream:
    """A store as a re-scannable Arrow stream (the Arrow PyCapsule protocol).

    DuckDB calls ``__arrow_c_stream__`` when the name is registered and then twice per
    scan (once to bind, for the schema only, once to read), so a store can appear twice
    in one statement (a self-join), which a registered ``RecordBatchReader`` (read once)
    could not. The first call opens a ``store_batches`` reader for the schema; every
    stream handed out after that opens nothing until DuckDB pulls its first batch, and
    the first stream pulled reads that first reader, so a statement that scans a store
    once reads it once, from the version the binder saw. Later streams (a self-join) are
    given that schema, so they cannot disagree with what DuckDB bound.
    """

    def __init__(
        self, session: SQLSession, engine: StateEngine, store: str, key: _SnapshotKey | None
    ) -> None:
        self._session = session
        self._engine = engine
        self.store = store
        self._key = key  # None: nothing published, or the version could not be read
        self._schema: pa.Schema | None = None
        self._spare: pa.RecordBatchReader | None = None
        self._lock = threading.Lock()

    def _open(self, schema: pa.Schema | None = None) -> pa.RecordBatchReader:
        from .tables import store_batches

        return store_batches(self._engine, self.store, schema=schema)

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        if self._schema is None:
            try:
                self._session._check_cancel()
                self._spare = self._open()
            except BaseException as e:
                # DuckDB reports this as "reading the schema ... failed: <repr>"; keep the
                # real exception for SQLSession._translate (SIGINT lands here too).
                self._session._stream_errors.append((self.store, e))
                raise
            self._schema = self._spare.schema
        stream = pa.RecordBatchReader.from_batches(self._schema, self._batches())
        return stream.__arrow_c_stream__(requested_schema)

    def _batches(self) -> Iterator[pa.RecordBatch]:
        reader = None
        try:
            with self._lock:
                reader, self._spare = self._spare, None
            if reader is None:
                reader = self._open(self._schema)
            session = self._session
            progress = session.progress
            kept: list[pa.RecordBatch] | None = [] if self._key and session.cache_bytes else None
            size = 0
            for batch in reader:
                session._check_cancel()  # a Ctrl-C between DuckDB's checks
                if progress is not None:
                    progress(self.store, batch.num_rows)
                if kept is not None:
                    size += batch.nbytes
                    kept = kept if size <= session.cache_bytes else None
                    if kept is not None:
                        kept.append(batch)
                yield batch
            if kept is not None and self._key is not None:  # a complete scan
                session._keep_snapshot(self._key, pa.Table.from_batches(kept, reader.schema))
        except GeneratorExit:  # DuckDB stopped reading early (LIMIT): not an error
            raise
        except BaseException as e:
            # DuckDB reports an exception raised here as a failed stream read, with a
            # Python traceback in its message; keep the real one for _translate.
            self._session._stream_errors.append((self.store, e))
            raise
        finally:
            if reader is not None:
                reader.close()

    def close(self) -> None:
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.close()


# -- helpers --------------------------------------------------------------------------------
#: (engine root, store, version): what a store snapshot holds.
_SnapshotKey = tuple[str, str, int]


def _snapshot_key(engine: StateEngine, store: str) -> _SnapshotKey | None:
    """The version ``store`` is served at now, read *before* the scan opens: a commit in
    between makes the scan newer than its key, so the key is never asked for again (the
    engine only moves forward), and a snapshot is never older than its key says."""
    try:
        version = engine.version(store)
    except IqkitError:
        return None
    return None if version is None else (os.fspath(engine.root), store, version)


def _limit_access(con: duckdb.DuckDBPyConnection, access: str, directories: Sequence[str]) -> None:
    """Apply ``access`` (module docstring) to a fresh connection. Order matters: DuckDB
    refuses ``allowed_directories`` once external access is off, and every setting once
    the configuration is locked."""
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    if access == "none":
        if directories:
            con.execute("SET allowed_directories = ?", [list(directories)])
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")


def _unregister(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Unregister ``name``; ``False`` if it is still registered.

    Quirk: ``con.interrupt()`` stops whatever the connection runs next, and
    ``unregister`` runs a statement (``DROP VIEW``): an interrupt aimed at the query that
    just ended can land on the cleanup after it, so an interrupted unregister is retried.
    """
    import duckdb

    for _ in range(3):
        try:
            con.unregister(name)
            return True
        except duckdb.InterruptException:
            continue
        except duckdb.Error:  # already gone (the user's SQL dropped it)
            return True
    return False


def _check_unicode(sql: str) -> None:
    """Quirk: DuckDB's Python binding takes SQL as UTF-8, and a ``str`` holding a lone
    surrogate (``'\\ud800'``, from a bad copy-paste or ``surrogateescape`` decoding) has
    no UTF-8 form: pybind11 then rejects the call with a ``TypeError`` listing every
    overload. Say what is wrong, and where."""
    at = _lone_surrogate(sql)
    if at is not None:
        raise SQLError(
            f"the SQL holds {sql[at]!r} at character {at + 1}: a lone surrogate, which is "
            "not valid Unicode (retype that character)"
        )


def _lone_surrogate(text: str) -> int | None:
    """Where ``text`` holds a character with no UTF-8 form (a lone surrogate), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name or "\x00" in name:
        raise SQLError(f"a table name must be a non-empty string, got {name!r}")
    if _lone_surrogate(name) is not None:
        raise SQLError(f"a table name must be valid Unicode, got {name!r} (a lone surrogate)")


def _is_pandas_frame(obj: Any) -> bool:
    """Whether ``obj`` is a pandas DataFrame, without importing pandas: if it is not
    loaded, nothing can be one."""
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(obj, pd.DataFrame)


def _is_table_like(obj: Any) -> bool:
    """Cheap type test (never calls ``.arrow()``) for objects :func:`_scannable` takes."""
    if _is_pandas_frame(obj) or isinstance(obj, pa.Table | pa.RecordBatch | pa.RecordBatchReader):
        return True
    if isinstance(obj, type | ModuleType):
        return False
    kind = type(obj)
    return hasattr(kind, "__arrow_c_stream__") or callable(getattr(kind, "arrow", None))


def _scannable(name: str, obj: Any) -> Any:
    """What DuckDB should scan for ``obj`` (no copies; ``.arrow()`` is called once)."""
    if _is_pandas_frame(obj) or isinstance(obj, pa.Table | pa.RecordBatchReader):
        return obj
    if isinstance(obj, pa.RecordBatch):
        return pa.Table.from_batches([obj])
    if isinstance(obj, type | ModuleType) or not _is_table_like(obj):
        raise SQLError(
            f"cannot use {name!r} as a table: a {type(obj).__name__} is not one (use a pandas "
            "DataFrame, a pyarrow Table, RecordBatch or RecordBatchReader, or a %iq result)"
        )
    if hasattr(type(obj), "__arrow_c_stream__"):
        return obj
    try:
        converted = obj.arrow()
    except Exception as e:
        raise SQLError(f"cannot use {name!r} as a table: its .arrow() failed: {e}") from None
    if isinstance(converted, pa.Table | pa.RecordBatchReader):
        return converted
    if isinstance(converted, pa.RecordBatch):
        return pa.Table.from_batches([converted])
    raise SQLError(
        f"cannot use {name!r} as a table: its .arrow() returned a {type(converted).__name__}, "
        "not a pyarrow Table"
    )


def _lookup(name: str, candidates: Sequence[str]) -> str | None:
    """``name`` among ``candidates``: exact, else the one equal ignoring case (DuckDB
    identifiers are case-insensitive, Python names and store folders are not)."""
    if name in candidates:
        return name
    folded = [c for c in candidates if c.casefold() == name.casefold()]
    return folded[0] if len(folded) == 1 else None


def _hint(name: str, known: Any) -> str:
    names = sorted(set(known))
    by_fold = {n.casefold(): n for n in names}
    close = difflib.get_close_matches(name.casefold(), list(by_fold), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {by_fold[close[0]]!r}?"
    if not names:
        return "; no tables, DataFrames or stores are available"
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return f"; available: {shown}"


def _referenced_tables(con: duckdb.DuckDBPyConnection, text: str, *, has_params: bool) -> set[str]:
    """Table names ``text`` references, from DuckDB's own parser; empty when
    ``get_table_names`` cannot read the statement.

    Quirk: ``get_table_names`` binds part of the statement and raises on ``USING`` and
    ``NATURAL`` joins of tables it does not know, on prepared parameters ("Unexpected
    prepared parameter"), and on table functions whose binding fails (``read_parquet``
    of a missing file). Those statements fall back to resolving tables from DuckDB's
    catalog errors (``SQLSession._statement``)."""
    import duckdb

    if has_params:
        return set()
    try:
        return set(con.get_table_names(text))
    except duckdb.Error:
        return set()


def _missing_table(error: duckdb.CatalogException) -> str | None:
    first = str(error).splitlines()[0] if str(error) else ""
    m = _MISSING_TABLE.search(first)
    return m.group(1) if m else None


def _short_message(error: BaseException) -> str:
    """DuckDB's message without the wall: the first line, the short lines right after it
    (hints such as "Candidate bindings"), and the ``LINE n:`` excerpt with its caret;
    tab-indented lists (every overload of a function) are dropped."""
    lines = str(error).splitlines()
    if not lines:
        return type(error).__name__
    out = [lines[0]]
    i = 1
    while i < len(lines) and lines[i].strip() and len(out) < 3:
        if not lines[i].startswith("\t"):
            out.append(lines[i])
        i += 1
    for j, line in enumerate(lines):
        if line.startswith("LINE ") and j + 1 < len(lines):
            out.extend([line, lines[j + 1]])
            break
    return "\n".join(out)


def _bind_parameters(
    statements: Sequence[Any],
    params: Mapping[str, Any] | Sequence[Any] | None,
    ns: Mapping[str, Any] | None,
) -> list[Mapping[str, Any] | Sequence[Any] | None]:
    """The parameter values for each statement (``None``: it takes none)."""
    named = [{p for p in st.named_parameters if not p.isdigit()} for st in statements]
    positional = [any(p.isdigit() for p in st.named_parameters) for st in statements]
    if params is None:
        out: list[Mapping[str, Any] | Sequence[Any] | None] = []
        for names in named:
            if not names or ns is None:
                out.append(None)  # DuckDB reports missing values itself
                continue
            missing = sorted(n for n in names if n not in ns)
            if missing:
                raise SQLError(
                    f"parameter ${missing[0]}: no variable named {missing[0]!r} in the "
                    "notebook (define it, or pass params=)"
                )
            out.append({n: _param(ns[n]) for n in sorted(names)})
        return out
    if isinstance(params, Mapping):
        wanted = set().union(*named)
        unused = sorted(str(k) for k in params if k not in wanted)
        if unused:
            where = f"uses ${', $'.join(sorted(wanted))}" if wanted else "has no $name parameters"
            raise SQLError(f"parameter(s) {', '.join(unused)} not used: the SQL {where}")
        missing = sorted(n for n in wanted if n not in params)
        if missing:
            raise SQLError(f"no value for parameter ${missing[0]} (params has no {missing[0]!r})")
        return [{n: _param(params[n]) for n in sorted(names)} if names else None for names in named]
    if isinstance(params, str | bytes) or not isinstance(params, Sequence):
        raise SQLError(
            "params must be a dict (for $name placeholders) or a list (for ?), "
            f"got {type(params).__name__}"
        )
    takers = [i for i, flag in enumerate(positional) if flag]
    if len(takers) > 1:
        raise SQLError(
            "positional parameters (?) in several statements are ambiguous: "
            "use $name placeholders with a dict"
        )
    target = takers[0] if takers else len(statements) - 1
    values = [_param(v) for v in params]
    return [values if i == target else None for i in range(len(statements))]


def _param(value: Any) -> Any:
    """Quirk: DuckDB cannot bind numpy scalars ("Unable to transform python value of type
    numpy.int64"), which is what ``df["x"].max()`` returns: bind the Python value."""
    return value.item() if isinstance(value, np.generic) else value


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
        from .engine import open as open_engine

        opened = engine = open_engine(root)
    try:
        with SQLSession(engine=engine) as session:
            for name, obj in tables.items():
                session.register(name, obj)
            return session.query(query, params)
    finally:
        if opened is not None:
            opened.close()
