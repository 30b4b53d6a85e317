"""SSTs written from Arrow columns (``rocks.write_arrow_sst``, the Spark writers' path):
the same rows and tombstones as the pairs path, checked by reading real RocksDB
databases back; and a job task's Arrow rows staged through ``ChainJobSpec.stage``."""

from __future__ import annotations

import pyarrow as pa
import pytest
from helpers import kv_rows
from hypothesis import given, settings
from hypothesis import strategies as st

import iqkit
from iqkit.store.encoding import keyspace
from iqkit.store.encoding.serdes import get_serde
from iqkit.store.formats import format_for
from iqkit.store.partitions import rocks
from iqkit.store.roots import parse_root
from iqkit.store.sorted_rows import ArrowRows, SortedRows

STORE = "totals"


def read_back(tmp_path, below: list[tuple[bytes, bytes]], sst) -> list[tuple[bytes, bytes]]:
    """Every live row of a database holding ``below`` with ``sst`` ingested above it."""
    tmp_path.mkdir()
    base = tmp_path / "below.sst"
    rocks.write_sst(base, iter(below))
    db = rocks.open_for_write(tmp_path / "db", create=True)
    try:
        rocks.ingest(db, [str(base)])
        rocks.ingest(db, [str(sst)])
        return list(rocks.scan(db, b"", None))
    finally:
        rocks.close_quietly(db)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.dictionaries(
        st.binary(min_size=1, max_size=4).map(lambda b: b"\x01" + b),
        st.none() | st.binary(max_size=3),
        min_size=1,
        max_size=60,
    ),
    cut=st.integers(min_value=0, max_value=60),
    chunk=st.integers(min_value=1, max_value=7),
)
def test_arrow_rows_write_the_puts_and_tombstones_the_pairs_path_writes(
    tmp_path_factory, rows, cut, chunk
):
    tmp_path = tmp_path_factory.mktemp("arrow")
    keys = sorted(rows)
    values = [rows[k] for k in keys]
    k, v = pa.array(keys, pa.binary()), pa.array(values, pa.binary())
    # Two chunks, each handed over in slices of `chunk` rows (runs of puts and deletes
    # cross the slices).
    cut = min(cut, len(keys))
    chunks = [(k.slice(0, cut), v.slice(0, cut)), (k.slice(cut), v.slice(cut))]
    rocks_chunk = rocks._ARROW_CHUNK_ROWS
    rocks._ARROW_CHUNK_ROWS = chunk
    try:
        counts = rocks.write_arrow_sst(
            tmp_path / "arrow.sst", chunks, head=[(b"\x00commit", b"c")]
        )
    finally:
        rocks._ARROW_CHUNK_ROWS = rocks_chunk
    pairs = [(b"\x00commit", b"c"), *zip(keys, values, strict=True)]
    rocks.write_changes_sst(tmp_path / "pairs.sst", pairs)
    deletes = sum(value is None for value in values)
    assert counts == (len(keys) - deletes, deletes)
    below = [(key, b"old") for key in keys]  # every key had a value the tombstones hide
    expected = read_back(tmp_path / "p", below, tmp_path / "pairs.sst")
    assert read_back(tmp_path / "a", below, tmp_path / "arrow.sst") == expected
    assert expected == [(b"\x00commit", b"c")] + [
        (key, value) for key, value in zip(keys, values, strict=True) if value is not None
    ]


def test_no_rows_are_no_error(tmp_path):
    # RocksDB refuses to finish an SST with no entries; the writer does not try.
    empty = pa.array([], pa.binary())
    assert rocks.write_arrow_sst(tmp_path / "x.sst", [(empty, empty)]) == (0, 0)


def kv(key: str) -> bytes:
    return keyspace.kv_key(get_serde("string").serialize(key))


def json(value: object) -> bytes:
    return get_serde("json").serialize(value)


def test_a_task_s_arrow_rows_stage_counted_and_read_back(root):
    iqkit.create_store(root, STORE, partitions=2, partitioner="explicit")
    with iqkit.StoreWriter(root, STORE) as w:
        w.put("alice", 1, partition=0)
        w.put("bob", 2, partition=0)
    buffer = SortedRows()
    keys = [kv("zed"), kv("alice"), kv("bob"), kv("alice")]
    values = [json(9), json(10), None, json(11)]
    buffer.add(
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array([0, 1, 2, 3], pa.int64()),
    )
    with format_for(parse_root(root)).open_job_commit(STORE) as job:
        staged = [
            job.spec.stage(p, rows, attempt="t", sorted_unique=True)
            for p, rows in buffer.partitions()
        ]
        assert [(s.puts, s.deletes) for s in staged] == [(2, 1)]
        job.publish(staged)
    with iqkit.open(root) as engine:
        assert kv_rows(engine, STORE) == [(0, "alice", 11), (0, "zed", 9)]


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ([kv("b"), kv("a")], "sorted by key"),
        ([kv("a"), kv("a")], "sorted by key"),
        ([b"\x00meta", kv("a")], "reserved keyspace"),
    ],
)
def test_arrow_rows_out_of_order_or_reserved_are_refused(root, keys, message):
    iqkit.create_store(root, STORE, partitions=1)
    k = pa.array(keys, pa.binary())
    # Two chunks, so the order is also checked where one chunk meets the next.
    rows = ArrowRows([(k.slice(0, 1), k.slice(0, 1)), (k.slice(1), k.slice(1))])
    with (
        format_for(parse_root(root)).open_job_commit(STORE) as job,
        pytest.raises(ValueError, match=message),
    ):
        job.spec.stage(0, rows, attempt="t")
