"""A state store's rows as iqkit stores them (store/checkpoint/shape.py), without Spark:
the fast writer of whole-number rows gives the json serde's bytes exactly."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from iqkit.store.checkpoint.shape import StateShape
from iqkit.store.encoding.serdes import get_serde

KEY_SCHEMA = {"type": "struct", "fields": [{"name": "user", "type": "string"}]}
WHOLE = {
    "long": st.integers(-(2**63), 2**63 - 1),
    "integer": st.integers(-(2**31), 2**31 - 1),
    "short": st.integers(-(2**15), 2**15 - 1),
    "byte": st.integers(-128, 127),
    "boolean": st.booleans(),
}


@st.composite
def value_rows(draw):
    kinds = draw(st.lists(st.sampled_from(sorted(WHOLE)), min_size=1, max_size=5))
    names = draw(st.lists(st.text(min_size=1, max_size=6), min_size=len(kinds),
                          max_size=len(kinds), unique=True))  # fmt: skip
    fields = [{"name": n, "type": k} for n, k in zip(names, kinds, strict=True)]
    rows = draw(st.lists(st.tuples(*[st.none() | WHOLE[k] for k in kinds]), max_size=5))
    return fields, rows


@given(value_rows())
def test_whole_number_rows_are_written_as_the_json_serde_writes_them(case):
    fields, rows = case
    shape = StateShape(KEY_SCHEMA, {"type": "struct", "fields": fields})
    serde = get_serde("json")
    for row in rows:
        assert shape._value_bytes(row) == serde.serialize(shape.value_of(row))
