"""A store whose served version has columnar twins as a DuckDB view over them: DuckDB's
own Parquet reader scans the files, so a statement's projections and filters reach the
files (columns not named are never read, row groups are skipped by their statistics)
instead of every column of every row being streamed from Python.

The view, one per store a statement names (dropped, and its files unpinned, when the
statement ends):

* one ``read_parquet`` over the newest file of every partition; the ``partition``
  column (``INTEGER``) is looked up from DuckDB's ``file_index`` in a constant list, so
  200 partitions cost one scan to plan, not 200;
* for partitions whose chain has several files, the older files' rows are added when no
  newer file of the same partition has their key (``__key``, or the key column it is
  derived from: an anti join, the newest file holding a key has its row); then
  tombstones (``__deleted``) are dropped;
* the twins' own columns (``__key``, ``__deleted``) are not in the view;
  each row column is cast to the DuckDB type of the Arrow type a scan of the store
  (``store_batches``) gives it, which is free where the two agree already.

Files of one set that do not all hold the same columns are read with
``union_by_name`` (a column a file lacks is null there, as in a scan of the store);
the column types are checked to agree beforehand (``columnar.columns.twin_columns``),
so DuckDB never has to promote one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from ..store.rows import PARTITION

if TYPE_CHECKING:
    import duckdb

    from ..store.columnar.columns import TwinColumns
    from ..store.format import TwinFile, TwinFiles

__all__ = ["TwinView", "twin_view"]

_DELETED = "__deleted"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class TwinView:
    """A store's twins as the SQL of a view (module docstring), the files pinned until
    ``close``. ``where`` maps each local path to ``(partition, place on the root)``, so
    a DuckDB error naming a file becomes one line naming the store's partition."""

    def __init__(self, store: str, files: TwinFiles, sql: str) -> None:
        self.store = store
        self.version = files.version
        self.sql = sql
        self._files: TwinFiles | None = files
        self.where = {f.path: (p, f.name) for p, chain in files.partitions.items() for f in chain}

    def failure(self, message: str) -> str | None:
        """``message`` (a DuckDB error) as one line naming the partition, when it names
        one of this view's files; else None."""
        for path, (p, name) in self.where.items():
            if path in message:
                detail = message.splitlines()[0].replace(path, name)
                return (
                    f"reading store {self.store!r} partition {p} failed: columnar twin "
                    f"{name} cannot be read: {detail}"
                )
        return None

    def close(self) -> None:
        files, self._files = self._files, None
        if files is not None:
            files.release()


def twin_view(con: duckdb.DuckDBPyConnection, store: str, files: TwinFiles) -> TwinView | None:
    """The view of ``files`` (module docstring), or None when they cannot be read as one
    by name and type (``twin_columns``): the store's rows are read then. Releases
    ``files`` unless it returns a view holding them."""
    # pyarrow.parquet is imported once a store is read (never by ``import iqkit``).
    from ..store.columnar.columns import twin_columns

    try:
        columns = twin_columns(files.partitions, files.layout) if files.partitions else None
        if columns is None or not columns.fields:  # no file gives a row: streamed
            files.release()
            return None
        sql = _view_sql(con, files.partitions, columns)
    except BaseException:
        files.release()
        raise
    return TwinView(store, files, sql)


def _view_sql(
    con: duckdb.DuckDBPyConnection, partitions: dict[int, list[TwinFile]], columns: TwinColumns
) -> str:
    names = [f.name for f in columns.fields]
    types = _duckdb_types(con, columns.fields)
    top = [(p, chain[-1]) for p, chain in sorted(partitions.items())]
    older = [(p, level, f) for p, chain in sorted(partitions.items()) for level, f in
             enumerate(chain[:-1])]  # fmt: skip
    newer = [(p, level, f) for p, chain in sorted(partitions.items()) if len(chain) > 1
             for level, f in enumerate(chain) if level > 0]  # fmt: skip
    part = PARTITION
    of_file, shown = columns.of_file, columns.shown
    key = columns.merge_key  # ``__key``, or the key column it is derived from
    branches = []
    top_files = [f for _, f in top]
    top_names = _present(top_files, shown, "")
    if top_names:  # else every newest file holds tombstones only: no rows
        branches.append(
            f"SELECT {_lookup([p for p, _ in top])} AS {_ident(part)}, {top_names} "
            f"FROM {_read(top_files, of_file)} WHERE NOT {_ident(_DELETED)}"
        )
    files = [f for _, _, f in older]
    older_names = _present(files, shown, "o.")
    if older_names:
        branches.append(
            f"SELECT o.{_ident(part)}, {older_names} FROM "
            f"(SELECT {_lookup([p for p, _, _ in older])} AS {_ident(part)}, "
            f"{_lookup([lv for _, lv, _ in older])} AS __level, * "
            f"FROM {_read(files, of_file)}) o "
            f"WHERE NOT o.{_ident(_DELETED)} AND NOT EXISTS (SELECT 1 FROM "
            f"(SELECT {_lookup([p for p, _, _ in newer])} AS __p, "
            f"{_lookup([lv for _, lv, _ in newer])} AS __level, {_ident(key)} "
            f"FROM {_read([f for _, _, f in newer], of_file)}) n "
            f"WHERE n.__p = o.{_ident(part)} AND n.{_ident(key)} = o.{_ident(key)} "
            f"AND n.__level > o.__level)"
        )
    assert branches  # some file gives a column (twin_view)
    projection = ", ".join(
        [f"CAST({_ident(part)} AS INTEGER) AS {_ident(part)}"]
        + [f"CAST({_ident(n)} AS {t}) AS {_ident(n)}" for n, t in zip(names, types, strict=True)]
    )
    # BY NAME: a column no file of a branch has is null in that branch's rows.
    return f"SELECT {projection} FROM ({' UNION ALL BY NAME '.join(branches)})"


def _present(files: list[TwinFile], shown: dict[str, list[str]], prefix: str) -> str:
    """The row columns some file of ``files`` gives rows, first seen first, as a
    select list ("": the files hold tombstones only)."""
    names = dict.fromkeys(n for f in files for n in shown[f.path])
    return ", ".join(prefix + _ident(n) for n in names)


def _read(files: list[TwinFile], of_file: dict[str, list[str]]) -> str:
    """``read_parquet`` of ``files``, by name when they do not all hold the same columns
    (a column a file lacks is null there)."""
    paths = ", ".join(_text(f.path) for f in files)
    same = all(of_file[f.path] == of_file[files[0].path] for f in files)
    return f"read_parquet([{paths}]{'' if same else ', union_by_name = true'})"


def _lookup(values: list[int]) -> str:
    """The value of the current row's file (``file_index`` counts the files of its
    ``read_parquet`` from 0): the index itself when the values are 0, 1, 2, ..."""
    if values == list(range(len(values))):
        return "CAST(file_index AS INTEGER)"
    # Quirk: a list is indexed by BIGINT and file_index is UBIGINT; DuckDB has no
    # implicit cast between them.
    return f"[{', '.join(map(str, values))}][CAST(file_index AS BIGINT) + 1]"


def _duckdb_types(con: duckdb.DuckDBPyConnection, fields: list[pa.Field]) -> list[str]:
    """The DuckDB types an Arrow table with ``fields`` is scanned as (what the view's
    columns are cast to: the types of ``store_batches`` registered as a table)."""
    empty = pa.schema([pa.field(f"c{i}", f.type) for i, f in enumerate(fields)]).empty_table()
    return [str(t) for t in con.from_arrow(empty).types]
