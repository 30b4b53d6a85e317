"""A store's versions as SQL tables: ``changes(store, from_version[, to_version])`` and
``history(store, key)``, as ``iqkit.tables``' ``changes_table`` and ``history_table``
make them (``SELECT * FROM changes('totals', 3, 5) WHERE kind = 'delete'``).

How: DuckDB's Python API has no table functions written in Python, so each is a table
macro of the session's connection that names a table after its arguments:
``query_table('__iqkit_changes_' || hex(json_array(store, ...)))``. DuckDB evaluates the
arguments itself (literals, ``$name`` and ``?`` parameters, constant expressions), then
reports that table missing; the resolver reads the call back from the name, queries the
engine and registers the table for the statement, and DuckDB binds again, as for any
store a statement names (``resolve.py``). No SQL text is rewritten, and a call works
wherever a table does (joins, ``CREATE TABLE ... AS``, ``COPY``). The arguments travel
as JSON, so their types survive (``'3'`` is text, not a version), and as hex, so the
name is one plain identifier whatever the store or key holds (quotes, dots, case).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import IqkitError
from ..query import ChangesQuery, MultiVersionedKeyQuery, QueryResult, StateQueryRequest
from .errors import SQLError
from .registry import hint

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from ..engine import StateEngine

#: What the names of the tables behind the macros start with.
PREFIX = "__iqkit_"

#: Each function: its parameters as the macro declares them, and as messages show them.
_FUNCTIONS = {
    "changes": ("store, from_version, to_version := NULL", "store, from_version[, to_version]"),
    "history": ("store, key", "store, key"),
}

#: DuckDB's message for a macro called with arguments it does not declare.
_BAD_ARGUMENTS = re.compile(r"Macro (\w+)\(\) does not support the supplied arguments")


def install(con: duckdb.DuckDBPyConnection) -> None:
    """Create the table macros on a fresh connection (temporary: the connection's own)."""
    for name, (params, _) in _FUNCTIONS.items():
        args = ", ".join(p.split(":=")[0].strip() for p in params.split(","))
        con.execute(
            f"CREATE OR REPLACE TEMPORARY MACRO {name}({params}) AS TABLE SELECT * FROM "
            f"query_table('{PREFIX}{name}_' || hex(json_array({args})))"
        )


@dataclass(frozen=True)
class VersionCall:
    """One ``changes(...)`` or ``history(...)`` call of a statement, read from the name
    of the table its macro asks for."""

    function: str
    args: tuple[Any, ...]

    def __str__(self) -> str:
        """The call as written, give or take spacing (an omitted ``to_version`` stays
        omitted)."""
        args = self.args[:-1] if self.function == "changes" and self.args[-1] is None else self.args
        return f"{self.function}({', '.join(map(_literal, args))})"


def parse_call(name: str) -> VersionCall | None:
    """The call behind a table name the macros make, else ``None``."""
    for function in _FUNCTIONS:
        head = f"{PREFIX}{function}_"
        if name.casefold().startswith(head):
            try:
                args = json.loads(bytes.fromhex(name[len(head) :]).decode("utf-8"))
            except ValueError:
                return None
            wanted = _FUNCTIONS[function][0].count(",") + 1
            ok = isinstance(args, list) and len(args) == wanted
            return VersionCall(function, tuple(args)) if ok else None
    return None


def bad_arguments(message: str) -> str | None:
    """DuckDB's "does not support the supplied arguments" for a macro here, said in one
    line naming the parameters; ``None`` for any other message."""
    m = _BAD_ARGUMENTS.search(message)
    if m is None or m.group(1) not in _FUNCTIONS:
        return None
    function = m.group(1)
    return f"{function}() takes ({_FUNCTIONS[function][1]}); got other arguments"


def version_table(
    call: VersionCall, engine: StateEngine | None, stores: Callable[[], Sequence[str]]
) -> pa.Table:
    """The table of ``call`` (``stores()``: the store names there are). Anything wrong
    (no engine, an unknown store, a version not retained, an argument of the wrong type,
    a failed partition) is one ``SQLError`` line that starts with the call."""
    from ..tables import changes_table, history_table

    store = call.args[0]
    if not isinstance(store, str):
        raise SQLError(f"{call}: the store must be a store's name (text), got {_literal(store)}")
    if engine is None:
        raise SQLError(f"{call}: no stores (the session has no engine)")
    names = stores()
    if store not in names:
        raise SQLError(f"{call}: unknown store {store!r}" + hint(store, names))
    try:
        if call.function == "changes":
            query: Any = ChangesQuery.between(call.args[1], call.args[2])
        else:
            query = MultiVersionedKeyQuery.with_key(_key(call.args[1]))
            query = query.with_ascending_timestamps()
        result = engine.query(StateQueryRequest.in_store(store).with_query(query))
        _check_partitions(call, result.partition_results)
        manifest = engine.manifest(store)
        if call.function == "changes":
            return changes_table(result, manifest)
        return history_table(result, manifest, key=query.key)
    except (IqkitError, TypeError, ValueError) as exc:
        if isinstance(exc, SQLError):
            raise
        raise SQLError(f"{call}: {_first_line(str(exc))}") from None


def _check_partitions(call: VersionCall, results: Mapping[int, QueryResult[Any]]) -> None:
    """Raise for a failed partition: a table missing a partition's rows would be wrong.
    The partition is named unless every partition failed alike (a version not retained)."""
    failed = {p: _first_line(r.failure_message) for p, r in results.items() if r.is_failure}
    if not failed:
        return
    p = min(failed)
    alike = len(failed) == len(results) and len(set(failed.values())) == 1
    raise SQLError(f"{call}: " + ("" if alike else f"partition {p}: ") + failed[p])


def _key(value: Any) -> Any:
    """A key as JSON gave it: a list is a composite key (a tuple, as the ``ordered``
    serde takes it)."""
    return tuple(value) if isinstance(value, list) else value


def _literal(value: Any) -> str:
    """``value`` as SQL would spell it (for messages)."""
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return json.dumps(value, ensure_ascii=False)


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else "failed"
