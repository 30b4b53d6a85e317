"""A checkpoint version's database in the file cache is named after its state files and
after how iqkit shapes their rows: a newer iqkit that shapes them otherwise never serves
(or builds on) a database an older one built."""

from __future__ import annotations

import os
from pathlib import Path

from matrix_oracle import CHECKPOINTS

import iqkit
from iqkit import RangeQuery, StateQueryRequest
from iqkit.store.checkpoint import materialize

CELL = CHECKPOINTS / "4.3.0" / "agg-rocksdb-changelog" / "checkpoint"


def _databases(cache: Path) -> set[str]:
    return {
        str(p.relative_to(cache))
        for p in cache.glob("dbs/*/spark-state/aggregate/*/*")
        if p.is_dir() and not p.name.startswith(".")
    }


def _scan_every_version() -> dict[int, list[tuple[object, object]]]:
    out = {}
    with iqkit.open(CELL) as engine:
        versions = engine.versions("aggregate")
    for version in versions:
        with iqkit.open(CELL, as_of=version) as engine:
            request = StateQueryRequest.in_store("aggregate").with_query(
                RangeQuery.with_no_bounds()
            )
            result = engine.query(request)
            rows = []
            for p, partition in sorted(result.partition_results.items()):
                assert partition.is_success, partition.failure_message
                rows.extend((p, kv.key, kv.value) for kv in partition.result)
            out[version] = rows
    return out


def test_a_database_built_with_another_shaping_is_not_served(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    monkeypatch.setenv("IQKIT_CACHE", os.fspath(cache))
    first = _scan_every_version()
    built = _databases(cache)
    assert built  # one per (partition, version) read
    assert _scan_every_version() == first
    assert _databases(cache) == built  # served from the cache: nothing new built
    # A newer iqkit that stores the rows otherwise: every database is built again, under
    # new names, and none is started from the older databases (their rows are not its).
    monkeypatch.setattr(materialize, "_STORED_LAYOUT", materialize._STORED_LAYOUT + 1)
    assert _scan_every_version() == first
    rebuilt = _databases(cache) - built
    assert len(rebuilt) == len(built)
