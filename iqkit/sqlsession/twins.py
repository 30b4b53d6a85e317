"""A store whose served version has columnar twins as a DuckDB view over them: DuckDB's
own Parquet reader scans the files, so a statement's projections and filters reach the
files (columns not named are never read, row groups are skipped by their statistics)
instead of every column of every row being streamed from Python.

The view, one per store a statement names (dropped, and its files unpinned, when the
statement ends):

* one ``read_parquet`` over every file of every partition; the ``partition`` column
  (``INTEGER``) is looked up from DuckDB's ``file_index`` in a constant list, so 200
  partitions cost one scan to plan, not 200;
* rows a newer file of their chain supersedes are dropped by position: the newest
  twin's bitmaps (``store/columnar/deletes.py``) are registered as a table of one row
  per older file, joined on ``file_index`` (a tiny build side), and ``get_bit(bitmap,
  file_row_number)`` says whether a row is dead; no key is compared. Chains whose newest
  twin has none (written by an earlier iqkit) are merged on keys instead: their older
  files' rows are added when no newer file of the same partition has their key
  (``__key``, or the key column it is derived from: an anti join). Then tombstones
  (``__deleted``) are dropped;
* the twins' own columns (``__key``, ``__deleted``) are not in the view;
  each row column is cast to the DuckDB type of the Arrow type a scan of the store
  (``store_batches``) gives it, which is free where the two agree already.

Files of one set that do not all hold the same columns are read with
``union_by_name`` (a column a file lacks is null there, as in a scan of the store);
the column types are checked to agree beforehand (``columnar.columns.twin_columns``),
so DuckDB never has to promote one.
"""

from __future__ import annotations

import contextlib
import uuid
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

    def __init__(
        self,
        store: str,
        files: TwinFiles,
        sql: str,
        masks: tuple[duckdb.DuckDBPyConnection, str] | None = None,
    ) -> None:
        self.store = store
        #: The connection and name of the position deletes' table the SQL joins.
        self._masks = masks
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
        masks, self._masks = self._masks, None
        if masks is not None:
            import duckdb

            con, name = masks
            with contextlib.suppress(duckdb.Error):  # the connection is closed already
                con.unregister(name)
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
        masks = f"__iqkit_superseded_{uuid.uuid4().hex}"
        sql, table = _view_sql(con, files.partitions, columns, masks)
        if table is not None:
            con.register(masks, table)  # unregistered by ``TwinView.close``
    except BaseException:
        files.release()
        raise
    return TwinView(store, files, sql, (con, masks) if table is not None else None)


def _view_sql(
    con: duckdb.DuckDBPyConnection,
    partitions: dict[int, list[TwinFile]],
    columns: TwinColumns,
    masks: str,
) -> tuple[str, pa.Table | None]:
    """The view's SQL, and the table of bitmaps it joins (to be registered as
    ``masks``; None: it joins none)."""
    from ..store.columnar.deletes import read_superseded

    names = [f.name for f in columns.fields]
    types = _duckdb_types(con, columns.fields)
    by_position: dict[int, list[TwinFile]] = {}  # merged by position deletes
    by_key: dict[int, list[TwinFile]] = {}  # an earlier iqkit's chains: on keys
    bitmaps: list[tuple[int, bytes]] = []  # (index in the positional read, bitmap)
    for p, chain in sorted(partitions.items()):
        older = [(f.name, columns.rows[f.path]) for f in chain[:-1]]
        deletes = read_superseded(columns.metadata.get(chain[-1].path), older) if older else None
        if older and deletes is None:
            by_key[p] = chain
            continue
        at = sum(map(len, by_position.values()))
        by_position[p] = chain
        if deletes is not None:
            bitmaps += [(at + i, b) for i, b in enumerate(deletes.bitmaps) if b is not None]
    branches = _position_branches(by_position, columns, masks if bitmaps else None) + _key_branches(
        by_key, columns
    )
    assert branches  # some file gives a column (twin_view)
    part = PARTITION
    projection = ", ".join(
        [f"CAST({_ident(part)} AS INTEGER) AS {_ident(part)}"]
        + [f"CAST({_ident(n)} AS {t}) AS {_ident(n)}" for n, t in zip(names, types, strict=True)]
    )
    table = None
    if bitmaps:
        table = pa.table(
            {
                "f": pa.array([i for i, _ in bitmaps], pa.int64()),
                "m": pa.array([b for _, b in bitmaps], pa.binary()),
            }
        )
    # BY NAME: a column no file of a branch has is null in that branch's rows.
    return f"SELECT {projection} FROM ({' UNION ALL BY NAME '.join(branches)})", table


def _position_branches(
    partitions: dict[int, list[TwinFile]], columns: TwinColumns, masks: str | None
) -> list[str]:
    """Every file of ``partitions`` in one scan: a single file per chain, or chains
    whose newest twin says which rows of its older files are superseded (position
    deletes): each file's bitmap (table ``masks``, a build side of one row per file) is
    joined on the file and tested at the row's position. No keys are compared."""
    files = [f for chain in partitions.values() for f in chain]
    shown = _present(files, columns.shown, "o.")
    if not shown:  # every file holds tombstones only: no rows
        return []
    lookup = _lookup([p for p, chain in partitions.items() for _ in chain])
    if masks is None:
        return [
            f"SELECT {lookup} AS {_ident(PARTITION)}, {_present(files, columns.shown, '')} "
            f"FROM {_read(files, columns.of_file)} WHERE NOT {_ident(_DELETED)}"
        ]
    return [
        f"SELECT o.{_ident(PARTITION)}, {shown} FROM "
        f"(SELECT {lookup} AS {_ident(PARTITION)}, file_index AS __file, "
        f"CAST(file_row_number AS INTEGER) AS __row, * "
        f"FROM {_read(files, columns.of_file, rows=True)}) o "
        f"LEFT JOIN (SELECT f, CAST(m AS BIT) AS m FROM {_ident(masks)}) k ON k.f = o.__file "
        f"WHERE NOT o.{_ident(_DELETED)} AND (k.m IS NULL OR get_bit(k.m, o.__row) = 0)"
    ]


def _key_branches(partitions: dict[int, list[TwinFile]], columns: TwinColumns) -> list[str]:
    """``partitions``' chains merged on keys (an anti join: what chains whose newest
    twin has no position deletes need, written by an earlier iqkit)."""
    if not partitions:
        return []
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
    return branches


def _present(files: list[TwinFile], shown: dict[str, list[str]], prefix: str) -> str:
    """The row columns some file of ``files`` gives rows, first seen first, as a
    select list ("": the files hold tombstones only)."""
    names = dict.fromkeys(n for f in files for n in shown[f.path])
    return ", ".join(prefix + _ident(n) for n in names)


def _read(files: list[TwinFile], of_file: dict[str, list[str]], *, rows: bool = False) -> str:
    """``read_parquet`` of ``files``, by name when they do not all hold the same columns
    (a column a file lacks is null there); ``rows``: with each row's position in its
    file (``file_row_number``)."""
    paths = ", ".join(_text(f.path) for f in files)
    same = all(of_file[f.path] == of_file[files[0].path] for f in files)
    options = ("" if same else ", union_by_name = true") + (
        ", file_row_number = true" if rows else ""
    )
    return f"read_parquet([{paths}]{options})"


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
