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
from .twins import DELETED, HIDDEN, JSON_TEXT, KEY_BYTES, LAYOUT

if TYPE_CHECKING:
    from ..format import TwinFile

__all__ = ["TwinColumns", "twin_columns"]


class TwinColumns:
    """The row columns of a set of twins (``fields``, without ``partition``), and each
    file's own row columns in its order (``of_file``, by path: files that differ are
    merged by name)."""

    __slots__ = ("fields", "of_file")

    def __init__(self, fields: list[pa.Field], of_file: dict[str, list[str]]) -> None:
        self.fields = fields
        self.of_file = of_file


def twin_columns(partitions: dict[int, list[TwinFile]], layout: bytes) -> TwinColumns | None:
    """The row columns of ``partitions``' twins (module docstring), or None when a file
    was written for another layout than ``layout`` or a column's type differs between
    files (or is only nulls in one: a scan gives such a column a type of its own). A
    footer that cannot be read raises ``StoreCorruptedError`` naming the partition and
    the twin."""
    found: dict[str, pa.Field] = {}
    of_file: dict[str, list[str]] = {}
    for p, files in sorted(partitions.items()):
        for f in files:
            try:
                schema = pq.read_schema(f.path)
            except (pa.ArrowException, OSError, ValueError) as exc:
                detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise StoreCorruptedError(
                    f"partition {p}: columnar twin {f.name} cannot be read: "
                    f"{detail.replace(f.path, f.name)}"
                ) from None
            if KEY_BYTES not in schema.names or DELETED not in schema.names:
                raise StoreCorruptedError(
                    f"partition {p}: columnar twin {f.name} cannot be read: "
                    f"no {KEY_BYTES} or {DELETED} column"
                )
            if (schema.metadata or {}).get(LAYOUT) != layout:
                return None
            names = []
            for field in schema:
                if field.name in HIDDEN:
                    continue
                if pa.types.is_null(field.type):
                    return None
                names.append(field.name)
                json = bool(field.metadata and field.metadata.get(JSON_TEXT))
                seen = found.get(field.name)
                if seen is None:
                    found[field.name] = pa.field(
                        field.name, field.type, metadata={JSON_TEXT: b"1"} if json else None
                    )
                elif seen.type != field.type or bool(seen.metadata) != json:
                    return None
            of_file[f.path] = names
    return TwinColumns(list(found.values()), of_file)
