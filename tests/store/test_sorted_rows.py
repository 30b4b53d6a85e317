"""``SortedRows``: a partition's rows in any order become sorted, one per key (the highest
sequence wins), in memory or through spilled runs, and feed a job commit's ``stage``."""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import iqkit
from iqkit.store.encoding import keyspace
from iqkit.store.formats import format_for
from iqkit.store.roots import parse_root
from iqkit.store.sorted_rows import SortedRows, last_per_key

relaxed = settings(deadline=None, max_examples=60)  # spills write files; shared machine

ROWS = st.lists(st.tuples(st.binary(max_size=3), st.none() | st.binary(max_size=4)), max_size=80)


def expected(rows):
    """(key, value) of the row with the highest sequence per key, by key."""
    last = {}
    for key, value in rows:  # rows listed in sequence order: later rows win
        last[key] = value
    return sorted(last.items())


def add_shuffled(buffer, rows, seed, pieces):
    """Add rows (sequence = list position) in a shuffled order, in several Arrow pieces."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    cut = sorted(random.Random(seed + 1).sample(range(len(order) + 1), k=min(pieces, len(order))))
    for lo, hi in zip([0, *cut], [*cut, len(order)], strict=True):
        part = order[lo:hi]
        buffer.add(
            pa.array([rows[i][0] for i in part], pa.binary()),
            pa.array([rows[i][1] for i in part], pa.binary()),
            pa.array(part, pa.int64()),
        )


@relaxed
@given(ROWS, st.integers(0, 10_000), st.integers(1, 6), st.sampled_from([None, 1, 64, 400]))
def test_rows_come_back_sorted_with_the_last_row_per_key(rows, seed, pieces, spill_bytes):
    buffer = SortedRows(spill_bytes=spill_bytes)
    add_shuffled(buffer, rows, seed, pieces)
    assert buffer.rows_added == len(rows)
    spilled = buffer.runs
    assert list(buffer.rows()) == expected(rows)
    if spill_bytes == 1 and rows:
        assert spilled >= 1  # the merge path really ran


@relaxed
@given(ROWS, st.integers(0, 10_000))
def test_explicit_spills_between_adds_merge_exactly(rows, seed):
    buffer = SortedRows()
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    for i in order:  # one row per add, a run after every other add
        buffer.add(
            pa.array([rows[i][0]], pa.binary()),
            pa.array([rows[i][1]], pa.binary()),
            pa.array([i], pa.int64()),
        )
        if i % 2:
            buffer.spill()
    assert list(buffer.rows()) == expected(rows)


def test_runs_are_removed_after_reading_and_when_abandoned(tmp_path):
    for consume in (True, False):
        buffer = SortedRows(spill_bytes=1, spill_dir=os.fspath(tmp_path))
        for i in range(5):
            buffer.add(pa.array([b"k%d" % i]), pa.array([b"v"]), pa.array([i], pa.int64()))
        assert buffer.runs == 5 and any(tmp_path.iterdir())
        it = buffer.rows()
        first = next(it)
        assert first == (b"k0", b"v")
        if consume:
            assert len(list(it)) == 4
        else:
            it.close()
        assert not any(tmp_path.iterdir())


def test_carried_columns_follow_their_rows_through_the_owners_spills(tmp_path):
    """A buffer without ``spill_bytes`` whose owner spills (a Spark task, every
    ``run_rows`` rows) and whose rows carry columns of their own (one named ``key``):
    the columns come back with the rows kept, and a partition's runs are sorted in
    pieces of at most one spill's bytes, parked on disk and merged, not all at once."""
    carried = pa.schema([("key", pa.string()), ("n", pa.int64())])
    buffer = SortedRows(spill_dir=os.fspath(tmp_path), columns=carried)
    rng = random.Random(3)
    last: dict[bytes, int] = {}
    seq = 0
    for _ in range(4):  # four runs of 500 rows over 300 keys, one partition
        keys = [b"k%03d" % rng.randrange(300) for _ in range(500)]
        seqs = list(range(seq, seq + 500))
        seq += 500
        last.update(zip(keys, seqs, strict=True))
        own = pa.record_batch([pa.array([k.decode() for k in keys]), pa.array(seqs)], carried)
        buffer.add(
            pa.array(keys, pa.binary()),
            pa.array([b"v%d" % s for s in seqs], pa.binary()),
            pa.array(seqs, pa.int64()),
            columns=own,
        )
        buffer.spill()
    got: dict[bytes, int] = {}
    parked = []
    for _, rows in buffer.partitions():
        for keys, values, seqs, own in rows.sequenced_chunks():
            assert own.column_names == ["key", "n"]
            assert own.column("key").to_pylist() == [k.decode() for k in keys.to_pylist()]
            assert own.column("n").to_pylist() == seqs.to_pylist()
            assert values.to_pylist() == [b"v%d" % s for s in seqs.to_pylist()]
            got.update(zip(keys.to_pylist(), seqs.to_pylist(), strict=True))
        parked = [f.name for d in tmp_path.iterdir() for f in d.iterdir()]
    assert got == last
    assert any(name.startswith("sorted-") for name in parked)
    assert not any(tmp_path.iterdir())
    with pytest.raises(ValueError, match="carry"):
        SortedRows(columns=carried).add(pa.array([b"k"]), pa.array([b"v"]), pa.array([0]))


def test_big_merge_keeps_order_and_the_highest_sequence():
    rng = random.Random(7)
    n = 200_000
    keys = [b"%06d" % rng.randrange(50_000) for _ in range(n)]
    buffer = SortedRows(spill_bytes=300_000)  # several runs of several batches each
    for lo in range(0, n, 30_000):
        hi = min(n, lo + 30_000)
        buffer.add(
            pa.array(keys[lo:hi], pa.binary()),
            pa.array([b"%d" % i for i in range(lo, hi)], pa.binary()),
            pa.array(range(lo, hi), pa.int64()),
        )
    assert buffer.runs > 3
    got = list(buffer.rows())
    assert got == expected(list(zip(keys, [b"%d" % i for i in range(n)], strict=True)))


@relaxed
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.binary(max_size=2), st.none() | st.binary(max_size=3)),
        max_size=80,
    ),
    st.integers(0, 10_000),
    st.sampled_from([None, 1, 200]),
)
def test_partitions_are_sorted_and_deduplicated_separately(rows, seed, spill_bytes):
    # The same key in two partitions is two rows (explicit partitioning allows it).
    buffer = SortedRows(spill_bytes=spill_bytes)
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    for lo in range(0, len(order), 7):
        part = order[lo : lo + 7]
        buffer.add(
            pa.array([rows[i][1] for i in part], pa.binary()),
            pa.array([rows[i][2] for i in part], pa.binary()),
            pa.array(part, pa.int64()),
            partitions=pa.array([rows[i][0] for i in part], pa.int32()),
        )
    got = [(p, list(r)) for p, r in buffer.partitions()]
    want = {}
    for p, key, value in rows:
        want.setdefault(p, []).append((key, value))
    assert got == [(p, expected(want[p])) for p in sorted(want)]


def test_puts_drop_deletes_and_keep_order():
    buffer = SortedRows()
    buffer.add(
        pa.array([b"c", b"a", b"b", b"a"]),
        pa.array([b"3", b"1", None, None]),
        pa.array([1, 2, 3, 4], pa.int64()),
    )
    [(p, rows)] = list(buffer.partitions())
    assert p == 0 and list(rows.puts()) == [(b"c", b"3")]


def test_last_per_key_on_a_table():
    table = pa.table(
        {
            "partition": pa.array([0, 0, 0, 0], pa.int32()),
            "key": pa.array([b"b", b"a", b"b", b"a"], pa.binary()),
            "value": pa.array([b"1", b"2", None, b"4"], pa.binary()),
            "seq": pa.array([3, 9, 5, 1], pa.int64()),
        }
    )
    out = last_per_key(table)
    assert out.column("key").to_pylist() == [b"a", b"b"]
    assert out.column("value").to_pylist() == [b"2", None]


def test_null_keys_are_refused():
    with pytest.raises(ValueError, match="keys must not be null"):
        SortedRows().add(pa.array([None], pa.binary()), pa.array([b"v"]), pa.array([1]))


def test_sorted_rows_build_a_partition_through_the_sst_path(tmp_path):
    iqkit.create_store(tmp_path, "s", partitions=1, value_serde="string")
    rows = [(keyspace.kv_key(b"k%03d" % (i % 40)), b"v%d" % i) for i in range(100)]
    rows += [(keyspace.kv_key(b"k001"), None)]  # the last row of k001 is a delete
    buffer = SortedRows(spill_bytes=500)
    add_shuffled(buffer, rows, seed=3, pieces=7)
    with format_for(parse_root(tmp_path)).open_job_commit("s", mode="overwrite") as job:
        staged = job.spec.stage(0, buffer.rows(), attempt="a", sorted_unique=True)
        assert staged.puts == 39
        job.publish([staged])
    with iqkit.open(tmp_path) as engine:
        r = engine.query(
            iqkit.StateQueryRequest.in_store("s").with_query(iqkit.RangeQuery.with_no_bounds())
        )
        with r.partition_results[0].result as it:
            got = {kv.key: kv.value for kv in it}
    assert "k001" not in got
    assert got["k000"] == "v80" and got["k039"] == "v79" and len(got) == 39


@relaxed
@given(
    st.lists(st.binary(max_size=3), max_size=60),
    st.integers(1, 5),
    st.sampled_from([None, 1, 64, 300]),
    st.booleans(),
)
def test_rows_added_in_key_order_are_runs_as_they_are(keys, pieces, spill_bytes, repeat):
    """Rows whose keys ascend (a table written in key order) come back exactly as the
    shuffled path gives them: held or spilled groups that follow each other are read in
    turn, groups that overlap (the same keys added twice) are merged, the later winning."""
    ordered = sorted(set(keys))
    rows = [(k, b"v%d" % i) for i, k in enumerate(ordered)]
    if repeat:  # the same keys again, later: overlapping ascending groups
        rows += [(k, b"w%d" % i) for i, k in enumerate(ordered)]
    buffer = SortedRows(spill_bytes=spill_bytes)
    cut = max(1, len(rows) // pieces)
    for lo in range(0, len(rows), cut):
        part = range(lo, min(len(rows), lo + cut))
        buffer.add(
            pa.array([rows[i][0] for i in part], pa.binary()),
            pa.array([rows[i][1] for i in part], pa.binary()),
            pa.array(part, pa.int64()),
        )
    assert list(buffer.rows()) == expected(rows)


KEYS = st.lists(
    st.binary(max_size=40) | st.sampled_from([b"", b"\x00", b"\x01user", b"\x01user\x00"]),
    min_size=2,
    max_size=60,
)


@relaxed
@given(KEYS, st.booleans(), st.booleans(), st.integers(0, 10_000))
def test_keys_sort_as_arrow_sorts_them(keys, one_partition, fixed, seed):
    """``_sort_order``'s numpy sort of keys as 8-byte words (past their shared prefix,
    by length last) gives the very order of Arrow's stable sort, long keys, zero bytes,
    prefixes of each other, repeats and several partitions included."""
    import numpy as np
    import pyarrow.compute as pc

    from iqkit.store.sorted_rows import _sort_order

    rng = random.Random(seed)
    if fixed:  # every key of one length: the reshaped path
        keys = [k.ljust(12, b"\x00")[:12] for k in keys]
    keys += rng.choices(keys, k=rng.randrange(3))
    n = len(keys)
    seqs = rng.sample(range(10 * n), n)
    parts = [2] * n if one_partition else [rng.randrange(3) for _ in range(n)]
    table = pa.table(
        {
            "partition": pa.array(parts, pa.int32()),
            "key": pa.array(keys, pa.binary()),
            "value": pa.nulls(n, pa.binary()),
            "seq": pa.array(seqs, pa.int64()),
        }
    )
    for with_seq in (False, True):
        by = [("key", "ascending"), ("seq", "ascending")] if with_seq else [("key", "ascending")]
        want = pc.sort_indices(table, by).to_numpy()
        want = want[np.argsort(np.asarray(parts)[want], kind="stable")]
        got = _sort_order(table, one_partition, with_seq=with_seq)
        assert np.asarray(got).tolist() == want.tolist()
