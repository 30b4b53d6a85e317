"""spark.read.format("iqkit"): schema rules, one input partition per store partition,
narrowing read options proven by the input partitions Spark plans and by the reader's
trace files (one per store partition actually read, naming the IQv2 query it ran), pinned
versions; ``where()`` filters are Spark's and never leak between DataFrames.

Every test reads real stores written with ``iqkit.create_store``/``StoreWriter`` through a
real local Spark session; expected rows come from the engine or from what was written.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import functions as F

import iqkit
from iqkit import KeyQuery, PrefixScanQuery, RangeQuery, WindowKeyQuery
from iqkit.spark.datasource import IqkitReader, register
from iqkit.store.formats import format_for
from iqkit.store.roots import parse_root

N_PARTITIONS = 4
CUSTOMERS = [f"cust-{i:02d}" for i in range(40)]


def order(i: int) -> dict:
    return {"customer": CUSTOMERS[i], "total": i * 10, "tags": ["a", "b"][: i % 3]}


@pytest.fixture(scope="module", autouse=True)
def iqkit_format(spark):
    register(spark)
    yield


@pytest.fixture(scope="module")
def orders_root(tmp_path_factory) -> Path:
    """string -> json, murmur2, 4 partitions, 40 customers (+ two odd values)."""
    root = tmp_path_factory.mktemp("orders") / "stores"
    iqkit.create_store(root, "orders", partitions=N_PARTITIONS)
    with iqkit.StoreWriter(root, "orders") as w:
        for i in range(len(CUSTOMERS)):
            w.put(CUSTOMERS[i], order(i), source=("orders", 0, i))
        w.put("odd-scalar", 7)  # not a JSON object
        w.put("odd-types", {"customer": 5, "total": "many"})  # members of the wrong type
    return root


def reader(spark, root, store, **options):
    """A read of ``store``; one Spark task per store partition read unless the test says
    otherwise (``max_partition_bytes``), so the input partitions show which store
    partitions a narrowed read plans (packing is tests/spark/test_read_tasks.py's)."""
    options.setdefault("max_partition_bytes", "1")
    r = spark.read.format("iqkit").option("store", store)
    for name, value in options.items():
        r = r.option(name, value)
    return r.load(str(root))


def owner(root, store, key) -> int:
    with iqkit.open(root) as engine:
        return engine.partition_for_key(store, key)


def traces(folder: Path) -> list[dict]:
    if not folder.exists():
        return []
    return sorted(
        (json.loads(p.read_text()) for p in folder.glob("*.json")),
        key=lambda t: t["partition"],
    )


def clear(folder: Path) -> None:
    for f in folder.glob("*.json"):
        f.unlink()


def keys_of(df) -> list:
    return sorted(row["key"] for row in df.collect())


def expected_orders() -> dict[str, dict]:
    out = {c: order(i) for i, c in enumerate(CUSTOMERS)}
    out["odd-scalar"] = 7
    out["odd-types"] = {"customer": 5, "total": "many"}
    return out


# -- full reads --------------------------------------------------------------------------------
def test_kv_json_store_reads_every_record_with_its_partition(spark, orders_root):
    df = reader(spark, orders_root, "orders")
    assert df.schema.simpleString() == "struct<partition:int,key:string,value:string>"
    assert df.rdd.getNumPartitions() == N_PARTITIONS
    rows = df.collect()
    expected = expected_orders()
    assert sorted(r["key"] for r in rows) == sorted(expected)
    for r in rows:
        assert json.loads(r["value"]) == expected[r["key"]]
        assert r["partition"] == owner(orders_root, "orders", r["key"])


def test_value_schema_expands_json_objects_into_columns(spark, orders_root):
    df = reader(spark, orders_root, "orders", value_schema="customer string, total bigint")
    assert df.columns == ["partition", "key", "customer", "total"]
    assert df.schema["total"].dataType.simpleString() == "bigint"
    got = {r["key"]: (r["customer"], r["total"]) for r in df.collect()}
    for i, c in enumerate(CUSTOMERS):
        assert got[c] == (c, i * 10)
    # PERMISSIVE like from_json: a non-object is all nulls, a mistyped member is null and a
    # string column receives a non-string member as its JSON text.
    assert got["odd-scalar"] == (None, None)
    assert got["odd-types"] == ("5", None)


def test_value_schema_with_nested_types(spark, orders_root):
    df = reader(spark, orders_root, "orders", value_schema="tags array<string>, missing double")
    got = {r["key"]: (r["tags"], r["missing"]) for r in df.collect()}
    assert got["cust-02"] == (["a", "b"], None)
    assert got["cust-01"] == (["a"], None)


@pytest.mark.parametrize(
    ("key_serde", "value_serde", "items", "schema"),
    [
        (
            "int32",
            "int64",
            [(-5, -(2**40)), (0, 0), (7, 2**40), (2**31 - 1, 1)],
            "struct<partition:int,key:int,value:bigint>",
        ),
        (
            "int64",
            "int32",
            [(-(2**62), -1), (3, 3), (2**62, 2**31 - 1)],
            "struct<partition:int,key:bigint,value:int>",
        ),
        (
            "bytes",
            "double",
            [(b"\x00", -1.5), (b"ab", 2.25), (b"\xff\x01", 1e300)],
            "struct<partition:int,key:binary,value:double>",
        ),
        (
            "double",
            "string",
            [(-0.5, "neg"), (3.25, "pos"), (1e-9, "tiny")],
            "struct<partition:int,key:double,value:string>",
        ),
    ],
)
def test_scalar_serdes_map_to_spark_types(spark, root, key_serde, value_serde, items, schema):
    iqkit.create_store(root, "s", partitions=3, key_serde=key_serde, value_serde=value_serde)
    with iqkit.StoreWriter(root, "s") as w:
        for k, v in items:
            w.put(k, v)
    df = reader(spark, root, "s")
    assert df.schema.simpleString() == schema
    assert df.rdd.getNumPartitions() == 3
    got = sorted((r["key"], r["value"]) for r in df.collect())
    assert got == sorted(items)
    for r in df.collect():
        assert r["partition"] == owner(root, "s", r["key"])


def test_window_store_reads_windows_as_timestamps(spark, root):
    iqkit.create_store(root, "clicks", partitions=2, kind="window", window_size_ms=60_000)
    t0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    written = {}
    with iqkit.StoreWriter(root, "clicks") as w:
        for i, user in enumerate(["ann", "bob", "cy"]):
            for minute in range(3):
                start = int(t0.timestamp() * 1000) + minute * 60_000
                value = {"clicks": i * 10 + minute}
                w.put(user, value, window_start=start)
                written[(user, start)] = value
    df = reader(spark, root, "clicks")
    assert df.schema.simpleString() == (
        "struct<partition:int,key:string,window_start:timestamp,window_end:timestamp,value:string>"
    )
    assert df.rdd.getNumPartitions() == 2
    rows = df.collect()
    assert len(rows) == len(written)
    for r in rows:
        start_ms = int(r["window_start"].replace(tzinfo=UTC).timestamp() * 1000)
        end_ms = int(r["window_end"].replace(tzinfo=UTC).timestamp() * 1000)
        assert end_ms - start_ms == 60_000
        assert json.loads(r["value"]) == written[(r["key"], start_ms)]
        assert r["partition"] == owner(root, "clicks", r["key"])


def test_window_store_key_and_time_options(spark, root, tmp_path):
    iqkit.create_store(root, "clicks", partitions=4, kind="window", window_size_ms=1000)
    with iqkit.StoreWriter(root, "clicks") as w:
        for user in ("ann", "bob", "cy", "dee"):
            for s in range(10):
                w.put(user, s, window_start=s * 1000)
    trace_dir = tmp_path / "trace"
    sel = reader(
        spark,
        root,
        "clicks",
        key="bob",
        time_from="4000",
        time_to="1970-01-01T00:00:06",  # ISO-8601, naive = UTC; both ends inclusive
        _trace_dir=str(trace_dir),
    )
    assert sel.rdd.getNumPartitions() == 1
    got = sorted((r["key"], r["window_start"].second, r["value"]) for r in sel.collect())
    assert got == [("bob", 4, "4"), ("bob", 5, "5"), ("bob", 6, "6")]
    (t,) = traces(trace_dir)
    assert t["partition"] == owner(root, "clicks", "bob")
    assert t["queries"] == [repr(WindowKeyQuery.with_key_and_window_start_range("bob", 4000, 6000))]
    # times alone: every partition, a WindowRangeQuery over the time range
    every = reader(spark, root, "clicks", time_from="8000")
    assert sorted((r["key"], r["value"]) for r in every.collect()) == sorted(
        (u, str(s)) for u in ("ann", "bob", "cy", "dee") for s in (8, 9)
    )
    # where() on window_start is Spark's, and right
    df = reader(spark, root, "clicks")
    lo = datetime.fromtimestamp(3, UTC)
    late = df.filter((F.col("key") == "bob") & (F.col("window_start") > lo))
    assert sorted(r["value"] for r in late.collect()) == [str(s) for s in range(4, 10)]


def test_an_empty_store_is_an_empty_dataframe(spark, root):
    iqkit.create_store(root, "empty", partitions=3, key_serde="int64", value_serde="string")
    df = reader(spark, root, "empty")
    assert df.schema.simpleString() == "struct<partition:int,key:bigint,value:string>"
    assert df.collect() == []


def test_partitions_without_data_read_as_no_rows(spark, root):
    iqkit.create_store(root, "sparse", partitions=4, partitioner="explicit")
    with iqkit.StoreWriter(root, "sparse") as w:
        w.put("a", 1, partition=2)
    df = reader(spark, root, "sparse")
    assert df.rdd.getNumPartitions() == 4
    assert [(r["partition"], r["key"], r["value"]) for r in df.collect()] == [(2, "a", "1")]


# -- narrowing options -------------------------------------------------------------------------
def test_key_option_reads_exactly_one_store_partition(spark, orders_root, tmp_path):
    trace_dir = tmp_path / "trace"
    one = reader(spark, orders_root, "orders", key="cust-07", _trace_dir=str(trace_dir))
    assert one.rdd.getNumPartitions() == 1  # partitions() planned one input partition
    rows = one.collect()
    assert [(r["partition"], r["key"]) for r in rows] == [
        (owner(orders_root, "orders", "cust-07"), "cust-07")
    ]
    assert json.loads(rows[0]["value"]) == order(7)
    (t,) = traces(trace_dir)  # one store partition was opened, with a point lookup
    assert t["partition"] == owner(orders_root, "orders", "cust-07")
    assert t["queries"] == [repr(KeyQuery.with_key("cust-07"))]
    assert t["rows"] == 1
    assert one.count() == 1 and one.count() == 1  # a narrowed DataFrame stays narrowed


def test_key_option_on_a_missing_key_is_empty(spark, orders_root):
    df = reader(spark, orders_root, "orders", key="nobody")
    assert df.rdd.getNumPartitions() == 1
    assert df.collect() == []


def test_keys_option_reads_only_the_owning_partitions(spark, orders_root, tmp_path):
    trace_dir = tmp_path / "trace"
    wanted = ["cust-01", "cust-02", "cust-03", "cust-04", "nobody"]
    sel = reader(spark, orders_root, "orders", keys=json.dumps(wanted), _trace_dir=str(trace_dir))
    owners = {owner(orders_root, "orders", k) for k in wanted}
    assert sel.rdd.getNumPartitions() == len(owners)
    assert keys_of(sel) == ["cust-01", "cust-02", "cust-03", "cust-04"]
    read = traces(trace_dir)
    assert {t["partition"] for t in read} == owners
    for t in read:
        (q,) = t["queries"]
        assert q.startswith(("KeyQuery(", "MultiKeyQuery("))
    # PySpark turns a Python list option into its repr; that is accepted too
    as_list = spark.read.format("iqkit").option("store", "orders").option("keys", wanted[:2])
    assert keys_of(as_list.load(str(orders_root))) == ["cust-01", "cust-02"]


def test_prefix_option_is_a_prefix_scan(spark, orders_root, tmp_path):
    trace_dir = tmp_path / "trace"
    sel = reader(spark, orders_root, "orders", prefix="cust-1", _trace_dir=str(trace_dir))
    assert keys_of(sel) == [f"cust-1{i}" for i in range(10)]
    read = traces(trace_dir)
    assert len(read) == N_PARTITIONS
    assert all(t["queries"] == [repr(PrefixScanQuery.with_prefix("cust-1"))] for t in read)
    assert sum(t["rows"] for t in read) == 10


def test_key_range_options_on_string_keys(spark, orders_root, tmp_path):
    trace_dir = tmp_path / "trace"
    sel = reader(
        spark,
        orders_root,
        "orders",
        key_from="cust-06",
        key_to="cust-12",
        _trace_dir=str(trace_dir),
    )
    assert keys_of(sel) == [f"cust-{i:02d}" for i in range(6, 13)]
    read = traces(trace_dir)
    assert all(t["queries"] == [repr(RangeQuery.with_range("cust-06", "cust-12"))] for t in read)
    assert keys_of(reader(spark, orders_root, "orders", key_from="odd")) == [
        "odd-scalar",
        "odd-types",
    ]
    assert keys_of(reader(spark, orders_root, "orders", key_to="cust-01")) == [
        "cust-00",
        "cust-01",
    ]
    assert keys_of(reader(spark, orders_root, "orders", key_from="x", key_to="a")) == []


def test_partitions_option_prunes_input_partitions(spark, orders_root, tmp_path):
    trace_dir = tmp_path / "trace"
    p2 = reader(spark, orders_root, "orders", partitions="2", _trace_dir=str(trace_dir))
    assert p2.rdd.getNumPartitions() == 1
    rows = p2.collect()
    assert rows and {r["partition"] for r in rows} == {2}
    expected = sorted(k for k in expected_orders() if owner(orders_root, "orders", k) == 2)
    assert sorted(r["key"] for r in rows) == expected
    assert [t["partition"] for t in traces(trace_dir)] == [2]
    two = reader(spark, orders_root, "orders", partitions="0,3")
    assert two.rdd.getNumPartitions() == 2
    assert {r["partition"] for r in two.collect()} == {0, 3}
    assert reader(spark, orders_root, "orders", partitions="1-3").rdd.getNumPartitions() == 3
    # a where() on partition is Spark's filter: right, and reads every partition
    assert {r["partition"] for r in reader(spark, orders_root, "orders").where("partition = 1")
            .collect()} == {1}  # fmt: skip


def test_key_and_partitions_options_combine(spark, orders_root):
    home = owner(orders_root, "orders", "cust-07")
    other = (home + 1) % N_PARTITIONS
    miss = reader(spark, orders_root, "orders", key="cust-07", partitions=str(other))
    assert miss.collect() == []
    hit = reader(spark, orders_root, "orders", key="cust-07", partitions=str(home))
    assert [r["key"] for r in hit.collect()] == ["cust-07"]


def test_filters_are_spark_s_and_correct(spark, orders_root):
    df = reader(spark, orders_root, "orders", value_schema="customer string, total bigint")
    sel = df.filter((F.col("total") > 300) & F.col("key").startswith("cust-3"))
    assert keys_of(sel) == [f"cust-{i}" for i in range(31, 40)]
    assert keys_of(df.filter(F.col("total").isNull())) == ["odd-scalar", "odd-types"]
    raw = reader(spark, orders_root, "orders")
    assert keys_of(raw.filter(F.col("value").contains('"total":390'))) == ["cust-39"]
    assert len(raw.filter(F.col("key") != "cust-00").collect()) == len(expected_orders()) - 1
    either = raw.filter((F.col("key") == "cust-00") | (F.col("value") == "7"))
    assert keys_of(either) == ["cust-00", "odd-scalar"]
    # options and where() together: the where() applies to the narrowed rows
    narrowed = reader(spark, orders_root, "orders", prefix="cust-3", value_schema="total bigint")
    assert keys_of(narrowed.where("total >= 370")) == ["cust-37", "cust-38", "cust-39"]


def test_int_keys_are_typed_and_ranges_need_an_order_preserving_serde(spark, root, tmp_path):
    iqkit.create_store(root, "ints", partitions=4, key_serde="int32", value_serde="int64")
    with iqkit.StoreWriter(root, "ints") as w:
        for k in range(-10, 11):
            w.put(k, k * 100)
    trace_dir = tmp_path / "trace"
    five = reader(spark, root, "ints", key="5", _trace_dir=str(trace_dir))
    assert five.rdd.getNumPartitions() == 1
    assert [(r["key"], r["value"]) for r in five.collect()] == [(5, 500)]
    assert [t["queries"] for t in traces(trace_dir)] == [[repr(KeyQuery.with_key(5))]]
    many = reader(spark, root, "ints", keys="[-3, 4, 99]")
    assert sorted(r["key"] for r in many.collect()) == [-3, 4]
    # big-endian int32 bytes do not sort negatives first: a key range is refused by name...
    with pytest.raises(Exception, match=r"key_from'/'key_to' need keys whose byte order"):
        reader(spark, root, "ints", key_from="-3")
    # ...and where() is right
    between = reader(spark, root, "ints").filter((F.col("key") > -3) & (F.col("key") <= 2))
    assert sorted(r["key"] for r in between.collect()) == [-2, -1, 0, 1, 2]
    with pytest.raises(Exception, match=r"option 'key': serde 'int32' cannot parse 'five'"):
        reader(spark, root, "ints", key="five")


def test_explicit_store_key_lookup_reads_every_partition_and_is_right(spark, root):
    iqkit.create_store(root, "placed", partitions=3, partitioner="explicit")
    with iqkit.StoreWriter(root, "placed") as w:
        w.put("a", 1, partition=0)
        w.put("b", 2, partition=2)
        w.put("a", 3, partition=2)  # explicit stores may hold one key in several places
    sel = reader(spark, root, "placed", key="a")
    assert sel.rdd.getNumPartitions() == 3  # no function of the key says where it lives
    assert sorted((r["partition"], r["value"]) for r in sel.collect()) == [(0, "1"), (2, "3")]


def test_ordered_keys_with_declared_columns(spark, root, tmp_path):
    iqkit.create_store(
        root,
        "by_region",
        partitions=3,
        key_serde="ordered",
        properties={"key_columns": ["region", "customer"], "key_types": ["string", "bigint"]},
    )
    data = {(r, c): {"n": i} for i, (r, c) in enumerate((r, c) for r in "ab" for c in range(5))}
    with iqkit.StoreWriter(root, "by_region") as w:
        for k, v in data.items():
            w.put(k, v)
    trace_dir = tmp_path / "trace"
    df = reader(spark, root, "by_region")
    assert df.schema.simpleString() == (
        "struct<partition:int,region:string,customer:bigint,value:string>"
    )
    got = {(r["region"], r["customer"]): json.loads(r["value"]) for r in df.collect()}
    assert got == data
    point = reader(spark, root, "by_region", key='["b", 3]', _trace_dir=str(trace_dir))
    assert point.rdd.getNumPartitions() == 1
    assert [(r["region"], r["customer"]) for r in point.collect()] == [("b", 3)]
    (t,) = traces(trace_dir)
    assert t["queries"] == [repr(KeyQuery.with_key(("b", 3)))]
    clear(trace_dir)
    lead = reader(spark, root, "by_region", prefix='["a"]', _trace_dir=str(trace_dir))
    assert sorted(r["customer"] for r in lead.collect()) == [0, 1, 2, 3, 4]
    assert {q for t in traces(trace_dir) for q in t["queries"]} == {
        repr(PrefixScanQuery.with_prefix(("a",)))
    }
    # where() on a key column is Spark's filter
    assert sorted(r["customer"] for r in df.where("region = 'b' AND customer > 2").collect()) == [
        3,
        4,
    ]


def test_ordered_single_column_ranges(spark, root):
    iqkit.create_store(
        root,
        "seq",
        partitions=2,
        key_serde="ordered",
        value_serde="string",
        properties={"key_columns": ["n"], "key_types": ["bigint"]},
    )
    with iqkit.StoreWriter(root, "seq") as w:
        for n in range(-20, 21, 5):
            w.put(n, f"v{n}")
    df = reader(spark, root, "seq", key_from="-10", key_to="5")
    assert df.columns == ["partition", "n", "value"]
    assert sorted(r["n"] for r in df.collect()) == [-10, -5, 0, 5]


def test_ordered_keys_without_columns_are_json_text(spark, root):
    iqkit.create_store(root, "tuples", partitions=2, key_serde="ordered")
    with iqkit.StoreWriter(root, "tuples") as w:
        w.put(("eu", "ann"), 1)
        w.put(("us", 7, b"\x01"), 2)
        w.put("plain", 3)
    df = reader(spark, root, "tuples")
    assert df.schema.simpleString() == "struct<partition:int,key:string,value:string>"
    got = sorted((r["key"], r["value"]) for r in df.collect())
    assert got == [('"plain"', "3"), ('["eu","ann"]', "1"), ('["us",7,"0x01"]', "2")]
    assert keys_of(df.filter(F.col("key") == '["eu","ann"]')) == ['["eu","ann"]']


# -- versions, errors, configuration ---------------------------------------------------------
def test_as_of_reads_an_older_version(spark, root):
    iqkit.create_store(root, "v", partitions=2)
    with iqkit.StoreWriter(root, "v") as w:
        w.put("a", 1)
        w.put("b", 1)
    with iqkit.StoreWriter(root, "v") as w:
        w.put("a", 2)
        w.delete("b")
        w.put("c", 2)
    latest = {r["key"]: r["value"] for r in reader(spark, root, "v").collect()}
    assert latest == {"a": "2", "c": "2"}
    old = {r["key"]: r["value"] for r in reader(spark, root, "v", as_of=1).collect()}
    assert old == {"a": "1", "b": "1"}
    pinned = reader(spark, root, "v", as_of=1).filter(F.col("key") == "b")
    assert [r["value"] for r in pinned.collect()] == ["1"]


def test_as_of_a_version_that_does_not_exist_fails_naming_the_retained_ones(spark, root):
    iqkit.create_store(root, "v", partitions=1)
    with iqkit.StoreWriter(root, "v") as w:
        w.put("a", 1)
    with pytest.raises(Exception, match=r"no version 9 \(retained: 1\)"):
        reader(spark, root, "v", as_of=9).collect()


def test_every_partition_reads_the_version_resolved_at_planning(spark, root):
    """The driver resolves the version once when Spark plans the read; tasks that run
    after a new commit still read the planned version, all of them the same one."""
    iqkit.create_store(root, "moving", partitions=3)
    keys = [f"k{i}" for i in range(12)]
    with iqkit.StoreWriter(root, "moving") as w:
        for k in keys:
            w.put(k, 1)
    planned = reader(spark, root, "moving").rdd  # planning happens here, tasks run later
    assert planned.getNumPartitions() == 3
    with iqkit.StoreWriter(root, "moving") as w:  # a commit lands "mid-job"
        for k in keys:
            w.put(k, 2)
    assert sorted((r["key"], r["value"]) for r in planned.collect()) == [
        (k, "1") for k in sorted(keys)
    ]
    assert {r["value"] for r in reader(spark, root, "moving").collect()} == {"2"}

    # the same mechanism without Spark around it: the reader object carries the version
    schema = reader(spark, root, "moving").schema
    direct = IqkitReader({"path": str(root), "store": "moving"}, schema)
    assert direct.version == 2
    parts = direct.partitions()
    with iqkit.StoreWriter(root, "moving") as w:
        w.put("k0", 3)
    # Partitions with columnar twins come as Arrow record batches (rows otherwise).
    out = [item for part in parts for item in direct.read(part)]
    rows = [
        row
        for item in out
        for row in (
            [tuple(r.values()) for r in item.to_pylist()] if hasattr(item, "to_pylist") else [item]
        )
    ]
    assert {r[2] for r in rows} == {"2"} and len(rows) == len(keys)


def test_a_user_given_schema_picks_columns_and_decodes_json_members(spark, orders_root):
    df = (
        spark.read.format("iqkit")
        .schema("key string, total bigint, customer string")
        .option("store", "orders")
        .load(str(orders_root))
    )
    got = {r["key"]: (r["total"], r["customer"]) for r in df.collect()}
    assert got["cust-03"] == (30, "cust-03")
    assert len(got) == len(expected_orders())


def test_unknown_store_names_it_with_a_hint(spark, orders_root):
    with pytest.raises(Exception, match=r"unknown store 'ordrs'; did you mean 'orders'\?"):
        reader(spark, orders_root, "ordrs")


def test_missing_store_option_lists_the_stores(spark, orders_root):
    with pytest.raises(Exception, match=r"option 'store' is required \(stores under .*: orders"):
        spark.read.format("iqkit").load(str(orders_root))


def test_root_option_is_accepted(spark, orders_root):
    df = spark.read.format("iqkit").option("store", "orders").option("root", str(orders_root))
    assert df.load().count() == len(expected_orders())


def break_partition(root: Path, store: str, partition: int) -> None:
    """Make ``partition`` of ``store``'s latest version unreadable: its SSTs and their
    columnar twins are replaced by garbage (new files: a cached database's hard links
    keep the old bytes)."""
    version = format_for(parse_root(root)).latest_published(store)
    assert version is not None
    for f in version.partitions[partition].files:
        for name in f.object_keys():
            path = root / name
            path.unlink()
            path.write_bytes(b"not an sst")


def test_an_unreadable_partition_fails_the_read_with_the_reason(spark, root):
    iqkit.create_store(root, "broken", partitions=2)
    with iqkit.StoreWriter(root, "broken") as w:
        for k in ("a", "b", "c", "d"):
            w.put(k, 1)
    break_partition(root, "broken", 1)
    with pytest.raises(Exception, match=r"store 'broken' partition 1 .*STORE_EXCEPTION"):
        reader(spark, root, "broken").collect()
    # the healthy partition alone still reads
    assert reader(spark, root, "broken", partitions="0").count() > 0


def test_reading_sets_no_session_conf_and_works_with_pushdown_on_or_off(spark, orders_root):
    """iqkit must not change how other data sources behave: register() and reads leave
    Spark's Python filter-pushdown setting as the user had it, and either value works."""
    conf = "spark.sql.python.filterPushdown.enabled"
    before = spark.conf.get(conf, None)
    register(spark)
    reader(spark, orders_root, "orders").where("key = 'cust-07'").collect()
    assert spark.conf.get(conf, None) == before
    for value in ("true", "false"):
        spark.conf.set(conf, value)
        try:
            df = reader(spark, orders_root, "orders")
            assert keys_of(df.where("key = 'cust-07'")) == ["cust-07"]
            assert df.count() == len(expected_orders())
        finally:
            spark.conf.unset(conf)


def test_unknown_and_misplaced_options_are_refused_by_name(spark, orders_root, root):
    with pytest.raises(Exception, match=r"unknown read option\(s\) 'prefx'"):
        reader(spark, orders_root, "orders", prefx="cust")
    with pytest.raises(Exception, match=r"option 'time_from' does not apply to store 'orders'"):
        reader(spark, orders_root, "orders", time_from="0")
    with pytest.raises(Exception, match=r"option 'prefix' cannot be combined with a key lookup"):
        reader(spark, orders_root, "orders", key="a", prefix="b")
    with pytest.raises(Exception, match=r"'partitions': '7' is outside store 'orders'"):
        reader(spark, orders_root, "orders", partitions="7")
    with pytest.raises(Exception, match=r"option 'keys' takes a non-empty JSON array"):
        reader(spark, orders_root, "orders", keys="cust-01")
    iqkit.create_store(root, "w", partitions=1, kind="window", window_size_ms=10)
    with pytest.raises(Exception, match=r"option 'prefix' does not apply to store 'w'"):
        reader(spark, root, "w", prefix="a")
    with pytest.raises(Exception, match=r"option 'time_to' takes epoch milliseconds or ISO"):
        reader(spark, root, "w", time_to="yesterday")


def test_bad_value_schema_fails_at_load(spark, orders_root, root):
    with pytest.raises(Exception, match=r"value_schema' repeats column\(s\) key"):
        reader(spark, orders_root, "orders", value_schema="key string, total bigint")
    iqkit.create_store(root, "nums", partitions=1, value_serde="int64")
    with pytest.raises(Exception, match=r"needs a store with json values; store 'nums'"):
        reader(spark, root, "nums", value_schema="total bigint")
