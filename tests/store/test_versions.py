"""Versions, retention, readers' leases and concurrent writers (real processes).

Retention by reader leases (flocks on version records) is the folder format's: those
tests are marked ``folder_format``. The chain format protects readers with a grace period
instead (chain_retention.py; its rules are tested in test_chain.py);
``test_chain_retention_keeps_the_newest_versions_once_the_grace_is_over`` is its
user-level counterpart here."""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import time

import pytest
from helpers import request

import iqkit
from iqkit.store.chain import latest_version
from iqkit.store.chain import list_versions as chain_versions
from iqkit.store.chain_retention import DEFAULT_GRACE_SECONDS, collect_chain_garbage
from iqkit.store.layout import StoreLayout
from iqkit.store.locking import CommitLock
from iqkit.store.objects import open_objects
from iqkit.store.roots import parse_root
from iqkit.store.versions import list_versions, live_leased_versions


def get(engine, store, key):
    only = engine.query(request(store, iqkit.KeyQuery.with_key(key))).only_partition_result()
    return None if only is None else only.result


def commit(root, store, **puts):
    with iqkit.StoreWriter(root, store) as w:
        for k, v in puts.items():
            w.put(k, v)
    return w.version


@pytest.mark.folder_format
def test_retention_keeps_the_newest_versions_and_removes_unreferenced_folders(root):
    iqkit.create_store(root, "s", partitions=1, retention=3)
    for i in range(8):
        commit(root, "s", a=i)
    layout = StoreLayout.of(root, "s")
    assert list_versions(layout) == [6, 7, 8]
    assert sorted(int(f) for f in os.listdir(layout.partition_dir(0))) == [6, 7, 8]
    with iqkit.open(root, as_of=6) as engine:
        assert get(engine, "s", "a") == 5
    with pytest.raises(ValueError, match=r"no version 2 \(retained: 6..8\)"):
        iqkit.open(root, as_of=2)


@pytest.mark.folder_format
def test_a_pinned_reader_keeps_its_version_until_it_closes(root):
    iqkit.create_store(root, "s", partitions=1, retention=2)
    commit(root, "s", a="v1")
    reader = iqkit.open(root, as_of=1)
    assert get(reader, "s", "a") == "v1"
    for i in range(2, 7):
        commit(root, "s", a=f"v{i}")
    layout = StoreLayout.of(root, "s")
    assert 1 in live_leased_versions(layout)
    assert (layout.partition_version_dir(0, 1)).exists()
    assert get(reader, "s", "a") == "v1"  # still readable after five newer commits
    reader.close()
    commit(root, "s", a="v7")
    assert not layout.partition_version_dir(0, 1).exists()
    assert list_versions(layout) == [6, 7]


@pytest.mark.folder_format
def test_leases_of_dead_readers_expire(root):
    """A lease is a shared flock on the version's record (readers write nothing), which
    the kernel drops when its holder dies: a dead reader's lease is simply gone, and a
    stale lease file an older iqkit left in ``leases/`` protects nothing. (A reader
    process killed while holding a version: tests/engine/test_engine_footprint.py.)"""
    iqkit.create_store(root, "s", partitions=1, retention=1)
    commit(root, "s", a=1)
    layout = StoreLayout.of(root, "s")
    layout.leases_dir.mkdir(parents=True, exist_ok=True)
    (layout.leases_dir / "12345-deadbeef.1").write_text("")  # nobody holds its lock
    fd = os.open(layout.version_record(1), os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # what a live reader of version 1 holds
    assert live_leased_versions(layout) == {1}
    os.close(fd)  # what the kernel does when that reader dies
    assert live_leased_versions(layout) == set()
    commit(root, "s", a=2)
    assert list_versions(layout) == [2]
    assert not layout.partition_version_dir(0, 1).exists()


def test_chain_retention_keeps_the_newest_versions_once_the_grace_is_over(root, monkeypatch):
    monkeypatch.setenv("IQKIT_LOCAL_FORMAT", "chain")
    iqkit.create_store(root, "s", partitions=1, retention=3)
    for i in range(8):
        commit(root, "s", a=i)
    objects = open_objects(parse_root(root))
    assert chain_versions(objects, "s") == list(range(1, 9))  # all within the grace
    created = latest_version(objects, "s").created_at
    collect_chain_garbage(objects, "s", retain=3, now=created + DEFAULT_GRACE_SECONDS + 1)
    assert chain_versions(objects, "s") == [6, 7, 8]
    with iqkit.open(root, as_of=6) as engine:
        assert get(engine, "s", "a") == 5
    with pytest.raises(ValueError, match=r"no version 2 \(retained: 6..8\)"):
        iqkit.open(root, as_of=2)


def test_a_long_lived_engine_sees_new_commits(root):
    iqkit.create_store(root, "s", partitions=2)
    commit(root, "s", a=1)
    with iqkit.open(root) as engine:
        assert get(engine, "s", "a") == 1
        assert get(engine, "s", "b") is None
        commit(root, "s", a=2, b=3)
        assert engine.version("s") == 2
        assert get(engine, "s", "a") == 2
        assert get(engine, "s", "b") == 3


def test_as_of_dict_pins_named_stores_only(root):
    iqkit.create_store(root, "x", partitions=1)
    iqkit.create_store(root, "y", partitions=1)
    commit(root, "x", k="x1")
    commit(root, "x", k="x2")
    commit(root, "y", k="y1")
    commit(root, "y", k="y2")
    with iqkit.open(root, as_of={"x": 1}) as engine:
        assert get(engine, "x", "k") == "x1"
        assert get(engine, "y", "k") == "y2"
    with iqkit.open(root, as_of=1) as engine:
        assert (get(engine, "x", "k"), get(engine, "y", "k")) == ("x1", "y1")


def test_bad_as_of_values_are_refused(root):
    iqkit.create_store(root, "x", partitions=1)
    commit(root, "x", k=1)
    with pytest.raises(ValueError, match="as_of must be"):
        iqkit.open(root, as_of=0)
    with pytest.raises(iqkit.UnknownStoreError):
        iqkit.open(root, as_of={"nope": 1})


# -- concurrent writers, in separate processes ---------------------------------------------
def _write_many(root: str, prefix: str, count: int, barrier) -> list[int]:
    barrier.wait()
    versions = []
    for i in range(count):
        with iqkit.StoreWriter(root, "s") as w:
            w.put(f"{prefix}{i}", i)
        versions.append(w.version)
    return versions


def test_concurrent_writers_both_land_in_order(root):
    iqkit.create_store(root, "s", partitions=2, retention=100)
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(2)
        with ctx.Pool(2) as pool:
            a = pool.apply_async(_write_many, (str(root), "a", 5, barrier))
            b = pool.apply_async(_write_many, (str(root), "b", 5, barrier))
            va, vb = a.get(timeout=120), b.get(timeout=120)
    assert sorted(va + vb) == list(range(1, 11))  # every commit got its own version
    assert va == sorted(va) and vb == sorted(vb)
    with iqkit.open(root) as engine:
        assert engine.version("s") == 10
        for prefix in "ab":
            assert [get(engine, "s", f"{prefix}{i}") for i in range(5)] == list(range(5))


def _hold_lock(root: str, seconds: float, ready) -> None:
    with CommitLock(StoreLayout.of(root, "s"), who="test-holder", timeout=5):
        ready.set()
        time.sleep(seconds)


def test_a_writer_that_cannot_get_the_lock_names_the_holder(root):
    iqkit.create_store(root, "s", partitions=1)
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(root), 3.0, ready))
    holder.start()
    try:
        assert ready.wait(30)
        with (
            pytest.raises(iqkit.StoreLockedError) as info,
            iqkit.StoreWriter(root, "s", lock_timeout=0.2) as w,
        ):
            w.put("a", 1)
        assert "test-holder" in str(info.value)
        assert f"pid {holder.pid}" in str(info.value)
    finally:
        holder.join(30)
    with iqkit.open(root) as engine:
        assert engine.version("s") is None  # the refused commit published nothing
