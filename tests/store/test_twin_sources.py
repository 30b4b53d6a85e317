"""A Spark writer's twin made from its own typed columns (``twin_table_of_columns``) is
exactly the twin shaped from the stored rows it writes (``twin_table``): same columns,
types, values (floats bit for bit), field and schema metadata. The stored rows are what
the data source's tasks write (``to_json.json_records``, Spark's ``to_json`` spelling),
so the columns a twin is copied from must read back from that JSON unchanged.

And where a twin cannot be copied (no value schema, a nested member, a composite key, a
key serde whose column does not give the key back, a type other than the declared one),
no columns are asked for, or none are taken.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iqkit.store.columnar.twins import (
    twin_source_columns,
    twin_table,
    twin_table_of_columns,
)
from iqkit.store.encoding.json_arrow import json_records
from iqkit.store.encoding.keyspace import kv_keys_arrow
from iqkit.store.encoding.serdes import get_serde
from iqkit.store.manifest import StoreKind, StoreManifest

UTC = dt.UTC
#: Spark DDL type → (Arrow type Spark hands a writer, strategy of its values).
MEMBERS = {
    "tinyint": (pa.int8(), st.integers(-128, 127)),
    "int": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "bigint": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "double": (pa.float64(), st.floats(allow_nan=False, allow_infinity=False)),
    "float": (pa.float32(), st.floats(allow_nan=False, allow_infinity=False, width=32)),
    "boolean": (pa.bool_(), st.booleans()),
    # Quotes, backslashes, controls and non-ASCII: JSON escapes some of them.
    "string": (pa.string(), st.text(max_size=6)),
    "decimal(38,18)": (
        pa.decimal128(38, 18),
        st.decimals(-(10**19) + 1, 10**19 - 1, places=18, allow_nan=False),
    ),
    "decimal(5,2)": (pa.decimal128(5, 2), st.decimals(-999, 999, places=2, allow_nan=False)),
    "date": (pa.date32(), st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31))),
    "timestamp": (
        pa.timestamp("us", tz="UTC"),
        st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30), timezones=st.just(UTC)),
    ),
    "timestamp_ntz": (
        pa.timestamp("us"),
        st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30)),
    ),
    "binary": (pa.binary(), st.binary(max_size=5)),
}
KEYS = {
    "string": (pa.string(), st.text(max_size=4)),
    "int32": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "bytes": (pa.binary(), st.binary(max_size=4)),
}


def manifest(key_serde: str, members: list[tuple[str, str]], **extra: object) -> StoreManifest:
    properties = {
        "key_columns": ["id"],
        "value_column": None,
        "record_columns": [name for name, _ in members],
        "value_schema": ", ".join(f"`{n}` {t}" for n, t in members),
        **extra,
    }
    return StoreManifest(
        name="s",
        kind=StoreKind.KEY_VALUE,
        partitions=1,
        key_serde=key_serde,
        value_serde="json",
        partitioner="murmur2",
        properties=properties,
    )


@st.composite
def fragments(draw: st.DrawFn) -> tuple[StoreManifest, pa.Table]:
    """A typed store and a fragment's columns (``id`` then the members), sorted by the
    RocksDB key, each key once."""
    key_serde = draw(st.sampled_from(sorted(KEYS)))
    ddls = draw(st.lists(st.sampled_from(sorted(MEMBERS)), min_size=1, max_size=4))
    # A member called like the key or the partition column is renamed in the layout.
    names = draw(
        st.lists(
            st.sampled_from(["a", "b", "partition", "value", "id2", "ü"]),
            min_size=len(ddls),
            max_size=len(ddls),
            unique=True,
        )
    )
    members = list(zip(names, ddls, strict=True))
    key_type, key_values = KEYS[key_serde]
    keys = draw(st.lists(key_values, min_size=1, max_size=12, unique=True))
    serde = get_serde(key_serde)
    keys.sort(key=lambda k: serde.serialize(k))
    columns = {"id": pa.array(keys, key_type)}
    for name, ddl in members:
        arrow_type, values = MEMBERS[ddl]
        column = draw(st.lists(st.none() | values, min_size=len(keys), max_size=len(keys)))
        columns[name] = pa.array(column, arrow_type)
    return manifest(key_serde, members), pa.table(columns)


def stored_rows(m: StoreManifest, columns: pa.Table) -> list[tuple[bytes, bytes]]:
    """The rows the data source's task writes for ``columns``."""
    serde = get_serde(m.key_serde)
    keys = kv_keys_arrow(pa.array([serde.serialize(k) for k in columns["id"].to_pylist()]))
    batch = columns.combine_chunks().to_batches()[0]
    values = json_records(batch, columns.column_names[1:]).cast(pa.binary())
    return list(zip(keys.to_pylist(), values.to_pylist(), strict=True))


def same_table(a: pa.Table, b: pa.Table) -> bool:
    """Equal, metadata too, floats compared by their bits (-0.0 is not 0.0)."""
    if not a.schema.equals(b.schema, check_metadata=True):
        return False
    for name in a.column_names:
        x, y = a.column(name).to_pylist(), b.column(name).to_pylist()
        for u, v in zip(x, y, strict=True):
            if isinstance(u, float) and isinstance(v, float):
                if math.copysign(1, u) != math.copysign(1, v) or u != v:
                    return False
            elif u != v or type(u) is not type(v):
                return False
    return True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fragments())
def test_a_twin_copied_from_the_columns_is_the_twin_of_the_stored_rows(fragment):
    m, columns = fragment
    assert twin_source_columns(m) == tuple(columns.column_names)
    copied = twin_table_of_columns(m, columns)
    shaped = twin_table(m, stored_rows(m, columns))
    assert copied is not None
    assert same_table(copied, shaped), (copied.to_pylist(), shaped.to_pylist())


def test_timestamps_in_the_session_zone_are_the_same_instants():
    m = manifest("string", [("at", "timestamp")])
    at = dt.datetime(2024, 3, 1, 12, 30, 0, 123456, tzinfo=UTC)
    columns = pa.table(
        {"id": pa.array(["k"]), "at": pa.array([at], pa.timestamp("us", tz="Europe/Paris"))}
    )
    copied = twin_table_of_columns(m, columns)
    assert copied is not None
    assert copied.column("at").type == pa.timestamp("us", tz="UTC")
    assert same_table(copied, twin_table(m, stored_rows(m, columns)))


@pytest.mark.parametrize(
    ("m", "why"),
    [
        (manifest("string", [("tags", "array<string>")]), "a nested member"),
        (manifest("string", [("p", "struct<a:int>")]), "a nested member"),
        (manifest("double", [("a", "int")]), "double keys: the twin keeps __key"),
        (manifest("ordered", [("a", "int")], key_columns=["x", "y"]), "a composite key"),
        (manifest("string", [("a", "int")], value_schema=None), "no value schema"),
    ],
)
def test_no_columns_are_asked_for_where_the_twin_is_shaped(m, why):
    assert twin_source_columns(m) is None, why


def test_columns_of_another_type_are_not_taken():
    m = manifest("string", [("n", "bigint"), ("d", "decimal(5,2)")])
    wrong = pa.table(
        {
            "id": pa.array(["a"]),
            "n": pa.array([1], pa.int32()),  # declared bigint
            "d": pa.array([decimal.Decimal("1.50")], pa.decimal128(5, 2)),
        }
    )
    assert twin_table_of_columns(m, wrong) is None
    reordered = wrong.select(["id", "d", "n"])
    assert twin_table_of_columns(m, reordered) is None
