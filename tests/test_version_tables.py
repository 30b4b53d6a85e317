"""``iqkit.tables.history_table`` and ``changes_table``: version query results as Arrow
tables in the row schema's layout, on real stores committed several times, checked row
by row against what the commits say (``version_model``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from version_model import Commits

import iqkit
from iqkit import (
    Change,
    ChangesQuery,
    MultiVersionedKeyQuery,
    StateQueryRequest,
    VersionedKeyQuery,
    VersionedRecord,
)
from iqkit.tables import changes_table, history_table

MS_UTC = pa.timestamp("ms", tz="UTC")

#: alice updated, deleted and re-inserted; bob inserted late then deleted; carol written
#: again unchanged.
COMMITS = [
    {"alice": {"total": 1, "region": "eu"}, "carol": {"total": 4, "region": "us"}},
    {"alice": {"total": 2, "region": "eu"}, "bob": {"total": 9, "region": "us"}},
    {"alice": None, "carol": {"total": 4, "region": "us"}},
    {"alice": {"total": 5, "region": "eu"}, "bob": None},
]


@pytest.fixture
def totals(root: Path) -> Commits:
    iqkit.create_store(root, "totals", partitions=3)
    commits = Commits(root, "totals")
    for writes in COMMITS:
        commits.commit(writes)
    return commits


def query(engine: iqkit.StateEngine, store: str, q: Any, partitions=None):
    request = StateQueryRequest.in_store(store).with_query(q)
    if partitions is not None:
        request = request.with_partitions(partitions)
    return engine.query(request)


def table_rows(table: pa.Table, columns: list[str]) -> list[tuple]:
    return list(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def ms(values: list[Any]) -> list[Any]:
    """Timestamps read back from Arrow as epoch ms (None stays None)."""
    return [None if v is None else int(v.timestamp() * 1000 + 0.5) for v in values]


# -- history_table ---------------------------------------------------------------------------
@pytest.mark.parametrize("ascending", [True, False])
@pytest.mark.parametrize("key", ["alice", "bob", "carol"])
def test_history_table_is_every_value_of_the_key_in_the_engines_order(
    totals: Commits, key: str, ascending: bool
) -> None:
    q = MultiVersionedKeyQuery.with_key(key)
    q = q.with_ascending_timestamps() if ascending else q
    with iqkit.open(totals.root) as engine:
        table = history_table(query(engine, "totals", q), engine.manifest("totals"), key=key)
        owner = engine.partition_for_key("totals", key)
    want = totals.history(key)
    want = want if ascending else want[::-1]
    assert table.column_names == [
        "partition", "key", "total", "region", "timestamp", "valid_to", "version"
    ]  # fmt: skip
    got = table_rows(table, ["partition", "key", "total", "region", "version"])
    assert got == [(owner, key, v["total"], v["region"], n) for v, _, _, n in want] and got
    assert ms(table.column("timestamp").to_pylist()) == [start for _, start, _, _ in want]
    assert ms(table.column("valid_to").to_pylist()) == [end for _, _, end, _ in want]
    schema = table.schema
    assert schema.field("timestamp").type == MS_UTC == schema.field("valid_to").type
    assert schema.field("version").type == pa.int64()
    assert schema.field("partition").type == pa.int32()


def test_history_table_of_a_key_at_each_version(totals: Commits) -> None:
    assert any(totals.states[v].get("alice") is None for v in totals.states if v)
    with iqkit.open(totals.root) as engine:
        manifest = engine.manifest("totals")
        for version in range(1, totals.latest + 1):
            q = VersionedKeyQuery.with_key("alice").as_of_version(version)
            table = history_table(query(engine, "totals", q), manifest, key="alice")
            if totals.states[version].get("alice") is None:  # deleted then: no row
                assert table.num_rows == 0, version
                continue
            want = [r for r in totals.history("alice") if r[3] <= version][-1:]
            got = table_rows(table, ["total", "version"])
            assert got == [(v["total"], n) for v, _, _, n in want], version
            assert ms(table.column("timestamp").to_pylist()) == [r[1] for r in want]
            assert ms(table.column("valid_to").to_pylist()) == [r[2] for r in want]


def test_history_table_of_records_given_bare_keeps_their_order(totals: Commits) -> None:
    records = [
        VersionedRecord({"total": 7, "region": "eu"}, 2_000, None, 3),
        VersionedRecord({"total": 6, "region": "eu"}, 1_000, 2_000, 1),
    ]
    with iqkit.open(totals.root) as engine:
        table = history_table(records, engine.manifest("totals"), key="zoe")
        single = history_table(records[0], engine.manifest("totals"), key="zoe")
        none = history_table(None, engine.manifest("totals"), key="zoe")
    got = table_rows(table, ["partition", "key", "total", "version"])
    assert got == [(None, "zoe", r.value["total"], r.version) for r in records]
    assert ms(table.column("valid_to").to_pylist()) == [r.valid_to for r in records]
    assert table_rows(single, ["total", "version"]) == [(7, 3)]
    assert none.num_rows == 0 and none.schema.field("timestamp").type == MS_UTC


def test_value_fields_named_like_the_version_columns_are_renamed(root: Path) -> None:
    iqkit.create_store(root, "s", partitions=1)
    commits = Commits(root, "s")
    commits.commit({"k": {"version": "a", "timestamp": 1, "kind": "x"}})
    commits.commit({"k": {"version": "b", "timestamp": 2, "kind": "y"}})
    with iqkit.open(root) as engine:
        manifest = engine.manifest("s")
        history = history_table(
            query(engine, "s", MultiVersionedKeyQuery.with_key("k").with_ascending_timestamps()),
            manifest,
            key="k",
        )
        changes = changes_table(query(engine, "s", ChangesQuery.between(1)), manifest)
    assert history.column_names == [
        "partition", "key", "value.version", "value.timestamp", "kind", "timestamp", "valid_to",
        "version",
    ]  # fmt: skip
    got = table_rows(history, ["value.version", "value.timestamp", "version"])
    assert got == [(v["version"], v["timestamp"], n) for v, _, _, n in commits.history("k")]
    assert changes.column_names == [
        "partition", "version", "kind", "key", "value.version", "timestamp", "value.kind",
        "old_version", "old_timestamp", "old_kind",
    ]  # fmt: skip
    (c,) = commits.changes(1)
    assert table_rows(changes, ["version", "kind", "value.kind", "old_kind", "old_version"]) == [
        (c.version, c.kind, c.value["kind"], c.old["kind"], c.old["version"])
    ]


# -- changes_table ---------------------------------------------------------------------------
def expected_changes(engine, commits: Commits, after: int, upto: int | None = None) -> list:
    """Rows of partition, version, kind, key, total, region, old_total, old_region in the
    table's order: partitions ascending, then version, then key."""
    out = [
        (
            engine.partition_for_key("totals", c.key), c.version, c.kind, c.key,
            c.value and c.value["total"], c.value and c.value["region"],
            c.old and c.old["total"], c.old and c.old["region"],
        )
        for c in commits.changes(after, upto)
    ]  # fmt: skip
    return sorted(out, key=lambda r: (r[0], r[1], r[3]))


CHANGE_COLUMNS = [
    "partition", "version", "kind", "key", "total", "region", "old_total", "old_region"
]  # fmt: skip


@pytest.mark.parametrize("after, upto", [(1, None), (1, 2), (2, 4), (3, 4)])
def test_changes_table_is_what_the_commits_did_in_partition_version_key_order(
    totals: Commits, after: int, upto: int | None
) -> None:
    with iqkit.open(totals.root) as engine:
        result = query(engine, "totals", ChangesQuery.between(after, upto))
        table = changes_table(result, engine.manifest("totals"))
        want = expected_changes(engine, totals, after, upto)
    assert table.column_names == CHANGE_COLUMNS
    assert table_rows(table, CHANGE_COLUMNS) == want and want
    types = {f.name: f.type for f in table.schema}
    assert types["partition"] == pa.int32() and types["version"] == pa.int64()
    assert types["kind"] == pa.string() and types["total"] == types["old_total"] == pa.int64()


def test_a_side_without_any_value_still_has_the_values_columns(totals: Commits) -> None:
    # Version 3 deleted alice and wrote carol unchanged: deletes only, yet the value's
    # columns are there (null), typed as the old value's.
    assert {c.kind for c in totals.changes(2, 3)} == {"delete"}
    with iqkit.open(totals.root) as engine:
        result = query(engine, "totals", ChangesQuery.between(2, 3))
        table = changes_table(result, engine.manifest("totals"))
        want = expected_changes(engine, totals, 2, 3)
    assert table_rows(table, CHANGE_COLUMNS) == want and want
    assert table.schema.field("total").type == table.schema.field("old_total").type


def test_failed_partitions_are_left_to_the_caller(totals: Commits) -> None:
    with iqkit.open(totals.root) as engine:
        result = query(engine, "totals", ChangesQuery.between(1), partitions=[0, 1, 2, 9])
        assert result.partition_results[9].is_failure
        table = changes_table(result, engine.manifest("totals"))
        want = expected_changes(engine, totals, 1)
    assert table_rows(table, CHANGE_COLUMNS) == want and want


def test_changes_given_bare_have_no_partition(totals: Commits) -> None:
    changes = [
        Change("x", "insert", {"total": 1, "region": "eu"}, None, 2),
        Change("x", "delete", None, {"total": 1, "region": "eu"}, 3),
    ]
    with iqkit.open(totals.root) as engine:
        table = changes_table(changes, engine.manifest("totals"))
        empty = changes_table([], engine.manifest("totals"))
    assert table_rows(table, CHANGE_COLUMNS) == [
        (None, 2, "insert", "x", 1, "eu", None, None),
        (None, 3, "delete", "x", None, None, 1, "eu"),
    ]
    assert empty.num_rows == 0
    assert empty.column_names == ["partition", "version", "kind", "key", "value", "old_value"]


def test_numbers_keep_their_serdes_types(root: Path) -> None:
    iqkit.create_store(root, "counts", partitions=2, key_serde="int32", value_serde="int64")
    commits = Commits(root, "counts")
    commits.commit({k: k * 10 for k in range(5)})
    commits.commit({1: None, 2: 21, 6: 60})
    with iqkit.open(root) as engine:
        manifest = engine.manifest("counts")
        table = changes_table(query(engine, "counts", ChangesQuery.between(1)), manifest)
        owner = {k: engine.partition_for_key("counts", k) for k in range(7)}
    want = sorted(
        ((owner[c.key], c.version, c.kind, c.key, c.value, c.old) for c in commits.changes(1)),
        key=lambda r: (r[0], r[1], r[3]),  # non-negative int32 keys: byte order is numeric
    )
    columns = ["partition", "version", "kind", "key", "value", "old_value"]
    assert table_rows(table, columns) == want and want
    types = [table.schema.field(c).type for c in ("key", "value", "old_value")]
    assert types == [pa.int32(), pa.int64(), pa.int64()]


def test_a_typed_store_has_its_declared_columns_even_without_rows(root: Path) -> None:
    iqkit.create_store(
        root,
        "typed",
        partitions=2,
        properties={"key_columns": ["customer"], "value_schema": "total bigint, note string"},
    )
    commits = Commits(root, "typed")
    commits.commit({"ann": {"total": 3, "note": "a"}})
    commits.commit({"ann": {"total": 4, "note": None}, "bo": {"total": 1, "note": "b"}})
    with iqkit.open(root) as engine:
        manifest = engine.manifest("typed")
        table = changes_table(query(engine, "typed", ChangesQuery.between(1)), manifest)
        empty = changes_table(query(engine, "typed", ChangesQuery.between(2, 2)), manifest)
        history = history_table(
            query(engine, "typed", MultiVersionedKeyQuery.with_key("ann")), manifest, key="ann"
        )
    columns = ["version", "kind", "customer", "total", "note", "old_total", "old_note"]
    want = [
        (c.version, c.kind, c.key, c.value["total"], c.value["note"],
         c.old and c.old["total"], c.old and c.old["note"])
        for c in commits.changes(1)
    ]  # fmt: skip
    assert sorted(table_rows(table, columns)) == sorted(want) and want
    assert empty.num_rows == 0
    declared = {"total": pa.int64(), "note": pa.string()}
    for t in (table, empty):
        for name, arrow_type in declared.items():
            assert t.schema.field(name).type == arrow_type
            assert t.schema.field("old_" + name).type == arrow_type
    assert table_rows(history, ["customer", "total", "version"]) == [
        ("ann", v["total"], n) for v, _, _, n in reversed(commits.history("ann"))
    ]
