"""Arrow record batches for the ``iqkit`` Spark reader: a partition's columnar twins as
batches of the DataFrame's schema, with no Python work per row.

Spark 4's Python data sources take ``pyarrow.RecordBatch`` from ``read()`` and hand them
to the JVM as they are (their schema must equal the DataFrame's, as Spark maps its types
to Arrow). A twin (:mod:`iqkit.store.columnar.twins`) already holds the row layout's
columns, typed, so a scan read from twins becomes batches by picking columns and casting
them. This is the path of full, range and prefix reads of key-value stores whose
partitions have twins; everything else keeps the row path (:mod:`iqkit.spark.read_rows`),
and both give the same rows.

Which schemas the batch path serves (``ArrowRows.plan``; anything else: the row path):

* ``partition``: the store partition, a constant column;
* a key that is one column of a scalar serde (``string``, ``int32``, ``int64``,
  ``double``, ``bytes``): the twin's key column (``ordered`` and ``json`` keys, shown as
  JSON text or declared elements, take the row path);
* the whole value of a scalar serde: the twin's ``value`` column (a ``json`` store's
  whole value, JSON text, takes the row path: twins keep no stored text);
* the value columns of a typed store (a declared value schema), read with the declared
  names and types: the twin's typed columns (other ``value_schema`` options and
  user-given schemas decode JSON members PERMISSIVE-ly: the row path).

Built on the driver, pickled into every task; nothing but names and Spark types crosses
the wire.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.types import StructType

from iqkit.errors import IqkitError
from iqkit.store.rows import VALUE, RowSchema, ddl_arrow_type

from .read_rows import SparkRows

__all__ = ["ArrowRows"]


class ArrowRows:
    """How the twin tables of one store become record batches of ``schema`` (see the
    module docstring): one source per schema column, ``("partition", None)``,
    ``("column", twin column)``."""

    def __init__(self, store: str, schema: StructType, sources: list[tuple[str, Any]]) -> None:
        self.store = store
        self.schema = schema
        self.sources = sources

    @classmethod
    def plan(cls, rows: RowSchema, spark: SparkRows, schema: StructType) -> ArrowRows | None:
        """The batch plan of ``schema``'s columns, or ``None`` when a column needs the
        row path (module docstring)."""
        from pyspark.sql.pandas.types import to_arrow_type

        if rows.windowed or spark.key_mode != "value":
            return None
        declared = dict(rows.value_columns())
        named = rows.value_column_names()
        sources: list[tuple[str, Any]] = []
        for (slot, where), field in zip(spark.slots, schema.fields, strict=True):
            if slot == "partition":
                sources.append(("partition", None))
            elif slot == "key":
                sources.append(("column", spark.key_names[where]))
            elif slot == "value":
                if rows.value_serde.arrow_type() is None:
                    # json/ordered values read whole: twins keep no stored text (their
                    # typed columns cannot give it back exactly): the row path.
                    return None
                sources.append(("column", VALUE))
            elif slot == "field" and where in declared and named[where] == field.name:
                # A typed store's member read as declared: the twin holds it so typed.
                try:
                    same = to_arrow_type(field.dataType, timezone="UTC") == ddl_arrow_type(
                        declared[where]
                    )
                except (TypeError, ValueError):
                    same = False
                if not same:
                    return None
                sources.append(("column", field.name))
            else:
                return None
        return cls(rows.store, schema, sources)

    def columns(self) -> list[str]:
        """The twins' columns the batches are made of (a scan reads only these)."""
        return [name for kind, name in self.sources if kind == "column"]

    def batches(self, p: int, tables: Iterator[pa.Table]) -> Iterator[pa.RecordBatch]:
        """Record batches of the schema from the twin tables of store partition ``p``."""
        from pyspark.sql.pandas.types import to_arrow_schema

        target = to_arrow_schema(self.schema, timezone="UTC")
        for table in tables:
            n = table.num_rows
            if not n:
                continue
            arrays = []
            for (kind, name), field in zip(self.sources, target, strict=True):
                if kind == "partition":
                    array = pa.array(np.full(n, p, dtype=np.int32), pa.int32())
                elif name in table.column_names:
                    array = table.column(name).combine_chunks()
                else:  # a member no row of these files has (a typed column: all null)
                    array = pa.nulls(n, field.type)
                if array.type != field.type:
                    try:
                        array = array.cast(field.type)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                        raise IqkitError(
                            f"iqkit: store {self.store!r} partition {p}: column "
                            f"{field.name!r} of its columnar twins ({array.type}) does not "
                            f"fit {field.type}: {exc}"
                        ) from None
                arrays.append(array)
            yield pa.RecordBatch.from_arrays(arrays, schema=target)
