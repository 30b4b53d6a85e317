"""DuckDB SQL over stores, named results and notebook DataFrames (``%iq sql``, ``iqkit.sql``).

A package named ``sqlsession``, not ``sql``: ``iqkit.sql`` is the function
(``iqkit.sql(...)``), and a module of that name would be a second meaning of it
(importing it rebound the package attribute). One module per job: ``connection`` (the
private connection and its settings), ``registry`` (names DuckDB scans), ``resolve``
(which object a table name means), ``params`` (``$name``/``?`` values), ``worker`` (the
interrupt worker thread), ``stores`` and ``snapshots`` (stores streamed to DuckDB,
complete scans kept), ``twins`` (stores read through their columnar twins), ``versions``
(the ``changes`` and ``history`` table functions), ``errors`` (``SQLError`` and short
messages), ``session`` (``SQLSession`` putting them together, and ``sql``).

A :class:`SQLSession` owns one private in-memory DuckDB connection, so nothing a user does
with ``duckdb.sql`` (the module's default connection) and nothing iqkit does can clobber
the other. DuckDB's *replacement scans* are switched off: since duckdb 1.1 they only look
at the calling Python frame, which from inside a magic is never the notebook, and they
resolve names by accident (``df`` once meant ``duckdb.df``). Instead every table a
statement references is resolved explicitly, in this order:

1. names registered with :meth:`SQLSession.register` (``%iq ... --as x`` results);
2. tables and views created in the session's own SQL (``CREATE TABLE t AS ...``);
3. objects of a supported type in the namespace (the notebook's ``user_ns``), registered
   for this statement only and unregistered afterwards;
4. a store of that name in the engine, registered as an Arrow stream: DuckDB pulls
   ``iqkit.tables.store_batches`` batches as it scans, so a store is never
   materialised in pandas first.

Besides names, a statement may call two table functions over a store's retained
versions: ``changes(store, from_version[, to_version])``, one row per key a version after
``from_version`` changed (up to ``to_version``, else the latest), and ``history(store,
key)``, one row per value the key had (``iqkit.tables``' ``changes_table`` and
``history_table`` give their columns; ``versions.py`` how they reach DuckDB).

Anything else is one short :class:`SQLError` naming the table, with a "did you mean" over
all four kinds of names. Values are bound as parameters (``$name`` with a dict, ``?``
with a list); when no parameters are given, ``$name`` placeholders are bound from the
namespace. Names are found with DuckDB's own parser (``Statement.named_parameters``), so
placeholders inside string literals, comments and quoted identifiers are never touched,
and no value is ever spliced into SQL text.

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
  and interrupting a query after the bar appeared used to kill kernels.
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

from .connection import SQL_ACCESS
from .errors import SQLError
from .session import SQLSession, sql

__all__ = ["SQL_ACCESS", "SQLError", "SQLSession", "sql"]
