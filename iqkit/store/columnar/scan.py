"""Scanning a partition's chain through its twins: the rows of one version between two
RocksDB keys, in key order, without building its database.

A chain is a base and deltas; a key's row is the one in the newest file that has the key,
and a tombstone there means no row. ``TwinScan`` plans a scan from the files' footers
alone (which row groups can hold keys between the bounds, by their ``__key``
statistics), and reads lazily:

* one file: its row groups stream one at a time (reversed for a descending scan), so a
  full scan of a big partition never holds more than a row group of it;
* several files: the row groups each file needs are read, every file's rows a newer file
  supersedes are dropped (by position, from the newest twin's position deletes,
  ``deletes.py``; chains of an earlier iqkit by ``is_in`` against the newer files' keys),
  tombstones are dropped: one table, as big as the rows scanned. By position, what is
  left of each file is in key order and no key is left twice, so the files' rows are
  merged (``key_order.merge_order``: the biggest file's rows stay in order, the others'
  are put among them by binary search) and copied once, in that order; merged on keys,
  they are sorted.

Files whose columns differ (a field only some commits wrote, ints in one file and
floats in another) are put together as a scan's chunks are (``shaping._assemble``): the
union of the columns, each cast to the type all files' columns fit, else JSON text.
"""

from __future__ import annotations

import contextlib
import os
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ...errors import StoreCorruptedError
from ..encoding.key_order import merge_order
from ..encoding.serdes import get_serde
from ..manifest import StoreManifest
from ..rows import VALUE
from .deletes import Superseded, footer_schema, read_superseded
from .shaping import _assemble, _Column, _unified_type
from .twins import (
    DELETED,
    JSON_TEXT,
    KEY_BYTES,
    KEY_FROM,
    LAYOUT,
    key_bounds,
    key_bytes,
    serialized_keys,
)

__all__ = ["TwinScan"]


@dataclass
class _File:
    #: Its place on the root (for messages) and its local path.
    path: str
    local: str
    schema: pa.Schema
    groups: list[int]
    #: The column its RocksDB keys are derived from (None: it holds ``__key``).
    key_from: str | None = None
    #: The groups whose keys all lie within the scan's bounds (by their statistics).
    inside: frozenset[int] = frozenset()
    #: The rows of each of its row groups.
    group_rows: tuple[int, ...] = ()
    #: Its footer as planning parsed it.
    meta: pq.FileMetaData | None = None


#: Opens a twin's local path for reading, for a ``with`` block.
Opener = Callable[[str], AbstractContextManager[BinaryIO]]

#: Where a descriptor's open file can be named: pyarrow then reads it with its own
#: native reader, yet opens nothing by the twin's path (which a link could replace).
_FD_FOLDER = "/proc/self/fd"


def _open_copy(local: str) -> AbstractContextManager[BinaryIO]:
    """A twin copy pinned in this user's private cache (its folders are 0700)."""
    return open(local, "rb")


def _native(fh: BinaryIO) -> str | BinaryIO:
    """What pyarrow reads the open file ``fh`` through: its descriptor's name where the
    system has one, else the Python file (slower, same bytes)."""
    return f"{_FD_FOLDER}/{fh.fileno()}" if os.path.isdir(_FD_FOLDER) else fh


def _parquet(fh: BinaryIO, meta: pq.FileMetaData | None = None) -> pq.ParquetFile:
    """The open twin ``fh`` for reading row groups (``meta``: its footer, parsed when it
    was planned, not again). Every page's CRC32 is checked where its header has one
    (twins.write_twin writes them; older twins have none and are read unchecked): a
    flipped bit in a page is an error (``_damage``), not wrong rows."""
    return pq.ParquetFile(_native(fh), metadata=meta, page_checksum_verification=True)


@dataclass
class _Footer:
    """What planning needs of a twin's footer, parsed once: its schema, layout, the
    column its keys are derived from, and each row group's rows and key bounds."""

    schema: pa.Schema
    layout: bytes | None
    key_from: str | None
    groups: list[tuple[int, tuple[bytes, bytes] | None]]
    meta: pq.FileMetaData | None = None
    #: The groups holding rows, and their smallest and largest keys, when every such
    #: group has bounds and each starts at or after the previous one's end (a twin is
    #: written sorted by key, so this is the rule): groups are then found by bisection,
    #: not one test per group (a million-row twin has 62, and every scan plans).
    _ordered: tuple[list[int], list[bytes], list[bytes]] | None = None

    def __post_init__(self) -> None:
        held = [(g, b) for g, (rows, b) in enumerate(self.groups) if rows]
        if any(b is None for _, b in held):
            return
        bounds = [b for _, b in held]
        if all(prev[1] <= nxt[0] for prev, nxt in pairwise(bounds)):
            self._ordered = (
                [g for g, _ in held],
                [b[0] for b in bounds],  # type: ignore[index]
                [b[1] for b in bounds],  # type: ignore[index]
            )

    def overlapping(self, lower: bytes, upper: bytes | None) -> list[int]:
        """The groups holding rows that can hold keys in ``[lower, upper)``."""
        if self._ordered is None:
            return [
                g
                for g, (rows, bounds) in enumerate(self.groups)
                if rows and _overlaps(bounds, lower, upper)
            ]
        held, los, his = self._ordered
        first = bisect_left(his, lower)  # the first group whose largest key >= lower
        end = len(los) if upper is None else bisect_left(los, upper)  # smallest < upper
        return held[first:end]

    @classmethod
    def read(cls, local: str, key_serde: Any, opener: Opener) -> _Footer:
        # The footer only: no file stays open between planning and reading (a query
        # plans every partition's scan before any is read).
        with opener(local) as fh:
            meta = pq.read_metadata(_native(fh))
        schema = footer_schema(meta)
        leaves = [meta.schema.column(i).path for i in range(meta.num_columns)]
        derived = (schema.metadata or {}).get(KEY_FROM)
        key_leaf = KEY_BYTES if derived is None else derived.decode()
        if key_leaf not in leaves or DELETED not in leaves:
            raise ValueError(f"no {key_leaf} or {DELETED} column")
        if derived is not None and key_serde is None:
            raise ValueError(f"its keys are derived from {key_leaf!r}: no manifest")
        key_index = leaves.index(key_leaf)
        groups = []
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            stats = group.column(key_index).statistics
            bounds = _raw_bounds(stats) if derived is None else key_bounds(stats, key_serde)
            groups.append((group.num_rows, bounds))
        layout = (schema.metadata or {}).get(LAYOUT)
        return cls(schema, layout, None if derived is None else key_leaf, groups, meta)


def _raw_bounds(stats: pq.Statistics | None) -> tuple[bytes, bytes] | None:
    """The smallest and largest key of a row group by its ``__key`` statistics."""
    if stats is None or not stats.has_min_max:
        return None
    lo, hi = stats.min, stats.max
    if isinstance(lo, str):  # statistics of a column pyarrow took for text
        lo, hi = lo.encode("utf-8", "surrogateescape"), hi.encode("utf-8", "surrogateescape")
    return lo, hi


def _within(bounds: tuple[bytes, bytes] | None, lower: bytes, upper: bytes | None) -> bool:
    """Whether every key of a row group whose keys lie within ``bounds`` is in
    ``[lower, upper)`` (no bounds: not known)."""
    if bounds is None:
        return False
    lo, hi = bounds
    return lo >= lower and (upper is None or hi < upper)


def _overlaps(bounds: tuple[bytes, bytes] | None, lower: bytes, upper: bytes | None) -> bool:
    """Whether a row group whose keys lie within ``bounds`` can hold keys in
    ``[lower, upper)`` (no bounds: it might)."""
    if bounds is None:
        return True
    lo, hi = bounds
    return hi >= lower and (upper is None or lo < upper)


class TwinScan:
    """A planned scan of one partition version's twins (oldest file first) for RocksDB
    keys in ``[lower, upper)`` (``upper`` None: to the end), ascending or not.

    ``columns``: the row columns to read (None: all); ``__key`` and ``__deleted`` are
    always read. Planning reads each file's footer (or takes it from ``footers``, which
    it fills: a partition's reader keeps its files' footers); ``batches`` reads rows."""

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]],
        lower: bytes,
        upper: bytes | None,
        *,
        reverse: bool = False,
        columns: Sequence[str] | None = None,
        names: Sequence[str] | None = None,
        layout: bytes | None = None,
        manifest: StoreManifest | None = None,
        footers: dict[str, Any] | None = None,
        opener: Opener | None = None,
    ) -> None:
        self.lower, self.upper, self.reverse = lower, upper, reverse
        self._open = opener or _open_copy
        self._key_serde = get_serde(manifest.key_serde) if manifest is not None else None
        #: Whether a file was written for another layout than ``layout`` (the store's
        #: manifest was changed since): the caller then does not read the twins.
        self.stale = False
        self.files: list[_File] = []
        self.groups_total = 0
        self._names = list(names) if names is not None else [os.fspath(p) for p in paths]
        for path, name in zip(paths, self._names, strict=True):
            local = os.fspath(path)
            footer = footers.get(local) if footers is not None else None
            if footer is None:
                with _damage(name):
                    footer = _Footer.read(local, self._key_serde, self._open)
                if footers is not None:  # twins never change: their footers neither
                    footers[local] = footer
            if layout is not None and footer.layout != layout:
                self.stale = True
            groups = footer.overlapping(lower, upper)
            self.groups_total += len(footer.groups)
            inside = frozenset(g for g in groups if _within(footer.groups[g][1], lower, upper))
            rows = tuple(n for n, _ in footer.groups)
            self.files.append(
                _File(
                    name, local, footer.schema, groups, footer.key_from, inside, rows, footer.meta
                )
            )
        self.columns = None if columns is None else list(columns)
        #: Whether every table has ``__key`` (derived where the files do not hold it);
        #: a reader that drops it says so (``False``), and then only a scan that needs
        #: the keys (bounds, a merge on keys) derives them.
        self.keys = True
        #: Set by ``close``: the scan yields nothing more (its engine was closed).
        self.closed = False
        #: What planning fetched into the cache, for a query's trace (set by whoever
        #: fetched the files; None when they were read in place on a local root).
        self.fetched: str | None = None

    def close(self) -> None:
        """End the scan: ``batches`` stops before its next row group."""
        self.closed = True

    @property
    def groups_read(self) -> int:
        return sum(len(f.groups) for f in self.files)

    @property
    def groups_skipped(self) -> int:
        return self.groups_total - self.groups_read

    def trace_line(self) -> str:
        """What the scan reads, for a query's trace."""
        files = len(self.files)
        upper = self.upper.hex() if self.upper is not None else "∞"
        direction = "reverse" if self.reverse else "forward"
        return (
            f"{files} file{'s' if files != 1 else ''}, {self.groups_read} row groups read, "
            f"{self.groups_skipped} row groups skipped by key statistics, {direction} over "
            f"[{self.lower.hex()}, {upper})"
        )

    def _read(
        self,
        f: _File,
        groups: list[int],
        parquet: pq.ParquetFile | None = None,
        *,
        keys: bool = True,
        key_column: bool = True,
    ) -> pa.Table:
        """Row groups ``groups`` of ``f`` (through ``parquet`` if open, else opened and
        closed here); ``keys``: with ``__key`` derived where the file does not hold it;
        ``key_column`` False (no keys needed at all): the column keys are derived from is
        read only when the reader named it."""
        names = f.schema.names
        if self.columns is not None:
            wanted = {KEY_BYTES, DELETED, *self.columns}
            if keys or key_column:
                wanted.add(f.key_from)
            names = [n for n in names if n in wanted]
        with _damage(f.path):
            if parquet is not None:
                table = parquet.read_row_groups(groups, columns=names, use_threads=False)
            else:
                with self._open(f.local) as fh, _parquet(fh, f.meta) as opened:
                    table = opened.read_row_groups(groups, columns=names, use_threads=False)
            if f.key_from is None or not keys:
                return table
            assert self._key_serde is not None
            # Every table a scan hands on has ``__key`` (merges and bounds compare it).
            return table.add_column(0, KEY_BYTES, key_bytes(table, f.key_from, self._key_serde))

    def _bounded(self, table: pa.Table) -> pa.Table:
        keys = table.column(KEY_BYTES)
        mask = pc.greater_equal(keys, pa.scalar(self.lower, pa.binary()))
        if self.upper is not None:
            mask = pc.and_(mask, pc.less(keys, pa.scalar(self.upper, pa.binary())))
        return table.filter(mask)

    def batches(self) -> Iterator[pa.Table]:
        """The rows, in scan order, as tables (with ``__key`` and ``__deleted`` still in;
        tombstones removed). Types of a column may differ between the tables of a
        several-file scan only if they differ between files (see ``table``)."""
        if not self.files:
            return
        if len(self.files) == 1:
            f = self.files[0]
            order = reversed(f.groups) if self.reverse else f.groups
            # A reader that named its columns without ``__key`` (the Spark data source),
            # or drops it, gets none derived for row groups its bounds hold whole: no
            # filter needs them.
            keyless = self._keyless()
            with contextlib.ExitStack() as held:
                with _damage(f.path):
                    fh = held.enter_context(self._open(f.local))
                    parquet = held.enter_context(_parquet(fh, f.meta))
                for g in order:
                    if self.closed:
                        return
                    if keyless and g in f.inside:  # not even the key column, unless named
                        table = _live(self._read(f, [g], parquet, keys=False, key_column=False))
                    else:
                        table = _live(self._bounded(self._read(f, [g], parquet)))
                    if self.reverse:
                        table = _reversed(table)
                    if table.num_rows:
                        yield table
            return
        table = self.table()
        if table.num_rows:
            yield table

    def _keyless(self) -> bool:
        """Whether the reader does without derived ``__key`` columns."""
        return not self.keys or (self.columns is not None and KEY_BYTES not in self.columns)

    def written_keys(self) -> list[bytes]:
        """Every RocksDB key the files hold within the bounds, puts and tombstones alike,
        sorted and each once: the keys the commits that wrote these files changed (what
        a change feed reads a delta for; only ``__key`` and ``__deleted`` are read)."""
        saved, self.columns = self.columns, []
        try:
            keys = [self._bounded(self._read(f, f.groups)).column(KEY_BYTES) for f in self.files]
        finally:
            self.columns = saved
        return sorted({key for column in keys for key in column.to_pylist()})

    def table(self) -> pa.Table:
        """Every row of the scan as one table, in scan order."""
        if len(self.files) == 1:
            parts = list(self.batches())
            if parts:
                return pa.concat_tables(parts)
            return _live(self._bounded(self._read(self.files[0], [])))
        deletes = read_superseded(
            self.files[-1].schema.metadata,
            [(f.path, sum(f.group_rows)) for f in self.files[:-1]],
        )
        if deletes is not None:  # the newest twin says which older rows are dead
            return self._merged_by_position(deletes)
        merged = _live(_unify_tables(self._merged_on_keys()))  # an earlier iqkit's chain
        order = pc.sort_indices(
            merged, sort_keys=[(KEY_BYTES, "descending" if self.reverse else "ascending")]
        )
        return merged.take(order)

    def _merged_by_position(self, deletes: Superseded) -> pa.Table:
        """The chain's rows by its position deletes: each file's live rows (neither
        superseded nor tombstones, within the bounds) merged in key order, copied once.

        Keys are derived only where needed: a reader that does without them
        (``_keyless``) scanning row groups its bounds hold whole orders the rows by the
        key column serialized (a kv store's keys share their prefix)."""
        whole = all(f.inside.issuperset(f.groups) for f in self.files)
        by_column = (
            whole
            and self._keyless()
            and len({f.key_from for f in self.files}) == 1
            and self.files[0].key_from is not None
        )
        tables, kept, keys = [], [], []
        for i, f in enumerate(self.files):
            table = self._read(f, f.groups, keys=not by_column)
            live = _alive_rows(table, f, deletes, i)
            if not whole:
                live &= _in_bounds(table, self.lower, self.upper)
            tables.append(table)
            kept.append(np.flatnonzero(live))
            keys.append(
                serialized_keys(table.column(f.key_from).combine_chunks(), self._key_serde)
                if by_column
                else table.column(KEY_BYTES)
            )
        order = merge_order(keys, kept)
        if self.reverse:
            order = order[::-1]
        return _unify_tables(tables).take(pa.array(order))

    def _merged_on_keys(self) -> list[pa.Table]:
        """Each file's rows that no newer file has the key of (``is_in``)."""
        tables = [self._bounded(self._read(f, f.groups)) for f in self.files]
        newer: pa.Array | None = None
        kept: list[pa.Table] = []
        for table in reversed(tables):  # newest first
            keys = table.column(KEY_BYTES).combine_chunks()
            if newer is not None and len(newer) and table.num_rows:
                table = table.filter(pc.invert(pc.is_in(keys, value_set=newer)))
            newer = keys if newer is None else pa.concat_arrays([newer, keys])
            kept.append(table)
        kept.reverse()
        return kept

    @staticmethod
    def stored_rows(table: pa.Table, value_serde: Any) -> list[tuple[bytes, bytes]]:
        """The rows of one of this scan's tables (``__key`` in) as the ``(key, value)``
        bytes RocksDB holds for them: the ``value`` column serialized back, exact where
        ``twins.values_from_columns``. What a scan's ``KeyValue`` rows are decoded from
        when they are read from the twins (``layers.ScanIterator.over_twins``)."""
        keys = table.column(KEY_BYTES).to_pylist()
        column = table.column(VALUE).combine_chunks()
        encoded = value_serde.serialize_arrow(column)
        values = (
            encoded.to_pylist()
            if encoded is not None
            else [value_serde.serialize(v) for v in column.to_pylist()]
        )
        return list(zip(keys, values, strict=True))


@contextlib.contextmanager
def _damage(name: str) -> Iterator[None]:
    """A twin that cannot be read is a damaged store: ``StoreCorruptedError`` naming it
    (the partition fails; no other partition does)."""
    try:
        yield
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise StoreCorruptedError(f"columnar twin {name} cannot be read: {exc}") from None


def _alive_rows(table: pa.Table, f: _File, deletes: Superseded, i: int) -> np.ndarray:
    """Which rows of ``table`` (row groups ``f.groups`` of the ``i``-th file of a
    chain) are live: not tombstones, and not superseded by a newer file by the chain's
    position deletes (the newest file has none). A boolean array."""
    live = pc.invert(table.column(DELETED)).fill_null(False).to_numpy(zero_copy_only=False)
    mask = deletes.mask(i) if i < len(deletes.bitmaps) else None
    if mask is None or not f.groups:
        return live
    starts = np.cumsum((0, *f.group_rows))
    positions = np.concatenate([np.arange(starts[g], starts[g + 1]) for g in f.groups])
    return live & mask[positions]


def _in_bounds(table: pa.Table, lower: bytes, upper: bytes | None) -> np.ndarray:
    """Which rows of ``table`` have a ``__key`` in ``[lower, upper)``."""
    keys = table.column(KEY_BYTES)
    mask = pc.greater_equal(keys, pa.scalar(lower, pa.binary()))
    if upper is not None:
        mask = pc.and_(mask, pc.less(keys, pa.scalar(upper, pa.binary())))
    return mask.fill_null(False).to_numpy(zero_copy_only=False)


def _live(table: pa.Table) -> pa.Table:
    deleted = table.column(DELETED)
    if deleted.null_count == 0 and not pc.any(deleted).as_py():
        return table
    return table.filter(pc.invert(deleted))


def _reversed(table: pa.Table) -> pa.Table:
    return table.take(pa.array(np.arange(table.num_rows - 1, -1, -1, dtype=np.int64)))


def _unify_tables(tables: list[pa.Table]) -> pa.Table:
    """One table of ``tables`` whose columns may differ (module docstring), keeping the
    twins' metadata: the first table's, and ``JSON_TEXT`` on every column that is JSON
    text in some table or became text because no type fits them all."""
    # The files' own metadata differs (a delta's carries its position deletes), their
    # columns' (``JSON_TEXT``) must not: only then is concatenating them enough.
    metadata = tables[0].schema.metadata
    first = tables[0].schema.remove_metadata()
    if all(t.schema.remove_metadata().equals(first, check_metadata=True) for t in tables):
        return pa.concat_tables([t.replace_schema_metadata(metadata) for t in tables])
    chunks = [
        {
            name: _Column(
                table.column(name).combine_chunks(),
                json=bool(field.metadata and field.metadata.get(JSON_TEXT)),
            )
            for name, field in zip(table.column_names, table.schema, strict=True)
        }
        for table in tables
    ]
    merged = _assemble(chunks)
    fields = []
    for field in merged.schema:
        present = [c[field.name] for c in chunks if field.name in c]
        types = [c.array.type for c in present]
        json_text = any(c.json for c in present) or _unified_type(field.name, types) is None
        fields.append(field.with_metadata({JSON_TEXT: b"1"}) if json_text else field)
    schema = pa.schema(fields, metadata=tables[0].schema.metadata)
    return pa.Table.from_batches(merged.to_batches(), schema=schema)
