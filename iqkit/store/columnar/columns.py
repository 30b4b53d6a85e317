"""The row columns a version's twins hold together, read from their footers alone: what
a reader with its own Parquet reader (``iqkit.sql``'s DuckDB) projects from them.

A scan of the store (``iqkit.tables.store_batches``) puts the twins' columns together
as ``shaping._assemble`` does: the union of the columns in first-seen order (partitions
ascending, each chain's files oldest first), a column missing from a file is null
there, and columns whose types differ between files are cast to a common type or made
JSON text. A Parquet reader merging files by name promotes types by its own rules, which
need not be those; so ``twin_columns`` answers only when every file that has a column
gives it the same type (and the same JSON-text marking), where both ways agree, and
``None`` otherwise (the caller then reads the store's rows)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import StoreCorruptedError
from .deletes import footer_schema
from .twins import DELETED, HIDDEN, JSON_TEXT, KEY_BYTES, KEY_FROM, LAYOUT

if TYPE_CHECKING:
    from ..format import TwinFile

__all__ = ["TwinColumns", "twin_columns"]


class TwinColumns:
    """The row columns of a set of twins (``fields``, without ``partition``); each file's
    own row columns in its order (``of_file``, by path: files that differ are read by
    name); and the columns each file gives rows (``shown``: none for a file of
    tombstones only, whose columns hold nothing; a column only nulls in a file is not
    given by it)."""

    __slots__ = ("fields", "merge_key", "metadata", "of_file", "rows", "shown", "tombstones")

    def __init__(
        self,
        fields: list[pa.Field],
        of_file: dict[str, list[str]],
        shown: dict[str, list[str]],
        merge_key: str = KEY_BYTES,
        rows: dict[str, int] | None = None,
        metadata: dict[str, dict[bytes, bytes]] | None = None,
        tombstones: dict[str, bool] | None = None,
    ) -> None:
        self.fields = fields
        self.of_file = of_file
        self.shown = shown
        #: Each file's rows and schema metadata, by path (a chain's newest twin's holds
        #: its position deletes, ``deletes.py``).
        self.rows = rows or {}
        self.metadata = metadata or {}
        #: Whether a file may hold a tombstone, by path (``__deleted``'s statistics).
        self.tombstones = tombstones or {}
        #: The column a chain's files are merged on (the newest file holding a value of
        #: it has the row): ``__key``, or the key column it is derived from.
        self.merge_key = merge_key


def twin_columns(partitions: dict[int, list[TwinFile]], layout: bytes) -> TwinColumns | None:
    """The row columns of ``partitions``' twins (module docstring), or None when a file
    was written for another layout than ``layout`` or a column's type differs between
    the files that hold values of it. A column that is only nulls in every file is left
    out: merging a chain's twins leaves such columns behind (a file of tombstones has a
    null ``value`` column), which a scan of RocksDB never shows. A footer that cannot be read raises
    ``StoreCorruptedError`` naming the partition and the twin."""
    found: dict[str, pa.Field] = {}
    of_file: dict[str, list[str]] = {}
    shown: dict[str, list[str]] = {}
    merge_keys = set()
    rows: dict[str, int] = {}
    metadata: dict[str, dict[bytes, bytes]] = {}
    tombstones: dict[str, bool] = {}
    for p, files in sorted(partitions.items()):
        for f in files:
            meta = _footer(p, f)
            schema = footer_schema(meta)
            rows[f.path] = meta.num_rows
            metadata[f.path] = schema.metadata or {}
            if (schema.metadata or {}).get(LAYOUT) != layout:
                return None
            derived = (schema.metadata or {}).get(KEY_FROM)
            merge_keys.add(KEY_BYTES if derived is None else derived.decode())
            of_file[f.path] = [n for n in schema.names if n not in HIDDEN]
            shown[f.path] = []
            tombstones[f.path] = _may_hold(meta, schema.names.index(DELETED), True)
            if not _may_hold(meta, schema.names.index(DELETED), False):
                continue
            for field in schema:
                if field.name in HIDDEN:
                    continue
                json = bool(field.metadata and field.metadata.get(JSON_TEXT))
                seen = found.get(field.name)
                if pa.types.is_null(field.type):
                    continue
                shown[f.path].append(field.name)
                if seen is None:
                    found[field.name] = pa.field(
                        field.name, field.type, metadata={JSON_TEXT: b"1"} if json else None
                    )
                elif seen.type != field.type or bool(seen.metadata) != json:
                    return None
    if len(merge_keys) > 1:
        return None
    merge_key = merge_keys.pop() if merge_keys else KEY_BYTES
    return TwinColumns(list(found.values()), of_file, shown, merge_key, rows, metadata, tombstones)


def _footer(p: int, f: TwinFile) -> pq.FileMetaData:
    try:
        meta = pq.read_metadata(f.path)
        names = meta.schema.to_arrow_schema().names
    except (pa.ArrowException, OSError, ValueError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StoreCorruptedError(
            f"partition {p}: columnar twin {f.name} cannot be read: "
            f"{detail.replace(f.path, f.name)}"
        ) from None
    derived = (meta.schema.to_arrow_schema().metadata or {}).get(KEY_FROM)
    key = KEY_BYTES if derived is None else derived.decode()
    if key not in names or DELETED not in names:
        raise StoreCorruptedError(
            f"partition {p}: columnar twin {f.name} cannot be read: no {key} or {DELETED} column"
        )
    return meta


def _may_hold(meta: pq.FileMetaData, deleted: int, value: bool) -> bool:
    """Whether a row of the file may have ``__deleted`` = ``value`` (``False``: a row,
    ``True``: a tombstone), by the column's statistics (none: it may)."""
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if not group.num_rows:
            continue
        stats = group.column(deleted).statistics
        if stats is None or not stats.has_min_max or (stats.max if value else not stats.min):
            return True
    return False
