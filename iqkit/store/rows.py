"""The columns of a store's rows: one layout for every reader that shows a store as rows,
Arrow tables (:mod:`iqkit.tables`, behind ``%iq``, the panel and SQL) and Spark
DataFrames (:mod:`iqkit.spark.datasource`).

A row is ``partition``, then the key, then, for window stores, ``window_start`` and
``window_end``, then the value:

* The key is one column ``key``, or, for a composite ``ordered`` key, one column per
  tuple element, named from the manifest's ``properties["key_columns"]`` (a list, or
  ``"a, b"`` written by hand), else ``key_0, key_1, ...``.
* The value is one column ``value``, or one column per field of a JSON record; a field
  named like a partition, key or window column becomes ``value.<field>``.
* Types come from the serdes (:mod:`iqkit.store.encoding.serdes`: ``arrow_type``, ``spark_ddl``):
  ``partition`` is a 32-bit int, window bounds are UTC timestamps in milliseconds.

The two readers differ only where their type systems make them. Arrow infers a column's
type from the values read, so a table splits any tuple key into elements (declared
names win, ``key_i`` otherwise). Spark fixes a DataFrame's schema before reading a row,
so it splits a key only when the manifest also declares the elements' types
(``properties["key_types"]``, DDL types); otherwise the whole key is one ``key``
column, of the serde's Spark type or, for ``json``/``ordered``, its compact JSON text.

Pure Python: pyarrow is imported only by :meth:`RowSchema.arrow_types`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .encoding.serdes import Serde, get_serde
from .manifest import StoreManifest

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "KEY",
    "PARTITION",
    "VALUE",
    "WINDOW_END",
    "WINDOW_START",
    "RowSchema",
    "arrow_timestamp",
    "ddl_names",
    "quote_ddl",
    "split_ddl_list",
]

PARTITION = "partition"
KEY = "key"
VALUE = "value"
WINDOW_START = "window_start"
WINDOW_END = "window_end"

#: Spark DDL types of the partition and window columns.
PARTITION_DDL = "INT"
WINDOW_DDL = "TIMESTAMP"


def arrow_timestamp() -> pa.DataType:
    """Arrow's type of ``window_start`` / ``window_end``: epoch milliseconds, UTC."""
    import pyarrow as pa

    return pa.timestamp("ms", tz="UTC")


# -- DDL text --------------------------------------------------------------------------------
def split_ddl_list(text: str) -> list[str]:
    """Split ``"string, decimal(10,2)"`` on top-level commas."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "(<":
            depth += 1
        elif ch in ")>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def ddl_names(ddl: str) -> list[str]:
    """Column names of a DDL column list (``"a string, `b c` map<string,int>"``)."""
    names = []
    for part in split_ddl_list(ddl):
        part = part.strip()
        if part.startswith("`"):
            end = part.find("`", 1)
            while end != -1 and part[end + 1 : end + 2] == "`":
                end = part.find("`", end + 2)
            names.append(part[1:end].replace("``", "`") if end != -1 else part)
        else:
            names.append(part.split(None, 1)[0].rstrip(":"))
    return names


def quote_ddl(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _listed(value: Any, split: Any) -> list[str]:
    """A manifest property holding a list of texts: a list, or one comma-separated text
    (written by hand)."""
    if not value:
        return []
    if isinstance(value, str):
        return [part.strip() for part in split(value) if part.strip()]
    return [str(part) for part in value]


# -- the schema ------------------------------------------------------------------------------
class RowSchema:
    """The row layout of one store (of one query: ``raw`` queries' keys and values are
    bytes, and their window keys are not split into windows)."""

    def __init__(self, manifest: StoreManifest, *, raw: bool = False) -> None:
        self.store = manifest.name
        self.windowed = manifest.kind.windowed and not raw
        self.key_serde: Serde = get_serde("bytes" if raw else manifest.key_serde)
        self.value_serde: Serde = get_serde("bytes" if raw else manifest.value_serde)
        self._properties = manifest.properties
        #: The key columns the manifest declares (any serde; see ``tuple_key_columns``).
        self.declared_key_columns = _listed(
            manifest.properties.get("key_columns"), lambda t: t.split(",")
        )
        ordered = self.key_serde.name == "ordered"
        #: A composite key's columns, known before any row is read: the declared ones,
        #: for an ``ordered`` key of two or more (a single one is the bare key).
        self.tuple_key_columns: list[str] = (
            self.declared_key_columns if ordered and len(self.declared_key_columns) >= 2 else []
        )

    # Key columns ----------------------------------------------------------------------
    def key_element_column(self, i: int) -> str:
        """The column of a tuple key's element ``i``: its declared name, else ``key_i``."""
        names = self.declared_key_columns
        return names[i] if i < len(names) else f"key_{i}"

    def typed_key_columns(self) -> list[tuple[str, str]] | None:
        """``(name, DDL type)`` of an ``ordered`` key's declared columns (names and
        types), or ``None``: what a reader that fixes types before reading (Spark) splits
        a key into. Raises ``ValueError`` when the two lists differ in length."""
        if self.key_serde.name != "ordered":
            return None
        names = self.declared_key_columns
        types = _listed(self._properties.get("key_types"), split_ddl_list)
        if not names or not types:
            return None
        if len(names) != len(types):
            raise ValueError(
                f"iqkit: store {self.store!r}: properties key_columns {names!r} and "
                f"key_types {types!r} differ in length"
            )
        return list(zip(names, types, strict=True))

    @staticmethod
    def key_parts(keys: list[Any]) -> list[tuple[Any, ...]]:
        """Every key as the tuple of its elements. The ``ordered`` serde encodes a
        one-element tuple as its element, so a bare key is the 1-tuple ``(k,)``."""
        return [k if isinstance(k, tuple) else (k,) for k in keys]

    def fixed_columns(self, key_columns: Sequence[str]) -> list[str]:
        """The columns before the value: ``partition``, ``key_columns``, the windows."""
        window = [WINDOW_START, WINDOW_END] if self.windowed else []
        return [PARTITION, *key_columns, *window]

    @staticmethod
    def field_column(field: Any, taken: Any) -> str:
        """The column of a JSON record's ``field``: its name, prefixed with ``value.``
        (as often as needed) while ``taken`` (a container of column names) holds it."""
        name = field if isinstance(field, str) else str(field)
        while name in taken:
            name = f"{VALUE}.{name}"
        return name

    # Types ----------------------------------------------------------------------------
    def arrow_types(self) -> dict[str, pa.DataType | None]:
        """Arrow types of the columns known before any row is read (``None``: inferred
        from the values): the schema of a result without rows."""
        import pyarrow as pa

        keys = self.tuple_key_columns or [KEY]
        types: dict[str, pa.DataType | None] = {PARTITION: pa.int32()}
        for name in keys:
            types[name] = None if self.tuple_key_columns else self.key_serde.arrow_type()
        if self.windowed:
            types[WINDOW_START] = types[WINDOW_END] = arrow_timestamp()
        types[VALUE] = self.value_serde.arrow_type()
        return types

    def spark_key_columns(self) -> list[tuple[str, str]]:
        """``(name, DDL type)`` of the key's Spark columns (module docstring)."""
        return self.typed_key_columns() or [(KEY, self.key_serde.spark_ddl)]

    def spark_ddl(self, value_schema: str | None = None) -> str:
        """The Spark schema (DDL) of the rows; ``value_schema`` (DDL columns, ``json``
        values only) replaces the ``value`` column by a JSON object's members. Raises
        ``ValueError`` naming what is wrong."""
        fixed = [(PARTITION, PARTITION_DDL), *self.spark_key_columns()]
        if self.windowed:
            fixed += [(WINDOW_START, WINDOW_DDL), (WINDOW_END, WINDOW_DDL)]
        cols = [f"{quote_ddl(n)} {t}" for n, t in fixed]
        if value_schema is None:
            cols.append(f"{quote_ddl(VALUE)} {self.value_serde.spark_ddl}")
            return ", ".join(cols)
        if self.value_serde.name != "json":
            raise ValueError(
                f"iqkit: option 'value_schema' needs a store with json values; store "
                f"{self.store!r} has {self.value_serde.name!r} values"
            )
        taken = [n.lower() for n, _ in fixed]
        names = [n.lower() for n in ddl_names(value_schema)]
        clash = sorted({n for n in names if names.count(n) > 1 or n in taken})
        if clash:
            raise ValueError(
                f"iqkit: option 'value_schema' repeats column(s) {', '.join(clash)}: value "
                f"columns may not repeat each other, the partition, key or window columns"
            )
        cols.append(value_schema)
        return ", ".join(cols)

    # Placing a record in a row ---------------------------------------------------------
    def value_fields(
        self, columns: Sequence[str], key_columns: Sequence[str], *, value_schema: bool = False
    ) -> list[str] | None:
        """The value columns of ``columns`` when they are a JSON object's members (a
        ``value_schema`` was given, or the columns after the fixed ones are anything but
        ``value`` alone), else ``None`` (they take the whole value)."""
        fixed = set(self.fixed_columns(key_columns))
        fields = [n for n in columns if n not in fixed]
        return fields if value_schema or fields not in ([VALUE], []) else None

    def slots(
        self, columns: Sequence[str], key_columns: Sequence[str], *, value_schema: bool = False
    ) -> list[tuple[str, Any]]:
        """Where each of ``columns`` (a schema's names, in order) takes its value from,
        for a row whose key is split into ``key_columns``: ``("partition", None)``,
        ``("key", i)`` (element ``i``), ``("window", 0 | 1)`` (start, end), ``("value",
        None)`` (the whole value) or ``("field", name)`` (a member of a JSON object).

        Without a ``value_schema``, a schema whose only value column is ``value`` takes
        the whole value; any other value columns are fields (a ``value_schema``, or a
        user-given schema)."""
        whole = not self.value_fields(columns, key_columns, value_schema=value_schema)
        out: list[tuple[str, Any]] = []
        for name in columns:
            if name == PARTITION:
                out.append(("partition", None))
            elif name in key_columns:
                out.append(("key", list(key_columns).index(name)))
            elif self.windowed and name in (WINDOW_START, WINDOW_END):
                out.append(("window", 0 if name == WINDOW_START else 1))
            else:
                out.append(("value", None) if whole else ("field", name))
        return out
