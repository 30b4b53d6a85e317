"""Spark's hash partitioning in Python (``store/encoding/spark_hash.py``) agrees with Spark
itself: ``hash(...)`` and ``pmod(hash(...), n)`` evaluated by the local Spark session on
DataFrames of an explicit schema (so every column has exactly the type under test), and
the partition a real hash-partitioned shuffle puts each row in.

A Spark query costs far more than any hashing, so each hypothesis example is one query
over a wide DataFrame: one column per type, many rows, and several multi-column keys."""

from __future__ import annotations

import decimal
import math
import struct
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from iqkit.store.encoding.spark_hash import SparkKeyHasher, spark_hash, spark_partition

PROPERTY = settings(
    max_examples=4,  # each example is one Spark query over up to 100 rows
    deadline=None,
    # No shrinking: each step would be a Spark query (minutes in all); a failure names its
    # row, key and partition count instead.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_ZONES = [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]
_INSTANTS = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.sampled_from(_ZONES)
)
# iqkit takes a naive datetime in a timestamp column as UTC; pyspark would take it as the
# machine's local time, so Spark is given the same instant made explicit.
_TIMESTAMPS = _INSTANTS | st.datetimes(min_value=datetime(1, 1, 2))


def _instant(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _wall_clock(value: datetime) -> datetime:
    return value.replace(tzinfo=None)


def _scaled(unscaled: int, scale: int) -> decimal.Decimal:
    """``unscaled * 10**-scale`` exactly (the default context would round to 28 digits)."""
    return decimal.Decimal(unscaled).scaleb(-scale, context=decimal.Context(prec=100))


def _decimals(precision: int, scale: int) -> st.SearchStrategy[decimal.Decimal]:
    """Values of decimal(p, s) over the whole range, and values with two more fraction
    digits that Spark rounds half up into it (never past its precision)."""
    top = 10**precision - 1
    exact = st.integers(-top, top).map(lambda n: _scaled(n, scale))
    finer = st.tuples(st.integers(-top + 1, top - 1), st.integers(0, 99)).map(
        lambda nd: _scaled(nd[0] * 100 + (nd[1] if nd[0] >= 0 else -nd[1]), scale + 2)
    )
    return exact | finer


@dataclass(frozen=True)
class Column:
    """One type under test: its spelling for ``spark_hash``, its pyspark type, a strategy
    of Python values (without None: nulls are added for every column) and, where pyspark
    would read a value otherwise than iqkit does, the value that means the same to it."""

    spec: Any
    spark_type: Any
    values: st.SearchStrategy[Any]
    to_spark: Any = None

    def spark_value(self, value: Any) -> Any:
        return value if value is None or self.to_spark is None else self.to_spark(value)


def _window_to_spark(value: Any) -> tuple:
    start, end = (value["start"], value["end"]) if isinstance(value, dict) else value
    return tuple(None if t is None else _instant(t) for t in (start, end))


_WINDOW_TYPE = T.StructType(
    [T.StructField("start", T.TimestampType()), T.StructField("end", T.TimestampType())]
)
_WINDOWS = st.tuples(st.none() | _TIMESTAMPS, st.none() | _TIMESTAMPS)
_WINDOWS = _WINDOWS | _WINDOWS.map(lambda w: {"start": w[0], "end": w[1]})

COLUMNS = [
    Column("boolean", T.BooleanType(), st.booleans()),
    Column("byte", T.ByteType(), st.integers(-(2**7), 2**7 - 1)),
    Column("short", T.ShortType(), st.integers(-(2**15), 2**15 - 1)),
    Column("integer", T.IntegerType(), st.integers(-(2**31), 2**31 - 1)),
    Column("long", T.LongType(), st.integers(-(2**63), 2**63 - 1)),
    # doubles too: Spark rounds them to float32 (and overflows to infinity) as Java does
    Column("float", T.FloatType(), st.floats(width=32) | st.floats()),
    Column("double", T.DoubleType(), st.floats()),
    Column("string", T.StringType(), st.text(max_size=20)),
    Column("binary", T.BinaryType(), st.binary(max_size=20)),
    Column("date", T.DateType(), st.dates()),
    Column("timestamp", T.TimestampType(), _TIMESTAMPS, _instant),
    # an aware datetime in a timestamp_ntz column is its wall clock (iqkit's reading)
    Column("timestamp_ntz", T.TimestampNTZType(), _TIMESTAMPS, _wall_clock),
    Column("time(6)", T.TimeType(6), st.times()),
    Column("void", T.NullType(), st.nothing()),  # groupBy(lit(null)): always null
    Column("decimal(5,2)", T.DecimalType(5, 2), _decimals(5, 2)),
    Column("decimal(18,0)", T.DecimalType(18, 0), _decimals(18, 0)),
    Column("decimal(18,6)", T.DecimalType(18, 6), _decimals(18, 6)),
    Column("decimal(19,0)", T.DecimalType(19, 0), _decimals(19, 0)),
    Column("decimal(38,10)", T.DecimalType(38, 10), _decimals(38, 10)),
    Column("decimal(38,0)", T.DecimalType(38, 0), _decimals(38, 0)),
    # a window key column; spelled as Spark's JSON of the struct (field names) ...
    Column(_WINDOW_TYPE.jsonValue(), _WINDOW_TYPE, _WINDOWS, _window_to_spark),
    # ... or as the list of its field types (positional values only)
    Column(
        ["string", "long"],
        T.StructType([T.StructField("a", T.StringType()), T.StructField("b", T.LongType())]),
        st.tuples(st.none() | st.text(max_size=6), st.none() | st.integers(-(2**63), 2**63 - 1)),
    ),
    Column(
        {"type": "array", "elementType": "integer", "containsNull": True},
        T.ArrayType(T.IntegerType()),
        st.lists(st.none() | st.integers(-(2**31), 2**31 - 1), max_size=4),
    ),
]


def _schema(columns: list[Column]) -> Any:
    return T.StructType([T.StructField(f"c{j}", c.spark_type) for j, c in enumerate(columns)])


def _spark_answers(spark, columns, rows, keys, partitions):
    """For each row: Spark's ``hash`` and ``pmod(hash, n)`` of every key (a tuple of column
    indexes), for every n of ``partitions``, from one query."""
    schema = T.StructType([T.StructField("i", T.IntegerType()), *_schema(columns).fields])
    data = [
        (i, *(c.spark_value(v) for c, v in zip(columns, row, strict=True)))
        for i, row in enumerate(rows)
    ]
    exprs = ["i"]
    for key in keys:
        cols = ", ".join(f"c{j}" for j in key)
        exprs.append(f"hash({cols})")
        exprs += [f"pmod(hash({cols}), {n})" for n in partitions]
    got = spark.createDataFrame(data, schema).selectExpr(*exprs).collect()
    assert [r[0] for r in got] == list(range(len(rows)))
    return [list(r[1:]) for r in got]


def _python_answers(columns, rows, keys, partitions):
    """The same answers from iqkit: ``spark_hash``/``spark_partition`` with the types as
    spelled above, and ``SparkKeyHasher`` built from the pyspark schema's JSON (the form a
    checkpoint's schema file holds), given keys the IQv2 way."""
    schema = _schema(columns).jsonValue()
    hashers = [
        SparkKeyHasher({"type": "struct", "fields": [schema["fields"][j] for j in key]})
        for key in keys
    ]
    answers: list[list[int]] = [[] for _ in rows]
    for key, hasher in zip(keys, hashers, strict=True):
        types = [columns[j].spec for j in key]
        iq_keys = [row[key[0]] if len(key) == 1 else tuple(row[j] for j in key) for row in rows]
        bulk = {n: hasher.partitions(iq_keys, n) for n in partitions}
        for r, (row, iq_key) in enumerate(zip(rows, iq_keys, strict=True)):
            values = [row[j] for j in key]
            h = spark_hash(values, types)
            assert hasher.hash(iq_key) == h
            answers[r].append(h)
            for n in partitions:
                p = spark_partition(values, types, n)
                assert hasher.partition(iq_key, n) == p == bulk[n][r]
                answers[r].append(p)
    return answers


def _assert_agree(spark, columns, rows, keys, partitions):
    spark_side = _spark_answers(spark, columns, rows, keys, partitions)
    python_side = _python_answers(columns, rows, keys, partitions)
    labels = [
        label
        for key in keys
        for label in (f"hash{key}", *(f"pmod(hash{key}, {n})" for n in partitions))
    ]
    for row, want, got in zip(rows, spark_side, python_side, strict=True):
        wrong = [
            f"{label}: Spark {w}, iqkit {g}"
            for label, w, g in zip(labels, want, got, strict=True)
            if w != g
        ]
        assert not wrong, f"row {row!r}:\n" + "\n".join(wrong)


@st.composite
def _tables(draw):
    """Rows with a value (or null) for every column; every single column as a key, and
    a few multi-column keys (columns may repeat, in any order)."""
    row = st.tuples(*(st.none() | c.values for c in COLUMNS))
    rows = draw(st.lists(row, min_size=1, max_size=100))
    combos = st.lists(st.integers(0, len(COLUMNS) - 1), min_size=2, max_size=4).map(tuple)
    keys = [(j,) for j in range(len(COLUMNS))] + draw(st.lists(combos, min_size=1, max_size=8))
    partitions = (draw(st.just(200) | st.integers(1, 10_000)),)  # 200: Spark's default
    return rows, keys, partitions


@PROPERTY
@given(_tables())
def test_hash_and_partition_agree_with_spark_for_every_type(spark, table):
    rows, keys, partitions = table
    _assert_agree(spark, COLUMNS, rows, keys, partitions)


def _edge_values() -> dict[str, list[Any]]:
    """The values a random draw may miss, by type: every string tail length in one and
    in several bytes per character, tail bytes over 0x7f, extremes, -0.0, NaNs with other
    bits, subnormals, float32 rounding and overflow, dates and times before 1970, and
    decimals whose unscaled bytes have every length mod 4."""
    nan_payload = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000001))[0]
    texts = ["a" * n for n in range(21)] + ["é" * n for n in range(11)]
    texts += ["日本語", "😀", "a😀", "ab\x00c", "\x7f\x80", "ÿ", "Ω" * 3]
    wide = [0, 1, -1, 127, 128, -128, -129, 2**31, -(2**31), 2**63, -(2**63) - 1, 10**37]
    wide += [10**38 - 1, -(10**38) + 1, 2**100, -(2**100), 255, 256, -256, 65535, -65536]
    floats = [0.0, -0.0, math.nan, -math.nan, nan_payload, math.inf, -math.inf, 1e-45, -1e-50]
    floats += [0.1, 3.4028235e38, 3.4028236e38, 1e39, -1e39, 5e-324, 2.0**-149, -(2.0**-150)]
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    instants = [epoch, epoch - timedelta(microseconds=1), epoch + timedelta(microseconds=1)]
    instants += [datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999999)]
    instants += [datetime(1582, 10, 10, 12, tzinfo=UTC), datetime(1969, 7, 20, 20, 17, 40)]
    return {
        "boolean": [True, False],
        "byte": [-(2**7), 2**7 - 1, -1, 0, 1],
        "short": [-(2**15), 2**15 - 1, -1, 0],
        "integer": [-(2**31), 2**31 - 1, -1, 0, 1],
        "long": [-(2**63), 2**63 - 1, -1, 0, 2**32, -(2**32), 2**31],
        "float": floats,
        "double": floats,
        "string": texts,
        "binary": [bytes(range(n)) for n in range(9)] + [b"\xff" * n for n in range(1, 8)],
        "date": [date(1, 1, 1), date(1969, 12, 31), date(1970, 1, 1), date(9999, 12, 31)],
        "timestamp": instants,
        "timestamp_ntz": [_wall_clock(t) for t in instants],
        "time(6)": [time(0), time(23, 59, 59, 999999), time(12, 0, 0, 123456)],
        "void": [None],
        "decimal(5,2)": [_scaled(n, 2) for n in (0, 1, -1, 99999, -99999)]
        + [decimal.Decimal("-0.00"), decimal.Decimal("1.005"), decimal.Decimal("-1.005")],
        "decimal(18,0)": [decimal.Decimal(n) for n in (0, 10**18 - 1, -(10**18) + 1, -1)],
        "decimal(18,6)": [_scaled(n, 6) for n in (0, 1, 10**18 - 1, -1)],
        "decimal(19,0)": [decimal.Decimal(n) for n in wide if abs(n) < 10**19],
        "decimal(38,10)": [_scaled(n, 10) for n in wide if abs(n) < 10**38],
        "decimal(38,0)": [decimal.Decimal(n) for n in wide if abs(n) < 10**38],
    }


def test_edge_values_agree_with_spark(spark):
    by_name = _edge_values()
    columns = [c for c in COLUMNS if isinstance(c.spec, str)]
    assert {c.spec for c in columns} == set(by_name)  # every named type has edge values
    longest = max(len(v) for v in by_name.values())
    # Row r holds each column's edge value r (wrapping), then one row of nulls.
    rows = [
        tuple(by_name[c.spec][r % len(by_name[c.spec])] for c in columns) for r in range(longest)
    ]
    rows.append((None,) * len(columns))
    at = {c.spec: j for j, c in enumerate(columns)}
    keys = [(j,) for j in range(len(columns))] + [
        (at["string"], at["long"]),
        (at["string"], at["timestamp"], at["integer"]),
        (at["date"], at["binary"], at["float"], at["double"]),
        (at["void"], at["string"], at["void"], at["decimal(38,0)"]),
    ]
    _assert_agree(spark, columns, rows, keys, (200, 7, 1))


@settings(PROPERTY, max_examples=2)
@given(
    st.lists(
        st.tuples(st.none() | st.text(max_size=12), st.integers(-(2**63), 2**63 - 1), _INSTANTS),
        min_size=1,
        max_size=200,
    ),
    st.integers(1, 300),
)
def test_a_shuffle_puts_each_key_in_the_partition_iqkit_computes(spark, rows, partitions):
    # A windowed aggregation's state is partitioned like this repartition: Spark hashes
    # the grouping columns (here a string, a long and a window struct made by window()).
    from pyspark.sql import functions as F

    schema = T.StructType(
        [
            T.StructField("i", T.IntegerType()),
            T.StructField("k", T.StringType()),
            T.StructField("n", T.LongType()),
            T.StructField("ts", T.TimestampType()),
        ]
    )
    df = spark.createDataFrame([(i, *row) for i, row in enumerate(rows)], schema)
    keyed = df.select("i", "k", "n", F.window("ts", "10 minutes").alias("w"))
    key_schema = T.StructType([keyed.schema["k"], keyed.schema["n"], keyed.schema["w"]])
    hasher = SparkKeyHasher(key_schema.json())  # the schema as a checkpoint's file holds it
    got = (
        keyed.repartition(partitions, "k", "n", "w")
        .select(
            F.spark_partition_id().alias("p"),
            "i",
            F.unix_micros("w.start").alias("start"),
            F.unix_micros("w.end").alias("end"),
        )
        .collect()
    )
    assert sorted(r.i for r in got) == list(range(len(rows)))
    for r in got:
        k, n, _ = rows[r.i]
        window = {
            "start": datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=r.start),
            "end": datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=r.end),
        }
        assert hasher.partition((k, n, window), partitions) == r.p, rows[r.i]
        assert hasher.partition({"k": k, "n": n, "w": window}, partitions) == r.p


# -- without Spark: what iqkit refuses -----------------------------------------------------
def test_collated_strings_maps_and_unknown_types_are_refused():
    # Spark hashes a collated string by its collation, not its bytes: no guessing.
    lcase = T.StructType([T.StructField("s", T.StringType("UTF8_LCASE"))]).jsonValue()
    with pytest.raises(NotImplementedError, match="UTF8_LCASE"):
        SparkKeyHasher(lcase)
    with pytest.raises(NotImplementedError, match="collation"):
        spark_hash(["a"], ["string collate UNICODE_CI"])
    binary = T.StructType([T.StructField("s", T.StringType("UTF8_BINARY"))]).jsonValue()
    assert SparkKeyHasher(binary).hash("a") == spark_hash(["a"], ["string"])
    with pytest.raises(NotImplementedError, match="map"):
        spark_hash([{}], [T.MapType(T.StringType(), T.LongType()).jsonValue()])
    with pytest.raises(NotImplementedError, match="variant"):
        spark_hash([1], ["variant"])


def test_values_outside_a_type_are_refused():
    with pytest.raises(ValueError, match="integer range"):
        spark_hash([2**31], ["integer"])
    with pytest.raises(ValueError, match="long range"):
        spark_hash([2**63], ["long"])
    with pytest.raises(ValueError, match="more digits"):
        spark_hash([decimal.Decimal("1000.00")], ["decimal(5,2)"])
    with pytest.raises(TypeError, match="string"):
        spark_hash([b"x"], ["string"])
    with pytest.raises(ValueError, match="more digits"):
        spark_hash([decimal.Decimal("1E+300")], ["decimal(38,2)"])
    with pytest.raises(TypeError, match="timestamp"):
        spark_hash([date(2024, 1, 1)], ["timestamp"])
    with pytest.raises(TypeError, match="date"):  # a datetime is not a date
        spark_hash([datetime(2024, 1, 1)], ["date"])
    with pytest.raises(TypeError, match="long"):  # nor is a float an integer
        spark_hash([1.0], ["long"])
    with pytest.raises(ValueError, match="field types"):
        spark_hash([("a", 1)], ["struct"])
    with pytest.raises(ValueError, match="2 column values"):
        spark_hash(["a"], ["string", "long"])
    with pytest.raises(ValueError, match="positive"):
        spark_partition(["a"], ["string"], 0)


def test_spellings_of_one_type_hash_alike():
    # SQL's names, pyspark types and their JSON are the same types; numpy scalars and a
    # Row-like tuple are plain values.
    import numpy as np

    assert (
        spark_hash([5], ["int"])
        == spark_hash([5], ["integer"])
        == spark_hash([5], [T.IntegerType()])
    )
    assert spark_hash([np.int64(-5)], ["bigint"]) == spark_hash([-5], ["long"])
    assert spark_hash([np.float32(0.5)], ["float"]) == spark_hash([0.5], ["float"])
    assert spark_hash(["x"], ["varchar(3)"]) == spark_hash(["x"], ["string"])
    assert spark_hash([decimal.Decimal(7)], ["decimal"]) == spark_hash([7], ["decimal(10,0)"])
    window = SparkKeyHasher(_WINDOW_TYPE)  # a pyspark StructType: its columns are the fields
    start, end = datetime(2024, 5, 1, tzinfo=UTC), datetime(2024, 5, 1, 0, 10, tzinfo=UTC)
    assert window.columns == ("start", "end")
    assert window.hash((start, end)) == spark_hash([start, end], ["timestamp", "timestamp"])
