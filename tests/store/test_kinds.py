"""StoreKind: the one home of what each store kind is (issue 12, item 3), against real
stores on disk and the real %iq parser."""

from __future__ import annotations

import json

import pytest
from helpers import request

import iqkit
from iqkit.jupyter.command import QUERY_ACTIONS
from iqkit.jupyter.parse import parse_line
from iqkit.store.formats import format_for
from iqkit.store.kinds import QUERY_COMMANDS, StoreKind
from iqkit.store.roots import parse_root


@pytest.mark.parametrize(
    ("name", "kind"), [("kv", StoreKind.KEY_VALUE), ("window", StoreKind.WINDOW)]
)
def test_the_manifest_keeps_the_kind_name_on_disk_and_equal_to_the_string(root, name, kind):
    size = 1_000 if kind.windowed else None
    iqkit.create_store(root, "s", partitions=1, kind=name, window_size_ms=size)
    assert json.loads((root / "s" / "manifest.json").read_text())["kind"] == name
    manifest = format_for(parse_root(root)).read_manifest("s")
    assert manifest.kind is kind
    assert manifest.kind == name and f"{manifest.kind}" == name
    # Asking again with the enum is the same settings, not a conflict.
    assert iqkit.create_store(root, "s", partitions=1, kind=kind, window_size_ms=size) == manifest


def test_an_unknown_kind_is_one_value_error_naming_the_known_ones(root):
    with pytest.raises(ValueError, match=r"store 's': kind must be one of \('kv', 'window'\)"):
        iqkit.create_store(root, "s", partitions=1, kind="table")


@pytest.mark.parametrize("kind", list(StoreKind))
def test_the_engine_runs_exactly_the_query_types_of_the_kind(root, kind):
    iqkit.create_store(
        root, "s", partitions=1, kind=kind, window_size_ms=1_000 if kind.windowed else None
    )
    queries = [
        iqkit.KeyQuery.with_key("a"),
        iqkit.RangeQuery.with_no_bounds(),
        iqkit.WindowRangeQuery.with_window_start_range(0, 1),
        kind.scan_query(),
    ]
    with iqkit.open(root) as engine:
        for query in queries:
            result = engine.query(request("s", query)).partition_results[0]
            assert result.is_success == isinstance(query, kind.query_types), query


def test_every_query_command_belongs_to_a_kind_and_parses():
    assert QUERY_ACTIONS == QUERY_COMMANDS
    assert {c for k in StoreKind for c in k.commands} == set(QUERY_COMMANDS)
    lines = {
        "get": "get s a",
        "range": "range s",
        "prefix": "prefix s a",
        "window": "window s a --from 0 --to 1",
        "windows": "windows s --from 0 --to 1",
        "scan": "scan s",
        "history": "history s a",
        "changes": "changes s --from 1",
    }
    assert set(lines) == set(QUERY_COMMANDS)
    for command in QUERY_COMMANDS:
        assert parse_line(lines[command]).action == command


def test_records_count_a_window_once_though_it_is_two_keys(root):
    iqkit.create_store(
        root, "w", partitions=1, kind="window", window_size_ms=1_000, value_serde="int64"
    )
    with iqkit.StoreWriter(root, "w") as w:
        for start in (0, 1_000, 2_000):
            w.put("a", 1, window_start=start)
    with iqkit.open(root) as engine:
        assert engine.approximate_rows("w") == 3
    assert StoreKind.WINDOW.records_in(6) == 3 and StoreKind.KEY_VALUE.records_in(6) == 6
