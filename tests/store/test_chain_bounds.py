"""Bounds of the SST-chain format under hostile stores and odd environments: the highest
version number, writers whose clocks are skewed, what retention keeps, what killed
writers leave in their TMPDIR, and chain length. Real RocksDB, real files, a real S3
server (moto on 127.0.0.1) and real killed processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from faults import child_env

from iqkit.errors import ObjectMissingError, VersionConflictError, VersionLimitError
from iqkit.store.cache import FileCache
from iqkit.store.chain import write as chain_write
from iqkit.store.chain.jobs import ChainJobCommit
from iqkit.store.chain.read import open_partition
from iqkit.store.chain.records import (
    MAX_CHAIN_VERSION,
    ChainVersion,
    latest_version,
    list_versions,
    publish_version,
    read_version,
    record_key,
)
from iqkit.store.chain.retention import collect_chain_garbage
from iqkit.store.chain.stores import ensure_chain_store
from iqkit.store.chain.write import (
    COMPACT_AFTER_DELTAS,
    commit_partition,
    commit_version,
    publish_next,
)
from iqkit.store.manifest import StoreManifest
from iqkit.store.names import CHAIN_WORK_PREFIX
from iqkit.store.objects import open_objects

STORE = "totals"


def key(i: int) -> bytes:
    return b"\x01" + i.to_bytes(8, "big")


def read_all(tmp_path: Path, objects, record: ChainVersion, p: int = 0) -> dict[bytes, bytes]:
    """Partition ``p`` of ``record`` read whole from the root, through a fresh cache."""
    cache = FileCache(tmp_path / f"reader-{time.monotonic_ns()}")
    part = open_partition(cache, objects, STORE, p, record.partitions[p])
    try:
        return {k: v for chunk in part.scan_chunks(b"\x01", None) for k, v in chunk}
    finally:
        part.close()


@pytest.fixture
def writer_cache(tmp_path) -> FileCache:
    return FileCache(tmp_path / "writer-cache")


def skewed(monkeypatch, seconds: float) -> None:
    """This process's chain writer's clock is ``seconds`` off (the writer's own clock:
    the one its SST names, commit records and version records are stamped with)."""
    monkeypatch.setattr(chain_write, "writer_clock", lambda: time.time() + seconds)


# -- item 5: the highest version number ------------------------------------------------------
def test_a_store_at_the_highest_version_number_refuses_the_next_commit(objects, writer_cache):
    top = ChainVersion(MAX_CHAIN_VERSION, {}, metadata={"planted": True})
    publish_version(objects, STORE, top)
    before = set(objects.list())
    with pytest.raises(VersionLimitError, match=r"store 'totals' .*999999999999.*highest"):
        commit_version(objects, STORE, top, {0: [(key(1), b"x")]}, cache=writer_cache)
    # Nothing uploaded, no 13-digit record a listing would not see, and every later
    # commit gets the same one-line refusal (never a VersionConflictError).
    assert set(objects.list()) == before
    with pytest.raises(VersionLimitError):
        commit_version(objects, STORE, top, {0: [(key(1), b"x")]}, cache=writer_cache)
    assert list_versions(objects, STORE) == [MAX_CHAIN_VERSION]


def test_a_version_past_the_bound_is_never_published_nor_read(objects):
    with pytest.raises(VersionLimitError):
        publish_version(objects, STORE, ChainVersion(MAX_CHAIN_VERSION + 1, {}))
    assert objects.list() == []
    # A record under a 13-digit name (written by something else) is no version.
    objects.create_exclusive(f"{STORE}/chain/{MAX_CHAIN_VERSION + 1}.json", b"{}")
    assert list_versions(objects, STORE) == []
    with pytest.raises(LookupError, match=r"has no version 1000000000000"):
        read_version(objects, STORE, MAX_CHAIN_VERSION + 1)
    for bad in (0, -1):
        with pytest.raises(LookupError, match=rf"has no version {bad}\b"):
            read_version(objects, STORE, bad)


def new_job_store(root: str):
    """A 2-partition chain store of strings at ``root``, made as a Spark job makes one;
    returns the root's objects."""
    objects = open_objects(root)
    manifest = StoreManifest(
        name=STORE,
        kind="kv",
        partitions=2,
        key_serde="string",
        value_serde="string",
        partitioner="murmur2",
    )
    ensure_chain_store(objects, manifest)
    return objects


def test_a_job_on_a_store_at_the_highest_version_is_refused_before_its_tasks_run(tmp_path):
    root = os.fspath(tmp_path / "root")
    objects = new_job_store(root)
    publish_version(objects, STORE, ChainVersion(MAX_CHAIN_VERSION, {}))
    with pytest.raises(VersionLimitError, match="highest"):
        ChainJobCommit(objects, STORE)


# -- item 6: clock skew ------------------------------------------------------------------------
def test_a_writer_an_hour_behind_loses_nothing_to_another_writers_retention(
    s3_root, tmp_path, monkeypatch
):
    objects = open_objects(s3_root)
    cache = FileCache(tmp_path / "b-cache")
    v1 = commit_version(objects, STORE, None, {0: [(key(1), b"one")]}, cache=cache)
    # Writer B publishes version 2; writer A (clock an hour behind) reads it as the latest
    # and uploads its SST; B's retention then runs; A publishes version 3.
    v2 = commit_version(objects, STORE, v1, {1: [(key(2), b"b")]}, cache=cache)
    with monkeypatch.context() as m:
        skewed(m, -3600)
        a_chain = commit_partition(
            objects,
            STORE,
            0,
            v2.partitions[0],
            [(key(3), b"a")],
            version=3,
            cache=FileCache(tmp_path / "a-cache"),
        )
    collect_chain_garbage(objects, STORE, retain=1)  # B's, with its correct clock
    with monkeypatch.context() as m:
        skewed(m, -3600)
        v3 = publish_next(objects, STORE, v2, 3, {0: a_chain})
    assert read_all(tmp_path, objects, v3) == {key(1): b"one", key(3): b"a"}
    assert read_all(tmp_path, objects, v3, 1) == {key(2): b"b"}


def test_versions_superseded_by_a_skewed_writer_are_kept_by_the_stores_clock(
    objects, tmp_path, monkeypatch
):
    cache = FileCache(tmp_path / "c")
    v1 = commit_version(objects, STORE, None, {0: [(key(1), b"one")]}, cache=cache)
    with monkeypatch.context() as m:  # a writer an hour behind supersedes version 1
        skewed(m, -3600)
        v2 = commit_version(objects, STORE, v1, {0: [(key(1), b"two")]}, cache=cache)
    # Version 1 was superseded a moment ago, whatever the writer's record says.
    cleanup = collect_chain_garbage(objects, STORE, retain=1)
    assert cleanup.removed_versions == [] and list_versions(objects, STORE) == [1, 2]
    assert read_all(tmp_path, objects, v1) == {key(1): b"one"}
    # A writer an hour ahead does not keep versions an hour longer than the grace.
    with monkeypatch.context() as m:
        skewed(m, +3600)
        v3 = commit_version(objects, STORE, v2, {0: [(key(1), b"three")]}, cache=cache)
    later = collect_chain_garbage(objects, STORE, retain=1, now=time.time() + 700)
    assert later.removed_versions == [1, 2] and list_versions(objects, STORE) == [3]
    assert read_all(tmp_path, objects, v3) == {key(1): b"three"}


def test_publishing_refuses_a_version_whose_new_file_is_gone(objects, tmp_path):
    cache = FileCache(tmp_path / "c")
    v1 = commit_version(objects, STORE, None, {0: [(key(1), b"one")]}, cache=cache)
    chain = commit_partition(
        objects, STORE, 0, v1.partitions[0], [(key(2), b"two")], version=2, cache=cache
    )
    gone = chain.files[-1].name
    objects.delete(gone)  # as another writer's retention would
    with pytest.raises(ObjectMissingError, match=r"version 2 .*not published.*" + gone):
        publish_next(objects, STORE, v1, 2, {0: chain})
    assert list_versions(objects, STORE) == [1]
    assert read_all(tmp_path, objects, latest_version(objects, STORE)) == {key(1): b"one"}


# -- item 7: what retention keeps, what killed writers leave -----------------------------------
def test_retention_keeps_only_versions_superseded_within_the_grace_by_the_stores_clock(
    objects, tmp_path
):
    cache = FileCache(tmp_path / "c")
    record = commit_version(objects, STORE, None, {0: [(key(1), b"v1")]}, cache=cache)
    for v in range(2, 6):
        record = commit_version(objects, STORE, record, {0: [(key(1), b"v%d" % v)]}, cache=cache)
    # Superseded moments ago: a reader may have pinned any of them.
    assert collect_chain_garbage(objects, STORE, retain=2).removed_versions == []
    # Once the grace is over, only the newest `retain` are left, with their files only.
    later = collect_chain_garbage(objects, STORE, retain=2, now=time.time() + 601)
    assert later.removed_versions == [1, 2, 3] and list_versions(objects, STORE) == [4, 5]
    listed = read_version(objects, STORE, 4).files() | read_version(objects, STORE, 5).files()
    assert set(objects.list(f"{STORE}/sst")) == listed


KILLED_WRITER = r"""
import os, signal, sys
from iqkit.store.chain import write as chain_write
from iqkit.store.partitions import rocks
from iqkit.store.cache import FileCache
from iqkit.store.objects import open_objects

root, work, how = sys.argv[1:4]
real = rocks.write_changes_sst

def write_then_stop(path, changes):
    real(path, changes)
    if how == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    print("writing", flush=True)
    sys.stdin.readline()  # alive, inside its working folder, until told to go on

rocks.write_changes_sst = write_then_stop
chain_write.commit_version(
    open_objects(root), "totals", None, {0: [(b"\x01k", b"v")]},
    cache=FileCache(os.path.join(work, "cache")), work=work,
)
"""


def test_writers_making_working_folders_at_once_never_take_each_others(tmp_path):
    """Each writer's sweep for dead writers' folders runs while other writers (threads
    here, as racing StoreWriters in one process) are making theirs: a folder not yet
    locked looks dead to a sweep, which may remove it; its maker makes another instead
    of failing (before: FileNotFoundError out of the commit), and no live (locked)
    folder is ever removed under its writer."""
    errors: list[str] = []

    def writer() -> None:
        for _ in range(100):
            try:
                with chain_write.work_folder(tmp_path) as folder:
                    (folder / "sst").write_bytes(b"x")
                    assert (folder / "sst").read_bytes() == b"x"
            except Exception as exc:  # each failure, whatever it is, is reported below
                errors.append(repr(exc))

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [n for n in os.listdir(tmp_path) if n.startswith(CHAIN_WORK_PREFIX)] == []


def test_the_next_writer_removes_a_killed_writers_working_folder_only(tmp_path):
    root, work = tmp_path / "root", tmp_path / "work"
    work.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, root, work, "die"],
        env=child_env(),
        capture_output=True,
        timeout=120,
    )
    assert dead.returncode == -signal.SIGKILL, dead.stderr.decode()[-2000:]
    left = [p.name for p in work.glob(f"{CHAIN_WORK_PREFIX}*")]
    assert len(left) == 1 and (work / left[0] / "delta.sst").exists()

    live = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, root, work, "live"],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert live.stdout is not None and live.stdout.readline().strip() == b"writing"
        living = {p.name for p in work.glob(f"{CHAIN_WORK_PREFIX}*")} - set(left)
        assert len(living) == 1
        commit_version(  # the next writer (of another store: the live one has "totals")
            open_objects(root),
            "other",
            None,
            {1: [(key(1), b"next")]},
            cache=FileCache(tmp_path / "c"),
            work=work,
        )
        # The dead writer's folder is gone; the live writer's is still there.
        assert {p.name for p in work.glob(f"{CHAIN_WORK_PREFIX}*")} == living
    finally:
        _, err = live.communicate(b"go on\n", timeout=120)
    assert live.returncode == 0, err.decode()[-2000:]
    assert list(work.glob(f"{CHAIN_WORK_PREFIX}*")) == []


# -- item 17: chain length ---------------------------------------------------------------------
def test_a_long_chain_is_compacted_by_the_next_commit_even_when_it_does_not_touch_it(
    objects, tmp_path
):
    cache = FileCache(tmp_path / "c")
    # A chain far over the bound, as a writer that never compacted left it.
    record = commit_version(objects, STORE, None, {1: [(key(0), b"p1")]}, cache=cache)
    for i in range(1, 3 * COMPACT_AFTER_DELTAS):
        record = commit_version(
            objects, STORE, record, {0: [(key(i), b"%d" % i)]}, cache=cache, compact_after=10**6
        )
    assert len(record.partitions[0].files) == 3 * COMPACT_AFTER_DELTAS - 1
    expected = read_all(tmp_path, objects, record)
    after = commit_version(objects, STORE, record, {1: [(key(1), b"p1b")]}, cache=cache)
    assert len(after.partitions[0].files) == 1
    assert read_all(tmp_path, objects, after) == expected
    assert read_all(tmp_path, objects, after, 1) == {key(0): b"p1", key(1): b"p1b"}
    assert (
        after.partitions[0].commit_record()["position"]
        == (record.partitions[0].commit_record()["position"])
    )


def test_failed_compactions_never_publish_a_chain_over_the_bound(objects, tmp_path, monkeypatch):
    cache = FileCache(tmp_path / "c")
    record = commit_version(objects, STORE, None, {0: [(key(0), b"0")]}, cache=cache)
    for i in range(1, COMPACT_AFTER_DELTAS + 1):
        record = commit_version(objects, STORE, record, {0: [(key(i), b"%d" % i)]}, cache=cache)
    assert len(record.partitions[0].files) == COMPACT_AFTER_DELTAS + 1

    def failing(*args, **kwargs):
        raise OSError("injected: compaction failed")

    with monkeypatch.context() as m:
        m.setattr(chain_write, "compact_files", failing)
        for i in range(3):
            with pytest.raises(OSError, match="injected"):
                commit_version(objects, STORE, record, {0: [(key(100 + i), b"x")]}, cache=cache)
    for v in list_versions(objects, STORE):
        assert len(read_version(objects, STORE, v).partitions[0].files) <= (
            1 + COMPACT_AFTER_DELTAS
        )
    after = commit_version(objects, STORE, record, {0: [(key(200), b"y")]}, cache=cache)
    assert len(after.partitions[0].files) == 1
    assert read_all(tmp_path, objects, after) == {
        **{key(i): b"%d" % i for i in range(COMPACT_AFTER_DELTAS + 1)},
        key(200): b"y",
    }


def test_a_commit_conflict_is_still_a_version_conflict(objects, tmp_path):
    # The bound does not change what racing writers get.
    cache = FileCache(tmp_path / "c")
    v1 = commit_version(objects, STORE, None, {0: [(key(1), b"a")]}, cache=cache)
    commit_version(objects, STORE, v1, {0: [(key(1), b"b")]}, cache=cache)
    with pytest.raises(VersionConflictError):
        commit_version(objects, STORE, v1, {0: [(key(1), b"c")]}, cache=cache)
    assert record_key(STORE, 2).endswith("chain/000000000002.json")


def test_a_job_publish_compacts_a_long_chain_it_does_not_touch(tmp_path):
    root = os.fspath(tmp_path / "root")
    objects = new_job_store(root)
    cache = FileCache(tmp_path / "c")
    record = commit_version(objects, STORE, None, {1: [(key(0), b"p1")]}, cache=cache)
    for i in range(1, 2 * COMPACT_AFTER_DELTAS):
        record = commit_version(
            objects, STORE, record, {0: [(key(i), b"%d" % i)]}, cache=cache, compact_after=10**6
        )
    expected = read_all(tmp_path, objects, record)
    with ChainJobCommit(objects, STORE) as job:
        staged = job.spec.stage(1, [(key(5), b"job")], attempt="t1")
        version = job.publish([staged])
    after = read_version(objects, STORE, version)
    assert len(after.partitions[0].files) == 1
    assert read_all(tmp_path, objects, after) == expected
    assert read_all(tmp_path, objects, after, 1) == {key(0): b"p1", key(5): b"job"}
