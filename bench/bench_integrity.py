"""What integrity checks cost (issue 34), on the shape users have: a store with a base
and 8 deltas, at several sizes, against the same code without the checks.

    .venv/bin/python bench/bench_integrity.py [--sizes 200000 1000000] [--repeat 5]
    .venv/bin/python bench/bench_integrity.py --against /path/to/checkout-before-checksums

Each size builds, with ``StoreWriter``, a JSON-record store of 8 partitions
(``{total: float, n: int, region: str}``, random floats and varied strings), then 8
commits that each update 1% and delete 0.1% of the keys (a chain of a base and 8 deltas
per partition, the longest today's policy keeps). Then, in one process:

* the first ``iqkit.sql`` aggregate of the version (a new engine, an empty
  ``IQKIT_CACHE``, no file known whole: every twin and SST is hashed), against DuckDB over
  one zstd Parquet file of the same live rows;
* the first KeyQuery of the version (new engine, empty cache), and a warm one (the
  request built once, as a notebook loop has it).

``--against DIR`` runs the same measurement with the iqkit of another checkout (a
worktree of the commit before checksums) in a child process, in turns with this one, and
prints both with their ratio: the cost of checking, measured on the same machine.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARTITIONS = 8
DELTAS = 8
REGIONS = [f"region-{i}-{'x' * (i % 7)}" for i in range(37)]


def build(root: Path, rows: int) -> dict[str, dict]:
    import iqkit

    rng = random.Random(rows)
    iqkit.create_store(root, "t", partitions=PARTITIONS, key_serde="string", value_serde="json")
    live: dict[str, dict] = {}
    with iqkit.StoreWriter(root, "t") as w:
        for i in range(rows):
            key = f"k{i:09d}"
            value = {"total": rng.random() * 1000, "n": i, "region": rng.choice(REGIONS)}
            w.put(key, value)
            live[key] = value
    for _ in range(DELTAS):
        keys = list(live)
        with iqkit.StoreWriter(root, "t") as w:
            for key in rng.sample(keys, rows // 100):
                value = {"total": rng.random() * 1000, "n": -1, "region": rng.choice(REGIONS)}
                w.put(key, value)
                live[key] = value
            for key in rng.sample(keys, rows // 1000):
                w.delete(key)
                live.pop(key, None)
    return live


def measure(rows: int, repeat: int) -> dict[str, float]:
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    import iqkit
    from iqkit import KeyQuery, StateQueryRequest

    forget = None
    with contextlib.suppress(ImportError):
        forget = importlib.import_module("iqkit.store.integrity").forget_verified
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        live = build(folder / "root", rows)
        table = pa.table(
            {
                "key": list(live),
                "total": [v["total"] for v in live.values()],
                "region": [v["region"] for v in live.values()],
            }
        )
        parquet = os.fspath(folder / "t.parquet")
        pq.write_table(table, parquet, compression="zstd")
        sql = "SELECT region, sum(total) AS s, count(*) AS c FROM t GROUP BY region ORDER BY region"

        def cold(fn):
            times = []
            for _ in range(repeat):
                cache = folder / f"cache-{time.monotonic_ns()}"
                os.environ["IQKIT_CACHE"] = os.fspath(cache)
                if forget is not None:
                    forget()
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
                shutil.rmtree(cache, ignore_errors=True)
            return statistics.median(times)

        def aggregate():
            got = iqkit.sql(sql, root=folder / "root")
            assert int(got["c"].sum()) == len(live)

        key = next(iter(live))
        request = StateQueryRequest.in_store("t").with_query(KeyQuery.with_key(key))

        def first_key():
            with iqkit.open(folder / "root") as engine:
                assert engine.query(request).only_partition_result().result == live[key]

        duck = []
        for _ in range(repeat + 1):
            t0 = time.perf_counter()
            over_parquet = sql.replace("FROM t", f"FROM read_parquet('{parquet}')")
            duckdb.connect().sql(over_parquet).fetchall()
            duck.append(time.perf_counter() - t0)
        out = {
            "aggregate": cold(aggregate),
            "duckdb": min(duck[1:]),
            "first_key": cold(first_key),
        }
        os.environ["IQKIT_CACHE"] = os.fspath(folder / "warm-cache")
        with iqkit.open(folder / "root") as engine:
            engine.query(request)
            engine.query(request)
            best = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(2000):
                    engine.query(request)
                best.append((time.perf_counter() - t0) / 2000)
            out["warm_key"] = min(best)
        size = sum(p.stat().st_size for p in (folder / "root" / "t").rglob("*") if p.is_file())
        out["store_mib"] = size / 2**20
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--against", help="a checkout whose iqkit to measure in turns")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.repeat)))
        return

    def run(rows: int, checkout: str | None) -> dict[str, float]:
        env = dict(os.environ)
        if checkout is not None:
            env["PYTHONPATH"] = checkout  # before the editable install's path
        argv = [sys.executable, __file__, "--child", str(rows), "--repeat", str(args.repeat)]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    print("| keys | measure | this code | ratio to its reference |", end="")
    print(" code before | ratio this/before |" if args.against else "")
    print("|---|---|---|---|" + ("---|---|" if args.against else ""))
    for rows in args.sizes:
        now = run(rows, None)
        before = run(rows, args.against) if args.against else None
        lines = [
            ("first iqkit.sql aggregate, cold", "aggregate", now["aggregate"] / now["duckdb"]),
            ("first KeyQuery, cold", "first_key", None),
            ("warm KeyQuery", "warm_key", None),
        ]
        for label, field, ratio in lines:
            ref = f"{ratio:.2f}× DuckDB" if ratio is not None else "(info)"
            row = f"| {rows:,} | {label} | {now[field] * 1e3:.3f} ms | {ref} |"
            if before is not None:
                row += f" {before[field] * 1e3:.3f} ms | {now[field] / before[field]:.2f} |"
            print(row)
        print(f"| {rows:,} | store bytes (SSTs, twins, records) | {now['store_mib']:.1f} MiB | |")


if __name__ == "__main__":
    main()
