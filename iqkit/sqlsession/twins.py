"""A store whose served version has columnar twins as a DuckDB view over them: DuckDB's
own Parquet reader scans the files, so a statement's projections and filters reach the
files (columns not named are never read, row groups are skipped by their statistics)
instead of every column of every row being streamed from Python.

The view, one per store a statement names (dropped, and its files unpinned, when the
statement ends; its plan, ``TwinPlan``, is kept by the session for the next statement
over the same files, ``TwinPlans``):

* the files of every partition in at most two ``read_parquet`` scans; the ``partition``
  column (``INTEGER``) is looked up from DuckDB's ``file_index`` in a constant list, so
  200 partitions cost one scan to plan, not 200;
* rows a newer file of their chain supersedes, and tombstones, are dropped by position:
  per file, one bitmap of its dead rows, the newest twin's position deletes
  (``store/columnar/deletes.py``) or-ed with the file's own tombstones (``__deleted``,
  found by one scan of that column where the footers allow one). Files with no dead
  row are read with no filter; the others with ``file_row_number``, their bitmaps
  registered as a table of one row per file, joined on ``file_index`` (a tiny build
  side) and tested with ``get_bit(bitmap, file_row_number)``; no key is compared.
  Chains whose newest twin has no position deletes (written by an earlier iqkit) are
  merged on keys instead: their older files' rows are added when no newer file of the
  same partition has their key (``__key``, or the key column it is derived from: an
  anti join), and their tombstones dropped by ``__deleted``;
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
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..store.rows import PARTITION

if TYPE_CHECKING:
    import duckdb

    from ..store.columnar.columns import TwinColumns
    from ..store.format import TwinFile, TwinFiles

__all__ = ["TwinPlan", "TwinPlans", "TwinView", "twin_view"]

_DELETED = "__deleted"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class TwinPlan:
    """What a version's files give the view, worked out once (their footers, position
    deletes and column types): the view's SQL and the bitmaps it joins (``masks``, the
    name it joins them by). Twin files are immutable, so a plan holds as long as its
    files do (``TwinPlans``)."""

    __slots__ = ("masks", "sql", "table")

    def __init__(self, sql: str, table: pa.Table | None, masks: str) -> None:
        self.sql = sql
        self.table = table
        self.masks = masks


class TwinPlans:
    """A session's plans by the files they read (each twin's local path and place on the
    root, oldest first per partition): the next statement over the same version, or over
    a version sharing every file, reads no footer and decodes no bitmap again. A twin's
    name is unique and its bytes never change (every statement still checks them,
    ``StoreSnapshot.twin_files``), so a plan cannot go stale. The ``KEPT`` most recently
    used are kept (a plan holds the version's bitmaps: a bit per row of its older files)."""

    KEPT = 8

    def __init__(self) -> None:
        self._plans: OrderedDict[tuple[object, ...], TwinPlan | None] = OrderedDict()

    def plan(self, con: duckdb.DuckDBPyConnection, files: TwinFiles) -> TwinPlan | None:
        """``files``' plan, made if not kept (None: they cannot be one view)."""
        key = (
            files.layout,
            *((p, f.path, f.name) for p, chain in sorted(files.partitions.items()) for f in chain),
        )
        if key in self._plans:
            self._plans.move_to_end(key)
            return self._plans[key]
        made = _plan(con, files)
        self._plans[key] = made
        while len(self._plans) > self.KEPT:
            self._plans.popitem(last=False)
        return made

    def clear(self) -> None:
        self._plans.clear()


class TwinView:
    """A store's twins as the SQL of a view (module docstring), the files pinned and the
    bitmaps it joins registered until ``close``. ``where`` maps each local path to
    ``(partition, place on the root)``, so a DuckDB error naming a file becomes one line
    naming the store's partition."""

    def __init__(
        self,
        store: str,
        files: TwinFiles,
        plan: TwinPlan,
        con: duckdb.DuckDBPyConnection,
    ) -> None:
        self.store = store
        self.version = files.version
        self.sql = plan.sql
        self._files: TwinFiles | None = files
        self.where = {f.path: (p, f.name) for p, chain in files.partitions.items() for f in chain}
        #: The connection and name of the position deletes' table the SQL joins.
        self._masks: tuple[duckdb.DuckDBPyConnection, str] | None = None
        if plan.table is not None:
            con.register(plan.masks, plan.table)
            self._masks = (con, plan.masks)

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


def twin_view(
    con: duckdb.DuckDBPyConnection,
    store: str,
    files: TwinFiles,
    plans: TwinPlans | None = None,
) -> TwinView | None:
    """The view of ``files`` (module docstring), or None when they cannot be read as one
    by name and type (``twin_columns``): the store's rows are read then. ``plans``: the
    session's kept plans (else one is made for this view). Releases ``files`` unless it
    returns a view holding them."""
    try:
        plan = (plans or TwinPlans()).plan(con, files)
        if plan is None:  # no file gives a row, or they differ: streamed
            files.release()
            return None
        return TwinView(store, files, plan, con)
    except BaseException:
        files.release()
        raise


def _plan(con: duckdb.DuckDBPyConnection, files: TwinFiles) -> TwinPlan | None:
    """``files``' plan (``TwinPlan``), or None when they cannot be read as one view."""
    # pyarrow.parquet is imported once a store is read (never by ``import iqkit``).
    from ..store.columnar.columns import twin_columns

    columns = twin_columns(files.partitions, files.layout) if files.partitions else None
    if columns is None or not columns.fields:
        return None
    masks = f"__iqkit_superseded_{uuid.uuid4().hex}"
    sql, table = _view_sql(con, files.partitions, columns, masks)
    return TwinPlan(sql, table, masks)


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
    clean: list[tuple[int, TwinFile]] = []  # files whose every row is live
    masked: list[tuple[int, TwinFile, bytes]] = []  # files with dead rows: their bitmap
    by_key: dict[int, list[TwinFile]] = {}  # an earlier iqkit's chains: on keys
    by_position: list[tuple[int, TwinFile, bytes | None]] = []  # (p, file, superseded)
    for p, chain in sorted(partitions.items()):
        older = [(f.name, columns.rows[f.path]) for f in chain[:-1]]
        deletes = read_superseded(columns.metadata.get(chain[-1].path), older) if older else None
        if older and deletes is None:
            by_key[p] = chain
            continue
        by_position += [
            (p, f, deletes.bitmaps[i] if deletes is not None and i < len(older) else None)
            for i, f in enumerate(chain)
        ]
    tombs = _tombstones(con, [f for _, f, _ in by_position], columns)
    for p, f, superseded in by_position:
        dead = _dead_rows(columns.rows[f.path], superseded, tombs.get(f.path))
        if dead is None:
            clean.append((p, f))
        elif dead is not _ALL_DEAD:
            masked.append((p, f, dead))
    branches = _position_branches(clean, masked, columns, masks) + _key_branches(by_key, columns)
    if not branches:  # every row is dead: the columns, no rows
        nulls = ", ".join(f"NULL AS {_ident(n)}" for n in [PARTITION, *names])
        branches = [f"SELECT {nulls} WHERE false"]
    part = PARTITION
    projection = ", ".join(
        [f"CAST({_ident(part)} AS INTEGER) AS {_ident(part)}"]
        + [f"CAST({_ident(n)} AS {t}) AS {_ident(n)}" for n, t in zip(names, types, strict=True)]
    )
    table = None
    if masked:
        table = pa.table(
            {
                # UBIGINT, as DuckDB's file_index: a join on equal types (else HUGEINT)
                "f": pa.array(range(len(masked)), pa.uint64()),
                "m": pa.array([m for _, _, m in masked], pa.binary()),
            }
        )
    # BY NAME: a column no file of a branch has is null in that branch's rows.
    return f"SELECT {projection} FROM ({' UNION ALL BY NAME '.join(branches)})", table


#: ``_dead_rows`` of a file none of whose rows is live (it is not read).
_ALL_DEAD = b""


def _tombstones(
    con: duckdb.DuckDBPyConnection, files: list[TwinFile], columns: TwinColumns
) -> dict[str, Any]:
    """The rows of ``files`` that are tombstones (``__deleted``), by path, as numpy
    arrays of row numbers: one DuckDB scan of that column alone, of the files whose
    footer statistics allow one (a base with none costs nothing)."""
    import numpy as np

    files = [f for f in files if columns.tombstones.get(f.path, True)]
    if not files:
        return {}
    found = con.execute(
        f"SELECT file_index, file_row_number FROM {_read(files, columns.of_file, rows=True)} "
        f"WHERE {_ident(_DELETED)}"
    ).fetchnumpy()
    index = np.asarray(found["file_index"], np.int64)
    rows = np.asarray(found["file_row_number"], np.int64)
    order = np.argsort(index, kind="stable")
    index, rows = index[order], rows[order]
    bounds = np.searchsorted(index, np.arange(len(files) + 1))
    return {
        f.path: rows[bounds[i] : bounds[i + 1]]
        for i, f in enumerate(files)
        if bounds[i + 1] > bounds[i]
    }


def _dead_rows(rows: int, superseded: bytes | None, tombstones: Any) -> bytes | None:
    """The packed bitmap (``deletes.Superseded``'s order) of a file's ``rows`` a reader
    drops: superseded by a newer file of its chain, or tombstones (row numbers). None:
    every row is live; ``_ALL_DEAD``: none is.

    Why tombstones become bits too: a ``NOT __deleted`` filter pushed into DuckDB's scan
    made the scan of every file cost about twice as much (it decodes each row group's
    other columns through a selection), while the bitmap test is needed anyway."""
    import numpy as np

    if superseded is None and tombstones is None:
        return None
    dead = np.zeros(rows, bool)
    if superseded is not None:
        dead = np.unpackbits(np.frombuffer(superseded, np.uint8), count=rows).astype(bool)
    if tombstones is not None:
        dead[tombstones] = True
    if not dead.any():
        return None
    if dead.all():
        return _ALL_DEAD
    return np.packbits(dead).tobytes()


def _position_branches(
    clean: list[tuple[int, TwinFile]],
    masked: list[tuple[int, TwinFile, bytes]],
    columns: TwinColumns,
    masks: str,
) -> list[str]:
    """The files of chains merged by position (a single file, or chains whose newest
    twin says which rows of its older files are superseded, ``deletes.py``): those
    whose every row is live in one scan with no filter; those with dead rows in another,
    each file's bitmap (table ``masks``, a build side of one row per file, in the
    order of ``masked``) joined on the file and tested at the row's position. No keys
    are compared, and ``__deleted`` is not read by DuckDB (``_dead_rows``)."""
    branches = []
    files = [f for _, f in clean]
    if files and (shown := _present(files, columns.shown, "")):
        lookup = _lookup([p for p, _ in clean])
        branches.append(
            f"SELECT {lookup} AS {_ident(PARTITION)}, {shown} FROM {_read(files, columns.of_file)}"
        )
    files = [f for _, f, _ in masked]
    if files and (shown := _present(files, columns.shown, "o.")):
        lookup = _lookup([p for p, _, _ in masked])
        branches.append(
            f"SELECT o.{_ident(PARTITION)}, {shown} FROM "
            f"(SELECT {lookup} AS {_ident(PARTITION)}, file_index AS __file, "
            f"CAST(file_row_number AS INTEGER) AS __row, * "
            f"FROM {_read(files, columns.of_file, rows=True)}) o "
            f"JOIN (SELECT f, CAST(m AS BIT) AS m FROM {_ident(masks)}) k ON k.f = o.__file "
            f"WHERE get_bit(k.m, o.__row) = 0"
        )
    return branches


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
