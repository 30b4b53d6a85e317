"""Stores with many partitions (issue 20), as ratios against the same rows in 8.

    .venv/bin/python bench/bench_partitions.py [--keys 15000] [--partitions 1000,10000]

Runs under a soft ``ulimit -n`` of 1024 (set here, as most Linux sessions have it). For
each partition count it builds a chain store on a local root holding ``--keys`` rows
(string keys, murmur2: few rows per partition, many partitions), and the same rows in a
store of 8 partitions (the reference), then measures on both:

1. creating the store and its first commit (every row);
2. a commit changing 1% of the keys (writer in a fresh process state: records read);
3. the first full range of a fresh engine with a cold cache (``IQKIT_CACHE`` empty:
   every partition's database is built), every row read;
4. the same full range again in that engine (warm: databases built, partitions open or
   reopened under the descriptor bound);
5. a key lookup in that engine (routed to one partition).

Prints a Markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from bench_core import best, print_table

import iqkit
from iqkit.store.chain.snapshot import descriptor_budget

STORE = "wide"
REFERENCE = 8
FD_LIMIT = 1024


def build(root: Path, partitions: int, keys: int) -> float:
    t0 = time.perf_counter()
    iqkit.create_store(root, STORE, partitions=partitions, value_serde="string")
    with iqkit.StoreWriter(root, STORE) as w:
        for i in range(keys):
            w.put(f"key-{i:06d}", f"value-{i}")
    return time.perf_counter() - t0


def commit_share(root: Path, keys: int, share: float = 0.01) -> float:
    t0 = time.perf_counter()
    with iqkit.StoreWriter(root, STORE) as w:
        for i in range(0, keys, int(1 / share)):
            w.put(f"key-{i:06d}", f"changed-{i}")
    return time.perf_counter() - t0


def full_range(engine: iqkit.StateEngine) -> int:
    req = iqkit.StateQueryRequest.in_store(STORE).with_query(iqkit.RangeQuery.with_no_bounds())
    n = 0
    for qr in engine.query(req).partition_results.values():
        assert qr.is_success, qr.failure_message
        with qr.result as it:
            n += sum(1 for _ in it)
    return n


def measure(folder: Path, partitions: int, keys: int) -> dict[str, float]:
    root = folder / f"root-{partitions}"
    out = {"build": build(root, partitions, keys), "commit": commit_share(root, keys)}
    os.environ["IQKIT_CACHE"] = os.fspath(folder / f"cache-{partitions}")
    with iqkit.open(root) as engine:
        t0 = time.perf_counter()
        assert full_range(engine) == keys
        out["cold"] = time.perf_counter() - t0
        out["warm"] = best(lambda: full_range(engine), 3)
        req = iqkit.StateQueryRequest.in_store(STORE).with_query(
            iqkit.KeyQuery.with_key("key-000042")
        )
        engine.query(req)
        out["key"] = best(lambda: engine.query(req), 200)
        out["open"] = float(len(engine._format._bound))  # partitions held at the end
        out["fds"] = float(engine._format._bound.held)  # their descriptors (memory copies: none)
    shutil.rmtree(root)
    shutil.rmtree(folder / f"cache-{partitions}", ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=15_000)
    parser.add_argument("--partitions", default="1000,10000")
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(FD_LIMIT, hard), hard))
    table: list[tuple[str, str, str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        ref = measure(folder, REFERENCE, args.keys)
        for n in (int(p) for p in args.partitions.split(",")):
            got = measure(folder, n, args.keys)
            for label, key, unit in (
                ("create + first commit (every row)", "build", "s"),
                ("commit changing 1% of the keys", "commit", "s"),
                ("first full range, cold cache (databases built)", "cold", "s"),
                ("full range again, same engine (warm)", "warm", "s"),
                ("key lookup, same engine", "key", "µs"),
            ):
                scale = 1e6 if unit == "µs" else 1.0
                table.append((
                    f"{n:,} partitions: {label}",
                    f"{got[key] * scale:.3g} {unit}",
                    f"{ref[key] * scale:.3g} {unit} ({REFERENCE} partitions)",
                    f"{got[key] / ref[key]:.1f}×",
                    "(info)",
                ))  # fmt: skip
            table.append((f"{n:,} partitions: partitions held open / their descriptors",
                          f"{got['open']:.0f} / {got['fds']:.0f}",
                          f"budget {descriptor_budget()} descriptors",
                          "", "never 'Too many open files'"))  # fmt: skip
    print_table(
        "partitions",
        f"{args.keys:,} keys; soft ulimit -n {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}",
        table,
    )


if __name__ == "__main__":
    main()
