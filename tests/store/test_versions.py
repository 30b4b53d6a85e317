"""Versions, retention and concurrent writers (real processes).

Readers are protected by retention's grace period (store/chain/retention.py; its rules are
tested in test_chain.py); ``test_chain_retention_keeps_the_newest_versions_once_the_grace_
is_over`` is its user-level counterpart here."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest
from helpers import request

import iqkit
from iqkit.store.chain.records import latest_version
from iqkit.store.chain.records import list_versions as chain_versions
from iqkit.store.chain.retention import DEFAULT_GRACE_SECONDS, collect_chain_garbage
from iqkit.store.locking import CommitLock
from iqkit.store.names import LOCK_FILE
from iqkit.store.objects import open_objects
from iqkit.store.roots import parse_root


def get(engine, store, key):
    only = engine.query(request(store, iqkit.KeyQuery.with_key(key))).only_partition_result()
    return None if only is None else only.result


def commit(root, store, **puts):
    with iqkit.StoreWriter(root, store) as w:
        for k, v in puts.items():
            w.put(k, v)
    return w.version


def test_chain_retention_keeps_the_newest_versions_once_the_grace_is_over(root, monkeypatch):
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
    with CommitLock(os.path.join(root, "s", LOCK_FILE), "s", who="test-holder", timeout=5):
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
