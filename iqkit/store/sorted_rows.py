"""An external sort of a task's rows: ``SortedRows`` turns rows for any partitions, in any
order and with duplicate keys, into what ``ChainJobSpec.stage(..., sorted_unique=True)``
(``store.chain.jobs``) needs per partition: strictly increasing keys, the row with the highest
sequence number per key (``ArrowRows``). It sorts Arrow columns (no per-row Python work
but the final hand-over to the SST writer) and spills runs to local disk past a memory
budget, sorting each partition when it is read, in pieces merged when it does not fit:
a big partition never has to fit in memory.

Its own module, not part of the job commit: it knows nothing of stores, versions or
commits (it sorts bytes), and the Spark writers use it before a job commits anything.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
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

    def __init__(self, chunks: Iterable[tuple[Any, ...]]) -> None:
        #: ``(keys, values)`` or, from ``SortedRows``, ``(keys, values, seqs)`` and, where
        #: its rows carry the writer's own columns, those too (a ``Table``).
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
        for chunk in self.sequenced_chunks():
            yield chunk[0], chunk[1]

    def sequenced_chunks(self) -> Iterator[tuple[Any, ...]]:
        """``chunks`` with each row's sequence number (None where not known), and the
        writer's own columns of those rows where ``SortedRows`` carried them (a
        ``Table``, as a fourth element; ``twins.TwinWriter`` takes it)."""
        for chunk in self._chunks:
            keys, values = chunk[0], chunk[1]
            seqs = chunk[2] if len(chunk) > 2 else None
            columns = chunk[3] if len(chunk) > 3 else None
            for lo in range(0, len(keys), _CHUNK_ROWS):
                k, v = keys.slice(lo, _CHUNK_ROWS), values.slice(lo, _CHUNK_ROWS)
                self.deletes_seen += v.null_count
                self.puts_seen += len(v) - v.null_count
                s = None if seqs is None else seqs.slice(lo, _CHUNK_ROWS)
                if columns is None:
                    yield k, v, s
                else:
                    yield k, v, s, columns.slice(lo, _CHUNK_ROWS)

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
    what ``pyarrow``'s sort does. Memory stays bounded: ``spill()`` (called by the owner,
    or automatically once ``spill_bytes`` are held) writes what is held to a run file
    (Arrow IPC) under ``spill_dir``, grouped by partition but not sorted; each group
    notes whether its keys already ascend.

    Why the sort waits for the read (``by_partition``): a partition's rows are sorted
    once there, in memory when they fit ``spill_bytes``, else in pieces that fit, merged
    block by block. Sorted runs spilled while rows were added would be sorted again by
    that merge (it sorts each block), and the adds (``StoreWriter.put_table``) would pay
    for a sort of every row on the way. Keys that arrive ascending (ids, a table written
    in key order) are not sorted at all: their groups are runs as they are. An owner
    that spills by itself, without ``spill_bytes`` (a Spark task, every ``run_rows``
    rows), has the pieces sorted at the read fit what it let the buffer hold: the most
    bytes one ``spill()`` wrote.

    ``columns``: the schema of other columns every row carries along (a Spark task's own
    typed columns, which its twin is made of): grouped, spilled, sorted, de-duplicated and
    merged with the rows, and handed out with them (``ArrowRows.sequenced_chunks``).
    """

    def __init__(
        self,
        *,
        spill_bytes: int | None = None,
        spill_dir: str | None = None,
        columns: pa.Schema | None = None,
    ) -> None:
        #: The carried columns; the batches hold them under names of their own
        #: (``_rows_schema``).
        self._columns = columns
        self._schema = _rows_schema(columns)
        self._batches: list[pa.RecordBatch] = []
        self._nbytes = 0
        #: Spilled runs: (file, {partition: its group of the file}).
        self._runs: list[tuple[str, dict[int, _Group]]] = []
        self._tmp: str | None = None
        self._spill_bytes = spill_bytes
        self._spill_dir = spill_dir
        self._sorted_runs = 0  # run files of sorted rows written while reading
        self._spilled_most = 0  # the most bytes one spill() wrote
        self.rows_added = 0

    @property
    def nbytes(self) -> int:
        """Arrow bytes held in memory (spilled runs not counted)."""
        return self._nbytes

    @property
    def runs(self) -> int:
        """How many runs were spilled to disk."""
        return len(self._runs)

    def add(
        self,
        keys: pa.Array,
        values: pa.Array,
        seqs: pa.Array,
        partitions: pa.Array | int = 0,
        columns: pa.RecordBatch | None = None,
    ) -> None:
        """Add rows: ``binary`` keys (no nulls), ``binary`` values (null = delete),
        ``int64`` sequence numbers, and their partitions (an ``int32`` array, or one
        partition for all), all of one length; ``columns``: theirs of the carried
        columns (required when the buffer was made with ``columns``)."""
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
        arrays = [parts, keys.cast(pa.binary()), values.cast(pa.binary()), seqs.cast(pa.int64())]
        if self._columns is not None:
            if columns is None or columns.schema.names != self._columns.names:
                raise ValueError("SortedRows: rows must carry the buffer's columns")
            arrays += columns.columns
        batch = pa.RecordBatch.from_arrays(arrays, schema=self._schema)
        # Grouped by partition now, while the rows are in the CPU's caches: a spill
        # reading them back from memory to group them took several times as long.
        self._batches.append(batch if isinstance(partitions, int) else _partition_order(batch))
        self._nbytes += batch.nbytes
        self.rows_added += n
        if self._spill_bytes is not None and self._nbytes >= self._spill_bytes:
            self.spill()

    def spill(self) -> None:
        """Write what is held in memory to a run file, grouped by partition; memory is
        released."""
        import pyarrow as pa

        if not self._batches:
            return
        groups = _grouped(self._batches)
        self._spilled_most = max(self._spilled_most, self._nbytes)
        self._batches = []
        self._nbytes = 0
        path = os.path.join(self._tmp_dir(), f"run-{len(self._runs):05d}.arrow")
        index: dict[int, _Group] = {}
        written = 0
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, self._schema) as out:
            for p in sorted(groups):
                group = groups[p]
                for batch in group.batches:
                    out.write_batch(batch)
                first, written = written, written + len(group.batches)
                index[p] = group.moved(range(first, written))
        self._runs.append((path, index))

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
        order), valid inside the ``with`` block: spilled runs stay open until it ends,
        then everything added is dropped and the run files removed. A partition's rows
        are sorted while they are read (the class docstring), so memory holds one
        partition's sort at a time, and one block per run while runs are merged."""
        import pyarrow as pa

        # Runs are read a batch at a time from their files, not memory-mapped whole: the
        # pages of a mapping stay resident (and in the process's RSS) until it closes.
        files: list[pa.NativeFile] = []
        try:
            sources: list[tuple[Any, dict[int, _Group]]] = []
            for path, index in self._runs:
                files.append(pa.OSFile(path))
                sources.append((pa.ipc.open_file(files[-1]), index))
            if self._batches:
                sources.append((None, _grouped(self._batches)))
                self._batches = []
                self._nbytes = 0
            parts: dict[int, ArrowRows] = {}
            for p in sorted({p for _, index in sources for p in index}):
                pieces = [_piece(reader, index[p]) for reader, index in sources if p in index]
                parts[p] = _rows_of(self._sorted_batches(pieces, files), self._columns)
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

    def _tmp_dir(self) -> str:
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="iqkit-runs-", dir=self._spill_dir)
        return self._tmp

    def _sorted_batches(
        self, pieces: list[_Piece], files: list[pa.NativeFile]
    ) -> Iterator[pa.RecordBatch]:
        """One partition's rows, sorted and key-unique, from its pieces (its group of
        each run and of the rows held). Pieces whose keys ascend are runs as they are,
        read one after the other when their key ranges do not overlap; the others are
        sorted together, in memory up to ``spill_bytes`` (or, without it, the most one
        ``spill()`` wrote), else in groups of that size, each but the last written to a
        run file of its own (opened into ``files``); the runs are then merged
        (``_merge_runs``)."""
        import pyarrow as pa

        if all(piece.group.ascending for piece in pieces):
            ordered = sorted(pieces, key=lambda piece: piece.group.first)
            if all(a.group.last < b.group.first for a, b in itertools.pairwise(ordered)):
                for piece in ordered:
                    yield from piece.read()
                return
        runs = [piece.read for piece in pieces if piece.group.ascending]
        todo = collections.deque(piece for piece in pieces if not piece.group.ascending)
        budget = self._spill_bytes if self._spill_bytes is not None else self._spilled_most
        budget = budget or None  # never spilled: everything was held in memory anyway
        while todo:
            group = [todo.popleft()]
            size = group[0].group.nbytes
            while todo and (budget is None or size + todo[0].group.nbytes <= budget):
                size += todo[0].group.nbytes
                group.append(todo.popleft())
            batches = [b for piece in group for b in piece.read()]
            table = last_per_key(pa.Table.from_batches(batches, schema=self._schema))
            del batches
            if todo:
                runs.append(self._parked(table, files))
            else:
                runs.append(lambda t=table: iter(t.to_batches(max_chunksize=_CHUNK_ROWS)))
            del table
        if len(runs) == 1:
            yield from runs[0]()
        else:
            yield from _merge_runs([run() for run in runs], self._schema)

    def _parked(
        self, table: pa.Table, files: list[pa.NativeFile]
    ) -> Callable[[], Iterator[pa.RecordBatch]]:
        """``table`` written to a run file, and read back from it a batch at a time."""
        import pyarrow as pa

        self._sorted_runs += 1
        path = os.path.join(self._tmp_dir(), f"sorted-{self._sorted_runs:05d}.arrow")
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
            for batch in table.to_batches(max_chunksize=_CHUNK_ROWS):
                out.write_batch(batch)
        files.append(pa.OSFile(path))
        reader = pa.ipc.open_file(files[-1])
        return lambda: (reader.get_batch(i) for i in range(reader.num_record_batches))


class _Group:
    """One partition's rows in a run (``batches``: its batches' numbers in the file) or
    held in memory (``batches``: the batches), with their Arrow bytes, whether their keys
    strictly ascend, batch after batch (then they are a sorted run already), and their
    first and last keys."""

    __slots__ = ("ascending", "batches", "first", "last", "nbytes")

    def __init__(self, batches: Any, nbytes: int, ascending: bool, first: bytes, last: bytes):
        self.batches = batches
        self.nbytes = nbytes
        self.ascending = ascending
        self.first = first
        self.last = last

    def moved(self, batches: Any) -> _Group:
        """The same rows, found at ``batches``."""
        return _Group(batches, self.nbytes, self.ascending, self.first, self.last)


class _Piece:
    """A partition's group of one run or of the held rows (``_Group``) with a way to
    read its batches (``read()``)."""

    __slots__ = ("group", "read")

    def __init__(self, group: _Group, read: Callable[[], Iterator[pa.RecordBatch]]) -> None:
        self.group = group
        self.read = read


def _piece(reader: Any, group: _Group) -> _Piece:
    """The piece of ``group``: held batches, or batches of a run file's ``reader``."""
    if reader is None:
        held = group.batches
        return _Piece(group, lambda: iter(held))
    numbers = group.batches
    return _Piece(group, lambda: (reader.get_batch(i) for i in numbers))


def _grouped(batches: list[pa.RecordBatch]) -> dict[int, _Group]:
    """``batches``' rows grouped by partition, each batch's rows of a partition a slice
    of it (``add`` put them in partition order): each group's batches in the order
    added, its bytes, whether its keys strictly ascend (within each batch, by one
    comparison kernel per batch, and from batch to batch), and its first and last keys."""
    import numpy as np
    import pyarrow.compute as pc

    slices: dict[int, list[pa.RecordBatch]] = {}
    ascending: dict[int, bool] = {}
    first: dict[int, bytes] = {}
    last: dict[int, bytes] = {}
    for batch in map(_partition_order, batches):
        n = batch.num_rows
        parts = batch.column(0).to_numpy()
        cuts = (np.flatnonzero(np.diff(parts)) + 1).tolist()
        keys = batch.column(1)
        rising = np.asarray(pc.less(keys.slice(0, n - 1), keys.slice(1))) if n > 1 else None
        for lo, hi in zip([0, *cuts], [*cuts, n], strict=True):
            p = int(parts[lo])
            slices.setdefault(p, []).append(batch.slice(lo, hi - lo))
            low, high = keys[lo].as_py(), keys[hi - 1].as_py()
            if p not in first:
                first[p], ascending[p] = low, True
            elif ascending[p] and not last[p] < low:
                ascending[p] = False
            if ascending[p] and rising is not None and not rising[lo : hi - 1].all():
                ascending[p] = False
            last[p] = high
    return {
        p: _Group(group, sum(b.nbytes for b in group), ascending[p], first[p], last[p])
        for p, group in slices.items()
    }


def partition_order(parts: Any) -> Any:
    """The stable order that groups rows by their partitions (an integer numpy array),
    or None when they are grouped already (``SortedRows.add`` keeps rows so)."""
    import numpy as np

    if not (parts[1:] < parts[:-1]).any():
        return None
    if parts.min() >= 0 and parts.max() <= 0xFFFF:
        parts = parts.astype(np.uint16)  # numpy's stable sort is a radix sort for these
    return np.argsort(parts, kind="stable")


def _partition_order(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with its rows in partition order (stable), or itself when they are."""
    import pyarrow as pa

    order = partition_order(batch.column(0).to_numpy())
    return batch if order is None else batch.take(pa.array(order))


def _rows_of(batches: Iterator[pa.RecordBatch], carried: pa.Schema | None) -> ArrowRows:
    """One partition's rows from its sorted, key-unique batches; with the ``carried``
    columns, under their own names, as a fourth element."""
    import pyarrow as pa

    def columns() -> Iterator[tuple[Any, ...]]:
        for b in batches:
            if carried is None:
                yield b.column("key"), b.column("value"), b.column("seq")
            else:
                own = b.select(range(len(_ROWS), b.num_columns))
                own = pa.Table.from_batches([own]).rename_columns(carried.names)
                yield b.column("key"), b.column("value"), b.column("seq"), own

    return ArrowRows(columns())


def _np_full(n: int, value: int) -> Any:
    import numpy as np

    return np.full(n, value, dtype=np.int32)


#: The rows' own columns, first in every batch and run.
_ROWS = ("partition", "key", "value", "seq")


def _rows_schema(carried: pa.Schema | None = None) -> pa.Schema:
    """The buffer's batches: the rows' columns (``_ROWS``), then the ``carried`` ones
    named by their place (a carried column may well be called ``key``)."""
    import pyarrow as pa

    types = (pa.int32(), pa.binary(), pa.binary(), pa.int64())
    fields = [pa.field(n, t) for n, t in zip(_ROWS, types, strict=True)]
    if carried is not None:
        fields += [pa.field(f"carried{i}", f.type) for i, f in enumerate(carried)]
    return pa.schema(fields)


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
    """Row order by (partition, key[, seq]), stable (as Arrow's sort is). Keys are
    sorted by numpy as ``key_order.sort_columns`` makes them (with ``np.lexsort`` when
    there are several columns), or by Arrow's comparison sort when they are too wide.
    The partition comes from a stable numpy sort of the small ints on top, which is
    cheaper than sorting by it first."""
    import numpy as np
    import pyarrow.compute as pc

    from .encoding.key_order import sort_columns

    words = sort_columns(table.column("key").combine_chunks())
    if words is None:
        keys = [("key", "ascending"), ("seq", "ascending")] if with_seq else [("key", "ascending")]
        order = pc.sort_indices(table, keys).to_numpy()
    else:
        columns = [*reversed(words)]  # np.lexsort: the last column sorts first
        if with_seq:
            columns.insert(0, table.column("seq").to_numpy())
        if not columns:  # every key the same
            order = np.arange(table.num_rows)
        elif len(columns) == 1:
            order = np.argsort(columns[0], kind="stable")
        else:
            order = np.lexsort(columns)
    if one_partition:
        return order
    parts = table.column("partition").to_numpy()[order]
    if parts.min() >= 0 and parts.max() <= 0xFFFF:
        parts = parts.astype(np.uint16)  # numpy's stable sort is a radix sort for these
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


def _merge_runs(
    runs: list[Iterator[pa.RecordBatch]], schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
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
        rows = [t for t in taken if t.num_rows]
        if len(rows) == 1:  # one run's rows alone: sorted and key-unique already
            yield rows[0]
            continue
        block = last_per_key(pa.Table.from_batches(rows, schema=schema))
        yield from block.to_batches()
