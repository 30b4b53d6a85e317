"""`%iq sql` speed: a store joined with a notebook DataFrame, against DuckDB on Arrow.

    .venv/bin/python bench/bench_sql.py [--rows 1000000] [--frame 10000] [--repeat 3]

Builds a kv store of ``--rows`` JSON records (4 partitions) in a temporary folder and a
pandas DataFrame of ``--frame`` customers, then times the same join (returning the
``--frame`` matching rows) five ways:

* ``SQLSession.query`` with the store streamed into DuckDB (what ``%iq sql`` does the
  first time it meets a store version; snapshots off so every run streams);
* ``SQLSession.query`` again on the same store version (served from the session's
  in-memory Arrow snapshot of that version, what a re-run or refined query costs);
* DuckDB joining the same rows already in an Arrow table (the target's baseline);
* the store → Arrow stream alone (``iqkit.tables.store_batches(...).read_all()``);
* by hand: the stream read into Arrow first, then DuckDB (stream + baseline);
* ``SQLSession.query`` over the Arrow table registered by name (the session's own
  overhead: resolution, parameters, the worker thread, the DataFrame result);
* the first and the stream-alone cases again with ``iqkit.tables.bulk_decode(False)``, i.e.
  every row decoded by the engine (``json.loads`` per value), as before bulk decoding.

Prints a Markdown table: median seconds of ``--repeat`` runs after one warm-up run, and
each time as a multiple of the baseline. Target (README): the first line within 3x of
the second. Then a second table, bulk decoding against row by row in the same process,
runs alternating: ``store_batches(...).read_all()`` of the whole store and ``collect`` of
a range scan of ``--collect`` rows (what ``%iq range`` does).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime

import duckdb
import pandas as pd
import pyarrow as pa

import iqkit
from iqkit import tables
from iqkit.sqlsession import SQLSession
from iqkit.tables import collect, store_batches

STORE = "totals"
QUERY = (
    "SELECT t.key, t.total, t.region, c.name, c.segment "
    "FROM totals t JOIN customers c ON c.key = t.key"
)
TARGET = 3.0


def build(root: str, rows: int) -> None:
    iqkit.create_store(root, STORE, partitions=4, value_serde="json")
    regions = ("eu", "us", "apac")
    with iqkit.StoreWriter(root, STORE) as w:
        for i in range(rows):
            w.put(f"c{i:07d}", {"total": i % 9973, "region": regions[i % 3], "orders": i % 17})


def customers(rows: int, frame: int) -> pd.DataFrame:
    step = max(1, rows // frame)
    keys = [f"c{i:07d}" for i in range(0, step * frame, step)]
    return pd.DataFrame(
        {
            "key": keys,
            "name": [f"customer {i}" for i in range(len(keys))],
            "segment": [("retail", "business")[i % 2] for i in range(len(keys))],
        }
    )


def median_time(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    """Median seconds of ``repeat`` runs after one warm-up run, and the last result."""
    out = fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def paired_times(
    a: Callable[[], object], b: Callable[[], object], repeat: int
) -> tuple[float, float, object, object]:
    """Median seconds of ``a`` and of ``b`` run alternately ``repeat`` times after one
    warm-up each, and their last results: alternating keeps a shared machine's load
    changes from favouring one side of the ratio."""
    out_a, out_b = a(), b()
    times_a, times_b = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out_a = a()
        times_a.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        out_b = b()
        times_b.append(time.perf_counter() - t0)
    return statistics.median(times_a), statistics.median(times_b), out_a, out_b


def canonical(frame: pd.DataFrame) -> list[tuple]:
    return sorted(map(tuple, frame[["key", "total", "region", "name"]].values.tolist()))


def row_by_row(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run with bulk decoding off: every row decoded by the engine, as before."""

    def run() -> object:
        with tables.bulk_decode(False):
            return fn()

    return run


def collect_range(engine: iqkit.StateEngine, rows: int) -> Callable[[], pa.Table]:
    """``collect`` of a range scan of the first ``rows`` keys (every partition)."""
    query = iqkit.RangeQuery.with_range("c0000000", f"c{rows - 1:07d}")
    request = iqkit.StateQueryRequest.in_store(STORE).with_query(query)
    manifest = engine.manifest(STORE)

    def run() -> pa.Table:
        return collect(engine.query(request), manifest, query=query).table

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--frame", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--collect", type=int, default=100_000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = f"{tmp}/stores"
        t0 = time.perf_counter()
        build(root, args.rows)
        build_s = time.perf_counter() - t0
        people = customers(args.rows, args.frame)

        with iqkit.open(root) as engine:
            in_arrow = store_batches(engine, STORE).read_all()
            raw = duckdb.connect(":memory:")
            raw.register(STORE, in_arrow)
            raw.register("customers", people)

            def duckdb_on_arrow() -> pd.DataFrame:
                return raw.sql(QUERY).df()

            def stream_alone() -> object:
                return store_batches(engine, STORE).read_all()

            def by_hand() -> pd.DataFrame:
                con = duckdb.connect(":memory:")
                con.register(STORE, store_batches(engine, STORE).read_all())
                con.register("customers", people)
                try:
                    return con.sql(QUERY).df()
                finally:
                    con.close()

            ns = {"customers": people}
            with (
                SQLSession(engine=engine, namespace=ns, cache_bytes=0) as session,
                SQLSession(engine=engine, namespace=ns) as cached,
            ):

                def session_streamed() -> pd.DataFrame:
                    return session.query(QUERY)

                def session_cached() -> pd.DataFrame:
                    return cached.query(QUERY)

                with SQLSession(namespace={"customers": people}) as on_arrow:
                    on_arrow.register(STORE, in_arrow)

                    def session_on_arrow() -> pd.DataFrame:
                        return on_arrow.query(QUERY)

                    cases = [
                        ("`%iq sql` join, store streamed (SQLSession.query)", session_streamed),
                        ("DuckDB join, rows already in Arrow (baseline)", duckdb_on_arrow),
                        ("`%iq sql` join again, same store version (snapshot)", session_cached),
                        ("store → Arrow stream alone (store_batches)", stream_alone),
                        ("stream read into Arrow, then DuckDB join", by_hand),
                        ("SQLSession.query over the Arrow table", session_on_arrow),
                        (
                            "`%iq sql` join, store streamed, rows decoded one by one (before)",
                            row_by_row(session_streamed),
                        ),
                        (
                            "store → Arrow stream alone, rows decoded one by one (before)",
                            row_by_row(stream_alone),
                        ),
                    ]
                    results = [(label, *median_time(fn, args.repeat)) for label, fn in cases]
            scan = collect_range(engine, args.collect)
            decoding = [
                ("store_batches(...).read_all(), whole store", stream_alone),
                (f"collect of a {args.collect:,}-row range scan", scan),
            ]
            bulk = []
            for label, fn in decoding:
                slow_s, fast_s, slow, fast = paired_times(row_by_row(fn), fn, args.repeat)
                if not (isinstance(fast, pa.Table) and fast.equals(slow)):
                    sys.exit(f"bulk and row-by-row decoding differ: {label}")
                bulk.append((f"{label} ({fast.num_rows:,} rows)", slow_s, fast_s))
            raw.close()

    baseline = results[1][1]
    joined = [r for r in results if isinstance(r[2], pd.DataFrame)]
    expected = canonical(joined[0][2])
    for label, _, frame in joined:
        if canonical(frame) != expected:
            sys.exit(f"results differ: {label}")

    print(f"# bench_sql — {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(
        f"python {platform.python_version()}, duckdb {duckdb.__version__}, "
        f"{platform.machine()}, store of {args.rows:,} JSON records (built in "
        f"{build_s:.1f} s) joined with a {len(people):,}-row DataFrame → "
        f"{len(expected):,} rows; median of {args.repeat} runs\n"
    )
    print("| case | seconds | × baseline |")
    print("|---|---:|---:|")
    for label, seconds, _ in results:
        print(f"| {label} | {seconds:.3f} | {seconds / baseline:.1f} |")
    print()
    for what, seconds in (("first (streamed)", results[0][1]), ("repeated", results[2][1])):
        ratio = seconds / baseline
        verdict = "met" if ratio <= TARGET else "MISSED"
        print(f"target, {what} join within {TARGET:.0f}× of the baseline: {verdict} ({ratio:.1f}×)")
    overhead = results[0][1] / results[4][1]
    print(f"streamed join vs stream-then-join by hand: {overhead:.2f}×")
    print()
    print("| bulk decoding vs row by row, same process | row by row s | bulk s | speed-up |")
    print("|---|---:|---:|---:|")
    for label, slow_s, fast_s in bulk:
        print(f"| {label} | {slow_s:.3f} | {fast_s:.3f} | {slow_s / fast_s:.1f}× |")


if __name__ == "__main__":
    main()
