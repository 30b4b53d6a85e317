"""How ``StoreWriter.put_table`` turns a table into stored rows: ``arrow_table`` takes
its input (a pyarrow ``Table`` or ``RecordBatch``, a pandas ``DataFrame``); ``TablePlan``
checks the table's columns against the store's settings once, before any row is written,
then encodes it a batch at a time (``encoding.arrow_encode``, ``encoding.json_arrow``),
each batch's rows grouped by partition as ``SortedRows`` holds them.

Its own module, apart from the writer's buffer: it knows a store's settings
(``StoreManifest``), not a writer's state."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from .encoding import keyspace
from .encoding.partitioners import get_partitioner
from .encoding.serdes import get_serde
from .manifest import StoreManifest

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["TablePlan", "arrow_table"]


def arrow_table(data: Any, store: str) -> pa.Table:
    """``put_table``'s input as an Arrow table: a pandas DataFrame is converted (its
    index left out), a record batch wrapped."""
    import pyarrow as pa

    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if type(data).__module__.startswith("pandas") and type(data).__name__ == "DataFrame":
        return pa.Table.from_pandas(data, preserve_index=False)
    raise TypeError(
        f"store {store!r}: put_table takes a pyarrow Table or RecordBatch or a pandas "
        f"DataFrame, got {type(data).__name__}"
    )


class TablePlan:
    """How ``put_table`` encodes the batches of one table (checked before any row is):
    the columns of the key, the value (or the JSON record) and the partition."""

    def __init__(
        self,
        manifest: StoreManifest,
        keys: tuple[str, ...],
        value: str | None,
        record: tuple[str, ...],
        partition: str | None,
    ) -> None:
        self.manifest = manifest
        self.key_serde = get_serde(manifest.key_serde)
        self.value_serde = get_serde(manifest.value_serde)
        self.partitioner = get_partitioner(manifest.partitioner)
        self.keys = keys
        self.value = value
        self.record = record
        self.partition = partition
        #: The columns a twin of the rows is made of (``twins.twin_of_columns``: the
        #: key, then the record's), or None: twins are shaped from the stored rows.
        self.twin_names: tuple[str, ...] | None = None
        if record and len(keys) == 1 and manifest.kind.has_twins:
            self.twin_names = (keys[0], *record)

    @classmethod
    def of(
        cls,
        manifest: StoreManifest,
        table: pa.Table,
        keys: tuple[str, ...],
        value: str | None,
        partition: str | None,
    ) -> TablePlan:
        """The plan for ``table``, its columns checked against the store's settings."""
        store = manifest.name
        names = table.column_names
        asked = [*keys, value, partition]
        for column in [c for c in asked if c is not None]:
            if column not in names:
                hint = difflib.get_close_matches(column, names, n=1)
                tail = f"; did you mean {hint[0]!r}?" if hint else f" (it has {names})"
                raise ValueError(f"store {store!r}: the table has no column {column!r}{tail}")
        if not keys:
            raise ValueError(f"store {store!r}: key must name at least one column")
        if len(keys) > 1 and manifest.key_serde != "ordered":
            raise ValueError(
                f"store {store!r}: a composite key {list(keys)} needs the 'ordered' key "
                f"serde; this store's is {manifest.key_serde!r}"
            )
        routed = get_partitioner(manifest.partitioner).routes_keys
        if routed and partition is not None:
            raise ValueError(
                f"store {store!r} routes keys by {manifest.partitioner}: partition= names "
                "an explicit store's partition column"
            )
        if not routed and partition is None:
            raise ValueError(
                f"store {store!r} uses the explicit partitioner: pass partition=<column>"
            )
        record: tuple[str, ...] = ()
        if value is None:
            if manifest.value_serde != "json":
                raise ValueError(
                    f"store {store!r} has value serde {manifest.value_serde!r}: name the "
                    "value column (value=); every other column as a record needs 'json'"
                )
            record = tuple(n for n in names if n not in keys and n != partition)
        return cls(manifest, keys, value, record, partition)

    def encode(self, batch: pa.RecordBatch) -> tuple[pa.Array, pa.Array, pa.Array, Any]:
        """A batch's partitions, RocksDB keys and value bytes (null: a delete), its rows
        grouped by partition (as ``SortedRows`` holds them: reordering the table's
        columns before they are encoded copies fewer bytes than reordering the encoded
        rows), and their places in ``batch`` (a numpy array; None: in its order)."""
        import pyarrow as pa

        from .encoding import arrow_encode, json_arrow
        from .sorted_rows import partition_order

        store = self.manifest.name
        n = self.manifest.partitions
        key_columns = [batch.column(k) for k in self.keys]
        key_bytes = arrow_encode.serialize_keys(self.key_serde, key_columns, self.keys, store)
        if self.partition is None:
            parts = arrow_encode.route(self.partitioner, key_bytes, n)
        else:
            column = batch.column(self.partition)
            label = f"partition column {self.partition!r}"
            parts = arrow_encode.explicit_partitions(column, label, n, store)
        order = partition_order(parts.to_numpy())
        if order is not None:
            taken = pa.array(order)
            parts, key_bytes = parts.take(taken), key_bytes.take(taken)
            batch = batch.select(list(self.record) if self.value is None else [self.value])
            batch = batch.take(taken)
        if self.value is None:
            for name in self.record:
                if arrow_encode.arrow_has_non_finite(batch.column(name)):
                    raise ValueError(arrow_encode.non_finite_message(store, name))
            values = json_arrow.json_records(batch, self.record).cast(pa.binary())
        else:
            column = batch.column(self.value)
            if self.manifest.value_serde == "json":
                if arrow_encode.arrow_has_non_finite(column):
                    raise ValueError(arrow_encode.non_finite_message(store, self.value))
                values = json_arrow.json_texts(column).cast(pa.binary())
            else:
                serde = self.value_serde
                values = arrow_encode.serialize_column(serde, column, store, "value", self.value)
        return parts, keyspace.kv_keys_arrow(key_bytes), values, order
