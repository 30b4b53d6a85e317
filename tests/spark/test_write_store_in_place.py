"""write_store writes a DataFrame of few Spark partitions in place (``batch_in_place``: no
shuffle, each task's rows as fragments) and one of many through a shuffle; both give the
same store: the same rows in the same partitions, the same winner among duplicate keys,
the same deletes, the same typed columns, and the same errors for bad input."""

from __future__ import annotations

import math

import pytest
from helpers import kv_rows
from pyspark.sql import functions as F
from store_facts import version_record, written_counts

import iqkit
from iqkit.spark import write_store
from iqkit.spark.batch_in_place import IN_PLACE_MAX_PARTITIONS, writes_in_place
from iqkit.spark.schema import plan_columns
from iqkit.tables import collect

DDL = "key string, n long, x double, tag string"


def rows(count: int, keys: int, shift: int = 0) -> list[tuple]:
    """Rows with duplicate keys (``keys`` distinct), null members, -0.0 and big numbers."""
    return [
        (
            f"k{(i * 7919) % keys:04d}",
            i + shift if i % 11 else None,
            -0.0 if i % 13 == 0 else (i + shift) / 3 * 10 ** (i % 9),
            None if i % 5 == 0 else f"t{i % 4}é",
        )
        for i in range(count)
    ]


def ordered(spark, data: list[tuple], partitions: int, ddl: str = DDL):
    """``data`` split into ``partitions`` Spark partitions, in order (so the later row
    of a duplicate key is later in ``monotonically_increasing_id`` too)."""
    return spark.createDataFrame(spark.sparkContext.parallelize(data, partitions), ddl)


def store(root, name: str) -> tuple[list, list]:
    """Every row (partition, key, value) and the columns a scan collects."""
    with iqkit.open(root) as engine:
        request = iqkit.StateQueryRequest.in_store(name)
        result = engine.query(request.with_query(iqkit.RangeQuery.with_no_bounds()))
        table = collect(result, engine.manifest(name)).table
        return kv_rows(engine, name), table.sort_by(
            [("partition", "ascending"), ("key", "ascending")]
        ).to_pylist()


def same(a, b) -> bool:
    """Equal, floats by their bits (-0.0 is not 0.0)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b and type(a) is type(b)


def planned(df, key: str, value: str | None):
    return plan_columns(
        df, "s", key=key, value=value, key_serde=None, value_serde=None, window=None,
        partition_column=None,
    )  # fmt: skip


def test_the_path_follows_the_number_of_spark_partitions(spark):
    few = ordered(spark, rows(40, 10), IN_PLACE_MAX_PARTITIONS)
    many = ordered(spark, rows(40, 10), IN_PLACE_MAX_PARTITIONS + 1)
    plan = planned(few, "key", None)
    assert writes_in_place(few, plan)
    assert not writes_in_place(many, plan)
    kafka = spark.createDataFrame(
        [("t", 0, 1, "k", "v")],
        "topic string, partition int, offset long, key string, value string",
    )
    assert not writes_in_place(kafka, planned(kafka, "key", "value"))


def test_a_groupby_result_is_not_run_to_count_its_partitions(spark):
    # Under AQE (Spark's default) its partitions are known only once its shuffle ran.
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"
    grouped = ordered(spark, rows(40, 10), 2).groupBy("key").agg(F.max("n").alias("n"))
    tracker = spark.sparkContext.statusTracker()
    jobs = len(tracker.getJobIdsForGroup(None))
    assert not writes_in_place(grouped, planned(grouped, "key", None))
    assert len(tracker.getJobIdsForGroup(None)) == jobs  # no Spark job ran to decide


def test_records_in_place_and_shuffled_are_the_same_store(spark, tmp_path):
    data = rows(3000, 700)
    write_store(
        ordered(spark, data, 2), tmp_path, "in_place", key="key", partitions=5, progress=False
    )
    write_store(
        ordered(spark, data, 8), tmp_path, "shuffled", key="key", partitions=5, progress=False
    )
    a_rows, a_table = store(tmp_path, "in_place")
    b_rows, b_table = store(tmp_path, "shuffled")
    assert len(a_rows) == 700
    assert same(a_rows, b_rows)
    assert same(a_table, b_table)
    # The later row of each key won: the last one in input order.
    last = {k: (n, x, t) for k, n, x, t in data}
    for _, key, value in a_rows:
        n, x, t = last[key]
        want = {name: v for name, v in (("n", n), ("x", x), ("tag", t)) if v is not None}
        assert same(value, want)
    with iqkit.open(tmp_path) as engine:
        assert engine.manifest("in_place").properties == engine.manifest("shuffled").properties
    assert version_record(tmp_path, "in_place", 1).metadata["spark_write"] == "write_store"
    # Written in place, a version counts each task's distinct keys (a key two tasks wrote
    # counts twice, as for the data source's writes); the shuffle counts the store's.
    assert written_counts(tmp_path, "shuffled")[0] == 700
    assert 700 <= written_counts(tmp_path, "in_place")[0] <= 2 * 700
    assert version_record(tmp_path, "in_place", 1).metadata["rows_in"] == 3000


def write_both(spark, root, data: list[tuple], ddl: str, **kwargs) -> None:
    """``data`` into store ``in_place`` from 2 Spark partitions and into ``shuffled``
    from 8 (``k`` → ``v``, 3 store partitions)."""
    for name, parts in (("in_place", 2), ("shuffled", 8)):
        df = ordered(spark, data, parts, ddl)
        write_store(df, root, name, key="k", value="v", partitions=3, progress=False, **kwargs)


def test_upserts_deletes_and_overwrites_in_place_match_the_shuffle(spark, tmp_path):
    ddl = "k string, v long"
    write_both(spark, tmp_path, [(f"k{i}", i) for i in range(200)], ddl)
    # Deletes (null values), re-inserts and new keys, with duplicates.
    second = [(f"k{i % 260}", None if i % 3 == 0 else i * 10) for i in range(520)]
    write_both(spark, tmp_path, second, ddl)
    assert same(store(tmp_path, "in_place"), store(tmp_path, "shuffled"))
    with iqkit.open(tmp_path) as engine:
        assert engine.versions("in_place") == [1, 2]
    third = [(f"z{i}", i) for i in range(30)]
    write_both(spark, tmp_path, third, ddl, mode="overwrite")
    got, _ = store(tmp_path, "in_place")
    assert sorted(k for _, k, _ in got) == sorted(k for k, _ in third)
    assert same(got, store(tmp_path, "shuffled")[0])


def test_bad_input_in_place_gives_write_stores_errors(spark, tmp_path):
    nulls = ordered(spark, [("a", 1), (None, 2)], 2, "k string, v long")
    with pytest.raises(ValueError, match=r"^store 's': key column 'k' holds null keys$"):
        write_store(nulls, tmp_path, "s", key="k", value="v", partitions=2, progress=False)
    nan = ordered(spark, [("a", 1.0), ("b", float("nan"))], 2, "k string, x double")
    with pytest.raises(ValueError, match=r"store 's'.*'x'"):
        write_store(nan, tmp_path, "s", key="k", partitions=2, progress=False)
    assert not (tmp_path / "s").exists()  # a refused first write leaves no folder
    one = ordered(spark, [("a", 1)], 2, "k string, v long")
    with pytest.raises(ValueError, match="mode must be one of"):  # not an upsert in disguise
        write_store(one, tmp_path, "s", key="k", value="v", partitions=2, mode="append")
    assert not (tmp_path / "s").exists()
