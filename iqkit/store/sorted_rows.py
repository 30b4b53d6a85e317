"""An external sort of a task's rows: ``SortedRows`` turns rows for any partitions, in any
order and with duplicate keys, into what ``ChainJobSpec.stage(..., sorted_unique=True)``
(``store.chain.jobs``) needs per partition: strictly increasing keys, the row with the highest
sequence number per key (``ArrowRows``). It sorts Arrow columns (no per-row Python work
but the final hand-over to the SST writer) and spills sorted runs to local disk past a
memory budget, merging them at the end, so a big partition never has to fit in memory.

Its own module, not part of the job commit: it knows nothing of stores, versions or
commits (it sorts bytes), and the Spark writers use it before a job commits anything.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa


#: Rows per Arrow slice handed to the SST writer, and per block when runs are merged.
_CHUNK_ROWS = 65_536


class ArrowRows:
    """Sorted, key-unique ``(key, value)`` rows held as Arrow chunks: iterating yields
    Python pairs (any ``stage_partition`` caller's format); ``puts()`` the non-deletes,
    filtered column-wise and handed over through C-level iterators (``chain``/``zip``),
    so no Python frame runs per row on the way to the SST writer."""

    def __init__(self, chunks: Iterable[tuple[pa.Array, ...]]) -> None:
        #: ``(keys, values)`` or, from ``SortedRows``, ``(keys, values, seqs)``.
        self._chunks = chunks
        #: Puts and deletes handed out by ``chunks()`` so far (a job's counts, without
        #: another pass).
        self.puts_seen = 0
        self.deletes_seen = 0
        #: The writer's own columns of rows by their sequence numbers, where it kept
        #: them (``StoreWriter.put_table``: a twin is then made of them, not of the
        #: stored bytes); None, or a call returning None: there are none.
        self.twin_columns: Callable[[pa.Array], pa.Table | None] | None = None

    def chunks(self) -> Iterator[tuple[pa.Array, pa.Array]]:
        """``(keys, values)`` Arrow arrays of at most ``_CHUNK_ROWS`` rows each: keys
        sorted, values aligned, ``null`` a delete. One pass (a merge of spilled runs
        cannot be read twice)."""
        for keys, values, _ in self.sequenced_chunks():
            yield keys, values

    def sequenced_chunks(self) -> Iterator[tuple[pa.Array, pa.Array, pa.Array | None]]:
        """``chunks`` with each row's sequence number (None where not known)."""
        for chunk in self._chunks:
            keys, values = chunk[0], chunk[1]
            seqs = chunk[2] if len(chunk) > 2 else None
            for lo in range(0, len(keys), _CHUNK_ROWS):
                k, v = keys.slice(lo, _CHUNK_ROWS), values.slice(lo, _CHUNK_ROWS)
                self.deletes_seen += v.null_count
                self.puts_seen += len(v) - v.null_count
                yield k, v, None if seqs is None else seqs.slice(lo, _CHUNK_ROWS)

    def __iter__(self) -> Iterator[tuple[bytes, bytes | None]]:
        return chain.from_iterable(
            zip(k.to_pylist(), v.to_pylist(), strict=True) for k, v in self.chunks()
        )

    def puts(self) -> Iterator[tuple[bytes, bytes]]:
        """The rows whose value is not ``None`` (deletes dropped)."""
        import pyarrow.compute as pc

        def kept() -> Iterator[tuple[pa.Array, pa.Array]]:
            for k, v in self.chunks():
                if v.null_count:
                    valid = pc.is_valid(v)
                    k, v = k.filter(valid), v.filter(valid)
                yield k, v

        return chain.from_iterable(
            zip(k.to_pylist(), v.to_pylist(), strict=True) for k, v in kept()
        )


class SortedRows:
    """Rows of one or more partitions — (partition, RocksDB key, value or ``None`` =
    delete, sequence) Arrow columns added in any order — read back per partition, sorted
    by key, one row per key: the one with the highest sequence (the later row wins, as
    Kafka applies records).

    Why in Arrow rather than in Spark: sorting binary keys that share a long prefix
    (``\\x01customer-…``) defeats Spark's 8-byte prefix sort and costs several times
    what ``pyarrow``'s sort does; and one sort by (partition, key) of everything a task
    holds is cheaper than splitting each incoming batch by partition. Memory stays
    bounded: ``spill()`` (called by the owner, or automatically once ``spill_bytes`` are
    held) sorts what is held into a run file (Arrow IPC) under ``spill_dir``, and
    ``partitions()`` merges a partition's runs block by block.
    """

    def __init__(self, *, spill_bytes: int | None = None, spill_dir: str | None = None) -> None:
        self._batches: list[pa.RecordBatch] = []
        self._nbytes = 0
        #: Spilled runs: (file, {partition: (first row, end row)}, first row of each batch).
        self._runs: list[tuple[str, dict[int, tuple[int, int]], list[int]]] = []
        self._tmp: str | None = None
        self._spill_bytes = spill_bytes
        self._spill_dir = spill_dir
        self.rows_added = 0

    @property
    def nbytes(self) -> int:
        """Arrow bytes held in memory (spilled runs not counted)."""
        return self._nbytes

    @property
    def runs(self) -> int:
        """How many sorted runs were spilled to disk."""
        return len(self._runs)

    def add(
        self,
        keys: pa.Array,
        values: pa.Array,
        seqs: pa.Array,
        partitions: pa.Array | int = 0,
    ) -> None:
        """Add rows: ``binary`` keys (no nulls), ``binary`` values (null = delete),
        ``int64`` sequence numbers, and their partitions (an ``int32`` array, or one
        partition for all), all of one length."""
        import pyarrow as pa

        if keys.null_count:
            raise ValueError("SortedRows: keys must not be null")
        n = len(keys)
        if not n:
            return
        if isinstance(partitions, int):
            parts = pa.array(_np_full(n, partitions))
        else:
            parts = partitions.cast(pa.int32())
        batch = pa.RecordBatch.from_arrays(
            [parts, keys.cast(pa.binary()), values.cast(pa.binary()), seqs.cast(pa.int64())],
            schema=_rows_schema(),
        )
        self._batches.append(batch)
        self._nbytes += batch.nbytes
        self.rows_added += n
        if self._spill_bytes is not None and self._nbytes >= self._spill_bytes:
            self.spill()

    def spill(self) -> None:
        """Sort what is held in memory into a run file; memory is released."""
        import pyarrow as pa

        if not self._batches:
            return
        table, index = self._take_sorted()
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="iqkit-runs-", dir=self._spill_dir)
        path = os.path.join(self._tmp, f"run-{len(self._runs):05d}.arrow")
        starts = []
        row = 0
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
            for batch in table.to_batches(max_chunksize=_CHUNK_ROWS):
                starts.append(row)
                row += batch.num_rows
                out.write_batch(batch)
        self._runs.append((path, index, starts))

    def partitions(self) -> Iterator[tuple[int, ArrowRows]]:
        """``(partition, rows)`` by increasing partition; ``rows`` in strictly increasing
        key order, the last row per key. Consume each partition's rows before the next
        one; everything added is consumed, and run files are removed at the end (or when
        the generator is closed)."""
        with self.by_partition() as parts:
            yield from sorted(parts.items())

    @contextlib.contextmanager
    def by_partition(self) -> Iterator[dict[int, ArrowRows]]:
        """Every partition's rows (``partitions``' ``ArrowRows``, each read once, in any
        order), valid inside the ``with`` block: spilled runs stay mapped until it ends,
        then everything added is dropped and the run files removed. A partition's rows
        are merged from its runs while they are read, so only one block per run is in
        memory at a time."""
        import pyarrow as pa

        # Runs are read a batch at a time from their files, not memory-mapped whole: the
        # pages of a mapping stay resident (and in the process's RSS) until it closes.
        files: list[pa.NativeFile] = []
        try:
            sources: list[tuple[Any, dict[int, tuple[int, int]], list[int] | None]] = []
            for path, index, starts in self._runs:
                files.append(pa.OSFile(path))
                sources.append((pa.ipc.open_file(files[-1]), index, starts))
            if self._batches:
                table, index = self._take_sorted()
                sources.append((table, index, None))
            parts: dict[int, ArrowRows] = {}
            for p in sorted({p for _, index, _ in sources for p in index}):
                pieces = [
                    _piece(source, lo, hi, starts)
                    for source, index, starts in sources
                    if p in index
                    for lo, hi in [index[p]]
                ]
                parts[p] = _rows_of(pieces)
            yield parts
        finally:
            for f in files:
                f.close()
            self.close()

    def rows(self) -> Iterator[tuple[bytes, bytes | None]]:
        """Every partition's rows, by (partition, key): for a buffer of one partition."""
        for _, rows in self.partitions():
            yield from rows

    def close(self) -> None:
        """Drop held rows and remove the run files."""
        self._batches = []
        self._nbytes = 0
        self._runs = []
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _take_sorted(self) -> tuple[pa.Table, dict[int, tuple[int, int]]]:
        import numpy as np
        import pyarrow as pa

        table = last_per_key(pa.Table.from_batches(self._batches, schema=_rows_schema()))
        self._batches = []
        self._nbytes = 0
        parts = table.column("partition").to_numpy()
        cuts = (np.flatnonzero(np.diff(parts)) + 1).tolist()
        bounds = zip([0, *cuts], [*cuts, len(parts)], strict=True)
        return table, {int(parts[lo]): (lo, hi) for lo, hi in bounds if hi > lo}


def _piece(source: Any, lo: int, hi: int, starts: list[int] | None) -> Iterator[pa.RecordBatch]:
    """Rows ``lo`` to ``hi`` of a run: a table held in memory (``starts`` None), or a run
    file's reader (its batches begin at rows ``starts``), read a batch at a time."""
    if starts is None:
        yield from source.slice(lo, hi - lo).to_batches(max_chunksize=_CHUNK_ROWS)
        return
    import bisect

    for i in range(bisect.bisect_right(starts, lo) - 1, len(starts)):
        if starts[i] >= hi:
            return
        batch = source.get_batch(i)
        a = max(lo - starts[i], 0)
        b = min(hi - starts[i], batch.num_rows)
        if b > a:
            yield batch.slice(a, b - a)


def _rows_of(pieces: list[Iterator[pa.RecordBatch]]) -> ArrowRows:
    """One partition's rows from its sorted, key-unique pieces (one per run): the piece
    itself, or a merge of them (``_merge_runs``) made while the rows are read."""

    def columns(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[pa.Array, ...]]:
        for b in batches:
            yield b.column("key"), b.column("value"), b.column("seq")

    return ArrowRows(columns(pieces[0] if len(pieces) == 1 else _merge_runs(pieces)))


def _np_full(n: int, value: int) -> Any:
    import numpy as np

    return np.full(n, value, dtype=np.int32)


def _rows_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("partition", pa.int32()),
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("seq", pa.int64()),
        ]
    )


def last_per_key(table: pa.Table) -> pa.Table:
    """``table`` (``partition``, ``key``, ``value``, ``seq`` columns) sorted by
    (partition, key), keeping the row with the highest ``seq`` of each (partition, key)
    (of equal ones, the one sorted last)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = table.combine_chunks()  # one copy now makes every take below cheaper
    n = table.num_rows
    if n < 2:
        return table
    parts = table.column("partition")
    lo_hi = pc.min_max(parts)
    one_partition = lo_hi["min"] == lo_hi["max"]
    # The sequence only matters when a key repeats: sort without it first.
    sorted_table = table.take(_sort_order(table, one_partition, with_seq=False))
    same = _same_as_next(sorted_table, one_partition)
    if not pc.any(same).as_py():
        return sorted_table
    sorted_table = table.take(_sort_order(table, one_partition, with_seq=True))
    same = _same_as_next(sorted_table, one_partition)
    last = pa.concat_arrays([pc.invert(same), pa.array([True])])  # row i is its key's last
    return sorted_table.filter(last)


def _sort_order(table: pa.Table, one_partition: bool, *, with_seq: bool) -> Any:
    """Row order by (partition, key[, seq]). Arrow sorts by key (and seq); the partition
    comes from a stable numpy sort of the small ints on top, which is cheaper than
    Arrow's multi-column comparison sort with the partition first."""
    import numpy as np
    import pyarrow.compute as pc

    keys = [("key", "ascending"), ("seq", "ascending")] if with_seq else [("key", "ascending")]
    order = pc.sort_indices(table, keys).to_numpy()
    if one_partition:
        return order
    parts = table.column("partition").to_numpy()[order]
    return order[np.argsort(parts, kind="stable")]


def _same_as_next(table: pa.Table, one_partition: bool) -> pa.Array:
    """Row i (of n - 1) has the same (partition, key) as row i + 1."""
    import pyarrow.compute as pc

    n = table.num_rows
    keys = table.column("key").combine_chunks()
    same = pc.equal(keys.slice(0, n - 1), keys.slice(1))
    if not one_partition:
        parts = table.column("partition").combine_chunks()
        same = pc.and_(same, pc.equal(parts.slice(0, n - 1), parts.slice(1)))
    return same


def _merge_runs(runs: list[Iterator[pa.RecordBatch]]) -> Iterator[pa.RecordBatch]:
    """Merge runs of one partition, each sorted and key-unique, into sorted, key-unique
    blocks, one block at a time.

    Each round takes, from every run, its rows up to the smallest "last key of the
    current batch" among the runs: every row of any key up to that bound is then in the
    round (runs are sorted), so sorting the round's rows and keeping the last per key is
    exact, and memory holds one batch per run.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    heads: list[tuple[pa.RecordBatch, Iterator[pa.RecordBatch]]] = []
    for run in runs:
        first = next(run, None)
        while first is not None and not first.num_rows:
            first = next(run, None)
        if first is not None:
            heads.append((first, run))
    while heads:
        keys = [head.column("key") for head, _ in heads]
        bound = pa.scalar(min(k[-1].as_py() for k in keys), pa.binary())
        taken: list[pa.RecordBatch] = []
        rest: list[tuple[pa.RecordBatch, Iterator[pa.RecordBatch]]] = []
        for (head, run), k in zip(heads, keys, strict=True):
            count = pc.sum(pc.less_equal(k, bound)).as_py() or 0
            taken.append(head.slice(0, count))
            remaining: pa.RecordBatch | None = head.slice(count)
            while remaining is not None and not remaining.num_rows:
                remaining = next(run, None)
            if remaining is not None:
                rest.append((remaining, run))
        heads = rest
        block = last_per_key(pa.Table.from_batches(taken, schema=_rows_schema()))
        yield from block.to_batches()
