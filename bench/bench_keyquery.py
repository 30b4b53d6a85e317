"""The warm routed KeyQuery against a raw rocksdict ``get`` on the same partition databases.

    .venv/bin/python bench/bench_keyquery.py [--keys 10000000] [--root DIR]

Issue 36's shape: a store written by ``StoreWriter``, 8 partitions, string keys, JSON
values ``{total: float, n: int, region: str}``. ``--root`` keeps the store (a 10M-key one
takes minutes to write) and reuses it when it is there already. Reports, per query:

- raw: rocksdict ``get`` of the same keys on each key's own partition database, the
  very folder iqkit reads (the partition already chosen: no hash, no JSON);
- iqkit warm: ``engine.query`` in a notebook loop, one engine, the request built per key
  (and, for reference, built before the loop), with ``skip_cache()`` (RocksDB against
  RocksDB) and with default options on keys never asked before (the read cache misses);
- the same on a working set of 2,000 keys whose blocks are all in RocksDB's cache;
- the first KeyQuery of a newly published version, on the same engine.

Keys are never repeated across timed rounds with default options, so iqkit's read cache
cannot answer them. Best of several alternating rounds (``bench_core.paired``).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_core import paired

import iqkit
from iqkit import KeyQuery, StateQueryRequest
from iqkit.store.cache import FileCache
from iqkit.store.chain.read import database_folder
from iqkit.store.chain.records import latest_version
from iqkit.store.encoding.keyspace import kv_key
from iqkit.store.encoding.partitioners import murmur2_partition
from iqkit.store.objects import open_objects
from iqkit.store.partitions import rocks

NAME = "totals"
PARTITIONS = 8
REGIONS = ("eu-west", "us-east", "ap-south", "sa-east", "af-north")


def key_of(i: int) -> str:
    return f"customer-{i:09d}"


def build(root: str, n: int) -> float:
    """Write the store in one commit (seconds), unless it is there already (0)."""
    if (Path(root) / NAME).exists():
        return 0.0
    iqkit.create_store(root, NAME, partitions=PARTITIONS, key_serde="string", value_serde="json")
    rnd = random.Random(1)
    t0 = time.perf_counter()
    with iqkit.StoreWriter(root, NAME) as w:
        put = w.put
        for i in range(n):
            value = {
                "total": rnd.random() * 1e4,
                "n": rnd.randrange(1000),
                "region": REGIONS[i % 5],
            }
            put(key_of(i), value)
    return time.perf_counter() - t0


def warm_up(engine: iqkit.StateEngine) -> None:
    """Two lookups per partition: the first reads the chain's files in place, the second
    builds the partition's database in the cache; both then stay open."""
    seen: dict[int, int] = {}
    i = 0
    while len(seen) < PARTITIONS or min(seen.values()) < 2:
        p = engine.partition_for_key(NAME, key_of(i))
        if seen.get(p, 0) < 2:
            engine.query(StateQueryRequest.in_store(NAME).with_query(KeyQuery.with_key(key_of(i))))
            seen[p] = seen.get(p, 0) + 1
        i += 1


def raw_databases(root: str) -> list:
    objects = open_objects(root)
    record = latest_version(objects, NAME)
    return [
        rocks.open_for_read(os.fspath(database_folder(FileCache(), objects, NAME, p, chain)))
        for p, chain in sorted(record.partitions.items())
    ]


def per_query(seconds: float, count: int) -> float:
    return seconds / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--root", default=None, help="keep (and reuse) the store here")
    parser.add_argument("--queries", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    tmp = None
    if args.root is None:
        tmp = tempfile.TemporaryDirectory()
        root = tmp.name
    else:
        root = args.root
        os.makedirs(root, exist_ok=True)
    os.environ.setdefault("IQKIT_CACHE", os.path.join(root, ".cache"))
    n = args.keys
    write_s = build(root, n)
    rnd = random.Random(7)
    engine = iqkit.open(root)
    warm_up(engine)
    dbs = raw_databases(root)
    q = engine.query

    def sample(count: int) -> list[str]:
        return [key_of(rnd.randrange(n)) for _ in range(count)]

    def raw_pairs(keys: list[str]) -> list[tuple]:
        return [
            (dbs[murmur2_partition(k.encode(), PARTITIONS)].get, kv_key(k.encode())) for k in keys
        ]

    rows: list[tuple[str, float, float]] = []

    def compare(label: str, keys: list[str], skip: bool) -> None:
        pairs = raw_pairs(keys)

        def raw() -> None:
            for get, k in pairs:
                get(k)

        def built_per_key() -> None:
            for k in keys:
                query = KeyQuery.with_key(k)
                q(
                    StateQueryRequest.in_store(NAME).with_query(
                        query.skip_cache() if skip else query
                    )
                )

        t_raw, t_iq = paired(raw, built_per_key, args.rounds)
        rows.append((label, per_query(t_iq, len(keys)), per_query(t_raw, len(keys))))

    keys = sample(args.queries)
    compare("warm KeyQuery, skip_cache(), request built per key", keys, True)
    requests = [
        StateQueryRequest.in_store(NAME).with_query(KeyQuery.with_key(k).skip_cache()) for k in keys
    ]
    pairs = raw_pairs(keys)

    def raw_all() -> None:
        for get, k in pairs:
            get(k)

    def prebuilt() -> None:
        for r in requests:
            q(r)

    t_raw, t_iq = paired(raw_all, prebuilt, args.rounds)
    rows.append(
        ("… request built before the loop", per_query(t_iq, len(keys)), per_query(t_raw, len(keys)))
    )

    # Default options: fresh keys each round, so the read cache only misses.
    fresh_iq, fresh_raw = [], []
    for _ in range(args.rounds):
        a, b = sample(args.queries), sample(args.queries)
        pa = raw_pairs(b)
        t0 = time.perf_counter()
        for k in a:
            q(StateQueryRequest.in_store(NAME).with_query(KeyQuery.with_key(k)))
        fresh_iq.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for get, k in pa:
            get(k)
        fresh_raw.append(time.perf_counter() - t0)
    rows.append(
        (
            "warm KeyQuery, default options (read cache misses)",
            per_query(min(fresh_iq), args.queries),
            per_query(min(fresh_raw), args.queries),
        )
    )
    hot = sample(2_000) * 10
    compare("… skip_cache(), 2,000 keys whose blocks are all cached", hot, True)

    # The first KeyQuery of a new version: a one-row commit, then one query.
    firsts, warm_after = [], []
    for i in range(3):
        with iqkit.StoreWriter(root, NAME) as w:
            w.put(key_of(i), {"total": 1.0, "n": i, "region": "eu-west"})
        owner = murmur2_partition(key_of(i).encode(), PARTITIONS)
        probe = key_of(rnd.randrange(n))
        while murmur2_partition(probe.encode(), PARTITIONS) != owner:  # the changed one
            probe = key_of(rnd.randrange(n))
        t0 = time.perf_counter()
        q(StateQueryRequest.in_store(NAME).with_query(KeyQuery.with_key(probe)))
        firsts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        q(StateQueryRequest.in_store(NAME).with_query(KeyQuery.with_key(probe).skip_cache()))
        warm_after.append(time.perf_counter() - t0)

    print(
        f"\n{n:,} keys, {PARTITIONS} partitions, JSON values; written in {write_s:.0f} s"
        if write_s
        else f"\n{n:,} keys, {PARTITIONS} partitions, JSON values (store reused)"
    )
    print(
        f"Python {sys.version.split()[0]}, {args.queries:,} queries a round, "
        f"best of {args.rounds}\n"
    )
    print("| query | iqkit | raw rocksdict `get` | ratio |")
    print("|---|---|---|---|")
    for label, t_iq, t_raw in rows:
        print(f"| {label} | {t_iq:.2f} µs | {t_raw:.2f} µs | {t_iq / t_raw:.1f}× |")
    print(
        f"| first KeyQuery of a new version (median of 3) | "
        f"{statistics.median(firsts) * 1e3:.2f} ms | | |"
    )
    print(
        f"| … the query after it (opens the new chain's database) | "
        f"{statistics.median(warm_after) * 1e3:.2f} ms | | |"
    )
    engine.close()
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
