"""Merge-on-read of a store with a base and deltas (issue 36), against DuckDB over one
zstd Parquet file of the same live rows.

    .venv/bin/python bench/bench_merge.py build ROOT [--keys 2000000] [--deltas 8]
    .venv/bin/python bench/bench_merge.py run ROOT [--repeat 3]
    .venv/bin/python bench/bench_merge.py candidates ROOT [--repeat 3]

``build`` writes with ``iqkit.StoreWriter`` a store of ``--keys`` string keys (8
partitions, JSON values ``{total: float, n: int, region: one of 50}``), then ``--deltas``
commits each updating 1% and deleting 0.1% of the live keys (random), and
``ROOT/live.parquet``: the same live rows, one zstd Parquet file (the reference).

``run`` times, each in a fresh child process with an empty ``IQKIT_CACHE``, the first
``iqkit.sql`` aggregate (``SELECT region, sum(total), count(*) ... GROUP BY region``) and
the whole store to Arrow (``store_batches(...).read_all()``), then the same again warm in
that process, against DuckDB over ``live.parquet`` (fresh connection each run) and
``pyarrow.parquet.read_table`` of it; prints a Markdown table of medians and ratios.

``candidates`` times the merge alone, in DuckDB over the twin files of the latest
version: today's key anti join (the view of ``sqlsession/twins.py``) against position
deletes (the view with deletes files, ``columnar/deletes.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

STORE = "orders"
QUERY = f"SELECT region, sum(total) AS total, count(*) AS n FROM {STORE} GROUP BY region"
REF = (
    "SELECT region, sum(total) AS total, count(*) AS n FROM read_parquet('{path}') GROUP BY region"
)
REGIONS = [f"region-{i:02d}" for i in range(50)]


def build(root: str, keys: int, deltas: int, seed: int = 36) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    import iqkit

    rng = random.Random(seed)
    iqkit.create_store(root, STORE, partitions=8, value_serde="json")
    live: dict[str, dict] = {}

    def value() -> dict:
        return {
            "total": rng.random() * 1000,
            "n": rng.randrange(1000),
            "region": rng.choice(REGIONS),
        }

    t0 = time.perf_counter()
    with iqkit.StoreWriter(root, STORE) as w:
        for i in range(keys):
            k = f"k{i:09d}"
            v = value()
            live[k] = v
            w.put(k, v)
    print(f"base: {keys} keys in {time.perf_counter() - t0:.1f} s", flush=True)
    for d in range(deltas):
        names = list(live)
        updated = rng.sample(names, keys // 100)
        deleted = rng.sample(names, keys // 1000)
        t0 = time.perf_counter()
        with iqkit.StoreWriter(root, STORE) as w:
            for k in updated:
                v = value()
                live[k] = v
                w.put(k, v)
            for k in deleted:
                if k in live:
                    del live[k]
                    w.delete(k)
        print(f"delta {d + 1}: {time.perf_counter() - t0:.2f} s", flush=True)
    names = sorted(live)
    table = pa.table(
        {
            "key": names,
            "total": [live[k]["total"] for k in names],
            "n": [live[k]["n"] for k in names],
            "region": [live[k]["region"] for k in names],
        }
    )
    pq.write_table(table, os.path.join(root, "live.parquet"), compression="zstd")
    print(f"live rows: {len(names)}", flush=True)


_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import iqkit
from iqkit.tables import store_batches
root, what, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
def once():
    if what == "sql":
        return iqkit.sql(QUERY, root=root).sort_values("region").values.tolist()
    with iqkit.open(root) as e:
        return store_batches(e, STORE).read_all().num_rows
first_out = once()
first = time.perf_counter() - t0
warm = []
for _ in range(repeat):
    t = time.perf_counter(); out = once(); warm.append(time.perf_counter() - t)
print(json.dumps({"first": first, "warm": sorted(warm)[len(warm) // 2], "out": repr(first_out)[:200]}))
"""


def _child(root: str, what: str, repeat: int) -> dict:
    code = f"QUERY = {QUERY!r}\nSTORE = {STORE!r}\n" + _CHILD
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "IQKIT_CACHE": cache}
        out = subprocess.run(
            [sys.executable, "-c", code, root, what, str(repeat)],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def _reference(root: str, what: str, repeat: int) -> tuple[float, float]:
    """DuckDB (or pyarrow) over live.parquet: the first run in a fresh child process
    (import included, like iqkit's), and the median warm run."""
    path = os.path.join(root, "live.parquet")
    code = (
        "import sys, time, json\nt0 = time.perf_counter()\n"
        + (
            f"import duckdb\nf = lambda: duckdb.connect().sql({REF.format(path=path)!r}).fetchall()\n"
            if what == "sql"
            else f"import pyarrow.parquet as pq\nf = lambda: pq.read_table({path!r}).num_rows\n"
        )
        + "f(); first = time.perf_counter() - t0\nw = []\n"
        + f"for _ in range({repeat}):\n    t = time.perf_counter(); f(); w.append(time.perf_counter() - t)\n"
        + "print(json.dumps([first, sorted(w)[len(w) // 2]]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    first, warm = json.loads(out.stdout)
    return first, warm


def run(root: str, repeat: int) -> None:
    rows = []
    for what, label in (("sql", "`iqkit.sql` aggregate"), ("arrow", "whole store to Arrow")):
        firsts, warms, rfirsts, rwarms = [], [], [], []
        for _ in range(repeat):  # alternating, so load changes favour neither side
            r = _child(root, what, repeat)
            firsts.append(r["first"])
            warms.append(r["warm"])
            rf, rw = _reference(root, what, repeat)
            rfirsts.append(rf)
            rwarms.append(rw)
        med = statistics.median
        rows.append((f"{label}, first (fresh process)", med(firsts), med(rfirsts)))
        rows.append((f"{label}, warm (same process)", med(warms), med(rwarms)))
    print("| | iqkit | reference | ratio |\n|---|---|---|---|")
    for label, a, b in rows:
        print(f"| {label} | {a:.3f} s | {b:.3f} s | {a / b:.2f}× |")


def candidates(root: str, repeat: int) -> None:
    """The merge alone in DuckDB over the latest version's twins (module docstring)."""
    import duckdb

    import iqkit
    from iqkit.sqlsession.twins import twin_view

    def time_sql(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[float, object]:
        q = f"SELECT region, sum(total), count(*) FROM ({sql}) GROUP BY region ORDER BY region"
        out = con.sql(q).fetchall()
        ts = []
        for _ in range(repeat):
            t = time.perf_counter()
            out = con.sql(q).fetchall()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts), out

    con = duckdb.connect()
    path = os.path.join(root, "live.parquet")
    ref, expected = time_sql(con, f"SELECT * FROM read_parquet('{path}')")
    print(f"| merge | seconds | ratio |\n|---|---|---|\n| reference | {ref:.3f} | 1.00× |")
    with iqkit.open(root) as engine:
        from iqkit.sqlsession.session import _twin_files  # type: ignore[attr-defined]

        files = _twin_files(engine, STORE)
        for label, legacy in (("key anti join", True), ("position deletes", False)):
            view = twin_view(con, STORE, files, positions=not legacy, keep=True)
            assert view is not None
            t, out = time_sql(con, view.sql)
            ok = "" if _close(out, expected) else " (WRONG ROWS)"
            print(f"| {label}{ok} | {t:.3f} | {t / ref:.2f}× |")
        files.release()


def _close(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x[0] == y[0] and abs(x[1] - y[1]) < 1e-6 * max(1, abs(y[1])) and x[2] == y[2]
        for x, y in zip(a, b, strict=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build", "run", "candidates"])
    parser.add_argument("root")
    parser.add_argument("--keys", type=int, default=2_000_000)
    parser.add_argument("--deltas", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.command == "build":
        build(args.root, args.keys, args.deltas)
    elif args.command == "run":
        run(args.root, args.repeat)
    else:
        candidates(args.root, args.repeat)


if __name__ == "__main__":
    main()
