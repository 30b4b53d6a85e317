"""Chain stores under a local root: a store copied down from object storage, object for
object (what ``aws s3 sync`` does), opens, answers and takes commits locally, as stores
made on the local root do."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import kv_rows, tree_digest, write_notebook_stores

import iqkit
from iqkit.store.encoding.keyspace import kv_key
from iqkit.store.format import is_folder_store
from iqkit.store.formats import format_for
from iqkit.store.integrity import seal_json
from iqkit.store.objects import open_objects
from iqkit.store.roots import parse_root


def sync_down(url: str, folder: Path) -> None:
    """Every object under ``url`` copied to the same relative path under ``folder``."""
    objects = open_objects(url)
    for key in objects.list():
        target = folder / key
        target.parent.mkdir(parents=True, exist_ok=True)
        objects.download(key, target)


def everything(root, store: str) -> dict:
    with iqkit.open(root) as engine:
        return {
            "rows": kv_rows(engine, store) if engine.manifest(store).kind == "kv" else None,
            "versions": engine.versions(store),
            "manifest": engine.manifest(store),
        }


@pytest.fixture
def synced(s3_root, tmp_path) -> Path:
    """The notebook stores written to S3 twice over (two versions of ``totals``), then
    copied to a local folder."""
    write_notebook_stores(s3_root)
    iqkit.create_store(s3_root, "fresh", partitions=2)  # a manifest, never written
    with iqkit.StoreWriter(s3_root, "totals") as w:
        w.put("bob", {"customer": "bob", "total": 14, "orders": 3})
    local = tmp_path / "synced"
    sync_down(s3_root, local)
    return local


def test_a_synced_store_is_read_in_its_own_format_with_the_same_answers(synced, s3_root):
    assert not is_folder_store(synced / "totals")
    before = tree_digest(synced)
    for store in ("totals", "counts", "clicks"):
        assert everything(synced, store) == everything(s3_root, store)
    with iqkit.open(synced, as_of={"totals": 1}) as engine:
        r = engine.query(iqkit.StateQueryRequest.in_store("totals").with_query(
            iqkit.KeyQuery.with_key("bob")))  # fmt: skip
        assert r.only_partition_result().result["total"] == 13
    assert tree_digest(synced) == before  # readers never write to the root


def test_commits_to_a_synced_store_stay_in_the_chain_format(synced, s3_root):
    with iqkit.StoreWriter(synced, "totals") as w:
        w.put("zoe", {"customer": "zoe", "total": 1, "orders": 1})
    assert w.version == 3
    assert not (synced / "totals" / "LATEST").exists()  # no folder-format file appears
    assert (synced / "totals" / "chain" / "000000000003.json").is_file()
    fmt = format_for(parse_root(synced))
    assert fmt.store_exists("totals") and fmt.latest_published("totals").version == 3
    # A job commit (what Spark's writers use) publishes the next version the same way.
    with fmt.open_job_commit("totals") as job:
        staged = job.spec.stage(0, [(kv_key(b"yan"), b'{"total": 2}')], attempt="t")
        assert job.publish([staged]) == 4
    with iqkit.open(synced) as engine:
        assert engine.versions("totals")[-2:] == [3, 4]
        got = dict((k, v) for _, k, v in kv_rows(engine, "totals"))
    assert got["zoe"]["total"] == 1 and got["yan"] == {"total": 2}
    assert got["bob"]["total"] == 14


def test_a_synced_store_never_written_is_still_a_chain_store(synced):
    # Its manifest says so: there is nothing else in its folder to tell.
    assert sorted(p.name for p in (synced / "fresh").iterdir()) == ["manifest.json"]
    assert not is_folder_store(synced / "fresh")
    with iqkit.open(synced) as engine:
        assert engine.version("fresh") is None
    with iqkit.StoreWriter(synced, "fresh") as w:
        w.put("a", 1)
    assert (synced / "fresh" / "chain" / "000000000001.json").is_file()
    with iqkit.open(synced) as engine:
        assert [v for _, _, v in kv_rows(engine, "fresh")] == [1]


def test_a_manifest_of_an_unknown_format_is_refused_in_one_line(root):
    iqkit.create_store(root, "s", partitions=1)
    manifest = root / "s" / "manifest.json"
    data = json.loads(manifest.read_text())
    data.pop("checksum")
    data["format_version"] = 3  # as a later iqkit would write it: sealed with its checksum
    manifest.write_text(seal_json(json.dumps(data, indent=2, sort_keys=True)))
    with iqkit.open(root) as engine, pytest.raises(iqkit.IqkitError) as info:
        engine.manifest("s")
    assert "manifest format 3 is not supported (this iqkit reads formats 1 and 2)" in str(
        info.value
    )
    assert "\n" not in str(info.value)


def test_a_local_chain_store_is_read_in_place_never_copied(synced, tmp_path, monkeypatch):
    cache = tmp_path / "fresh-cache"
    monkeypatch.setenv("IQKIT_CACHE", str(cache))
    with iqkit.open(synced) as engine:
        req = (
            iqkit.StateQueryRequest.in_store("totals")
            .with_query(iqkit.KeyQuery.with_key("bob"))
            .enable_execution_info()
        )
        # The first key lookup reads the chain's files themselves; the next builds the
        # partition's database from them, in the cache, reading them in place too.
        first = engine.query(req).only_partition_result()
        assert first.result["total"] == 14
        line = next(x for x in first.execution_info if x.startswith("Handled in FileCache"))
        assert "read in place from the chain's SST files, no database built" in line
        assert not list(cache.rglob("dbs/**/CURRENT"))
        again = (
            iqkit.StateQueryRequest.in_store("totals")
            .with_query(iqkit.KeyQuery.with_key("bob").skip_cache())  # past the read cache
            .enable_execution_info()
        )
        qr = engine.query(again).only_partition_result()
        assert qr.result["total"] == 14
        line = next(x for x in qr.execution_info if x.startswith("Handled in FileCache"))
    assert "local root: 2 files read in place; database built (2 SST files)" in line
    assert not list(cache.rglob("objects/**/*.sst"))  # only the database is in the cache
    assert list(cache.rglob("dbs/**/CURRENT"))


@pytest.mark.parametrize("damage", ["missing", "truncated"])
@pytest.mark.parametrize("suffix", [".sst", ".parquet"])
def test_a_damaged_sst_of_a_local_chain_store_is_that_partitions_failure(root, damage, suffix):
    """A damaged SST fails what reads the database (a key lookup; a scan reads the
    twin); a damaged twin fails a scan. Either way the partition's result names the file
    on the root."""
    iqkit.create_store(root, "c", partitions=2, partitioner="explicit")
    with iqkit.StoreWriter(root, "c") as w:
        w.put("a", 1, partition=0)
        w.put("b", 2, partition=1)
    (damaged,) = (root / "c" / "sst" / "1").glob(f"*{suffix}")
    if damage == "missing":
        damaged.unlink()
    else:
        damaged.write_bytes(b"")
    query = iqkit.KeyQuery.with_key("b") if suffix == ".sst" else iqkit.RangeQuery.with_no_bounds()
    messages = []
    for _ in range(2):  # the same words every time: no temporary names
        with iqkit.open(root) as engine:
            r = engine.query(iqkit.StateQueryRequest.in_store("c").with_query(query))
            assert r.partition_results[0].is_success
            failed = r.partition_results[1]
            assert failed.failure_reason == iqkit.FailureReason.STORE_EXCEPTION
            messages.append(failed.failure_message)
    assert messages[0] == messages[1] and f"c/sst/1/{damaged.name}" in messages[0], messages[0]
    assert ".building-" not in messages[0] and ".ingest-" not in messages[0]


def test_a_long_lived_engine_follows_versions_after_retention_removed_its_next(tmp_path):
    # An engine idle while newer versions came and retention (past its grace) removed
    # them: the record after the one it serves is gone, and so is the one it serves.
    # It must read the latest, not take the missing next record for "nothing newer".
    from iqkit.store.chain.retention import collect_chain_garbage

    root = tmp_path / "stores"
    iqkit.create_store(root, "s", partitions=1, value_serde="int64", retention=2)

    def commit(value: int) -> None:
        with iqkit.StoreWriter(root, "s") as w:
            w.put("k", value)

    def read(engine) -> tuple[int, int]:
        req = iqkit.StateQueryRequest.in_store("s").with_query(iqkit.KeyQuery.with_key("k"))
        return engine.query(req).only_partition_result().result, engine.version("s")

    commit(1)
    with iqkit.open(root) as engine:
        assert read(engine) == (1, 1)
        for value in (2, 3, 4):
            commit(value)
        # What retention does once the grace has passed (the commits' own runs kept
        # every version: they were superseded moments ago).
        cleanup = collect_chain_garbage(open_objects(root), "s", retain=2, grace_seconds=0)
        assert cleanup.removed_versions == [1, 2]
        assert read(engine) == (4, 4)
        commit(5)
        assert read(engine) == (5, 5)


def test_an_sst_damaged_after_a_reader_built_its_database_is_named_on_the_root(root):
    # The cache's database shares the root file's bytes (a hard link): damage to the
    # file shows when the database is opened, and the failure names the root's file in
    # one line, never the cache. Restored, the partition reads again.
    iqkit.create_store(root, "c", partitions=1)
    with iqkit.StoreWriter(root, "c") as w:
        w.put("a", 1)
    (sst,) = (root / "c" / "sst" / "0").glob("*.sst")
    # A key lookup builds and reads the database (a scan would read the twin).
    request = iqkit.StateQueryRequest.in_store("c").with_query(iqkit.KeyQuery.with_key("a"))
    with iqkit.open(root) as engine:
        assert engine.query(request).only_partition_result().is_success  # database built
    data = sst.read_bytes()
    sst.write_bytes(data[: len(data) // 2])
    with iqkit.open(root) as engine:
        failed = engine.query(request).only_partition_result()
    assert failed.failure_reason == iqkit.FailureReason.STORE_EXCEPTION
    message = failed.failure_message
    assert f"c/sst/0/{sst.name}" in message and "\n" not in message, message
    assert "dbs" not in message and "iqkit-views" not in message, message
    sst.write_bytes(data)
    with iqkit.open(root) as engine:
        assert engine.query(request).only_partition_result().result == 1


def test_a_compaction_that_met_a_damaged_sst_works_once_it_is_restored(root):
    # A commit that compacts reads the chain's files in place on a local root: refused
    # (naming the file) while one is damaged, and working as soon as it is restored
    # (no damaged copy kept anywhere).
    iqkit.create_store(root, "c", partitions=1, value_serde="int64")

    def commit(i: int) -> int:
        with iqkit.StoreWriter(root, "c") as w:
            w.put(f"k{i}", i)
        return w.version

    for i in range(1, 10):  # a base and 8 deltas: the next commit compacts
        commit(i)
    sst = sorted((root / "c" / "sst" / "0").glob("*.sst"))[4]
    data = sst.read_bytes()
    sst.write_bytes(data[: len(data) // 2])
    with pytest.raises(iqkit.StoreCorruptedError, match=re.escape(sst.name)):
        commit(10)
    sst.write_bytes(data)
    assert commit(11) == 10 and commit(12) == 11
    with iqkit.open(root) as engine:
        rows = {k: v for _, k, v in kv_rows(engine, "c")}
    assert rows == {f"k{i}": i for i in [*range(1, 10), 11, 12]}
