"""How a partition's database is built (store/partitions/builds.py build_database): RocksDB
writes it in a memory folder, unsynced, and it is moved into the cache and published with
one rename. The database serves exactly the chain's rows either way (in memory or in
place), holds hard links of the chain's files (never changed), a build cut short at any
step is never served, and a published database a power loss left incomplete is built
again rather than failing the query."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

import iqkit
from iqkit.store.names import CACHE_BUILDING_PREFIX, ROCKSDB_SIDE_FILES
from iqkit.store.partitions import builds, rocks

MEMORY = Path("/dev/shm")
needs_memory = pytest.mark.skipif(
    not (sys.platform == "linux" and os.access(MEMORY, os.W_OK | os.X_OK)),
    reason="no writable /dev/shm",
)


def key(i: int) -> bytes:
    return b"k%06d" % i


def chain_files(folder: Path) -> tuple[list[Path], dict[bytes, bytes]]:
    """Three SSTs, oldest first, overwriting and deleting each other's keys; the rows
    the chain holds."""
    folder.mkdir()
    expected: dict[bytes, bytes] = {}
    files = []
    for n, step in enumerate((1, 3, 7)):
        changes: list[tuple[bytes, bytes | None]] = []
        for i in range(0, 3000, step):
            if n and i % 2:
                changes.append((key(i), None))  # a tombstone over an older value
                expected.pop(key(i), None)
            else:
                changes.append((key(i), b"v%d-%d" % (n, i)))
                expected[key(i)] = b"v%d-%d" % (n, i)
        path = folder / f"{n}.sst"
        rocks.write_changes_sst(path, changes)
        files.append(path)
    return files, expected


def rows_of(database: Path) -> dict[bytes, bytes]:
    db = rocks.open_for_read(database)
    try:
        return dict(rocks.scan(db, b"", None))
    finally:
        rocks.close_quietly(db)


@pytest.fixture
def memory(monkeypatch) -> Path | None:
    """A memory folder of this test's own (in /dev/shm) where builds put their scratch
    folders (other processes' builds are elsewhere); ``None`` where there is none."""
    if not (sys.platform == "linux" and os.access(MEMORY, os.W_OK | os.X_OK)):
        monkeypatch.setattr(builds, "MEMORY_FOLDER", None)
        yield None
        return
    folder = Path(tempfile.mkdtemp(dir=MEMORY, prefix="iqkit-test-"))
    monkeypatch.setattr(builds, "MEMORY_FOLDER", folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def scratch_folders() -> set[str]:
    folder = builds.MEMORY_FOLDER
    if folder is None or not folder.is_dir():
        return set()
    return {n for n in os.listdir(folder) if n.startswith("iqkit-build-")}


@pytest.mark.parametrize("where", ["memory", "in place"])
def test_a_built_database_serves_the_chains_rows_and_shares_its_files(
    where, memory, tmp_path, monkeypatch
):
    if where == "memory" and memory is None:
        pytest.skip("no writable /dev/shm")
    if where == "in place":
        monkeypatch.setattr(builds, "MEMORY_FOLDER", None)
    files, expected = chain_files(tmp_path / "chain")
    before = {f: (f.read_bytes(), os.stat(f).st_mtime_ns) for f in files}
    scratch = scratch_folders()
    database = tmp_path / "db"
    builds.build_database(database, files)
    assert rows_of(database) == expected
    # Each source's bytes are in the database as a hard link (same inode, no copy),
    # unchanged; nothing of the build is left beside the database or in memory.
    inodes = {os.stat(p).st_ino for p in database.glob("*.sst")}
    assert inodes == {os.stat(f).st_ino for f in files}
    assert {f: (f.read_bytes(), os.stat(f).st_mtime_ns) for f in files} == before
    names = set(os.listdir(database))
    assert not [n for n in names if n.startswith(".")], names
    assert "CURRENT" in names
    if where == "memory":  # what RocksDB wrote beside the database stayed behind
        assert not names & {"LOCK", "LOG", "rocksdict-config.json"}, names
    assert scratch_folders() == scratch


@needs_memory
def test_a_build_in_memory_refuses_a_link_and_a_folder_and_names_them(memory, tmp_path):
    files, _ = chain_files(tmp_path / "chain")
    elsewhere = tmp_path / "elsewhere.sst"
    os.rename(files[1], elsewhere)
    files[1].symlink_to(elsewhere)
    scratch = scratch_folders()
    with pytest.raises(iqkit.StoreIOError, match="the-delta is a symbolic link") as info:
        builds.build_database(tmp_path / "db1", files, ["base", "the-delta", "last"])
    assert "\n" not in str(info.value)
    files[1].unlink()
    files[1].mkdir()
    with pytest.raises(iqkit.StoreIOError, match="the-delta is a folder"):
        builds.build_database(tmp_path / "db2", files, ["base", "the-delta", "last"])
    os.rmdir(files[1])
    with pytest.raises(iqkit.StoreNotFoundError, match="the-delta: a file of this version"):
        builds.build_database(tmp_path / "db3", files, ["base", "the-delta", "last"])
    assert scratch_folders() == scratch


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import iqkit
    from iqkit.store.partitions import builds as read
    from iqkit.store import cache

    step = sys.argv[2]
    read.MEMORY_FOLDER = None if sys.argv[3] == "-" else read.Path(sys.argv[3])
    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    if step == "ingest":  # RocksDB has part of the chain, in memory
        real = read.rocks.ingest
        calls = []
        def ingest(*args, **kwargs):
            real(*args, **kwargs)
            calls.append(1)
            if len(calls) == 2:
                die()
        read.rocks.ingest = ingest
    elif step == "move":  # the database is being moved into the cache
        read._link_open_file = die
    else:  # complete in its building folder, not yet renamed into place
        cache.FileCache.hold_new_database = die
    with iqkit.open(sys.argv[1]) as engine:
        # the first key lookup reads the files in place; the second builds the database
        for query in (iqkit.KeyQuery.with_key("k1"), iqkit.KeyQuery.with_key("k1").skip_cache()):
            engine.query(iqkit.StateQueryRequest.in_store("s").with_query(query))
    print("not killed")
    """
)


@pytest.mark.parametrize("step", ["ingest", "move", "publish"])
def test_a_build_killed_at_any_step_is_never_served(step, memory, tmp_path, monkeypatch):
    root = tmp_path / "root"
    iqkit.create_store(root, "s", partitions=1, value_serde="int64")
    for n in range(3):  # a chain of three files
        with iqkit.StoreWriter(root, "s") as w:
            for i in range(n, 500, 3):
                w.put(f"k{i}", i * 10 + n)
    cache = tmp_path / "cache"
    here = os.fspath(Path(__file__).resolve().parents[2])
    env = {**os.environ, "IQKIT_CACHE": os.fspath(cache)}
    env["PYTHONPATH"] = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])
    scratch = scratch_folders()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, os.fspath(root), step, os.fspath(memory or "-")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == -9, (done.stdout, done.stderr)
    assert not published(cache)
    assert [p for p in cache.rglob(f"{CACHE_BUILDING_PREFIX}*")]  # what it left
    left_in_memory = scratch_folders() - scratch
    if memory is not None and step != "publish":
        assert left_in_memory  # killed while RocksDB's files were in memory
    monkeypatch.setattr(builds, "_swept", set())  # as in a new process
    monkeypatch.setenv("IQKIT_CACHE", os.fspath(cache))
    with iqkit.open(root) as engine:
        trace = engine_trace(engine)  # the first query: it opens the partition
        rows = dict(engine_rows(engine))
    assert rows == {f"k{i}": i * 10 + i % 3 for i in range(500)}
    assert "database built (3 SST files)" in trace
    assert not left_in_memory & scratch_folders()  # swept by the next build


def published(cache: Path) -> list[Path]:
    """The database folders in ``cache`` a reader would open (not builds in progress)."""
    found = [p.parent for p in cache.rglob("dbs/**/CURRENT")]
    return [p for p in found if not p.name.startswith(".")]


def engine_rows(engine) -> list[tuple[str, int]]:
    req = iqkit.StateQueryRequest.in_store("s").with_query(iqkit.RangeQuery.with_no_bounds())
    result = engine.query(req).only_partition_result()
    assert result.is_success, result.failure_message
    return [(kv.key, kv.value) for kv in result.result]


def engine_trace(engine) -> str:
    """What opening the partition's database cost: the trace of the second key lookup
    (a partition's first one reads its files in place when no database is built yet)."""
    line = ""
    for query in (iqkit.KeyQuery.with_key("k1"), iqkit.KeyQuery.with_key("k1").skip_cache()):
        req = iqkit.StateQueryRequest.in_store("s").with_query(query).enable_execution_info()
        result = engine.query(req).only_partition_result()
        line = next(x for x in result.execution_info if x.startswith("Handled in FileCache"))
        if "read in place from the chain's SST files" not in line:
            return line
    return line


@pytest.mark.parametrize("lost", ["CURRENT", "MANIFEST"])
def test_a_published_database_a_power_loss_left_empty_is_built_again(lost, tmp_path, monkeypatch):
    # Builds are not synced: after a power loss the renamed folder may hold files with
    # none of their bytes. The next reader builds the database again and answers.
    root = tmp_path / "root"
    iqkit.create_store(root, "s", partitions=1, value_serde="int64")
    with iqkit.StoreWriter(root, "s") as w:
        for i in range(100):
            w.put(f"k{i}", i)
    monkeypatch.setenv("IQKIT_CACHE", os.fspath(tmp_path / "cache"))
    with iqkit.open(root) as engine:
        assert "database built" in engine_trace(engine)
    (database,) = published(tmp_path / "cache")
    for f in database.glob(f"{lost}*"):
        f.write_bytes(b"")
    with iqkit.open(root) as engine:
        assert "database built" in engine_trace(engine)
        assert dict(engine_rows(engine)) == {f"k{i}": i for i in range(100)}
    with iqkit.open(root) as engine:
        assert "database reused" in engine_trace(engine)


@needs_memory
def test_scratch_folders_a_killed_build_left_in_memory_are_swept(memory, tmp_path, monkeypatch):
    # A scratch folder nobody holds (its builder died) is removed by the next process's
    # first build; one a live build holds (a shared flock) stays, however old.
    dead = memory / "iqkit-build-dead"
    alive = memory / "iqkit-build-alive"
    for folder in (dead, alive):
        folder.mkdir()
        (folder / "MANIFEST-000005").write_bytes(b"x")
    held = os.open(alive, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_SH)
    try:
        stale = time.time() - 2 * 3600
        os.utime(alive, (stale, stale))
        monkeypatch.setattr(builds, "_swept", set())  # as in a new process
        files, expected = chain_files(tmp_path / "chain")
        builds.build_database(tmp_path / "db", files)
        assert rows_of(tmp_path / "db") == expected
        assert not dead.exists() and alive.exists()
    finally:
        os.close(held)
        for folder in (dead, alive):
            if folder.exists():
                shutil.rmtree(folder)


def test_side_files_are_what_a_reader_leaves_out():
    # The move into the cache leaves out exactly what readers' views leave out.
    assert {"LOCK", "LOG", "rocksdict-config.json"} == set(ROCKSDB_SIDE_FILES)


@needs_memory
def test_the_database_a_first_query_built_is_read_as_built_then_let_go(
    memory, tmp_path, monkeypatch
):
    # The build keeps its database open for the partition's first reads: every row is
    # served from it, its table files are the published database's (never a descriptor
    # number that may be reused), and closing the partition removes its memory folder.
    root = tmp_path / "root"  # rows enough for RocksDB (a small chain is read into memory)
    iqkit.create_store(root, "s", partitions=1, value_serde="int64")
    for n in range(3):
        with iqkit.StoreWriter(root, "s") as w:
            for i in range(n, 60_000, 3):
                w.put(f"k{i}", i * 10 + n)
            if n == 2:
                w.delete("k0")
    monkeypatch.setenv("IQKIT_CACHE", os.fspath(tmp_path / "cache"))
    expected = {f"k{i}": i * 10 + i % 3 for i in range(1, 60_000)}
    with iqkit.open(root) as engine:
        assert "database built (3 SST files)" in engine_trace(engine)
        (scratch,) = scratch_folders()
        (database,) = published(tmp_path / "cache")
        tables = list((memory / scratch).rglob("*.sst"))
        assert tables and all(t.is_symlink() for t in tables)
        assert {os.readlink(t) for t in tables} == {os.fspath(p) for p in database.glob("*.sst")}
        assert dict(engine_rows(engine)) == expected
        for k in ("k1", "k59999", "k0"):
            req = iqkit.StateQueryRequest.in_store("s").with_query(iqkit.KeyQuery.with_key(k))
            (result,) = engine.query(req).partition_results.values()
            assert result.is_success and result.result == expected.get(k)
    assert scratch_folders() == set()
    with iqkit.open(root) as engine:  # another reader: the published database, read-only
        assert "database reused" in engine_trace(engine)
        assert dict(engine_rows(engine)) == expected
        assert scratch_folders() == set()
