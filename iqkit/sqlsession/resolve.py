"""Which object each table name of a statement means, in the package docstring's order:
registered names, the session's own tables and views, namespace objects, stores; and the
tables behind ``changes(...)`` and ``history(...)`` calls (``versions.py``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .errors import SQLError
from .registry import Registry, hint, is_table_like, scannable
from .versions import PREFIX, parse_call, version_table

if TYPE_CHECKING:
    import duckdb

    from ..engine import StateEngine

#: How many missing tables one statement may resolve through DuckDB's catalog errors
#: (the fallback when ``get_table_names`` cannot read the statement). A bound, not a
#: limit anyone should meet: each round resolves one more distinct table.
MAX_RESOLVE_ROUNDS = 64

#: DuckDB's message for a table it cannot find (stable since 0.x: "Catalog Error: Table
#: with name X does not exist!"). X is the name as written, unquoted.
_MISSING_TABLE = re.compile(r"Table with name (.+?) does not exist!")


class Resolver:
    """Finds and registers the tables one statement references.

    Store names and catalog names are read once per statement, and only when a name is
    not registered already. ``engine`` returns the engine stores come from (or ``None``);
    ``store_table(engine, store)`` is what DuckDB scans for a store (a snapshot or a
    stream, decided by the session)."""

    def __init__(
        self,
        registry: Registry,
        con: duckdb.DuckDBPyConnection,
        ns: Mapping[str, Any] | None,
        *,
        engine: Callable[[], StateEngine | None],
        store_table: Callable[[StateEngine, str], Any],
    ) -> None:
        self.registry = registry
        self.con = con
        self.ns = ns
        self._engine_source = engine
        self._store_table = store_table
        self._catalog: dict[str, str] | None = None
        self._stores: list[str] | None = None
        self._engine: StateEngine | None = None
        self._engine_error: str | None = None

    def provide(self, name: str) -> bool:
        """Make ``name`` resolvable; ``True`` if this registered something for it."""
        if self.registry.knows(name):
            return False
        if name.casefold() in self.catalog():
            return False  # DuckDB finds it (the session's own tables and views)
        call = parse_call(name)
        if call is not None:  # a changes(...) or history(...) call (versions.py)
            engine = self.engine()
            if engine is None and self._engine_error is not None:
                raise SQLError(f"{call}: stores unavailable: {self._engine_error}")
            table = version_table(call, engine, self.stores)
            self.registry.add_temporary(self.con, name, table)
            return True
        frame = lookup(name, self.frames())
        if frame is not None:
            assert self.ns is not None
            self.registry.add_temporary(self.con, frame, scannable(frame, self.ns[frame]))
            return True
        store = lookup(name, self.stores())
        if store is not None:
            assert self._engine is not None
            self.registry.add_temporary(self.con, store, self._store_table(self._engine, store))
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
        """Namespace names holding something :func:`scannable` accepts."""
        if not self.ns:
            return []
        return [k for k, v in self.ns.items() if not k.startswith("_") and is_table_like(v)]

    def engine(self) -> StateEngine | None:
        """The engine stores come from (``None``: there is none, or asking failed)."""
        self.stores()
        return self._engine

    def stores(self) -> list[str]:
        if self._stores is None:
            self._stores = []
            try:
                self._engine = self._engine_source()
                if self._engine is not None:
                    self._stores = self._engine.store_names()
            except Exception as e:  # the engine getter's own error, kept for the message
                self._engine_error = str(e).splitlines()[0] if str(e) else type(e).__name__
        return self._stores

    def unknown_table(self, name: str) -> SQLError:
        known = {*self.frames(), *self.stores(), *self.catalog().values()}
        known = {n for n in known if not n.startswith(PREFIX)}  # versions.py's, not a user's
        msg = f"unknown table {name!r}" + hint(name, known)
        if self._engine_error is not None:
            msg += f" (stores unavailable: {self._engine_error})"
        return SQLError(msg)


def referenced_tables(con: duckdb.DuckDBPyConnection, text: str, *, has_params: bool) -> set[str]:
    """Table names ``text`` references, from DuckDB's own parser; empty when
    ``get_table_names`` cannot read the statement.

    Quirk: ``get_table_names`` binds part of the statement and raises on ``USING`` and
    ``NATURAL`` joins of tables it does not know, on prepared parameters ("Unexpected
    prepared parameter"), and on table functions whose binding fails (``read_parquet``
    of a missing file). Those statements fall back to resolving tables from DuckDB's
    catalog errors (:func:`missing_table`, ``SQLSession._statement``)."""
    import duckdb

    if has_params:
        return set()
    try:
        return set(con.get_table_names(text))
    except duckdb.Error:
        return set()


def missing_table(error: duckdb.CatalogException) -> str | None:
    """The table a catalog error says DuckDB cannot find, or ``None``."""
    first = str(error).splitlines()[0] if str(error) else ""
    m = _MISSING_TABLE.search(first)
    return m.group(1) if m else None


def lookup(name: str, candidates: Sequence[str]) -> str | None:
    """``name`` among ``candidates``: exact, else the one equal ignoring case (DuckDB
    identifiers are case-insensitive, Python names and store folders are not)."""
    if name in candidates:
        return name
    folded = [c for c in candidates if c.casefold() == name.casefold()]
    return folded[0] if len(folded) == 1 else None
