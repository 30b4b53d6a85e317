"""A stream-stream join's state (``symmetricHashJoin``) served as one store per side.

Why a module of its own: Spark keeps a join side in two internal stores that mean
nothing alone, and the layout of those stores changed with the join state format; this
is the one place that knows them, so ``layout`` only names the sides and the rest of the
checkpoint reader sees a side as any other store.

What Spark keeps, per side (``left`` / ``right``) and state partition:

* ``<side>-keyToNumValues``: join key → ``{value: long}``, how many rows the side buffers
  for the key. The key row's columns are the join key's, named ``field0``, ``field1``, …
* ``<side>-keyWithIndexToValue``: (join key columns, ``index: long``) → one buffered
  input row of the side (all its columns), for index 0 to count - 1. From join state
  format 2 on the row has a last column ``matched: boolean``: whether the row has joined
  with a row of the other side yet (an outer join emits the unmatched ones, padded with
  nulls, when the watermark evicts them: the padded rows are output, never state).
  When a row is evicted Spark moves the key's last row into its index, so index order is
  not arrival order.

Where: formats 1 and 2 keep each internal store as a store of its own, in
``state/<op>/<partition>/<store name>/`` (HDFS-backed or RocksDB), listed by the
operator's metadata (with checkpoint format v2, ``rocksdb_files`` finds each store's
file ids in the commit log, one per store in the metadata's order). Format 3 (Spark
4.1+, RocksDB only) keeps the four as column families of the operator's one ``default``
RocksDB store (``rocksdb_files``), named as the stores were, their schemas in the
``_stateSchema`` file the v2 metadata names.
Format 4 (keys with event times, lists of rows per key) is refused in one line.

What iqkit serves: a side is keyed by the join key (one column its value, several a
tuple, as ``shape`` keys every store) and a key's value is the list of its buffered rows
in index order, each a dict of the row's columns (``matched`` kept where Spark keeps
it), as ``format("statestore")`` with ``joinSide`` reads them; ``keyToNumValues`` says
how many rows a key has, as it does for Spark. The join's input is hash-partitioned on
the join key, so Spark's ``pmod(hash(join key columns), n)`` routes key lookups.

A side's version is rebuilt in full from its files each time (no build on an older
version's database: ``changed_state`` is ``None``), a whole partition at a time where
the side's columns allow (``JoinShape.stored_columns``: both stores' records decoded
column-wise, each key's rows joined into its JSON list by Arrow), else key by key.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from ..encoding import keyspace
from ..encoding.serdes import JsonSerde, get_serde
from ..manifest import StoreManifest
from . import rocksdb_files
from .codecs import StateFileError
from .layout import OperatorStore
from .providers import ROCKSDB_PROVIDER, StateReader, VersionFiles
from .shape import JSON_COLUMNS, StateShape, UnsupportedStateError, json_objects, stored_text_keys
from .state_records import StateRecords, StateRows
from .state_schema import DEFAULT_STORE, read_store_schema
from .unsafe_row import RowDecoder

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "JOIN_OPERATOR",
    "JoinShape",
    "JoinSideReader",
    "SideState",
    "StoreReader",
    "is_join_side",
    "open_side",
    "open_store",
]

#: The operator name Spark records for a stream-stream join.
JOIN_OPERATOR = "symmetricHashJoin"
_COUNTS, _ROWS = "keyToNumValues", "keyWithIndexToValue"
#: The column family join state format 4 keeps a side's rows in.
_V4_ROWS = "keyWithTsToValues"

#: Arrow holds offsets into a ``binary`` column's bytes in 32 bits.
_ARROW_OFFSETS = 2**31 - 1
#: A private scratch folder a provider may use while it reads.
_Dir = str | os.PathLike[str]
#: One side's rows: (join key row, its buffered rows in index order).
SideRows = list[tuple[tuple[Any, ...], list[tuple[Any, ...]]]]


def is_join_side(store: OperatorStore) -> bool:
    """Whether ``store`` is a side of a stream-stream join: the one place the operator
    kind is asked (an operator named by inference, where the metadata is missing, is
    asked the same way)."""
    return store.operator_name == JOIN_OPERATOR


def open_store(reader: StateReader, store: OperatorStore) -> tuple[StoreReader, StateShape]:
    """What reads ``store`` and the shape it is served in, chosen once per store: a join
    side's own reader and shape, else the checkpoint's reader and ``reader.shape`` (which
    knows every other operator's). Here, not in ``providers``: a join side reads through
    the checkpoint's reader, so ``providers`` cannot import this module."""
    if is_join_side(store):
        return open_side(reader, store)
    return reader, reader.shape(store)


def open_side(reader: StateReader, store: OperatorStore) -> tuple[JoinSideReader, JoinShape]:
    """The reader and shape of the join side ``store`` (``UnsupportedStateError`` for a
    layout iqkit does not read, in one line)."""
    side = JoinSideReader(reader, store)
    return side, JoinShape(side.key_schema, side.row_schema, side=store.store_name)


def _internal(store: OperatorStore, name: str) -> OperatorStore:
    """The operator's internal store ``name``, under a name of its own (readers cache
    schemas and decoders by store name)."""
    return OperatorStore(f"{store.name}/{name}", store.operator, store.operator.store(name))


def _hashable(value: Any) -> Any:
    """A decoded key column as a dict key (a struct column decodes to a dict)."""
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


class JoinSideReader:
    """One join side's state, read through the checkpoint's ``StateReader``: what the
    snapshot and the build path (``materialize``) ask of a reader, for a side."""

    def __init__(self, reader: StateReader, store: OperatorStore) -> None:
        self.base = reader
        self.objects = reader.objects
        self.provider_name = reader.provider_name
        self.store = store
        side = store.store_name
        names = {info.name for info in store.operator.stores}
        source = store.operator.source
        self._counts_family = f"{side}-{_COUNTS}"
        self._rows_family = f"{side}-{_ROWS}"
        if {self._counts_family, self._rows_family} <= names:
            # Join state formats 1 and 2: stores of their own.
            self._counts: OperatorStore | None = _internal(store, self._counts_family)
            self._rows: OperatorStore | None = _internal(store, self._rows_family)
            self._families: OperatorStore | None = None
            self.key_schema = reader.schemas(self._counts)[0]
            self.row_schema = reader.schemas(self._rows)[1]
            return
        if names != {DEFAULT_STORE}:
            raise UnsupportedStateError(
                f"not supported yet: a stream-stream join whose stores are "
                f"{', '.join(sorted(names))} ({source})"
            )
        # Join state format 3: column families of the operator's one store.
        schema = read_store_schema(self.objects, store.folder, metadata=store.operator)
        families = {f.name: f for f in schema.column_families}
        if f"{side}-{_V4_ROWS}" in families:
            raise UnsupportedStateError(
                f"not supported yet: stream-stream join state format 4 ({schema.source})"
            )
        if not {self._counts_family, self._rows_family} <= set(families):
            raise UnsupportedStateError(
                f"not supported yet: a stream-stream join whose column families are "
                f"{', '.join(sorted(families))} ({schema.source})"
            )
        if reader.provider != ROCKSDB_PROVIDER:
            raise UnsupportedStateError(
                f"not supported yet: column families in state of the {reader.provider_name} "
                f"provider ({schema.source})"
            )
        self._counts = self._rows = None
        self._families = _internal(store, DEFAULT_STORE)
        counts, rows = families[self._counts_family], families[self._rows_family]
        self.key_schema = counts.key_schema
        self.row_schema = rows.value_schema
        self._decoders = {
            self._counts_family: (RowDecoder(counts.key_schema), RowDecoder(counts.value_schema)),
            self._rows_family: (RowDecoder(rows.key_schema), RowDecoder(rows.value_schema)),
        }

    # -- which files ---------------------------------------------------------------------
    def _stores(self) -> list[OperatorStore]:
        if self._families is not None:
            return [self._families]
        assert self._counts is not None and self._rows is not None
        return [self._counts, self._rows]

    def version_files(self, store: OperatorStore, partition: int, version: int) -> VersionFiles:
        """The files the side's partition is rebuilt from at ``version``: both internal
        stores' (formats 1 and 2), or the one store's (format 3)."""
        parts = [self.base.version_files(s, partition, version) for s in self._stores()]
        keys = [key for files in parts for key in files.keys]
        folder = f"{self.store.folder}/{partition}"
        return VersionFiles(folder, parts, "\n".join([self.base.query_id, *keys]))

    def oldest_version(self, store: OperatorStore, partition: int = 0) -> int | None:
        """The oldest version every internal store can still rebuild (``partition``'s)."""
        oldest = [self.base.oldest_version(s, partition) for s in self._stores()]
        if any(v is None for v in oldest):
            return None
        return max(v for v in oldest if v is not None)

    def where(self, store: OperatorStore, partition: int, version: int) -> str:
        return f"{self.store.folder}/{partition} ({self.store.store_name} side) version {version}"

    def changed_state(self, store: OperatorStore, files: VersionFiles, since: int) -> None:
        return None  # a side is rebuilt in full (module docstring)

    def trace_line(self, store: OperatorStore, *opened: Any) -> str:
        """``StateReader.trace_line`` of the side's first store (its folder named)."""
        line = self.base.trace_line(self._stores()[0], *opened)
        return f"{line} (join {self.store.store_name} side)"

    # -- rows ----------------------------------------------------------------------------
    def state_rows(
        self, store: Any, version: int, files: VersionFiles, work_dir: _Dir
    ) -> SideState:
        """The side's two internal stores' state at ``version``: each join key the side
        buffers rows for, with those rows in index order, as it is iterated
        (``SideState``), or shaped a whole partition at once (``JoinShape.stored_columns``)."""
        parts: list[VersionFiles] = files.plan
        if self._families is None:
            assert self._counts is not None and self._rows is not None
            counts = self.base.state_rows(self._counts, version, parts[0], work_dir)
            rows = self.base.state_rows(self._rows, version, parts[1], work_dir)
            return SideState(counts, rows, files)
        return SideState(*self._family_rows(version, parts[0], work_dir), files)

    def _family_rows(
        self, version: int, files: VersionFiles, work_dir: _Dir
    ) -> tuple[StateRows, StateRows]:
        """The records of the counts and rows families, from the one store."""
        state = rocksdb_files.load_family_state(
            self.objects, files.folder, version, plan=files.plan, work_dir=work_dir,
            row_checksums=self.base.row_checksums,
        )  # fmt: skip
        where = f"{self.objects.where(files.folder)} version {version}"
        families = (
            rocksdb_files.split_families(state.rows, state.families, where) if state.rows else {}
        )
        found = []
        for name in (self._counts_family, self._rows_family):
            if state.rows and name not in families:
                raise StateFileError(f"{where}: its snapshot names no column family {name!r}")
            row = rocksdb_files.stored_row
            records = StateRecords.of_mapping(
                {row(k, where, "key"): row(v, where, "value")
                 for k, v in families.get(name, {}).items()}
            )  # fmt: skip
            found.append(StateRows(records, *self._decoders[name]))
        return found[0], found[1]


@dataclass(frozen=True, eq=False)
class SideState:
    """A join side's partition version: the records of its counts store (join key →
    how many rows) and of its rows store ((join key, index) → row), with their
    decoders. Iterated, each counted key with its rows 0 to count - 1, one key at a time
    (the general path); ``JoinShape.stored_columns`` reads the records column-wise."""

    counts: StateRows
    rows: StateRows
    files: VersionFiles

    def __iter__(self) -> Iterator[tuple[tuple[Any, ...], list[tuple[Any, ...]]]]:
        """``StateFileError`` naming the files when a counted row is missing: the two
        stores disagree."""
        by_key: dict[Any, dict[int, tuple[Any, ...]]] = {}
        for key_row, value_row in self.rows:
            by_key.setdefault(_hashable(key_row[:-1]), {})[key_row[-1]] = value_row
        out: SideRows = []
        for key_row, (count,) in self.counts:
            held = by_key.get(_hashable(key_row), {})
            try:
                values = [held[i] for i in range(count or 0)]
            except KeyError as exc:
                raise StateFileError(
                    f"{', '.join(self.files.keys)}: join key {key_row!r} counts {count} rows "
                    f"but row {exc.args[0]} is missing (damaged?)"
                ) from None
            out.append((key_row, values))
        return iter(out)


#: What reads a store's state: the checkpoint's reader, or a join side's own.
StoreReader = StateReader | JoinSideReader


@dataclass(frozen=True)
class JoinShape(StateShape):
    """A join side's shape: the join key (``key_schema``, ``field0``, …) and the lists
    of buffered rows (``value_schema`` is one row's) as iqkit stores them."""

    side: str = ""

    @property
    def window_index(self) -> int | None:  # type: ignore[override]
        return None  # a join key is never a window store's key

    def manifest(
        self, store: OperatorStore, window_size_ms: int | None, provider: str
    ) -> StoreManifest:
        base = super().manifest(store, None, provider)
        properties = dict(base.properties)
        # A value is a list of rows, not one object of these columns: no value_schema (it
        # would be read as the value's columns); the row's columns are kept apart.
        properties["row_schema"] = properties.pop("value_schema")
        properties["spark_join_side"] = self.side
        return dataclasses.replace(base, properties=properties)

    def stored_columns(self, rows: Any) -> tuple[pa.Array, pa.Array] | None:
        """``store_rows`` of a whole ``SideState`` at once, sorted: iqkit's stored keys
        (each once, in byte order) and values (each key's rows as a JSON list), as two
        Arrow ``binary`` columns, byte for byte what ``store_rows`` gives. For a side of
        one string join key column and rows of ``JSON_COLUMNS``; ``None`` for any other,
        and for state ``store_rows`` treats apart (``StateShape.stored_columns``' cases,
        a count that is not positive) or refuses (a counted row missing: its error names
        the row).

        Each store's live records are settled by the sort its keys need anyway
        (``StateRecords.live_sorted``): the counted keys by stored key, the rows by
        stored key and index, so that the rows of a key, 0 to count - 1, follow one
        another in the order of the keys."""
        if not isinstance(rows, SideState) or not self._bulk_side:
            return None
        counts, held = rows.counts.records, rows.rows.records
        if max(len(counts.data), len(held.data)) > _ARROW_OFFSETS:
            return None
        import pyarrow as pa
        import pyarrow.compute as pc

        # The counted keys, sorted, and how many rows each has.
        count_keys = rows.counts.keys.decode_columns(
            counts.data, counts.key_starts, counts.key_lengths
        )
        keys = None if count_keys is None else stored_text_keys(counts.data, count_keys[0])
        live = None if keys is None else counts.live_sorted([keys])
        if keys is None or live is None:
            return None
        keys = keys.take(pa.array(live))
        numbers = rows.counts.values.decode_columns(
            counts.data, counts.value_starts[live], counts.value_lengths[live]
        )
        if numbers is None or len(numbers) != 1 or numbers[0].kind != "long":
            return None
        if numbers[0].nulls is not None:
            return None
        how_many = numbers[0].values
        if (how_many <= 0).any():
            return None  # no rows: store_rows stores an empty list
        # The rows, sorted by key and index.
        row_keys = rows.rows.keys.decode_columns(held.data, held.key_starts, held.key_lengths)
        if row_keys is None or len(row_keys) != 2 or row_keys[1].kind != "long":
            return None
        if row_keys[1].nulls is not None:
            return None
        held_keys = stored_text_keys(held.data, row_keys[0])
        if held_keys is None:
            return None
        index = row_keys[1].values
        placed = held.live_sorted([held_keys, pa.array(index)])
        if placed is None:
            return None
        # Each row's key among the counted keys, and whether its index is counted.
        at = np.asarray(pc.index_in(held_keys.take(pa.array(placed)), value_set=keys)
                        .fill_null(-1), dtype=np.int64)  # fmt: skip
        index = index[placed]
        counted = (at >= 0) & (index >= 0)
        counted[counted] = index[counted] < how_many[at[counted]]
        at, placed = at[counted], placed[counted]
        if not np.array_equal(np.bincount(at, minlength=len(keys)), how_many):
            return None  # a counted row is missing: store_rows names it
        values = rows.rows.values.decode_columns(
            held.data, held.value_starts[placed], held.value_lengths[placed]
        )
        objects = None if values is None else json_objects(self._json_names, values, held.data)
        if objects is None:
            return None
        offsets = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(how_many, out=offsets[1:])
        try:
            lists = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), objects)
            comma, left, right, nothing = (
                pa.scalar(t, pa.binary()) for t in (b",", b"[", b"]", b"")
            )
            joined = pc.binary_join(lists, comma)
            text = pc.binary_join_element_wise(left, joined, right, nothing)
        except (pa.ArrowCapacityError, pa.ArrowInvalid):
            return None  # past 2 GiB of text (32-bit offsets): left to store_rows
        return keys, text

    @cached_property
    def _bulk_side(self) -> bool:
        """Whether ``stored_columns`` serves this side (its docstring)."""
        return (
            len(self.key_fields) == 1
            and self.key_serde == "string"
            and self._distinct_names
            and all(isinstance(f["type"], str) and f["type"] in JSON_COLUMNS
                    for f in self.value_fields)
        )  # fmt: skip

    def store_rows(  # type: ignore[override]
        self, rows: Iterable[tuple[tuple[Any, ...], list[tuple[Any, ...]]]]
    ) -> Iterator[tuple[bytes, bytes]]:
        """(join key row, its rows) pairs as iqkit's stored key and value bytes."""
        serialize_key = get_serde(self.key_serde).serialize
        # Spark's state may hold NaN or an infinity (a double column): kept, as tokens.
        serialize = JsonSerde().serialize_keeping_non_finite
        value_of = self.value_of
        for key_row, value_rows in rows:
            key = keyspace.kv_key(serialize_key(self.key_value(key_row)))
            yield key, serialize([value_of(row) for row in value_rows])
