"""``iqkit.sql`` over stores whose versions have columnar twins reads the twins with
DuckDB's own Parquet reader (sqlsession/twins.py), and gives exactly what the same SQL
gives over ``store_batches(...)`` of the store registered as an Arrow table: same rows,
same column names and types (compared with the scan of RocksDB,
``twin_scans(False)``), whether chains merge by position deletes or, written by an
earlier iqkit, on keys. Stores without twins keep the streamed path."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iqkit
from iqkit import SQLError
from iqkit.sqlsession import SQLSession
from iqkit.sqlsession.twins import TwinPlans, twin_view
from iqkit.store.columnar.deletes import writing
from iqkit.store.partitions.layers import twin_scans
from iqkit.tables import store_batches

QUERIES = [
    "SELECT tag, sum(price * qty) AS total, count(*) AS n FROM {t} GROUP BY tag ORDER BY tag",
    "SELECT * FROM {t} ORDER BY partition, key",
    "SELECT partition, count(*) AS n, min(key) AS lo, max(key) AS hi FROM {t} "
    "GROUP BY partition ORDER BY partition",
    "SELECT key, qty FROM {t} WHERE key >= 'k020' AND key < 'k040' ORDER BY key",
    "SELECT key, price FROM {t} WHERE qty > 30 AND tag <> 'new' ORDER BY key",
    "SELECT a.key, a.price, b.qty FROM {t} a JOIN {t} b ON a.key = b.key "
    "WHERE a.qty % 2 = 0 ORDER BY a.key",
    "SELECT f.name, t.price FROM {t} t JOIN frame f ON f.key = t.key ORDER BY f.name",
    "SELECT count(*) AS n FROM (SELECT * FROM {t} LIMIT 7)",
]


def record(i: int, tag: str | None = None) -> dict:
    return {"price": i * 1.5, "qty": i, "tag": tag or f"t{i % 4}"}


def write_history(root: Path | str, store: str = "r", *, commits: int = 3) -> None:
    """A JSON-record store of 3 partitions whose chains have several files: puts, then
    commits deleting and overwriting some keys (and putting some back)."""
    iqkit.create_store(root, store, partitions=3, value_serde="json")
    with iqkit.StoreWriter(root, store) as w:
        for i in range(60):
            w.put(f"k{i:03d}", record(i))
    for c in range(1, commits):
        with iqkit.StoreWriter(root, store) as w:
            for i in range(c % 3, 60, 4):
                w.delete(f"k{i:03d}")
            for i in range(c, 60, 5):
                w.put(f"k{i:03d}", record(i + c, "new"))


def uses_twins(session: SQLSession, table: str) -> bool:
    """Whether DuckDB plans ``table`` as a Parquet scan (not an Arrow stream)."""
    plan = session.query(f"EXPLAIN SELECT * FROM {table}")
    text = "\n".join(map(str, plan.to_numpy().ravel()))
    return "PARQUET" in text.upper()


def check_same(engine: iqkit.StateEngine, store: str, queries: list[str]) -> None:
    frame = pa.table({"key": [f"k{i:03d}" for i in range(0, 60, 2)],
                      "name": [f"n{i:03d}" for i in range(0, 60, 2)]})  # fmt: skip
    with SQLSession(engine=engine) as session:
        with twin_scans(False):  # the rows as RocksDB has them
            session.register("ref", store_batches(engine, store).read_all())
        session.register("frame", frame)
        assert uses_twins(session, store)
        for query in queries:
            got = session.query_arrow(query.format(t=store))
            want = session.query_arrow(query.format(t="ref"))
            assert got.schema == want.schema, query
            assert got.equals(want), query


def test_sql_over_twins_equals_sql_over_store_batches(tmp_path):
    write_history(tmp_path, commits=4)
    with iqkit.open(tmp_path) as engine:
        check_same(engine, "r", QUERIES)
        assert iqkit.sql("SELECT count(*) AS n FROM r", engine=engine)["n"][0] > 0


def test_a_compacted_chain(tmp_path):
    write_history(tmp_path, commits=12)  # over 9 commits: chains are compacted
    with iqkit.open(tmp_path) as engine:
        check_same(engine, "r", QUERIES)


def test_as_of_reads_the_pinned_version(tmp_path):
    write_history(tmp_path, commits=3)
    for version in (1, 2, 3):
        with iqkit.open(tmp_path, as_of=version) as engine:
            check_same(engine, "r", QUERIES[:3])
    with iqkit.open(tmp_path, as_of=1) as engine:
        assert iqkit.sql("SELECT count(*) AS n FROM r", engine=engine)["n"][0] == 60


def test_typed_int64_store(tmp_path):
    iqkit.create_store(tmp_path, "n", partitions=4, key_serde="int32", value_serde="int64")
    for c in range(3):
        with iqkit.StoreWriter(tmp_path, "n") as w:
            for k in range(c, 200, c + 1):
                w.put(k, k * (c + 1))
            w.delete(c * 7)
    queries = [
        "SELECT value % 16 AS g, sum(value) AS total, count(*) AS n FROM {t} GROUP BY g ORDER BY g",
        "SELECT * FROM {t} ORDER BY partition, key",
        "SELECT key FROM {t} WHERE value > 100 AND key < 150 ORDER BY key",
    ]
    with iqkit.open(tmp_path) as engine:
        check_same(engine, "n", queries)


def test_records_whose_fields_differ_between_commits(tmp_path):
    # A field only the second commit writes: null in the older file's rows.
    iqkit.create_store(tmp_path, "r", partitions=2, value_serde="json")
    with iqkit.StoreWriter(tmp_path, "r") as w:
        for i in range(20):
            w.put(f"k{i:03d}", {"price": float(i), "qty": i, "tag": "a"})
    with iqkit.StoreWriter(tmp_path, "r") as w:
        for i in range(10, 30):
            w.put(f"k{i:03d}", {"price": float(i), "qty": i, "tag": "b", "extra": i * 2})
    with iqkit.open(tmp_path) as engine:
        check_same(engine, "r", [*QUERIES[:2], "SELECT key, extra FROM {t} ORDER BY key"])


def test_an_object_root(s3_root):
    write_history(s3_root, commits=3)
    with iqkit.open(s3_root) as engine:
        check_same(engine, "r", QUERIES)


def test_a_store_without_twins_is_streamed(tmp_path):
    iqkit.create_store(tmp_path, "w", partitions=2, kind="window", window_size_ms=1000,
                       value_serde="int64")  # fmt: skip
    with iqkit.StoreWriter(tmp_path, "w") as w:
        for i in range(10):
            w.put(f"u{i % 3}", i, window_start=i * 1000)
    write_history(tmp_path, commits=2)
    with iqkit.open(tmp_path) as engine, SQLSession(engine=engine) as session:
        assert not uses_twins(session, "w")
        got = session.query("SELECT count(*) AS n, sum(value) AS s FROM w")
        assert (got["n"][0], got["s"][0]) == (10, 45)
        with twin_scans(False):
            assert not uses_twins(session, "r")
            streamed = session.query_arrow("SELECT * FROM r ORDER BY partition, key")
        assert uses_twins(session, "r")
        assert session.query_arrow("SELECT * FROM r ORDER BY partition, key").equals(streamed)


def test_the_view_is_gone_after_the_statement(tmp_path):
    write_history(tmp_path, commits=2)
    with iqkit.open(tmp_path) as engine, SQLSession(engine=engine) as session:
        session.query("SELECT count(*) FROM r")
        views = session.query("SELECT view_name FROM duckdb_views() WHERE NOT internal")
        assert list(views["view_name"]) == []
        # The next statement sees a new commit (a new view, a new version).
        with iqkit.StoreWriter(tmp_path, "r") as w:
            w.put("zzz", record(1))
        assert session.query("SELECT count(*) AS n FROM r WHERE key = 'zzz'")["n"][0] == 1


def test_a_damaged_twin_is_one_line_naming_the_store_and_partition(tmp_path):
    write_history(tmp_path, commits=1)
    twin = sorted((tmp_path / "r" / "sst" / "1").glob("*.parquet"))[-1]
    twin.write_bytes(b"not parquet at all" * 10)
    with iqkit.open(tmp_path) as engine, pytest.raises(SQLError) as info:
        iqkit.sql("SELECT sum(qty) FROM r", engine=engine)
    message = str(info.value)
    assert "\n" not in message
    assert "'r'" in message and "partition 1" in message and twin.name in message


def test_a_twin_damaged_past_its_footer_is_one_line(tmp_path):
    write_history(tmp_path, commits=1)
    twin = sorted((tmp_path / "r" / "sst" / "2").glob("*.parquet"))[-1]
    data = bytearray(twin.read_bytes())
    for i in range(4, len(data) // 2):  # the column chunks, not the footer
        data[i] = 0xFF
    twin.write_bytes(bytes(data))
    with iqkit.open(tmp_path) as engine, pytest.raises(SQLError) as info:
        iqkit.sql("SELECT sum(price), max(tag), max(key) FROM r", engine=engine)
    message = str(info.value)
    assert "\n" not in message
    assert "'r'" in message and "partition 2" in message and twin.name in message


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_histories_merge_by_position_as_rocksdb_does(tmp_path_factory, data):
    """Random histories of puts, deletes, compactions (over 9 commits) and retention,
    some commits written without position deletes (an earlier iqkit's: those chains are
    merged on keys), every retained version: the view gives what RocksDB has."""
    root = tmp_path_factory.mktemp("positions")
    iqkit.create_store(
        root, "r", partitions=data.draw(st.integers(1, 3)), value_serde="json",
        retention=data.draw(st.integers(2, 4)),
    )  # fmt: skip
    keys = [f"k{i:03d}" for i in range(40)]
    for _ in range(data.draw(st.integers(1, 12))):
        with writing(data.draw(st.integers(0, 3)) > 0), iqkit.StoreWriter(root, "r") as w:
            for i in data.draw(st.lists(st.integers(0, 39), max_size=15)):
                if data.draw(st.integers(0, 3)) == 0:
                    w.delete(keys[i])
                else:
                    w.put(keys[i], record(data.draw(st.integers(0, 99))))
    with iqkit.open(root) as latest:
        versions = latest.versions("r")
    for version in versions:
        with iqkit.open(root, as_of=version) as engine:
            with twin_scans(False):
                want = store_batches(engine, "r").read_all()
            if want.num_rows == 0:
                continue
            check_same(engine, "r", QUERIES[:5])


def test_new_chains_merge_by_position_and_earlier_ones_on_keys(tmp_path):
    """One version whose partitions' newest twins have position deletes and whose
    other partitions' do not (written by an earlier iqkit): one view reads both."""
    with writing(False):
        write_history(tmp_path, commits=3)
    with iqkit.StoreWriter(tmp_path, "r") as w:
        w.put("k001", record(99, "new"))  # one partition's chain gets position deletes
    with iqkit.open(tmp_path) as engine:
        files = engine.twin_files("r")
        view = twin_view(duckdb.connect(), "r", files)
        assert view is not None
        assert "get_bit" in view.sql and "NOT EXISTS" in view.sql
        view.close()
        check_same(engine, "r", QUERIES)
    with iqkit.StoreWriter(tmp_path, "r") as w:  # every partition's chain, now
        for i in range(0, 60, 7):
            w.put(f"k{i:03d}", record(i, "new"))
    with iqkit.open(tmp_path) as engine:
        files = engine.twin_files("r")
        view = twin_view(duckdb.connect(), "r", files)
        assert view is not None
        assert "get_bit" in view.sql and "NOT EXISTS" not in view.sql
        view.close()
        check_same(engine, "r", QUERIES)


def test_a_damaged_sst_does_not_change_sql_which_reads_the_twins_only(tmp_path):
    """DuckDB reads the twins alone, so they are checked whole and the SSTs beside them
    are not (a damaged SST cannot change the answer); once a reader found an SST
    damaged, SQL fails the partition with the same line (integrity.py's one verdict)."""
    write_history(tmp_path, commits=2)
    query = "SELECT count(*) AS n, sum(qty) AS q FROM r"
    with iqkit.open(tmp_path) as engine:
        want = iqkit.sql(query, engine=engine).values.tolist()
    sst = sorted((tmp_path / "r" / "sst" / "1").glob("*.sst"))[0]
    sst.write_bytes(bytes((b + 101) % 256 for b in sst.read_bytes()))  # same size
    with iqkit.open(tmp_path) as engine:
        assert iqkit.sql(query, engine=engine).values.tolist() == want
        keys = (f"k{i:03d}" for i in range(60))
        key = next(k for k in keys if engine.partition_for_key("r", k) == 1)
        lookup = iqkit.KeyQuery.with_key(key)  # reads the SST, finds it damaged
        r = engine.query(iqkit.StateQueryRequest.in_store("r").with_query(lookup))
        assert r.partition_results[1].is_failure
        with pytest.raises(SQLError, match=sst.name):
            iqkit.sql(query, engine=engine)


def test_a_second_statement_on_the_same_files_reuses_the_plan(tmp_path):
    """A version's plan (footers, bitmaps, SQL) is made once per session: the same files
    give the same plan; a new version's files a new one; ``KEPT`` plans at most."""
    write_history(tmp_path, commits=2)
    con = duckdb.connect()
    plans = TwinPlans()
    with iqkit.open(tmp_path) as engine:
        files = engine.twin_files("r")
        again = engine.twin_files("r")
        first = plans.plan(con, files)
        assert first is not None and plans.plan(con, again) is first
        files.release()
        again.release()
    with iqkit.StoreWriter(tmp_path, "r") as w:
        w.put("k000", record(5, "new"))
    plans.KEPT = 1
    with iqkit.open(tmp_path) as engine:
        files = engine.twin_files("r")
        newer = plans.plan(con, files)
        files.release()
    assert newer is not None and newer is not first and newer.sql != first.sql
    with iqkit.open(tmp_path, as_of=2) as engine:
        files = engine.twin_files("r")
        assert plans.plan(con, files) is not first  # evicted by the newer one
        files.release()


def test_tombstones_are_dropped_by_position_and_footers_cached_for_the_statement(tmp_path):
    """Chains merged by position: DuckDB never filters on ``__deleted`` (tombstones are
    bits of the files' bitmaps too); while a statement reads twins, DuckDB keeps their
    footers (``parquet_metadata_cache``), and the session's own value is back after."""
    write_history(tmp_path, commits=3)
    with iqkit.open(tmp_path) as engine:
        files = engine.twin_files("r")
        view = twin_view(duckdb.connect(), "r", files)
        assert view is not None and "__deleted" not in view.sql
        view.close()
        with SQLSession(engine=engine) as session:
            during = "SELECT current_setting('parquet_metadata_cache') AS c, count(*) FROM r"
            assert bool(session.query(during)["c"][0]) is True
            after = "SELECT current_setting('parquet_metadata_cache') AS c"
            assert bool(session.query(after)["c"][0]) is False
            session.query("SET parquet_metadata_cache = true")  # the user's own choice
            session.query("SELECT count(*) FROM r")
            assert bool(session.query(after)["c"][0]) is True


def test_every_row_deleted(tmp_path):
    iqkit.create_store(tmp_path, "r", partitions=2, value_serde="json")
    with iqkit.StoreWriter(tmp_path, "r") as w:
        for i in range(10):
            w.put(f"k{i:03d}", record(i))
    with iqkit.StoreWriter(tmp_path, "r") as w:
        for i in range(10):
            w.delete(f"k{i:03d}")
    with iqkit.open(tmp_path) as engine, SQLSession(engine=engine) as session:
        got = session.query_arrow("SELECT * FROM r")
        assert got.num_rows == 0
        assert got.column_names == ["partition", "key", "price", "qty", "tag"]
        assert session.query("SELECT count(*) AS n FROM r")["n"][0] == 0


def test_a_link_planted_after_a_statement_is_not_followed(tmp_path):
    """The session's later statements check each twin by a ``stat`` of its own path (its
    paths were found through no link once): a twin swapped for a link to a copy of
    itself outside the root fails with one line naming it, as on the first statement."""
    root = tmp_path / "root"
    write_history(root, commits=2)
    twin = sorted((root / "r" / "sst" / "1").glob("*.parquet"))[-1]
    with iqkit.open(root) as engine, SQLSession(engine=engine) as session:
        n = session.query("SELECT count(*) AS n FROM r")["n"][0]
        copy = tmp_path / "outside.parquet"
        copy.write_bytes(twin.read_bytes())
        twin.unlink()
        twin.symlink_to(copy)
        with pytest.raises(SQLError) as info:
            session.query("SELECT count(*) AS n FROM r")
        assert twin.name in str(info.value) and "\n" not in str(info.value)
        twin.unlink()
        twin.write_bytes(copy.read_bytes())  # restored: read again
        assert session.query("SELECT count(*) AS n FROM r")["n"][0] == n
