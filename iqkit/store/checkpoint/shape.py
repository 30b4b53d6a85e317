"""A Spark state store's shape as an iqkit store: the manifest made from its key and value
schemas, its rows turned into iqkit's row layout, and the partitioner that routes its keys.

The one place that knows how Spark's state rows map to iqkit's, so the format, the
snapshot and the tests all agree:

* **Keys.** A single key column is its value, several are a tuple in key-schema order
  (the ``ordered`` serde, whose byte order is value order, so range and prefix scans on
  the leading columns work); a single string column uses the ``string`` serde. Dates and
  timestamps in keys become ISO-8601 text (``2026-11-27``, ``2026-11-27T09:00:00.000001Z``;
  without the ``Z`` for ``timestamp_ntz``), which sorts like the instants for years 1 to
  9999. A decimal key column is refused in one line (its text would not sort).
* **Windows.** A key column named ``window`` holding ``struct<start: timestamp, end:
  timestamp>`` (what ``groupBy(window(...))`` keeps) makes a window store: the other key
  columns are the key, the window's start its start, and the store's window size the
  first window's length. Spark hashes the window into the partition, so a window key's
  windows lie in several partitions and window queries ask every partition.
* **Values.** A JSON object of the value schema's columns (the ``json`` serde), with the
  value schema recorded as the manifest's ``value_schema`` so SQL, Arrow and pandas get
  typed columns; dates and timestamps as ISO-8601 text, decimals as their exact digits in
  text, bytes as ``0x<hex>``.
* **Partitions.** Spark's ``pmod(hash(key columns), n)`` (``encoding.spark_hash``).

The commonest shape, one string key column and values of numbers and booleans (most
aggregations), is also made a whole version at a time (``stored_columns``): the same
bytes, from numpy and Arrow columns instead of a Python object per row. Its property
test (tests/store/checkpoint/test_shape.py) holds it to ``store_rows``, byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ...errors import IqkitError
from ..encoding import keyspace
from ..encoding.partitioners import SparkHashPartitioner
from ..encoding.serdes import JsonSerde, get_serde
from ..encoding.spark_hash import SparkKeyHasher
from ..kinds import StoreKind
from ..manifest import StoreManifest
from .state_records import StateRows, binary_slices
from .unsafe_row import Column

if TYPE_CHECKING:
    import pyarrow as pa

    from .layout import OperatorStore  # layout's store names need transform, which needs this

__all__ = [
    "JSON_COLUMNS",
    "StateShape",
    "UnsupportedStateError",
    "json_objects",
    "stored_text_keys",
]

#: The key column ``groupBy(window(...))`` adds.
WINDOW_COLUMN = "window"

#: Spark's JSON type names and their DDL spelling where they differ.
_DDL = {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint"}


class UnsupportedStateError(IqkitError, ValueError):
    """A state store iqkit cannot serve (yet): one line naming what is not supported."""


def _ddl(spark_type: Any) -> str:
    """Spark's JSON form of a type as DDL (``{"type": "array", ...}`` → ``array<...>``)."""
    if isinstance(spark_type, str):
        return _DDL.get(spark_type, spark_type)
    kind = spark_type.get("type")
    if kind == "struct":
        fields = ", ".join(f"`{f['name']}`: {_ddl(f['type'])}" for f in spark_type["fields"])
        return f"struct<{fields}>"
    if kind == "array":
        return f"array<{_ddl(spark_type['elementType'])}>"
    if kind == "map":
        return f"map<{_ddl(spark_type['keyType'])}, {_ddl(spark_type['valueType'])}>"
    raise UnsupportedStateError(f"not supported yet: a state column of type {kind!r}")


def _is_window(field: Mapping[str, Any]) -> bool:
    kind = field.get("type")
    if field.get("name") != WINDOW_COLUMN or not isinstance(kind, dict):
        return False
    names = [(f["name"], f["type"]) for f in kind.get("fields", [])]
    return names == [("start", "timestamp"), ("end", "timestamp")]


def _iso_timestamp(value: datetime) -> str:
    """An instant as fixed-width ISO-8601 UTC text (sorts like the instants)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _json_ready(value: Any) -> Any:
    """``value`` (a decoded state column) as the JSON serde can write it."""
    if isinstance(value, datetime):
        return _iso_timestamp(value) if value.tzinfo else value.isoformat(timespec="microseconds")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    if isinstance(value, Mapping):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    return value


#: Key column types whose values iqkit holds as text (module docstring), and how.
_KEY_PARTS: dict[str, Callable[[Any], Any]] = {
    "date": date.isoformat,
    "timestamp": _iso_timestamp,
    "timestamp_ntz": lambda v: v.isoformat(timespec="microseconds"),
}
#: Value column types holding whole numbers or booleans (``StateShape._value_bytes``).
_WHOLE = frozenset({"integer", "long", "short", "byte", "boolean"})
#: JSON's words for a boolean column's values.
_BOOLEAN_WORDS: dict[bool | None, str] = {None: "null", True: "true", False: "false"}


def _number_text(value: int | None) -> int | str:
    return "null" if value is None else value


#: Value column types JSON writes as they are.
_PLAIN = frozenset({"string", "integer", "long", "short", "byte", "boolean", "double", "float"})
#: Value column types ``stored_columns`` writes (JSON numbers and booleans).
_BULK_VALUES = frozenset({"integer", "long", "short", "byte", "boolean", "double", "float"})
#: Arrow holds offsets into a ``binary`` column's bytes (and views' offsets) in 32 bits.
_ARROW_OFFSETS = 2**31 - 1


def _epoch_ms(value: datetime) -> int:
    delta = value - datetime(1970, 1, 1, tzinfo=UTC)
    return delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000


@dataclass(frozen=True)
class StateShape:
    """One state store's key and value schemas (Spark's JSON ``StructType`` dicts) and
    what they make in iqkit (module docstring)."""

    key_schema: Mapping[str, Any]
    value_schema: Mapping[str, Any]

    #: Whether each of Spark's rows is one stored row, so that a version can be built on
    #: an older version's database plus the rows its batches changed (``materialize``).
    replays_changes: ClassVar[bool] = True

    # -- columns ---------------------------------------------------------------------------
    @cached_property
    def key_fields(self) -> list[Mapping[str, Any]]:
        return list(self.key_schema.get("fields", []))

    @cached_property
    def value_fields(self) -> list[Mapping[str, Any]]:
        return list(self.value_schema.get("fields", []))

    @cached_property
    def window_index(self) -> int | None:
        """Where the window column is among the key columns (``None``: no window)."""
        for i, f in enumerate(self.key_fields):
            if _is_window(f):
                return i
        return None

    @cached_property
    def key_columns(self) -> list[Mapping[str, Any]]:
        """The key columns iqkit's key is made of (the window column left out)."""
        w = self.window_index
        return [f for i, f in enumerate(self.key_fields) if i != w]

    @cached_property
    def key_serde(self) -> str:
        columns = self.key_columns
        if len(columns) == 1 and columns[0]["type"] == "string":
            return "string"
        return "ordered"

    def check(self) -> None:
        """``UnsupportedStateError`` naming the first column iqkit cannot serve."""
        for f in self.key_columns:
            kind = f["type"]
            if isinstance(kind, str) and kind.startswith("decimal"):
                raise UnsupportedStateError(
                    f"not supported yet: a decimal key column ({f['name']!r}: {kind})"
                )
            if not isinstance(kind, str):
                raise UnsupportedStateError(
                    f"not supported yet: a key column of type {_ddl(kind)} ({f['name']!r})"
                )
        for f in self.value_fields:
            _ddl(f["type"])

    # -- the manifest ----------------------------------------------------------------------
    def manifest(
        self, store: OperatorStore, window_size_ms: int | None, provider: str
    ) -> StoreManifest:
        """The manifest iqkit serves ``store`` under (``window_size_ms``: a window
        store's window length, from its first window; ``provider``: the state store
        provider that wrote it, for ``%iq stores``)."""
        self.check()
        windowed = self.window_index is not None
        columns = self.key_columns
        properties: dict[str, Any] = {
            "key_columns": [f["name"] for f in columns],
            "key_types": [_ddl(f["type"]) for f in columns],
            "value_schema": ", ".join(
                f"`{f['name']}` {_ddl(f['type'])}" for f in self.value_fields
            ),
            "spark_key_schema": dict(self.key_schema),
            "spark_value_schema": dict(self.value_schema),
            "spark_operator": store.operator_name,
            "spark_operator_id": store.operator_id,
            "spark_store_name": store.store_name,
            "spark_provider": provider,
        }
        return StoreManifest(
            name=store.name,
            kind=StoreKind.WINDOW if windowed else StoreKind.KEY_VALUE,
            partitions=store.partitions,
            key_serde=self.key_serde,
            value_serde="json",
            partitioner=SparkHashPartitioner.name,
            window_size_ms=(window_size_ms or 1) if windowed else None,
            properties=properties,
        )

    # -- rows ------------------------------------------------------------------------------
    @cached_property
    def _key_parts(self) -> list[tuple[int, Callable[[Any], Any] | None]]:
        """Per iqkit key column: its index in Spark's key row and what turns its value
        into iqkit's (``None``: the value as it is)."""
        w = self.window_index
        return [(i, _KEY_PARTS.get(f["type"])) for i, f in enumerate(self.key_fields) if i != w]

    def key_value(self, key_row: tuple[Any, ...]) -> Any:
        """The iqkit key of a decoded Spark key row: its value, or a tuple."""
        parts = [
            row if (row := key_row[i]) is None or convert is None else convert(row)
            for i, convert in self._key_parts
        ]
        return parts[0] if len(parts) == 1 else tuple(parts)

    @cached_property
    def _plain_values(self) -> bool:
        """Whether every value column holds what JSON writes as it is (numbers, text,
        booleans): then a row needs no conversion."""
        return all(isinstance(f["type"], str) and f["type"] in _PLAIN for f in self.value_fields)

    def value_of(self, value_row: tuple[Any, ...]) -> dict[str, Any]:
        """The iqkit value of a decoded Spark value row: a dict of its columns."""
        names = self._value_names
        if self._plain_values:
            return dict(zip(names, value_row, strict=True))
        return {n: _json_ready(v) for n, v in zip(names, value_row, strict=True)}

    @cached_property
    def _value_names(self) -> list[str]:
        return [f["name"] for f in self.value_fields]

    @cached_property
    def _value_bytes(self) -> Callable[[tuple[Any, ...]], bytes]:
        """What turns a decoded value row into the json serde's bytes. A row of only
        whole numbers and booleans (counts, sums of integers: most aggregation states)
        is written through one format string, byte for byte what the serde writes for
        it, at a fraction of the cost; any other row goes through the serde."""
        # Spark's state may hold NaN or an infinity (a max over doubles): kept, as tokens.
        serialize = JsonSerde().serialize_keeping_non_finite
        value_of = self.value_of
        kinds = [f["type"] for f in self.value_fields]
        if not self._distinct_names or not all(isinstance(k, str) and k in _WHOLE for k in kinds):
            return lambda row: serialize(value_of(row))
        template = "{" + ",".join(f"{n.replace('%', '%%')}:%s" for n in self._json_names) + "}"
        if "boolean" not in kinds:

            def encode_numbers(row: tuple[Any, ...]) -> bytes:
                return (template % tuple("null" if v is None else v for v in row)).encode()

            return encode_numbers
        # True == 1 in Python: booleans are looked up by field, never mixed with numbers.
        words = [_BOOLEAN_WORDS.__getitem__ if k == "boolean" else _number_text for k in kinds]

        def encode(row: tuple[Any, ...]) -> bytes:
            return (template % tuple(w(v) for w, v in zip(words, row, strict=True))).encode()

        return encode

    @cached_property
    def _distinct_names(self) -> bool:
        """Whether the value columns have names, none twice (the JSON object's members
        are then the columns, in order; a name twice is one member of ``value_of``)."""
        names = self._value_names
        return bool(names) and len(set(names)) == len(names)

    @cached_property
    def _json_names(self) -> list[str]:
        """The value columns' names as JSON writes them (quoted, escaped)."""
        return [json.dumps(n, ensure_ascii=False) for n in self._value_names]

    def window_size_ms(self, key_rows: Iterable[tuple[Any, ...]]) -> int | None:
        """The length of the first window among ``key_rows`` (``None``: none there)."""
        w = self.window_index
        if w is None:
            return None
        for row in key_rows:
            window = row[w]
            if window and window.get("start") is not None and window.get("end") is not None:
                return max(1, _epoch_ms(window["end"]) - _epoch_ms(window["start"]))
        return None

    def store_rows(
        self, rows: Iterable[tuple[tuple[Any, ...], tuple[Any, ...]]]
    ) -> Iterator[tuple[bytes, bytes]]:
        """Decoded ``(key row, value row)`` pairs as iqkit's stored ``(key, value)`` bytes
        (both of a window store's index entries for a window)."""
        key_of, value_bytes_of = self.key_value, self._value_bytes
        serialize_key = get_serde(self.key_serde).serialize
        w = self.window_index
        if w is None:
            kv_key = keyspace.kv_key
            for key_row, value_row in rows:
                yield kv_key(serialize_key(key_of(key_row))), value_bytes_of(value_row)
            return
        for key_row, value_row in rows:
            key_bytes = serialize_key(key_of(key_row))
            value_bytes = value_bytes_of(value_row)
            start = _epoch_ms(key_row[w]["start"])
            yield keyspace.window_key(key_bytes, start), value_bytes
            yield keyspace.window_time_key(key_bytes, start), b""

    def stored_keys(self, key_row: tuple[Any, ...]) -> list[bytes]:
        """The stored keys ``store_rows`` gives a key row (a window store's two index
        entries): what a removal of that key removes."""
        key_bytes = get_serde(self.key_serde).serialize(self.key_value(key_row))
        w = self.window_index
        if w is None:
            return [keyspace.kv_key(key_bytes)]
        start = _epoch_ms(key_row[w]["start"])
        return [keyspace.window_key(key_bytes, start), keyspace.window_time_key(key_bytes, start)]

    def stored_columns(self, rows: StateRows) -> tuple[pa.Array, pa.Array] | None:
        """``store_rows`` of all of ``rows`` at once, sorted: iqkit's stored keys (each
        once, in byte order) and values, as two Arrow ``binary`` columns, byte for byte
        what ``store_rows`` gives for the live records. For a store of one string key
        column (no window) and values of numbers and booleans; ``None`` for any other
        shape, and for records ``store_rows`` treats apart (a null key, a key that is not
        UTF-8, a value that is not a JSON number, two keys it would store alike) or that
        the decoders would refuse: then ``store_rows`` takes them.

        Which record of a key is live is settled by the sort the keys need anyway: a
        stable sort keeps a key's records in replay order, so each run of equal stored
        keys ends with the key's last record (its value, or a removal: no row)."""
        if not self._bulk_shape:
            return None
        records = rows.records
        if len(records.data) > _ARROW_OFFSETS:
            return None
        keys = rows.keys.decode_columns(records.data, records.key_starts, records.key_lengths)
        if keys is None:
            return None
        import pyarrow as pa

        stored = stored_text_keys(records.data, keys[0])
        if stored is None:
            return None
        live = records.live_sorted([stored])
        if live is None:
            # Records of different Spark keys stored alike would be two rows of one key
            # in store_rows (which fails on them): left to it.
            return None
        values = rows.values.decode_columns(
            records.data, records.value_starts[live], records.value_lengths[live]
        )
        stored_values = (
            None if values is None else json_objects(self._json_names, values, records.data)
        )
        if stored_values is None:
            return None
        return stored.take(pa.array(live)), stored_values

    @cached_property
    def _bulk_shape(self) -> bool:
        """Whether ``stored_columns`` serves this shape (its docstring)."""
        return (
            self.window_index is None
            and len(self.key_fields) == 1
            and self.key_serde == "string"
            and self._distinct_names
            and all(isinstance(f["type"], str) and f["type"] in _BULK_VALUES
                    for f in self.value_fields)
        )  # fmt: skip

    # -- routing ---------------------------------------------------------------------------
    def partitioner(self) -> SparkHashPartitioner:
        """What routes this store's keys: Spark's hash of the typed key columns; a window
        store's keys cannot be routed (the window is hashed in too)."""
        if self.window_index is not None:
            return SparkHashPartitioner()
        return _KeyRouting(self)


def stored_text_keys(data: bytes, column: Column) -> pa.Array | None:
    """iqkit's stored keys (``kv_key``, the ``string`` serde) of a decoded string key
    column whose bytes lie in ``data``, as an Arrow ``binary`` column; ``None`` when a key
    is null or not UTF-8 (the row decoder replaces what is not: ``store_rows`` takes
    those)."""
    import pyarrow as pa

    if column.kind != "string" or column.nulls is not None:
        return None
    text = binary_slices(data, column.values, column.sizes)
    try:
        text.cast(pa.string())  # UTF-8 checked
    except pa.ArrowInvalid:
        return None
    return keyspace.kv_keys_arrow(text)


#: Value column types ``json_objects`` writes.
JSON_COLUMNS = frozenset({*_BULK_VALUES, "string", "date", "timestamp", "timestamp_ntz"})
#: The dates and instants ``json_objects`` writes (``_json_ready``'s ISO-8601 text):
#: years 1000 to 9999 (``strftime``'s ``%Y`` does not pad years below 1000; Python's
#: dates end at 9999), as days or microseconds since 1970-01-01.
_FIRST_DAY = date(1000, 1, 1).toordinal() - date(1970, 1, 1).toordinal()
_DAY_AFTER = date.max.toordinal() + 1 - date(1970, 1, 1).toordinal()
_FIRST_MICRO, _MICRO_AFTER = _FIRST_DAY * 86_400_000_000, _DAY_AFTER * 86_400_000_000
#: Characters JSON writes escaped in a string (Python's encoder: quote, backslash, the
#: control characters; nothing else with ``ensure_ascii=False``).
_JSON_ESCAPED = r'[\x00-\x1f"\\]'


def json_objects(names: list[str], columns: list[Column], data: bytes) -> pa.Array | None:
    """One JSON object per row, ``names`` (as JSON writes them) its members and
    ``columns`` (``RowDecoder.decode_columns``' of rows in ``data``) their values, as
    ``JsonSerde.serialize_keeping_non_finite`` writes ``value_of`` of each row (compact
    separators), as an Arrow ``binary`` column; ``None`` when a column is not one of
    ``JSON_COLUMNS`` or a value is one written apart: NaN or an infinity, a string that
    is not UTF-8, a date or instant outside ``_FIRST_DAY``.. ``_DAY_AFTER``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    pieces: list[Any] = []
    for index, (name, column) in enumerate(zip(names, columns, strict=True)):
        text = _json_texts(column, data)
        if text is None:
            return None
        pieces += [pa.scalar(("{" if index == 0 else ",") + name + ":"), text]
    pieces.append(pa.scalar("}"))
    try:
        joined = pc.binary_join_element_wise(
            *pieces, "", null_handling="replace", null_replacement="null"
        )
    except (pa.ArrowCapacityError, pa.ArrowInvalid):
        return None  # past 2 GiB of text (32-bit offsets): left to store_rows
    return joined.cast(pa.binary())


def _json_texts(column: Column, data: bytes) -> pa.Array | None:
    """Each value of ``column`` as JSON text (null where it is null), or ``None``
    (``json_objects``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values, nulls = column.values, column.nulls
    kind = column.kind
    if kind in ("float", "double"):
        finite = np.isfinite(values)
        if nulls is not None:
            finite |= nulls
        if not finite.all():
            return None
        # Python's repr is what the serde writes for a float; Arrow's own float
        # text differs from it (``1`` for 1.0, other exponent rules).
        return pa.array(
            list(map(float.__repr__, values.astype(np.float64).tolist())), pa.string(), mask=nulls
        )
    if kind == "string":
        assert column.sizes is not None
        starts, sizes = values, column.sizes
        if nulls is not None:  # a null's slot means nothing: an empty slice instead
            starts, sizes = np.where(nulls, 0, starts), np.where(nulls, 0, sizes)
        try:
            text = binary_slices(data, starts, sizes).cast(pa.string())
        except pa.ArrowInvalid:
            return None  # not UTF-8: the row decoder replaces it
        if nulls is not None:
            text = pc.if_else(pa.array(nulls), pa.nulls(len(text), pa.string()), text)
        quoted = pc.binary_join_element_wise('"', text, '"', "")
        escaped = pc.match_substring_regex(text, _JSON_ESCAPED).fill_null(False)
        if pc.any(escaped).as_py():
            # The few that need escapes are written by the encoder itself.
            written = map(_json_string, text.filter(escaped).to_pylist())
            quoted = pc.replace_with_mask(quoted, escaped, pa.array(written, pa.string()))
        return quoted
    if kind in ("date", "timestamp", "timestamp_ntz"):
        first, after, unit = (
            (_FIRST_DAY, _DAY_AFTER, "D") if kind == "date" else (_FIRST_MICRO, _MICRO_AFTER, "us")
        )
        inside = (values >= first) & (values < after)
        if nulls is not None:
            inside |= nulls
        if not inside.all():
            return None
        days_or_micros = values if nulls is None else np.where(nulls, 0, values)
        text = np.datetime_as_string(days_or_micros.astype(f"datetime64[{unit}]"), unit=unit)
        end = '"' if kind != "timestamp" else 'Z"'  # an instant in UTC; a wall-clock time
        return pc.binary_join_element_wise('"', pa.array(text, mask=nulls), end, "")
    if kind in _BULK_VALUES:
        # integers as decimal digits, booleans as true and false: as JSON writes them
        return pa.array(values, mask=nulls).cast(pa.string())
    return None


_json_string = json.JSONEncoder(ensure_ascii=False).encode


class _KeyRouting(SparkHashPartitioner):
    """``spark_hash`` for one store's key schema: iqkit's key bytes decoded back to the
    typed Spark columns, then hashed as Spark hashes them."""

    __slots__ = ("_columns", "_decode", "_hasher", "_schema")
    routes_keys: ClassVar[bool] = True

    def __init__(self, shape: StateShape) -> None:
        self._decode = get_serde(shape.key_serde).deserialize
        self._columns = [f["type"] for f in shape.key_columns]
        # The key's own columns are what Spark hashes (a session store's key row also
        # holds the session start, which its shuffle does not hash).
        schema = {"type": "struct", "fields": list(shape.key_columns)}
        self._schema = json.dumps(schema, sort_keys=True)
        self._hasher = SparkKeyHasher(schema)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _KeyRouting) and other._schema == self._schema

    def __hash__(self) -> int:
        return hash((_KeyRouting, self._schema))

    def partition(self, key_bytes: bytes, num_partitions: int) -> int:
        key = self._decode(key_bytes)
        parts = (key,) if len(self._columns) == 1 else tuple(key)
        typed = tuple(_typed(v, t) for v, t in zip(parts, self._columns, strict=True))
        return self._hasher.partition(typed[0] if len(typed) == 1 else typed, num_partitions)


def _typed(value: Any, kind: str) -> Any:
    """A key part as iqkit holds it back to the Python value Spark's hash expects."""
    if value is None or not isinstance(value, str):
        return value
    if kind == "date":
        return date.fromisoformat(value)
    if kind == "timestamp":
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    if kind == "timestamp_ntz":
        return datetime.fromisoformat(value)
    return value
