"""Job commits through the root's format (``StoreFormat.open_job_commit``): partitions
staged by task attempts, published once by the driver. A speculative attempt's upload
and a dead job's are orphans that retention removes after its grace period
(test_chain_jobs.py)."""

from __future__ import annotations

import pytest
from helpers import request

import iqkit
from iqkit.errors import StoreConflictError
from iqkit.store.encoding.keyspace import kv_key
from iqkit.store.encoding.partitioners import murmur2_partition
from iqkit.store.encoding.serdes import get_serde
from iqkit.store.formats import format_for
from iqkit.store.names import CHAIN_SST_DIR
from iqkit.store.roots import parse_root

STRING, INT64 = get_serde("string"), get_serde("int64")


def open_job_commit(root, store, **options):
    return format_for(parse_root(root)).open_job_commit(store, **options)


def latest_published(root, store):
    return format_for(parse_root(root)).latest_published(store)


def store_exists(root, store):
    return format_for(parse_root(root)).store_exists(store)


def rows_for(partition, items, n=4):
    """(RocksDB key, value) rows of the items that murmur2 routes to ``partition``."""
    out = [
        (kv_key(STRING.serialize(k)), None if v is None else INT64.serialize(v))
        for k, v in items
        if murmur2_partition(STRING.serialize(k), n) == partition
    ]
    return sorted(out)


ITEMS = [(f"user-{i}", i) for i in range(40)]


def get(engine, key):
    only = engine.query(request("s", iqkit.KeyQuery.with_key(key))).only_partition_result()
    return None if only is None else only.result


def job_leftovers(root):
    """What job commits left in store ``s``: its SSTs (``sst/<p>/*``; a store with no
    published version lists none, so every one there is left over)."""
    ssts = (root / "s" / CHAIN_SST_DIR).glob("*/*")
    return sorted(str(p.relative_to(root)) for p in ssts)


@pytest.fixture
def store(root):
    iqkit.create_store(root, "s", partitions=4, value_serde="int64")
    return root


def test_staged_partitions_publish_as_one_version(store):
    with open_job_commit(store, "s") as job:
        staged = [
            job.spec.stage(
                p,
                rows_for(p, ITEMS),
                attempt=f"a{p}",
                position=iqkit.Position.from_map({"in": {0: 39}}),
            )
            for p in range(4)
        ]
        version = job.publish(staged, metadata={"spark_batch_id": 0})
    assert version == 1
    with iqkit.open(store) as engine:
        assert [get(engine, k) for k, _ in ITEMS] == [v for _, v in ITEMS]
        r = engine.query(request("s", iqkit.RawScanQuery.scan()))
        assert {p: q.position.to_map() for p, q in r.partition_results.items()} == {
            p: {"in": {0: 39}} for p in range(4)
        }


def test_upsert_builds_on_the_base_and_overwrite_replaces(store):
    with iqkit.StoreWriter(store, "s") as w:
        for k, v in ITEMS:
            w.put(k, v)
    changed = [("user-1", 100), ("user-2", None)]
    owner = murmur2_partition(b"user-1", 4)
    with open_job_commit(store, "s", mode="upsert") as job:
        job.publish([job.spec.stage(owner, rows_for(owner, changed), attempt="x")])
    with iqkit.open(store) as engine:
        assert get(engine, "user-1") == 100
        assert get(engine, "user-3") == 3  # everything else kept
    with open_job_commit(store, "s", mode="overwrite") as job:
        job.publish(
            [
                job.spec.stage(
                    0,
                    rows_for(0, [(k, -v) for k, v in ITEMS]),
                    attempt="y",
                )
            ]
        )
    with iqkit.open(store) as engine:
        r = engine.query(request("s", iqkit.RangeQuery.with_no_bounds()))
        assert r.partition_results[0].is_success
        for p in (1, 2, 3):  # not rebuilt by the overwrite: empty (issue 10: was NOT_PRESENT)
            with r.partition_results[p].result as it:
                assert list(it) == []
        with r.partition_results[0].result as it:
            assert all(kv.value <= 0 for kv in it)


def test_a_commit_during_the_job_is_a_conflict_and_nothing_is_published(store):
    job = open_job_commit(store, "s")
    staged = job.spec.stage(0, rows_for(0, ITEMS), attempt="0")
    with iqkit.StoreWriter(store, "s") as w:
        w.put("other", 1)
    with pytest.raises(
        StoreConflictError, match=r"changed while the job ran \(version None -> 1\)"
    ):
        job.publish([staged])
    with iqkit.open(store) as engine:
        assert engine.version("s") == 1


def test_an_aborted_job_leaves_nothing(store):
    with pytest.raises(RuntimeError, match="task failed"), open_job_commit(store, "s") as job:
        staged = job.spec.stage(1, rows_for(1, ITEMS), attempt="0")
        # what a task sends back, the driver takes charge of (as the Spark driver does);
        # a chain SST no driver was handed is an orphan for retention (test_chain_jobs)
        job.adopt([staged])
        assert job_leftovers(store) != []  # the task's work is there until the abort
        raise RuntimeError("task failed")
    assert job_leftovers(store) == []
    assert latest_published(store, "s") is None


def test_sorted_rows_are_bulk_loaded_through_an_sst_file(store):
    with open_job_commit(store, "s", mode="overwrite") as job:
        staged = [
            job.spec.stage(p, rows_for(p, ITEMS), attempt="0", sorted_unique=True) for p in range(4)
        ]
        job.publish(staged)
    assert sum(s.puts for s in staged) == len(ITEMS)
    with iqkit.open(store) as engine:
        assert [get(engine, k) for k, _ in ITEMS] == [v for _, v in ITEMS]


def test_unsorted_rows_for_the_sst_path_fail_cleanly(store):
    with open_job_commit(store, "s", mode="overwrite") as job:
        rows = list(reversed(rows_for(0, ITEMS)))
        # the writer checks the order first (ValueError naming the keys)
        with pytest.raises(ValueError):
            job.spec.stage(0, rows, attempt="0", sorted_unique=True)
    assert job_leftovers(store) == []
    assert latest_published(store, "s") is None


def test_a_new_store_is_created_only_when_the_job_publishes(root):
    from iqkit.errors import StoreExistsError, UnknownStoreError
    from iqkit.store.manifest import StoreManifest

    def planned(name, **settings):
        kv = dict(kind="kv", key_serde="string", partitioner="murmur2")
        return StoreManifest(name=name, **kv, **settings)

    s = planned("s", partitions=4, value_serde="int64")
    with pytest.raises(UnknownStoreError):
        open_job_commit(root, "s")  # without create=, a missing store is an error
    with open_job_commit(root, "s", create=s) as job:  # a job that fails
        job.spec.stage(0, rows_for(0, ITEMS), attempt="a0")
        assert not store_exists(root, "s")
        job.abort()
    assert not store_exists(root, "s")
    with iqkit.open(root) as engine:
        assert "s" not in engine.store_names()
    # A task's upload no driver was handed waits for retention, as on object roots: only
    # the driver's own chains go with abort().
    with open_job_commit(root, "s", create=s) as job:
        staged = [job.spec.stage(p, rows_for(p, ITEMS), attempt="a") for p in range(4)]
        assert job.publish(staged) == 1
    with iqkit.open(root) as engine:
        assert engine.manifest("s").value_serde == "int64"
        assert get(engine, "user-7") == 7
    # a store created meanwhile with other settings is not overwritten
    with open_job_commit(root, "t", create=planned("t", partitions=2, value_serde="json")) as job:
        iqkit.create_store(root, "t", partitions=3)
        with pytest.raises(StoreExistsError, match="partitions=3 \\(asked 2\\)"):
            job.publish([])
    with iqkit.open(root) as engine:
        assert engine.manifest("t").partitions == 3
