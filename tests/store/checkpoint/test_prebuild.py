"""The helper process that builds a checkpoint version's next partition into the cache
while a reader builds one (store/checkpoint/prebuild.py): the database it builds is the
one the reader builds, byte for byte; a partition it could not build (a damaged file) is
the reader's to fail, naming the file; and a reader gives the same rows with it or
without it (it runs only with ``IQKIT_PREBUILD=1``).

The helper is asked directly and waited for through the cache (a database appears there
once built), so nothing here depends on how fast it runs."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from jobs import run_stream

import iqkit
from iqkit import RangeQuery, StateQueryRequest
from iqkit.store.cache import FileCache
from iqkit.store.checkpoint import prebuild
from iqkit.store.checkpoint.layout import operator_stores
from iqkit.store.checkpoint.materialize import state_folder_in_cache
from iqkit.store.checkpoint.providers import StateReader
from iqkit.store.checkpoint.shape import StateShape
from iqkit.store.checkpoint.snapshot import committed_versions, version_record
from iqkit.store.objects import open_objects
from iqkit.store.partitions import rocks
from iqkit.store.partitions.partition import encode_commit_record

PARTITIONS = 3
BATCHES = [
    [{"user": f"u{i}", "amount": i, "ts": "2026-01-01T00:00:01"} for i in range(40)],
    [{"user": f"u{i}", "amount": 1, "ts": "2026-01-01T00:00:02"} for i in range(0, 40, 3)],
]


@pytest.fixture(scope="module")
def checkpoint(spark, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("prebuild") / "ckpt"
    return run_stream(spark, "agg", folder, BATCHES, partitions=PARTITIONS)


def database(checkpoint: Path, cache: Path, p: int) -> Path:
    """Where partition ``p`` of the newest version lives in ``cache``."""
    objects = open_objects(checkpoint)
    (store,) = operator_stores(objects)
    version = committed_versions(objects)[-1]
    reader = StateReader(objects)
    files = reader.version_files(store, p, version)
    shape = StateShape(*reader.schemas(store))
    return state_folder_in_cache(
        FileCache(cache), objects, store.name, p, version, files.names, shape
    )


def ask_helper(checkpoint: Path, cache: Path, p: int) -> None:
    """Ask the helper to build partition ``p`` of the newest version into ``cache``, with
    the commit record a reader writes there."""
    objects = open_objects(checkpoint)
    version = committed_versions(objects)[-1]
    record = version_record(objects, version, PARTITIONS)
    commit = encode_commit_record({"position": record.position, "version": version})
    ahead = prebuild.ask(objects, "aggregate", FileCache(cache), version, p, commit)
    assert ahead is not None


def wait_for(folder: Path) -> None:
    """Until the database ``folder`` is in the cache (the helper built it)."""
    deadline = time.monotonic() + 300
    while not folder.is_dir():
        assert time.monotonic() < deadline, f"the helper built no {folder}"
        time.sleep(0.05)


def rows_of(folder: Path) -> list[tuple[bytes, bytes]]:
    db = rocks.open_for_read(folder)
    try:
        return list(rocks.scan(db, b"", None))
    finally:
        rocks.close_quietly(db)


def every_partition(checkpoint: Path) -> dict[int, object]:
    request = StateQueryRequest.in_store("aggregate").with_query(RangeQuery.with_no_bounds())
    with iqkit.open(checkpoint) as engine:
        found = {}
        for p, result in engine.query(request).partition_results.items():
            if result.is_failure:
                found[p] = result.failure_message
            else:
                with result.result as rows:
                    found[p] = [(kv.key, kv.value) for kv in rows]
        return found


def test_what_the_helper_builds_is_what_the_reader_builds(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("IQKIT_PREBUILD", "0")
    monkeypatch.setenv("IQKIT_CACHE", str(tmp_path / "alone"))
    alone = every_partition(checkpoint)
    assert sum(len(rows) for rows in alone.values()) == 40

    monkeypatch.setenv("IQKIT_PREBUILD", "1")
    for p in range(PARTITIONS):
        ask_helper(checkpoint, tmp_path / "helped", p)
    for p in range(PARTITIONS):
        built = database(checkpoint, tmp_path / "helped", p)
        wait_for(built)
        assert rows_of(built) == rows_of(database(checkpoint, tmp_path / "alone", p))

    monkeypatch.setenv("IQKIT_CACHE", str(tmp_path / "helped"))
    assert every_partition(checkpoint) == alone


def test_a_partition_the_helper_could_not_build_fails_the_read_naming_the_file(
    checkpoint, tmp_path, monkeypatch
):
    damaged = tmp_path / "ckpt"
    shutil.copytree(checkpoint, damaged)
    for crc in damaged.rglob(".*.crc"):
        crc.unlink()
    delta = damaged / "state/0/1/2.delta"
    delta.write_bytes(delta.read_bytes()[:-30])
    monkeypatch.setenv("IQKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("IQKIT_PREBUILD", "1")
    ask_helper(damaged, tmp_path / "cache", 1)
    ask_helper(damaged, tmp_path / "cache", 2)  # built after 1: the helper is done with 1
    wait_for(database(damaged, tmp_path / "cache", 2))
    assert not database(damaged, tmp_path / "cache", 1).exists()

    found = every_partition(damaged)
    assert "state/0/1/2.delta" in found[1]
    assert isinstance(found[0], list) and isinstance(found[2], list)


def test_no_helper_serves_a_root_that_is_not_a_local_folder(monkeypatch):
    monkeypatch.setenv("IQKIT_PREBUILD", "1")
    objects = open_objects("s3://bucket/ckpt", storage_options={"anon": True})
    assert prebuild.ask(objects, "aggregate", FileCache(), 1, 0, b"") is None
    monkeypatch.delenv("IQKIT_PREBUILD")  # off unless asked for
    local = open_objects(".")
    assert prebuild.ask(local, "aggregate", FileCache(), 1, 0, b"") is None
