"""``RowDecoder`` against Spark itself: a real streaming aggregation whose grouping key
and aggregation buffer hold every type the decoder supports (nulls, non-ASCII strings,
decimals on both sides of 18 digits, nested structs, arrays of every element width, maps
with struct keys) leaves UnsafeRows in its checkpoint; the decoder must give exactly the
values Spark's own state reader gives. One micro-batch holds a row of edge values, a row
of nulls and a non-ASCII row; the others hold rows drawn by hypothesis.

Rows of flat schemas also decode in bulk (``RowDecoder.decode_columns``): the same values
as row by row, on Spark's rows and on rows written here (tests/store/checkpoint/
unsafe_rows.py), and no columns at all where a row would be refused."""

from __future__ import annotations

import json
import uuid
from datetime import date, datetime

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from jobs import session_conf, state_rows
from unsafe_rows import BLOBS, CODES, NUMBERS, encode_row, records_of
from unsafe_rows import TEXT as ROW_TEXT
from unsafe_rows import schema as flat_schema

from iqkit.store.checkpoint.hdfs_files import load_records, load_state
from iqkit.store.checkpoint.state_schema import read_operator_metadata, read_store_schema
from iqkit.store.checkpoint.unsafe_row import RowDecodeError, RowDecoder, UnsupportedStateTypeError
from iqkit.store.objects import open_objects

#: The input: JSON-friendly columns the query converts into Spark's types.
INPUT_SCHEMA = (
    "s string, bin_hex string, flag boolean, i8 long, i16 long, i32 long, i64 long, "
    "f32 double, f64 double, d string, t string, tn string, small string, big string"
)
#: Within a year of the ends of Python's datetimes: PySpark turns a timestamp into a local
#: time first, which must exist too.
TIMES = st.datetimes(datetime(1000, 1, 1), datetime(9000, 12, 31)).map(str)
TEXT = st.text(alphabet=st.sampled_from("aZ09 -é日本語😀\u00a0ß"), max_size=8)
ROWS = st.lists(
    st.fixed_dictionaries(
        {
            "s": st.none() | TEXT,
            "bin_hex": st.none() | st.binary(max_size=6).map(bytes.hex),
            "flag": st.none() | st.booleans(),
            "i8": st.none() | st.integers(-128, 127),
            "i16": st.none() | st.integers(-(2**15), 2**15 - 1),
            "i32": st.none() | st.integers(-(2**31), 2**31 - 1),
            "i64": st.none() | st.integers(-(2**63), 2**63 - 1),
            "f32": st.none() | st.floats(-(2.0**100), 2.0**100, width=32),
            "f64": st.none() | st.floats(allow_nan=False, allow_infinity=False),
            "d": st.none() | st.dates(min_value=date(1000, 1, 1)).map(str),
            "t": st.none() | TIMES,
            "tn": st.none() | TIMES,
            "small": st.none() | st.decimals(-(10**9) + 1, 10**9 - 1, places=3).map(str),
            "big": st.none() | st.decimals(-(10**24) + 1, 10**24 - 1, places=6).map(str),
        }
    ),
    min_size=1,
    max_size=12,
)
EDGES = {
    "s": "",
    "bin_hex": "",
    "flag": False,
    "i8": -128,
    "i16": 32767,
    "i32": -(2**31),
    "i64": 2**63 - 1,
    "f32": -0.5,
    "f64": 5e-324,
    "d": "1969-12-31",
    "t": "1969-12-31 23:59:59.999999",
    "tn": "9999-12-31 23:59:59.999999",
    "small": "-999999999.999",
    "big": "999999999999999999999999.999999",
}
NULLS = dict.fromkeys(EDGES)
NON_ASCII = {**EDGES, "s": "日本語 é 😀", "big": "-0.000001", "small": "0.000"}


def typed_columns(source):
    """The input converted to every supported type, plus nested structs, arrays and maps."""
    from pyspark.sql import functions as F

    c = F.col
    typed = source.select(
        c("s"),
        F.unhex("bin_hex").alias("bin"),
        c("flag"),
        c("i8").cast("byte").alias("i8"),
        c("i16").cast("short").alias("i16"),
        c("i32").cast("int").alias("i32"),
        c("i64"),
        c("f32").cast("float").alias("f32"),
        c("f64"),
        c("d").cast("date").alias("d"),
        c("t").cast("timestamp").alias("t"),
        c("tn").cast("timestamp_ntz").alias("tn"),
        c("small").cast("decimal(12,3)").alias("small"),
        c("big").cast("decimal(30,6)").alias("big"),
    )
    return typed.select(
        "*",
        F.struct("s", "i32", F.struct("big", "d").alias("inner")).alias("nested"),
        F.array("i32", "i32").alias("ints"),
        F.array("s", F.lit("x")).alias("strings"),
        F.array("flag").alias("flags"),
        F.array("i8", "i8").alias("bytes"),
        F.array("i16").alias("shorts"),
        F.array("f32", "f32", "f32").alias("floats"),
        F.array("f64").alias("doubles"),
        F.array("d").alias("dates"),
        F.array("t", "t").alias("times"),
        F.array("small").alias("smalls"),
        F.array("big", "big").alias("bigs"),
        F.array("bin").alias("binaries"),
        F.array(F.struct("s", "i64")).alias("structs"),
        F.array(F.array("i16"), F.array("i16", "i16")).alias("nested_arrays"),
        F.create_map(F.lit("a"), c("f64"), F.lit("b€"), c("i64")).alias("by_name"),
        F.create_map(F.struct("i32", "s"), c("big")).alias("by_struct"),
    )


KEY_COLUMNS = ["s", "bin", "flag", "i8", "i16", "i32", "i64", "f32", "f64", "d", "t", "tn"]
KEY_COLUMNS += ["small", "big", "nested", "ints", "strings"]
VALUE_COLUMNS = [
    "nested",
    "ints",
    "strings",
    "flags",
    "bytes",
    "shorts",
    "floats",
    "doubles",
    "dates",
    "times",
    "smalls",
    "bigs",
    "binaries",
    "structs",
    "nested_arrays",
    "by_name",
    "by_struct",
    "tn",
    "big",
]


def run_typed_aggregation(
    spark, folder, rows, keys: list[str] = KEY_COLUMNS, values: list[str] = VALUE_COLUMNS
) -> str:
    """One micro-batch of ``rows`` through a streaming aggregation grouped by the ``keys``
    columns, keeping ``first`` of each of ``values``: its checkpoint's folder."""
    from pyspark.sql import functions as F

    inputs = folder / "input"
    inputs.mkdir(parents=True)
    (inputs / "rows.json").write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    checkpoint = folder / "ckpt"
    source = typed_columns(spark.readStream.schema(INPUT_SCHEMA).json(str(inputs)))
    aggregated = source.groupBy(*keys).agg(
        *(F.first(name).alias(name) for name in values), F.count("*")
    )
    with session_conf(spark, {"spark.sql.shuffle.partitions": "2"}):
        query = (
            aggregated.writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    return str(checkpoint)


def decoded_rows(checkpoint: str) -> dict[int, list[tuple[tuple, tuple]]]:
    objects = open_objects(checkpoint)
    schema = read_store_schema(objects, "state/0")
    keys, values = RowDecoder(schema.key_schema), RowDecoder(schema.value_schema)
    found = {}
    for partition in range(read_operator_metadata(objects, "state/0").store().num_partitions):
        state = load_state(objects, f"state/0/{partition}", 1)
        if state:
            rows = [(keys.decode(k), values.decode(v)) for k, v in state.items()]
            found[partition] = sorted(rows, key=repr)
    return found


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("typed")


@pytest.fixture(scope="module")
def edge_checkpoint(spark, scratch) -> str:
    """One micro-batch of a row of edge values, a row of nulls and a non-ASCII row."""
    return run_typed_aggregation(spark, scratch / "edges", [EDGES, NULLS, NON_ASCII])


def test_edge_values_and_nulls_decode_as_sparks_state_reader_reads_them(spark, edge_checkpoint):
    expected = state_rows(spark, edge_checkpoint, 0)
    assert sum(len(found) for found in expected.values()) == 3
    assert decoded_rows(edge_checkpoint) == expected


# Each example is a Spark query (seconds): few examples, and no shrinking, which would run
# hundreds of queries; a failure reports the drawn rows as they are.
@settings(
    max_examples=2,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rows=ROWS)
def test_drawn_values_decode_as_sparks_state_reader_reads_them(spark, scratch, rows):
    checkpoint = run_typed_aggregation(spark, scratch / uuid.uuid4().hex, rows)
    expected = state_rows(spark, checkpoint, 0)
    assert sum(len(found) for found in expected.values()) >= 1
    assert decoded_rows(checkpoint) == expected


def test_decimals_keep_their_scale_and_large_ones_every_digit(edge_checkpoint):
    key_schema = read_store_schema(open_objects(edge_checkpoint), "state/0").key_schema
    names = RowDecoder(key_schema).names
    small, big = names.index("small"), names.index("big")
    keys = [key for rows in decoded_rows(edge_checkpoint).values() for key, _ in rows]
    texts = sorted((str(key[small]), str(key[big])) for key in keys if key[big] is not None)
    assert texts == [("-999999999.999", "999999999999999999999999.999999"), ("0.000", "-0.000001")]


def test_bytes_that_are_not_a_row_of_the_schema_raise(edge_checkpoint):
    objects = open_objects(edge_checkpoint)
    keys = RowDecoder(read_store_schema(objects, "state/0").key_schema)
    for partition in range(2):
        for key in load_state(objects, f"state/0/{partition}", 1):
            keys.decode(key)  # whole: decodes
            for cut in (8, len(key) // 2, len(key) - 8):
                with pytest.raises(RowDecodeError):
                    keys.decode(key[:cut])


def test_a_type_not_supported_yet_is_refused_when_the_decoder_is_built():
    schema = {
        "type": "struct",
        "fields": [{"name": "span", "type": "interval", "nullable": True, "metadata": {}}],
    }
    with pytest.raises(UnsupportedStateTypeError, match="span"):
        RowDecoder(schema)


# -- in bulk ------------------------------------------------------------------------------
FLAT_COLUMNS = ["s", "bin", "flag", "i8", "i16", "i32", "i64", "f32", "f64"]


def column_value(data: bytes, column, row: int):
    """Row ``row`` of a ``Column`` as ``decode`` gives it."""
    if column.nulls is not None and column.nulls[row]:
        return None
    if column.sizes is None:
        return column.values[row].item()
    start = int(column.values[row])
    raw = data[start : start + int(column.sizes[row])]
    return raw.decode("utf-8", "replace") if column.kind == "string" else raw


def same(a: tuple, b: tuple) -> bool:
    """Equal, NaN equal to NaN."""
    return len(a) == len(b) and all(
        x == y or (x != x and y != y) for x, y in zip(a, b, strict=True)
    )


def assert_bulk_is_row_by_row(decoder: RowDecoder, records) -> None:
    """Every key row of ``records`` decoded in bulk gives what ``decode`` gives."""
    columns = decoder.decode_columns(records.data, records.key_starts, records.key_lengths)
    assert columns is not None
    for row, (key, _) in enumerate(records.items()):
        found = tuple(column_value(records.data, column, row) for column in columns)
        assert same(found, decoder.decode(key)), (found, decoder.decode(key))


def test_sparks_flat_rows_decode_in_bulk_as_one_by_one(spark, scratch):
    rows = [EDGES, NULLS, NON_ASCII, {**EDGES, "f32": float("nan"), "f64": float("-inf")}]
    checkpoint = run_typed_aggregation(
        spark, scratch / "flat", rows, keys=FLAT_COLUMNS, values=FLAT_COLUMNS
    )
    objects = open_objects(checkpoint)
    schema = read_store_schema(objects, "state/0")
    keys, values = RowDecoder(schema.key_schema), RowDecoder(schema.value_schema)
    assert keys.kinds == ("string", "binary", "boolean", "byte", "short", "integer", "long",
                          "float", "double")  # fmt: skip
    decoded = 0
    for partition in range(2):
        records = load_records(objects, f"state/0/{partition}", 1)
        assert_bulk_is_row_by_row(keys, records)
        swapped = type(records)(records.data, records.value_starts, records.value_lengths,
                                records.key_starts, records.key_lengths)  # fmt: skip
        assert_bulk_is_row_by_row(values, swapped)
        decoded += len(records)
    assert decoded == 4


FLAT_KINDS = [*sorted(CODES), "string", "binary"]


@st.composite
def flat_rows(draw):
    """(kinds, slot filler, rows): a flat schema (past 64 fields now and then, for a
    second null word) and rows of it, nulls and bytes that are not UTF-8 included."""
    many = draw(st.booleans())
    kinds = draw(st.lists(st.sampled_from(FLAT_KINDS), min_size=60 if many else 0,
                          max_size=70 if many else 6))  # fmt: skip
    values = [
        ROW_TEXT | BLOBS if k == "string" else BLOBS if k == "binary" else NUMBERS[k] for k in kinds
    ]
    rows = draw(st.lists(st.tuples(*[st.none() | v for v in values]), max_size=5))
    return kinds, draw(st.binary(min_size=8, max_size=8)), rows


@given(flat_rows())
def test_rows_decoded_in_bulk_are_the_rows_decoded_one_by_one(case):
    kinds, filler, rows = case
    decoder = RowDecoder(flat_schema(kinds))
    records = records_of([(encode_row(kinds, list(row), filler), b"") for row in rows])
    assert_bulk_is_row_by_row(decoder, records)


@given(flat_rows(), st.booleans())
def test_a_nested_struct_decodes_in_bulk_where_its_row_lies(case, null):
    """``decode_columns(structs=True)`` of rows holding a struct (laid out as a binary's
    bytes) and a long: the struct column says where each nested row lies, and the
    struct's own decoder reads there what ``decode`` gives."""
    kinds, filler, rows = case
    inner = RowDecoder(flat_schema(kinds))
    outer_schema = {"type": "struct", "fields": [
        {"name": "s", "type": dict(inner.schema), "nullable": True, "metadata": {}},
        {"name": "n", "type": "long", "nullable": True, "metadata": {}},
    ]}  # fmt: skip
    decoder = RowDecoder(outer_schema)
    encoded = [
        encode_row(["binary", "long"], [None if null else encode_row(kinds, list(row), filler), i])
        for i, row in enumerate(rows)
    ]
    records = records_of([(e, b"") for e in encoded])
    args = (records.data, records.key_starts, records.key_lengths)
    assert decoder.decode_columns(*args) is None  # not a flat schema
    nested, numbers = decoder.decode_columns(*args, structs=True)
    assert nested.kind == "struct" and numbers.values.tolist() == list(range(len(rows)))
    if null and rows:
        assert nested.nulls is not None and nested.nulls.all()
        return
    assert nested.nulls is None
    columns = inner.decode_columns(records.data, nested.values, nested.sizes)
    assert columns is not None
    for row, key in enumerate(encoded):
        found = tuple(column_value(records.data, column, row) for column in columns)
        expected = tuple(decoder.decode(key)[0].values())
        assert same(found, expected), (found, expected)


@given(flat_rows(), st.data())
def test_a_row_the_row_decoder_refuses_is_refused_in_bulk(case, data):
    kinds, filler, rows = case
    assume(kinds and rows)
    encoded = [encode_row(kinds, list(row), filler) for row in rows]
    row = data.draw(st.integers(0, len(rows) - 1))
    words = (len(kinds) + 63) // 64
    strings = [
        i for i, k in enumerate(kinds) if k in ("string", "binary") and rows[row][i] is not None
    ]
    damages = (
        ["short"]
        + (["null bit"] if len(kinds) % 64 else [])
        + (["past the end"] if strings else [])
    )
    damage = data.draw(st.sampled_from(damages))
    bad = bytearray(encoded[row])
    if damage == "short":
        bad = bad[: data.draw(st.integers(0, 8 * (words + len(kinds)) - 1))]
    elif damage == "null bit":
        last = slice(8 * (words - 1), 8 * words)
        bad[last] = (int.from_bytes(bad[last], "little") | 1 << len(kinds) % 64).to_bytes(
            8, "little"
        )
    else:
        slot = 8 * (words + data.draw(st.sampled_from(strings)))
        offset = int.from_bytes(bad[slot + 4 : slot + 8], "little")
        bad[slot : slot + 4] = (len(bad) - offset + 1).to_bytes(4, "little")
    encoded[row] = bytes(bad)
    decoder = RowDecoder(flat_schema(kinds))
    with pytest.raises(RowDecodeError):
        decoder.decode(encoded[row])
    records = records_of([(e, b"") for e in encoded])
    assert decoder.decode_columns(records.data, records.key_starts, records.key_lengths) is None


def test_schemas_of_other_types_do_not_decode_in_bulk(edge_checkpoint):
    objects = open_objects(edge_checkpoint)
    schema = read_store_schema(objects, "state/0")
    decoder = RowDecoder(schema.key_schema)  # dates, decimals, structs, arrays
    assert decoder.kinds is None
    records = load_records(objects, "state/0/0", 1)
    assert decoder.decode_columns(records.data, records.key_starts, records.key_lengths) is None
