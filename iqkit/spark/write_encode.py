"""The data source's write tasks encode here: ``RowEncoder`` turns the Arrow batches of a
DataFrame into (store partition, RocksDB key, value, sequence) batches with the encoding
every bulk write shares (``store.encoding.arrow_encode``). ``RowEncoder`` also makes
the data source's JSON values as Spark's ``to_json`` writes them, and hands its encoded
rows, with the input's own columns a twin is made of, to a ``store.sorted_rows.SortedRows``,
which sorts them by (store partition, key, input order), keeps the last row of each key,
and spills what it holds to local disk when the task asks (``spill``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..store.encoding.arrow_encode import (
    arrow_has_non_finite,
    encoded_batch,
    explicit_partitions,
    non_finite_message,
    route,
    serialize_column,
    serialize_keys,
)
from ..store.encoding.json_arrow import json_records, json_texts
from ..store.encoding.partitioners import get_partitioner
from ..store.encoding.serdes import get_serde
from ..store.sorted_rows import ArrowRows, SortedRows

if TYPE_CHECKING:  # write_store encodes here too, and needs none of the data source's jobs
    from .write_options import WriteJob

# -- the data source's tasks -------------------------------------------------------------------
class RowEncoder:
    """Arrow batches of the DataFrame → (store partition, RocksDB key, value, sequence),
    buffered (``SortedRows``) until :meth:`partitions` hands them out sorted, the last row
    of each key only; :meth:`spill` writes what is held to local disk (a run, grouped by
    store partition), which :meth:`partitions` sorts and merges back. What the
    task reports besides its fragments is counted here too: ``rows`` read, the highest
    Kafka ``offsets`` per (topic, partition), and the smallest and largest
    ``window_sizes``.

    Keys, partitions and encoded rows come from the functions above, as in
    ``write_store``; what differs is the input: each task encodes the DataFrame's own
    columns as it is given them, making JSON values here (``write_store`` has Spark's
    ``to_json`` make them in the JVM, then shuffles before it encodes)."""

    def __init__(
        self,
        job: WriteJob,
        twin_columns: Sequence[str] | None = None,
        *,
        spill_dir: str | None = None,
    ) -> None:
        assert job.plan is not None
        plan = job.plan
        self.plan = plan
        self.store = job.store
        self.key_serde = get_serde(plan.key_serde)
        self.value_serde = get_serde(plan.value_serde)
        self.partitioner = get_partitioner(job.partitioner)
        self.n = job.partitions
        self.kafka = job.kafka
        #: The encoded rows (made at the first batch: the carried columns' types are
        #: the input's).
        self.sorted: SortedRows | None = None
        self.spill_dir = spill_dir
        #: The input's own columns a fragment's twin is made of, carried with the rows
        #: (``twin_source_columns``; ``None``: twins are shaped from the stored rows).
        self.twin_names = twin_columns
        #: Rows held in memory (not spilled yet).
        self.buffered = 0
        self.seq = 0  # input order within the task
        self.rows = 0
        #: Highest input offset per (topic, partition), for Kafka-shaped input.
        self.offsets: dict[str, dict[int, int]] = {}
        #: Smallest and largest window size (ms) seen, for window stores.
        self.window_sizes: tuple[int, int] | None = None

    # -- one batch -----------------------------------------------------------------------
    def add(self, batch: pa.RecordBatch) -> None:
        plan, n = self.plan, batch.num_rows
        self.rows += n
        keys = [batch.column(name) for name in plan.key_columns]
        key_bytes = serialize_keys(self.key_serde, keys, plan.key_columns, self.store)
        if plan.partition_column is not None:
            parts = self._explicit_partitions(batch)
        else:
            parts = route(self.partitioner, key_bytes, self.n)
        values = self._values(batch)
        if self.kafka:
            seq = pc.fill_null(batch.column("offset").cast(pa.int64()), -1)
            _max_offsets(batch, self.offsets)
        else:
            seq = pa.array(np.arange(self.seq, self.seq + n, dtype=np.int64))
            self.seq += n
        starts = None
        if plan.window_column is not None:
            window = batch.column(plan.window_column)
            if window.null_count:
                raise ValueError(
                    f"store {self.store!r}: window column {plan.window_column!r} holds nulls"
                )
            starts, sizes = _window_starts(window)
            self.window_sizes = _widen(self.window_sizes, sizes)
        encoded = encoded_batch(parts, key_bytes, values, seq, starts)
        names = self.twin_names
        if self.sorted is None and names is not None and not set(names) <= set(batch.schema.names):
            self.twin_names = None  # the first batch lacks the store's columns: twins shaped
        own = None if self.twin_names is None else batch.select(list(self.twin_names))
        if self.sorted is None:
            carried = None if own is None else own.schema
            self.sorted = SortedRows(spill_dir=self.spill_dir, columns=carried)
        p, k, v, s = encoded.columns
        self.sorted.add(k, v, s, partitions=p, columns=own)
        self.buffered += encoded.num_rows

    def _explicit_partitions(self, batch: pa.RecordBatch) -> pa.Array:
        name = self.plan.partition_column
        label = f"mark_as_partitioned column {name!r}"
        return explicit_partitions(batch.column(name), label, self.n, self.store)

    def _values(self, batch: pa.RecordBatch) -> pa.Array:
        plan = self.plan
        for name in plan.float_json_columns:  # JSON has no NaN: refused, as write_store does
            if arrow_has_non_finite(batch.column(name)):
                raise ValueError(non_finite_message(self.store, name))
        if plan.value_column is None:
            return json_records(batch, plan.record_columns).cast(pa.binary())
        col = batch.column(plan.value_column)
        if plan.value_serde == "json":
            return json_texts(col).cast(pa.binary())  # a null value stays null: a delete
        return serialize_column(self.value_serde, col, self.store, "value", plan.value_column)

    # -- sorting ------------------------------------------------------------------------------
    def spill(self) -> None:
        """Write the rows held in memory to local disk (a run, grouped by store partition,
        sorted when it is read back: ``SortedRows``)."""
        if self.sorted is not None:
            self.sorted.spill()
        self.buffered = 0

    def partitions(self) -> Iterator[tuple[int, ArrowRows]]:
        """Per store partition (ascending): its rows, keys ascending, the last row of
        each key (``SortedRows.partitions``: a partition's runs sorted in pieces of at
        most what one spill held, merged block by block), each
        chunk with the input's twin columns of its rows where they are kept."""
        if self.sorted is not None:
            yield from self.sorted.partitions()
        self.buffered = 0

    def close(self) -> None:
        """Drop what is held and the run files."""
        if self.sorted is not None:
            self.sorted.close()


def _max_offsets(batch: pa.RecordBatch, into: dict[str, dict[int, int]]) -> None:
    """Highest ``offset`` per (``topic``, ``partition``) of Kafka-shaped rows (rows with a
    null topic, partition or offset are skipped, as in write_store)."""
    table = pa.table(
        {
            "t": batch.column("topic").cast(pa.string()),
            "p": batch.column("partition").cast(pa.int64()),
            "o": batch.column("offset").cast(pa.int64()),
        }
    )
    grouped = table.group_by(["t", "p"]).aggregate([("o", "max")])
    for t, p, o in zip(*(grouped.column(c).to_pylist() for c in ("t", "p", "o_max")), strict=True):
        if t is None or p is None or o is None:
            continue
        parts = into.setdefault(t, {})
        parts[p] = max(o, parts.get(p, o))


def _window_starts(col: pa.Array) -> tuple[list[int], tuple[int, int] | None]:
    """Window starts (epoch ms, floored like Spark's ``unix_millis``) and the smallest and
    largest window size of a Spark window struct column (nulls were refused already)."""
    start = pc.struct_field(col, "start").cast(pa.int64())  # microseconds
    end = pc.struct_field(col, "end").cast(pa.int64())
    starts = [us // 1000 for us in start.to_pylist()]
    ends = [us // 1000 for us in end.to_pylist()]
    if not starts:
        return [], None
    sizes = [e - s for s, e in zip(starts, ends, strict=True)]
    return starts, (min(sizes), max(sizes))


def _widen(current: tuple[int, int] | None, new: tuple[int, int] | None) -> tuple[int, int] | None:
    if new is None:
        return current
    if current is None:
        return new
    return min(current[0], new[0]), max(current[1], new[1])
