"""``json_arrow``: Arrow columns as the JSON text Spark's ``to_json`` writes. Doubles are
spelt as Java's ``Double.toString`` lays out their shortest digits, whichever way the
digits were found (orjson's numpy path for doubles without nulls, Arrow's cast for the
others); records join their fields, null fields left out."""

from __future__ import annotations

import decimal
import json

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from iqkit.store.encoding.json_arrow import (
    _CONSTANT_ROWS,
    _java_number,
    _shortest_texts,
    json_records,
    json_texts,
)

relaxed = settings(deadline=None)

FINITE = st.floats(allow_nan=False, allow_infinity=False)
#: Doubles where spellings part: the plain range's ends, integral values, ties between
#: two shortest texts (8388608.0009765625 is halfway between ...562 and ...563), the
#: extremes, negative zero.
EDGES = [
    0.0, -0.0, 1e-3, 0.0009999999999999998, 9999999.999999998, 1e7, -1e7, 100.0, -5.0,
    8388608.0009765625, 8388608 + 3 * 2**-10, 9999999.0009765625, 2.0**60, 1e16, 1e23,
    5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 1e-7, 123.456, 0.1,
]  # fmt: skip


def java(value: float) -> str:
    """Java's spelling from Python's own shortest digits (``repr``): a third way."""
    return _java_number(repr(value))


@relaxed
@given(st.lists(FINITE | st.sampled_from(EDGES), max_size=40), st.booleans())
def test_doubles_are_spelt_as_java_spells_their_shortest_digits(values, nulls):
    mask = [nulls and i % 3 == 1 for i in range(len(values))]
    col = pa.array(values, pa.float64(), mask=np.array(mask, dtype=bool))
    want = [None if m else java(v) for v, m in zip(values, mask, strict=True)]
    assert json_texts(col).to_pylist() == want
    assert json_texts(col.slice(1)).to_pylist() == want[1:]


@relaxed
@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), max_size=40))
def test_floats_are_spelt_in_float_precision(values):
    col = pa.array(values, pa.float32())
    assert json_texts(col).to_pylist() == [_java_number(str(np.float32(v))) for v in values]


@relaxed
@given(st.lists(FINITE | st.sampled_from(EDGES), min_size=1, max_size=60))
def test_orjson_writes_the_digits_arrow_writes(values):
    """The fast path's claim: orjson's texts and Arrow's cast are the same numbers."""
    mine = _shortest_texts(np.array(values, dtype=np.float64)).to_pylist()
    arrows = pa.array(values, pa.float64()).cast(pa.string()).to_pylist()
    assert [decimal.Decimal(t) for t in mine] == [decimal.Decimal(t) for t in arrows]
    assert [float(t) for t in mine] == values


RECORD = st.fixed_dictionaries(
    {
        "total": st.none() | FINITE,
        "n": st.none() | st.integers(-(2**63), 2**63 - 1),
        "region": st.none() | st.text(max_size=5),
        "ok": st.none() | st.booleans(),
    }
)


@relaxed
@given(st.lists(RECORD, min_size=1, max_size=30), st.permutations(["total", "n", "region", "ok"]))
def test_records_are_their_fields_texts_null_fields_left_out(rows, names):
    batch = pa.RecordBatch.from_pylist(
        rows,
        schema=pa.schema(
            [("total", pa.float64()), ("n", pa.int64()), ("region", pa.string()),
             ("ok", pa.bool_())]
        ),
    )  # fmt: skip
    texts = {name: json_texts(batch.column(name)).to_pylist() for name in names}
    want = [
        "{" + ",".join(f"{json.dumps(m)}:{texts[m][i]}" for m in names if row[m] is not None) + "}"
        for i, row in enumerate(rows)
    ]
    assert json_records(batch, names).to_pylist() == want


def test_a_batch_longer_than_the_kept_constants_is_joined_alike():
    n = _CONSTANT_ROWS + 5
    batch = pa.record_batch({"a": pa.array(np.arange(n) * 0.5), "b": pa.array(np.arange(n))})
    whole = json_records(batch, ["a", "b"])
    head = json_records(batch.slice(0, 10), ["a", "b"])
    assert whole.slice(0, 10).equals(head)
    assert whole[n - 1].as_py() == f'{{"a":{java((n - 1) * 0.5)},"b":{n - 1}}}'
