"""``store.snapshot``: one store as a reader sees it (served version, leases, open
partitions), driven directly, without the engine (issue 12, item 6).

The engine's own tests cover the same rules end to end (test_engine_footprint.py,
test_versions.py); these pin the interface the engine relies on: a partition a newer
version still names stays open (its read cache with it) and moves to the newer lease,
the others close and release theirs, the cache's cap closes the least recently used,
and a partition no commit touched is one shared empty partition holding no lease.
StoreSnapshot serves folder-format stores (chain stores have chain_snapshot.py, tested in
test_chain.py), so every test here makes its stores in the folder format.
"""

from __future__ import annotations

import pytest

import iqkit
from iqkit.store.layout import StoreLayout
from iqkit.store.snapshot import PartitionCache, StoreSnapshot
from iqkit.store.versions import list_versions, live_leased_versions

pytestmark = pytest.mark.folder_format


def commit(root, store: str, **puts_by_partition: int) -> int:
    """One commit putting ``{key: partition}`` (an explicit store: key ``kN`` → N)."""
    with iqkit.StoreWriter(root, store) as w:
        for key, p in puts_by_partition.items():
            w.put(key, p, partition=p)
    return w.version


@pytest.fixture
def store(root) -> StoreLayout:
    iqkit.create_store(root, "s", partitions=3, partitioner="explicit", retention=1)
    commit(root, "s", a=0, b=1)  # version 1: partitions 0 and 1; 2 is never written
    return StoreLayout.of(root, "s")


@pytest.fixture
def cache():
    partitions = PartitionCache()
    yield partitions
    partitions.close()


def test_a_partition_the_next_version_still_names_stays_open_under_its_lease(store, cache):
    snapshot = StoreSnapshot(store, None, cache)
    v1 = snapshot.current()
    kept, replaced = snapshot.partition(v1, 0), snapshot.partition(v1, 1)
    assert live_leased_versions(store) == {1}

    commit(store.root, "s", b=1)  # version 2 rewrites partition 1 only
    v2 = snapshot.current()
    assert v2.version == 2
    assert snapshot.partition(v2, 0) is kept  # same folder: same open partition
    assert kept.lease_version == 2
    assert replaced.partition.open_iterators == 0
    assert "closed" in repr(replaced.partition)
    assert live_leased_versions(store) == {2}  # nothing holds version 1 any more

    commit(store.root, "s", a=0)  # retention 1: version 1 goes, 2 is leased and stays
    assert list_versions(store) == [2, 3]
    snapshot.close()
    cache.close()
    assert live_leased_versions(store) == set()


def test_a_pinned_snapshot_serves_its_version_and_names_what_is_retained(store, cache):
    commit(store.root, "s", a=0)
    pinned = StoreSnapshot(store, 2, cache)
    commit(store.root, "s", a=0)
    assert pinned.current().version == 2
    assert pinned.latest_number() == 3
    assert pinned.versions() == [2, 3]  # retention 1, but 2 is leased
    with pytest.raises(ValueError, match=r"has no version 1 \(retained: 2\.\.3\)"):
        StoreSnapshot(store, 1, cache)
    pinned.close()


def test_the_cap_closes_the_least_recently_used_partition(store):
    cache = PartitionCache(capacity=1)
    snapshot = StoreSnapshot(store, None, cache)
    v1 = snapshot.current()
    first = snapshot.partition(v1, 0)
    second = snapshot.partition(v1, 1)
    assert "closed" in repr(first.partition)
    assert "open" in repr(second.partition)
    assert snapshot.partition(v1, 0) is not first  # opened again on demand
    cache.close()
    snapshot.close()


def test_a_partition_never_written_is_one_shared_empty_partition(root, cache):
    iqkit.create_store(root, "e", partitions=2)
    layout = StoreLayout.of(root, "e")
    snapshot = StoreSnapshot(layout, None, cache)
    assert snapshot.current() is None
    empty = snapshot.partition(None, 0)
    assert empty is snapshot.partition(None, 1)
    assert empty.never_written and empty.position.is_empty and empty.lease_version == 0
    assert snapshot.served() is None
    snapshot.close()


def test_a_damaged_store_is_served_as_its_error(store, cache):
    snapshot = StoreSnapshot(store, None, cache)
    store.latest.write_text("garbage\n")
    served = snapshot.served()
    assert isinstance(served, iqkit.IqkitError) and "LATEST" in str(served)
    snapshot.close()
