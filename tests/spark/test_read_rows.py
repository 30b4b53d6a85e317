"""Row building of the Spark reader (``iqkit.spark.read_rows``) on its own: records of a
store as rows of a Spark schema, in the row schema's layout (``iqkit.store.rows``). Pure
Python: Spark's type objects need no session."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from helpers import store_manifest as manifest
from pyspark.sql.types import (
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from iqkit.errors import IqkitError
from iqkit.spark.read_rows import SparkRows, coerce, json_text
from iqkit.store.rows import RowSchema

UTC = dt.UTC


def schema(*fields):
    return StructType([StructField(n, t) for n, t in fields])


def row(rows: SparkRows, p, key, window, value):
    return rows.builder(p)(rows.splitter()(key), window, value)


def test_window_rows_in_schema_order_with_json_values_as_text():
    rows = SparkRows(
        RowSchema(manifest("window")),
        schema(
            ("partition", IntegerType()),
            ("key", StringType()),
            ("window_start", TimestampType()),
            ("window_end", TimestampType()),
            ("value", StringType()),
        ),
        value_schema=False,
    )
    assert row(rows, 1, "a", (1000, 2000), {"n": [1, b"\x01"]}) == (
        1,
        "a",
        dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
        dt.datetime(1970, 1, 1, 0, 0, 2, tzinfo=UTC),
        '{"n":[1,"0x01"]}',
    )


def test_ordered_keys_without_declared_types_are_json_text():
    rows = SparkRows(
        RowSchema(manifest(key_serde="ordered", value_serde="string")),
        schema(("partition", IntegerType()), ("key", StringType()), ("value", StringType())),
        value_schema=False,
    )
    assert row(rows, 0, ("eu", 7), None, "v") == (0, '["eu",7]', "v")


def test_declared_key_columns_are_coerced_and_a_misfit_fails_naming_the_key():
    store = manifest(key_serde="ordered", key_columns=["r", "n"], key_types=["string", "int"])
    rows = SparkRows(
        RowSchema(store),
        # a user-given schema may reorder and pick members of JSON values
        schema(("n", IntegerType()), ("total", DecimalType(10, 2)), ("r", StringType())),
        value_schema=False,
    )
    assert row(rows, 0, ("eu", 3), None, {"total": 1.5}) == (3, Decimal("1.5"), "eu")
    assert row(rows, 0, ("eu", 3), None, [1]) == (3, None, "eu")  # not an object: null
    with pytest.raises(IqkitError, match="does not fit the declared key type int"):
        row(rows, 0, ("eu", 2**40), None, {})
    with pytest.raises(IqkitError, match="does not match its key_columns"):
        row(rows, 0, ("eu",), None, {})


def test_value_schema_columns_are_json_members():
    rows = SparkRows(
        RowSchema(manifest()),
        schema(("partition", IntegerType()), ("key", StringType()), ("value", LongType())),
        value_schema=True,
    )
    assert row(rows, 0, "k", None, {"value": 5}) == (0, "k", 5)


@pytest.mark.parametrize(
    ("store", "fields", "message"),
    [
        (manifest(value_serde="string"), [("total", LongType())], "can only be decoded from json"),
        (manifest(), [("key", StringType()), ("key", StringType())], "appear twice"),
        (
            manifest(key_serde="ordered", key_columns=["partition"], key_types=["int"]),
            [("partition", IntegerType())],
            "clash with the partition or window columns",
        ),
    ],
)
def test_schemas_that_do_not_fit_the_store_are_refused(store, fields, message):
    with pytest.raises(ValueError, match=message):
        SparkRows(RowSchema(store), schema(*fields), value_schema=False)


def test_coerce_is_permissive():
    assert coerce("2024-05-01T12:00", TimestampType()) == dt.datetime(2024, 5, 1, 12, tzinfo=UTC)
    assert coerce(True, IntegerType()) is None
    assert coerce(2**31, IntegerType()) is None
    assert coerce({"a": 1}, StringType()) == json_text({"a": 1}) == '{"a":1}'
