"""Reliability probes of the SST-chain format (rows of RELIABILITY.md; see
``tests/reliability/registry.py``).

A chain store (``iqkit/store/chain/``) publishes version N with one exclusive create
of its record ``chain/<N>.json``, which lists each partition's immutable SSTs
(``sst/<p>/<version>-<ms>-<random>.sst``); nothing is renamed or rewritten and the latest
version is the newest record. Retention removes records first, then SSTs no remaining
record lists, each only once older than a grace period (600 s by default). Readers build
one RocksDB per partition chain in their cache (``IQKIT_CACHE``: every probe here points
it at its own folder, and its child processes inherit that).

The crash probes use the *generation store* of ``tests/faults.py`` (its writer process,
its whole-generation checks of every query kind); what is chain-specific here is reading
the records and the SSTs on the root, and telling what a killed commit left: temporary
files of an interrupted create or copy (``.iqkit-tmp-*``) and orphan SSTs no record lists.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

from faults import (
    CHILD,
    KEYS,
    PARTITIONS,
    RETENTION,
    STORE,
    Child,
    child_env,
    commit_generation,
    commit_one_key_and_read,
    describe_changes,
    drain,
    kill_at_random,
    new_store,
    partition_generation,
    position,
    query_generation,
    request,
    tree_state,
)
from helpers import kv_rows
from registry import Outcome, probe

import iqkit
from iqkit.store.cache import FileCache
from iqkit.store.chain import retention as chain_retention
from iqkit.store.chain import stores as chain_store
from iqkit.store.chain.read import database_folder
from iqkit.store.chain.records import ChainVersion, list_versions, read_version, record_key
from iqkit.store.chain.retention import DEFAULT_GRACE_SECONDS, collect_chain_garbage
from iqkit.store.names import CACHE_DBS_DIR, CHAIN_RECORDS_DIR, CHAIN_SST_DIR
from iqkit.store.objects import TMP_PREFIX, open_objects


# -- the probes' own cache, retention's grace period, the chain writer process -----------
@contextlib.contextmanager
def own_cache(workdir: Path, **more: str) -> Iterator[Path]:
    """``IQKIT_CACHE`` (and ``more`` variables) set for this probe while it runs."""
    cache = workdir / "iqkit-cache"
    with mock.patch.dict(os.environ, {"IQKIT_CACHE": os.fspath(cache), **more}):
        yield cache


@contextlib.contextmanager
def grace_period(seconds: float) -> Iterator[None]:
    """Retention after commits made in this process judges ages with a grace period of
    ``seconds`` instead of 600 s (as tests/store/test_store_faults.py does)."""
    shorter = functools.partial(chain_retention.collect_chain_garbage, grace_seconds=seconds)
    with mock.patch.object(chain_store, "collect_chain_garbage", shorter):
        yield


GRACE_ENV = "IQKIT_PROBE_GRACE"
#: Run before faults.CHILD: the writer's retention uses the grace period in
#: IQKIT_PROBE_GRACE (seconds) when that is set.
GRACE_PRELUDE = r"""
import functools as _functools, os as _os
if _os.environ.get("IQKIT_PROBE_GRACE"):
    from iqkit.store.chain import retention as _retention
    from iqkit.store.chain import stores as _chain_store
    _chain_store.collect_chain_garbage = _functools.partial(
        _retention.collect_chain_garbage, grace_seconds=float(_os.environ["IQKIT_PROBE_GRACE"])
    )
"""


class ChainChild(Child):
    """``faults.Child`` in mode ``loop`` (generations committed until it is killed), its
    retention's grace period ``grace`` seconds (None: iqkit's default, 600 s)."""

    def __init__(self, root: Path, first: int, grace: float | None) -> None:
        env = child_env()
        env.pop(GRACE_ENV, None)
        if grace is not None:
            env[GRACE_ENV] = str(grace)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", GRACE_PRELUDE + CHILD, str(root), str(first), "loop"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.stdout = b""
        self.stderr = b""
        self.done = False


def new_chain_store(root: Path) -> Path:
    """The generation store (``faults.new_store``); its folder."""
    return new_store(root)


# -- what is on the root -------------------------------------------------------------------
def on_root(root: Path, store: str = STORE) -> tuple[set[str], set[str]]:
    """(the SSTs under the store, as keys; the temporary files of interrupted creates
    and copies anywhere under it)."""
    ssts, temps = set(), set()
    for dirpath, _, names in os.walk(root / store):
        for name in names:
            key = Path(dirpath, name).relative_to(root).as_posix()
            if name.startswith(TMP_PREFIX):
                temps.add(key)
            elif key.startswith(f"{store}/{CHAIN_SST_DIR}/"):
                ssts.add(key)
    return ssts, temps


def written_by(key: str) -> int:
    """The version whose commit wrote the SST ``key`` (the first part of its name)."""
    return int(key.rpartition("/")[2].split("-")[0])


@contextlib.contextmanager
def fresh_cache(workdir: Path) -> Iterator[None]:
    """A cache of its own for the block, removed after: reads build from the root's files."""
    cache = workdir / "fresh-cache"
    try:
        with mock.patch.dict(os.environ, {"IQKIT_CACHE": os.fspath(cache)}):
            yield
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def check_chain_store(
    root: Path, rng: random.Random, verified: dict[int, str], label: str, *, again: bool
) -> tuple[dict[int, int], set[str]]:
    """Every retained version whole; returns ({version: generation} of the retained
    versions, the SSTs they list).

    A version is read in full (every query kind, ``as_of``) the first time it is seen;
    after that its record's bytes must not change and every file it lists must be on the
    root at its recorded size (records and SSTs are never rewritten), and (``again``) one
    retained version, picked at random, is read in full again from a fresh cache (from
    the root's files). Generations rise with versions, and a fresh engine serves the
    newest record."""
    objects = open_objects(root)
    retained = list_versions(objects, STORE)
    assert retained, f"{label}: no version on the root"
    reread = rng.choice(retained) if again else None
    generations: dict[int, int] = {}
    listed: set[str] = set()
    for v in retained:
        raw = (root / record_key(STORE, v)).read_bytes()
        record = ChainVersion.parse(raw, v, record_key(STORE, v))
        assert sorted(record.partitions) == list(range(PARTITIONS)), f"{label}: version {v}"
        for chain in record.partitions.values():
            for f in chain.files:
                path = root / f.name
                size = path.stat().st_size if path.exists() else None
                assert size == f.size, f"{label}: version {v} lists {f.name} ({f.size} B): {size}"
        listed |= record.files()
        digest = hashlib.sha256(raw).hexdigest()
        assert verified.get(v, digest) == digest, f"{label}: the record of version {v} changed"
        g = record.metadata["generation"]
        if v not in verified or v == reread:
            cache = fresh_cache(root.parent) if v in verified else contextlib.nullcontext()
            with cache, iqkit.open(root, as_of=v) as pinned:
                assert query_generation(pinned, rng) == g, f"{label}: version {v} is not {g}"
            verified[v] = digest
        generations[v] = g
    gens = list(generations.values())
    assert gens == sorted(set(gens)), f"{label}: generations of versions {retained}: {gens}"
    with iqkit.open(root) as engine:
        assert engine.version(STORE) == retained[-1], label
        assert query_generation(engine, rng) == gens[-1], label
    return generations, listed


# -- writers killed ------------------------------------------------------------------------
def where_killed(
    published: bool, grace: float | None, retained: int, orphans: set[str], new_temps: set[str]
) -> str:
    """Where in its commit the writer was, told by what the kill left: ``orphans``, SSTs
    on the root no record lists; ``new_temps``, its temporary files on the root and its
    folders in TMPDIR (where each SST is written before it is copied to the root)."""
    if published:
        if grace == 0 and (retained > RETENTION or orphans):
            return "after publishing, before its retention (grace 0) finished"
        return "after publishing, before commit() returned"
    if any(f"/{CHAIN_RECORDS_DIR}/" in t for t in new_temps):
        return "while creating the version record"
    if len(orphans) == PARTITIONS and not new_temps:
        return "after writing its SSTs, before the record"
    if orphans or new_temps:
        return "while writing its SSTs"
    return "before the commit wrote a file"


@probe(
    "SIGKILLed chain writer, random moment",
    fault="a process committing generations in a loop to a chain store (retention 2, its "
    "grace period 0 s or the default 600 s at random) is SIGKILLed 0-300 ms after it "
    "starts; every retained version must read whole and the next commit succeed at once",
    unit="kill",
    fast=4,
    long=60,
)
def sigkill_chain_writer_at_random(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    root, tmp = workdir / "stores", workdir / "tmp"
    tmp.mkdir()
    # The writers' TMPDIR, where a commit writes each SST before copying it to the root.
    with own_cache(workdir, TMPDIR=os.fspath(tmp)):
        layout = new_chain_store(root)
        g, latest, verified = 1, commit_generation(root, 1), {}
        landed: Counter[str] = Counter()
        returned = lost = orphaned = slowest = 0
        temps: set[str] = set()
        for i in range(iterations):
            label = f"kill {i}"
            grace = rng.choice([0.0, None])
            committed = kill_at_random(ChainChild(root, g + 1, grace), rng, layout, label)
            returned += len(committed)
            durable = committed[-1][0] if committed else g  # the last commit that returned

            generations, listed = check_chain_store(root, rng, verified, label, again=True)
            versions = list(generations)
            observed = generations[versions[-1]]
            # Nothing returned is lost; at most the commit in flight is added; no going back.
            lost += max(0, durable - observed)
            assert observed <= durable + 1, f"{label}: {observed=} {durable=}"
            assert observed >= g, f"{label}: generation went back from {g} to {observed}"
            assert versions[-1] >= latest, f"{label}: version went back from {latest}"
            for gen, v in committed:
                assert generations.get(v, gen) == gen, f"{label}: version {v} is not {gen}"
            ssts, on_root_temps = on_root(root)
            now_temps = on_root_temps | {p.name for p in tmp.glob("iqkit-chain-*")}
            killed = {k for k in ssts - listed if written_by(k) == versions[-1] + 1}
            published = observed > durable
            orphans = ssts - listed if published else killed
            landed[where_killed(published, grace, len(versions), orphans, now_temps - temps)] += 1
            orphaned += len(killed)
            temps = now_temps

            # The commit lock is free: a fresh writer publishes the next version at once.
            latest, g = versions[-1], max(observed, durable) + 1
            started = time.monotonic()
            assert commit_generation(root, g) == latest + 1, label
            slowest = max(slowest, time.monotonic() - started)
            generations, _ = check_chain_store(root, rng, verified, label, again=False)
            latest = list(generations)[-1]
            assert generations[latest] == g, label

        # Once the grace period is over, retention removes every SST no record lists.
        ssts, temps = on_root(root)
        left = len(ssts - listed)
        later = time.time() + DEFAULT_GRACE_SECONDS + 1
        cleanup = collect_chain_garbage(open_objects(root), STORE, retain=RETENTION, now=later)
        assert not cleanup.problems, cleanup.problems
        generations, listed = check_chain_store(root, rng, verified, "grace over", again=True)
        ssts, temps_after = on_root(root)
        assert ssts == listed, f"SSTs no record lists after the grace: {sorted(ssts - listed)}"
        assert not temps_after, f"temporary files left after the grace: {sorted(temps_after)}"
        building = list(tmp.glob("iqkit-chain-*"))
    return Outcome(
        checked=f"{returned} commits returned in killed writers; {g} generations; after every "
        f"kill the commit lock was free and the next commit published (slowest {slowest:.1f} s)",
        lost=lost,
        lost_detail="generations whose commit returned but are not in the store",
        notes=[
            "kills landed " + ", ".join(f"{n}× {what}" for what, n in sorted(landed.items())),
            f"{orphaned} orphan SSTs left by killed commits; {left} SSTs no record listed were "
            "on the root at the end (retention with grace 0 removes them at once, with 600 s "
            "after 10 minutes); retention run as if the grace period were over removed "
            f"{len(cleanup.removed_files)} SSTs (those and the dropped versions') and left no "
            "SST unlisted",
            f"{len(temps)} temporary files of interrupted creates and copies "
            f"({TMP_PREFIX}*) left on the root, all removed by retention once the grace "
            f"was over; {len(building)} folders (iqkit-chain-*) where killed commits were "
            "writing SSTs left in their TMPDIR at the end (the next writer removes a killed "
            "writer's folder: its flock is free)",
        ],
    )


# -- readers during commits ----------------------------------------------------------------
def reader_round(engine: iqkit.StateEngine, rng: random.Random) -> Iterator[tuple[str, int]]:
    """The soak's queries, one round: (what, generation) of each; every partition of every
    query must succeed and hold one whole generation."""
    key = rng.choice(KEYS)
    single = engine.query(request(iqkit.KeyQuery.with_key(key))).only_partition_result()
    assert single is not None and single.is_success, f"KeyQuery {key}: {single}"
    assert single.position == position(single.result), f"KeyQuery {key}: {single.position}"
    yield "KeyQuery", single.result
    queries: list[tuple[str, iqkit.Query, set[int] | None]] = [
        ("MultiKeyQuery", iqkit.MultiKeyQuery.with_keys(KEYS), None),
        ("RangeQuery", iqkit.RangeQuery.with_no_bounds(), None),
    ]
    queries += [
        (f"RangeQuery of partition {p}", iqkit.RangeQuery.with_no_bounds(), {p})
        for p in range(PARTITIONS)
    ]
    for what, query, only in queries:
        req = request(query) if only is None else request(query).with_partitions(only)
        results = engine.query(req).partition_results
        assert set(results) == (only or set(range(PARTITIONS))), f"{what}: {sorted(results)}"
        gens = set()
        for p, r in results.items():
            assert r.is_success, f"{what} p{p}: {r.failure_reason} {r.failure_message}"
            rows = r.result if isinstance(query, iqkit.MultiKeyQuery) else drain(r)
            gens.add(partition_generation(p, r, rows))
        assert len(gens) == 1, f"{what}: one query, generations {sorted(gens)}"
        yield what, gens.pop()


#: The soak writer's grace period: short enough for retention to remove records and SSTs
#: under the reader within the run, far longer than a reader takes between queries.
SOAK_GRACE = 10.0


@probe(
    "Readers during chain commits (soak)",
    fault="a long-lived engine queries (key, multi-key, range of all and of each partition) "
    f"while another process commits to a chain store with retention 2 (grace period "
    f"shortened to {SOAK_GRACE:.0f} s, so retention removes records and SSTs under the "
    "reader), then the writer is SIGKILLed",
    unit="reader round",
    fast=40,
    long=50000,
)
def chain_readers_during_commits(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    root = workdir / "stores"
    with own_cache(workdir):
        new_chain_store(root)
        commit_generation(root, 1)
        engine = iqkit.open(root)
        child = ChainChild(root, 2, SOAK_GRACE)
        queries = rounds = last_g = last_version = 0
        seen: set[int] = set()
        try:
            child.wait_ready()
            started = time.monotonic()
            # At least `iterations` rounds; more only while the writer has published fewer
            # than 5 versions under the reader.
            while rounds < iterations or (len(seen) < 5 and time.monotonic() - started < 60):
                rounds += 1
                version = engine.version(STORE)
                assert version is not None and version >= last_version, (version, last_version)
                last_version = version
                seen.add(version)
                for what, g in reader_round(engine, rng):
                    assert g >= last_g, f"{what}: generation went back from {last_g} to {g}"
                    last_g = g
                    queries += 1
            assert child.proc.poll() is None, f"writer died: {child.describe()}"
            assert child.kill() == -signal.SIGKILL, child.describe()
            assert len(seen) >= 5, f"only versions {sorted(seen)} seen"

            # The writer is dead: the engine converges on the newest record.
            objects = open_objects(root)
            latest = list_versions(objects, STORE)[-1]
            assert engine.version(STORE) == latest
            final = query_generation(engine, rng)
            assert final == read_version(objects, STORE, latest).metadata["generation"] >= last_g
            durable = child.committed()[-1][0]
            assert final <= durable + 1
            lost = max(0, durable - final)
            # The next commit succeeds at once and the same engine serves it.
            assert commit_generation(root, final + 1) == latest + 1
            assert query_generation(engine, rng) == final + 1
            removed = latest + 1 - len(list_versions(objects, STORE))
        finally:
            child.kill()
            engine.close()
    return Outcome(
        checked=f"{queries} queries over {len(seen)} versions while retention removed "
        f"{removed} versions; none failed or mixed generations",
        lost=lost,
        lost_detail="generations whose commit returned but are not in the store",
    )


# -- a long-lived engine -------------------------------------------------------------------
def open_files_under(folder: Path) -> list[str]:
    """Paths under ``folder`` this process holds open (from /proc/self/fd)."""
    prefix = os.fspath(folder) + os.sep
    out = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(prefix):
                out.append(target)
    return out


def cache_databases(cache: Path) -> set[Path]:
    """The database folders in the cache (those holding RocksDB's CURRENT)."""
    return {p.parent for p in (cache / CACHE_DBS_DIR).glob("*/*/*/*/CURRENT")}


#: The cache limit of the long-lived engine probe: a few dozen of its databases.
ENGINE_CACHE_SIZE = "2MiB"


@probe(
    "Long-lived engine on a chain store, retention 2",
    fault="one engine queries after every commit of a one-key write to a chain store, "
    "never closed (retention's grace period 0 s, so the root keeps 2 versions; the "
    f"reader's cache limited to {ENGINE_CACHE_SIZE})",
    unit="commit",
    fast=40,
    long=3000,
)
def long_lived_chain_engine(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    root = workdir / "stores"
    limited = own_cache(workdir, IQKIT_CACHE_SIZE=ENGINE_CACHE_SIZE)
    with limited as cache, grace_period(0):
        iqkit.create_store(root, "s", partitions=4, retention=2)
        objects = open_objects(root)
        expected: dict[str, int] = {}
        built: set[Path] = set()
        max_open = max_dbs = max_ssts = lost = 0
        with iqkit.open(root) as engine:
            for i in range(iterations):
                missing, version = commit_one_key_and_read(root, engine, rng, i, expected)
                lost += missing
                assert engine.version("s") == version, f"commit {i}"

                retained = list_versions(objects, "s")
                assert retained == list(range(max(1, version - 1), version + 1)), retained
                listed = set().union(*(read_version(objects, "s", v).files() for v in retained))
                ssts, temps = on_root(root, "s")
                assert ssts == listed and not temps, f"commit {i}: {sorted(ssts ^ listed)}"

                # Open: only the databases of the chains the served version lists.
                latest = read_version(objects, "s", version)
                serving = {
                    database_folder(FileCache(), objects, "s", p, chain)
                    for p, chain in latest.partitions.items()
                }
                open_now = open_files_under(cache)
                for path in open_now:
                    folder = Path(path) if Path(path).is_dir() else Path(path).parent
                    assert folder in serving, f"commit {i}: {path} still open"

                assert open_files_under(root) == [], f"commit {i}: {open_files_under(root)}"
                dbs = cache_databases(cache)
                built |= dbs
                max_open = max(max_open, len(open_now))
                max_dbs = max(max_dbs, len(dbs))
                max_ssts = max(max_ssts, len(ssts))
        sizes = [sum(f.stat().st_size for f in d.iterdir() if f.is_file()) for d in dbs]
    return Outcome(
        checked=f"{iterations} commits and queries; at most {max_ssts} SSTs on the root, "
        f"{max_dbs} databases in the cache (of {len(built)} built) and {max_open} cache "
        "files open at any time",
        lost=lost,
        lost_detail="keys missing or stale in a query after their commit",
        notes=[
            f"the cache limit ({ENGINE_CACHE_SIZE}) bounds the databases: one is built per "
            f"partition version read, {sum(sizes) // max(1, len(sizes)) // 1024} KiB each here; "
            "under the default 10 GiB limit a long-lived reader keeps every one it built"
        ],
    )


# -- damaged chain files -------------------------------------------------------------------
CHAIN_DAMAGE = [
    "record truncated",
    "record garbage",
    "record non-UTF-8",
    "record wrong version",
    "SST missing",
    "SST truncated",
    "manifest truncated",
    "manifest non-UTF-8",
]


def damage_chain_file(root: Path, kind: str, rng: random.Random) -> Path:
    """Damage one file of store ``s`` as ``kind`` says (the latest version's record, one
    SST it lists, or the manifest); return the file."""
    objects = open_objects(root)
    latest = list_versions(objects, "s")[-1]
    if kind.startswith("record"):
        path = root / record_key("s", latest)
    elif kind.startswith("SST"):
        chains = read_version(objects, "s", latest).partitions
        path = root / rng.choice(chains[rng.choice(sorted(chains))].files).name
    else:
        path = root / "s" / "manifest.json"
    data = path.read_bytes()
    if kind == "SST missing":
        path.unlink()
    elif kind == "record garbage":
        path.write_bytes(rng.choice([b"", b"x\n", b"[]", b"{}", b"null", "٣".encode()]))
    elif kind == "record wrong version":
        other = rng.choice([0, latest + 1, 999])
        path.write_bytes(data.replace(b'"version": %d' % latest, b'"version": %d' % other))
    elif kind.endswith("non-UTF-8"):
        at = rng.randrange(len(data))
        path.write_bytes(data[:at] + bytes([rng.randrange(0x80, 0x100)]) + data[at + 1 :])
    else:  # truncated
        path.write_bytes(data[: rng.randrange(len(data.rstrip()))])
    return path


def commit_keys(root: Path, rng: random.Random, value: int, keys: list[int], parts: int) -> dict:
    """Commit ``k<i>`` = value for each i in keys (k<i> lives in partition i % parts);
    returns what was written as {(partition, key): value}."""
    written = {}
    with iqkit.StoreWriter(root, "s") as w:
        for i in keys:
            w.put(f"k{i}", value, partition=i % parts)
            written[(i % parts, f"k{i}")] = value
    return written


def partition_rows(engine: iqkit.StateEngine) -> dict[int, object]:
    """Each partition's rows {(partition, key): value}, or its failure (reason, message);
    a StoreCorruptedError raised by the query itself is returned."""
    try:
        results = engine.query(
            iqkit.StateQueryRequest.in_store("s").with_query(iqkit.RangeQuery.with_no_bounds())
        ).partition_results
    except iqkit.StoreCorruptedError as exc:
        return {-1: exc}
    return {p: _rows_or_failure(p, r) for p, r in results.items()}


def _rows_or_failure(p: int, r: iqkit.QueryResult) -> object:
    """A successful partition's rows, or its failure. A json store's scan reads its rows
    from RocksDB when they are first iterated (its columnar twins hold no stored value
    text), so a damaged SST fails the iteration, naming the file, rather than the query:
    counted as that partition's STORE_EXCEPTION."""
    if not r.is_success:
        return (r.failure_reason, r.failure_message)
    try:
        return {(p, k): v for k, v in drain(r).items()}
    except iqkit.IqkitError as exc:
        return (iqkit.FailureReason.STORE_EXCEPTION, str(exc))


def check_damaged_reads(
    root: Path, kind: str, named: Path, expected: dict, label: str, violations: list[str]
) -> None:
    """A query of every partition: a damaged manifest raises naming it; a damaged record
    fails every partition, a damaged SST its partition (or, missing, is still read whole
    from a database built before), with ``STORE_EXCEPTION`` naming the file in one line."""
    key = named.relative_to(root).as_posix()
    with iqkit.open(root) as engine:
        results = partition_rows(engine)
    for p, r in results.items():
        if isinstance(r, Exception):
            assert kind.startswith("manifest") and str(named) in str(r), f"{label}: {r}"
        elif isinstance(r, dict):
            assert kind.startswith("SST"), f"{label}: p{p} read"
            want = {k: v for k, v in expected.items() if k[0] == p}
            assert r == want, f"{label}: p{p} read {r} instead of {want}"
        else:
            reason, message = r
            assert reason is iqkit.FailureReason.STORE_EXCEPTION, f"{label}: p{p} {r}"
            if key not in message or "\n" in message:
                violations.append(f"{label}: p{p}'s failure does not name it in one line: "
                                  f"{message!r}")  # fmt: skip


@probe(
    "Damaged chain record, SST or manifest",
    fault="one of: the latest version record truncated, garbage, not UTF-8 or naming another "
    "version; an SST of the latest version missing or truncated (some stores read before, "
    "so readers hold a database built from it); the manifest truncated or not UTF-8; then "
    "commits and queries, then the file is restored and commits go on through compaction",
    unit="damaged store",
    fast=len(CHAIN_DAMAGE),
    long=300,
)
def damaged_chain_files(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    lost = keys = over = refused = 0
    kinds: Counter[str] = Counter()
    violations: list[str] = []
    with own_cache(workdir):
        for i in range(iterations):
            root = workdir / str(i)
            kind = (
                CHAIN_DAMAGE[i % len(CHAIN_DAMAGE)]
                if i < len(CHAIN_DAMAGE)
                else rng.choice(CHAIN_DAMAGE)
            )
            kinds[kind] += 1
            parts = rng.randint(1, 4)
            iqkit.create_store(root, "s", partitions=parts, partitioner="explicit",
                               retention=rng.randint(1, 3))  # fmt: skip
            expected: dict = {}
            for v in range(rng.randint(1, 12)):  # chains long enough to be compacted
                expected |= commit_keys(
                    root, rng, v, rng.sample(range(60), rng.randint(1, 20)), parts
                )
            if rng.random() < 0.5:  # a reader built the partitions' databases before
                with iqkit.open(root) as engine:
                    partition_rows(engine)
            store = root / "s"
            originals = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
            named = damage_chain_file(root, kind, rng)
            key = named.relative_to(root).as_posix()
            label = f"store {i} ({kind}, {key})"
            objects = open_objects(root)

            # Readers: the damaged file's partitions fail naming it, in one line.
            before = tree_state(store)
            check_damaged_reads(root, kind, named, expected, label, violations)
            # Writers: refuse, naming the file, when the latest version cannot be read.
            if kind.startswith("SST"):
                # Commits read records, never SSTs, except to compact a long chain.
                for v in range(rng.randint(1, 10)):
                    latest = list_versions(objects, "s")[-1]
                    try:
                        expected |= commit_keys(root, rng, 100 + v, rng.sample(range(60), 5), parts)
                        over += 1
                    except iqkit.IqkitError as exc:
                        refused += 1
                        assert list_versions(objects, "s")[-1] == latest, f"{label}: {exc}"
                        if key not in str(exc):
                            violations.append(f"{label}: a refused commit does not name it: {exc}")
                check_damaged_reads(root, kind, named, expected, label, violations)
            else:
                try:
                    commit_keys(root, rng, -1, [0], parts)
                except iqkit.StoreCorruptedError as exc:
                    assert str(named) in str(exc), f"{label}: {exc}"
                else:
                    raise AssertionError(f"{label}: a commit was accepted")
                changes = describe_changes(_no_lock(before), _no_lock(tree_state(store)))
                assert changes == [], f"{label}: {changes}"

            # Restored, every committed key is there and commits go on, compaction included.
            for path, data in originals.items():
                if not path.exists() or path.read_bytes() != data:
                    path.write_bytes(data)
            with iqkit.open(root) as engine:
                found = {(p, k): v for p, k, v in kv_rows(engine, "s")}
            keys += len(expected)
            lost += sum(1 for k, v in expected.items() if found.get(k) != v)
            for v in range(9):  # more commits than COMPACT_AFTER_DELTAS: every chain compacts
                try:
                    commit_keys(root, rng, 200 + v, list(range(parts)), parts)
                except iqkit.IqkitError as exc:
                    violations.append(f"{label}: commit {v} after the file was restored: {exc}")
                    break
            shutil.rmtree(root, ignore_errors=True)
    assert not violations, "\n".join(violations)
    return Outcome(
        checked=f"{keys} committed keys over {iterations} stores "
        f"({', '.join(f'{n}× {k}' for k, n in sorted(kinds.items()))}); {over} commits "
        f"published over a damaged SST, {refused} refused (a compaction needed it)",
        lost=lost,
        lost_detail="committed keys missing or changed after the file was restored",
    )


def _no_lock(state: dict[str, object]) -> dict[str, object]:
    # A refused commit takes (and releases) the writer lock: that file may change.
    return {path: v for path, v in state.items() if not path.endswith("writer.lock")}
