"""Versions as data (issue 24): what a change feed and a key's history cost.

    .venv/bin/python bench/bench_versions.py [--keys 1000000] [--versions 100] [--repeat 3]
    .venv/bin/python bench/bench_versions.py --profile changes   # cProfile of one case

Builds one store of ``--keys`` string keys in 8 partitions, JSON records
``{"price": float, "qty": int, "tag": short str}`` (version 1, one commit), then version 2
rewriting 1% of the keys with new values, then versions 3.. each rewriting 100 random
keys and the probe key, up to ``--versions`` versions (all retained; commits compact
each partition's chain every few versions, as they do in use). Then, in this process:

1. ``ChangesQuery.between(1, 2)`` on every partition, every ``Change`` built, against a
   full scan of the store through the same API (``RangeQuery.with_no_bounds()``, every
   row read as a ``KeyValue``), both on a new engine over an empty ``IQKIT_CACHE``
   (target: ≤ 5%). The full scan to Arrow (``tables.collect``, the columnar twins) is
   shown beside it for the record.
2. ``MultiVersionedKeyQuery`` of the probe key across every retained version against one
   ``KeyQuery`` of it, both cold (a new engine, empty cache: the first query of each), and
   both warm (the same engine again) (target: ≤ 20×).

Every result is checked once: the changes are exactly the rewritten keys, and the history
has one record per version that gave the probe key a new value.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_core import print_table
from bench_explore import cold_engine
from bench_explore import commit as head_commit

import iqkit
from iqkit import (
    ChangesQuery,
    KeyQuery,
    MultiVersionedKeyQuery,
    RangeQuery,
    StateQueryRequest,
)
from iqkit.tables import collect

PARTITIONS = 8
TAGS = tuple(f"tag{i:02d}" for i in range(16))
RECORD_SCHEMA = "price double, qty bigint, tag string"
PROBE = "k0000042"


def key_of(i: int) -> str:
    return f"k{i:07d}"


def record(i: int, version: int) -> dict[str, object]:
    return {"price": (i * 7919 % 10_000) / 100 + version, "qty": i % 50, "tag": TAGS[i % 16]}


def build(root: Path, keys: int, versions: int) -> tuple[float, int, int]:
    """The store; seconds taken, the keys version 2 changed, the probe's distinct values."""
    t0 = time.perf_counter()
    iqkit.create_store(
        root, "records", partitions=PARTITIONS, value_serde="json",
        retention=versions + 10, properties={"value_schema": RECORD_SCHEMA},
    )  # fmt: skip
    with iqkit.StoreWriter(root, "records") as w:
        for i in range(keys):
            w.put(key_of(i), record(i, 1))
    rng = random.Random(24)
    changed = rng.sample(range(keys), keys // 100)
    with iqkit.StoreWriter(root, "records") as w:
        for i in changed:
            w.put(key_of(i), record(i, 2))
    probe_values = 1 + (42 in changed)
    for v in range(3, versions + 1):
        with iqkit.StoreWriter(root, "records") as w:
            for i in rng.sample(range(keys), 100):
                w.put(key_of(i), record(i, v))
            w.put(PROBE, record(42, v))
        probe_values += 1
    return time.perf_counter() - t0, len(changed), probe_values


def request(query: object) -> StateQueryRequest:
    return StateQueryRequest.in_store("records").with_query(query)


def changes(engine: iqkit.StateEngine) -> int:
    result = engine.query(request(ChangesQuery.between(1, 2)))
    return sum(len(qr.result) for qr in result.partition_results.values())


def full_scan(engine: iqkit.StateEngine) -> int:
    result = engine.query(request(RangeQuery.with_no_bounds()))
    n = 0
    for qr in result.partition_results.values():
        with qr.result as rows:
            for _kv in rows:
                n += 1
    return n


def full_scan_arrow(engine: iqkit.StateEngine) -> int:
    query = RangeQuery.with_no_bounds()
    table = collect(engine.query(request(query)), engine.manifest("records"), query=query).table
    return table.num_rows  # type: ignore[no-any-return]


def history(engine: iqkit.StateEngine) -> int:
    result = engine.query(request(MultiVersionedKeyQuery.with_key(PROBE)))
    return sum(len(qr.result) for qr in result.partition_results.values())


def lookup(engine: iqkit.StateEngine) -> object:
    result = engine.query(request(KeyQuery.with_key(PROBE)))
    return result.only_partition_result().result


def cold(fn: Callable[[iqkit.StateEngine], object], folder: Path, root: Path, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        with cold_engine(folder, root) as engine:
            out = fn(engine)
            times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def warm(fn: Callable[[iqkit.StateEngine], object], folder: Path, root: Path, repeat: int):
    with cold_engine(folder, root) as engine:
        out = fn(engine)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn(engine)
            times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms" if seconds >= 0.001 else f"{seconds * 1e6:,.0f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--versions", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", choices=("changes", "history"))
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="iqkit-bench-versions-", dir=os.getcwd()))
    root = folder / "root"
    try:
        took, changed, probe_values = build(root, args.keys, args.versions)
        built = f"built {args.keys:,} keys, {args.versions} versions in {took:.0f} s"
        print(built, file=sys.stderr)
        if args.profile:
            fn = changes if args.profile == "changes" else history
            with cold_engine(folder, root) as engine:
                prof = cProfile.Profile()
                prof.enable()
                fn(engine)
                prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
            return
        t_changes, n_changes = cold(changes, folder, root, args.repeat)
        assert n_changes == changed, (n_changes, changed)
        t_scan, n_rows = cold(full_scan, folder, root, args.repeat)
        assert n_rows == args.keys
        t_arrow, n_arrow = cold(full_scan_arrow, folder, root, args.repeat)
        assert n_arrow == args.keys
        t_hist, n_hist = cold(history, folder, root, args.repeat)
        assert n_hist == probe_values, (n_hist, probe_values)
        t_key, _ = cold(lookup, folder, root, args.repeat)
        w_hist, _ = warm(history, folder, root, args.repeat)
        w_key, _ = warm(lookup, folder, root, max(args.repeat, 20))
        rows = [
            (
                f"changes between versions 1 and 2 ({changed:,} keys), cold",
                ms(t_changes), f"{ms(t_scan)} (full scan, KeyValue rows)",
                f"{t_changes / t_scan:.1%}",
                "≤ 5% " + ("met" if t_changes <= 0.05 * t_scan else "MISSED"),
            ),
            (
                "the same changes against the full scan to Arrow (twins)",
                ms(t_changes), ms(t_arrow), f"{t_changes / t_arrow:.1%}", "(info)",
            ),
            (
                f"history of one key across {args.versions} versions, cold",
                ms(t_hist), f"{ms(t_key)} (first KeyQuery, cold)",
                f"{t_hist / t_key:.1f}×", "≤ 20× " + ("met" if t_hist <= 20 * t_key else "MISSED"),
            ),
            (
                "the same history, warm (same engine again)",
                ms(w_hist), f"{ms(w_key)} (KeyQuery, warm)", f"{w_hist / w_key:.0f}×", "(info)",
            ),
        ]  # fmt: skip
        print_table(
            "versions",
            f"commit {head_commit()}, {args.keys:,} keys, {args.versions} versions, "
            f"medians of {args.repeat}",
            rows,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
