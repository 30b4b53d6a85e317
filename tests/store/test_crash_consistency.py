"""Crash consistency under real SIGKILLs, and readers racing a committing writer.

No mocks of RocksDB: writers are separate Python processes using the real
``StoreWriter`` against real RocksDB folders, and they are killed with SIGKILL
(no ``finally``, no ``atexit``, no RocksDB shutdown; open files, the ``flock`` on
``writer.lock`` and RocksDB's own LOCK go away only because the kernel cleans them up).

Every commit writes a whole *generation* g: keys ``k0..k49`` (string keys, int64 values,
4 partitions, murmur2) all get the value g with ``source=("in", 0, g)``, and the version
record gets ``metadata["generation"] = g``. A commit touches all four partitions and
publishes one version, so in every consistent version, each partition holds exactly its
keys, all with value g, at position ``{"in": {0: g}}``, and all four partitions have the
same g.

What the tests prove:

* ``test_sigkill_at_random_moments_never_exposes_a_torn_version``: a writer committing in
  a loop is killed at a random moment (0-300 ms after it starts committing),
  ``IQKIT_FAULT_ITERATIONS`` times (default 25). After each kill:
  (a) ``iqkit.open(root)`` serves a whole generation (MultiKeyQuery of all 50 keys,
  unbounded RangeQuery of every partition, KeyQuery, positions, the record's metadata),
  and the latest record's partition folders all exist;
  (b) nothing half-written is visible to a reader: every retained version (each opened
  with ``as_of``) is whole, generations rise strictly with versions, and the version above
  ``LATEST`` (which a killed commit may have half-built) cannot be opened;
  (c) a new ``StoreWriter`` commit in this process succeeds at once: the dead writer's
  staging folders, unpublished folders/records above ``LATEST`` and its lock do not block
  it (the lock is checked free right after the kill), and afterwards no debris is left
  and only the retained versions' folders remain (disk stays small);
  (d) the generation never goes backwards, and no commit whose ``commit()`` returned in the
  killed process is lost (at most the one in flight is published on top of it).
* ``test_sigkill_at_each_step_of_the_commit_protocol``: the same checks, with the kill
  placed deterministically at each step of the protocol (mid-checkpoint, after the
  WriteBatch but before the flush, between the renames, between the version record and
  ``LATEST``, before retention, between unpublishing records and removing folders, midway
  through removing a folder). The kill happens *inside* the real code path: the child
  wraps one function so that it SIGKILLs itself there. Kills before ``LATEST`` is replaced
  must leave the previous version; kills after it must leave the new one.
* ``test_readers_see_whole_generations_while_a_writer_commits_and_collects``: one process
  commits continuously with ``retention=2`` (so retention runs against the reader's leases
  after every commit) while a long-lived engine queries for ~3 s (KeyQuery, MultiKeyQuery
  of all keys, unbounded RangeQuery over all partitions and over each single partition).
  Every result is successful (never ``STORE_EXCEPTION``: no folder is deleted under a
  reader), every result set comes from one generation, and the generations (and
  ``engine.version``) observed never decrease. The writer is then SIGKILLed mid-stream;
  the engine must converge on the final ``LATEST``, and once it is closed, the next
  commit's retention must bring the disk back to the retained versions only.
"""

from __future__ import annotations

import fcntl
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import iqkit
from iqkit.store.layout import StoreLayout
from iqkit.store.names import STAGING_PREFIX
from iqkit.store.partitioners import murmur2_partition
from iqkit.store.rocks import database_exists
from iqkit.store.versions import list_versions, read_latest_number, read_version

REPO = Path(__file__).resolve().parents[2]
STORE = "gens"
PARTITIONS = 4
RETENTION = 2
KEYS = [f"k{i}" for i in range(50)]
KEYS_BY_PARTITION = {
    p: sorted(k for k in KEYS if murmur2_partition(k.encode(), PARTITIONS) == p)
    for p in range(PARTITIONS)
}
ITERATIONS = int(os.environ.get("IQKIT_FAULT_ITERATIONS", "25"))
READER_SECONDS = 3.0

# -- the writer process ------------------------------------------------------------------
# argv: root, first generation, mode. Mode "loop" commits generations first, first+1, ...
# until killed. Mode "kill:<point>" commits three generations, then arms <point> and
# commits a fourth, which SIGKILLs the process at that point of the commit protocol.
# Each commit that returns is reported as "committed <generation> <version>".
CHILD = r"""
import os, signal, sys
root, first, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
import iqkit
from iqkit.store import commit, layout, rocks, versions

KEYS = [f"k{i}" for i in range(50)]
armed = False
counts = {}


def die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def nth(name, n):
    # True on the n-th call (while armed) of the wrapped step called `name`.
    if not armed:
        return False
    counts[name] = counts.get(name, 0) + 1
    return counts[name] == n


class Proxy:
    # Delegates everything to `real`, except the attributes given as overrides.
    def __init__(self, real, **overrides):
        self.__dict__.update(overrides)
        self.__dict__["_real"] = real

    def __getattr__(self, name):
        return getattr(self._real, name)


point = mode.partition(":")[2]
if point == "mid-checkpoint":  # partition 2 checkpointed, its batch not written yet
    real_checkpoint = rocks.checkpoint

    def checkpoint(source, dest):
        real_checkpoint(source, dest)
        if nth("checkpoint", 3):
            die()

    rocks.checkpoint = checkpoint
elif point == "before-flush":  # partition 3's batch is in the WAL, not flushed
    real_open_for_write = rocks.open_for_write

    def open_for_write(path, *, create):
        db = real_open_for_write(path, create=create)

        def flush(wait):
            if nth("flush", 4):
                die()
            return db.flush(wait)

        return Proxy(db, flush=flush)

    rocks.open_for_write = open_for_write
elif point == "mid-rename":  # partitions 0, 1 renamed to <version>/, 2, 3 still staging
    real_rename = os.rename

    def rename(src, dst):
        if nth("rename", 3):
            die()
        real_rename(src, dst)

    commit.os = Proxy(os, rename=rename)
elif point == "before-latest":  # record <version>.json written, LATEST's temp file too
    real_atomic_write_text = versions.atomic_write_text

    def atomic_write_text(path, text):
        if armed and path.name == "LATEST":
            with open(path.with_name(f".{path.name}.{os.getpid()}.tmp"), "w") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            die()
        real_atomic_write_text(path, text)

    versions.atomic_write_text = atomic_write_text
elif point == "before-gc":  # published, retention not run
    real_collect_garbage = commit.collect_garbage

    def collect_garbage(layout, retain):
        if armed:
            die()
        return real_collect_garbage(layout, retain)

    commit.collect_garbage = collect_garbage
elif point == "mid-gc":  # expired records unlinked, their folders not removed
    real_remove = versions._remove_unreferenced_folders

    def remove_unreferenced_folders(layout, kept, cleanup):
        if armed:
            die()
        return real_remove(layout, kept, cleanup)

    versions._remove_unreferenced_folders = remove_unreferenced_folders
elif point == "mid-rmtree":  # an expired folder half removed: its SST files gone
    import shutil

    def rmtree(path, ignore_errors=False):
        if armed:
            for name in sorted(os.listdir(path)):
                if name.endswith(".sst"):
                    os.unlink(os.path.join(path, name))
            die()
        shutil.rmtree(path, ignore_errors=ignore_errors)

    layout.shutil = Proxy(shutil, rmtree=rmtree)
elif point:
    raise SystemExit(f"unknown kill point {point!r}")


def commit(g):
    with iqkit.StoreWriter(root, "gens", who="crash-child") as w:
        for k in KEYS:
            w.put(k, g, source=("in", 0, g))
        w.set_metadata(generation=g)
    print(f"committed {g} {w.version}", flush=True)


print("ready", flush=True)
g = first
if point:
    for g in range(first, first + 3):
        commit(g)
    armed = True
    commit(first + 3)
    raise SystemExit(3)  # the kill point was never reached
while True:
    commit(g)
    g += 1
"""


class Child:
    """A writer process running ``CHILD``."""

    def __init__(self, root: Path, first: int, mode: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), str(first), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.stdout = b""
        self.stderr = b""
        self.done = False

    def wait_ready(self, timeout: float = 60.0) -> None:
        assert self.proc.stdout is not None
        readable, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if readable else b""
        if line.strip() != b"ready":
            self.kill()
            pytest.fail(f"writer process did not start: {line!r} {self.stderr.decode()}")

    def kill(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.finish()

    def finish(self, timeout: float = 60.0) -> int:
        if not self.done:
            out, err = self.proc.communicate(timeout=timeout)
            self.stdout += out
            self.stderr += err
            self.done = True
        return self.proc.returncode

    def committed(self) -> list[tuple[int, int]]:
        """(generation, version) of every commit that returned in the child."""
        return [
            (int(g), int(v))
            for kind, g, v in (line.split() for line in self.stdout.decode().splitlines())
            if kind == "committed"
        ]

    def describe(self) -> str:
        return f"rc={self.proc.returncode} stderr:\n{self.stderr.decode()[-3000:]}"


# -- helpers -------------------------------------------------------------------------------
def request(query: iqkit.Query) -> iqkit.StateQueryRequest:
    return iqkit.StateQueryRequest.in_store(STORE).with_query(query)


def position(g: int) -> iqkit.Position:
    return iqkit.Position.from_map({"in": {0: g}})


def new_store(root: Path) -> StoreLayout:
    iqkit.create_store(
        root,
        STORE,
        partitions=PARTITIONS,
        key_serde="string",
        value_serde="int64",
        partitioner="murmur2",
        retention=RETENTION,
    )
    return StoreLayout.of(root, STORE)


def commit_generation(root: Path, g: int) -> int:
    """Commit generation ``g`` from this process; the dead writer must not block it."""
    with iqkit.StoreWriter(root, STORE, lock_timeout=5.0, who="test-parent") as w:
        for k in KEYS:
            w.put(k, g, source=("in", 0, g))
        w.set_metadata(generation=g)
    assert w.version is not None
    return w.version


def drain(result: iqkit.QueryResult) -> dict[str, int]:
    with result.result as it:
        return {kv.key: kv.value for kv in it}


def partition_generation(p: int, qr: iqkit.QueryResult, values: dict[str, int]) -> int:
    """The one generation partition ``p``'s result holds (all its keys, one value)."""
    assert sorted(values) == KEYS_BY_PARTITION[p], f"partition {p}: keys {sorted(values)}"
    gens = set(values.values())
    assert len(gens) == 1, f"partition {p} mixes generations {sorted(gens)}"
    g = gens.pop()
    assert qr.position == position(g), f"partition {p}: position {qr.position} for g={g}"
    return g


def query_generation(engine: iqkit.StateEngine, rng: random.Random) -> int:
    """Read the store every way the tests use; all must agree on one generation."""
    multi = engine.query(request(iqkit.MultiKeyQuery.with_keys(KEYS))).partition_results
    scan = engine.query(request(iqkit.RangeQuery.with_no_bounds())).partition_results
    assert sorted(multi) == sorted(scan) == list(range(PARTITIONS))
    gens = set()
    for p in range(PARTITIONS):
        for qr in (multi[p], scan[p]):
            assert qr.is_success, f"partition {p}: {qr.failure_reason} {qr.failure_message}"
        gens.add(partition_generation(p, multi[p], multi[p].result))
        gens.add(partition_generation(p, scan[p], drain(scan[p])))
    key = rng.choice(KEYS)
    single = engine.query(request(iqkit.KeyQuery.with_key(key))).only_partition_result()
    assert single is not None and single.is_success
    gens.add(single.result)
    assert single.position == position(single.result)
    assert len(gens) == 1, f"one engine version, several generations: {sorted(gens)}"
    return gens.pop()


def assert_lock_free(layout: StoreLayout) -> None:
    """The dead writer's flock on writer.lock is gone (the kernel released it)."""
    fd = os.open(layout.lock_file, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if still held
    finally:
        os.close(fd)


def check_store(
    root: Path, rng: random.Random, violations: list[str], label: str
) -> tuple[int, int]:
    """(a)+(b): the latest and every retained version are whole; nothing else is
    readable. Returns (latest version, its generation)."""
    layout = StoreLayout.of(root, STORE)
    latest = read_latest_number(layout)
    assert latest is not None, "LATEST vanished"
    retained = list_versions(layout)
    assert retained and retained[-1] == latest, f"retained {retained}, LATEST {latest}"
    gens = []
    for v in retained:
        record = read_version(layout, v)
        assert record.version == v
        assert sorted(record.partitions) == list(range(PARTITIONS)), record.partitions
        for p, m in record.partitions.items():
            folder = layout.partition_version_dir(p, m)
            assert m <= v and database_exists(folder), f"version {v} names missing {folder}"
        with iqkit.open(root, as_of=v) as pinned:
            g = query_generation(pinned, rng)
        assert record.metadata["generation"] == g, f"version {v}: record says {record.metadata}"
        gens.append(g)
    assert gens == sorted(set(gens)), f"generations of versions {retained}: {gens}"
    with iqkit.open(root) as engine:
        assert engine.version(STORE) == latest
        assert query_generation(engine, rng) == gens[-1]
    # A version above LATEST was never published: no reader may open it. A killed commit
    # can leave versions/<LATEST+1>.json behind (killed between the record and LATEST);
    # if as_of serves it, the next commit rebuilds that version number under the reader.
    try:
        with iqkit.open(root, as_of=latest + 1) as engine:
            engine.version(STORE)
    except ValueError:
        pass
    else:
        violations.append(
            f"{label}: iqkit.open(root, as_of={latest + 1}) served the unpublished version "
            f"{latest + 1} (LATEST is {latest}; versions/{latest + 1}.json was left by the "
            "killed commit, and the next commit rebuilds that version number)"
        )
    return latest, gens[-1]


def assert_no_debris(layout: StoreLayout) -> None:
    """(c): after a successful commit, only the retained versions remain on disk."""
    retained = list_versions(layout)
    referenced = {(p, m) for v in retained for p, m in read_version(layout, v).partitions.items()}
    on_disk = set()
    for p in range(PARTITIONS):
        for name in os.listdir(layout.partition_dir(p)):
            assert not name.startswith(STAGING_PREFIX), f"staging debris {p}/{name}"
            assert name.isdigit(), f"unexpected {p}/{name}"
            on_disk.add((p, int(name)))
    assert on_disk == referenced, f"folders {sorted(on_disk - referenced)} not referenced"
    records = sorted(
        int(n.split(".")[0]) for n in os.listdir(layout.versions_dir) if n[0].isdigit()
    )
    assert records == retained, f"records {records}, retained {retained}"
    assert not layout.leases_dir.exists() or not os.listdir(layout.leases_dir)


def debris_after_kill(layout: StoreLayout, latest: int) -> list[str]:
    """What the killed commit left (before the next commit cleans it), for the report."""
    found = []
    for p in range(PARTITIONS):
        names = os.listdir(layout.partition_dir(p))
        if any(n.startswith(STAGING_PREFIX) for n in names):
            found.append("staging folder")
        if any(n.isdigit() and int(n) > latest for n in names):
            found.append("folder above LATEST")
    if layout.version_record(latest + 1).exists():
        found.append("record above LATEST")
    return sorted(set(found))


def temp_files(layout: StoreLayout) -> list[str]:
    """atomic_write_text's temporary files left by killed writers (not cleaned up)."""
    return [
        n
        for d in (layout.store_dir, layout.versions_dir)
        for n in os.listdir(d)
        if n.endswith(".tmp")
    ]


def fault_rng() -> tuple[int, random.Random]:
    seed = int(os.environ.get("IQKIT_FAULT_SEED", str(time.time_ns() % 1_000_000)))
    return seed, random.Random(seed)


# -- 1. random kills -------------------------------------------------------------------------
@pytest.mark.slow
def test_sigkill_at_random_moments_never_exposes_a_torn_version(tmp_path):
    assert all(KEYS_BY_PARTITION.values()), "every partition must own some keys"
    seed, rng = fault_rng()
    root = tmp_path / "stores"
    layout = new_store(root)
    commit_generation(root, 1)
    g, violations, landed = 1, [], Counter()
    started = time.monotonic()
    for i in range(ITERATIONS):
        label = f"iteration {i} (IQKIT_FAULT_SEED={seed})"
        child = Child(root, g + 1, "loop")
        child.wait_ready()
        time.sleep(rng.uniform(0.0, 0.3))
        rc = child.kill()
        assert rc == -signal.SIGKILL, f"{label}: writer died on its own: {child.describe()}"
        assert_lock_free(layout)
        committed = child.committed()
        durable = committed[-1][0] if committed else g  # the last commit that returned

        latest, observed = check_store(root, rng, violations, label)
        # (d) nothing returned is lost, at most the in-flight commit is added, never back.
        assert durable <= observed <= durable + 1, f"{label}: {observed=} {durable=}"
        assert observed >= g, f"{label}: generation went back from {g} to {observed}"
        landed["killed after publishing" if observed > durable else "killed before LATEST"] += 1
        for what in debris_after_kill(layout, latest):
            landed[what] += 1

        # (c) a fresh commit succeeds at once and cleans up after the dead writer.
        g = observed + 1
        assert commit_generation(root, g) == latest + 1, label
        assert check_store(root, rng, violations, label) == (latest + 1, g)
        assert_no_debris(layout)
    elapsed = time.monotonic() - started
    print(
        f"\n{ITERATIONS} kill iterations in {elapsed:.1f}s (seed {seed}), final generation "
        f"{g}; kills: {dict(sorted(landed.items()))}; leftover temp files: "
        f"{len(temp_files(layout))}"
    )
    assert not violations, "\n".join(violations)


# -- 1b. a kill at each step of the commit protocol -------------------------------------------
KILL_POINTS = {
    # point: does the killed commit end up published?
    "mid-checkpoint": False,
    "before-flush": False,
    "mid-rename": False,
    "before-latest": False,
    "before-gc": True,
    "mid-gc": True,
    "mid-rmtree": True,
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_sigkill_at_each_step_of_the_commit_protocol(tmp_path, point):
    rng = random.Random(0)
    root = tmp_path / "stores"
    layout = new_store(root)
    child = Child(root, 1, f"kill:{point}")
    child.wait_ready()
    rc = child.finish()
    assert rc == -signal.SIGKILL, f"kill point {point} not reached: {child.describe()}"
    assert [g for g, _ in child.committed()] == [1, 2, 3]
    assert_lock_free(layout)

    violations: list[str] = []
    latest, observed = check_store(root, rng, violations, point)
    assert (latest, observed) == ((4, 4) if KILL_POINTS[point] else (3, 3))
    assert commit_generation(root, 5) == latest + 1
    assert check_store(root, rng, violations, point) == (latest + 1, 5)
    assert_no_debris(layout)
    assert not violations, "\n".join(violations)


# -- 2. readers during writes ------------------------------------------------------------------
@pytest.mark.slow
def test_readers_see_whole_generations_while_a_writer_commits_and_collects(tmp_path):
    rng = random.Random(1)
    root = tmp_path / "stores"
    layout = new_store(root)
    commit_generation(root, 1)
    engine = iqkit.open(root)
    child = Child(root, 2, "loop")
    try:
        child.wait_ready()
        last_g, last_version = 0, 0
        versions_seen: set[int] = set()
        queries = 0

        def seen(g: int, what: str) -> None:
            nonlocal last_g
            assert g >= last_g, f"{what}: generation went back from {last_g} to {g}"
            last_g = g

        # ~3 s of queries; longer only if the writer was too slow to publish 5 versions.
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < READER_SECONDS or (
            len(versions_seen) < 5 and elapsed < 30
        ):
            version = engine.version(STORE)
            assert version is not None and version >= last_version
            last_version = version
            versions_seen.add(version)

            key = rng.choice(KEYS)
            qr = engine.query(request(iqkit.KeyQuery.with_key(key))).only_partition_result()
            assert qr is not None and qr.is_success, f"KeyQuery: {qr}"
            assert qr.position == position(qr.result)
            seen(qr.result, "KeyQuery")

            multi = engine.query(request(iqkit.MultiKeyQuery.with_keys(KEYS))).partition_results
            assert sorted(multi) == list(range(PARTITIONS))
            gens = set()
            for p, r in multi.items():
                assert r.is_success, f"MultiKeyQuery p{p}: {r.failure_reason} {r.failure_message}"
                gens.add(partition_generation(p, r, r.result))
            assert len(gens) == 1, f"one MultiKeyQuery, generations {sorted(gens)}"
            seen(gens.pop(), "MultiKeyQuery")

            scan = engine.query(request(iqkit.RangeQuery.with_no_bounds())).partition_results
            gens = set()
            for p, r in scan.items():
                assert r.is_success, f"RangeQuery p{p}: {r.failure_reason} {r.failure_message}"
                gens.add(partition_generation(p, r, drain(r)))
            assert len(gens) == 1, f"one RangeQuery, generations {sorted(gens)}"
            seen(gens.pop(), "RangeQuery")

            for p in range(PARTITIONS):
                req = request(iqkit.RangeQuery.with_no_bounds()).with_partitions({p})
                r = engine.query(req).partition_results[p]
                assert r.is_success, f"RangeQuery p{p}: {r.failure_reason} {r.failure_message}"
                seen(partition_generation(p, r, drain(r)), f"RangeQuery of partition {p}")
            queries += 3 + PARTITIONS
        assert child.proc.poll() is None, f"writer died: {child.describe()}"
        rc = child.kill()
        assert rc == -signal.SIGKILL, child.describe()
        # Enough commits happened under the reader for the test to mean something.
        assert len(versions_seen) >= 5, f"only versions {sorted(versions_seen)} seen"

        # The writer is dead: the long-lived engine converges on the final LATEST.
        latest = read_latest_number(layout)
        assert engine.version(STORE) == latest
        final = query_generation(engine, rng)
        assert final == read_version(layout, latest).metadata["generation"] >= last_g
        durable = child.committed()[-1][0]
        assert durable <= final <= durable + 1
        print(
            f"\nreader: {queries} queries over {elapsed:.1f}s, {len(versions_seen)} "
            f"versions seen ({min(versions_seen)}..{max(versions_seen)}), final version {latest}"
        )
    finally:
        child.kill()
        engine.close()
    # With the reader gone, the next commit's retention brings the disk back to
    # the retained versions only (the reader's leases were all released).
    assert commit_generation(root, final + 1) == latest + 1
    assert_no_debris(layout)
