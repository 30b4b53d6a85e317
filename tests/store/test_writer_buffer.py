"""StoreWriter's Arrow buffer (store/writer.py): a commit whose puts went through
``SortedRows`` (past ``FLUSH_ROWS`` pending puts, spilled past ``memory_budget``) and
whose twins were written chunk by chunk (``twins.TwinWriter``) publishes exactly what
the same writes publish through the small path: the same rows, commit-record counts,
positions and twin rows, for key-value stores (murmur2 and explicit) and window stores.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from helpers import kv_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iqkit
import iqkit.store.sorted_rows as sorted_rows
import iqkit.store.writer as writer_module
from iqkit.store.chain.records import latest_version
from iqkit.store.columnar import twins
from iqkit.store.names import twin_key
from iqkit.store.objects import open_objects

PROPERTY = settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

KEYS = st.sampled_from([f"k{i}" for i in range(40)] + ["", "ä", "k" * 30])
RECORDS = st.fixed_dictionaries(
    {
        "total": st.floats(-1e6, 1e6),
        "n": st.integers(0, 10**6),
        "region": st.text("xyz", max_size=4),
    }
)
# (key, record or None = delete); several commits of such writes
HISTORY = st.lists(
    st.lists(st.tuples(KEYS, st.none() | RECORDS), max_size=30), min_size=1, max_size=3
)


def big_path(monkeypatch) -> None:
    """Every few puts go to the Arrow buffer, which spills each time, and its rows
    reach the SST in chunks of 3 and the twin in pieces of 2 or more."""
    monkeypatch.setattr(writer_module, "FLUSH_ROWS", 4)
    monkeypatch.setattr(sorted_rows, "_CHUNK_ROWS", 3)
    monkeypatch.setattr(twins, "TWIN_CHUNK_ROWS", 2)


def write(root, store: str, history, *, budget: int | None = None, **kw) -> None:
    for commit in history:
        extra = {} if budget is None else {"memory_budget": budget}
        with iqkit.StoreWriter(root, store, **extra) as w:
            for key, value in commit:
                w.put(key, value, **kw)


def published(root, store: str) -> dict:
    """Per partition of the latest version: its commit record's counts and position,
    and every twin's rows (chain order)."""
    objects = open_objects(root)
    record = latest_version(objects, store)
    out: dict = {}
    if record is None:
        return out
    for p, chain in sorted(record.partitions.items()):
        commit = chain.commit_record()
        twins = []
        for f in chain.files:
            if f.twin_name:
                twins.append(pq.read_table(root / twin_key(f.name)).to_pylist())
        out[p] = (commit.get("puts"), commit.get("deletes"), commit["position"], twins)
    return out


@PROPERTY
@given(history=HISTORY)
def test_the_arrow_buffer_publishes_what_the_small_path_does(
    tmp_path_factory, monkeypatch, history
):
    root = tmp_path_factory.mktemp("root")
    for name in ("small", "big"):
        iqkit.create_store(root, name, partitions=3)
    write(root, "small", history)
    with monkeypatch.context() as m:
        big_path(m)
        write(root, "big", history, budget=1)
    engine = iqkit.open(root)
    assert kv_rows(engine, "big") == kv_rows(engine, "small")
    assert published(root, "big") == published(root, "small")


def test_spilled_runs_are_merged_and_removed(tmp_path, monkeypatch):
    root = tmp_path / "root"
    iqkit.create_store(root, "s", partitions=2)
    monkeypatch.setattr(writer_module, "FLUSH_ROWS", 10)
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv("TMPDIR", str(spill))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    with iqkit.StoreWriter(root, "s", memory_budget=1) as w:
        for i in range(95):
            w.put(f"k{i % 50}", {"i": i})
        w.delete("k3")
        assert w._sorted is not None and w._sorted.runs >= 9  # spilled at every flush
    assert not any(spill.iterdir())  # the runs are gone with the commit
    rows = {k: v for _, k, v in kv_rows(iqkit.open(root), "s")}
    expected = {f"k{i % 50}": {"i": i} for i in range(95)}
    del expected["k3"]
    assert rows == expected


def test_explicit_and_positioned_puts_go_through_the_buffer(tmp_path, monkeypatch):
    root = tmp_path / "root"
    iqkit.create_store(root, "x", partitions=4, partitioner="explicit")
    iqkit.create_store(root, "m", partitions=4)
    big_path(monkeypatch)
    with iqkit.StoreWriter(root, "x", memory_budget=1) as w:
        for i in range(20):
            w.put(f"k{i}", i, partition=i % 4, source=("t", i % 4, i))
    with iqkit.StoreWriter(root, "m", memory_budget=1) as w:
        for i in range(20):
            w.put(f"k{i}", i, source=("t", 0, i) if i % 5 == 0 else None)
    engine = iqkit.open(root)
    assert [(p, k) for p, k, _ in kv_rows(engine, "x")] == sorted(
        (i % 4, f"k{i}") for i in range(20)
    )
    from iqkit.store.encoding.partitioners import murmur2_partition

    got = kv_rows(engine, "m")
    assert sorted(got) == sorted(
        (murmur2_partition(f"k{i}".encode(), 4), f"k{i}", i) for i in range(20)
    )
    record = latest_version(open_objects(root), "x")
    for p, chain in record.partitions.items():
        assert chain.commit_record()["puts"] == 5
        assert chain.commit_record()["position"].partition_positions("t") == {p: 16 + p}


def test_window_store_through_the_buffer(tmp_path, monkeypatch):
    root = tmp_path / "root"
    for name in ("small", "big"):
        iqkit.create_store(root, name, partitions=2, kind="window", window_size_ms=1000)
    writes = [(f"u{i % 7}", i * 1000 % 5000, None if i % 6 == 5 else i) for i in range(40)]
    for name in ("small", "big"):
        with monkeypatch.context() as m:
            if name == "big":
                big_path(m)
            with iqkit.StoreWriter(root, name, memory_budget=1) as w:
                for key, start, value in writes:
                    w.put(key, value, window_start=start)
    q = iqkit.WindowRangeQuery.with_window_start_range(0, 10_000)
    engine = iqkit.open(root)
    results = []
    for name in ("small", "big"):
        r = engine.query(iqkit.StateQueryRequest.in_store(name).with_query(q))
        rows = []
        for p, qr in sorted(r.partition_results.items()):
            with qr.result as it:
                rows.extend((p, kv.key.key, kv.key.start, kv.value) for kv in it)
        results.append(rows)
    assert results[0] == results[1] and results[0]
    assert published(root, "big") == published(root, "small")


@pytest.mark.parametrize("chunk", [2, 1000])
def test_a_twin_written_in_chunks_conforms_later_chunks_to_the_first(tmp_path, monkeypatch, chunk):
    """A field absent from a later chunk is null there; an integer field where the first
    chunk had floats is cast; a field the first chunk lacked means no twin (scans of that
    SST read RocksDB), and the commit still succeeds."""
    root = tmp_path / "root"
    iqkit.create_store(root, "s", partitions=1)
    big_path(monkeypatch)
    monkeypatch.setattr(twins, "TWIN_CHUNK_ROWS", chunk)
    rows = {"a": {"f": 1.5, "g": "x"}, "b": {"f": 2.5, "g": "y"}, "c": {"f": 3}, "d": {"f": 4}}
    with iqkit.StoreWriter(root, "s", memory_budget=1) as w:
        for k, v in rows.items():
            w.put(k, v)
    chain = latest_version(open_objects(root), "s").partitions[0]
    twin = pq.read_table(root / twin_key(chain.files[-1].name)).to_pylist()
    assert [(r["key"], r["f"], r["g"]) for r in twin] == [
        ("a", 1.5, "x"),
        ("b", 2.5, "y"),
        ("c", 3.0, None),
        ("d", 4.0, None),
    ]
    with iqkit.StoreWriter(root, "s", memory_budget=1) as w:
        for k in "efg":  # the first piece (3 rows: the SST's chunks) has no "new"
            w.put(k, {"f": 1.0})
        for k in "hi":
            w.put(k, {"f": 2.0, "new": k == "h"})
    chain = latest_version(open_objects(root), "s").partitions[0]
    assert (chain.files[-1].twin_name is None) == (chunk == 2)
    assert {k for _, k, _ in kv_rows(iqkit.open(root), "s")} == set("abcdefghi")


# -- put_table ------------------------------------------------------------------------------
def test_put_table_writes_what_puts_write(tmp_path):
    """A table's rows, as JSON records of the other columns, read back like the same
    puts (values compared decoded: the JSON spells floats as Spark's to_json does), the
    later row winning, and mixed with puts in input order."""
    import pandas as pd
    import pyarrow as pa

    root = tmp_path / "root"
    for name in ("puts", "tbl", "frame"):
        iqkit.create_store(root, name, partitions=3)
    rows = [
        {"id": f"k{i % 30}", "total": i * 0.5, "n": i, "region": f"r{i % 4}"} for i in range(50)
    ]
    with iqkit.StoreWriter(root, "puts") as w:
        w.put("early", {"x": 1})
        for r in rows:
            w.put(r["id"], {k: v for k, v in r.items() if k != "id"})
        w.delete("k3")
    table = pa.Table.from_pylist(rows)
    with iqkit.StoreWriter(root, "tbl") as w:
        w.put("early", {"x": 1})
        assert w.put_table(table, key="id") == 50
        w.delete("k3")
    with iqkit.StoreWriter(root, "frame") as w:
        w.put("early", {"x": 1})
        w.put_table(pd.DataFrame(rows), key="id")
        w.delete("k3")
    engine = iqkit.open(root)
    expected = kv_rows(engine, "puts")
    assert len(expected) == 30
    assert kv_rows(engine, "tbl") == expected
    assert kv_rows(engine, "frame") == expected
    counts = {p: c[:2] for p, c in published(root, "puts").items()}
    assert {p: c[:2] for p, c in published(root, "tbl").items()} == counts
    sql = "SELECT key, total, n, region FROM {} ORDER BY key"
    assert iqkit.sql(sql.format("tbl"), root=root).equals(iqkit.sql(sql.format("puts"), root=root))


def test_put_table_value_column_explicit_partitions_and_deletes(tmp_path):
    import pyarrow as pa

    root = tmp_path / "root"
    iqkit.create_store(root, "x", partitions=2, partitioner="explicit", value_serde="int64")
    table = pa.table({"k": ["a", "b", "c", "a"], "v": [1, 2, None, None], "p": [0, 1, 1, 0]})
    with iqkit.StoreWriter(root, "x") as w:
        w.put("a", 7, partition=0)
        w.put("c", 9, partition=1)
        w.put_table(table, key="k", value="v", partition="p")
    assert kv_rows(iqkit.open(root), "x") == [(1, "b", 2)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key": "idd"}, "no column 'idd'; did you mean 'id'"),
        ({"key": ["id", "n"]}, "composite key .* needs the 'ordered' key serde"),
        ({"key": "id", "partition": "n"}, "partition= names an explicit store"),
        ({"key": "bad"}, "holds NaN or an infinity"),
    ],
)
def test_put_table_refuses_bad_input_whole(tmp_path, kwargs, message):
    import pyarrow as pa

    root = tmp_path / "root"
    iqkit.create_store(root, "s", partitions=2)
    table = pa.table({"id": ["a", "b"], "n": [1, 2], "f": [1.0, float("nan")], "bad": ["x", "y"]})
    with iqkit.StoreWriter(root, "s") as w:
        w.put("kept", 1)
        with pytest.raises(ValueError, match=message):
            w.put_table(table, **kwargs)
    assert [k for _, k, _ in kv_rows(iqkit.open(root), "s")] == ["kept"]


COLUMNS = st.sampled_from(["int64", "int32", "float64", "string", "bool", "float32", "nulls"])


def arrow_column(kind: str, n: int, draw_values, with_nulls: bool):
    import pyarrow as pa

    if kind == "nulls":
        return pa.nulls(n, pa.int64())
    strategy = {
        "int64": st.integers(-(2**63), 2**63 - 1),
        "int32": st.integers(-(2**31), 2**31 - 1),
        "float64": st.floats(allow_nan=False, allow_infinity=False),
        "float32": st.floats(width=32, allow_nan=False, allow_infinity=False),
        "string": st.text(max_size=4),
        "bool": st.booleans(),
    }[kind]
    values = draw_values(st.lists(strategy | st.none() if with_nulls else strategy,
                                  min_size=n, max_size=n))  # fmt: skip
    return pa.array(values, {"int32": pa.int32(), "float32": pa.float32()}.get(kind))


@PROPERTY
@given(data=st.data())
def test_a_twin_made_from_put_table_columns_is_the_twin_of_the_stored_rows(
    tmp_path_factory, monkeypatch, data
):
    """put_table's twin taken from its columns (twins.twin_of_columns) equals, schema and
    rows, the twin shaped from the JSON records it stored — or is not taken at all; with
    deletes in the same commit too (tombstones added to the columns' twin)."""
    import pyarrow as pa

    n = data.draw(st.integers(1, 12))
    kinds = data.draw(st.lists(COLUMNS, min_size=1, max_size=4))
    names = data.draw(
        st.lists(st.sampled_from(["a", "b", "key", "partition", "value.key"]), min_size=len(kinds),
                 max_size=len(kinds), unique=True)
    )
    with_nulls = data.draw(st.booleans())
    ids = data.draw(st.lists(st.text("xyz", min_size=1, max_size=3), min_size=n, max_size=n))
    columns = {"id": pa.array(ids, data.draw(st.sampled_from([pa.string(), pa.large_string()])))}
    for name, kind in zip(names, kinds, strict=True):
        columns[name] = arrow_column(kind, n, data.draw, with_nulls)
    table = pa.table(columns)
    gone = data.draw(st.lists(st.text("xyz", min_size=1, max_size=3), max_size=4))
    root = tmp_path_factory.mktemp("root")
    for store in ("cols", "shaped"):
        iqkit.create_store(root, store, partitions=2)
    taken = []
    real = twins.twin_of_columns
    with monkeypatch.context() as m:
        m.setattr(twins, "twin_of_columns", lambda *a: taken.append(real(*a)) or taken[-1])
        with iqkit.StoreWriter(root, "cols") as w:
            w.put_table(table, key="id")
            for key in gone:
                w.delete(key)
    simple = {"int64", "int32", "float64", "string", "bool"}
    kept = not set(ids) <= set(gone)
    if kept and not with_nulls and set(kinds) <= simple | {"nulls"} and set(kinds) & simple:
        assert taken and all(t is not None for t in taken)  # the columns path ran
    with monkeypatch.context() as m:
        m.setattr(twins, "twin_of_columns", lambda manifest, columns: None)
        with iqkit.StoreWriter(root, "shaped") as w:
            w.put_table(table, key="id")
            for key in gone:
                w.delete(key)
    engine = iqkit.open(root)
    assert kv_rows(engine, "cols") == kv_rows(engine, "shaped")
    objects = open_objects(root)
    for store_chain, shaped_chain in zip(
        latest_version(objects, "cols").partitions.values(),
        latest_version(objects, "shaped").partitions.values(),
        strict=True,
    ):
        got, want = (
            pq.read_table(root / twin_key(chain.files[-1].name))
            for chain in (store_chain, shaped_chain)
        )
        assert got.schema == want.schema and got.schema.metadata == want.schema.metadata
        assert got.equals(want)
