"""Arrow columns as JSON text, exactly as Spark's ``to_json`` writes them: what the
bulk writes that encode in Python write as JSON values and records (``arrow_encode``:
``StoreWriter.put_table`` and the ``iqkit`` data source's tasks), so a store they write
reads back like one ``write_store`` (Spark's own ``to_json``) wrote.

Vectorized in Arrow for strings, numbers and booleans; other types go value by value
through the spellings here (timestamps to the microsecond, ``JSON_OPTIONS``, which
``write_store`` gives Spark's ``to_json`` too; decimals as their digits; doubles as Java
spells them; binary as base64; maps, lists and structs without null fields)."""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# NaN and infinities are refused before encoding (arrow_encode.arrow_has_non_finite); JSON has no
# such numbers, so one reaching the encoder fails the task rather than being written.
_json_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def json_records(batch: pa.RecordBatch, names: Sequence[str]) -> pa.Array:
    """One JSON object per row (a ``string`` array, never null: a record of nulls is
    ``{}``), decoding to what ``to_json(struct(...))`` writes: null fields are left out.

    Built in Arrow with one ``binary_join_element_wise`` over the pieces ``{``, per field
    ``"name":`` and its value's pieces (``_text_pieces``), and ``}``: no per-row Python
    for columns of strings, numbers and booleans, and no join per column where a
    column has no nulls (a column with nulls becomes one array of its pieces first,
    ``""`` where null). The separating comma goes before every field but the first
    present one: with a first column that has no nulls that is simply every later
    field; otherwise a comma goes before every field and the one after ``{`` is cut
    off (a slower kernel). Adjacent constant pieces are joined first (``_join``)."""
    if not names:
        return pa.array(np.full(batch.num_rows, "{}", dtype=object), pa.string())
    columns = [batch.column(name) for name in names]
    texts = [_text_pieces(c) for c in columns]
    if columns[0].null_count == 0:
        return _join(["{", *_field_pieces(names, texts, ""), "}"])
    joined = _join(_field_pieces(names, texts, ","))
    return pc.binary_join_element_wise("{", pc.utf8_slice_codeunits(joined, 1), "}", "")


def _join(pieces: Sequence[Any]) -> pa.Array:
    """``binary_join_element_wise`` of ``pieces`` (arrays, and ``str`` constants made
    arrays, ``_constant``), each run of constants joined into one first: the kernel's
    cost grows with its pieces (2 fewer of 11: -25%), and it takes an array piece
    faster than a scalar one (-12%)."""
    merged: list[Any] = []
    for piece in pieces:
        if isinstance(piece, str) and merged and isinstance(merged[-1], str):
            merged[-1] += piece
        else:
            merged.append(piece)
    n = next(len(p) for p in merged if not isinstance(p, str))
    return pc.binary_join_element_wise(
        *(_constant(p, n) if isinstance(p, str) else p for p in merged), ""
    )


#: Arrays of one repeated text (``_constant``), by text; at most ``_CONSTANT_TEXTS`` texts
#: of at most ``_CONSTANT_ROWS`` rows (a record's field names: a few KiB a batch row).
_CONSTANTS: dict[str, pa.Array] = {}
_CONSTANT_TEXTS = 64
_CONSTANT_ROWS = 1 << 17


def _constant(text: str, n: int) -> pa.Array | str:
    """``text`` ``n`` times, a ``string`` array sliced from the one kept for ``text``
    (made once: each batch of a table has the same field names), or ``text`` itself
    past ``_CONSTANT_ROWS`` rows (the kernel repeats a scalar)."""
    kept = _CONSTANTS.get(text)
    if kept is None or len(kept) < n:
        if n > _CONSTANT_ROWS:
            return text
        if len(_CONSTANTS) >= _CONSTANT_TEXTS:
            _CONSTANTS.clear()
        encoded = text.encode()
        data = np.tile(np.frombuffer(encoded, dtype=np.uint8), n)
        offsets = np.arange(n + 1, dtype=np.int32) * len(encoded)
        kept = pa.Array.from_buffers(
            pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        )
        _CONSTANTS[text] = kept
    return kept.slice(0, n)


def _field_pieces(names: Sequence[str], texts: Sequence[list[Any]], lead: str) -> list[Any]:
    """The pieces of ``json_records``' join: per field, its ``"name":`` (after a comma
    but for the first, unless ``lead`` puts one there too) and its value's pieces, or
    for a field with nulls one array of them all (``""`` where null)."""
    pieces: list[Any] = []
    for i, (name, text) in enumerate(zip(names, texts, strict=True)):
        name_text = (lead if i == 0 else ",") + _json_encode(name) + ":"
        if not any(isinstance(p, pa.Array) and p.null_count for p in text):
            pieces += [name_text, *text]
        else:
            field = pc.binary_join_element_wise(
                pa.scalar(name_text, pa.string()), *text, "", null_handling="emit_null"
            )
            pieces.append(pc.fill_null(field, ""))
    return pieces


def json_texts(col: pa.Array) -> pa.Array:
    """The JSON text of every value of ``col`` as Spark's ``to_json`` writes it (a
    ``string`` array; null stays null): its ``_text_pieces`` joined."""
    pieces = _text_pieces(col)
    if len(pieces) == 1:
        return pieces[0]  # type: ignore[no-any-return]
    return pc.binary_join_element_wise(*pieces, "")


# Pieces are plain strings, made Arrow scalars by the kernels: a ``pa.scalar`` at import
# would load pandas (``pyarrow.pandas_compat``) in every Spark worker (test_import_cost).
_QUOTE = '"'


def _text_pieces(col: pa.Array) -> list[Any]:
    """The JSON texts of ``col`` as pieces to join (arrays, null where ``col`` is, and
    string scalars): a column's text is rarely worth a join of its own when it is joined
    into a record anyway. Vectorized for integers, booleans, floats and strings that need
    no escaping; other types go value by value (``_texter``)."""
    t = col.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_null(t):
        return [col.cast(pa.string())]
    if pa.types.is_floating(t):
        return _float_pieces(col)
    is_text = pa.types.is_string(t) or pa.types.is_large_string(t)
    if is_text and not _may_need_escapes(col):
        return [_QUOTE, col.cast(pa.string()), _QUOTE]
    text = _texter(t)
    return [pa.array([None if v is None else text(v) for v in col.to_pylist()], pa.string())]


def _may_need_escapes(col: pa.Array) -> bool:
    """Whether a string column may hold a character JSON escapes (quote, backslash, a
    control character): a scan of the bytes its offsets span (null slots' bytes too,
    which can only say yes wrongly: the slow path is then taken, never a wrong text)."""
    if len(col) == 0:
        return False
    width = np.int32 if pa.types.is_string(col.type) else np.int64
    offsets = np.frombuffer(col.buffers()[1], dtype=width)
    start, end = int(offsets[col.offset]), int(offsets[col.offset + len(col)])
    data = col.buffers()[2]
    if data is None or end <= start:
        return False
    raw = np.frombuffer(data, dtype=np.uint8, count=end - start, offset=start)
    return bool(((raw < 0x20) | (raw == 0x22) | (raw == 0x5C)).any())


def _float_pieces(col: pa.Array) -> list[Any]:
    """The pieces of floats' texts as Java's ``Double.toString`` / ``Float.toString`` write
    them (Spark's JSON writer uses them): ``1.5``, ``100.0`` between 10^-3 and 10^7, else
    ``1.0E7``, ``1.5E-7``. The shortest digits that read back exactly (a float32 in float32
    precision) come from ``_shortest_texts`` (doubles without nulls) or Arrow's cast, each
    in its own notation: values within the plain range only need ``.0`` after an integral
    text of Arrow's (a piece of its own, left out when no value is integral); the others
    are respelt value by value. Which is which is found in numpy, from the values and
    from the bytes of the texts (an ``e``).
    (NaN and infinities were refused before: ``RowEncoder._values`` in write_encode.py.)

    Quirk: before Java 19, ``Double.toString`` sometimes writes more digits than the
    shortest (``9.999999999999999E22`` for 1e23; most often beyond 10^16, and for many
    float32s beyond 10^7); those texts read back as the same number, but their bytes
    differ from the shortest text written here (docs/DECISIONS.md "Spark writes")."""
    values = col.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    shortest = None
    if pa.types.is_float64(col.type) and not col.null_count and np.isfinite(values).all():
        shortest = _shortest_texts(values)
    text = col.cast(pa.string()) if shortest is None else shortest
    with np.errstate(invalid="ignore"):
        magnitude = np.abs(values)
        plain = (magnitude == 0) | ((magnitude >= 1e-3) & (magnitude < 1e7))
        # Arrow writes an integral value of the plain range without a fraction ("5", "-0").
        integral = np.floor(values) == values if shortest is None else None
    plain[_rows_with_e(text)] = False
    if col.null_count:
        plain |= ~np.asarray(col.is_valid())  # a null stays null whatever its slot holds
    if integral is None or not integral.any():
        out = text
    else:
        fraction = pa.array(np.where(integral, _POINT_ZERO, _NOTHING), pa.string())
        if plain.all():
            return [text, fraction]
        out = pc.binary_join_element_wise(text, fraction, "")
    if plain.all():
        return [out]
    respell = np.flatnonzero(~plain)
    respelt = [_java_number(d) for d in text.take(pa.array(respell)).to_pylist()]
    order = np.arange(len(out))
    order[respell] = len(out) + np.arange(len(respell))
    return [pa.concat_arrays([out, pa.array(respelt, pa.string())]).take(pa.array(order))]


def _shortest_texts(values: Any) -> pa.Array | None:
    """The shortest text that reads back as each of ``values`` (finite doubles, a numpy
    array) in orjson's notation (``100.0``, ``1e+16``, ``1e-7``), as a ``string``
    array; None when too long for one. One ``orjson.dumps`` of the whole array (its
    numpy path), cut after each comma and the commas trimmed: a third of the time of
    Arrow's cast, which writes the same digits (both write the shortest, nearest, ties
    to even: tests/store/test_json_arrow.py)."""
    import orjson

    n = len(values)
    values = np.ascontiguousarray(values)  # orjson's numpy path reads contiguous arrays
    dumped = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)  # [1.5,2.0,...]
    if not n or len(dumped) >= 2**31:
        return None if n else pa.array([], pa.string())
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[0] = 1
    offsets[1:n] = np.flatnonzero(np.frombuffer(dumped, dtype=np.uint8) == ord(",")) + 1
    offsets[n] = len(dumped) - 1
    cut = pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(dumped)]
    )  # each value with the comma after it
    return pc.utf8_rtrim(cut, characters=",")


def _rows_with_e(text: pa.Array) -> Any:
    """The rows of a ``string`` array of numbers whose text has an ``e`` (an exponent):
    a scan of the bytes, each ``e`` mapped to its row by the offsets."""
    if len(text) == 0 or text.buffers()[2] is None:
        return np.zeros(0, dtype=np.int64)
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int32)[
        text.offset : text.offset + len(text) + 1
    ]
    start, end = int(offsets[0]), int(offsets[-1])
    raw = np.frombuffer(text.buffers()[2], dtype=np.uint8, count=end - start, offset=start)
    at = np.flatnonzero(raw == ord("e")) + start
    return np.searchsorted(offsets, at, side="right") - 1


_POINT_ZERO = ".0"
_NOTHING = ""


def _java_number(text: str) -> str:
    """A finite number's shortest text (any notation: ``1e+16``, ``0.00001``) as Java's
    ``Double.toString`` spells it: plain with at least one fraction digit for magnitudes
    from 10^-3 to below 10^7, else ``<d>.<digits>E<exponent>``."""
    sign, digits, exponent = decimal.Decimal(text).as_tuple()
    minus = "-" if sign else ""
    ds = "".join(map(str, digits)).rstrip("0")
    if not ds:
        return minus + "0.0"
    exponent = int(exponent) + len(digits) - len(ds)
    adjusted = len(ds) - 1 + exponent
    if -3 <= adjusted < 7:
        if exponent >= 0:
            return f"{minus}{ds}{'0' * exponent}.0"
        point = len(ds) + exponent
        if point > 0:
            return f"{minus}{ds[:point]}.{ds[point:]}"
        return f"{minus}0.{'0' * -point}{ds}"
    return f"{minus}{ds[0]}.{ds[1:] or '0'}E{adjusted}"


def _texter(t: pa.DataType) -> Callable[[Any], str]:
    """Python value of an Arrow type (not None) → its JSON text as Spark's ``to_json``
    writes it."""
    if pa.types.is_boolean(t):
        return lambda v: "true" if v else "false"
    if pa.types.is_integer(t):
        return str
    if pa.types.is_float32(t):
        return lambda v: _java_number(str(np.float32(v)))
    if pa.types.is_floating(t):
        return lambda v: _java_number(repr(v))
    if pa.types.is_timestamp(t):
        spell = _spark_timestamp if t.tz is not None else _spark_timestamp_ntz
        return lambda v: '"' + spell(v) + '"'
    if pa.types.is_date(t):
        return lambda v: f'"{v.year:04d}-{v.month:02d}-{v.day:02d}"'
    if pa.types.is_decimal(t):
        # Spark writes a decimal as Java's BigDecimal.toString of its digits at the
        # type's scale (1.10, 0E-18); Python's str of a Decimal spells them alike.
        return str
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return lambda v: '"' + base64.b64encode(v).decode("ascii") + '"'
    if pa.types.is_map(t):
        key, item = _texter(t.key_type), _texter(t.item_type)
        text_keys = pa.types.is_string(t.key_type) or pa.types.is_large_string(t.key_type)

        def map_text(v: Sequence[tuple[Any, Any]]) -> str:
            fields = (
                (_json_encode(k) if text_keys else '"' + key(k).strip('"') + '"')
                + ":"
                + ("null" if x is None else item(x))
                for k, x in v
            )
            return "{" + ",".join(fields) + "}"

        return map_text
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        item = _texter(t.value_type)
        return lambda v: "[" + ",".join("null" if x is None else item(x) for x in v) + "]"
    if pa.types.is_struct(t):
        members = [
            (t.field(i).name, _json_encode(t.field(i).name) + ":", _texter(t.field(i).type))
            for i in range(t.num_fields)
        ]

        # Spark's to_json leaves null struct fields out (ignoreNullFields), at every level.
        def struct_text(v: dict[str, Any]) -> str:
            fields = (
                name_text + text(v[name])
                for name, name_text, text in members
                if v.get(name) is not None
            )
            return "{" + ",".join(fields) + "}"

        return struct_text
    return _json_encode


#: The timestamp formats both Spark writers use (``write_store`` passes them to Spark's
#: ``to_json``): microseconds, so a timestamp round-trips exactly (Spark's default
#: writes milliseconds).
TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"
TIMESTAMP_NTZ_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"
JSON_OPTIONS = {"timestampFormat": TIMESTAMP_FORMAT, "timestampNTZFormat": TIMESTAMP_NTZ_FORMAT}


def _spark_timestamp(v: _dt.datetime) -> str:
    """``TIMESTAMP_FORMAT`` in ``v``'s zone, which Arrow sets to the session time zone
    (``XXX``: ``Z`` for UTC, else ``+01:00``)."""
    offset = v.utcoffset() or _dt.timedelta(0)
    if offset:
        minutes = int(offset.total_seconds()) // 60
        sign = "+" if minutes >= 0 else "-"
        zone = f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    else:
        zone = "Z"
    return _spark_timestamp_ntz(v) + zone


def _spark_timestamp_ntz(v: _dt.datetime) -> str:
    """``TIMESTAMP_NTZ_FORMAT``; fields spelt by hand: ``strftime("%Y")`` does not pad
    years before 1000 on every platform, Spark's ``yyyy`` does."""
    return (
        f"{v.year:04d}-{v.month:02d}-{v.day:02d}T{v.hour:02d}:{v.minute:02d}:"
        f"{v.second:02d}.{v.microsecond:06d}"
    )
