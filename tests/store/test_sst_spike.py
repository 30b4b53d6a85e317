"""Spike: a partition version as immutable SST files, proven with rocksdict (issue 13.5).

The format this proves (docs/DECISIONS.md, "The SST chain"): a partition version is a
chain of SST files (one base, then one delta per commit, tombstones for deletes) under
unique names, listed in order by one small version record published with
``create_exclusive``. A reader pins the chain's files in the local cache, builds an empty
RocksDB beside them and ingests the files in order with ``move_files`` from hard links
(so cache and database share the bytes), then opens it read-only. A commit uploads only
its new delta; compaction folds a chain into a new base.

Run as a script to measure open times (the numbers in DECISIONS.md)::

    .venv/bin/python tests/store/test_sst_spike.py --keys 1000000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from rocksdict import Options, SstFileWriter

from iqkit.errors import ObjectExistsError
from iqkit.store import rocks
from iqkit.store.cache import FileCache
from iqkit.store.objects import ObjectStore, open_objects

Change = tuple[bytes, bytes | None]  # value None: a delete (a tombstone in the delta)


# -- the spike's writer ------------------------------------------------------------------
def write_delta_sst(path: Path, changes: Iterable[Change]) -> int:
    """An SST of puts and tombstones, keys strictly increasing (``SstFileWriter`` refuses
    anything else). Raw mode as the database's (quirk: default options pickle values).
    ``rocks.write_sst`` writes puts only; the format module will add deletes there."""
    writer = SstFileWriter(Options(raw_mode=True))
    writer.open(os.fspath(path))
    count = 0
    for key, value in changes:
        if value is None:
            del writer[key]
        else:
            writer[key] = value
        count += 1
    writer.finish()
    return count


def commit(
    objects: ObjectStore,
    work: Path,
    version: int,
    changes: list[Change],
    parent: dict | None,
    *,
    base: bool = False,
) -> dict:
    """Upload one new SST, then publish version ``version`` of partition 0 (the record
    lists the parent's files plus the new one, or just the new base)."""
    name = f"t/sst/0/{version:06d}-{uuid.uuid4().hex}.sst"
    local = work / name.rsplit("/", 1)[1]
    if base:
        rocks.write_sst(local, ((k, v) for k, v in changes if v is not None))
    else:
        write_delta_sst(local, changes)
    objects.put_immutable(name, local)
    files = [name] if base or parent is None else [*parent["files"], name]
    record = {"version": version, "partition": 0, "files": files}
    objects.create_exclusive(f"t/versions/0/{version}.json", json.dumps(record).encode())
    return record


def read_record(objects: ObjectStore, version: int) -> dict:
    return json.loads(objects.read_bytes(f"t/versions/0/{version}.json"))


# -- the spike's reader ------------------------------------------------------------------
def materialize(cache: FileCache, objects: ObjectStore, record: dict) -> tuple[Path, list]:
    """Build the version's RocksDB in the cache from its SSTs; returns its folder and
    the pins (held while the database is in use)."""
    pins = [cache.pin(objects, key) for key in record["files"]]
    db_dir = cache.folder / "dbs" / f"v{record['version']}-{uuid.uuid4().hex[:8]}"
    db_dir.parent.mkdir(parents=True, exist_ok=True)
    db = rocks.open_for_write(db_dir, create=True)
    try:
        for pin in pins:
            # ingest with move_files removes what it was given: hand it a second link,
            # so the cached file stays and the database shares its bytes
            stage = db_dir.parent / f".ingest-{uuid.uuid4().hex}.sst"
            os.link(pin.path, stage)
            rocks.ingest(db, [stage])
    finally:
        rocks.close_quietly(db)
    return db_dir, pins


def read_all(db_dir: Path) -> dict[bytes, bytes]:
    db = rocks.open_for_read(db_dir)
    try:
        return dict(db.items())
    finally:
        rocks.close_quietly(db)


def compact(cache: FileCache, objects: ObjectStore, work: Path, record: dict) -> dict:
    """Fold a version's chain into one new base SST (tombstones dropped) and publish it as
    the next version; older versions keep their files until retention drops them."""
    db_dir, pins = materialize(cache, objects, record)
    try:
        rows = sorted(read_all(db_dir).items())
    finally:
        for pin in pins:
            pin.release()
    return commit(objects, work, record["version"] + 1, list(rows), record, base=True)


def key(i: int) -> bytes:
    return b"\x01" + i.to_bytes(8, "big")


def random_changes(rnd: random.Random, n: int, version: int, share: float) -> list[Change]:
    """About ``share`` of the keys changed, a tenth of them deleted, a few new keys."""
    picked = {rnd.randrange(n + n // 10) for _ in range(max(1, int(n * share)))}
    return [
        (key(i), None if rnd.random() < 0.1 else b"v%d-%d" % (version, i)) for i in sorted(picked)
    ]


# -- tests --------------------------------------------------------------------------------
@pytest.fixture(params=["local", "s3"])
def objects(request, tmp_path):
    if request.param == "local":
        return open_objects(tmp_path / "root")
    return open_objects(request.getfixturevalue("s3_root"))


@pytest.fixture
def work(tmp_path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


def _apply(model: dict[bytes, bytes], changes: list[Change]) -> None:
    for k, v in changes:
        if v is None:
            model.pop(k, None)
        else:
            model[k] = v


def test_a_chain_reads_newest_first_with_deletes_applied(objects, work, tmp_path):
    rnd, n = random.Random(7), 3000
    model: dict[bytes, bytes] = {}
    a, b, c = key(10**6 + 5), key(10**6 + 6), key(10**6 + 7)  # beyond the random keys
    base = [(key(i), b"v1-%d" % i) for i in range(n)] + [(a, b"first"), (b, b"first")]
    _apply(model, base)
    record = commit(objects, work, 1, base, None, base=True)
    # pinned cases: updated twice, deleted then re-put, new then deleted
    steps = [
        [(a, b"second"), (b, None), (c, b"x")],
        [(a, b"third"), (b, b"back"), (c, None)],
    ]
    steps += [random_changes(rnd, n, v, 0.05) for v in (4, 5, 6)]
    for version, changes in enumerate(steps, start=2):
        record = commit(objects, work, version, changes, record)
        _apply(model, changes)
    assert len(record["files"]) == 6

    cache = FileCache(tmp_path / "cache")
    db_dir, _ = materialize(cache, objects, read_record(objects, 6))
    got = read_all(db_dir)
    assert got == model  # every key, newest value, deleted keys absent
    assert (got[a], got[b], c in got) == (b"third", b"back", False)
    assert list(got) == sorted(got)  # byte order, as RocksDB iterates


def test_ingestion_links_cached_files_and_never_changes_them(objects, work, tmp_path):
    record = commit(objects, work, 1, [(key(i), b"a") for i in range(500)], None, base=True)
    record = commit(objects, work, 2, [(key(3), None), (key(9), b"b")], record)
    cache = FileCache(tmp_path / "cache")
    db_dir, pins = materialize(cache, objects, record)
    db_inodes = {f.stat().st_ino for f in db_dir.iterdir() if f.suffix == ".sst"}
    for pin in pins:
        st = pin.path.stat()
        assert st.st_ino in db_inodes and st.st_nlink == 2  # shared, not copied
        local = work / pin.path.name
        assert _sha(pin.path) == _sha(local)  # ingestion wrote no sequence number into it
    assert not list(db_dir.parent.glob(".ingest-*"))  # RocksDB removed the staging links
    assert read_all(db_dir)[key(9)] == b"b"


def test_a_commit_uploads_only_its_new_sst_and_a_reader_fetches_only_that(objects, work, tmp_path):
    rows = [(key(i), b"%d" % i) for i in range(5000)]
    record = commit(objects, work, 1, rows, None, base=True)
    cache = FileCache(tmp_path / "cache")
    materialize(cache, objects, record)
    before_objects = set(objects.list("t"))
    before_stats = cache.stats.copy()

    record = commit(objects, work, 2, [(key(1), b"new")], record)
    added = set(objects.list("t")) - before_objects
    new_sst = record["files"][-1]
    assert added == {new_sst, "t/versions/0/2.json"}
    assert objects.size(new_sst) < objects.size(record["files"][0]) / 10

    db_dir, _ = materialize(cache, objects, record)
    fetched = cache.stats.since(before_stats)
    assert (fetched.files_fetched, fetched.hits) == (1, 1)
    assert fetched.bytes_fetched == objects.size(new_sst)
    assert read_all(db_dir)[key(1)] == b"new"


def test_compaction_folds_a_chain_into_one_base(objects, work, tmp_path):
    rnd, n = random.Random(3), 2000
    model: dict[bytes, bytes] = {}
    base = [(key(i), b"v1-%d" % i) for i in range(n)]
    _apply(model, base)
    record = commit(objects, work, 1, base, None, base=True)
    for version in range(2, 6):
        changes = random_changes(rnd, n, version, 0.05)
        record = commit(objects, work, version, changes, record)
        _apply(model, changes)
    cache = FileCache(tmp_path / "cache")
    compacted = compact(cache, objects, work, record)
    assert compacted["version"] == 6 and len(compacted["files"]) == 1
    db_dir, _ = materialize(cache, objects, compacted)
    assert read_all(db_dir) == model
    assert len(read_record(objects, 5)["files"]) == 5  # the old chain is still readable


def test_two_writers_cannot_both_publish_a_version(objects, work):
    record = commit(objects, work, 1, [(key(1), b"a")], None, base=True)
    commit(objects, work, 2, [(key(1), b"mine")], record)
    with pytest.raises(ObjectExistsError):
        commit(objects, work, 2, [(key(1), b"theirs")], record)
    assert read_record(objects, 2)["files"][-1] in objects.list("t/sst")
    # the loser's SST is an orphan under a unique name: retention's to remove, never read
    assert len(objects.list("t/sst")) == 3


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- measurement (not a test) -----------------------------------------------------------
def measure(keys: int, chains: list[int], share: float, folder: Path) -> Iterator[str]:
    objects = open_objects(folder / "root")
    work = folder / "work"
    work.mkdir()
    rnd = random.Random(1)
    started = time.perf_counter()
    record = commit(
        objects, work, 1, [(key(i), b"value-%d" % i) for i in range(keys)], None, base=True
    )
    yield (
        f"base: {keys:,} keys, {objects.size(record['files'][0]) / 1e6:.1f} MB SST, "
        f"written and stored in {time.perf_counter() - started:.2f} s"
    )
    records = {0: record}
    for version in range(1, max(chains) + 1):
        record = commit(
            objects, work, version + 1, random_changes(rnd, keys, version, share), record
        )
        records[version] = record
    delta = objects.size(records[1]["files"][-1]) if len(records) > 1 else 0
    yield f"each delta: {share:.0%} of the keys changed ({delta / 1e6:.2f} MB SST)"
    cache = FileCache(folder / "cache")
    for k in chains:
        for pin in [cache.pin(objects, f) for f in records[k]["files"]]:
            pin.release()  # warm: the numbers are RocksDB's, not the copy's
        best = []
        for _ in range(3):
            t0 = time.perf_counter()
            db_dir, pins = materialize(cache, objects, records[k])
            t1 = time.perf_counter()
            db = rocks.open_for_read(db_dir)
            db.get(key(keys // 2))
            t2 = time.perf_counter()
            rocks.close_quietly(db)
            for pin in pins:
                pin.release()
            shutil.rmtree(db_dir)
            best.append((t2 - t0, t1 - t0, t2 - t1))
        total, build, opened = min(best)
        yield (
            f"1 base + {k:>2} deltas: build (ingest) {build * 1000:7.1f} ms, open "
            f"read-only + first get {opened * 1000:6.1f} ms, total {total * 1000:7.1f} ms"
        )


if __name__ == "__main__":
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--share", type=float, default=0.01)
    parser.add_argument("--chains", default="0,1,4,16")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for line in measure(
            args.keys, [int(c) for c in args.chains.split(",")], args.share, Path(tmp)
        ):
            print(line, flush=True)
    sys.exit(0)
