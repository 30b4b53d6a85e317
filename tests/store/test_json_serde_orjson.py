"""The ``json`` serde computes with orjson where it agrees with the stdlib: its bytes and
values must stay the stdlib's, to the byte (a JSON key's bytes are its identity)."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import math
import uuid
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iqkit.store.encoding.serdes import get_serde

SERDE = get_serde("json")
STDLIB = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode

finite = st.floats(allow_nan=False, allow_infinity=False)
leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | finite
    | st.sampled_from([1e-05, 1e-07, -9.87e-06, 1e16, 1e-4, 5e-324, -0.0, 2**63, -(2**63) - 1])
    | st.text()
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=600, deadline=None)
@given(values)
def test_bytes_are_the_stdlib_bytes_and_read_back(value):
    data = SERDE.serialize(value)
    assert data == STDLIB(value).encode("utf-8")
    assert SERDE.deserialize(data) == json.loads(data)
    back = SERDE.deserialize(data)
    assert json.dumps(back) == json.dumps(json.loads(data))  # ints stay ints, -0.0 stays


@pytest.mark.parametrize(
    "text, expected",
    [
        (b"18446744073709551616", 2**64),  # orjson alone: a float
        (b"-9223372036854775809", -(2**63) - 1),
        (b'{"a":NaN}', {"a": math.nan}),
        (b"[Infinity,-Infinity]", [math.inf, -math.inf]),
        (b'"\\ud800"', "\ud800"),
        (b"1e400", math.inf),
        (b"-0", 0),
    ],
)
def test_reads_what_orjson_reads_otherwise_as_the_stdlib(text, expected):
    value = SERDE.deserialize(text)
    assert repr(value) == repr(expected)
    assert type(value) is type(expected)


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


@dataclasses.dataclass
class Point:
    x: int


@pytest.mark.parametrize(
    "value",
    [
        uuid.UUID(int=7),
        Color.RED,
        {"c": Color.RED},
        Point(1),
        datetime.datetime(2024, 1, 1),
        datetime.date(2024, 1, 1),
        np.int64(3),
        b"x",
        {1: "a"},
        {("a",): 1},
        float("nan"),
        [float("inf")],
        "\ud800",
        2**64,
    ],
    ids=repr,
)
def test_refuses_or_writes_exactly_as_the_stdlib(value):
    try:
        expected: bytes | type[Exception] = STDLIB(value).encode("utf-8")
    except (TypeError, ValueError) as exc:
        expected = TypeError if isinstance(exc, TypeError) else ValueError
    if isinstance(expected, bytes):
        assert SERDE.serialize(value) == expected
    else:
        with pytest.raises(expected, match="serde 'json' cannot serialize"):
            SERDE.serialize(value)


@pytest.mark.parametrize(
    "value",
    [Level.HIGH, np.float64(1.5), OrderedDict(a=1), {"x": [np.float64(0.25), Level.HIGH]}],
    ids=repr,
)
def test_subclasses_are_written_as_the_stdlib_writes_them(value):
    assert SERDE.serialize(value) == STDLIB(value).encode("utf-8")


def test_nesting_past_orjson_s_limit_is_the_stdlib_s():
    deep: list = []
    for _ in range(300):  # orjson refuses past 254 levels
        deep = [deep]
    assert SERDE.serialize(deep) == STDLIB(deep).encode("utf-8")
    assert SERDE.deserialize(SERDE.serialize(deep)) == deep
