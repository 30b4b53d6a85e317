"""SQLSession / iqkit.sql: DuckDB over registered results, notebook DataFrames and stores
(real RocksDB stores on disk, a real private DuckDB connection)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from helpers import kv_rows

import iqkit
from iqkit.sqlsession import SQLError, SQLSession, sql
from iqkit.store.partitions.layers import twin_scans

TOTALS = {f"c{i:03d}": {"total": i * 10, "region": "eu" if i % 3 else "us"} for i in range(60)}


def _write_totals(root: Path, name: str = "orders-totals") -> None:
    iqkit.create_store(root, name, partitions=3)
    with iqkit.StoreWriter(root, name) as w:
        for key, value in TOTALS.items():
            w.put(key, value)


@pytest.fixture
def engine(root: Path):
    _write_totals(root)
    iqkit.create_store(
        root, "clicks", partitions=2, kind="window", window_size_ms=60_000, value_serde="int64"
    )
    with iqkit.StoreWriter(root, "clicks") as w:
        for minute in range(4):
            w.put("alice", minute + 1, window_start=minute * 60_000)
        w.put("bob", 7, window_start=60_000)
    with iqkit.open(root) as eng:
        yield eng


@pytest.fixture(scope="module")
def big_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store big enough to stream in several batches and to interrupt mid-scan."""
    root = tmp_path_factory.mktemp("big") / "stores"
    iqkit.create_store(root, "big", partitions=2)
    with iqkit.StoreWriter(root, "big") as w:
        for i in range(200_000):
            w.put(f"k{i:06d}", {"n": i, "even": i % 2 == 0})
    return root


def _views(session: SQLSession) -> set[str]:
    frame = session.query("SELECT view_name FROM duckdb_views() WHERE NOT internal")
    return set(frame["view_name"])


# -- registration and namespace resolution ---------------------------------------------------
def test_join_namespace_frame_with_arrow_table_matches_pandas_merge() -> None:
    people = pd.DataFrame({"id": [1, 2, 3, 4], "name": ["ann", "bo", "cy", "di"]})
    scores = pa.table({"id": [2, 3, 3, 9], "score": [1.5, 2.5, 4.0, 9.9]})
    with SQLSession(namespace={"people": people, "scores": scores}) as s:
        got = s.query(
            "SELECT p.name, sum(s.score) AS score FROM people p JOIN scores s ON p.id = s.id "
            "GROUP BY p.name ORDER BY p.name"
        )
    want = (
        people.merge(scores.to_pandas(), on="id")
        .groupby("name", as_index=False)["score"]
        .sum()
        .sort_values("name")
        .reset_index(drop=True)
    )
    pd.testing.assert_frame_equal(got, want)


def test_namespace_frames_are_registered_for_one_query_only() -> None:
    df = pd.DataFrame({"x": [1, 2, 3]})
    ns = {"df": df}
    with SQLSession(namespace=ns) as s:
        assert s.query("SELECT sum(x) AS s FROM df")["s"].iloc[0] == 6
        assert _views(s) == set()
        assert s.registered() == []
        ns["df"] = pd.DataFrame({"x": [10]})  # the next query sees the variable's new value
        assert s.query("SELECT sum(x) AS s FROM df")["s"].iloc[0] == 10


def test_frame_scanning_is_off() -> None:
    local_frame = pd.DataFrame({"x": [1]})  # DuckDB's replacement scan would find this
    assert len(local_frame) == 1
    with SQLSession() as s:
        setting = s.query("SELECT current_setting('python_enable_replacements') AS v")
        assert not setting["v"].iloc[0]
        with pytest.raises(SQLError, match="unknown table 'local_frame'"):
            s.query("SELECT * FROM local_frame")


def test_register_supported_objects_and_unregister() -> None:
    class HasArrow:  # the protocol IQResult follows: .arrow() -> pa.Table
        def arrow(self) -> pa.Table:
            return pa.table({"v": [5, 6]})

    batch = pa.record_batch({"v": [3]})
    with SQLSession() as s:
        s.register("frame", pd.DataFrame({"v": [1, 2]}))
        s.register("tbl", pa.table({"v": [10, 20, 30]}))
        s.register("batch", batch)
        s.register("reader", pa.RecordBatchReader.from_batches(batch.schema, [batch, batch]))
        s.register("result", HasArrow())
        assert s.registered() == ["batch", "frame", "reader", "result", "tbl"]
        got = s.query(
            "SELECT (SELECT sum(v) FROM frame) a, (SELECT sum(v) FROM tbl) b, "
            "(SELECT sum(v) FROM batch) c, (SELECT sum(v) FROM reader) d, "
            "(SELECT sum(v) FROM result) e"
        )
        assert got.iloc[0].tolist() == [3, 60, 3, 6, 11]
        # A RecordBatchReader is a stream: it can be read once only (DuckDB says so).
        with pytest.raises(SQLError, match="consumed"):
            s.query("SELECT * FROM reader")
        s.register("tbl", pa.table({"v": [1]}))  # replaces
        assert s.query("SELECT sum(v) AS s FROM tbl")["s"].iloc[0] == 1
        s.unregister("tbl")
        assert "tbl" not in s.registered()
        with pytest.raises(SQLError, match="unknown table 'tbl'"):
            s.query("SELECT * FROM tbl")
        with pytest.raises(SQLError, match="no registered table 'tbll'; available: batch, frame"):
            s.unregister("tbll")


def test_registered_dataframes_are_scanned_in_place_not_copied() -> None:
    values = np.arange(5, dtype=np.int64)
    frame = pd.DataFrame({"x": values}, copy=False)
    with SQLSession(namespace={"ns_frame": frame}) as s:
        s.register("frame", frame)
        values[0] = 1_000  # after registering: a copy taken then would not see this
        assert frame["x"].iloc[0] == 1_000  # (pandas shares the array)
        got = s.query("SELECT (SELECT sum(x) FROM frame) a, (SELECT sum(x) FROM ns_frame) b")
        assert got.iloc[0].tolist() == [1_000 + 1 + 2 + 3 + 4] * 2


@pytest.mark.parametrize("bad", [42, "text", os, pd.DataFrame])
def test_register_rejects_what_is_not_a_table(bad: object) -> None:
    with SQLSession() as s, pytest.raises(SQLError, match="cannot use 'x' as a table"):
        s.register("x", bad)
    with SQLSession() as s, pytest.raises(SQLError, match="non-empty string"):
        s.register("", pd.DataFrame())


def test_an_arrow_method_that_fails_is_one_sqlerror() -> None:
    class Broken:
        def arrow(self) -> pa.Table:
            raise RuntimeError("result was closed")

    failed = r"'broken' as a table: its \.arrow\(\) failed: result was closed"
    with SQLSession(namespace={"broken": Broken()}) as s, pytest.raises(SQLError, match=failed):
        s.query("SELECT * FROM broken")


def test_namespace_values_that_are_not_tables_are_not_tables() -> None:
    with SQLSession(namespace={"n": 3}) as s, pytest.raises(SQLError, match="unknown table 'n'"):
        s.query("SELECT * FROM n")


def test_resolution_order_registered_catalog_namespace_store(engine) -> None:
    ns_frame = pd.DataFrame({"src": ["namespace"]})
    ns = {"clicks": ns_frame, "named": ns_frame, "made": ns_frame}
    with SQLSession(engine=engine, namespace=ns) as s:
        # A namespace frame wins over a store of the same name ...
        assert s.query("SELECT src FROM clicks")["src"].tolist() == ["namespace"]
        # ... a registered name over a namespace frame ...
        s.register("named", pd.DataFrame({"src": ["registered"]}))
        assert s.query("SELECT src FROM named")["src"].tolist() == ["registered"]
        # ... and a table the session's own SQL created over a namespace frame.
        s.query("CREATE TABLE made AS SELECT 'catalog' AS src")
        assert s.query("SELECT src FROM made")["src"].tolist() == ["catalog"]
        # Without the namespace, the store is what 'clicks' means.
        assert "window_start" in s.query("SELECT * FROM clicks", namespace={}).columns


def test_names_match_case_insensitively_like_duckdb_identifiers() -> None:
    with SQLSession(namespace={"Cust": pd.DataFrame({"x": [1, 2]})}) as s:
        assert s.query("SELECT count(*) AS n FROM CUST")["n"].iloc[0] == 2


def test_unknown_table_is_one_short_error_with_a_hint(engine) -> None:
    ns = {"customers": pd.DataFrame({"x": [1]})}
    with SQLSession(engine=engine, namespace=ns) as s:
        s.register("scan_result", pd.DataFrame({"x": [1]}))
        for typo, meant in [
            ("customer", "customers"),
            ('"orders-total"', "orders-totals"),
            ("scan_reslt", "scan_result"),
        ]:
            with pytest.raises(SQLError) as info:
                s.query(f"SELECT * FROM {typo}")
            msg = str(info.value)
            assert msg == f"unknown table {typo.strip(chr(34))!r}; did you mean {meant!r}?"
            assert info.value.__suppress_context__  # raised "from None": no chained wall
        with pytest.raises(SQLError, match=r"unknown table 'zzz'; available: .*clicks"):
            s.query("SELECT * FROM zzz")


def test_duckdb_errors_are_short_sqlerrors() -> None:
    with SQLSession(namespace={"t": pd.DataFrame({"a": [1], "b": ["x"]})}) as s:
        with pytest.raises(SQLError, match=r"^Parser Error: syntax error") as info:
            s.query("SELEC * FROM t")
        assert "LINE 1: SELEC" in str(info.value)
        with pytest.raises(SQLError, match=r'^Binder Error: Referenced column "nope"'):
            s.query("SELECT nope FROM t")
        with pytest.raises(SQLError) as info:
            s.query("SELECT a + b FROM t")
        # DuckDB lists every overload of '+' (dozens of lines); the error keeps one.
        assert str(info.value).startswith("Binder Error: No function matches")
        assert len(str(info.value).splitlines()) <= 3
        with pytest.raises(SQLError, match="no SQL"):
            s.query("   ")


def test_using_join_where_get_table_names_fails(engine) -> None:
    left = pd.DataFrame({"key": ["c001", "c002", "zzz"], "tag": ["a", "b", "c"]})
    right = pa.table({"key": ["c002", "zzz"], "w": [1, 2]})
    sql_text = "SELECT l.tag, r.w FROM lft l JOIN rgt r USING (key) ORDER BY l.tag"
    with duckdb.connect() as raw, pytest.raises(duckdb.BinderException):
        raw.get_table_names(sql_text)  # the DuckDB quirk the fallback exists for
    with SQLSession(engine=engine, namespace={"lft": left, "rgt": right}) as s:
        got = s.query(sql_text)
        assert got.values.tolist() == [["b", 1], ["c", 2]]
        # A store joined with USING, which get_table_names cannot read either.
        got = s.query(
            'SELECT key, t.total FROM lft JOIN "orders-totals" t USING (key) ORDER BY key'
        )
        assert got.values.tolist() == [["c001", 10], ["c002", 20]]
        with pytest.raises(SQLError, match="unknown table 'rgtt'; did you mean 'rgt'"):
            s.query("SELECT * FROM lft JOIN rgtt USING (key)")


# -- parameters --------------------------------------------------------------------------------
def test_parameters_dict_list_and_namespace() -> None:
    t = pd.DataFrame({"k": ["a", "b", "c", "d"], "n": [1, 2, 3, 4]})
    with SQLSession(namespace={"t": t, "lo": 2, "name": "d"}) as s:
        q = "SELECT k FROM t WHERE n >= $lo ORDER BY k"
        assert s.query(q, {"lo": 3})["k"].tolist() == ["c", "d"]  # explicit beats namespace
        assert s.query(q)["k"].tolist() == ["b", "c", "d"]  # bound from the namespace
        assert s.query("SELECT k FROM t WHERE n > ? AND n < ?", [1, 4])["k"].tolist() == [
            "b",
            "c",
        ]
        assert s.query("SELECT k FROM t WHERE k = $name")["k"].tolist() == ["d"]


def test_numpy_scalars_bind_as_their_python_values() -> None:
    t = pd.DataFrame({"n": [1, 2, 3]})
    top = t["n"].max()  # numpy.int64, which DuckDB cannot bind by itself
    with SQLSession(namespace={"t": t, "top": top}) as s:
        assert s.query("SELECT count(*) AS c FROM t WHERE n < $top")["c"].iloc[0] == 2
        assert s.query("SELECT ? + ? AS v", [np.float32(0.5), np.int8(2)])["v"].iloc[0] == 2.5


def test_parameter_values_are_never_spliced() -> None:
    t = pd.DataFrame({"k": ["a", "b"]})
    evil = "a' OR '1'='1"
    with SQLSession(namespace={"t": t, "evil": evil}) as s:
        assert s.query("SELECT count(*) AS n FROM t WHERE k = $evil")["n"].iloc[0] == 0
        assert s.query("SELECT $evil AS v")["v"].iloc[0] == evil


def test_dollar_names_inside_literals_comments_and_quoted_identifiers_are_not_parameters() -> None:
    with SQLSession(namespace={"x": 5}) as s:  # none of $a, $b, $c, $d exists
        got = s.query(
            "SELECT '$a' AS lit, $$ $b $$ AS dollar, 1 AS \"$c\" /* $d */ -- $d\n, $x AS x"
        )
        assert got.iloc[0].tolist() == ["$a", " $b ", 1, 5]
        assert list(got.columns) == ["lit", "dollar", "$c", "x"]


def test_parameter_errors_name_the_parameter() -> None:
    with SQLSession(namespace={"a": 1}) as s:
        with pytest.raises(SQLError, match=r"parameter \$missing: no variable named 'missing'"):
            s.query("SELECT $a, $missing")
        with pytest.raises(SQLError, match=r"parameter\(s\) extra not used"):
            s.query("SELECT $a", {"a": 1, "extra": 2})
        with pytest.raises(SQLError, match=r"no value for parameter \$b"):
            s.query("SELECT $a, $b", {"a": 1})
        with pytest.raises(SQLError, match="params must be a dict"):
            s.query("SELECT ?", "1")
        with pytest.raises(SQLError, match="ambiguous"):
            s.query("SELECT ?; SELECT ?", [1])
    with SQLSession() as s, pytest.raises(SQLError, match="Values were not provided"):
        s.query("SELECT $v")  # no namespace: DuckDB's own message


def test_several_statements_run_in_order_and_return_the_last() -> None:
    with SQLSession(namespace={"src": pd.DataFrame({"n": [1, 2, 3]})}) as s:
        got = s.query(
            "CREATE TABLE kept AS SELECT n * $f AS m FROM src; SELECT sum(m) AS s FROM kept "
            "WHERE m > $lo",
            {"f": 10, "lo": 10},
        )
        assert got["s"].iloc[0] == 50
        assert s.query("SELECT count(*) AS c FROM kept")["c"].iloc[0] == 3  # tables persist
        assert list(s.query("DROP TABLE kept").columns) == ["Success"]


def test_query_arrow_returns_the_same_rows_as_query() -> None:
    t = pd.DataFrame({"k": ["a", "b"], "n": [1, 2]})
    with SQLSession(namespace={"t": t}) as s:
        arrow = s.query_arrow("SELECT * FROM t ORDER BY k")
        assert isinstance(arrow, pa.Table)
        pd.testing.assert_frame_equal(arrow.to_pandas(), s.query("SELECT * FROM t ORDER BY k"))


# -- stores as tables ------------------------------------------------------------------------
def test_store_as_table_joined_with_a_dataframe(engine) -> None:
    customers = pd.DataFrame(
        {"key": ["c003", "c010", "c042", "nobody"], "name": ["x", "y", "z", "w"]}
    )
    with SQLSession(engine=engine, namespace={"customers": customers}) as s:
        got = s.query(
            'SELECT c.name, t.key, t.total, t.region FROM "orders-totals" t '
            "JOIN customers c ON c.key = t.key ORDER BY t.key"
        )
        full = s.query('SELECT * FROM "orders-totals" ORDER BY key')
    assert list(full.columns) == ["partition", "key", "total", "region"]
    on_disk = sorted(kv_rows(engine, "orders-totals"), key=lambda r: r[1])
    assert full[["partition", "key"]].values.tolist() == [[p, k] for p, k, _ in on_disk]
    assert full["total"].tolist() == [v["total"] for _, _, v in on_disk]
    want = [
        [n, k, TOTALS[k]["total"], TOTALS[k]["region"]]
        for k, n in [("c003", "x"), ("c010", "y"), ("c042", "z")]
    ]
    assert got.values.tolist() == want


def test_store_names_with_dots_and_dashes_work_quoted(root: Path) -> None:
    _write_totals(root, "eu.orders-v2")
    with iqkit.open(root) as eng, SQLSession(engine=eng) as s:
        got = s.query('SELECT count(*) AS n, sum(total) AS s FROM "eu.orders-v2"')
        assert got.iloc[0].tolist() == [len(TOTALS), sum(v["total"] for v in TOTALS.values())]


def test_window_store_and_self_join(engine) -> None:
    with SQLSession(engine=engine) as s:
        w = s.query("SELECT key, window_start, window_end, value FROM clicks ORDER BY key, 2")
        assert w["key"].tolist() == ["alice"] * 4 + ["bob"]
        assert w["value"].tolist() == [1, 2, 3, 4, 7]
        assert ((w["window_end"] - w["window_start"]) == pd.Timedelta(minutes=1)).all()
        # A store scanned twice in one statement (each scan streams it afresh).
        pairs = s.query(
            'SELECT count(*) AS n FROM "orders-totals" a JOIN "orders-totals" b '
            "ON a.region = b.region"
        )
        regions = pd.Series([v["region"] for v in TOTALS.values()]).value_counts()
        assert pairs["n"].iloc[0] == int((regions**2).sum())


@pytest.fixture
def streamed_stores():
    """Stores streamed from their rows (``StoreStream``), not read as views over their
    columnar twins (tests/sql/test_sql_twins.py): what progress and snapshots apply to."""
    with twin_scans(False):
        yield


@pytest.mark.usefixtures("streamed_stores")
def test_store_is_streamed_in_batches_not_materialized(big_root: Path) -> None:
    seen: list[tuple[str, int]] = []
    with (
        iqkit.open(big_root) as eng,
        SQLSession(
            engine=eng, progress=lambda st, rows: seen.append((st, rows)), cache_bytes=0
        ) as s,
    ):
        got = s.query("SELECT count(*) AS n, sum(n) AS s FROM big")
        assert got.iloc[0].tolist() == [200_000, sum(range(200_000))]
        assert {store for store, _ in seen} == {"big"}
        assert sum(rows for _, rows in seen) == 200_000
        assert len(seen) > 1 and max(rows for _, rows in seen) <= 65_536
        # DuckDB stops pulling once LIMIT is met: the rest of the store is never read.
        seen.clear()
        assert len(s.query("SELECT * FROM big LIMIT 3")) == 3
        assert 0 < sum(rows for _, rows in seen) < 200_000


def test_store_scan_sees_new_commits_and_engine_getter_is_lazy(root: Path) -> None:
    _write_totals(root)
    asked: list[int] = []
    with iqkit.open(root) as eng:

        def current() -> iqkit.StateEngine:
            asked.append(1)
            return eng

        with SQLSession(engine=current, namespace={"d": pd.DataFrame({"x": [1]})}) as s:
            assert s.query("SELECT count(*) AS n FROM d")["n"].iloc[0] == 1
            assert asked == []  # no store referenced: the engine was not needed
            before = s.query('SELECT count(*) AS n FROM "orders-totals"')["n"].iloc[0]
            with iqkit.StoreWriter(root, "orders-totals") as w:
                w.put("new-key", {"total": 1, "region": "eu"})
            after = s.query('SELECT count(*) AS n FROM "orders-totals"')["n"].iloc[0]
            assert (before, after) == (len(TOTALS), len(TOTALS) + 1)


def test_engine_getter_failure_is_named_in_the_unknown_table_error() -> None:
    def no_engine() -> iqkit.StateEngine:
        raise iqkit.StoreNotFoundError("no iqkit root folder at 'nowhere'")

    unavailable = "stores unavailable: no iqkit root folder"
    with SQLSession(engine=no_engine) as s, pytest.raises(SQLError, match=unavailable):
        s.query('SELECT * FROM "orders-totals"')
    with SQLSession(engine=lambda: None) as s, pytest.raises(SQLError, match="unknown table"):
        s.query("SELECT * FROM anything")


@pytest.mark.usefixtures("streamed_stores")
def test_store_read_failure_mid_scan_is_one_sqlerror(root: Path) -> None:
    # The schema comes from the first batch (65,536 rows); a field first seen later
    # cannot be streamed, and store_batches says so: the session passes that on.
    iqkit.create_store(root, "drift", partitions=1, key_serde="int64")
    with iqkit.StoreWriter(root, "drift") as w:
        for i in range(70_000):
            w.put(i, {"a": i} if i < 69_000 else {"a": i, "late": "x"})
    with iqkit.open(root) as eng, SQLSession(engine=eng) as s:
        with pytest.raises(SQLError, match=r"reading store 'drift' failed: .*'late'") as info:
            s.query("SELECT count(*) FROM drift")
        assert "Traceback" not in str(info.value)
        assert s.query("SELECT 1 AS ok")["ok"].iloc[0] == 1
        assert _views(s) == set()


# -- interrupt -------------------------------------------------------------------------------
_ENDLESS = "SELECT count(*) FROM big a, big b WHERE a.n + b.n < 0"


def _watchdog(session: SQLSession, fired: list[bool]) -> threading.Timer:
    """Interrupts the session after 60 s so a broken interrupt fails instead of hanging."""

    def fire() -> None:
        fired.append(True)
        session.interrupt()

    timer = threading.Timer(60, fire)
    timer.start()
    return timer


@pytest.mark.usefixtures("streamed_stores")
def test_interrupt_from_another_thread_leaves_the_session_usable(big_root: Path) -> None:
    frame = pd.DataFrame({"x": [1, 2]})
    with iqkit.open(big_root) as eng, SQLSession(engine=eng, namespace={"frame": frame}) as s:
        s.register("kept", pd.DataFrame({"y": [1]}))
        timer = threading.Timer(0.5, s.interrupt)
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            s.query(_ENDLESS + " AND a.n IN (SELECT x FROM frame)")
        timer.cancel()
        assert _views(s) == {"kept"}  # per-query registrations are gone, explicit kept
        assert s.query("SELECT count(*) AS n FROM big")["n"].iloc[0] == 200_000


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs pthread_kill")
@pytest.mark.parametrize(
    ("query", "delay"),
    [
        # hash(i) = 42: a filter DuckDB cannot prove false (DuckDB 2 folds `i % 7 = 10` away and
        # answers at once, before the interrupt lands)
        ("SELECT count(*) FROM range(1000000000000000) t(i) WHERE hash(i) = 42", 0.5),
        (_ENDLESS, 0.3),  # lands while DuckDB pulls store batches (Python code)
        (_ENDLESS, 2.0),  # lands in DuckDB's join, after the scans
    ],
)
@pytest.mark.usefixtures("sigint_raises")
def test_keyboard_interrupt_leaves_the_session_usable(
    big_root: Path, query: str, delay: float
) -> None:
    """A real SIGINT (what the kernel's stop button sends) to the thread running the
    query."""
    main = threading.get_ident()
    fired: list[bool] = []
    with iqkit.open(big_root) as eng, SQLSession(engine=eng) as s:
        guard = _watchdog(s, fired)
        try:
            with pytest.raises(KeyboardInterrupt):
                threading.Timer(delay, signal.pthread_kill, (main, signal.SIGINT)).start()
                s.query(query)
        finally:
            guard.cancel()
        assert not fired, "SIGINT did not stop the query; the watchdog did"
        assert _views(s) == set()
        assert s.query("SELECT sum(n) AS s FROM big WHERE n < 10")["s"].iloc[0] == 45


# -- lifecycle and iqkit.sql -----------------------------------------------------------------
def test_close_is_idempotent_and_final() -> None:
    s = SQLSession()
    s.register("t", pd.DataFrame({"x": [1]}))
    s.close()
    s.close()
    assert s.is_closed
    with pytest.raises(SQLError, match="closed"):
        s.query("SELECT 1")
    with pytest.raises(SQLError, match="closed"):
        s.register("u", pd.DataFrame())


def test_sessions_are_private_connections() -> None:
    with SQLSession() as a, SQLSession() as b:
        a.query("CREATE TABLE only_a AS SELECT 1 AS x")
        with pytest.raises(SQLError, match="unknown table 'only_a'"):
            b.query("SELECT * FROM only_a")
    with pytest.raises(duckdb.CatalogException):
        duckdb.sql("SELECT * FROM only_a")  # nor the module's default connection


def test_iqkit_sql_function(engine, root: Path) -> None:
    regions = pd.DataFrame({"region": ["eu", "us"], "label": ["Europe", "America"]})
    q = (
        'SELECT r.label, count(*) AS n FROM "orders-totals" t JOIN regions r USING (region) '
        "WHERE t.total >= $min GROUP BY r.label ORDER BY r.label"
    )
    want_counts = pd.Series(
        [v["region"] for v in TOTALS.values() if v["total"] >= 100]
    ).value_counts()
    want = [["America", want_counts["us"]], ["Europe", want_counts["eu"]]]
    assert sql(q, {"min": 100}, root=root, regions=regions).values.tolist() == want
    assert sql(q, {"min": 100}, engine=engine, regions=regions).values.tolist() == want
    assert sql("SELECT sum(x) AS s FROM a", a=pa.table({"x": [1, 2]}))["s"].iloc[0] == 3
    with pytest.raises(SQLError, match="not both"):
        sql("SELECT 1", root=root, engine=engine)
    with pytest.raises(SQLError, match="unknown table 'regions'"):
        sql("SELECT * FROM regions")  # iqkit.sql never looks at the caller's variables


# -- store snapshots ---------------------------------------------------------------------------
@pytest.mark.usefixtures("streamed_stores")
def test_a_store_version_is_decoded_once_then_served_from_memory(root: Path) -> None:
    _write_totals(root)
    streamed: list[int] = []
    q = 'SELECT sum(total) AS s, count(*) AS n FROM "orders-totals"'
    with (
        iqkit.open(root) as eng,
        SQLSession(engine=eng, progress=lambda store, rows: streamed.append(rows)) as s,
    ):
        first = s.query(q).iloc[0].tolist()
        assert sum(streamed) == len(TOTALS)
        streamed.clear()
        assert s.query(q).iloc[0].tolist() == first
        assert streamed == []  # the same version again: no store read at all
        with iqkit.StoreWriter(root, "orders-totals") as w:
            w.put("c000", {"total": 1_000_000, "region": "eu"})
        updated = s.query(q).iloc[0].tolist()
        assert sum(streamed) == len(TOTALS)  # a new version is streamed afresh
        assert updated == [first[0] + 1_000_000, len(TOTALS)]


@pytest.mark.usefixtures("streamed_stores")
def test_partial_scans_and_a_zero_budget_keep_nothing(big_root: Path) -> None:
    streamed: list[int] = []
    with iqkit.open(big_root) as eng:
        with SQLSession(engine=eng, progress=lambda store, rows: streamed.append(rows)) as s:
            s.query("SELECT * FROM big LIMIT 1")  # stopped early: not a snapshot
            streamed.clear()
            assert s.query("SELECT count(*) AS n FROM big")["n"].iloc[0] == 200_000
            assert sum(streamed) == 200_000
        streamed.clear()
        with SQLSession(
            engine=eng, progress=lambda store, rows: streamed.append(rows), cache_bytes=0
        ) as s:
            for _ in range(2):
                s.query("SELECT count(*) AS n FROM big")
            assert sum(streamed) == 2 * 200_000
        with pytest.raises(ValueError, match="cache_bytes"):
            SQLSession(cache_bytes=-1)


# -- bad text -------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "at"), [("SELECT '\ud800' AS x", 9), ("SELECT 1 -- \udcff", 13)])
def test_a_lone_surrogate_in_the_sql_is_one_sqlerror_naming_it(text: str, at: int) -> None:
    # DuckDB's binding refused it with a TypeError listing every extract_statements overload.
    with SQLSession() as session:
        with pytest.raises(SQLError, match=r"lone surrogate") as err:
            session.query(text)
        assert f"at character {at}:" in str(err.value) and "\n" not in str(err.value)
        assert session.query("SELECT 1 AS x")["x"].tolist() == [1]  # still usable


# -- what SQL can touch ---------------------------------------------------------------------
def _setting(session: SQLSession, name: str) -> object:
    return session.query(f"SELECT current_setting('{name}') AS v")["v"].tolist()[0]


def test_by_default_sql_reads_and_writes_local_files_but_never_downloads(tmp_path: Path) -> None:
    (tmp_path / "regions.csv").write_text("customer,region\nc001,eu\nc002,us\n")
    frame = pd.DataFrame({"customer": ["c001", "c002"], "total": [10, 20]})
    with SQLSession() as session:
        # Joining a local CSV is a notebook's daily work: allowed.
        joined = session.query(
            f"SELECT f.customer, r.region FROM frame f JOIN read_csv('{tmp_path}/regions.csv') r "
            "USING (customer) ORDER BY 1",
            namespace={"frame": frame},
        )
        assert joined.values.tolist() == [["c001", "eu"], ["c002", "us"]]
        session.query(f"COPY (SELECT 1 AS x) TO '{tmp_path}/out.csv'")
        assert (tmp_path / "out.csv").read_text().split() == ["x", "1"]
        # No extension is ever fetched or loaded behind the user's back.
        assert _setting(session, "autoinstall_known_extensions") is False
        assert _setting(session, "autoload_known_extensions") is False
        with pytest.raises(SQLError) as err:
            session.query("SELECT * FROM read_csv('https://example.invalid/a.csv')")
        assert "httpfs" in str(err.value) and "download" not in str(err.value).lower()


def test_access_none_keeps_sql_to_iqkit_tables(engine, tmp_path: Path) -> None:
    (tmp_path / "regions.csv").write_text("customer,region\nc001,eu\n")
    frame = pd.DataFrame({"customer": ["c001"], "n": [1]})
    with SQLSession(engine=engine, access="none") as session:
        # stores, registered results and notebook DataFrames still work
        session.register("named", pa.table({"x": [1, 2]}))
        assert session.query('SELECT count(*) AS n FROM "orders-totals"')["n"].tolist() == [60]
        assert session.query("SELECT sum(x) AS s FROM named")["s"].tolist() == [3]
        assert session.query("SELECT n FROM f", namespace={"f": frame})["n"].tolist() == [1]
        for statement in (
            f"SELECT * FROM read_csv('{tmp_path}/regions.csv')",
            "SELECT * FROM read_text('/etc/passwd')",
            f"COPY (SELECT 1) TO '{tmp_path}/out.csv'",
            f"ATTACH '{tmp_path}/x.duckdb'",
            "INSTALL httpfs",
            "SET enable_external_access = true",
            "SET lock_configuration = false",
        ):
            with pytest.raises(SQLError, match=r"Permission Error|configuration has been locked"):
                session.query(statement)
        assert not (tmp_path / "out.csv").exists() and not (tmp_path / "x.duckdb").exists()


def test_access_none_with_directories_reaches_only_those(tmp_path: Path) -> None:
    allowed, other = tmp_path / "allowed", tmp_path / "other"
    for folder in (allowed, other):
        folder.mkdir()
        (folder / "a.csv").write_text("x\n1\n")
    with SQLSession(access="none", directories=[allowed]) as session:
        assert session.query(f"SELECT x FROM read_csv('{allowed}/a.csv')")["x"].tolist() == [1]
        session.query(f"COPY (SELECT 2 AS x) TO '{allowed}/b.csv'")
        with pytest.raises(SQLError, match="Permission Error"):
            session.query(f"SELECT x FROM read_csv('{other}/a.csv')")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"access": "some"}, "access must be one of files, none"),
        ({"directories": ["/tmp"]}, "directories only apply with access='none'"),
    ],
)
def test_access_settings_are_checked(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SQLSession(**settings)
