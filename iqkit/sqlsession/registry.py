"""Registration: which Python objects DuckDB scans under which names — the user's
(``SQLSession.register``, until unregistered) and one statement's (namespace frames and
stores, removed when the statement ends) — and what counts as a table.

Registration is zero-copy: DuckDB scans pandas DataFrames in place (numpy columns are
read directly, Arrow-backed columns through Arrow) and Arrow tables and streams through
the Arrow C stream interface with projection pushdown."""

from __future__ import annotations

import contextlib
import difflib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from .connection import unregister
from .errors import SQLError, lone_surrogate
from .stores import StoreStream
from .twins import TwinView

if TYPE_CHECKING:
    import duckdb


class Registry:
    """The names registered on one connection. The caller holds the session's lock (no
    query runs on the worker thread meanwhile) or is that worker."""

    def __init__(self) -> None:
        self.named: dict[str, Any] = {}  # name → the object DuckDB scans
        self.temporary: dict[str, Any] = {}  # per-statement registrations still in DuckDB

    def register(self, con: duckdb.DuckDBPyConnection, name: str, source: Any) -> None:
        """Register ``source`` (from :func:`scannable`) as ``name``, replacing an earlier
        registration of that name."""
        for old in [n for n in self.named if n.casefold() == name.casefold()]:
            # DuckDB names are case-insensitive: 'X' would replace the view 'x'.
            con.unregister(old)
            del self.named[old]
        con.register(name, source)
        self.named[name] = source

    def unregister(self, con: duckdb.DuckDBPyConnection, name: str) -> None:
        if name not in self.named:
            raise SQLError(f"no registered table {name!r}" + hint(name, self.named))
        con.unregister(name)
        del self.named[name]

    def names(self) -> list[str]:
        return sorted(self.named)

    def knows(self, name: str) -> bool:
        """Whether ``name`` (ignoring case, as DuckDB does) is registered already."""
        folded = name.casefold()
        return any(n.casefold() == folded for n in (*self.named, *self.temporary))

    def add_temporary(self, con: duckdb.DuckDBPyConnection, name: str, obj: Any) -> None:
        self.temporary[name] = obj
        if isinstance(obj, TwinView):
            quoted = '"' + name.replace('"', '""') + '"'
            con.execute(f"CREATE OR REPLACE TEMPORARY VIEW {quoted} AS {obj.sql}")
        else:
            con.register(name, obj)

    def twin_views(self) -> list[TwinView]:
        """This statement's stores read through their twins."""
        return [obj for obj in self.temporary.values() if isinstance(obj, TwinView)]

    def drop_temporary(self, con: duckdb.DuckDBPyConnection | None) -> None:
        """Remove the per-statement registrations (``con`` ``None``: it is closed)."""
        for name in list(self.temporary):
            view = isinstance(self.temporary[name], TwinView)
            if con is not None and not unregister(con, name, view=view):
                continue  # still there: the next query's cleanup tries again
            obj = self.temporary.pop(name)
            if isinstance(obj, StoreStream | TwinView):
                obj.close()  # a view's files are unpinned once DuckDB cannot read them

    def clear(self, con: duckdb.DuckDBPyConnection) -> None:
        """Remove every registration before ``con`` closes: DuckDB keeps the Python
        objects alive through the views."""
        self.drop_temporary(con)
        import duckdb

        for name in self.named:
            with contextlib.suppress(duckdb.Error):  # a view the user's SQL dropped
                con.unregister(name)
        self.named.clear()


def check_name(name: object) -> None:
    if not isinstance(name, str) or not name or "\x00" in name:
        raise SQLError(f"a table name must be a non-empty string, got {name!r}")
    if lone_surrogate(name) is not None:
        raise SQLError(f"a table name must be valid Unicode, got {name!r} (a lone surrogate)")


def _is_pandas_frame(obj: Any) -> bool:
    """Whether ``obj`` is a pandas DataFrame, without importing pandas: if it is not
    loaded, nothing can be one."""
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(obj, pd.DataFrame)


def is_table_like(obj: Any) -> bool:
    """Cheap type test (never calls ``.arrow()``) for objects :func:`scannable` takes."""
    if _is_pandas_frame(obj) or isinstance(obj, pa.Table | pa.RecordBatch | pa.RecordBatchReader):
        return True
    if isinstance(obj, type | ModuleType):
        return False
    kind = type(obj)
    return hasattr(kind, "__arrow_c_stream__") or callable(getattr(kind, "arrow", None))


def scannable(name: str, obj: Any) -> Any:
    """What DuckDB should scan for ``obj`` (no copies; ``.arrow()`` is called once)."""
    if _is_pandas_frame(obj) or isinstance(obj, pa.Table | pa.RecordBatchReader):
        return obj
    if isinstance(obj, pa.RecordBatch):
        return pa.Table.from_batches([obj])
    if isinstance(obj, type | ModuleType) or not is_table_like(obj):
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


def hint(name: str, known: Any) -> str:
    """ "; did you mean 'x'?" over ``known`` names, else the names there are."""
    names = sorted(set(known))
    by_fold = {n.casefold(): n for n in names}
    close = difflib.get_close_matches(name.casefold(), list(by_fold), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {by_fold[close[0]]!r}?"
    if not names:
        return "; no tables, DataFrames or stores are available"
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return f"; available: {shown}"
