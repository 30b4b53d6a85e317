"""A DataFrame read from ``format("iqkit")`` returns what the same query returns over the
same data in Parquet, whatever ran on it before.

PySpark 4.1–4.3 keeps the read plan a Python data source's filter pushdown produced on the
data source object that every DataFrame from one ``load()`` shares; an unfiltered scan
after a filtered one reused it (``df.count()`` was 5, then 1 after
``df.where("key = 'alice'").count()``). These tests run that pattern and randomized
sequences of queries over one DataFrame — filtered, unfiltered, cached, joined, repeated —
each compared with the Parquet answer, on real local Spark.
"""

from __future__ import annotations

import random

import pytest
from pyspark.sql import functions as F

import iqkit
from iqkit.spark import register

KEYS = ["alice", "bob", "carol", "dave", "erin"]


@pytest.fixture(scope="module", autouse=True)
def iqkit_format(spark):
    register(spark)


@pytest.fixture(scope="module")
def totals(tmp_path_factory, spark):
    """A 4-partition string -> json store, and the same rows as Parquet."""
    base = tmp_path_factory.mktemp("consistency")
    root = base / "stores"
    iqkit.create_store(root, "totals", partitions=4)
    rows = {f"{name}-{i}": {"total": (i * 37) % 101, "n": i} for i in range(12) for name in KEYS}
    rows.update({k: {"total": len(k), "n": -1} for k in KEYS})
    with iqkit.StoreWriter(root, "totals") as w:
        for k, v in rows.items():
            w.put(k, v)
    df = (
        spark.read.format("iqkit")
        .option("store", "totals")
        .option("value_schema", "total bigint, n bigint")
        .load(str(root))
    )
    parquet_dir = str(base / "totals.parquet")
    df.write.parquet(parquet_dir)
    return root, parquet_dir


def _iqkit(spark, root):
    return (
        spark.read.format("iqkit")
        .option("store", "totals")
        .option("value_schema", "total bigint, n bigint")
        .load(str(root))
    )


def _rows(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.collect())


def test_the_reported_sequence_returns_every_row_after_a_filtered_query(spark, totals):
    root, _ = totals
    df = _iqkit(spark, root)
    everything = df.count()
    assert everything == len(KEYS) * 13
    assert df.where("key = 'alice'").count() == 1
    assert df.count() == everything  # was 1: the filtered plan leaked into this scan
    assert sorted(r.key for r in df.collect()) == sorted(
        r.key for r in _iqkit(spark, root).collect()
    )
    assert len(df.collect()) == everything


_FILTERS = [
    None,
    "key = 'alice'",
    "key = 'nobody'",
    "key IN ('bob', 'carol-3', 'erin-11')",
    "key LIKE 'dave%'",
    "key >= 'carol' AND key < 'dave'",
    "key > 'erin-5'",
    "partition = 2",
    "partition IN (0, 3)",
    "partition >= 1 AND key LIKE 'b%'",
    "total > 50",
    "key = 'bob' OR total < 5",
    "NOT (key LIKE 'a%')",
    "n = -1",
]


def _query(base, kind: str, flt: str | None, other):
    df = base if flt is None else base.where(flt)
    if kind == "rows":
        return _rows(df)
    if kind == "count":
        return df.count()
    if kind == "agg":
        return _rows(df.groupBy("partition").agg(F.sum("total"), F.count("*")))
    if kind == "join":  # the same DataFrame joined with a filtered copy of itself
        right = other.where("total % 2 = 0").select("key", F.col("total").alias("t2"))
        return _rows(df.join(right, "key").select("key", "total", "t2"))
    if kind == "limit":
        return df.orderBy("key").limit(3).collect()
    raise AssertionError(kind)


def test_randomized_query_sequences_match_parquet(spark, totals):
    root, parquet_dir = totals
    rng = random.Random(796)
    for _ in range(3):
        iq = _iqkit(spark, root)
        pq = spark.read.parquet(parquet_dir)
        cached = rng.random() < 0.5
        if cached:
            iq = iq.cache()
            pq = pq.cache()
        for step in range(12):
            flt = rng.choice(_FILTERS)
            kind = rng.choice(["rows", "count", "agg", "join", "limit"])
            got = _query(iq, kind, flt, iq)
            want = _query(pq, kind, flt, pq)
            assert got == want, f"step {step}: {kind} where {flt!r} (cached={cached})"
        if cached:
            iq.unpersist()
            pq.unpersist()


def test_narrowed_reads_match_the_same_filter_over_parquet(spark, totals):
    """Read options narrow a DataFrame the way a filter narrows Parquet, and stay put."""
    root, parquet_dir = totals
    pq = spark.read.parquet(parquet_dir)
    cases = [
        ({"key": "alice"}, "key = 'alice'"),
        ({"keys": '["bob-1", "erin", "nobody"]'}, "key IN ('bob-1', 'erin', 'nobody')"),
        ({"prefix": "carol-1"}, "key LIKE 'carol-1%'"),
        ({"key_from": "dave-2", "key_to": "dave-5"}, "key >= 'dave-2' AND key <= 'dave-5'"),
        ({"partitions": "1,3"}, "partition IN (1, 3)"),
    ]
    for options, flt in cases:
        reader = spark.read.format("iqkit").option("store", "totals")
        reader = reader.option("value_schema", "total bigint, n bigint")
        for name, value in options.items():
            reader = reader.option(name, value)
        iq = reader.load(str(root))
        want = _rows(pq.where(flt))
        assert _rows(iq) == want, options
        assert _rows(iq.where("total > 20")) == _rows(pq.where(flt).where("total > 20"))
        assert _rows(iq) == want, options  # unchanged after a filtered query
