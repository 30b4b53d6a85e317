"""How ``spark.read.format("iqkit")`` spreads store partitions over Spark tasks
(``read_tasks``): every partition read exactly once, as many tasks as cores unless the
bytes call for more, balanced by bytes; and a packed read gives the same rows as one
task per store partition."""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

import iqkit
from iqkit.spark.read_tasks import DEFAULT_MAX_PARTITION_BYTES, max_partition_bytes, spread


@given(
    st.dictionaries(st.integers(0, 40), st.integers(0, 10_000), min_size=1, max_size=30),
    st.integers(1, 50_000),
    st.integers(1, 8),
)
def test_every_partition_is_read_once_by_as_many_tasks_as_the_rule_says(weights, cap, cores):
    parts = [(p, f"q{p}") for p in sorted(weights)]
    groups = spread(parts, weights, cap=cap, cores=cores)
    assert sorted(pw for g in groups for pw in g) == parts
    total = sum(max(1, w) for w in weights.values())  # a partition weighs a byte at least
    assert len(groups) == min(len(parts), max(cores, math.ceil(total / cap)))
    assert all(g == sorted(g) for g in groups)
    assert [g[0][0] for g in groups] == sorted(g[0][0] for g in groups)
    # Largest first to the lightest task: no task exceeds the lightest by more than the
    # heaviest partition.
    loads = [sum(max(1, weights[p]) for p, _ in g) for g in groups]
    assert max(loads) - min(loads) <= max(max(1, w) for w in weights.values())


def test_a_cap_of_one_byte_is_one_task_per_partition():
    parts = [(p, None) for p in range(8)]
    assert spread(parts, {p: 10 for p in range(8)}, cap=1, cores=2) == [[pw] for pw in parts]


def test_weightless_partitions_are_dealt_round():
    parts = [(p, None) for p in range(6)]
    assert spread(parts, {}, cap=DEFAULT_MAX_PARTITION_BYTES, cores=2) == [
        [(0, None), (2, None), (4, None)],
        [(1, None), (3, None), (5, None)],
    ]


@pytest.mark.parametrize(
    ("text", "size"),
    [(None, 128 * 2**20), ("1", 1), ("64m", 64 * 2**20), ("1g", 2**30), ("2 MiB", 2 * 2**20)],
)
def test_max_partition_bytes_is_read_as_a_size(text, size):
    assert max_partition_bytes({} if text is None else {"max_partition_bytes": text}) == size


@pytest.mark.parametrize("text", ["0", "-1", "lots", "1.5g", ""])
def test_a_bad_max_partition_bytes_is_refused_by_name(text):
    with pytest.raises(ValueError, match="'max_partition_bytes'"):
        max_partition_bytes({"max_partition_bytes": text})


def test_a_packed_read_gives_the_rows_of_one_task_per_partition(spark, tmp_path):
    iqkit.create_store(tmp_path, "s", partitions=8, key_serde="string", value_serde="int64")
    with iqkit.StoreWriter(tmp_path, "s") as w:
        for i in range(500):
            w.put(f"k{i:03d}", i)

    def read(**options):
        r = spark.read.format("iqkit").option("store", "s")
        for name, value in options.items():
            r = r.option(name, value)
        return r.load(str(tmp_path))

    packed, apart = read(), read(max_partition_bytes="1")
    assert packed.rdd.getNumPartitions() == min(8, os.cpu_count() or 1)
    assert apart.rdd.getNumPartitions() == 8
    rows = sorted(tuple(r) for r in packed.collect())
    assert rows == sorted(tuple(r) for r in apart.collect())
    assert len(rows) == 500 and {p for p, _, _ in rows} == set(range(8))
    with pytest.raises(Exception, match="max_partition_bytes"):
        read(max_partition_bytes="lots").count()
