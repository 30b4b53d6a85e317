"""Serdes by name: how keys and values become the bytes stored in RocksDB.

Why byte-compatible with Kafka: a store written by Spark from a Kafka topic should hold
the same key bytes a Kafka producer would send, so a murmur2 store puts each key in the
partition Kafka's default partitioner would (``toPositive(murmur2(key bytes)) %
partitions`` over those very bytes), and raw bytes read with a Kafka client's
deserializer mean the same thing. ``string``, ``bytes``, ``int32``, ``int64`` and
``double`` match Kafka's ``StringSerializer`` (UTF-8), ``ByteArraySerializer``,
``IntegerSerializer``, ``LongSerializer`` and ``DoubleSerializer``; ``json`` is compact
UTF-8 JSON; ``ordered`` is iqkit's order-preserving codec (:mod:`iqkit.store.encoding.ordered`).

Serdes are stateless frozen singletons looked up with :func:`get_serde`, so a manifest
only needs to store the name, and a serde pickles cheaply to Spark executors.

Errors: a value of the wrong type raises ``TypeError``, a value of the right type that
cannot be represented (out of range, NaN in JSON, a lone surrogate in UTF-8) raises
``ValueError``, and bytes that do not decode raise ``ValueError``; every message starts
with ``serde '<name>'`` and shows a shortened ``repr`` of the value, so the store layer
only has to prefix the store name.

``serialize`` sits on the hot path of every put and lookup: it checks the exact type
first and uses precompiled ``struct.Struct`` objects; subclasses and numpy scalars take
a slower branch. ``serialize_arrow`` does a whole Arrow column at once (Spark's bulk
writes hand over Arrow batches): it returns ``None`` where it has no vectorized path or
a value would not serialize, so the caller falls back to ``serialize`` per value, which
raises the usual message.

One home per serde: besides its bytes, a serde holds every fact the rest of iqkit needs
about its values, so a new serde means editing this file only: its Arrow type
(``arrow_type``) and whole-column decoder (``decode_arrow``, next to ``serialize_arrow``)
for tables and SQL; its Spark SQL type (``spark_ddl``, ``json_text``) for the Spark reader,
and the Spark column types it is the default for and accepts (``spark_default_for``,
``spark_accepts``) for the Spark writers; and an ``example`` literal for the panel.
pyarrow and numpy stay imported lazily, inside the methods that use them.
"""

from __future__ import annotations

import ast
import difflib
import json
import numbers
import operator
import re
import struct
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from iqkit.store.encoding.json_bytes import json_bytes, json_value
from iqkit.store.encoding.ordered import decode as _ordered_decode
from iqkit.store.encoding.ordered import encode as _ordered_encode
from iqkit.store.encoding.ordered import short_repr
from iqkit.store.encoding.serde_arrow import (
    arrow_numbers,
    binary_after,
    decode_fixed_arrow,
    fixed_width_binary,
    utf8_array,
    valid_mask,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "SERDE_NAMES",
    "all_serdes",
    "BytesSerde",
    "DoubleSerde",
    "Int32Serde",
    "Int64Serde",
    "JsonSerde",
    "OrderedSerde",
    "Serde",
    "StringSerde",
    "TextTooDeepError",
    "get_serde",
]

_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_DOUBLE = struct.Struct(">d")
_pack_f64, _unpack_f64 = _DOUBLE.pack, _DOUBLE.unpack


# Java's Double.doubleToLongBits collapses every NaN to this one bit pattern.
_JAVA_NAN = bytes.fromhex("7ff8000000000000")


class Serde(ABC):
    """Turns values of one type into bytes and back.

    Subclasses set ``name`` (the identifier stored in manifests) and
    ``order_preserving``: ``True`` when the byte order of serialized values equals
    their value order, so a RocksDB range scan returns keys in value order
    (``string``, ``bytes``, ``ordered``). Big-endian two's-complement ``int32``/
    ``int64`` and IEEE ``double`` are not: negative numbers sort after positive ones.
    """

    __slots__ = ()  # stateless: instances are immutable and compare by class
    name: ClassVar[str]
    order_preserving: ClassVar[bool] = False
    #: A literal as a user types it (``%iq get totals 42``), shown by the panel's fields.
    example: ClassVar[str]
    #: The Spark SQL type (DDL) of this serde's keys and values in a DataFrame read from a
    #: store.
    spark_ddl: ClassVar[str]
    #: True when typed readers (Spark) show the values as their compact JSON text: their
    #: shape varies from value to value, so no one column type fits them all.
    json_text: ClassVar[bool] = False
    #: Spark column types (``DataType.typeName()``) a Spark writer stores with this serde
    #: when none is named.
    spark_default_for: ClassVar[tuple[str, ...]] = ()
    #: Spark column types this serde can store; empty: any type with a JSON form.
    spark_accepts: ClassVar[tuple[str, ...]] = ()
    #: True when a key given in a list of keys (the Spark reader's ``keys`` option) is
    #: its text as typed (``"alice"``, ``"0x0a"``), not a JSON value.
    text_keys: ClassVar[bool] = False
    #: True when a column of this serde's Arrow type gives the serialized keys back
    #: (``serialize_arrow``) and its Parquet statistics bound them: a columnar twin then
    #: derives its RocksDB keys from the key column instead of storing them.
    keys_from_column: ClassVar[bool] = False

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash((Serde, self.name))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @abstractmethod
    def serialize(self, value: Any) -> bytes:
        """The bytes for ``value``; ``TypeError``/``ValueError`` naming the serde."""

    @abstractmethod
    def deserialize(self, data: bytes) -> Any:
        """The value for ``data``; ``ValueError`` naming the serde when malformed."""

    def deserialize_many(self, datas: Sequence[bytes], offset: int = 0) -> list[Any]:
        """Decode ``data[offset:]`` for every ``data`` in a chunk, at once.

        Why: scans decode thousands of rows, and per-row Python calls dominate their
        cost; serdes override this with C-level paths (one ``struct.unpack`` for fixed
        widths). ``offset`` skips a storage prefix without a separate slicing pass; the
        caller guarantees every ``data`` starts with the same ``offset`` bytes.
        """
        if offset:
            return [self.deserialize(d[offset:]) for d in datas]
        return list(map(self.deserialize, datas))

    def serialize_arrow(self, values: pa.Array) -> pa.Array | None:
        """Serialize a whole pyarrow column: a ``binary`` array, nulls kept as nulls, equal
        to ``serialize`` of each non-null value; ``None`` when this serde has no
        vectorized path for the column's type, or some value would not serialize
        (out of range, invalid UTF-8): the caller then serializes value by value, and
        ``serialize`` raises its usual message.
        """
        return None

    def arrow_type(self) -> pa.DataType | None:
        """Arrow's type for this serde's values, or ``None`` when they have none of their
        own (JSON values, tuples: the type is inferred from the values)."""
        return None

    def decode_arrow(self, datas: Sequence[bytes], offset: int = 0) -> pa.Array | None:
        """``data[offset:]`` of every ``data`` decoded as one Arrow column of
        ``arrow_type()``, equal to ``pa.array`` of ``deserialize`` of each; ``None`` when
        this serde has no bulk decoder or some value would not decode (the caller then
        decodes value by value, and ``deserialize`` raises its usual message). The
        counterpart of ``serialize_arrow``."""
        return None

    @abstractmethod
    def parse_text(self, text: str) -> Any:
        """Parse a user-typed literal (``%iq get totals 42``) into this serde's type.

        Why: the Jupyter magic and widget get keys as text; each serde knows what its
        text form looks like. Raises ``ValueError`` naming the serde.
        """

    # -- error helpers (slow path only) --------------------------------------------------
    def _type_error(self, value: Any, expected: str) -> TypeError:
        return TypeError(
            f"serde {self.name!r} cannot serialize {short_repr(value)} "
            f"({type(value).__name__}): expected {expected}"
        )

    def _value_error(self, value: Any, why: str) -> ValueError:
        return ValueError(
            f"serde {self.name!r} cannot serialize {short_repr(value)} "
            f"({type(value).__name__}): {why}"
        )

    def _malformed(self, data: Any, why: str) -> ValueError:
        if isinstance(data, (bytes, bytearray, memoryview)):
            size = f"{len(data)} bytes"
        else:
            size = type(data).__name__
        return ValueError(
            f"serde {self.name!r} cannot deserialize {short_repr(data)} ({size}): {why}"
        )

    def _unparsable(self, text: Any, why: str) -> ValueError:
        return ValueError(f"serde {self.name!r} cannot parse {short_repr(text)}: {why}")

    @staticmethod
    def _require_text(text: Any) -> str:
        if not isinstance(text, str):
            raise TypeError(f"parse_text expects str, got {type(text).__name__}")
        return text


# --- string ---------------------------------------------------------------------------
class StringSerde(Serde):
    """UTF-8 text, like Kafka's ``StringSerializer`` (its default encoding).

    Strict both ways: a ``str`` holding a lone surrogate raises ``ValueError`` (Java
    would silently write ``?``), and invalid UTF-8 raises on read instead of turning
    into U+FFFD, so corrupt keys are noticed rather than merged.
    """

    keys_from_column = True
    __slots__ = ()
    name: ClassVar[str] = "string"
    order_preserving: ClassVar[bool] = True  # UTF-8 byte order == code point order
    example: ClassVar[str] = "alice"
    spark_ddl: ClassVar[str] = "STRING"
    text_keys: ClassVar[bool] = True
    spark_default_for: ClassVar[tuple[str, ...]] = ("string",)
    spark_accepts: ClassVar[tuple[str, ...]] = ("string",)

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.string()

    def serialize(self, value: Any) -> bytes:
        if isinstance(value, str):
            try:
                return value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise self._value_error(value, f"not encodable as UTF-8 ({exc.reason})") from None
        raise self._type_error(value, "str")

    def serialize_arrow(self, values: pa.Array) -> pa.Array | None:
        import pyarrow as pa

        if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
            return None
        try:
            values.validate(full=True)  # Arrow strings may hold invalid UTF-8 (Spark's can)
        except pa.ArrowInvalid:
            return None
        return values.cast(pa.binary())  # UTF-8 bytes as they are: no copy

    def decode_arrow(self, datas: Sequence[bytes], offset: int = 0) -> pa.Array | None:
        array = binary_after(datas, offset)
        return None if array is None else utf8_array(array)

    def deserialize_many(self, datas: Sequence[bytes], offset: int = 0) -> list[Any]:
        try:
            if offset == 1 and datas:
                # One decode for the whole chunk: join, then split on the shared one-byte
                # prefix, valid when that byte occurs only as the prefix (the count says).
                sep = datas[0][:1]
                joined = b"".join(datas)
                if joined.count(sep) == len(datas):
                    return joined.decode().split(sep.decode())[1:]
            return [d[offset:].decode() for d in datas]  # bytes.decode: UTF-8, strict
        except (UnicodeDecodeError, AttributeError):
            return [self.deserialize(d[offset:]) for d in datas]  # raises the serde's message

    def deserialize(self, data: bytes) -> str:
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError as exc:
            raise self._malformed(data, f"invalid UTF-8 at byte {exc.start}") from None
        except TypeError:
            raise self._malformed(data, "expected bytes") from None

    def parse_text(self, text: str) -> str:
        """The text itself: quoting, if any, is the caller's (the magic's) business."""
        return self._require_text(text)


# --- bytes ----------------------------------------------------------------------------
class BytesSerde(Serde):
    """Raw bytes, like Kafka's ``ByteArraySerializer``; accepts any bytes-like value."""

    keys_from_column = True
    __slots__ = ()
    name: ClassVar[str] = "bytes"
    order_preserving: ClassVar[bool] = True
    example: ClassVar[str] = "0x0a0b"
    spark_ddl: ClassVar[str] = "BINARY"
    text_keys: ClassVar[bool] = True
    spark_default_for: ClassVar[tuple[str, ...]] = ("binary",)
    spark_accepts: ClassVar[tuple[str, ...]] = ("binary",)

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.binary()

    def serialize(self, value: Any) -> bytes:
        if type(value) is bytes:
            return value
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise self._type_error(value, "bytes, bytearray or memoryview")

    def serialize_arrow(self, values: pa.Array) -> pa.Array | None:
        import pyarrow as pa

        if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
            return None
        return values.cast(pa.binary())

    def decode_arrow(self, datas: Sequence[bytes], offset: int = 0) -> pa.Array | None:
        return binary_after(datas, offset)

    def deserialize(self, data: bytes) -> bytes:
        if type(data) is bytes:
            return data
        if isinstance(data, (bytearray, memoryview)):
            return bytes(data)
        raise self._malformed(data, "expected bytes")

    def parse_text(self, text: str) -> bytes:
        """``0x0a0b`` is hex, ``b'...'`` is a Python bytes literal, anything else UTF-8."""
        text = self._require_text(text)
        stripped = text.strip()
        if stripped[:2] in ("0x", "0X"):
            try:
                return bytes.fromhex(stripped[2:])
            except ValueError:
                raise self._unparsable(text, "invalid hex after 0x") from None
        if stripped[:2] in ("b'", 'b"'):
            try:
                value = ast.literal_eval(stripped)
            except (ValueError, SyntaxError):
                raise self._unparsable(text, "invalid bytes literal") from None
            if isinstance(value, bytes):
                return value
        return text.encode("utf-8")


# --- int32 / int64 ----------------------------------------------------------------------
def _as_int(serde: Serde, value: Any) -> int:
    """Slow path: int subclasses and numpy integers (anything with ``__index__``)."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise serde._type_error(value, "int")
    try:
        return operator.index(value)
    except TypeError:
        raise serde._type_error(value, "int") from None


def _parse_int(serde: Serde, text: str, lo: int, hi: int) -> int:
    text = serde._require_text(text)
    try:
        value = int(text)
    except ValueError:
        try:
            value = int(text.strip(), 0)  # 0x2a, 0o52, 0b101010
        except ValueError:
            raise serde._unparsable(text, "not an integer") from None
    if not lo <= value <= hi:
        raise serde._unparsable(text, f"out of range [{lo}, {hi}]")
    return value


def _unpack_fixed(
    serde: Serde, datas: Sequence[bytes], offset: int, code: str, width: int
) -> list[Any]:
    """Decode equal-width big-endian values with one ``struct.unpack`` call (``x`` pad
    bytes skip the ``offset`` prefix)."""
    if not datas:
        return []
    if set(map(len, datas)) != {width + offset}:
        return [serde.deserialize(d[offset:]) for d in datas]  # raises the serde's message
    fmt = f">{len(datas)}{code}" if not offset else ">" + ("x" * offset + code) * len(datas)
    return list(struct.unpack(fmt, b"".join(datas)))


class _BigEndianIntSerde(Serde):
    """Fixed-width big-endian two's complement; subclasses set the width."""

    keys_from_column = True
    __slots__ = ()
    CODE: ClassVar[str]
    WIDTH: ClassVar[int]
    MIN: ClassVar[int]
    MAX: ClassVar[int]
    _STRUCT: ClassVar[struct.Struct]

    def serialize(self, value: Any) -> bytes:
        if type(value) is not int:
            value = _as_int(self, value)
        try:
            return self._STRUCT.pack(value)
        except struct.error:
            raise self._value_error(value, f"out of range [{self.MIN}, {self.MAX}]") from None

    def serialize_arrow(self, values: pa.Array) -> pa.Array | None:
        import pyarrow as pa

        if not pa.types.is_integer(values.type):
            return None
        ints = arrow_numbers(values)
        valid = ints if not values.null_count else ints[valid_mask(values)]
        if len(valid) and (valid.min() < self.MIN or valid.max() > self.MAX):
            return None  # serialize raises the out-of-range message
        return fixed_width_binary(values, ints.astype(f">i{self.WIDTH}"), self.WIDTH)

    def decode_arrow(self, datas: Sequence[bytes], offset: int = 0) -> pa.Array | None:
        return decode_fixed_arrow(datas, offset, f">i{self.WIDTH}", self.arrow_type())

    def deserialize_many(self, datas: Sequence[bytes], offset: int = 0) -> list[Any]:
        return _unpack_fixed(self, datas, offset, self.CODE, self.WIDTH)

    def deserialize(self, data: bytes) -> int:
        try:
            return self._STRUCT.unpack(data)[0]
        except (struct.error, TypeError):
            raise self._malformed(data, f"expected exactly {self.WIDTH} bytes") from None

    def parse_text(self, text: str) -> int:
        return _parse_int(self, text, self.MIN, self.MAX)


class Int32Serde(_BigEndianIntSerde):
    """4-byte big-endian two's complement, like Kafka's ``IntegerSerializer``."""

    __slots__ = ()
    name: ClassVar[str] = "int32"
    CODE, WIDTH, _STRUCT = "i", 4, _INT32
    MIN: ClassVar[int] = -(2**31)
    MAX: ClassVar[int] = 2**31 - 1
    example: ClassVar[str] = "42"
    spark_ddl: ClassVar[str] = "INT"
    spark_default_for: ClassVar[tuple[str, ...]] = ("integer", "short", "byte")
    spark_accepts: ClassVar[tuple[str, ...]] = ("integer", "short", "byte")

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.int32()


class Int64Serde(_BigEndianIntSerde):
    """8-byte big-endian two's complement, like Kafka's ``LongSerializer``."""

    __slots__ = ()
    name: ClassVar[str] = "int64"
    CODE, WIDTH, _STRUCT = "q", 8, _INT64
    MIN: ClassVar[int] = -(2**63)
    MAX: ClassVar[int] = 2**63 - 1
    example: ClassVar[str] = "42"
    spark_ddl: ClassVar[str] = "BIGINT"
    spark_default_for: ClassVar[tuple[str, ...]] = ("long",)
    spark_accepts: ClassVar[tuple[str, ...]] = ("long", "integer", "short", "byte")

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.int64()


# --- double ---------------------------------------------------------------------------
class DoubleSerde(Serde):
    """8-byte IEEE-754 big-endian, like Kafka's ``DoubleSerializer``.

    Accepts ints too (a Python user writes ``1`` for ``1.0``; ints beyond 2**53 round
    like Java's ``(double)`` cast). Every NaN is written as Java's canonical NaN bit
    pattern (``doubleToLongBits``), so the bytes match what the JVM would produce.
    ``-0.0`` keeps its sign bit, as in Java.
    """

    __slots__ = ()
    name: ClassVar[str] = "double"
    example: ClassVar[str] = "1.5"
    spark_ddl: ClassVar[str] = "DOUBLE"
    spark_default_for: ClassVar[tuple[str, ...]] = ("double", "float")
    spark_accepts: ClassVar[tuple[str, ...]] = ("double", "float", "integer", "long")

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.float64()

    def serialize(self, value: Any) -> bytes:
        t = type(value)
        if t is not float:
            if t is int:
                value = self._int_to_float(value)
            elif isinstance(value, float):
                value = float(value)
            elif not isinstance(value, bool) and isinstance(value, numbers.Real):
                value = self._int_to_float(value)  # numpy scalars, Fraction
            else:
                raise self._type_error(value, "float or int")
        if value != value:
            return _JAVA_NAN
        return _pack_f64(value)

    def _int_to_float(self, value: Any) -> float:
        try:
            return float(value)
        except OverflowError:
            raise self._value_error(value, "too large for a double") from None

    def serialize_arrow(self, values: pa.Array) -> pa.Array | None:
        import numpy as np
        import pyarrow as pa

        t = values.type
        if not (pa.types.is_integer(t) or pa.types.is_float32(t) or pa.types.is_float64(t)):
            return None
        # float32 -> float64 is exact; int64 -> float64 rounds to nearest like float(int).
        floats = arrow_numbers(values).astype(np.float64)
        big = floats.astype(">f8")
        nan = np.isnan(floats)
        if nan.any():
            big[nan] = np.frombuffer(_JAVA_NAN, dtype=">f8")[0]  # Java's canonical NaN bits
        return fixed_width_binary(values, big, 8)

    def decode_arrow(self, datas: Sequence[bytes], offset: int = 0) -> pa.Array | None:
        return decode_fixed_arrow(datas, offset, ">f8", self.arrow_type())

    def deserialize_many(self, datas: Sequence[bytes], offset: int = 0) -> list[Any]:
        return _unpack_fixed(self, datas, offset, "d", 8)

    def deserialize(self, data: bytes) -> float:
        try:
            return _unpack_f64(data)[0]
        except (struct.error, TypeError):
            raise self._malformed(data, "expected exactly 8 bytes") from None

    def parse_text(self, text: str) -> float:
        """Python float syntax: ``1.5``, ``-2``, ``1e-3``, ``inf``, ``nan``."""
        text = self._require_text(text)
        try:
            return float(text)
        except ValueError:
            raise self._unparsable(text, "not a number") from None


# --- json -----------------------------------------------------------------------------
#: How deep a JSON literal typed as text (``parse_text``) may nest. Keys are flat or a
#: few levels deep; Python's JSON parser and the ordered codec recurse once per level,
#: so a deeper literal would end in a ``RecursionError`` at a depth that depends on the
#: caller's stack (about 800 inside IPython).
MAX_TEXT_DEPTH = 100
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")


class TextTooDeepError(ValueError):
    """A JSON literal nests deeper than ``MAX_TEXT_DEPTH``: not a value anyone typed, and
    not a plain word either (callers that take unparsable text as a string must not)."""


def _check_text_depth(serde: Serde, text: str) -> None:
    """Refuse ``text`` when its brackets (outside JSON strings) nest deeper than
    ``MAX_TEXT_DEPTH``; linear in the text, no recursion."""
    if "[" not in text and "{" not in text:
        return
    depth = 0
    for bracket in _BRACKETS.findall(_JSON_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > MAX_TEXT_DEPTH:
            raise TextTooDeepError(
                f"serde {serde.name!r} cannot parse {short_repr(text)}: nested more than "
                f"{MAX_TEXT_DEPTH} levels deep"
            )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_json_encode_non_finite = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=True
).encode
_json_decode = json.JSONDecoder().decode
_json_decode_strict = json.JSONDecoder(parse_constant=_reject_constant).decode


class JsonSerde(Serde):
    """Compact UTF-8 JSON (``separators=(",", ":")``, non-ASCII kept as UTF-8).

    Why these choices: compact separators match what Jackson and Spark's ``to_json``
    write; ``ensure_ascii=False`` keeps text readable and smaller. Writing refuses NaN
    and infinities (``allow_nan=False``) because they are not JSON and other readers
    (DuckDB, Jackson's defaults) reject them; reading accepts the ``NaN``/``Infinity``
    tokens that lenient writers emit. Tuples are written as JSON arrays and come back
    as lists. Dict key order is kept as given (as Kafka's and Spark's writers do), so
    as a *key* serde, ``{"a":1,"b":2}`` and ``{"b":2,"a":1}`` are different keys.
    ``None`` serializes to ``b"null"``; what a ``None`` value means (a delete) is the
    store's decision, not the serde's.

    The bytes are the stdlib ``json`` module's, to the byte (a JSON *key*'s bytes are its
    identity: a store written before must still find its keys), and so are the values
    read back: :mod:`iqkit.store.encoding.json_bytes` computes them with orjson where it
    agrees with the stdlib, with the stdlib everywhere else.
    """

    __slots__ = ()
    name: ClassVar[str] = "json"
    example: ClassVar[str] = 'alice or {"id": 1}'
    spark_ddl: ClassVar[str] = "STRING"
    json_text: ClassVar[bool] = True

    def serialize(self, value: Any) -> bytes:
        try:
            return json_bytes(value)
        except (TypeError, ValueError, RecursionError) as exc:
            raise self._encode_error(value, exc) from None

    def serialize_keeping_non_finite(self, value: Any) -> bytes:
        """``serialize``, but NaN and infinities written as the ``NaN``/``Infinity``
        tokens ``deserialize`` accepts. For values iqkit did not choose (a Spark
        checkpoint's state, where a ``max`` over doubles may be NaN): refusing them would
        lose the row, and writing ``null`` would change it."""
        try:
            return _json_encode_non_finite(value).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as exc:
            raise self._encode_error(value, exc) from None

    def _encode_error(self, value: Any, exc: Exception) -> Exception:
        """The error for a value the encoder refused (``UnicodeEncodeError`` is a
        ``ValueError``, so it is told apart first)."""
        if isinstance(exc, TypeError):
            return self._type_error(value, f"a JSON-serializable value ({exc})")
        if isinstance(exc, UnicodeEncodeError):
            return self._value_error(value, f"not encodable as UTF-8 ({exc.reason})")
        return self._value_error(value, str(exc))

    def deserialize(self, data: bytes) -> Any:
        try:
            return json_value(data)
        except UnicodeDecodeError as exc:
            raise self._malformed(data, f"invalid UTF-8 at byte {exc.start}") from None
        except ValueError as exc:
            raise self._malformed(data, f"invalid JSON ({exc})") from None
        except TypeError:
            raise self._malformed(data, "expected bytes") from None

    def parse_text(self, text: str) -> Any:
        """Strict JSON: ``42``, ``"abc"``, ``[1, 2]``, ``{"a": 1}``; bare words fail."""
        text = self._require_text(text)
        _check_text_depth(self, text)
        try:
            return _json_decode_strict(text)
        except ValueError as exc:
            raise self._unparsable(text, f"invalid JSON ({exc})") from None


# --- ordered --------------------------------------------------------------------------
def _json_to_ordered(serde: Serde, text: str, value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_json_to_ordered(serde, text, v) for v in value)
    if isinstance(value, dict):
        raise serde._unparsable(text, "JSON objects cannot be ordered keys; use a list")
    return value


class OrderedSerde(Serde):
    """The order-preserving tuple codec (:mod:`iqkit.store.encoding.ordered`).

    Byte order equals value order, so range queries over numeric keys work and tuple
    keys support prefix scans. ``deserialize`` returns the bare value for a one-element
    key and a tuple otherwise (``encode(v) == encode((v,))``).
    """

    __slots__ = ()
    name: ClassVar[str] = "ordered"
    order_preserving: ClassVar[bool] = True
    example: ClassVar[str] = '[1, "a"]'
    spark_ddl: ClassVar[str] = "STRING"
    json_text: ClassVar[bool] = True

    def serialize(self, value: Any) -> bytes:
        return _ordered_encode(value)

    def deserialize(self, data: bytes) -> Any:
        return _ordered_decode(data)

    def parse_text(self, text: str) -> Any:
        """JSON literal with arrays as tuples (``[1, "a"]`` -> ``(1, 'a')``, ``7`` -> 7);
        text that is not JSON is taken as a plain string (``abc`` -> ``'abc'``).
        """
        text = self._require_text(text)
        _check_text_depth(self, text)
        try:
            value = _json_decode(text)
        except ValueError:
            return text
        return _json_to_ordered(self, text, value)


# --- registry -------------------------------------------------------------------------
_SERDES: dict[str, Serde] = {
    s.name: s
    for s in (
        StringSerde(),
        BytesSerde(),
        Int32Serde(),
        Int64Serde(),
        DoubleSerde(),
        JsonSerde(),
        OrderedSerde(),
    )
}
SERDE_NAMES: tuple[str, ...] = tuple(_SERDES)


def all_serdes() -> tuple[Serde, ...]:
    """Every serde, in ``SERDE_NAMES`` order: for tables of facts built from them."""
    return tuple(_SERDES.values())


# Names people bring from Kafka (Serdes.Integer(), Serdes.Long()...) and Python; used
# only to suggest the right name, never accepted silently (names live in manifests).
_HINTS = {
    "str": "string",
    "text": "string",
    "utf8": "string",
    "bytearray": "bytes",
    "binary": "bytes",
    "int": "int32",
    "integer": "int32",
    "long": "int64",
    "float": "double",
    "float64": "double",
    "tuple": "ordered",
}


def get_serde(name: str | Serde) -> Serde:
    """The serde called ``name`` (a ``Serde`` instance is returned as is).

    Names are exact (lower case), because they are stored in manifests and compared;
    an unknown name raises ``ValueError`` listing the known ones, with a suggestion.
    """
    if isinstance(name, Serde):
        return name
    if not isinstance(name, str):
        raise TypeError(f"serde name must be a str, got {type(name).__name__}")
    serde = _SERDES.get(name)
    if serde is not None:
        return serde
    msg = f"unknown serde {name!r}"
    key = name.strip().lower()
    hint = _HINTS.get(key)
    if hint is None:
        close = difflib.get_close_matches(key, SERDE_NAMES, n=1, cutoff=0.6)
        hint = close[0] if close else None
    if hint is not None:
        msg += f"; did you mean {hint!r}?"
    msg += f" (known serdes: {', '.join(SERDE_NAMES)})"
    raise ValueError(msg)
