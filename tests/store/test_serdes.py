"""Serdes: Kafka byte layouts, error messages naming serde and value, parse_text."""

from __future__ import annotations

import math
import pickle
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from iqkit.store.encoding import ordered
from iqkit.store.encoding.serdes import SERDE_NAMES, Serde, get_serde


def test_registry_names_and_lookup() -> None:
    assert SERDE_NAMES == ("string", "bytes", "int32", "int64", "double", "json", "ordered")
    for name in SERDE_NAMES:
        serde = get_serde(name)
        assert isinstance(serde, Serde)
        assert serde.name == name
        assert get_serde(name) is serde
        assert get_serde(serde) is serde


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("strng", "string"),
        ("INT32", "int32"),
        ("int", "int32"),
        ("long", "int64"),
        ("float", "double"),
        ("jsno", "json"),
        ("orderd", "ordered"),
    ],
)
def test_unknown_name_lists_known_and_suggests(name: str, suggestion: str) -> None:
    with pytest.raises(ValueError) as info:
        get_serde(name)
    msg = str(info.value)
    assert msg.startswith(f"unknown serde {name!r}; did you mean {suggestion!r}?")
    for known in SERDE_NAMES:
        assert known in msg


def test_unknown_name_without_close_match() -> None:
    with pytest.raises(ValueError, match=r"^unknown serde 'avro' \(known serdes: string, bytes"):
        get_serde("avro")
    with pytest.raises(TypeError):
        get_serde(3)  # type: ignore[arg-type]


def test_serdes_are_frozen_and_picklable() -> None:
    serde = get_serde("int32")
    with pytest.raises(AttributeError):
        serde.name = "x"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(serde)) == serde


def test_order_preserving_flags() -> None:
    flags = {n: get_serde(n).order_preserving for n in SERDE_NAMES}
    assert flags == {
        "string": True,
        "bytes": True,
        "int32": False,
        "int64": False,
        "double": False,
        "json": False,
        "ordered": True,
    }


# --- Kafka byte layouts ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("string", "abc", b"abc"),
        ("string", "héllo €", "héllo €".encode()),
        ("string", "", b""),
        ("bytes", b"\x00\xff", b"\x00\xff"),
        ("bytes", bytearray(b"ab"), b"ab"),
        ("bytes", memoryview(b"ab"), b"ab"),
        ("int32", 0, b"\x00\x00\x00\x00"),
        ("int32", 1, b"\x00\x00\x00\x01"),
        ("int32", -1, b"\xff\xff\xff\xff"),
        ("int32", 256, b"\x00\x00\x01\x00"),
        ("int32", 2**31 - 1, b"\x7f\xff\xff\xff"),
        ("int32", -(2**31), b"\x80\x00\x00\x00"),
        ("int64", 1, b"\x00" * 7 + b"\x01"),
        ("int64", -1, b"\xff" * 8),
        ("int64", 2**63 - 1, b"\x7f" + b"\xff" * 7),
        ("int64", -(2**63), b"\x80" + b"\x00" * 7),
        ("int64", 1_700_000_000_000, bytes.fromhex("0000018bcfe56800")),
        ("double", 1.0, b"?\xf0\x00\x00\x00\x00\x00\x00"),
        ("double", -2.5, bytes.fromhex("c004000000000000")),
        ("double", 0.1, bytes.fromhex("3fb999999999999a")),
        ("double", 2, bytes.fromhex("4000000000000000")),
        ("double", -0.0, bytes.fromhex("8000000000000000")),
        ("double", math.inf, bytes.fromhex("7ff0000000000000")),
        ("double", -math.inf, bytes.fromhex("fff0000000000000")),
        ("double", math.nan, bytes.fromhex("7ff8000000000000")),
        # Java's doubleToLongBits collapses every NaN, including negative ones
        ("double", -math.nan, bytes.fromhex("7ff8000000000000")),
        (
            "double",
            struct.unpack(">d", bytes.fromhex("7ff0000000000001"))[0],
            bytes.fromhex("7ff8000000000000"),
        ),
        ("json", {"a": [1, "é"], "b": None}, '{"a":[1,"é"],"b":null}'.encode()),
        ("json", (1, 2.5, True), b"[1,2.5,true]"),
        ("json", "x", b'"x"'),
        ("json", None, b"null"),
        ("json", {"b": 1, "a": 2}, b'{"b":1,"a":2}'),  # insertion order kept
        ("ordered", ("a", 1), b"\x30a\x00\x15\x01"),
    ],
)
def test_byte_layout(name: str, value: object, expected: bytes) -> None:
    assert get_serde(name).serialize(value) == expected


@pytest.mark.parametrize(
    ("name", "data", "expected"),
    [
        ("string", "é".encode(), "é"),
        ("bytes", b"\x00", b"\x00"),
        ("bytes", bytearray(b"\x01"), b"\x01"),
        ("int32", b"\xff\xff\xff\xfe", -2),
        ("int32", b"\x00\x00\x01\x00", 256),
        ("int64", b"\x80" + b"\x00" * 7, -(2**63)),
        ("double", b"?\xf0\x00\x00\x00\x00\x00\x00", 1.0),
        ("json", b'{"a":[1,2]}', {"a": [1, 2]}),
        ("json", b"NaN", None),  # lenient read; checked below
        ("ordered", b"\x30a\x00\x15\x01", ("a", 1)),
    ],
)
def test_deserialize(name: str, data: bytes, expected: object) -> None:
    out = get_serde(name).deserialize(data)
    if name == "json" and data == b"NaN":
        assert math.isnan(out)
    else:
        assert out == expected


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_int32_round_trip_and_struct_layout(n: int) -> None:
    serde = get_serde("int32")
    assert serde.serialize(n) == n.to_bytes(4, "big", signed=True)
    assert serde.deserialize(serde.serialize(n)) == n


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_int64_round_trip_and_layout(n: int) -> None:
    serde = get_serde("int64")
    assert serde.serialize(n) == n.to_bytes(8, "big", signed=True)
    assert serde.deserialize(serde.serialize(n)) == n


@given(st.floats(allow_nan=False))
def test_double_round_trip(x: float) -> None:
    serde = get_serde("double")
    out = serde.deserialize(serde.serialize(x))
    assert out == x and math.copysign(1.0, out) == math.copysign(1.0, x)


@given(st.text(st.characters(codec="utf-8")))
def test_string_round_trip(s: str) -> None:
    serde = get_serde("string")
    assert serde.deserialize(serde.serialize(s)) == s


@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(st.characters(codec="utf-8")),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=4),
        max_leaves=15,
    )
)
def test_json_round_trip(value: object) -> None:
    serde = get_serde("json")
    assert serde.deserialize(serde.serialize(value)) == value


def test_numpy_and_subclass_values() -> None:
    assert get_serde("int32").serialize(np.int32(7)) == b"\x00\x00\x00\x07"
    assert get_serde("int64").serialize(np.int64(-1)) == b"\xff" * 8
    assert get_serde("double").serialize(np.float32(0.5)) == struct.pack(">d", 0.5)
    assert get_serde("double").serialize(np.float64(0.5)) == struct.pack(">d", 0.5)
    assert get_serde("string").serialize(np.str_("ab")) == b"ab"


# --- errors ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "value", "pattern"),
    [
        ("int32", "abc", r"^serde 'int32' cannot serialize 'abc' \(str\): expected int$"),
        ("int32", True, r"^serde 'int32' cannot serialize True \(bool\): expected int$"),
        ("int32", 1.0, r"^serde 'int32' cannot serialize 1\.0 \(float\): expected int$"),
        ("int32", np.bool_(True), r"^serde 'int32' cannot serialize .*\(bool\): expected int$"),
        ("int64", None, r"^serde 'int64' cannot serialize None \(NoneType\): expected int$"),
        ("string", 42, r"^serde 'string' cannot serialize 42 \(int\): expected str$"),
        ("string", b"x", r"^serde 'string' cannot serialize b'x' \(bytes\): expected str$"),
        ("bytes", "x", r"^serde 'bytes' cannot serialize 'x' \(str\): expected bytes"),
        ("double", "1.5", r"^serde 'double' cannot serialize '1\.5' \(str\): expected float"),
        ("double", False, r"^serde 'double' cannot serialize False \(bool\): expected float"),
        ("json", {1, 2}, r"^serde 'json' cannot serialize \{1, 2\} \(set\): expected a JSON"),
        ("json", {"k": b"x"}, r"^serde 'json' cannot serialize \{'k': b'x'\} \(dict\)"),
        ("ordered", {"a": 1}, r"^serde 'ordered' cannot serialize \{'a': 1\} \(dict\)"),
    ],
)
def test_wrong_type_is_type_error_naming_serde_and_value(
    name: str, value: object, pattern: str
) -> None:
    with pytest.raises(TypeError, match=pattern):
        get_serde(name).serialize(value)


@pytest.mark.parametrize(
    ("name", "value", "pattern"),
    [
        ("int32", 2**31, r"^serde 'int32' cannot serialize 2147483648 \(int\): out of range"),
        ("int32", -(2**31) - 1, r"^serde 'int32' cannot serialize -2147483649 \(int\): out of"),
        ("int64", 2**63, r"^serde 'int64' cannot serialize 9223372036854775808 \(int\): out of"),
        ("double", 10**400, r"^serde 'double' cannot serialize 1000.*\.\.\. \(int\): too large"),
        ("json", math.nan, r"^serde 'json' cannot serialize nan \(float\): Out of range float"),
        ("json", [math.inf], r"^serde 'json' cannot serialize \[inf\] \(list\)"),
        ("string", "\ud800", r"^serde 'string' cannot serialize '\\ud800' \(str\): not encodable"),
    ],
)
def test_unrepresentable_value_is_value_error(name: str, value: object, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        get_serde(name).serialize(value)


def test_json_circular_reference_is_value_error() -> None:
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match=r"^serde 'json' cannot serialize"):
        get_serde("json").serialize(loop)


def test_long_value_repr_is_truncated() -> None:
    with pytest.raises(TypeError) as info:
        get_serde("int32").serialize("x" * 1000)
    msg = str(info.value)
    shown = msg.removeprefix("serde 'int32' cannot serialize ").split(" (str)")[0]
    assert 40 <= len(shown) <= 60
    assert shown.endswith("...")
    assert len(msg) < 120


def test_huge_int_in_message_does_not_crash() -> None:
    with pytest.raises(ValueError, match=r"^serde 'int64' cannot serialize <int object>"):
        get_serde("int64").serialize(10**5000)


@pytest.mark.parametrize(
    ("name", "data", "pattern"),
    [
        (
            "int32",
            b"\x00\x01\x02",
            r"^serde 'int32' cannot deserialize b'\\x00\\x01\\x02' \(3 "
            r"bytes\): expected exactly 4 bytes$",
        ),
        ("int32", b"\x00" * 5, r"^serde 'int32' cannot deserialize .* \(5 bytes\)"),
        ("int64", b"\x00" * 4, r"^serde 'int64' cannot deserialize .* \(4 bytes\): expected"),
        ("double", b"", r"^serde 'double' cannot deserialize b'' \(0 bytes\): expected"),
        ("string", b"a\xff", r"^serde 'string' cannot deserialize .*invalid UTF-8 at byte 1"),
        ("json", b"{nope", r"^serde 'json' cannot deserialize .*invalid JSON"),
        ("json", b"\xff", r"^serde 'json' cannot deserialize .*invalid UTF-8"),
        ("ordered", b"\x99", r"^serde 'ordered' cannot deserialize"),
        ("int32", None, r"^serde 'int32' cannot deserialize None \(NoneType\)"),
        ("bytes", "text", r"^serde 'bytes' cannot deserialize 'text' \(str\): expected bytes$"),
    ],
)
def test_malformed_bytes_are_value_errors_naming_serde(
    name: str, data: bytes, pattern: str
) -> None:
    with pytest.raises(ValueError, match=pattern):
        get_serde(name).deserialize(data)


# --- parse_text -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("string", "hello world", "hello world"),
        ("string", " 42 ", " 42 "),
        ("bytes", "0x0a0b", b"\x0a\x0b"),
        ("bytes", "0XFF", b"\xff"),
        ("bytes", "0x", b""),
        ("bytes", "b'\\x00a'", b"\x00a"),
        ("bytes", "héllo", "héllo".encode()),
        ("int32", "42", 42),
        ("int32", " -7 ", -7),
        ("int32", "+1_000", 1000),
        ("int32", "0x10", 16),
        ("int32", "-2147483648", -(2**31)),
        ("int64", "9223372036854775807", 2**63 - 1),
        ("double", "1.5", 1.5),
        ("double", "-2", -2.0),
        ("double", "1e-3", 0.001),
        ("double", "inf", math.inf),
        ("json", '{"a": [1, 2]}', {"a": [1, 2]}),
        ("json", "42", 42),
        ("json", '"abc"', "abc"),
        ("json", "null", None),
        ("ordered", '["user", 7]', ("user", 7)),
        ("ordered", '[["a", 1], 2.5]', (("a", 1), 2.5)),
        ("ordered", "7", 7),
        ("ordered", "-1.5", -1.5),
        ("ordered", '"42"', "42"),
        ("ordered", "true", True),
        ("ordered", "null", None),
        ("ordered", "user-7", "user-7"),  # not JSON: the raw string
        ("ordered", "", ""),
    ],
)
def test_parse_text(name: str, text: str, expected: object) -> None:
    out = get_serde(name).parse_text(text)
    assert out == expected
    assert type(out) is type(expected)


def test_parse_text_nan_double() -> None:
    assert math.isnan(get_serde("double").parse_text("nan"))


@pytest.mark.parametrize(
    ("name", "text", "pattern"),
    [
        ("int32", "abc", r"^serde 'int32' cannot parse 'abc': not an integer$"),
        ("int32", "1.5", r"^serde 'int32' cannot parse '1\.5': not an integer$"),
        ("int32", "2147483648", r"^serde 'int32' cannot parse '2147483648': out of range"),
        ("int64", "", r"^serde 'int64' cannot parse '': not an integer$"),
        ("double", "one", r"^serde 'double' cannot parse 'one': not a number$"),
        ("bytes", "0xabc", r"^serde 'bytes' cannot parse '0xabc': invalid hex"),
        ("bytes", "0xzz", r"^serde 'bytes' cannot parse '0xzz': invalid hex"),
        ("bytes", "b'\\x0'", r"^serde 'bytes' cannot parse .*invalid bytes literal"),
        ("json", "abc", r"^serde 'json' cannot parse 'abc': invalid JSON"),
        ("json", "NaN", r"^serde 'json' cannot parse 'NaN': invalid JSON"),
        ("ordered", '{"a": 1}', r"^serde 'ordered' cannot parse .*JSON objects"),
        ("ordered", '[1, {"a": 1}]', r"^serde 'ordered' cannot parse .*JSON objects"),
    ],
)
def test_parse_text_errors_name_the_serde(name: str, text: str, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        get_serde(name).parse_text(text)


@pytest.mark.parametrize("name", SERDE_NAMES)
def test_parse_text_rejects_non_str(name: str) -> None:
    with pytest.raises(TypeError):
        get_serde(name).parse_text(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", SERDE_NAMES)
def test_parse_text_result_serializes(name: str) -> None:
    samples = {
        "string": "a",
        "bytes": "0x00",
        "int32": "5",
        "int64": "-5",
        "double": "2.5",
        "json": '{"x": [1]}',
        "ordered": '["a", [1, 2]]',
    }
    serde = get_serde(name)
    value = serde.parse_text(samples[name])
    assert serde.deserialize(serde.serialize(value)) == value


def test_ordered_serde_is_the_ordered_codec() -> None:
    serde = get_serde("ordered")
    for value in [("a", 1, (2.5, None)), -(10**40), "x", b"\x00"]:
        assert serde.serialize(value) == ordered.encode(value)
        assert serde.deserialize(serde.serialize(value)) == value
