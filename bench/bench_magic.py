"""``%iq get`` through a real IPython shell vs the same KeyQuery through the Python API.

Target (issue 4): the magic within 2 ms of the API. Both run in this process against the
same store; the table shows medians over many lookups of random keys, and the
difference. ``run_cell`` adds what a notebook adds: the display hook formatting the
result (its HTML repr included).

    .venv/bin/python bench/bench_magic.py [--keys 100000] [--lookups 2000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable

import iqkit
from iqkit.jupyter.testing import IQTestShell, new_shell


def median_us(fn: Callable[[str], object], keys: list[str]) -> float:
    samples = []
    for k in keys:
        started = time.perf_counter_ns()
        fn(k)
        samples.append(time.perf_counter_ns() - started)
    return statistics.median(samples) / 1_000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--lookups", type=int, default=2_000)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="iqkit-bench-magic-")
    iqkit.create_store(root, "totals", partitions=4)
    with iqkit.StoreWriter(root, "totals") as w:
        for i in range(args.keys):
            w.put(f"customer-{i:07d}", {"customer": i, "total": i * 3})
    rng = random.Random(7)
    keys = [f"customer-{rng.randrange(args.keys):07d}" for _ in range(args.lookups)]

    engine = iqkit.open(root)

    def api(key: str) -> object:
        r = engine.query(
            iqkit.StateQueryRequest.in_store("totals").with_query(iqkit.KeyQuery.with_key(key))
        )
        return r.only_partition_result().result

    shell = new_shell(root=root, progress=False)

    def magic(key: str) -> object:
        return shell.run_line_magic("iq", f"get totals {key}")

    def cell(key: str) -> object:
        return shell.run_cell(f"%iq get totals {key}", store_history=False).result

    for fn in (api, magic, cell):  # warm caches, imports and the shell
        median_us(fn, keys[:200])
    rows = [
        (name, median_us(fn, keys))
        for name, fn in (
            ("Python API (engine.query)", api),
            ("%iq get (run_line_magic)", magic),
            ("%iq get (run_cell, displayed)", cell),
        )
    ]
    base = rows[0][1]
    print(f"{args.keys:,} keys, {args.lookups:,} random lookups, medians")
    print(f"{'path':34} {'µs/lookup':>10} {'vs API':>10}")
    for name, us in rows:
        print(f"{name:34} {us:10.1f} {us - base:+9.1f}µs")
    engine.close()
    IQTestShell.clear_instance()


if __name__ == "__main__":
    main()
