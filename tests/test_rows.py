"""The row schema (``iqkit.store.rows``, issue 12 item 1): one layout of a store's rows for
Arrow tables (``%iq``, the panel, SQL) and the Spark reader."""

from __future__ import annotations

import pyarrow as pa
import pytest
from helpers import store_manifest as manifest
from helpers import write_store

import iqkit
from iqkit.store.rows import RowSchema, ddl_names, split_ddl_list
from iqkit.tables import store_batches


def test_key_value_rows():
    rows = RowSchema(manifest(key_serde="int32", value_serde="int64"))
    assert rows.arrow_types() == {"partition": pa.int32(), "key": pa.int32(), "value": pa.int64()}
    assert rows.spark_ddl() == "`partition` INT, `key` INT, `value` BIGINT"


def test_window_rows_have_utc_window_columns_before_the_value():
    rows = RowSchema(manifest("window"))
    window = pa.timestamp("ms", tz="UTC")
    assert rows.arrow_types() == {
        "partition": pa.int32(),
        "key": pa.string(),
        "window_start": window,
        "window_end": window,
        "value": None,  # a JSON value's type is its values'
    }
    names = ["partition", "key", "window_start", "window_end", "value"]
    assert ddl_names(rows.spark_ddl()) == names


def test_raw_rows_are_bytes_and_never_windowed():
    rows = RowSchema(manifest("window", key_serde="int64"), raw=True)
    assert not rows.windowed
    assert rows.arrow_types() == {"partition": pa.int32(), "key": pa.binary(), "value": pa.binary()}


def test_declared_key_columns():
    declared = manifest(key_serde="ordered", key_columns="region, user")  # written by hand
    rows = RowSchema(declared)
    assert rows.tuple_key_columns == ["region", "user"]
    assert [rows.key_element_column(i) for i in range(3)] == ["region", "user", "key_2"]
    # Spark fixes types before reading: without key_types the key is its JSON text
    assert rows.typed_key_columns() is None
    assert ddl_names(rows.spark_ddl()) == ["partition", "key", "value"]
    typed = RowSchema(
        manifest(key_serde="ordered", key_columns=["n", "d"], key_types="bigint, decimal(10,2)")
    )
    assert typed.typed_key_columns() == [("n", "bigint"), ("d", "decimal(10,2)")]
    assert typed.spark_ddl() == "`partition` INT, `n` bigint, `d` decimal(10,2), `value` STRING"
    mismatched = manifest(key_serde="ordered", key_columns=["a"], key_types=["int", "int"])
    with pytest.raises(ValueError, match="differ in length"):
        RowSchema(mismatched).typed_key_columns()


def test_a_single_declared_column_is_the_bare_key_in_tables_and_named_in_spark():
    rows = RowSchema(manifest(key_serde="ordered", key_columns=["n"], key_types=["bigint"]))
    assert rows.tuple_key_columns == []
    assert "key" in rows.arrow_types()
    assert ddl_names(rows.spark_ddl()) == ["partition", "n", "value"]


def test_keys_split_into_elements_and_record_fields_step_aside():
    rows = RowSchema(manifest(key_serde="ordered"))
    assert rows.key_parts([("a", 1), "b"]) == [("a", 1), ("b",)]
    taken = {"partition": 0, "key": 0, "value.key": 0}
    assert rows.field_column("key", taken) == "value.value.key"
    assert rows.field_column(7, taken) == "7"


def test_value_schema_is_checked_against_the_fixed_columns():
    rows = RowSchema(manifest("window"))
    ddl = rows.spark_ddl("a string, `b c` int")
    assert ddl.endswith("`window_end` TIMESTAMP, a string, `b c` int")
    with pytest.raises(ValueError, match=r"repeats column\(s\) window_start"):
        rows.spark_ddl("Window_Start string")
    with pytest.raises(ValueError, match="needs a store with json values"):
        RowSchema(manifest(value_serde="string")).spark_ddl("a string")


def test_slots_place_each_column_of_a_schema():
    rows = RowSchema(manifest("window"))
    names = ["value", "key", "window_end", "partition"]
    assert rows.slots(names, ["key"]) == [
        ("value", None),
        ("key", 0),
        ("window", 1),
        ("partition", None),
    ]
    assert rows.value_fields(names, ["key"]) is None
    assert rows.slots(["key", "total"], ["key"]) == [("key", 0), ("field", "total")]
    assert rows.slots(["value"], ["key"], value_schema=True) == [("field", "value")]


def test_split_ddl_list_keeps_nested_commas():
    assert split_ddl_list("a map<string,int>, b decimal(10,2),") == [
        "a map<string,int>",
        " b decimal(10,2)",
    ]


@pytest.mark.parametrize(
    "settings",
    [
        {"key_serde": "int32", "value_serde": "double"},
        {"kind": "window", "window_size_ms": 1000, "value_serde": "string"},
        {"key_serde": "ordered", "properties": {"key_columns": ["a"], "key_types": ["int"]}},
    ],
)
def test_tables_and_the_spark_schema_name_the_same_columns(tmp_path, settings):
    """An empty store streams the columns known before any row, which are the Spark
    schema's, except a single declared key column (see the module docstring)."""
    write_store(tmp_path, "s", [], **settings)
    with iqkit.open(tmp_path) as engine:
        arrow = store_batches(engine, "s").schema.names
        spark = ddl_names(RowSchema(engine.manifest("s")).spark_ddl())
    if "properties" in settings:
        assert arrow == ["partition", "key", "value"] and spark == ["partition", "a", "value"]
    else:
        assert arrow == spark
