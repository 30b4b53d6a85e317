"""transformWithState's state (``transformWithState``, ``transformWithStateInPandas``,
``transformWithStateInPySpark``): one store per state variable, and one of the timers.

Why a module of its own: such an operator keeps all its state variables in one RocksDB
store, each in a column family of its own (``rocksdb_files.load_family_state``), with
keys encoded for prefix scans and values that may be Avro instead of UnsafeRows; the
facts of that layout, and what iqkit makes of it (one store per state variable), live here.

What the checkpoint says (Spark 4.0 to 4.3, checked on the frozen checkpoints):

* ``state/<op>/_metadata/v2/<batch>``: the operator's ``operatorPropertiesJson`` lists the
  state variables, ``{"stateName", "stateVariableType": "ValueState" | "ListState" |
  "MapState" | "TimerState", "ttlEnabled"}``; the timers are listed by their family's
  name, ``$procTimers_keyToTimestamp`` (processing time) or
  ``$eventTimers_keyToTimestamp`` (event time). ``variables`` reads that list (the
  layout names the stores from it, below this module).
* The v3 schema file names every column family with its key and value schemas, its
  schema ids and its key encoding: a variable's family is named after it; the others
  (``default``, ``$ttl_<var>``, ``$rowCounter_<var>``, ``$procTimers_timestampToKey``,
  ...) are Spark's own indexes, and are not served.
* A value state's family: key = the grouping key's row, value = its value row; with a
  TTL, the value row is ``{value: <the user's row>, ttlExpirationMs: long}``.
* A list state's family: key = the grouping key's row, value = its elements one after
  another, each ``[length: int32 LE][element]``, with ``,`` between two (Spark's merge
  operator version 1, the default before 4.3) or nothing (version 2:
  ``spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion`` in the offsets log).
* A map state's family, and the timers': keys encoded for prefix scans,
  ``[length of the first part: int32 LE][first part][the rest]``, the first part the
  grouping key (``{key: <grouping key>}``), the rest the user key (``{userKey: ...}``) or
  the expiry (``{expiryTimestampMs: long}``); the timers' value is a dummy.
* Every row (each part of a prefix-scan key, each list element) is one version byte (0)
  and the row: an UnsafeRow, or with ``spark.sql.streaming.stateStore.encodingFormat=avro``
  an Avro datum (``avro_rows``) after the row's schema id (int16 LE), which the first
  part of a prefix-scan key does not carry.

A value state's and a map state's rows in UnsafeRows are also shaped a whole version at
a time (``TransformShape.stored_columns``): the keys decoded column-wise (a map state's
two parts found by their framing) and written by ``ordered.encode_columns``; values of
numbers and booleans by ``shape``'s JSON writer, other values row by row. Lists, timers
and Avro rows go row by row. Its property test (tests/store/checkpoint/test_transform_bulk.py)
holds it to ``store_rows``, byte for byte.

What iqkit serves (``TransformShape``): the store ``transform.<variable>`` (with several
stateful operators ``transform-<id>.<variable>``) keyed by the grouping key (a plain
value when it has one column, else a tuple); a value state's value is its value row as a
dict of its columns, the TTL column kept as Spark keeps it; a list state's is the list of
its elements in Spark's order; a map state's store is keyed by (grouping key, user key)
and valued by the map value's row; ``transform.$timers`` is keyed by grouping key, valued
by the list of its timers' expiry times (epoch milliseconds, ascending). Every key goes
to the partition of ``pmod(hash(grouping key columns), n)``, as Spark shuffles the
operator's input.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..encoding import keyspace
from ..encoding.ordered import encode_columns
from ..encoding.partitioners import SparkHashPartitioner
from ..encoding.serdes import JsonSerde, get_serde
from ..manifest import StoreManifest
from ..objects import ObjectStore
from .avro_rows import AvroRowDecoder
from .codecs import StateFileError
from .rocksdb_files import ReplayPlan, load_family_state, split_families
from .shape import (
    _ARROW_OFFSETS,
    JSON_COLUMNS,
    StateShape,
    UnsupportedStateError,
    _ddl,
    _json_ready,
    json_objects,
)
from .state_records import StateRecords, binary_slices
from .state_schema import ColumnFamilySchema, StoreSchema
from .unsafe_row import Column, RowDecoder
from .variables import LIST, MAP, TIMER, VALUE, StateVariable

if TYPE_CHECKING:
    import pyarrow as pa

    from .layout import OperatorStore

__all__ = ["TransformShape", "VariableRows", "shape_of", "state_rows"]

_ENCODING = "spark.sql.streaming.stateStore.encodingFormat"
_MERGE_OPERATOR = "spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion"
#: What Spark's string-append merge operator puts between two list elements, by version
#: (version 1 when the offsets log records none: every Spark before 4.3).
_DELIMITERS = {"1": b",", "2": b""}
_INT32_LE = struct.Struct("<i")
_SCHEMA_ID = struct.Struct("<h")
_ENCODING_VERSION = 0


# -- the shape -----------------------------------------------------------------------------
def shape_of(schema: StoreSchema, variable: StateVariable) -> TransformShape:
    """The shape of ``variable``'s store, from the operator's schema file."""
    family = schema.family(variable.family)
    if variable.kind in (VALUE, LIST):
        return TransformShape(family.key_schema, family.value_schema, variable.kind)
    group, rest = _prefix_split(family, schema.source)
    group_schema = _inner_struct(group, schema.source)
    if variable.kind == MAP:
        user_key = _inner_struct(rest, schema.source)
        return TransformShape(group_schema, family.value_schema, MAP, user_key)
    return TransformShape(group_schema, {"type": "struct", "fields": []}, TIMER)


def _prefix_split(family: ColumnFamilySchema, source: str) -> tuple[dict, dict]:
    """A prefix-scan family's key schema split in (first part, rest)."""
    spec = family.key_encoder_spec or {}
    prefix = int(spec.get("numColsPrefixKey") or 0)
    fields = family.key_schema.get("fields", [])
    if spec.get("keyStateEncoderType") != "PrefixKeyScanStateEncoderSpec" or prefix != 1:
        raise StateFileError(
            f"{source}: column family {family.name!r} is not keyed for prefix scans on its "
            f"first column ({spec})"
        )
    return ({"type": "struct", "fields": fields[:1]}, {"type": "struct", "fields": fields[1:]})


def _inner_struct(part: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The struct a one-column part of a key holds (``{key: struct<...>}``); a column that
    is no struct is its own one-column struct."""
    fields = part.get("fields", [])
    if len(fields) != 1:
        raise StateFileError(f"{source}: a key part of {len(fields)} columns, not one")
    kind = fields[0]["type"]
    if isinstance(kind, dict) and kind.get("type") == "struct":
        return dict(kind)
    return {"type": "struct", "fields": [fields[0]]}


@dataclass(frozen=True)
class TransformShape(StateShape):
    """A transformWithState store's shape (module docstring): ``key_schema`` is the
    grouping key's, ``value_schema`` a value's (a list state's: an element's; the
    timers': none); ``user_key_schema`` a map state's user key's."""

    kind: str = VALUE
    user_key_schema: Mapping[str, Any] | None = None

    @cached_property
    def window_index(self) -> int | None:
        return None  # a grouping key is never a time window's

    @cached_property
    def _group(self) -> StateShape:
        return StateShape(self.key_schema, {"type": "struct", "fields": []})

    @cached_property
    def _user_key(self) -> StateShape:
        return StateShape(self.user_key_schema or {}, {"type": "struct", "fields": []})

    @cached_property
    def key_columns(self) -> list[Mapping[str, Any]]:
        if self.kind == MAP:
            return [*self._group.key_columns, *self._user_key.key_columns]
        return self._group.key_columns

    @cached_property
    def key_serde(self) -> str:
        return "ordered" if self.kind == MAP else self._group.key_serde

    def key_value(self, key_row: tuple[Any, ...]) -> Any:
        """A map state's key row is (grouping key row, user key row): a pair of keys."""
        if self.kind == MAP:
            return (self._group.key_value(key_row[0]), self._user_key.key_value(key_row[1]))
        return self._group.key_value(key_row)

    def value_of(self, value_row: tuple[Any, ...]) -> Any:
        """A list state's or the timers' value row is (the list,): the list itself."""
        if self.kind in (LIST, TIMER):
            return [_json_ready(item) for item in value_row[0]]
        return super().value_of(value_row)

    @cached_property
    def _value_bytes(self):  # type: ignore[no-untyped-def]
        serialize = JsonSerde().serialize_keeping_non_finite
        value_of = self.value_of
        return lambda row: serialize(value_of(row))

    def stored_columns(self, rows: Any) -> tuple[pa.Array, pa.Array] | None:
        """``store_rows`` of a value state's or a map state's UnsafeRows at once
        (``StateShape.stored_columns``; the module docstring): the keys column-wise where
        their columns are strings, binaries and whole numbers, without nulls; values of
        numbers and booleans column-wise, other values row by row. ``None`` (the row path)
        for lists and timers (a key gathers several records), Avro rows, other key
        columns, and any record the row path treats apart or refuses."""
        if not isinstance(rows, VariableRows) or self.kind not in (VALUE, MAP):
            return None
        codec = rows.codec
        if codec.avro:
            return None
        records = StateRecords.of_mapping(rows.rows)
        if len(records.data) > _ARROW_OFFSETS:
            return None
        parts = codec.key_columns(records, self.kind)
        encoded = None if parts is None else self._key_bytes(records.data, parts)
        if encoded is None:
            return None
        import pyarrow.compute as pc

        stored = keyspace.kv_keys_arrow(encoded)
        order = pc.sort_indices(stored)
        stored = stored.take(order)
        n = len(stored)
        if n > 1 and pc.any(pc.equal(stored.slice(0, n - 1), stored.slice(1))).as_py():
            return None  # two records stored alike: the row path's to settle
        live = np.frombuffer(order.buffers()[1], dtype=np.uint64).astype(np.int64)
        values = self._value_column(records, live, codec)
        if values is None:
            return None
        return stored, values

    def _key_bytes(self, data: bytes, parts: list[list[Column]]) -> pa.Array | None:
        """The key serde's bytes of every record, from its key parts' columns (a value
        state's grouping key; a map state's grouping key and user key)."""
        import pyarrow as pa

        elements: list[Any] = []
        for columns in parts:
            arrays = []
            for column in columns:
                if column.nulls is not None:
                    return None
                if column.kind in ("string", "binary"):
                    array = binary_slices(data, column.values, column.sizes)  # type: ignore[arg-type]
                    if column.kind == "string":
                        try:  # UTF-8 checked; the row decoder replaces what is not
                            array = array.cast(pa.string())
                        except pa.ArrowInvalid:
                            return None
                elif column.kind in ("byte", "short", "integer", "long"):
                    # From its buffer: ``pa.array`` of numpy would import pandas.
                    values = np.ascontiguousarray(column.values)
                    kind = pa.from_numpy_dtype(values.dtype)
                    array = pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])
                else:
                    return None  # booleans and floats: left to the row path
                arrays.append(array)
            if self.kind == MAP:  # (grouping key, user key): a part of several columns nested
                elements.append(arrays[0] if len(arrays) == 1 else arrays)
            else:
                elements += arrays
        if self.key_serde == "string":
            return elements[0].cast(pa.binary())
        return encode_columns(elements)

    def _value_column(
        self, records: StateRecords, live: np.ndarray, codec: _Codec
    ) -> pa.Array | None:
        """The stored values of records ``live``, in that order: column-wise for values of
        numbers and booleans (``shape``'s JSON writer), else (or where it declines: NaN)
        row by row as ``store_rows`` writes them."""
        if self._bulk_values:
            columns = codec.value_columns(records, live)
            if columns is not None:
                values = json_objects(self._json_names, columns, records.data)
                if values is not None:
                    return values
        import pyarrow as pa

        value_bytes, decode = self._value_bytes, codec.value
        starts = records.value_starts[live].tolist()
        ends = (records.value_starts[live] + records.value_lengths[live]).tolist()
        data = records.data
        return pa.array(
            [value_bytes(decode(data[a:b])) for a, b in zip(starts, ends, strict=True)],
            pa.binary(),
        )

    @cached_property
    def _bulk_values(self) -> bool:
        """Whether values are written column-wise (``json_objects``'s columns)."""
        return self._distinct_names and all(
            isinstance(f["type"], str) and f["type"] in JSON_COLUMNS for f in self.value_fields
        )

    def manifest(
        self, store: OperatorStore, window_size_ms: int | None, provider: str
    ) -> StoreManifest:
        manifest = super().manifest(store, None, provider)
        properties = dict(manifest.properties)
        properties["spark_state_variable"] = store.variable
        properties["spark_state_variable_type"] = self.kind
        if self.kind == MAP:
            parts = [self._group.key_columns, self._user_key.key_columns]
            if any(len(p) != 1 for p in parts):  # a part of several columns is a tuple
                properties["key_columns"] = ["key", "user_key"]
                properties.pop("key_types")
        if self.kind in (LIST, TIMER):
            # The value is a JSON list, not an object of columns.
            properties.pop("value_schema")
            element = self.value_schema if self.kind == LIST else "bigint"
            properties["value_element_type"] = (
                element if isinstance(element, str) else _ddl(dict(element))
            )
        return replace(manifest, properties=properties)

    def partitioner(self) -> SparkHashPartitioner:
        group = self._group.partitioner()
        if self.kind != MAP:
            return group
        return _GroupRouting(group, self._group.key_serde, self.key_serde)


class _GroupRouting(SparkHashPartitioner):
    """Routes a map state's (grouping key, user key) by its grouping key alone: Spark
    shuffles the operator's input by the grouping key."""

    __slots__ = ("_group", "_group_serde", "_serde")
    routes_keys: ClassVar[bool] = True

    def __init__(self, group: SparkHashPartitioner, group_serde: str, serde: str) -> None:
        self._group = group
        self._group_serde = get_serde(group_serde)
        self._serde = get_serde(serde)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _GroupRouting) and other._group == self._group

    def __hash__(self) -> int:
        return hash((_GroupRouting, self._group))

    def partition(self, key_bytes: bytes, num_partitions: int) -> int:
        group = self._serde.deserialize(key_bytes)[0]
        return self._group.partition(self._group_serde.serialize(group), num_partitions)


# -- the rows ------------------------------------------------------------------------------
def state_rows(
    objects: ObjectStore,
    folder: str,
    version: int,
    plan: ReplayPlan,
    work_dir: str | os.PathLike[str],
    *,
    schema: StoreSchema,
    variable: StateVariable,
    conf: Mapping[str, str],
    row_checksums: bool,
) -> list[tuple[Any, Any]]:
    """The ``(key row, value row)`` pairs of ``variable`` at ``version`` of the partition
    in ``folder``, as ``TransformShape`` takes them (one per key: a list's elements and a
    key's timers gathered)."""
    where = f"{objects.where(folder)} version {version}"
    merge = conf.get(_MERGE_OPERATOR, "1")
    delimiter = _DELIMITERS.get(merge)
    if delimiter is None:
        raise UnsupportedStateError(f"not supported yet: RocksDB merge operator version {merge}")
    encoding = conf.get(_ENCODING, "unsaferow").lower()
    if encoding not in ("unsaferow", "avro"):
        raise UnsupportedStateError(f"not supported yet: state encoding format {encoding!r}")
    state = load_family_state(
        objects, folder, version, work_dir=work_dir, merge_delimiter=delimiter,
        row_checksums=row_checksums, plan=plan,
    )  # fmt: skip
    rows = split_families(state.rows, state.families, where).get(variable.family, {})
    family = schema.family(variable.family)
    codec = _Codec(family, encoding == "avro", where)
    return VariableRows(rows, codec, variable.kind, delimiter)


@dataclass(frozen=True, eq=False)
class VariableRows:
    """A state variable's rows at a version: its column family's live keys and values as
    stored (the family id taken off), and what decodes them. Iterating gives the
    ``(key row, value row)`` pairs ``TransformShape`` takes, one per key (a list's
    elements and a key's timers gathered): the row path; ``TransformShape.stored_columns``
    reads them column-wise where it can."""

    rows: dict[bytes, bytes]
    codec: _Codec
    kind: str
    delimiter: bytes

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        codec, rows = self.codec, self.rows
        if self.kind == VALUE:
            return ((codec.key(k), codec.value(v)) for k, v in rows.items())
        if self.kind == LIST:
            delimiter = self.delimiter
            return ((codec.key(k), (codec.elements(v, delimiter),)) for k, v in rows.items())
        if self.kind == MAP:
            return (
                ((_values(group[0]), _values(user_key[0])), codec.value(v))
                for k, v in rows.items()
                for group, user_key in [codec.prefix_key(k)]
            )
        timers: dict[tuple[Any, ...], list[int]] = {}
        for k in rows:
            group, rest = codec.prefix_key(k)
            timers.setdefault(_values(group[0]), []).append(rest[0])
        return iter([(key, (sorted(times),)) for key, times in timers.items()])


def _values(struct_value: Any) -> tuple[Any, ...]:
    """A decoded struct column (a dict) as a row of its columns."""
    return tuple(struct_value.values()) if isinstance(struct_value, dict) else (struct_value,)


class _Codec:
    """Decodes one column family's keys and values (module docstring)."""

    def __init__(self, family: ColumnFamilySchema, avro: bool, where: str) -> None:
        self.family = family
        self.avro = avro
        self.where = where
        key_schema = family.key_schema
        self._key = self._decoder(key_schema)
        self._value = self._decoder(family.value_schema)
        fields = key_schema.get("fields", [])
        self._first = self._decoder({"type": "struct", "fields": fields[:1]})
        self._rest = self._decoder({"type": "struct", "fields": fields[1:]})

    def _decoder(self, schema: Mapping[str, Any]) -> Any:
        return AvroRowDecoder(schema) if self.avro else RowDecoder(dict(schema))

    def _body(self, encoded: bytes, schema_id: int | None, what: str) -> bytes:
        """A row's bytes after its version byte (and, in Avro, the schema id it must
        have; ``None``: none is written)."""
        if not encoded or encoded[0] != _ENCODING_VERSION:
            raise StateFileError(
                f"{self.where}: a {what} of column family {self.family.name!r} not in "
                "Spark's state encoding (version byte 0)"
            )
        if not self.avro or schema_id is None:
            return encoded[1:]
        if len(encoded) < 3:
            raise StateFileError(f"{self.where}: a {what} cut short in {self.family.name!r}")
        (found,) = _SCHEMA_ID.unpack_from(encoded, 1)
        if found != schema_id:
            raise UnsupportedStateError(
                f"not supported yet: {what}s written under another schema (id {found}; the "
                f"schema file has {schema_id}) in column family {self.family.name!r}"
            )
        return encoded[3:]

    def key(self, encoded: bytes) -> tuple[Any, ...]:
        return self._key.decode(self._body(encoded, self.family.key_schema_id, "key"))

    def value(self, encoded: bytes) -> tuple[Any, ...]:
        return self._value.decode(self._body(encoded, self.family.value_schema_id, "value"))

    def prefix_key(self, encoded: bytes) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """A prefix-scan key's (first part's row, the rest's row)."""
        if len(encoded) < 4:
            raise StateFileError(f"{self.where}: a key cut short in {self.family.name!r}")
        (size,) = _INT32_LE.unpack_from(encoded)
        if not 0 < size <= len(encoded) - 4:
            raise StateFileError(
                f"{self.where}: a prefix-scan key of {self.family.name!r} with a bad length"
            )
        first = self._first.decode(self._body(encoded[4 : 4 + size], None, "key"))
        rest = self._rest.decode(self._body(encoded[4 + size :], self.family.key_schema_id, "key"))
        return first, rest

    # -- column-wise (UnsafeRows only: ``TransformShape.stored_columns``) ------------------
    def key_columns(self, records: StateRecords, kind: str) -> list[list[Column]] | None:
        """The key parts of every record, column-wise: a value state's grouping key, a map
        state's grouping key and user key (each part's struct unwrapped). ``None`` where a
        key is framed other than ``key`` and ``prefix_key`` take it (they then raise), or
        a part does not decode column-wise."""
        data, starts, lengths = records.data, records.key_starts, records.key_lengths
        if kind == VALUE:
            if not _versioned(data, starts, lengths):
                return None
            columns = self._key.decode_columns(data, starts + 1, lengths - 1)
            return None if columns is None else [columns]
        # [prefix length: int32 LE][0][first part's row][0][the rest's row]
        if len(starts) and int(lengths.min()) < 4:
            return None
        size = _words(data, starts, np.dtype("<i4")).astype(np.int64)
        if ((size <= 0) | (size >= lengths - 4)).any():
            return None
        rest = starts + 4 + size
        if not (_versioned(data, starts + 4, size) and _versioned(data, rest, lengths - 4 - size)):
            return None
        first = _part_columns(self._first, data, starts + 5, size - 1)
        second = _part_columns(self._rest, data, rest + 1, lengths - 5 - size)
        return None if first is None or second is None else [first, second]

    def value_columns(self, records: StateRecords, live: np.ndarray) -> list[Column] | None:
        """The values of records ``live`` column-wise (``None``: as ``key_columns``)."""
        data = records.data
        starts, lengths = records.value_starts[live], records.value_lengths[live]
        if not _versioned(data, starts, lengths):
            return None
        return self._value.decode_columns(data, starts + 1, lengths - 1)

    def elements(self, encoded: bytes, delimiter: bytes) -> list[dict[str, Any]]:
        """A list state's elements, in Spark's order, each a dict of its columns."""
        names = [f["name"] for f in self.family.value_schema.get("fields", [])]
        out, position, end = [], 0, len(encoded)
        while position < end:
            if out and delimiter:
                if encoded[position : position + len(delimiter)] != delimiter:
                    raise StateFileError(
                        f"{self.where}: list elements of {self.family.name!r} without the "
                        f"merge operator's delimiter {delimiter!r} between them"
                    )
                position += len(delimiter)
            if position + 4 > end:
                raise StateFileError(f"{self.where}: a list of {self.family.name!r} cut short")
            (size,) = _INT32_LE.unpack_from(encoded, position)
            if not 0 < size <= end - position - 4:
                raise StateFileError(
                    f"{self.where}: a list element of {self.family.name!r} with a bad length"
                )
            row = self.value(encoded[position + 4 : position + 4 + size])
            out.append(dict(zip(names, row, strict=True)))
            position += 4 + size
        return out


def _words(data: bytes, starts: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The ``dtype`` number at each of ``starts`` in ``data`` (every one inside it)."""
    if not len(starts):
        return np.zeros(0, dtype=dtype)
    window = np.lib.stride_tricks.sliding_window_view(np.frombuffer(data, np.uint8), dtype.itemsize)
    return window[starts].copy().view(dtype)[:, 0]


def _versioned(data: bytes, starts: np.ndarray, lengths: np.ndarray) -> bool:
    """Whether every row ``data[starts[i]:starts[i] + lengths[i]]`` is there and starts
    with Spark's encoding version byte (``_Codec._body``)."""
    if not len(starts):
        return True
    if int(lengths.min()) < 1:
        return False
    return not np.frombuffer(data, np.uint8)[starts].any()


def _part_columns(
    decoder: RowDecoder, data: bytes, starts: np.ndarray, lengths: np.ndarray
) -> list[Column] | None:
    """A key part's columns: the row's one field, or where that field is a struct
    (``{key: struct<...>}``, ``_inner_struct``) the struct's own columns."""
    outer = decoder.decode_columns(data, starts, lengths, structs=True)
    if outer is None or len(outer) != 1 or outer[0].kind != "struct":
        return outer
    (nested,) = outer
    if nested.nulls is not None:
        return None  # a null struct: the row path's
    inner = RowDecoder(dict(decoder.schema["fields"][0]["type"]))
    return inner.decode_columns(data, nested.values, nested.sizes)  # type: ignore[arg-type]
