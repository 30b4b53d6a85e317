"""The SST-chain format (store/chain/) over a local root and a real S3 server (moto on
127.0.0.1): version records, publishing races, the writer's deltas and compaction, the
reader's cached databases, and faults that must leave the last version readable."""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from s3server import CuttingProxy

from iqkit.errors import StoreIOError, VersionConflictError
from iqkit.query.position import Position
from iqkit.store.cache import FileCache
from iqkit.store.chain.read import database_folder, open_partition
from iqkit.store.chain.records import (
    ChainVersion,
    latest_version,
    list_versions,
    publish_version,
    read_version,
    record_key,
)
from iqkit.store.chain.retention import collect_chain_garbage
from iqkit.store.chain.write import commit_partition, commit_version
from iqkit.store.names import CHAIN_RECORDS_DIR
from iqkit.store.objects import open_objects

STORE = "totals"
Change = tuple[bytes, bytes | None]


@pytest.fixture
def cache(tmp_path) -> FileCache:
    return FileCache(tmp_path / "cache")


def key(i: int) -> bytes:
    return b"\x01" + i.to_bytes(8, "big")


def random_changes(rnd: random.Random, n: int, version: int, share: float) -> list[Change]:
    """About ``share`` of the keys changed, a tenth of them deleted, a few new keys."""
    picked = {rnd.randrange(n + n // 10) for _ in range(max(1, int(n * share)))}
    return [
        (key(i), None if rnd.random() < 0.1 else b"v%d-%d" % (version, i)) for i in sorted(picked)
    ]


def apply(model: dict[bytes, bytes], changes: list[Change]) -> None:
    for k, v in changes:
        if v is None:
            model.pop(k, None)
        else:
            model[k] = v


def read_all(cache, objects, record: ChainVersion, partition: int = 0) -> dict[bytes, bytes]:
    part = open_partition(cache, objects, STORE, partition, record.partitions[partition])
    try:
        return {k: v for chunk in part.scan_chunks(b"\x01", None) for k, v in chunk}
    finally:
        part.close()


# -- version records -------------------------------------------------------------------
def test_records_are_published_once_and_listed_in_numeric_order(objects):
    assert latest_version(objects, STORE) is None
    for n in (1, 2, 9, 10, 11):
        publish_version(
            objects,
            STORE,
            ChainVersion(n, {}, source_end={"in": {0: n}}, metadata={"batch": n}),
        )
    assert list_versions(objects, STORE) == [1, 2, 9, 10, 11]
    latest = latest_version(objects, STORE)
    assert (latest.version, latest.source_end, latest.metadata) == (
        11,
        {"in": {0: 11}},
        {"batch": 11},
    )
    assert record_key(STORE, 10) == "totals/chain/000000000010.json"
    with pytest.raises(VersionConflictError, match="version 10 was published by another"):
        publish_version(objects, STORE, ChainVersion(10, {}, metadata={"other": True}))
    assert read_version(objects, STORE, 10).metadata == {"batch": 10}  # the winner's
    with pytest.raises(LookupError, match=r"has no version 5 \(retained: 1..11\)"):
        read_version(objects, STORE, 5)


def test_the_record_carries_chains_commit_records_and_store_facts(objects, cache):
    v1 = commit_version(
        objects,
        STORE,
        None,
        {0: [(key(1), b"a")], 3: [(key(2), b"b")]},
        cache=cache,
        positions={0: Position.from_map({"in": {0: 10}})},
        counts={0: {"rows": 1}},
        source_end=Position.from_map({"in": {0: 12}}),
        metadata={"job": "test", "sinks": {"s": {"q": 7}}},
    )
    v2 = commit_version(
        objects, STORE, v1, {0: [(key(1), None)]}, cache=cache,
        positions={0: Position.from_map({"in": {1: 4}})},
    )  # fmt: skip
    again = read_version(objects, STORE, 2)
    assert again == v2
    assert again.partitions[3] == v1.partitions[3]  # untouched: carried, same files
    chain0 = again.partitions[0]
    assert (chain0.written_by, chain0.deltas, again.partitions[3].written_by) == (2, 1, 1)
    assert chain0.commit_record()["position"].to_map() == {"in": {0: 10, 1: 4}}
    assert [objects.size(f.name) for f in chain0.files] == [f.size for f in chain0.files]
    first = read_version(objects, STORE, 1)
    assert first.metadata["job"] == "test"
    assert first.metadata["partitions_written"] == [0, 3]
    assert first.metadata["writer"]["pid"] == os.getpid()
    assert first.source_end == {"in": {0: 12}}
    # What every version carries forward (chain.next_record):
    # the source's end offsets and the sinks' batch ids survive a commit that names none.
    assert again.source_end == {"in": {0: 12}}
    assert again.metadata["sinks"] == {"s": {"q": {"batch": 7, "version": 1}}}
    assert again.metadata["partitions_written"] == [0]


# -- writer and reader ----------------------------------------------------------------
def test_a_chain_reads_newest_first_with_deletes_applied(objects, cache):
    rnd, n = random.Random(7), 3000
    model: dict[bytes, bytes] = {}
    a, b, c = key(10**6 + 5), key(10**6 + 6), key(10**6 + 7)  # beyond the random keys
    base = [(key(i), b"v1-%d" % i) for i in range(n)] + [(a, b"first"), (b, b"first")]
    apply(model, base)
    record = commit_version(objects, STORE, None, {0: base}, cache=cache)
    # pinned cases: updated twice, deleted then re-put, new then deleted
    steps = [
        [(a, b"second"), (b, None), (c, b"x")],
        [(a, b"third"), (b, b"back"), (c, None)],
    ]
    steps += [random_changes(rnd, n, v, 0.05) for v in (4, 5, 6)]
    for changes in steps:
        record = commit_version(objects, STORE, record, {0: changes}, cache=cache)
        apply(model, changes)
    assert record.version == 6 and len(record.partitions[0].files) == 6

    got = read_all(cache, objects, read_version(objects, STORE, 6))
    assert got == model  # every key, newest value, deleted keys absent
    assert (got[a], got[b], c in got) == (b"third", b"back", False)
    assert list(got) == sorted(got)  # byte order, as RocksDB iterates


def fetches(objects, n: int) -> int:
    """The files a reader fetches where it needs ``n``: none on a local root, whose files
    are read in place (iqkit.store.chain.read.open_partition)."""
    return 0 if objects.local_file("x") is not None else n


def source_of(objects, cache, name: str) -> Path:
    """The file a partition's database was built from: the root's own on a local root,
    else the cached copy."""
    return objects.local_file(name) or cache.path_of(objects, name)


def test_a_partition_serves_the_bytes_partition_interface(objects, cache):
    rows = [(key(i), b"%d" % i) for i in range(100)]
    v1 = commit_version(
        objects, STORE, None, {0: rows}, cache=cache,
        positions={0: Position.from_map({"in": {0: 99}})}, counts={0: {"rows": 100}},
    )  # fmt: skip
    part = open_partition(cache, objects, STORE, 0, v1.partitions[0])
    try:
        assert part.written_by_version == 1
        assert part.get(key(5)) == b"5" and part.get(key(500)) is None
        assert part.multi_get([key(1), key(500), key(99)]) == [b"1", None, b"99"]
        tail = [k for chunk in part.scan_chunks(key(90), None, reverse=True) for k, _ in chunk]
        assert tail == [key(i) for i in range(99, 89, -1)]
        record = part.commit_record()
        assert (record["version"], record["rows"]) == (1, 100)
        assert record["position"].to_map() == {"in": {0: 99}}
        assert part.approximate_rows() > 0
        opening = "cache: fetched 1 file (" if fetches(objects, 1) else "local root: 1 file read"
        assert part.trace_line().startswith(opening)
        assert part.trace_line().endswith("database built (1 SST file)")
    finally:
        part.close()


def test_ingestion_links_cached_files_and_never_changes_them(objects, cache, tmp_path):
    v1 = commit_version(
        objects, STORE, None, {0: [(key(i), b"a") for i in range(500)]}, cache=cache
    )
    v2 = commit_version(objects, STORE, v1, {0: [(key(3), None), (key(9), b"b")]}, cache=cache)
    chain = v2.partitions[0]
    originals = {}
    for f in chain.files:
        objects.download(f.name, tmp_path / Path(f.name).name)
        originals[f.name] = _sha(tmp_path / Path(f.name).name)
    part = open_partition(cache, objects, STORE, 0, chain)
    try:
        db_dir = part.database
        db_inodes = {f.stat().st_ino for f in db_dir.iterdir() if f.suffix == ".sst"}
        for f in chain.files:
            cached = source_of(objects, cache, f.name)
            assert cached.stat().st_ino in db_inodes  # shared, not copied
            assert _sha(cached) == originals[f.name]  # ingestion wrote nothing into it
        assert not list(db_dir.glob(".ingest-*"))  # RocksDB removed the staging links
        assert part.get(key(9)) == b"b" and part.get(key(3)) is None
    finally:
        part.close()


def test_a_commit_uploads_only_its_delta_and_a_reader_fetches_only_that(objects, cache):
    rows = [(key(i), b"%d" % i) for i in range(5000)]
    v1 = commit_version(objects, STORE, None, {0: rows}, cache=cache)
    read_all(cache, objects, v1)
    before_objects = set(objects.list(STORE))

    v2 = commit_version(objects, STORE, v1, {0: [(key(1), b"new")]}, cache=cache)
    delta = v2.partitions[0].files[-1]
    assert set(objects.list(STORE)) - before_objects == {delta.name, record_key(STORE, 2)}
    assert delta.size < v2.partitions[0].files[0].size / 10

    part = open_partition(cache, objects, STORE, 0, v2.partitions[0])
    try:
        hits = fetches(objects, 1)  # the base, fetched before (none on a local root)
        assert (part.fetch.files_fetched, part.fetch.hits, part.built) == (hits, hits, True)
        assert part.fetch.bytes_fetched == fetches(objects, delta.size)
        assert part.in_place == 2 - 2 * hits
        assert part.get(key(1)) == b"new"
    finally:
        part.close()

    # A second open of the same version: no fetch, the database in the cache is reused.
    again = open_partition(cache, objects, STORE, 0, v2.partitions[0])
    try:
        assert (again.fetch.files_fetched, again.built) == (0, False)
        assert again.database == part.database and again.get(key(1)) == b"new"
    finally:
        again.close()


def test_a_cached_database_needs_no_fetch_and_an_evicted_one_is_rebuilt(objects, tmp_path):
    cache = FileCache(tmp_path / "cache")
    v1 = commit_version(objects, STORE, None, {0: [(key(i), b"x") for i in range(50)]}, cache=cache)
    open_partition(cache, objects, STORE, 0, v1.partitions[0]).close()
    kept = open_partition(cache, objects, STORE, 0, v1.partitions[0])
    try:
        assert (kept.fetch.files_fetched, kept.built) == (0, False)
    finally:
        kept.close()
    # Databases count against the cache's limit: with none, nothing unpinned stays.
    tight = FileCache(tmp_path / "cache", limit=0)
    tight.evict()
    assert tight.usage() == 0
    again = open_partition(tight, objects, STORE, 0, v1.partitions[0])
    try:
        assert again.built and again.fetch.files_fetched == fetches(objects, 1)
        assert again.get(key(7)) == b"x"
    finally:
        again.close()


def test_a_killed_build_is_removed_once_stale_and_a_live_one_is_left(objects, tmp_path):
    cache = FileCache(tmp_path / "cache")
    v1 = commit_version(objects, STORE, None, {0: [(key(1), b"a")]}, cache=cache)
    v2 = commit_version(objects, STORE, v1, {0: [(key(1), b"b")]}, cache=cache)
    parent = database_folder(cache, objects, STORE, 0, v1.partitions[0]).parent
    dead, live = parent / ".building-dead-1-x", parent / ".building-live-1-x"
    for folder in (dead, live):
        folder.mkdir(parents=True)
        (folder / "CURRENT").write_text("half a build")
    os.utime(dead, (1, 1))  # as a process killed long ago left it
    part = open_partition(cache, objects, STORE, 0, v2.partitions[0])
    part.close()
    assert not dead.exists() and live.exists()
    assert {p.name for p in parent.iterdir()} == {live.name, part.database.name}


def test_compaction_folds_a_long_chain_into_one_base(objects, cache):
    rnd, n = random.Random(3), 2000
    model: dict[bytes, bytes] = {}
    base = [(key(i), b"v1-%d" % i) for i in range(n)]
    apply(model, base)
    record = commit_version(objects, STORE, None, {0: base}, cache=cache, compact_after=3)
    lengths = []
    for version in range(2, 8):
        changes = random_changes(rnd, n, version, 0.05)
        record = commit_version(objects, STORE, record, {0: changes}, cache=cache, compact_after=3)
        apply(model, changes)
        lengths.append(len(record.partitions[0].files))
    assert lengths == [2, 3, 4, 1, 2, 3]  # base + 3 deltas at most, then one new base
    compacted = read_version(objects, STORE, 5).partitions[0]
    assert read_all(cache, objects, read_version(objects, STORE, 7)) == model
    assert len(compacted.files) == 1
    assert read_version(objects, STORE, 4).partitions[0].deltas == 3  # old chain intact
    fresh = FileCache(cache.folder.parent / "fresh-cache")
    part = open_partition(fresh, objects, STORE, 0, compacted)
    try:
        assert part.commit_record()["version"] == 5
        assert part.fetch.files_fetched == fetches(objects, 1)
    finally:
        part.close()


def test_bad_changes_are_refused_and_nothing_is_published(objects, cache):
    v1 = commit_version(objects, STORE, None, {0: [(key(1), b"a")]}, cache=cache)
    before = set(objects.list(STORE))
    with pytest.raises(ValueError, match="sorted by key, each key once"):
        commit_version(objects, STORE, v1, {0: [(key(2), b"x"), (key(1), b"y")]}, cache=cache)
    with pytest.raises(ValueError, match="reserved keyspace"):
        commit_version(objects, STORE, v1, {0: [(b"\x00mine", b"x")]}, cache=cache)
    assert set(objects.list(STORE)) == before
    assert latest_version(objects, STORE) == v1


# -- racing writers -------------------------------------------------------------------
def test_two_writers_in_threads_one_wins_the_loser_leaves_orphans(objects, tmp_path):
    v1 = commit_version(
        objects, STORE, None, {0: [(key(1), b"a")]}, cache=FileCache(tmp_path / "c0")
    )
    outcomes: dict[str, object] = {}
    start = threading.Barrier(2)

    def write(name: str) -> None:
        start.wait()
        try:
            outcomes[name] = commit_version(
                objects, STORE, v1, {0: [(key(1), name.encode())]},
                cache=FileCache(tmp_path / name),
            )  # fmt: skip
        except VersionConflictError as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=write, args=(n,)) for n in ("left", "right")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [n for n, o in outcomes.items() if isinstance(o, ChainVersion)]
    lost = [n for n, o in outcomes.items() if isinstance(o, VersionConflictError)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert list_versions(objects, STORE) == [1, 2]
    latest = latest_version(objects, STORE)
    assert read_all(FileCache(tmp_path / "reader"), objects, latest) == {key(1): won[0].encode()}
    ssts = objects.list(f"{STORE}/sst")
    assert len(ssts) == 3  # v1's, the winner's, and the loser's orphan (listed by no record)
    assert set(ssts) - read_version(objects, STORE, 1).files() - latest.files()


_WRITER = """
import sys
from iqkit.errors import VersionConflictError
from iqkit.store.cache import FileCache
from iqkit.store.chain.records import read_version
from iqkit.store.chain.write import commit_version
from iqkit.store.names import CHAIN_RECORDS_DIR
from iqkit.store.objects import open_objects

root, name, cache, go = sys.argv[1:]
objects = open_objects(root)
v1 = read_version(objects, "totals", 1)
print("ready", flush=True)
sys.stdin.readline()
try:
    commit_version(objects, "totals", v1, {0: [(b"\\x01k", name.encode())]}, cache=FileCache(cache))
    print("won")
except VersionConflictError as exc:
    print("lost:", exc)
"""


def test_two_writers_in_processes_one_wins(root_url, objects, tmp_path):
    commit_version(objects, STORE, None, {0: [(b"\x01k", b"a")]}, cache=FileCache(tmp_path / "c"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, root_url, name, os.fspath(tmp_path / name), "go"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("p1", "p2")
    ]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
    assert outs[1] == "won" and outs[0].startswith("lost: store 'totals': version 2 was published")
    assert list_versions(objects, STORE) == [1, 2]
    value = read_all(FileCache(tmp_path / "reader"), objects, latest_version(objects, STORE))
    assert value[b"\x01k"] in (b"p1", b"p2")


_OPENER = """
import sys
from iqkit.store.cache import FileCache
from iqkit.store.chain.records import read_version
from iqkit.store.chain.retention import collect_chain_garbage
from iqkit.store.chain.read import database_folder, open_partition
from iqkit.store.names import CHAIN_RECORDS_DIR
from iqkit.store.objects import open_objects

root, cache = sys.argv[1:]
objects = open_objects(root)
chain = read_version(objects, "totals", 1).partitions[0]
sys.stdin.readline()
part = open_partition(FileCache(cache), objects, "totals", 0, chain)
print(part.get(b"\\x01" + (7).to_bytes(8, "big")).decode(), part.database)
part.close()
"""


def test_processes_opening_one_version_at_once_share_one_database(root_url, objects, tmp_path):
    rows = [(key(i), b"%d" % i) for i in range(20000)]
    commit_version(objects, STORE, None, {0: rows}, cache=FileCache(tmp_path / "w"))
    shared = os.fspath(tmp_path / "shared-cache")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPENER, root_url, shared],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for p in procs:
        p.stdin.write("\n")
        p.stdin.flush()
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert {o[0] for o in outs} == {"7"} and len({o[1] for o in outs}) == 1
    dbs = Path(outs[0][1]).parent
    assert [d.name for d in dbs.iterdir()] == [Path(outs[0][1]).name]  # no leftover builds


# -- faults (the real S3 server) --------------------------------------------------------
def test_server_stopped_mid_upload_leaves_the_last_version_readable(
    s3_endpoint, s3_root, monkeypatch, tmp_path
):
    direct = open_objects(s3_root)
    v1 = commit_version(
        direct, STORE, None, {0: [(key(1), b"one")]}, cache=FileCache(tmp_path / "c")
    )
    big = [(key(i), os.urandom(200)) for i in range(20000)]  # ~4 MB: cut in the middle
    proxy = CuttingProxy(s3_endpoint, cut_after=1 << 20)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    cut = open_objects(s3_root)
    with pytest.raises(StoreIOError) as info:
        commit_version(
            cut, STORE, v1, {0: [(key(1), b"small")], 1: big}, cache=FileCache(tmp_path / "c")
        )
    assert proxy.cut.is_set() and "\n" not in str(info.value)
    assert "the endpoint cannot be reached or dropped the connection" in str(info.value)

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # the server is back
    back = open_objects(s3_root)
    assert list_versions(back, STORE) == [1]
    assert read_all(FileCache(tmp_path / "reader"), back, latest_version(back, STORE)) == {
        key(1): b"one"
    }


def test_a_request_failing_at_publish_leaves_the_last_version(
    s3_endpoint, s3_root, monkeypatch, tmp_path
):
    direct = open_objects(s3_root)
    cache = FileCache(tmp_path / "c")
    v1 = commit_version(direct, STORE, None, {0: [(key(1), b"one")]}, cache=cache)
    chain = commit_partition(
        direct, STORE, 0, v1.partitions[0], [(key(1), b"two")], version=2, cache=cache
    )
    # The publish request fails: the endpoint now has nothing listening behind it.
    with socket.create_server(("127.0.0.1", 0)) as gone:
        dead = f"http://127.0.0.1:{gone.getsockname()[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's retries would only add time
    failing = open_objects(s3_root)
    with pytest.raises(StoreIOError, match=r"cannot create .*totals/chain/000000000002\.json"):
        publish_version(failing, STORE, ChainVersion(2, {0: chain}))
    assert latest_version(direct, STORE) == v1
    assert read_all(FileCache(tmp_path / "reader"), direct, v1) == {key(1): b"one"}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_record_is_plain_json(objects, cache):
    v1 = commit_version(objects, STORE, None, {2: [(key(1), b"a")]}, cache=cache)
    data = json.loads(objects.read_bytes(record_key(STORE, 1)))
    assert sorted(data) == [
        "checksum",
        "created_at",
        "metadata",
        "partitions",
        "source_end",
        "version",
    ]
    assert data["partitions"]["2"]["files"][0] == {
        "name": v1.partitions[2].files[0].name,
        "size": v1.partitions[2].files[0].size,
        "checksum": v1.partitions[2].files[0].checksum,
    }
    assert data["checksum"].startswith("xxh3_128:")
    assert data["partitions"]["2"]["commit"]["version"] == 1


# -- retention --------------------------------------------------------------------------
def _history(objects, tmp_path, n: int = 4) -> list[ChainVersion]:
    """Versions 1..n of partition 0, compacting every commit after the first two (so
    old versions own files no newer version lists), plus an unchanged partition 1."""
    cache = FileCache(tmp_path / "writer-cache")
    records = [
        commit_version(
            objects, STORE, None, {0: [(key(1), b"v1")], 1: [(key(9), b"p1")]}, cache=cache
        )
    ]
    for v in range(2, n + 1):
        records.append(
            commit_version(
                objects,
                STORE,
                records[-1],
                {0: [(key(1), b"v%d" % v)]},
                cache=cache,
                compact_after=0,
            )
        )
    return records


def _storage_now(objects) -> float:
    """The newest record's modification time on the storage's clock: what retention
    judges ages by. A record's ``created_at`` is taken before its upload, so under load
    the object service's time can be seconds later (moto's ``LastModified``)."""
    return max(objects.list_modified(f"{STORE}/{CHAIN_RECORDS_DIR}").values())


def test_retention_keeps_versions_superseded_within_the_grace(objects, tmp_path):
    _history(objects, tmp_path)
    now = _storage_now(objects)
    cleanup = collect_chain_garbage(objects, STORE, grace_seconds=600, now=now + 1)
    assert (cleanup.removed_versions, cleanup.removed_files) == ([], [])
    # A reader that pinned version 1 before it was superseded can still fetch it.
    assert read_all(FileCache(tmp_path / "late"), objects, read_version(objects, STORE, 1)) == {
        key(1): b"v1"
    }

    cleanup = collect_chain_garbage(objects, STORE, grace_seconds=600, now=now + 601)
    assert cleanup.removed_versions == [1, 2, 3] and not cleanup.problems
    assert list_versions(objects, STORE) == [4]
    latest = latest_version(objects, STORE)
    assert set(objects.list(f"{STORE}/sst")) == latest.files()  # partition 1's v1 file stays
    assert read_all(FileCache(tmp_path / "new"), objects, latest) == {key(1): b"v4"}
    assert read_all(FileCache(tmp_path / "new"), objects, latest, 1) == {key(9): b"p1"}
    with pytest.raises(LookupError, match=r"has no version 2 \(retained: 4\)"):
        read_version(objects, STORE, 2)


def test_retention_keeps_the_newest_versions_it_is_told_to(objects, tmp_path):
    records = _history(objects, tmp_path)
    cleanup = collect_chain_garbage(
        objects, STORE, retain=2, grace_seconds=0, now=_storage_now(objects) + 1
    )
    assert cleanup.removed_versions == [1, 2]
    for record in records[2:]:
        assert (
            read_all(FileCache(tmp_path / "r"), objects, record)[key(1)] == b"v%d" % record.version
        )
    with pytest.raises(ValueError, match="retain must keep at least the latest"):
        collect_chain_garbage(objects, STORE, retain=0)


def test_a_reader_that_pinned_an_old_version_still_reads_after_retention(objects, tmp_path):
    records = _history(objects, tmp_path, n=2)
    reader_cache = FileCache(tmp_path / "reader")
    part = open_partition(reader_cache, objects, STORE, 0, records[0].partitions[0])
    try:
        # Retention with no grace removes version 1 and its compacted-away files...
        cleanup = collect_chain_garbage(
            objects, STORE, grace_seconds=0, now=_storage_now(objects) + 1
        )
        assert cleanup.removed_versions == [1]
        assert records[0].partitions[0].files[0].name in cleanup.removed_files
        # ...and the reader, whose files are pinned in its cache, reads on.
        assert part.get(key(1)) == b"v1"
        assert [k for c in part.scan_chunks(b"\x01", None) for k, _ in c] == [key(1)]
    finally:
        part.close()
    again = open_partition(reader_cache, objects, STORE, 0, records[0].partitions[0])
    try:
        assert again.get(key(1)) == b"v1" and again.fetch.files_fetched == 0
    finally:
        again.close()


def test_retention_removes_a_losers_orphans_only_after_the_grace(objects, tmp_path):
    v1 = commit_version(
        objects, STORE, None, {0: [(key(1), b"a")]}, cache=FileCache(tmp_path / "c")
    )
    commit_version(objects, STORE, v1, {0: [(key(1), b"won")]}, cache=FileCache(tmp_path / "c"))
    with pytest.raises(VersionConflictError):
        commit_version(
            objects, STORE, v1, {0: [(key(1), b"lost")]}, cache=FileCache(tmp_path / "c")
        )
    orphans = set(objects.list(f"{STORE}/sst")) - latest_version(objects, STORE).files()
    orphans -= v1.files()
    assert len(orphans) == 1
    # An upload this young may be a commit about to publish: kept.
    assert not collect_chain_garbage(objects, STORE, retain=2).removed_files
    later = collect_chain_garbage(objects, STORE, retain=2, now=v1.created_at + 3600)
    assert set(later.removed_files) == orphans and later.removed_versions == []


def test_retention_removes_a_killed_writers_temporary_files_after_the_grace(tmp_path):
    # A writer killed mid-upload on a local root leaves a temporary file beside the
    # final name (never listed as an object); retention removes it once it is older
    # than the grace, and leaves a live writer's (younger) one alone.
    objects = open_objects(tmp_path / "root")
    records = _history(objects, tmp_path, n=2)
    folder = tmp_path / "root" / STORE / "sst" / "0"
    dead = folder / ".iqkit-tmp-0123-dead.sst"
    live = folder / ".iqkit-tmp-4567-live.sst"
    for path in (dead, live):
        path.write_bytes(b"half")
    old = records[-1].created_at - 3600
    os.utime(dead, (old, old))
    now = records[-1].created_at + 1
    cleanup = collect_chain_garbage(objects, STORE, retain=2, grace_seconds=600, now=now)
    assert f"{STORE}/sst/0/{dead.name}" in cleanup.removed_files
    assert not dead.exists() and live.exists()
    assert all(not k.rsplit("/", 1)[-1].startswith(".iqkit-tmp-") for k in objects.list())
