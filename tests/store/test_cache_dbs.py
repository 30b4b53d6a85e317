"""The cache's databases (``dbs/``, built by store/chain/read.py) count against the cache's
limit with its files: least recently used go first, never one a live reader has open
(in this process or another), bytes shared by hard links are counted once, and a query
after an eviction answers the same rows (the database is simply built again)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import request

import iqkit
from iqkit.store.cache import FileCache
from iqkit.store.chain import snapshot as chain_snapshot
from iqkit.store.chain.read import database_folder, open_partition
from iqkit.store.chain.records import ChainVersion, latest_version
from iqkit.store.chain.write import commit_version
from iqkit.store.columnar.deletes import writing
from iqkit.store.names import CACHE_BUILDING_PREFIX, CACHE_EVICTING_PREFIX
from iqkit.store.objects import ObjectStore, open_objects
from iqkit.store.partitions.layers import twin_scans

STORE = "totals"
PARTITIONS = 4


def key(i: int) -> bytes:
    return b"\x01" + i.to_bytes(8, "big")


def value(p: int, i: int) -> bytes:
    return b"p%d-value-%06d" % (p, i)


@pytest.fixture
def objects(s3_root) -> ObjectStore:
    """A root on the S3 server: its readers fetch into the cache (a local root's are read
    in place, iqkit.store.chain.read.open_partition, and never reach the cache's files)."""
    return open_objects(s3_root)


@pytest.fixture
def v1(objects, tmp_path) -> ChainVersion:
    """One version of four partitions, 3000 rows each (one SST file per partition)."""
    changes = {p: [(key(i), value(p, i)) for i in range(3000)] for p in range(PARTITIONS)}
    return commit_version(objects, STORE, None, changes, cache=FileCache(tmp_path / "writer"))


def read_partition(cache: FileCache, objects, record: ChainVersion, p: int) -> dict[bytes, bytes]:
    part = open_partition(cache, objects, STORE, p, record.partitions[p])
    try:
        return {k: v for chunk in part.scan_chunks(b"\x01", None) for k, v in chunk}
    finally:
        part.close()


def databases(cache: FileCache) -> list[Path]:
    """Database folders in the cache (RocksDB's CURRENT inside), sorted."""
    return sorted(p.parent for p in cache.dbs_dir.rglob("CURRENT"))


def footprint(cache: FileCache, objects, record: ChainVersion, p: int) -> int:
    """Disk bytes partition ``p``'s cached file and database hold, each inode once."""
    files = [cache.path_of(objects, f.name) for f in record.partitions[p].files]
    folder = database_folder(cache, objects, STORE, p, record.partitions[p])
    seen = {}
    for path in [*files, *folder.iterdir()]:
        st = path.stat()
        seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


def age(cache: FileCache, objects, record: ChainVersion, order: list[int]) -> None:
    """Make the partitions' files and databases used in ``order`` (oldest first): their
    mtimes, which are the cache's recency, set explicitly rather than slept for."""
    for n, p in enumerate(order):
        stamp = 1_000_000 + 10 * n
        for f in record.partitions[p].files:
            os.utime(cache.path_of(objects, f.name), (stamp, stamp))
        folder = database_folder(cache, objects, STORE, p, record.partitions[p])
        os.utime(folder, (stamp + 1, stamp + 1))


def test_hard_linked_bytes_are_counted_once(objects, v1, tmp_path):
    cache = FileCache(tmp_path / "cache")
    read_partition(cache, objects, v1, 0)
    cached = cache.path_of(objects, v1.partitions[0].files[0].name)
    (folder,) = databases(cache)
    db_files = [f.stat() for f in folder.iterdir()]
    shared = [st for st in db_files if st.st_ino == cached.stat().st_ino]
    assert len(shared) == 1 and cached.stat().st_nlink == 2  # the database's SST is a link
    naive = cached.stat().st_size + sum(st.st_size for st in db_files)
    honest = naive - cached.stat().st_size
    assert cache.usage() == honest == footprint(cache, objects, v1, 0)
    assert cache.usage() < naive


def test_least_recently_used_databases_go_first_when_over_the_limit(objects, v1, tmp_path):
    cache = FileCache(tmp_path / "cache")
    model = {p: read_partition(cache, objects, v1, p) for p in range(PARTITIONS)}
    assert len(databases(cache)) == PARTITIONS
    age(cache, objects, v1, [2, 0, 3, 1])  # 2 is the least recently used, 1 the most
    sizes = {p: footprint(cache, objects, v1, p) for p in range(PARTITIONS)}
    before = cache.usage()
    assert before == sum(sizes.values())

    bounded = FileCache(cache.folder, limit=sizes[3] + sizes[1])
    freed = bounded.evict()
    after = bounded.usage()
    assert freed == sizes[2] + sizes[0] == before - after and after == sizes[3] + sizes[1]
    kept = {database_folder(cache, objects, STORE, p, v1.partitions[p]) for p in (3, 1)}
    assert set(databases(cache)) == kept
    s = bounded.stats
    assert (s.databases_evicted, s.files_evicted, s.bytes_evicted) == (2, 2, freed)
    assert s.line().endswith(f"; evicted 2 files, 2 databases ({freed / 1e6:.1f} MB freed)")
    assert not list(cache.dbs_dir.rglob(f"{CACHE_EVICTING_PREFIX}*"))

    # A kept one is reused: nothing fetched, nothing built. (Asked first: rebuilding 2
    # below puts the cache over its limit again, and whether that evicts 1 too depends on
    # a few bytes of RocksDB's log files, which differ from run to run.)
    part = open_partition(bounded, objects, STORE, 1, v1.partitions[1])
    try:
        assert (part.built, part.fetch.files_fetched) == (False, 0)
        assert part.get(key(7)) == value(1, 7)
    finally:
        part.close()
    # Reading an evicted partition again builds its database again: the same rows.
    part = open_partition(bounded, objects, STORE, 2, v1.partitions[2])
    try:
        assert (part.built, part.fetch.files_fetched) == (True, 1)
        assert {k: v for c in part.scan_chunks(b"\x01", None) for k, v in c} == model[2]
        assert "database built" in part.trace_line()
    finally:
        part.close()


def test_a_database_open_in_this_process_is_never_evicted(objects, v1, tmp_path):
    cache = FileCache(tmp_path / "cache", limit=0)
    part = open_partition(cache, objects, STORE, 0, v1.partitions[0])
    try:
        read_partition(cache, objects, v1, 1)  # built, closed: evicted by the next eviction
        cache.evict()
        assert databases(cache) == [part.database]
        assert part.get(key(5)) == value(0, 5)
    finally:
        part.close()
    cache.evict()
    assert databases(cache) == [] and cache.usage() == 0


def test_a_file_whose_bytes_a_pinned_database_holds_is_kept(objects, v1, tmp_path):
    """Removing it would free nothing: eviction waits until the database goes too."""
    cache = FileCache(tmp_path / "cache")
    read_partition(cache, objects, v1, 0)
    folder = database_folder(cache, objects, STORE, 0, v1.partitions[0])
    cached = cache.path_of(objects, v1.partitions[0].files[0].name)
    used = cache.usage()
    bounded = FileCache(cache.folder, limit=0)
    with bounded.pin_database(folder):
        bounded.evict()
        assert cached.exists() and bounded.stats.files_evicted == 0
    assert bounded.evict() == used
    assert not cached.exists() and not folder.exists() and bounded.usage() == 0


HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from iqkit.store.cache import FileCache
    from iqkit.store.chain.records import latest_version
    from iqkit.store.chain.read import open_partition
    from iqkit.store.objects import open_objects
    root, cache_dir = sys.argv[1:3]
    objects = open_objects(root)
    record = latest_version(objects, "totals")
    part = open_partition(FileCache(cache_dir, limit=0), objects, "totals", 0,
                          record.partitions[0])
    print(part.database, flush=True)
    sys.stdin.readline()  # held open until the test says so
    print(part.get(b"\\x01" + (42).to_bytes(8, "big")).decode(), flush=True)
    part.close()
    """
)


def test_a_database_open_in_another_process_survives_eviction(objects, v1, tmp_path):
    cache = FileCache(tmp_path / "cache", limit=0)
    for p in range(PARTITIONS):
        read_partition(FileCache(cache.folder), objects, v1, p)  # every database built
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, objects.root.url, os.fspath(cache.folder)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        held = Path(holder.stdout.readline().strip())
        assert held == database_folder(cache, objects, STORE, 0, v1.partitions[0])
        cache.evict()
        assert databases(cache) == [held]  # the others went; the one held open stayed
        assert cache.stats.databases_evicted == PARTITIONS - 1
        out, _ = holder.communicate("\n", timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert holder.returncode == 0 and out.strip() == value(0, 42).decode()
    cache.evict()
    assert databases(cache) == [] and cache.usage() == 0  # the pin ended with its reader
    assert read_partition(cache, objects, v1, 0)[key(42)] == value(0, 42)  # rebuilt


READER = textwrap.dedent(
    """
    import sys
    from iqkit.store.cache import FileCache
    from iqkit.store.chain.records import latest_version
    from iqkit.store.chain.read import open_partition
    from iqkit.store.objects import open_objects
    root, cache_dir, limit = sys.argv[1:4]
    objects = open_objects(root)
    record = latest_version(objects, "totals")
    cache = FileCache(cache_dir, limit=int(limit))
    bad = 0
    for round in range(6):
        for p in range(4):
            part = open_partition(cache, objects, "totals", p, record.partitions[p])
            try:
                got = part.get(b"\\x01" + (round * 7 + p).to_bytes(8, "big"))
                bad += got != b"p%d-value-%06d" % (p, round * 7 + p)
                bad += sum(len(c) for c in part.scan_chunks(b"\\x01", None)) != 3000
            finally:
                part.close()
    s = cache.stats
    print(bad, s.databases_evicted, s.files_fetched)
    """
)


def test_several_processes_build_read_and_evict_databases_safely(objects, v1, tmp_path):
    """Three processes read every partition again and again in a cache that holds about
    one partition: databases are evicted and rebuilt all the time, every read is right,
    and no half-built or half-deleted folder is left."""
    probe = FileCache(tmp_path / "probe")
    read_partition(probe, objects, v1, 0)
    limit = probe.usage() + probe.usage() // 2
    cache_dir = tmp_path / "shared"
    command = [sys.executable, "-c", READER, objects.root.url, os.fspath(cache_dir)]
    procs = [
        subprocess.Popen(
            [*command, str(limit)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    evicted = 0
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        bad, dbs, _ = map(int, out.split())
        assert bad == 0
        evicted += dbs
    assert evicted > 0
    shared = FileCache(cache_dir, limit=limit)
    prefixes = (CACHE_BUILDING_PREFIX, CACHE_EVICTING_PREFIX)
    assert [p for p in shared.dbs_dir.rglob(".*") if p.name.startswith(prefixes)] == []
    # Over the limit only by what was pinned when the last eviction ran: the next one
    # (now nothing is pinned) brings it under.
    shared.evict()
    assert shared.usage() <= limit


# -- through the public API on the real S3 server ---------------------------------------
def all_rows(root: str, *, twins: bool = False) -> tuple[list[tuple[str, int]], list[str]]:
    """Every row of ``totals`` (sorted) and the trace's FileCache lines; read through the
    partitions' databases unless ``twins`` (then the scan reads the columnar twins)."""
    req = request(STORE, iqkit.RangeQuery.with_no_bounds()).enable_execution_info()
    with iqkit.open(root) as engine, twin_scans(twins):
        result = engine.query(req)
        out, lines = [], []
        for qr in result.partition_results.values():
            assert qr.is_success, qr.failure_message
            lines += [line for line in qr.execution_info if "FileCache" in line]
            with qr.result as it:
                out.extend((kv.key, kv.value) for kv in it)
    return sorted(out), lines


def evicted_databases(lines: list[str]) -> int:
    return sum(
        int(m) for line in lines for m in re.findall(r"evicted \d+ files?, (\d+) data", line)
    )


def test_queries_answer_the_same_rows_after_their_databases_were_evicted(s3_root, monkeypatch):
    monkeypatch.setenv("IQKIT_CACHE_SIZE", "1")  # nothing unpinned survives an eviction
    # Partitions read through their databases (pinned while open), not memory copies of
    # small chains, which unpin theirs at once.
    monkeypatch.setattr(chain_snapshot, "SMALL_CHAIN_BYTES", 0)
    iqkit.create_store(s3_root, STORE, partitions=3, value_serde="int64")
    with iqkit.StoreWriter(s3_root, STORE) as w:
        for i in range(300):
            w.put(f"user-{i:03d}", i)
    # A scan of the twins builds no database.
    from_twins, lines = all_rows(s3_root, twins=True)
    assert len(from_twins) == 300 and databases(FileCache()) == []
    assert len(lines) == 3 and all("1 columnar twin read, no database" in x for x in lines)
    first, lines = all_rows(s3_root)
    assert first == from_twins
    assert len(lines) == 3 and all("database built" in line for line in lines)

    cache = FileCache()  # the engine's cache: IQKIT_CACHE, IQKIT_CACHE_SIZE
    assert len(databases(cache)) == 3 and cache.usage() > 1
    freed = cache.evict()  # the engine is closed: nothing is pinned
    assert databases(cache) == [] and cache.usage() == 0 and freed > 0
    assert cache.stats.databases_evicted == 3

    again, lines = all_rows(s3_root)
    assert again == first and len(lines) == 3
    assert all("database built" in line for line in lines)

    # A new version: opening its databases evicts the previous version's, the trace says so.
    # Committed without position deletes: finding them fetches the older twins into this
    # 1-byte cache, which would evict the databases in the writer, before any read.
    with writing(False), iqkit.StoreWriter(s3_root, STORE) as w:
        for i in range(0, 300, 3):
            w.put(f"user-{i:03d}", -i)
    expected = sorted((k, -v if int(k[5:]) % 3 == 0 else v) for k, v in first)
    newer, lines = all_rows(s3_root)
    assert newer == expected
    assert evicted_databases(lines) == 3, lines
    assert len(databases(cache)) == 3  # the new version's (the engine had them open)
    assert latest_version(open_objects(s3_root), STORE).version == 2
