"""Arrow columns as JSON text, exactly as Spark's ``to_json`` writes them: what the
``iqkit`` data source's tasks write as JSON values and records (``write_encode``), so a
store written by ``df.write.format("iqkit")`` reads back like one ``write_store`` wrote.

Vectorized in Arrow for strings, numbers and booleans; other types go value by value
through the converters here (timestamps in Spark's format, decimals, binary as base64,
maps, lists and structs without null fields)."""

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

# NaN and infinities are refused before encoding (schema.arrow_has_non_finite); JSON has no
# such numbers, so one reaching the encoder fails the task rather than being written.
_json_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
#: Characters a JSON string must escape (RE2 syntax): quote, backslash, controls.
_NEEDS_ESCAPE = r'["\\\x00-\x1f]'


def json_records(batch: pa.RecordBatch, names: Sequence[str]) -> pa.Array:
    """One JSON object per row (a ``string`` array, never null: a record of nulls is
    ``{}``), decoding to what ``to_json(struct(...))`` writes: null fields are left out.

    Built column by column in Arrow (``,"name":<value text>`` per present field, then
    ``{`` + the fields without the first comma + ``}``): no per-row Python for columns of
    strings, numbers and booleans."""
    fields = []
    for name in names:
        name_text = pa.scalar("," + _json_encode(name) + ":", pa.string())
        text = json_texts(batch.column(name))
        field = pc.binary_join_element_wise(name_text, text, "", null_handling="emit_null")
        fields.append(pc.fill_null(field, ""))
    joined = pc.binary_join_element_wise(*fields, "") if len(fields) > 1 else fields[0]
    return pc.binary_join_element_wise("{", pc.utf8_slice_codeunits(joined, 1), "}", "")


def json_texts(col: pa.Array) -> pa.Array:
    """The JSON text of every value of ``col`` as Spark's ``to_json`` writes it (a
    ``string`` array; null stays null). Vectorized for integers, booleans, floats and
    strings that need no escaping; other types go value by value (``_json_converter``)."""
    t = col.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_null(t):
        return col.cast(pa.string())
    if pa.types.is_floating(t):
        # Arrow writes the shortest text that reads back exactly, float32 in float32
        # precision like Java's Float.toString; a JSON reader needs "1.0" (not "1") to
        # see a float. (NaN and infinities were refused before: ``RowEncoder._values``
        # in write_encode.py.)
        text = col.cast(pa.string())
        integral = pc.match_substring_regex(text, r"^-?[0-9]+$")
        return pc.if_else(integral, pc.binary_join_element_wise(text, ".0", ""), text)
    is_text = pa.types.is_string(t) or pa.types.is_large_string(t)
    if is_text and not pc.any(pc.match_substring_regex(col, _NEEDS_ESCAPE)).as_py():
        return pc.binary_join_element_wise('"', col.cast(pa.string()), '"', "")
    convert = _json_converter(t)
    values = col.to_pylist()
    if convert is not None:
        values = [None if v is None else convert(v) for v in values]
    return pa.array([None if v is None else _json_encode(v) for v in values], pa.string())


def _json_converter(t: pa.DataType) -> Callable[[Any], Any] | None:
    """Python value of an Arrow type → the JSON-able value Spark's to_json would write, or
    ``None`` when the value is already that (strings, integers, booleans)."""
    if pa.types.is_floating(t):
        return _float32_json if pa.types.is_float32(t) else None
    if pa.types.is_timestamp(t):
        return _spark_timestamp if t.tz is not None else _spark_timestamp_ntz
    if pa.types.is_date(t):
        return _dt.date.isoformat
    if pa.types.is_decimal(t):
        return _decimal_json
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return lambda v: base64.b64encode(v).decode("ascii")
    if pa.types.is_map(t):
        conv = _json_converter(t.item_type)
        if conv is None:
            return lambda v: dict(v)
        return lambda v: {k: None if x is None else conv(x) for k, x in v}
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        conv = _json_converter(t.value_type)
        if conv is None:
            return None
        return lambda v: [None if x is None else conv(x) for x in v]
    if pa.types.is_struct(t):
        convs = {t.field(i).name: _json_converter(t.field(i).type) for i in range(t.num_fields)}

        # Spark's to_json leaves null struct fields out (ignoreNullFields), at every level.
        def struct(v: dict[str, Any]) -> dict[str, Any]:
            out = {}
            for k, x in v.items():
                if x is not None:
                    conv = convs.get(k)
                    out[k] = x if conv is None else conv(x)
            return out

        return struct
    return None


def _float32_json(v: float) -> float:
    """A float32 as Java's ``Float.toString`` writes it: its shortest float32 text (Arrow
    hands it over widened to float64, 0.1f as 0.10000000149011612)."""
    return float(str(np.float32(v)))


def _spark_timestamp(v: _dt.datetime) -> str:
    """``yyyy-MM-dd'T'HH:mm:ss.SSSXXX`` (Spark's JSON timestamp format) in ``v``'s zone,
    which Arrow sets to the session time zone."""
    offset = v.utcoffset() or _dt.timedelta(0)
    if offset:
        minutes = int(offset.total_seconds()) // 60
        sign = "+" if minutes >= 0 else "-"
        zone = f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    else:
        zone = "Z"
    return f"{v:%Y-%m-%dT%H:%M:%S}.{v.microsecond // 1000:03d}{zone}"


def _spark_timestamp_ntz(v: _dt.datetime) -> str:
    return f"{v:%Y-%m-%dT%H:%M:%S}.{v.microsecond // 1000:03d}"


def _decimal_json(d: decimal.Decimal) -> int | float:
    """Spark writes a decimal's digits (``1.10``, ``5``): JSON readers get a float, or an
    int for scale 0; the same here."""
    return int(d) if d.as_tuple().exponent == 0 else float(d)
