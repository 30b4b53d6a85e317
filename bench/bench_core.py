"""Core query speed, as ratios to raw rocksdict doing the same work in the same run.

    make bench            # or: .venv/bin/python bench/bench_core.py [--keys 1000000]

Builds a 1,000,000-key store (and a 10,000-key one) in a temporary folder, then times
each iqkit query against the equivalent raw rocksdict call on the very same RocksDB
folder. Prints a Markdown table for BENCHMARKS.md. Single thread; best of several runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from itertools import islice

from rocksdict import ReadOptions

import iqkit
from iqkit import KeyQuery, MultiKeyQuery, PrefixScanQuery, RangeQuery, StateQueryRequest
from iqkit.store.cache import FileCache
from iqkit.store.chain.read import database_folder
from iqkit.store.chain.records import latest_version
from iqkit.store.encoding.keyspace import kv_key, kv_prefix_range
from iqkit.store.objects import open_objects
from iqkit.store.partitions import rocks

GROUP = 1000  # keys are f"{group:04d}-{i:04d}": a 5-char prefix selects 1,000 keys


def build(root: str, name: str, n: int) -> str:
    """Write the store; the RocksDB folder its one partition is read from (its database,
    built in the cache by a first read), so raw rocksdict reads the very same database
    as iqkit."""
    iqkit.create_store(root, name, partitions=1, key_serde="string", value_serde="int64")
    with iqkit.StoreWriter(root, name) as w:
        for i in range(n):
            w.put(f"{i // GROUP:04d}-{i % GROUP:04d}", i)
    with iqkit.open(root) as engine:  # builds the database in the cache
        # (a partition's first key lookup reads its files in place; the second builds it)
        for query in (KeyQuery.with_key("0000-0000"), KeyQuery.with_key("0000-0000").skip_cache()):
            engine.query(StateQueryRequest.in_store(name).with_query(query))
    objects = open_objects(root)
    chain = latest_version(objects, name).partitions[0]
    return os.fspath(database_folder(FileCache(), objects, name, 0, chain))


def best(fn: Callable[[], object], repeat: int) -> float:
    """Median of ``repeat`` timed runs, seconds (after one warm-up run)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def paired(a: Callable[[], object], b: Callable[[], object], rounds: int) -> tuple[float, float]:
    """The fastest of ``rounds`` runs of each of ``a`` and ``b``, taken in turns, seconds:
    for per-key costs of a microsecond, where this machine's background load moves a
    median by tens of percent between two runs, alternating makes both see the same
    load and the fastest run is the one least disturbed (as ``timeit`` reports)."""
    a(), b()
    times_a, times_b = [], []
    for _ in range(rounds):
        for fn, times in ((a, times_a), (b, times_b)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return min(times_a), min(times_b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=10_000)
    args = parser.parse_args()
    random.seed(7)
    rows: list[tuple[str, str, str, str, str]] = []

    with tempfile.TemporaryDirectory() as root, tempfile.TemporaryDirectory() as cache:
        # A chain store's databases are built in the reader's cache: a folder of the
        # bench's own, never the user's cache.
        os.environ["IQKIT_CACHE"] = cache
        t0 = time.perf_counter()
        big_path = build(root, "big", args.keys)
        small_path = build(root, "small", args.small)
        build_s = time.perf_counter() - t0
        raw_big = rocks.open_for_read(big_path)
        raw_small = rocks.open_for_read(small_path)
        engine = iqkit.open(root)
        n = args.keys

        # 1. KeyQuery vs raw get --------------------------------------------------------
        keys = [f"{(j := random.randrange(n)) // GROUP:04d}-{j % GROUP:04d}" for _ in range(20_000)]
        raw_keys = [kv_key(k.encode()) for k in keys]
        requests = [
            StateQueryRequest.in_store("big").with_query(KeyQuery.with_key(k).skip_cache())
            for k in keys
        ]

        def raw_gets() -> None:
            get = raw_big.get
            for k in raw_keys:
                get(k)

        def engine_gets() -> None:
            q = engine.query
            for r in requests:
                q(r)

        def engine_gets_with_build() -> None:
            q = engine.query
            for k in keys:
                q(StateQueryRequest.in_store("big").with_query(KeyQuery.with_key(k).skip_cache()))

        t_raw, t_eng = (t / len(keys) for t in paired(raw_gets, engine_gets, 7))
        t_build = best(engine_gets_with_build, 3) / len(keys)
        rows.append(
            (
                "KeyQuery (skip_cache) vs raw `get`",
                f"{t_eng * 1e6:.2f} µs",
                f"{t_raw * 1e6:.2f} µs",
                f"{t_eng / t_raw:.1f}×",
                "≤ 6×",
            )
        )
        # The same on the small store, whose blocks all stay in RocksDB's cache: the raw
        # get is at its cheapest, so iqkit's own cost per query shows most.
        small_keys = [
            f"{(j := random.randrange(args.small)) // GROUP:04d}-{j % GROUP:04d}"
            for _ in range(20_000)
        ]
        small_raw = [kv_key(k.encode()) for k in small_keys]
        small_requests = [
            StateQueryRequest.in_store("small").with_query(KeyQuery.with_key(k).skip_cache())
            for k in small_keys
        ]

        def raw_small_gets() -> None:
            get = raw_small.get
            for k in small_raw:
                get(k)

        def engine_small_gets() -> None:
            q = engine.query
            for r in small_requests:
                q(r)

        t_raw_s, t_eng_s = (
            t / len(small_keys) for t in paired(raw_small_gets, engine_small_gets, 7)
        )
        rows.append(
            (
                f"… on the {args.small:,}-key store (every block cached)",
                f"{t_eng_s * 1e6:.2f} µs",
                f"{t_raw_s * 1e6:.2f} µs",
                f"{t_eng_s / t_raw_s:.1f}×",
                "≤ 6×",
            )
        )
        rows.append(
            (
                "… including building the request",
                f"{t_build * 1e6:.2f} µs",
                f"{t_raw * 1e6:.2f} µs",
                f"{t_build / t_raw:.1f}×",
                "(info)",
            )
        )

        # 2. MultiKeyQuery of 1,000 keys vs raw multi-get ---------------------------------
        batches = [keys[i : i + 1000] for i in range(0, 10_000, 1000)]
        raw_batches = [[kv_key(k.encode()) for k in b] for b in batches]
        multi = [
            StateQueryRequest.in_store("big").with_query(MultiKeyQuery.with_keys(b).skip_cache())
            for b in batches
        ]

        def raw_multi() -> None:
            for b in raw_batches:
                raw_big.get(b)

        def engine_multi() -> None:
            for r in multi:
                engine.query(r)

        t_raw = best(raw_multi, 5) / len(batches)
        t_eng = best(engine_multi, 5) / len(batches)
        rows.append(
            (
                "MultiKeyQuery, 1,000 keys vs raw multi-get",
                f"{t_eng * 1e3:.2f} ms",
                f"{t_raw * 1e3:.2f} ms",
                f"{t_eng / t_raw:.1f}×",
                "≤ 3×",
            )
        )

        # 3. Prefix scan of 1,000 rows vs raw bounded iteration, and vs a full scan ------
        prefixes = [f"{random.randrange(n // GROUP):04d}-" for _ in range(20)]
        prefix_requests = [
            StateQueryRequest.in_store("big").with_query(PrefixScanQuery.with_prefix(p))
            for p in prefixes
        ]
        bounds = [kv_prefix_range(p.encode()) for p in prefixes]

        def raw_prefix() -> None:
            for lo, hi in bounds:  # plain rocksdict: a bounded iterator drained in C
                opts = ReadOptions()
                opts.set_iterate_lower_bound(lo)
                opts.set_iterate_upper_bound(hi)
                got = list(raw_big.items(from_key=lo, read_opt=opts))
                assert len(got) == GROUP

        def engine_prefix() -> None:
            for r in prefix_requests:
                with engine.query(r).partition_results[0].result as it:
                    got = list(it)
                assert len(got) == GROUP

        def full_scan_filter() -> None:
            target = kv_key(prefixes[0].encode())
            got = [kv for kv in raw_big.items() if kv[0].startswith(target)]
            assert len(got) == GROUP

        t_raw = best(raw_prefix, 5) / len(prefixes)
        t_eng = best(engine_prefix, 5) / len(prefixes)
        t_full = best(full_scan_filter, 2)
        rows.append(
            (
                "PrefixScanQuery, 1,000 rows vs raw bounded iteration",
                f"{t_eng * 1e3:.3f} ms",
                f"{t_raw * 1e3:.3f} ms",
                f"{t_eng / t_raw:.1f}×",
                "≤ 3×",
            )
        )
        rows.append(
            (
                "PrefixScanQuery vs full scan + filter (raw)",
                f"{t_eng * 1e3:.3f} ms",
                f"{t_full * 1e3:.1f} ms",
                f"{t_full / t_eng:.0f}× faster",
                "≥ 100× faster",
            )
        )

        # 4. Last 100 records, descending, 10k vs 1M keys ---------------------------------
        def last_100(store: str) -> Callable[[], None]:
            req = StateQueryRequest.in_store(store).with_query(
                RangeQuery.with_no_bounds().with_descending_keys()
            )

            def run() -> None:
                for _ in range(50):
                    with engine.query(req).partition_results[0].result as it:
                        got = list(islice(it, 100))
                    assert len(got) == 100

            return run

        t_small = best(last_100("small"), 5) / 50
        t_big = best(last_100("big"), 5) / 50
        rows.append(
            (
                f"Last 100 descending: {args.keys:,} vs {args.small:,} keys",
                f"{t_big * 1e6:.0f} µs",
                f"{t_small * 1e6:.0f} µs",
                f"{t_big / t_small:.2f}×",
                "≤ 2×",
            )
        )

        engine.close()
        rocks.close_quietly(raw_big)
        rocks.close_quietly(raw_small)
        rows.append(first_open_row(root))

    print_table("core", f"stores built in {build_s:.1f}s", rows)


def first_open_row(root: str, partitions: int = 8, keys: int = 80_000) -> tuple[str, ...]:
    """The first query of a version on a machine, over every partition of a store (each
    partition's database built in an empty cache)."""
    name = "first"
    iqkit.create_store(root, name, partitions=partitions, key_serde="string", value_serde="int64")
    with iqkit.StoreWriter(root, name) as w:
        for i in range(keys):
            w.put(f"k{i:07d}", i)
    query = RangeQuery.with_range("k0000000", "k0000009")
    req = StateQueryRequest.in_store(name).with_query(query)

    def run() -> None:
        with tempfile.TemporaryDirectory(dir=os.environ["IQKIT_CACHE"]) as cache:
            os.environ["IQKIT_CACHE"], outer = cache, os.environ["IQKIT_CACHE"]
            try:
                with iqkit.open(root) as engine:
                    result = engine.query(req)
                    assert len(result.partition_results) == partitions
            finally:
                os.environ["IQKIT_CACHE"] = outer

    t_first = best(run, 7)
    return (
        f"First query of a version, {partitions} partitions (databases built)",
        f"{t_first * 1e3:.1f} ms",
        "",
        "",
        "(info)",
    )


def print_table(
    title: str,
    note: str,
    rows: list[tuple[str, str, str, str, str]],
    out: Callable[[str], object] = print,
) -> None:
    """The benchmarks' Markdown output: a heading, the machine, the table (each line
    handed to ``out``)."""
    out(f"# iqkit {title} benchmark — {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    out(
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
        f"{platform.system()} {platform.release()}; {note}\n"
    )
    out("| measure | iqkit | reference | ratio | target |")
    out("|---|---|---|---|---|")
    for r in rows:
        out("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
