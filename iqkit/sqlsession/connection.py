"""The session's private DuckDB connection: opened with iqkit's settings (what SQL may
touch, no replacement scans, no progress bar; see the package docstring), and the one
DuckDB call its cleanup needs a workaround for."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb

#: What a session's SQL may reach besides iqkit's tables (package docstring).
SQL_ACCESS = ("files", "none")


def check_access(access: str, directories: Sequence[str | os.PathLike[str]]) -> tuple[str, ...]:
    """``access`` and ``directories`` checked (a ``ValueError`` naming what is wrong);
    the directories as absolute paths."""
    if access not in SQL_ACCESS:
        raise ValueError(f"access must be one of {', '.join(SQL_ACCESS)}, got {access!r}")
    if directories and access != "none":
        raise ValueError("directories only apply with access='none' ('files' reaches all)")
    return tuple(os.path.abspath(d) for d in directories)


def connect(access: str, directories: Sequence[str]) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory connection with iqkit's settings."""
    import duckdb

    con = duckdb.connect(":memory:")
    # Explicit resolution only (see the package docstring); and no DuckDB progress bar.
    con.execute("SET python_enable_replacements = false")
    con.execute("SET enable_progress_bar = false")
    _limit_access(con, access, directories)
    return con


def _limit_access(con: duckdb.DuckDBPyConnection, access: str, directories: Sequence[str]) -> None:
    """Apply ``access`` (package docstring) to a fresh connection. Order matters: DuckDB
    refuses ``allowed_directories`` once external access is off, and every setting once
    the configuration is locked."""
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    if access == "none":
        if directories:
            con.execute("SET allowed_directories = ?", [list(directories)])
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")


def cache_footers(con: duckdb.DuckDBPyConnection, on: bool) -> bool:
    """Set DuckDB's Parquet footer cache (``parquet_metadata_cache``) to ``on``; its
    value before. The session turns it on for a statement reading store twins and back
    after it: twin files never change once published, so their parsed footers can be
    kept (at 10M keys in 72 twins, parsing them again was about a third of DuckDB's own
    time in each statement), while DuckDB still reads the footers of the user's own
    files, which may be rewritten in place, afresh by default."""
    import duckdb

    for _ in range(3):  # an interrupt aimed at the query before: as ``unregister``'s quirk
        try:
            rows = con.execute("SELECT current_setting('parquet_metadata_cache')").fetchall()
            before = rows[0][0] in (True, "true")
            if before != on:
                con.execute(f"SET parquet_metadata_cache = {str(on).lower()}")
            return before
        except duckdb.InterruptException:
            continue
    return on


def unregister(con: duckdb.DuckDBPyConnection, name: str, *, view: bool = False) -> bool:
    """Unregister ``name`` (``view``: a view made by SQL, which ``unregister`` leaves
    in place: it is dropped); ``False`` if it is still registered.

    Quirk: ``con.interrupt()`` stops whatever the connection runs next, and
    ``unregister`` runs a statement (``DROP VIEW``): an interrupt aimed at the query that
    just ended can land on the cleanup after it, so an interrupted unregister is retried.
    """
    import duckdb

    for _ in range(3):
        try:
            if view:
                con.execute(f'DROP VIEW IF EXISTS "{name.replace(chr(34), chr(34) * 2)}"')
            else:
                con.unregister(name)
            return True
        except duckdb.InterruptException:
            continue
        except duckdb.Error:  # already gone (the user's SQL dropped it)
            return True
    return False
