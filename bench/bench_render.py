"""Notebook results: rendering an IQResult, and turning scans into Arrow.

    .venv/bin/python bench/bench_render.py [--render-rows 10000] [--scan-rows 1000000]

1. Rendering: a 10,000-row result (JSON records: strings, ints, floats, nulls) rendered
   with ``display_limit=0`` (every row), against ``DataFrame.to_html()`` of the very same
   rows. Target: well under 200 ms.
2. Collecting: a full scan of a store of JSON records (4 partitions) through
   ``tables.collect`` and ``tables.store_batches``, against draining the engine's
   iterators in a plain ``for`` loop (what any consumer pays at least), same process,
   same data.

Median of several timed runs after a warm-up; prints Markdown tables for BENCHMARKS.md.
Single thread. No assertions: speed is measured here, never in tests.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pandas as pd
import pyarrow as pa

import iqkit
from iqkit import RangeQuery, StateQueryRequest
from iqkit.jupyter import render
from iqkit.jupyter.result import IQResult
from iqkit.tables import collect, store_batches, to_pandas


def median_time(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of ``repeat`` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def record(i: int) -> dict[str, object]:
    return {
        "customer": f"customer-{i % 997:04d} <{i}>",
        "orders": i % 50,
        "total": round(i * 1.25, 2),
        "region": ("eu", "us", "apac")[i % 3],
        "coupon": None if i % 5 else f"SAVE{i % 20}",
    }


def build(root: str, name: str, n: int, partitions: int) -> None:
    iqkit.create_store(root, name, partitions=partitions)
    with iqkit.StoreWriter(root, name) as w:
        for i in range(n):
            w.put(f"key-{i:08d}", record(i), source=("orders", i % partitions, i))


def scan_request(store: str) -> StateQueryRequest:
    return StateQueryRequest.in_store(store).with_query(RangeQuery.with_no_bounds())


def bench_render(root: str, n: int, repeat: int) -> list[tuple[str, str, str, str]]:
    build(root, "render", n, 4)
    with iqkit.open(root) as engine:
        req = scan_request("render").enable_execution_info()
        manifest = engine.manifest("render")
        result = engine.query(req)
        collected = collect(result, manifest)
        lags = engine.lags(stores=["render"])["render"]
        r = IQResult(req, result, manifest, collected, engine_ns=1, lags=lags, display_limit=0)
        frame = r.rows
        html_s = median_time(r._repr_html_, repeat)
        table_s = median_time(lambda: render.table_html(r.arrow()), repeat)
        pandas_s = median_time(frame.to_html, repeat)
        r10 = IQResult(req, result, manifest, collected, engine_ns=1, lags=lags)
        ten_s = median_time(r10._repr_html_, repeat)
        text_s = median_time(lambda: str(r10), repeat)
    rows = f"{n:,}"
    return [
        (
            f"`_repr_html_`, {rows} rows, display_limit=0 vs `df.to_html()`",
            f"{html_s * 1e3:.1f} ms",
            f"{pandas_s * 1e3:.1f} ms",
            f"{pandas_s / html_s:.1f}× faster",
        ),
        (
            f"rows table only (`render.table_html`), {rows} rows vs `df.to_html()`",
            f"{table_s * 1e3:.1f} ms",
            f"{pandas_s * 1e3:.1f} ms",
            f"{pandas_s / table_s:.1f}× faster",
        ),
        ("`_repr_html_`, display_limit=10 (the default)", f"{ten_s * 1e3:.2f} ms", "", ""),
        ("`str()` (text form), display_limit=10", f"{text_s * 1e3:.2f} ms", "", ""),
    ]


def bench_scan(root: str, n: int, repeat: int) -> list[tuple[str, str, str, str]]:
    t0 = time.perf_counter()
    build(root, "scan", n, 4)
    build_s = time.perf_counter() - t0
    with iqkit.open(root) as engine:
        req = scan_request("scan")
        manifest = engine.manifest("scan")

        def drain() -> int:
            count = 0
            for qr in engine.query(req).partition_results.values():
                with qr.result as it:
                    for _ in it:
                        count += 1
            return count

        def collected() -> pa.Table:
            return collect(engine.query(req), manifest).table

        def streamed() -> pa.Table:
            return store_batches(engine, "scan").read_all()

        assert drain() == collected().num_rows == streamed().num_rows == n
        table = collected()
        # interleaved, so a noisy neighbour hits all three alike
        runs: dict[str, list[float]] = {"raw": [], "collect": [], "stream": []}
        for _ in range(repeat):
            for name, fn in (("raw", drain), ("collect", collected), ("stream", streamed)):
                t1 = time.perf_counter()
                fn()
                runs[name].append(time.perf_counter() - t1)
        raw_s, col_s, stream_s = (statistics.median(runs[k]) for k in ("raw", "collect", "stream"))
        pandas_s = median_time(lambda: to_pandas(table), repeat)
    rows = f"{n:,}"
    print(f"(building the {rows}-row scan store took {build_s:.1f} s)", file=sys.stderr)
    return [
        (
            f"`collect`, full scan of {rows} JSON records → Arrow vs draining the iterators",
            f"{col_s:.2f} s",
            f"{raw_s:.2f} s",
            f"{col_s / raw_s:.2f}×",
        ),
        (
            f"`store_batches(...).read_all()`, {rows} rows vs draining the iterators",
            f"{stream_s:.2f} s",
            f"{raw_s:.2f} s",
            f"{stream_s / raw_s:.2f}×",
        ),
        (f"`to_pandas` of the {rows}-row table", f"{pandas_s:.2f} s", "", ""),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render-rows", type=int, default=10_000)
    parser.add_argument("--scan-rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        rows = bench_render(root, args.render_rows, args.repeat)
        if args.scan_rows:
            rows += bench_scan(root, args.scan_rows, max(3, args.repeat // 2))
    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, pandas {pd.__version__}, pyarrow {pa.__version__}; "
        f"{datetime.now(UTC):%Y-%m-%d}; median of runs after a warm-up.\n"
    )
    print("| measure | iqkit | reference | ratio |")
    print("|---|---|---|---|")
    for measure, ours, ref, ratio in rows:
        print(f"| {measure} | {ours} | {ref} | {ratio} |")


if __name__ == "__main__":
    main()
