"""SQL over a store's versions: ``changes(store, from[, to])`` and ``history(store, key)``
read as tables, on real stores committed several times (puts, deletes, re-inserts, a
value written again), checked row by row against what the commits say
(``version_model``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from version_model import Commits

import iqkit
from iqkit.sqlsession import SQLError, SQLSession, sql
from iqkit.store.chain.retention import collect_chain_garbage
from iqkit.store.objects import open_objects

#: The commits behind 'totals' (None deletes): alice deleted then re-inserted, bob
#: deleted then re-inserted, carol written again unchanged, erin inserted then deleted.
COMMITS = [
    {"alice": {"total": 10, "region": "eu"}, "bob": {"total": 5, "region": "us"},
     "carol": {"total": 7, "region": "eu"}},
    {"alice": {"total": 12, "region": "eu"}, "bob": None, "dave": {"total": 1, "region": "us"}},
    {"bob": {"total": 6, "region": "us"}, "carol": {"total": 7, "region": "eu"},
     "erin": {"total": 3, "region": "eu"}},
    {"alice": None, "dave": {"total": 2, "region": "us"}},
    {"alice": {"total": 20, "region": "eu"}, "erin": None},
]  # fmt: skip

CHANGE_COLUMNS = "partition, version, kind, key, total, region, old_total, old_region"


@pytest.fixture
def totals(root: Path) -> Commits:
    iqkit.create_store(root, "totals", partitions=3)
    commits = Commits(root, "totals")
    for writes in COMMITS:
        commits.commit(writes)
    return commits


@pytest.fixture
def session(totals: Commits):
    with iqkit.open(totals.root) as engine, SQLSession(engine=engine) as s:
        yield s


def rows(session: SQLSession, query: str, params=None) -> list[tuple]:
    table = session.query_arrow(query, params)
    return [tuple(r.values()) for r in table.to_pylist()]


def expected_changes(commits: Commits, after: int, upto: int | None = None) -> list[tuple]:
    """Rows of CHANGE_COLUMNS, ordered by partition, version, key."""
    with iqkit.open(commits.root) as engine:
        owner = {k: engine.partition_for_key("totals", k) for k in commits.states[commits.latest]}
        owner.update({c.key: engine.partition_for_key("totals", c.key) for c in commits.changes(0)})
    out = [
        (
            owner[c.key], c.version, c.kind, c.key,
            c.value and c.value["total"], c.value and c.value["region"],
            c.old and c.old["total"], c.old and c.old["region"],
        )
        for c in commits.changes(after, upto)
    ]  # fmt: skip
    return sorted(out, key=lambda r: (r[0], r[1], r[3]))


# -- changes ------------------------------------------------------------------------------
@pytest.mark.parametrize("after, upto", [(1, 5), (1, 3), (2, 4), (4, 5), (5, 5)])
def test_changes_between_two_versions_are_what_the_commits_in_between_did(
    totals: Commits, session: SQLSession, after: int, upto: int
) -> None:
    want = expected_changes(totals, after, upto)
    if not want:  # no change: no row (a JSON store's value fields are known from rows only)
        assert (
            session.query_arrow(f"SELECT * FROM changes('totals', {after}, {upto})").num_rows == 0
        )
        return
    got = rows(
        session,
        f"SELECT {CHANGE_COLUMNS} FROM changes('totals', {after}, {upto}) "
        "ORDER BY partition, version, key",
    )
    assert got == want


def test_changes_without_to_reads_up_to_the_latest_version(
    totals: Commits, session: SQLSession
) -> None:
    query = "SELECT {} FROM changes('totals', 2{}) ORDER BY partition, version, key"
    open_ended = rows(session, query.format(CHANGE_COLUMNS, ""))
    assert open_ended == expected_changes(totals, 2)
    assert open_ended == rows(session, query.format(CHANGE_COLUMNS, f", {totals.latest}"))


def test_a_filter_on_kind_keeps_the_deletes_with_the_values_they_removed(
    totals: Commits, session: SQLSession
) -> None:
    got = rows(
        session,
        "SELECT version, key, total, old_total FROM changes('totals', 1, 5) "
        "WHERE kind = 'delete' ORDER BY version, key",
    )
    want = [(c.version, c.key, None, c.old["total"]) for c in totals.changes(1) if c.value is None]
    assert got == want
    assert 0 < len(got) < len(totals.changes(1))  # the filter kept some changes, not all


def test_a_value_written_again_unchanged_is_no_change(totals: Commits, session: SQLSession):
    # carol's value was written again by version 3: that version did not change it.
    got = rows(session, "SELECT version, kind FROM changes('totals', 1) WHERE key = 'carol'")
    assert got == [] and COMMITS[2]["carol"] == COMMITS[0]["carol"]


def test_changes_columns_have_their_types(session: SQLSession) -> None:
    got = rows(
        session,
        "SELECT typeof(partition), typeof(version), typeof(kind), typeof(key), typeof(total), "
        "typeof(old_total) FROM changes('totals', 1) LIMIT 1",
    )
    assert got == [("INTEGER", "BIGINT", "VARCHAR", "VARCHAR", "BIGINT", "BIGINT")]


# -- history ------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["alice", "bob", "carol", "dave", "erin"])
def test_history_of_a_key_is_every_value_it_had_with_the_commit_times(
    totals: Commits, session: SQLSession, key: str
) -> None:
    got = rows(
        session,
        "SELECT partition, key, total, region, epoch_ms(timestamp), epoch_ms(valid_to), "
        "version FROM history('totals', $key) ORDER BY version",
        {"key": key},
    )
    with iqkit.open(totals.root) as engine:
        owner = engine.partition_for_key("totals", key)
    want = [
        (owner, key, value["total"], value["region"], start, end, version)
        for value, start, end, version in totals.history(key)
    ]
    assert got == want and got  # the comparison compared rows


def test_history_of_a_key_never_written_is_no_row(totals: Commits, session: SQLSession) -> None:
    assert all(c.key != "zed" for c in totals.changes(0))
    table = session.query_arrow("SELECT * FROM history('totals', 'zed')")
    assert table.num_rows == 0 and {"key", "timestamp", "valid_to"} <= set(table.column_names)


def test_history_times_are_utc_timestamps(session: SQLSession) -> None:
    got = rows(
        session, "SELECT typeof(timestamp), typeof(valid_to) FROM history('totals', 'bob') LIMIT 1"
    )
    assert got == [("TIMESTAMP WITH TIME ZONE", "TIMESTAMP WITH TIME ZONE")]


def test_history_after_retention_starts_at_the_oldest_retained_version(
    totals: Commits, session: SQLSession
) -> None:
    cleanup = collect_chain_garbage(open_objects(totals.root), "totals", retain=2, grace_seconds=0)
    assert cleanup.removed_versions == [1, 2, 3]
    got = rows(
        session,
        "SELECT total, epoch_ms(timestamp), epoch_ms(valid_to), version "
        "FROM history('totals', 'dave') ORDER BY version",
    )
    want = [(v["total"], start, end, n) for v, start, end, n in totals.history("dave", oldest=4)]
    assert got == want and want[0][3] == 4  # dave's value at version 4 was written by it


# -- calls as tables ----------------------------------------------------------------------
def test_calls_take_parameters_and_join_stores_and_each_other(
    totals: Commits, session: SQLSession
) -> None:
    latest = totals.states[totals.latest]
    got = rows(
        session,
        "SELECT c.key, c.kind, t.total FROM changes('totals', ?) c JOIN totals t USING (key) "
        "ORDER BY c.version, c.key",
        [3],
    )
    want = [(c.key, c.kind, latest[c.key]["total"]) for c in totals.changes(3) if c.key in latest]
    assert got == want and got
    both = rows(
        session,
        "SELECT h.version, c.kind FROM history('totals', 'bob') h "
        "JOIN changes('totals', 1) c ON c.key = 'bob' AND c.version = h.version",
    )
    bob_inserted = [c.version for c in totals.changes(1) if c.key == "bob" and c.kind == "insert"]
    assert both == [(v, "insert") for v in bob_inserted] and both


def test_a_call_feeds_create_table_as(totals: Commits, session: SQLSession) -> None:
    session.query(
        "CREATE TABLE deletes AS SELECT key FROM changes('totals', 1) WHERE kind = 'delete'"
    )
    got = rows(session, "SELECT key FROM deletes ORDER BY key")
    assert got == sorted((c.key,) for c in totals.changes(1) if c.kind == "delete")


def test_stores_named_like_the_functions_are_still_tables(root: Path) -> None:
    for name in ("history", "changes"):
        iqkit.create_store(root, name, partitions=1)
        commits = Commits(root, name)
        commits.commit({"k": {"n": 1}})
        commits.commit({"k": {"n": 2}})
    with iqkit.open(root) as engine, SQLSession(engine=engine) as s:
        assert rows(s, "SELECT key, n FROM history") == [("k", 2)]
        assert rows(s, "SELECT key, n FROM changes") == [("k", 2)]
        got = rows(s, "SELECT n, version FROM history('changes', 'k') ORDER BY version")
        assert got == [(1, 1), (2, 2)]


def test_a_key_value_store_of_numbers(root: Path) -> None:
    iqkit.create_store(root, "counts", partitions=2, key_serde="int32", value_serde="int64")
    commits = Commits(root, "counts")
    commits.commit({k: k * 10 for k in range(6)})
    commits.commit({1: None, 2: 21, 7: 70})
    commits.commit({1: 11, 7: None})
    with iqkit.open(root) as engine, SQLSession(engine=engine) as s:
        got = rows(
            s,
            "SELECT version, kind, key, value, old_value FROM changes('counts', 1) "
            "ORDER BY version, key",
        )
        want = [(c.version, c.kind, c.key, c.value, c.old) for c in commits.changes(1)]
        assert got == want and got
        hist = rows(s, "SELECT value, version FROM history('counts', 1) ORDER BY version")
        assert hist == [(value, v) for value, _, _, v in commits.history(1)]
        types = rows(s, "SELECT typeof(key), typeof(value) FROM history('counts', 1) LIMIT 1")
        assert types == [("INTEGER", "BIGINT")]


def test_a_composite_key_is_given_as_a_list(root: Path) -> None:
    iqkit.create_store(
        root,
        "orders",
        partitions=2,
        key_serde="ordered",
        properties={"key_columns": ["region", "customer"]},
    )
    commits = Commits(root, "orders")
    commits.commit({("us", "bob"): {"n": 1}, ("eu", "al"): {"n": 2}})
    commits.commit({("us", "bob"): {"n": 3}})
    with iqkit.open(root) as engine, SQLSession(engine=engine) as s:
        got = rows(
            s,
            "SELECT region, customer, n, version FROM history('orders', ['us', 'bob']) "
            "ORDER BY version",
        )
        assert got == [("us", "bob", v["n"], n) for v, _, _, n in commits.history(("us", "bob"))]


def test_a_session_without_file_access_reads_them_too(totals: Commits) -> None:
    with iqkit.open(totals.root) as engine, SQLSession(engine=engine, access="none") as s:
        got = rows(s, f"SELECT {CHANGE_COLUMNS} FROM changes('totals', 1) ORDER BY 1, 2, 4")
    assert got == expected_changes(totals, 1)


def test_iqkit_sql_reads_them_from_a_root(totals: Commits) -> None:
    frame = sql("SELECT count(*) AS n FROM changes('totals', 1)", root=totals.root)
    assert int(frame["n"][0]) == len(totals.changes(1))


# -- what is wrong, in one line -----------------------------------------------------------
def error(session: SQLSession, query: str) -> str:
    with pytest.raises(SQLError) as caught:
        session.query(query)
    message = str(caught.value)
    assert "\n" not in message, message
    return message


def test_an_unknown_store_is_named_with_a_did_you_mean(session: SQLSession) -> None:
    message = error(session, "SELECT * FROM changes('totalz', 1)")
    assert message.startswith("changes('totalz', 1): unknown store 'totalz'")
    assert "did you mean 'totals'?" in message


def test_a_version_retention_removed_is_named_with_those_retained(
    totals: Commits, session: SQLSession
) -> None:
    collect_chain_garbage(open_objects(totals.root), "totals", retain=2, grace_seconds=0)
    message = error(session, "SELECT * FROM changes('totals', 1, 5)")
    assert message.startswith("changes('totals', 1, 5): ")
    assert "version 1" in message and "4" in message and "5" in message, message
    assert "partition" not in message  # every partition failed alike: said once


def test_a_version_not_yet_published_is_named(totals: Commits, session: SQLSession) -> None:
    message = error(session, f"SELECT * FROM changes('totals', 2, {totals.latest + 4})")
    assert f"version {totals.latest + 4}" in message


@pytest.mark.parametrize(
    "call, says",
    [
        ("changes('totals', '2')", "from_version must be a version number (int), got '2'"),
        ("changes('totals', 2.5)", "from_version must be a version number (int)"),
        ("changes('totals', 0)", "from_version must be a version number >= 1"),
        ("changes('totals', 4, 2)", "to_version 2 is before from_version 4"),
        ("changes(1, 2)", "the store must be a store's name (text), got 1"),
        ("history('totals', 3)", "key serde 'string' cannot serialize 3"),
        ("history('totals', NULL)", "key must not be None"),
        ("changes('totals')", "changes() takes (store, from_version[, to_version])"),
        ("history('totals')", "history() takes (store, key)"),
    ],
)
def test_bad_arguments_are_one_line_naming_them(session: SQLSession, call: str, says: str):
    message = error(session, f"SELECT * FROM {call}")
    assert says in message, message
    if "takes" not in says:
        assert message.startswith(call + ": "), message


def test_a_window_store_is_refused_in_one_line(root: Path) -> None:
    iqkit.create_store(root, "clicks", partitions=2, kind="window", window_size_ms=60_000)
    with iqkit.StoreWriter(root, "clicks") as w:
        w.put("alice", 1, window_start=0)
    with iqkit.open(root) as engine, SQLSession(engine=engine) as s:
        message = error(s, "SELECT * FROM history('clicks', 'alice')")
    assert message.startswith("history('clicks', 'alice'): ") and "clicks" in message[28:]


def test_without_an_engine_the_calls_say_so() -> None:
    with SQLSession() as s:
        message = error(s, "SELECT * FROM changes('totals', 1)")
    assert message == "changes('totals', 1): no stores (the session has no engine)"


def test_nothing_is_left_registered_after_a_statement(session: SQLSession) -> None:
    session.query("SELECT * FROM changes('totals', 1) JOIN history('totals', 'bob') USING (key)")
    views = session.query("SELECT view_name FROM duckdb_views() WHERE NOT internal")
    assert list(views["view_name"]) == []
