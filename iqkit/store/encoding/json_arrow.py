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
    off (a slower kernel)."""
    if not names:
        return pa.array(np.full(batch.num_rows, "{}", dtype=object), pa.string())
    columns = [batch.column(name) for name in names]
    texts = [_text_pieces(c) for c in columns]
    if columns[0].null_count == 0:
        return pc.binary_join_element_wise("{", *_field_pieces(names, texts, ""), "}", "")
    joined = pc.binary_join_element_wise(*_field_pieces(names, texts, ","), "")
    return pc.binary_join_element_wise("{", pc.utf8_slice_codeunits(joined, 1), "}", "")


def _field_pieces(names: Sequence[str], texts: Sequence[list[Any]], lead: str) -> list[Any]:
    """The pieces of ``json_records``' join: per field, its ``"name":`` (after a comma
    but for the first, unless ``lead`` puts one there too) and its value's pieces, or
    for a field with nulls one array of them all (``""`` where null)."""
    pieces: list[Any] = []
    for i, (name, text) in enumerate(zip(names, texts, strict=True)):
        name_text = pa.scalar((lead if i == 0 else ",") + _json_encode(name) + ":", pa.string())
        if not any(isinstance(p, pa.Array) and p.null_count for p in text):
            pieces += [name_text, *text]
        else:
            field = pc.binary_join_element_wise(name_text, *text, "", null_handling="emit_null")
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
    ``1.0E7``, ``1.5E-7``. Arrow's cast writes the shortest digits that read back exactly (a
    float32 in float32 precision), in its own notation: values within the plain range only
    need ``.0`` after an integral text; the others are respelt value by value.
    (NaN and infinities were refused before: ``RowEncoder._values`` in write_encode.py.)

    Quirk: before Java 19, ``Double.toString`` sometimes writes more digits than the
    shortest (``9.999999999999999E22`` for 1e23; most often beyond 10^16, and for many
    float32s beyond 10^7); those texts read back as the same number, but their bytes
    differ from the shortest text written here (docs/DECISIONS.md "Spark writes")."""
    text = col.cast(pa.string())
    magnitude = pc.abs(col.cast(pa.float64()))
    within = pc.and_(pc.greater_equal(magnitude, 1e-3), pc.less(magnitude, 1e7))
    plain = pc.and_(
        pc.or_(pc.equal(magnitude, 0), within), pc.invert(pc.match_substring(text, "e"))
    )
    # Arrow writes an integral value of the plain range without a fraction ("5", "-0").
    integral = pc.equal(pc.floor(col), col)
    fraction = pc.if_else(integral, _POINT_ZERO, _NOTHING)
    if pc.all(pc.fill_null(plain, True)).as_py():
        return [text, fraction]
    out = pc.binary_join_element_wise(text, fraction, "")
    texts, plains = out.to_pylist(), plain.to_pylist()
    digits = text.to_pylist()
    rows = zip(texts, plains, digits, strict=True)
    return [pa.array([t if ok is not False else _java_number(d) for t, ok, d in rows], pa.string())]


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
