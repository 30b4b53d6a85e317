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
version: the key anti join (``sqlsession/twins.py`` for chains of an earlier iqkit)
against position deletes joined three ways (the bitmap join is what the view does,
``columnar/deletes.py``), and two floors (no merge at all).
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
root, what, repeat, query, store = sys.argv[1:]
def once():
    if what == "sql":
        return iqkit.sql(query, root=root).sort_values("region").values.tolist()
    with iqkit.open(root) as e:
        return store_batches(e, store).read_all().num_rows
once()
first = time.perf_counter() - t0
warm = []
for _ in range(int(repeat)):
    t = time.perf_counter()
    once()
    warm.append(time.perf_counter() - t)
print(json.dumps({"first": first, "warm": sorted(warm)[len(warm) // 2]}))
"""

_REFERENCE = r"""
import json, sys, time
t0 = time.perf_counter()
path, what, repeat, query = sys.argv[1:]
if what == "sql":
    import duckdb
    f = lambda: duckdb.connect().sql(query.format(path=path)).fetchall()
else:
    import pyarrow.parquet as pq
    f = lambda: pq.read_table(path).num_rows
f()
first = time.perf_counter() - t0
warm = []
for _ in range(int(repeat)):
    t = time.perf_counter()
    f()
    warm.append(time.perf_counter() - t)
print(json.dumps({"first": first, "warm": sorted(warm)[len(warm) // 2]}))
"""


def _child(code: str, args: list[str]) -> dict:
    """Run ``code`` in a fresh process with an empty ``IQKIT_CACHE``; its JSON line."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "IQKIT_CACHE": cache}
        out = subprocess.run(
            [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(root: str, repeat: int) -> None:
    path = os.path.join(root, "live.parquet")
    rows = []
    for what, label in (("sql", "`iqkit.sql` aggregate"), ("arrow", "whole store to Arrow")):
        got: dict[str, list[float]] = {"first": [], "warm": [], "rfirst": [], "rwarm": []}
        for _ in range(repeat):  # alternating, so load changes favour neither side
            a = _child(_CHILD, [root, what, str(repeat), QUERY, STORE])
            b = _child(_REFERENCE, [path, what, str(repeat), REF])
            got["first"].append(a["first"])
            got["warm"].append(a["warm"])
            got["rfirst"].append(b["first"])
            got["rwarm"].append(b["warm"])
        med = {k: statistics.median(v) for k, v in got.items()}
        rows.append((f"{label}, first (fresh process)", med["first"], med["rfirst"]))
        rows.append((f"{label}, again (same process)", med["warm"], med["rwarm"]))
    print("| | iqkit | reference | ratio |\n|---|---|---|---|")
    for label, a, b in rows:
        print(f"| {label} | {a:.3f} s | {b:.3f} s | {a / b:.2f}× |")


def candidates(root: str, repeat: int) -> None:
    """The merge alone, in DuckDB over the latest version's twins: each candidate's SQL
    aggregated as ``QUERY`` is, against DuckDB over ``live.parquet``. Positions are
    computed here from the twins' keys (whatever wrote the store)."""
    import duckdb
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    import iqkit
    from iqkit.sqlsession.twins import _key_branches, _lookup
    from iqkit.store.columnar.columns import twin_columns

    con = duckdb.connect()

    def timed(sql: str) -> tuple[float, list]:
        q = f"SELECT region, sum(total), count(*) FROM ({sql}) GROUP BY region ORDER BY region"
        out = con.sql(q).fetchall()
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            out = con.sql(q).fetchall()
            times.append(time.perf_counter() - t)
        return statistics.median(times), [r[2] for r in out]

    ref, want = timed(f"SELECT * FROM read_parquet('{os.path.join(root, 'live.parquet')}')")
    print(f"| merge | seconds | ratio |\n|---|---|---|\n| reference | {ref:.3f} | 1.00× |")
    with iqkit.open(root) as engine:
        files = engine.twin_files(STORE)
        assert files is not None
        chains = files.partitions
        paths, parts, dead = [], [], {}
        for p, chain in sorted(chains.items()):
            keys = [pq.read_table(f.path, columns=["key"]).column("key") for f in chain]
            newer = None
            for i in range(len(chain) - 1, -1, -1):
                k = keys[i].combine_chunks()
                if newer is not None:
                    hit = pc.is_in(k, value_set=newer).to_numpy(zero_copy_only=False)
                    dead[len(paths) + i] = hit
                newer = k if newer is None else pa.concat_arrays([newer, k])
            paths += [f.path for f in chain]
            parts += [p] * len(chain)
        files_sql = ", ".join(f"'{x}'" for x in paths)
        src = f"read_parquet([{files_sql}], file_row_number = true)"
        part = _lookup(parts)
        g = "CAST(file_index AS BIGINT) * 4294967296 + file_row_number"
        ints = np.concatenate([f * (1 << 32) + np.flatnonzero(m) for f, m in dead.items()])
        con.register("dead_rows", pa.table({"g": ints}))
        masks = [(f, np.packbits(m).tobytes()) for f, m in dead.items()]
        con.register("masks", pa.table({"f": [f for f, _ in masks], "m": [m for _, m in masks]}))
        cases = {
            "(a) key anti join (today)": " UNION ALL BY NAME ".join(
                _key_branches(chains, twin_columns(chains, files.layout))
            ),
            "(b1) positions: anti join on (file, row)": (
                f"SELECT {part} AS partition, o.* FROM {src} o WHERE NOT __deleted AND NOT "
                f"EXISTS (SELECT 1 FROM dead_rows d WHERE d.g = {g})"
            ),
            "(b2) positions: int64 ANTI JOIN": (
                f"SELECT o.* FROM (SELECT {part} AS partition, {g} AS g, * FROM {src} "
                f"WHERE NOT __deleted) o ANTI JOIN dead_rows d ON d.g = o.g"
            ),
            "(b3) positions: per-file bitmap, get_bit (chosen)": (
                f"SELECT {part} AS partition, o.* FROM {src} o LEFT JOIN (SELECT f, "
                f"CAST(m AS BIT) AS m FROM masks) k ON k.f = o.file_index WHERE NOT "
                f"__deleted AND (k.m IS NULL OR get_bit(k.m, CAST(file_row_number AS INTEGER)) = 0)"
            ),
            "floor: every file, no merge (wrong rows)": (
                f"SELECT * FROM read_parquet([{files_sql}]) WHERE NOT __deleted"
            ),
            "floor: the bases alone (wrong rows)": "SELECT * FROM read_parquet(["
            + ", ".join(f"'{c[0].path}'" for _, c in sorted(chains.items()))
            + "]) WHERE NOT __deleted",
        }
        for label, sql in cases.items():
            t, counts = timed(sql)
            flag = "" if counts == want or "floor" in label else " WRONG ROWS"
            print(f"| {label}{flag} | {t:.3f} | {t / ref:.2f}× |")
        files.release()


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
