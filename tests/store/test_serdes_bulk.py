"""``Serde.deserialize_many``: the chunk decoders scans use agree with ``deserialize``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iqkit.store.encoding.serdes import SERDE_NAMES, get_serde

VALUES = {
    "string": st.text(max_size=12),
    "bytes": st.binary(max_size=12),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1),
    "double": st.floats(allow_nan=False),
    "json": st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
    "ordered": st.tuples(st.integers(), st.text(max_size=5)),
}


def test_every_serde_has_a_strategy():
    assert set(VALUES) == set(SERDE_NAMES)


@pytest.mark.parametrize("name", sorted(VALUES))
@pytest.mark.parametrize("prefix", [b"", b"\x01", b"\x02\x00"])
def test_bulk_decode_matches_one_by_one(name, prefix):
    serde = get_serde(name)

    @given(st.lists(VALUES[name], max_size=30))
    def check(values):
        datas = [prefix + serde.serialize(v) for v in values]
        expected = [serde.deserialize(d[len(prefix) :]) for d in datas]
        assert serde.deserialize_many(datas, len(prefix)) == expected

    check()


def test_string_chunk_with_the_prefix_byte_inside_a_key_falls_back_correctly():
    serde = get_serde("string")
    datas = [b"\x01a\x01b", b"\x01c", b"\x01\xc3\xa9t\xc3\xa9"]
    assert serde.deserialize_many(datas, 1) == ["a\x01b", "c", "été"]


def test_bulk_decode_reports_malformed_data_like_deserialize():
    with pytest.raises(ValueError, match="serde 'string'"):
        get_serde("string").deserialize_many([b"\x01ok", b"\x01\xff"], 1)
    with pytest.raises(ValueError, match="serde 'int64'"):
        get_serde("int64").deserialize_many([bytes(8), bytes(7), bytes(9)])
