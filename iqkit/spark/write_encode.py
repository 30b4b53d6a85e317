"""The data source's write tasks encode here: ``RowEncoder`` turns the Arrow batches of a
DataFrame into (store partition, RocksDB key, value, sequence) batches with the encoding
every bulk write shares (``store.encoding.arrow_encode``). ``RowEncoder`` also makes
the data source's JSON values as Spark's ``to_json`` writes them, buffers its encoded
batches, then sorts them by (store partition, key, input order) in Arrow, keeping the last
row of each key."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..store.encoding.arrow_encode import (
    ENCODED,
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

if TYPE_CHECKING:  # write_store encodes here too, and needs none of the data source's jobs
    from .write_options import WriteJob

# -- the data source's tasks -------------------------------------------------------------------
class RowEncoder:
    """Arrow batches of the DataFrame → (store partition, RocksDB key, value, sequence),
    buffered until :meth:`drain` sorts them and keeps the last row of each key. What the
    task reports besides its fragments is counted here too: ``rows`` read, the highest
    Kafka ``offsets`` per (topic, partition), and the smallest and largest
    ``window_sizes``.

    Keys, partitions and encoded rows come from the functions above, as in
    ``write_store``; what differs is the input: each task encodes the DataFrame's own
    columns as it is given them, making JSON values here (``write_store`` has Spark's
    ``to_json`` make them in the JVM, then shuffles before it encodes)."""

    def __init__(self, job: WriteJob, twin_columns: Sequence[str] | None = None) -> None:
        assert job.plan is not None
        plan = job.plan
        self.plan = plan
        self.store = job.store
        self.key_serde = get_serde(plan.key_serde)
        self.value_serde = get_serde(plan.value_serde)
        self.partitioner = get_partitioner(job.partitioner)
        self.n = job.partitions
        self.kafka = job.kafka
        self.buffer: list[pa.RecordBatch] = []
        #: The input's own columns a fragment's twin is made of, aligned with ``buffer``
        #: (``twin_source_columns``; ``None``: twins are shaped from the stored rows).
        self.twin_names = twin_columns
        self.twin_buffer: list[pa.RecordBatch] = []
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
        self.buffer.append(encoded)
        if self.twin_names is not None and not set(self.twin_names) <= set(batch.schema.names):
            self.twin_names, self.twin_buffer = None, []  # not the store's columns: shaped
        if self.twin_names is not None:
            self.twin_buffer.append(batch.select(list(self.twin_names)))
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
    def drain(self) -> Iterator[tuple[int, pa.Array, pa.Array, pa.Table | None]]:
        """Per store partition (ascending): ``binary`` keys ascending, the last row of
        each key, their values (null: a delete), as Arrow arrays, and the input's own
        twin columns of those rows (``None`` unless the encoder keeps them)."""
        if not self.buffer:
            return
        table = pa.Table.from_batches(self.buffer, schema=ENCODED)
        columns = pa.Table.from_batches(self.twin_buffer) if self.twin_buffer else None
        self.buffer, self.twin_buffer, self.buffered = [], [], 0
        order = self._order(table)
        table = table.take(order).combine_chunks()
        p, k = table.column("__p").chunk(0), table.column("__k").chunk(0)
        keep = None
        if len(table) > 1:
            same_as_next = pc.and_(pc.equal(k[:-1], k[1:]), pc.equal(p[:-1], p[1:]))
            keep = pa.concat_arrays([pc.invert(same_as_next), pa.array([True])])
            if keep.false_count:
                table = table.filter(keep)
            else:
                keep = None
        if columns is not None:
            columns = columns.take(order)
            columns = (columns if keep is None else columns.filter(keep)).combine_chunks()
        parts = table.column("__p").to_numpy()
        keys, values = table.column("__k"), table.column("__v")
        start = 0
        while start < len(parts):
            partition = int(parts[start])
            end = int(parts.searchsorted(partition, side="right"))
            n = end - start
            twin = None if columns is None else columns.slice(start, n)
            yield partition, keys.slice(start, n), values.slice(start, n), twin
            start = end

    def _order(self, table: pa.Table) -> np.ndarray:
        """The row order by (store partition, key, input order): a stable sort by
        partition (integers, numpy), then each partition's keys sorted by Arrow — several
        times faster than one Arrow sort by (partition, key), whose comparisons of a
        binary column after an integer one do not vectorize. Both sorts are stable, so
        rows of one key stay in input order; Kafka input is ordered by ``offset`` among
        them."""
        parts = table.column("__p").to_numpy()
        by_partition = np.argsort(parts, kind="stable")
        grouped = parts[by_partition]
        cuts = [0, *(np.flatnonzero(np.diff(grouped)) + 1).tolist(), len(grouped)]
        take = pa.array(by_partition)
        keys = table.column("__k").take(take)
        seqs = table.column("__seq").take(take) if self.kafka else None
        pieces = []
        for a, b in pairwise(cuts):
            if seqs is None:
                within = pc.sort_indices(keys.slice(a, b - a))
            else:
                run = pa.table({"k": keys.slice(a, b - a), "s": seqs.slice(a, b - a)})
                within = pc.sort_indices(run, sort_keys=[("k", "ascending"), ("s", "ascending")])
            pieces.append(by_partition[a:b][within.to_numpy()])
        return np.concatenate(pieces) if pieces else by_partition


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
