"""What notebooks ask the engine besides queries (issue 12, item 5): the rows a store
holds, estimated, and the version a result was read from, through public calls rather
than the engine's private views or the text of its trace."""

from __future__ import annotations

from helpers import request, write_store

import iqkit
from iqkit import RangeQuery
from iqkit.engine import served_version


def test_approximate_rows_counts_the_rows_of_the_version_served(root, open_engine):
    write_store(root, "kv", [(f"k{i}", i) for i in range(7)], key_serde="string")
    write_store(root, "win", [(f"k{i}", i, {"window_start": i}) for i in range(5)],
                kind="window", window_size_ms=5)  # fmt: skip
    iqkit.create_store(root, "empty", partitions=2, key_serde="int64")
    with open_engine(root) as engine:
        # commit records and a window store's time index are iqkit's keys, not rows
        assert engine.approximate_rows("kv") == 7
        assert engine.approximate_rows("win") == 5
        assert engine.approximate_rows("empty") == 0


def test_served_version_names_the_version_a_result_was_read_from(root, open_engine):
    write_store(root, "kv", [("a", 1)], key_serde="string")
    with iqkit.StoreWriter(root, "kv") as w:
        w.put("b", 2)
    scan = request("kv", RangeQuery.with_no_bounds())
    with open_engine(root, as_of=1) as engine:
        assert served_version(engine.query(scan.enable_execution_info())) == 1
    with open_engine(root) as engine:
        assert served_version(engine.query(scan.enable_execution_info())) == 2
        assert served_version(engine.query(scan)) is None  # no trace, nothing to name
