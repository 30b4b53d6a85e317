"""Job commits on an object root (``store/chain/jobs.py``) against the real S3 server:
partitions staged and uploaded by other processes, one publish by the driver."""

from __future__ import annotations

import base64
import pickle

import pytest
from helpers import kv_rows, run_python_script

import iqkit
from iqkit.errors import StoreConflictError, UnknownStoreError
from iqkit.query.position import Position
from iqkit.store.chain.jobs import ChainJobCommit, StagedChain
from iqkit.store.chain.records import list_versions, read_version
from iqkit.store.chain.stores import chain_store_names
from iqkit.store.encoding import keyspace
from iqkit.store.encoding.partitioners import murmur2_partition
from iqkit.store.encoding.serdes import get_serde
from iqkit.store.formats import format_for
from iqkit.store.manifest import StoreManifest
from iqkit.store.objects import open_objects
from iqkit.store.partitions import rocks
from iqkit.store.roots import parse_root

STORE = "totals"
PARTITIONS = 2


def open_job_commit(root, store, **options):
    return format_for(parse_root(root)).open_job_commit(store, **options)


def manifest() -> StoreManifest:
    return StoreManifest(
        name=STORE,
        kind="kv",
        partitions=PARTITIONS,
        key_serde="string",
        value_serde="json",
        partitioner="murmur2",
        window_size_ms=None,
    )


def by_partition(items: dict[str, object]) -> dict[int, list[tuple[bytes, bytes | None]]]:
    """``items`` as sorted (RocksDB key, value bytes or None) rows per store partition."""
    key_serde, value_serde = get_serde("string"), get_serde("json")
    out: dict[int, list[tuple[bytes, bytes | None]]] = {}
    for k, v in items.items():
        kb = key_serde.serialize(k)
        p = murmur2_partition(kb, PARTITIONS)
        out.setdefault(p, []).append(
            (keyspace.kv_key(kb), None if v is None else value_serde.serialize(v))
        )
    return {p: sorted(rows) for p, rows in out.items()}


# A task in a process of its own: it gets the pickled spec, opens the root from its own
# environment (the AWS variables), stages, and returns the staged chain as text.
TASK = """
import base64, pickle, sys
spec, partition, rows = pickle.loads(base64.b64decode(sys.argv[1]))
staged = spec.stage(partition, rows, attempt="task-" + str(partition))
print("RESULT" + __import__("json").dumps(staged.to_text()))
"""


def stage_in_process(spec, partition, rows) -> StagedChain:
    arg = base64.b64encode(pickle.dumps((spec, partition, rows))).decode()
    return StagedChain.from_text(run_python_script(TASK, arg))


def test_tasks_in_other_processes_stage_and_the_driver_publishes_once(s3_root):
    job = open_job_commit(s3_root, STORE, who="test", create=manifest())
    assert isinstance(job, ChainJobCommit)
    rows = by_partition({"alice": 1, "bob": 2, "carol": 3, "dave": 4})
    staged = [stage_in_process(job.spec, p, r) for p, r in sorted(rows.items())]
    objects = open_objects(parse_root(s3_root))
    assert chain_store_names(objects) == []  # nothing visible before the publish
    with job:
        version = job.publish(staged, metadata={"rows_written": 4})
    assert version == 1
    with iqkit.open(s3_root) as engine:
        got = {k: v for _p, k, v in kv_rows(engine, STORE)}
    assert got == {"alice": 1, "bob": 2, "carol": 3, "dave": 4}
    record = read_version(objects, STORE, 1)
    assert record.metadata["job"] == job.job_id
    assert record.metadata["partitions_written"] == sorted(rows)
    assert {s.puts for s in staged} <= {1, 2, 3} and sum(s.puts for s in staged) == 4


def test_upsert_builds_on_the_base_and_overwrite_replaces_every_partition(s3_root):
    with open_job_commit(s3_root, STORE, create=manifest()) as job:
        rows = by_partition({"alice": 1, "bob": 2, "carol": 3})
        job.publish([job.spec.stage(p, r, attempt="a") for p, r in rows.items()])
    with open_job_commit(s3_root, STORE) as job:  # upsert: a delta with a delete
        rows = by_partition({"alice": 10, "bob": None})
        job.publish([job.spec.stage(p, r, attempt="a") for p, r in rows.items()])
        assert all(len(job.spec.base_of(p).files) == 1 for p in rows if job.spec.base_of(p))
    with iqkit.open(s3_root) as engine:
        assert {k: v for _p, k, v in kv_rows(engine, STORE)} == {"alice": 10, "carol": 3}
    with open_job_commit(s3_root, STORE, mode="overwrite") as job:
        rows = by_partition({"erin": 5})
        job.publish([job.spec.stage(p, r, attempt="a") for p, r in rows.items()])
        assert job.version == 3
    with iqkit.open(s3_root) as engine:
        assert {k: v for _p, k, v in kv_rows(engine, STORE)} == {"erin": 5}
    with iqkit.open(s3_root, as_of=2) as engine:  # older versions untouched
        assert {k: v for _p, k, v in kv_rows(engine, STORE)} == {"alice": 10, "carol": 3}


def test_a_commit_landing_meanwhile_makes_the_job_publish_nothing(s3_root):
    iqkit.create_store(s3_root, STORE, partitions=PARTITIONS)
    with iqkit.StoreWriter(s3_root, STORE) as w:
        w.put("alice", 1)
    job = open_job_commit(s3_root, STORE)
    staged = [job.spec.stage(p, r, attempt="a") for p, r in by_partition({"bob": 2}).items()]
    with iqkit.StoreWriter(s3_root, STORE) as w:  # lands while the job runs
        w.put("carol", 3)
    objects = open_objects(parse_root(s3_root))
    conflict = r"changed while the job ran \(version 1 -> 2\)"
    with pytest.raises(StoreConflictError, match=conflict), job:
        job.publish(staged)
    assert list_versions(objects, STORE) == [1, 2]
    for s in staged:  # the job's uploads are gone; the base's files are not
        assert all(f.name not in objects.list(STORE) for f in s.chain.files[-1:])
    with iqkit.open(s3_root) as engine:
        assert {k: v for _p, k, v in kv_rows(engine, STORE)} == {"alice": 1, "carol": 3}


def test_a_failed_first_job_creates_no_store_and_leaves_no_files(s3_root):
    objects = open_objects(parse_root(s3_root))
    job = open_job_commit(s3_root, STORE, create=manifest())
    with pytest.raises(RuntimeError, match="a task failed"), job:
        for p, r in by_partition({"alice": 1}).items():
            job.stage_runs(p, [], puts=len(r))
        raise RuntimeError("a task failed")
    assert objects.list() == []
    with pytest.raises(UnknownStoreError):
        open_job_commit(s3_root, STORE)


def kv(key: str, value: object | None) -> tuple[bytes, bytes | None]:
    data = None if value is None else get_serde("json").serialize(value)
    return keyspace.kv_key(get_serde("string").serialize(key)), data


def test_runs_uploaded_by_tasks_apply_in_order_with_deletes(s3_root, tmp_path):
    iqkit.create_store(s3_root, STORE, partitions=PARTITIONS, partitioner="explicit")
    with iqkit.StoreWriter(s3_root, STORE) as w:
        w.put("alice", 1, partition=0)
        w.put("bob", 2, partition=0)
    job = open_job_commit(s3_root, STORE)
    runs = []
    for i, rows in enumerate([[kv("alice", 10), kv("zed", 1)], [kv("alice", None), kv("zed", 2)]]):
        sst = tmp_path / f"run{i}.sst"
        rocks.write_changes_sst(sst, rows)
        runs.append(job.spec.upload_runs([(0, sst)])[0])
    with job:
        staged = job.stage_runs(0, runs, position=Position.from_map({"in": {0: 9}}), puts=3)
        assert job.publish([staged]) == 2
    chain = read_version(open_objects(parse_root(s3_root)), STORE, 2).partitions[0]
    assert [f.name for f in chain.files] == [
        read_version(open_objects(parse_root(s3_root)), STORE, 1).partitions[0].files[0].name,
        *(r.name for r in runs),
        chain.files[-1].name,  # the driver's small SST with the commit record
    ]
    assert chain.commit_record()["position"].to_map() == {"in": {0: 9}}
    with iqkit.open(s3_root) as engine:
        assert {k: v for _p, k, v in kv_rows(engine, STORE)} == {"bob": 2, "zed": 2}


def test_a_job_on_a_local_chain_store_takes_the_commit_lock(root, monkeypatch):
    from iqkit.errors import StoreLockedError
    from iqkit.store.locking import CommitLock
    from iqkit.store.names import LOCK_FILE

    iqkit.create_store(root, "s", partitions=1)
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1)
    job = open_job_commit(root, "s", lock_timeout=0.2)
    assert isinstance(job, ChainJobCommit)
    staged = [job.spec.stage(0, [(keyspace.kv_key(b"b"), b"2")], attempt="t")]
    lock = root / "s" / LOCK_FILE
    holder = CommitLock(lock, "s", who="a notebook's StoreWriter", timeout=5)
    with holder, pytest.raises(StoreLockedError, match="a notebook's StoreWriter"):
        job.publish(staged)
    assert list_versions(open_objects(root), "s") == [1]  # nothing published
    with iqkit.open(root) as engine:
        assert [(k, v) for _, k, v in kv_rows(engine, "s")] == [("a", 1)]
