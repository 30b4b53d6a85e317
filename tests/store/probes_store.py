"""Reliability probes of the store layer (rows of RELIABILITY.md; see
``tests/reliability/registry.py``). Each raises ``AssertionError`` on a broken invariant
and reports what it checked and what was lost.

The crash probes use the *generation store* of ``tests/faults.py``: writers are separate
processes SIGKILLed at random moments or at each step of the commit protocol, and after
every kill (a) ``iqkit.open(root)`` serves a whole generation, (b) every retained version
(opened with ``as_of``) is whole, generations rise with versions, the version above
``LATEST`` a killed commit may have half-built cannot be opened, (c) a new commit in this
process succeeds at once, cleaning up after the dead writer, and (d) no commit whose
``commit()`` returned in the killed process is lost.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

from faults import (
    KEYS,
    KEYS_BY_PARTITION,
    KILL_POINTS,
    PARTITIONS,
    STORE,
    Child,
    assert_lock_free,
    assert_no_debris,
    check_store,
    child_env,
    commit_generation,
    commit_one_key_and_read,
    debris_after_kill,
    describe_changes,
    drain,
    folders_on_disk,
    kill_at_random,
    new_store,
    open_store_files,
    partition_generation,
    position,
    query_generation,
    read_session,
    referenced_folders,
    request,
    run_read_only,
    temp_files,
    tree_state,
)
from helpers import kv_rows, write_notebook_stores
from registry import Outcome, probe

import iqkit
from iqkit import FailureReason
from iqkit.store.layout import StoreLayout
from iqkit.store.versions import list_versions, read_latest_number, read_version


# -- writers killed ------------------------------------------------------------------------
@probe(
    "SIGKILLed writer, random moment",
    store_format="folder",
    fault="a process committing generations in a loop is SIGKILLed 0-300 ms after it starts; "
    "the store must be whole at every retained version and take the next commit at once",
    unit="kill",
    fast=8,
    long=300,
)
def sigkill_writer_at_random(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    assert all(KEYS_BY_PARTITION.values()), "every partition must own some keys"
    root = workdir / "stores"
    layout = new_store(root)
    commit_generation(root, 1)
    g, violations, landed = 1, [], Counter()
    returned = lost = 0
    for i in range(iterations):
        label = f"kill {i}"
        committed = kill_at_random(Child(root, g + 1, "loop"), rng, layout, label)
        returned += len(committed)
        durable = committed[-1][0] if committed else g  # the last commit that returned

        latest, observed = check_store(root, rng, violations, label)
        # (d) nothing returned is lost, at most the in-flight commit is added, never back.
        lost += max(0, durable - observed)
        assert observed <= durable + 1, f"{label}: {observed=} {durable=}"
        assert observed >= g, f"{label}: generation went back from {g} to {observed}"
        landed["after publishing" if observed > durable else "before LATEST"] += 1
        for what in debris_after_kill(layout, latest):
            landed[f"left a {what}"] += 1

        # (c) a fresh commit succeeds at once and cleans up after the dead writer.
        g = max(observed, durable) + 1
        assert commit_generation(root, g) == latest + 1, label
        assert check_store(root, rng, violations, label) == (latest + 1, g)
        assert_no_debris(layout)
    assert not violations, "\n".join(violations)
    return Outcome(
        checked=f"{returned} commits returned in killed writers; {g} generations",
        lost=lost,
        lost_detail="generations whose commit returned but are not in the store",
        notes=[
            "kills landed " + ", ".join(f"{n}× {what}" for what, n in sorted(landed.items())),
            f"{len(temp_files(layout))} temp files of killed atomic writes left (removed by "
            "the next commit under the lock)",
        ],
    )


@probe(
    "SIGKILLed writer, each commit step",
    store_format="folder",
    fault="the writer SIGKILLs itself inside the real code path at each of 7 steps: "
    "mid-checkpoint, before the flush, mid-rename, between record and LATEST, before "
    "retention, between unpublishing records and removing folders, mid-folder-removal",
    unit="round of 7 kills",
    fast=1,
    long=10,
)
def sigkill_writer_at_each_step(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    kills = 0
    for round_ in range(iterations):
        for point, published in KILL_POINTS.items():
            root = workdir / f"{round_}-{point}" / "stores"
            layout = new_store(root)
            child = Child(root, 1, f"kill:{point}")
            child.wait_ready()
            rc = child.finish()
            assert rc == -signal.SIGKILL, f"kill point {point} not reached: {child.describe()}"
            assert [g for g, _ in child.committed()] == [1, 2, 3], point
            assert_lock_free(layout)
            violations: list[str] = []
            latest, observed = check_store(root, rng, violations, point)
            # Kills before LATEST must leave the previous version, after it the new one.
            assert (latest, observed) == ((4, 4) if published else (3, 3)), point
            assert commit_generation(root, 5) == latest + 1, point
            assert check_store(root, rng, violations, point) == (latest + 1, 5), point
            assert_no_debris(layout)
            assert not violations, "\n".join(violations)
            kills += 1
            shutil.rmtree(root.parent, ignore_errors=True)
    return Outcome(checked=f"{kills} kills, 3 returned commits each", lost=0)


@probe(
    "Readers during commits and retention (soak)",
    store_format="folder",
    fault="a long-lived engine queries (key, multi-key, range of all and of each partition) "
    "while another process commits with retention 2, then the writer is SIGKILLed",
    unit="reader round",
    fast=40,
    long=150000,
)
def readers_during_commits(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    root = workdir / "stores"
    layout = new_store(root)
    commit_generation(root, 1)
    engine = iqkit.open(root)
    child = Child(root, 2, "loop")
    queries = rounds = 0
    try:
        child.wait_ready()
        last_g, last_version = 0, 0
        versions_seen: set[int] = set()

        def seen(g: int, what: str) -> None:
            nonlocal last_g
            assert g >= last_g, f"{what}: generation went back from {last_g} to {g}"
            last_g = g

        started = time.monotonic()
        # At least `iterations` rounds; more only if the writer was too slow to publish 5
        # versions under the reader.
        while rounds < iterations or (len(versions_seen) < 5 and time.monotonic() - started < 30):
            rounds += 1
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
        # Enough commits happened under the reader for the run to mean something.
        assert len(versions_seen) >= 5, f"only versions {sorted(versions_seen)} seen"

        # The writer is dead: the long-lived engine converges on the final LATEST.
        latest = read_latest_number(layout)
        assert engine.version(STORE) == latest
        final = query_generation(engine, rng)
        assert final == read_version(layout, latest).metadata["generation"] >= last_g
        durable = child.committed()[-1][0]
        assert final <= durable + 1
        lost = max(0, durable - final)
    finally:
        child.kill()
        engine.close()
    # With the reader gone, the next commit's retention brings the disk back to the
    # retained versions only (the reader's leases were all released).
    assert commit_generation(root, final + 1) == latest + 1
    assert_no_debris(layout)
    return Outcome(
        checked=f"{queries} queries over {len(versions_seen)} versions; none failed or mixed "
        "generations",
        lost=lost,
        lost_detail="generations whose commit returned but are not in the store",
    )


# -- damaged store files -------------------------------------------------------------------
def _damage(layout: StoreLayout, kind: str, rng: random.Random) -> Path:
    """Damage one file as ``kind`` says; return the file errors must name."""
    latest = read_latest_number(layout)
    assert latest is not None
    record = layout.version_record(latest)
    if kind == "LATEST missing":
        layout.latest.unlink()
        return layout.latest
    if kind == "LATEST past the records":
        layout.latest.write_text(f"{latest + rng.randint(1, 50)}\n")
        return layout.version_record(int(layout.latest.read_text()))
    if kind == "latest record missing":
        record.unlink()
        return record
    if kind == "LATEST garbage":
        layout.latest.write_bytes(rng.choice([b"", b"x\n", b"-3\n", b"1.5\n", "٣\n".encode()]))
        return layout.latest
    if kind == "record wrong version":
        record.write_text(record.read_text().replace(f'"version": {latest}', '"version": 999'))
        return record
    path = {"LATEST": layout.latest, "record": record, "manifest": layout.manifest}[kind.split()[0]]
    data = path.read_bytes()
    at = rng.randrange(len(data))
    if kind.endswith("non-UTF-8"):
        path.write_bytes(data[:at] + bytes([rng.randrange(0x80, 0x100)]) + data[at + 1 :])
    else:  # truncated JSON
        path.write_bytes(data[: max(1, at)])
    return path


DAMAGE = [
    "LATEST missing",
    "LATEST past the records",
    "latest record missing",
    "LATEST garbage",
    "LATEST non-UTF-8",
    "record non-UTF-8",
    "record truncated",
    "record wrong version",
    "manifest non-UTF-8",
    "manifest truncated",
]


def _contents(root: Path, store: str) -> dict[object, object]:
    with iqkit.open(root) as engine:
        return {k: v for _, k, v in kv_rows(engine, store)}


def _without_lock(state: dict[str, object]) -> dict[str, object]:
    # A refused commit takes (and releases) the writer lock: that file may change.
    return {path: v for path, v in state.items() if not path.endswith("writer.lock")}


@probe(
    "Damaged LATEST, version record or manifest",
    store_format="folder",
    fault="one of: LATEST missing, past the records or garbage; the latest record missing, "
    "truncated, naming another version; bytes that are not UTF-8 in LATEST, a record or "
    "the manifest; then commits and queries, then the file is restored",
    unit="damaged store",
    fast=len(DAMAGE),
    long=400,
)
def damaged_store_files(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    lost = keys = 0
    kinds: Counter[str] = Counter()
    for i in range(iterations):
        root = workdir / str(i)
        kind = DAMAGE[i % len(DAMAGE)] if i < len(DAMAGE) else rng.choice(DAMAGE)
        kinds[kind] += 1
        n_versions = rng.randint(1, 5)
        iqkit.create_store(root, "s", partitions=rng.randint(1, 4), retention=n_versions)
        expected: dict[object, object] = {}
        for v in range(n_versions):
            with iqkit.StoreWriter(root, "s") as w:
                for _ in range(rng.randint(1, 20)):
                    key, value = f"k{rng.randrange(60)}", v
                    w.put(key, value)
                    expected[key] = value
        layout = StoreLayout.of(root, "s")
        originals = {p: p.read_bytes() for p in layout.store_dir.rglob("*") if p.is_file()}
        named = _damage(layout, kind, rng)
        before = _without_lock(tree_state(layout.store_dir))

        # Writers refuse, naming the file; nothing on disk changes.
        try:
            with iqkit.StoreWriter(root, "s") as w:
                w.put("new", 1)
        except iqkit.StoreCorruptedError as exc:
            assert str(named) in str(exc), f"{kind}: {exc}"
        else:
            raise AssertionError(f"{kind}: a commit was accepted (version {w.version})")
        # Readers report the damage, never an empty store.
        with iqkit.open(root) as engine:
            try:
                results = engine.query(
                    iqkit.StateQueryRequest.in_store("s").with_query(
                        iqkit.RangeQuery.with_no_bounds()
                    )
                ).partition_results
            except iqkit.StoreCorruptedError as exc:
                assert kind.startswith("manifest"), f"{kind}: raised {exc}"
                assert str(named) in str(exc), f"{kind}: {exc}"
            else:
                for p, r in results.items():
                    assert r.failure_reason is FailureReason.STORE_EXCEPTION, f"{kind}: p{p} {r}"
                    assert str(named) in r.failure_message, f"{kind}: {r.failure_message}"
        changes = describe_changes(before, _without_lock(tree_state(layout.store_dir)))
        assert changes == [], f"{kind}: {changes}"

        # Restored, every committed key is there and commits go on.
        for path, data in originals.items():
            if not path.exists() or path.read_bytes() != data:
                path.write_bytes(data)
        found = _contents(root, "s")
        keys += len(expected)
        lost += sum(1 for k, v in expected.items() if found.get(k) != v)
        with iqkit.StoreWriter(root, "s") as w:
            w.put("new", 1)
        assert w.version == n_versions + 1, kind
        shutil.rmtree(root, ignore_errors=True)
    return Outcome(
        checked=f"{keys} committed keys over {iterations} stores "
        f"({', '.join(f'{n}× {k}' for k, n in sorted(kinds.items()))})",
        lost=lost,
        lost_detail="committed keys missing or changed after the file was restored",
    )


# -- failures after publish ----------------------------------------------------------------
CLEANUP_FAULTS = [
    "folder in leases/",
    "file in place of leases/",
    "folder at an expiring record",
    "file at partitions/<p> past the partition count",
    "file in place of jobs/",
]


def _inject_cleanup_fault(layout: StoreLayout, kind: str) -> None:
    if kind == "folder in leases/":
        (layout.leases_dir / "stray").mkdir(parents=True, exist_ok=True)
    elif kind == "file in place of leases/":
        shutil.rmtree(layout.leases_dir, ignore_errors=True)
        layout.leases_dir.write_text("x")
    elif kind == "folder at an expiring record":
        oldest = list_versions(layout)[0]
        layout.version_record(oldest).unlink()
        layout.version_record(oldest).mkdir()
    elif kind == "file at partitions/<p> past the partition count":
        (layout.partitions_dir / "99").write_text("x")
    else:
        layout.jobs_dir.write_text("x")


@probe(
    "Cleanup failing after publish",
    store_format="folder",
    fault="retention meets something it cannot remove or read: " + "; ".join(CLEANUP_FAULTS),
    unit="commit",
    fast=2 * len(CLEANUP_FAULTS),
    long=300,
)
def cleanup_fails_after_publish(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    lost = warned = 0
    for i in range(iterations):
        root = workdir / str(i)
        kind = CLEANUP_FAULTS[i % len(CLEANUP_FAULTS)]
        # An expiring record exists only when more than the latest version is retained.
        retention = 2 if kind == "folder at an expiring record" else rng.randint(1, 2)
        iqkit.create_store(root, "s", partitions=rng.randint(1, 3), retention=retention)
        layout = StoreLayout.of(root, "s")
        expected = {}
        for v in range(3):
            with iqkit.StoreWriter(root, "s") as w:
                w.put(f"k{v}", v)
            expected[f"k{v}"] = v
        _inject_cleanup_fault(layout, kind)
        for v in range(3, 5):
            before = read_latest_number(layout)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    with iqkit.StoreWriter(root, "s") as w:
                        w.put(f"k{v}", v)
                except Exception as exc:
                    # A failure is fine only if nothing was published (a retry is safe).
                    after = read_latest_number(layout)
                    lost += after != before
                    raise AssertionError(
                        f"{kind}: commit failed ({exc}); LATEST {before}->{after}"
                    ) from exc
            warned += bool(caught)
            expected[f"k{v}"] = v
            assert w.version == read_latest_number(layout) == (before or 0) + 1, kind
        found = _contents(root, "s")
        lost += sum(1 for k, v in expected.items() if found.get(k) != v)
        shutil.rmtree(root, ignore_errors=True)
    return Outcome(
        checked=f"{2 * iterations} commits, each reported published with its version "
        f"({warned} with a cleanup warning)",
        lost=lost,
        lost_detail="commits reported failed after publishing, or keys missing",
    )


# -- readers: leases, read-only stores, no writes, bounded footprint -------------------------
PINNED_READER = r"""
import sys, time
import iqkit
engine = iqkit.open(sys.argv[1], as_of=int(sys.argv[2]))
request = iqkit.StateQueryRequest.in_store("s").with_query(iqkit.RangeQuery.with_no_bounds())
for qr in engine.query(request).partition_results.values():
    assert qr.is_success or qr.failure_reason is not iqkit.FailureReason.STORE_EXCEPTION, qr
print("ready", flush=True)
time.sleep(600)
"""


@probe(
    "SIGKILLed reader holding a version (stale lease)",
    store_format="folder",
    fault="a reader process pinned to the latest version (as_of) is SIGKILLed; commits with "
    "retention 1 go on",
    unit="killed reader",
    fast=2,
    long=40,
)
def killed_reader_lease(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    root = workdir / "stores"
    iqkit.create_store(root, "s", partitions=2, retention=1)
    layout = StoreLayout.of(root, "s")
    kept = 0
    for i in range(iterations):
        with iqkit.StoreWriter(root, "s") as w:
            w.put(f"k{i}", i)
        pinned = w.version
        reader = subprocess.Popen(
            [sys.executable, "-c", PINNED_READER, str(root), str(pinned)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env(),
        )
        try:
            assert reader.stdout is not None and reader.stderr is not None
            if reader.stdout.readline().strip() != b"ready":
                raise AssertionError(f"reader did not start: {reader.stderr.read().decode()}")
            for _ in range(rng.randint(1, 3)):
                with iqkit.StoreWriter(root, "s") as w:
                    w.put("other", i)
            assert pinned in list_versions(layout), "a live reader's version was collected"
        finally:
            reader.send_signal(signal.SIGKILL)
            reader.wait()
        with iqkit.StoreWriter(root, "s") as w:
            w.put("other", -i)
        kept += pinned in list_versions(layout)
        assert folders_on_disk(layout) == referenced_folders(layout, list_versions(layout))
    return Outcome(
        checked=f"{iterations} readers killed while holding a version",
        lost=kept,
        lost_detail="versions still kept after their reader died",
    )


def _random_stores(root: Path, rng: random.Random) -> None:
    write_notebook_stores(root)
    for i in range(rng.randint(0, 3)):
        with iqkit.StoreWriter(root, "totals") as w:
            for _ in range(rng.randint(1, 5)):
                k = f"x{rng.randrange(20)}"
                w.put(k, {"customer": k, "total": i}, source=("orders", i % 2, 40 + i))


@probe(
    "Read-only store",
    fault="a copy of the stores is made read-only for a reading process (read-only bind "
    "mount in a private mount namespace here; see tests/faults.py), which reads everything",
    unit="read-only session",
    fast=1,
    long=10,
)
def read_only_store(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    hows = set()
    for i in range(iterations):
        root = workdir / str(i) / "stores"
        _random_stores(root, rng)
        expected = read_session(root)
        session, proof, how = run_read_only(root)
        hows.add(f"{how} ({proof})")
        assert session == expected, f"{how}: the read-only session differs"
        assert "STORE_EXCEPTION" not in repr(session)
    return Outcome(
        checked=f"{iterations} full read sessions equal to the writable store's",
        notes=sorted(hows),
    )


@probe(
    "Readers write nothing",
    fault="a query session (every query kind, lags, versions, as_of) with an engine left "
    "open, as in a notebook; every file and folder under the root is compared",
    unit="session",
    fast=2,
    long=50,
)
def readers_write_nothing(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    entries = 0
    for i in range(iterations):
        root = workdir / str(i) / "stores"
        _random_stores(root, rng)
        before = tree_state(root)
        entries += len(before)
        engine = iqkit.open(root)
        read_session(root)
        for store in engine.store_names():
            engine.lags()
            engine.versions(store)
        assert describe_changes(before, tree_state(root)) == [], "changed while open"
        engine.close()
        assert describe_changes(before, tree_state(root)) == [], "changed after close"
    return Outcome(checked=f"{entries} files and folders (bytes and mtime), while open and after")


@probe(
    "Long-lived engine, retention 2",
    store_format="folder",
    fault="one engine queries after every commit of a one-key write, never closed",
    unit="commit",
    fast=40,
    long=3000,
)
def long_lived_engine(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    root = workdir / "stores"
    iqkit.create_store(root, "s", partitions=4, retention=2)
    layout = StoreLayout.of(root, "s")
    expected: dict[str, int] = {}
    max_open = max_folders = lost = 0
    with iqkit.open(root) as engine:
        for i in range(iterations):
            missing, version = commit_one_key_and_read(root, engine, rng, i, expected)
            lost += missing
            retained = list_versions(layout)
            assert retained == list(range(max(1, version - 1), version + 1)), retained
            folders = folders_on_disk(layout)
            assert folders == referenced_folders(layout, retained)
            served = read_version(layout, version).partitions.items()
            allowed = {os.fspath(layout.partition_version_dir(p, m)) for p, m in served}
            open_files = open_store_files(layout)
            for path in open_files:
                if path != os.fspath(layout.version_record(version)):
                    assert os.path.dirname(path) in allowed, f"commit {i}: {path} still open"
            max_open = max(max_open, len(open_files))
            max_folders = max(max_folders, len(folders))
    return Outcome(
        checked=f"{iterations} commits and queries; at most {max_folders} partition folders "
        f"on disk and {max_open} store files open at any time",
        lost=lost,
        lost_detail="keys missing or stale in a query after their commit",
    )


# -- store names ---------------------------------------------------------------------------
_NAME_PIECES = ["a", "Z", "9", "-", "_", " ", ".", "..", "/", "\\", "\x00", "é", "日本", "🙂",
                "\udc80", "\ud800", "\n", ":", "*"]  # fmt: skip


def _random_name(rng: random.Random) -> str:
    if rng.random() < 0.2:  # around the 255-byte limit
        piece = rng.choice(["a", "é", "日", "🙂"])
        return piece * (rng.randint(240, 270) // len(piece.encode()))
    return "".join(rng.choice(_NAME_PIECES) for _ in range(rng.randint(0, 6)))


@probe(
    "Store names",
    fault="random names: empty, dots, separators, NUL, newlines, lone surrogates, "
    "non-ASCII, around the 255-byte folder-name limit; create, write, read",
    unit="name",
    fast=150,
    long=3000,
)
def store_names(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    root = workdir / "stores"
    accepted = refused = 0
    for _ in range(iterations):
        name = _random_name(rng)
        try:
            iqkit.create_store(root, name, partitions=1)
        except ValueError as exc:
            message = str(exc)
            assert "store name" in message and len(message) < 200 and "\n" not in message[:-1], (
                f"{name!r}: {message!r}"
            )
            refused += 1
            continue
        accepted += 1
        with iqkit.StoreWriter(root, name) as w:
            w.put("k", 1)
        with iqkit.open(root) as engine:
            assert name in engine.store_names(), name
            result = engine.query(
                iqkit.StateQueryRequest.in_store(name).with_query(iqkit.KeyQuery.with_key("k"))
            ).only_partition_result()
            assert result is not None and result.result == 1, name
        shutil.rmtree(root / name)
    return Outcome(checked=f"{accepted} names accepted and usable, {refused} refused in one line")
