"""Spark write speed: ``write_store`` against Spark writing the same DataFrame as Parquet.

    .venv/bin/python bench/bench_spark.py [--rows 2000000] [--partitions 8]

local[2], the same cached DataFrame for both writers, in one process; rows per second
and the ratio (target: iqkit ≥ 0.5× Parquet's rate). The target row times each writer's
first write in the process, as an application's first write runs: Parquet pays its JIT
warm-up, iqkit that and Spark's Python worker start (about 2.5 s on 2 cores, whatever the
row count). A second row, for information, times both again once warm (best of
``--warm`` runs each): the steady-state ratio. With the ``iqkit`` data source available
it also times a key lookup through ``spark.read.format("iqkit")`` against Spark
filtering the same data in Parquet.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from iqkit.spark import write_store


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def write_row(label: str, rows: int, t_iq: float, t_pq: float, target: str) -> tuple:
    rate_pq, rate_iq = rows / t_pq, rows / t_iq
    return (
        label,
        f"{rate_iq:,.0f} rows/s ({t_iq:.1f} s)",
        f"{rate_pq:,.0f} rows/s ({t_pq:.1f} s)",
        f"{rate_iq / rate_pq:.2f}×",
        target,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--warm", type=int, default=2, help="warm runs per writer (0: none)")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    df = (
        spark.range(args.rows)
        .select(
            F.format_string("customer-%08d", F.col("id")).alias("customer"),
            (F.col("id") % 1000).alias("orders"),
            (F.col("id") * 0.5).alias("total"),
        )
        .cache()
    )
    df.count()
    rows_table = []
    with tempfile.TemporaryDirectory() as tmp:

        def parquet() -> None:
            df.write.mode("overwrite").parquet(os.path.join(tmp, "pq"))

        def iqkit(store: str = "customers", progress: bool = True) -> None:
            write_store(
                df,
                os.path.join(tmp, "stores"),
                store,
                key="customer",
                partitions=args.partitions,
                progress=progress,
            )

        t_parquet = timed(parquet)
        t_iqkit = timed(iqkit)
        rows_table.append(
            write_row(
                f"write {args.rows:,} rows, {args.partitions} partitions",
                args.rows,
                t_iqkit,
                t_parquet,
                "≥ 0.5×",
            )
        )
        if args.warm > 0:
            t_pq_warm = min(timed(parquet) for _ in range(args.warm))
            t_iq_warm = min(
                timed(lambda i=i: iqkit(f"warm{i}", progress=False)) for i in range(args.warm)
            )
            rows_table.append(
                write_row(
                    f"same, warm (best of {args.warm})", args.rows, t_iq_warm, t_pq_warm, "(info)"
                )
            )
        try:
            from iqkit.spark.datasource import register
        except ImportError:
            register = None
        if register is not None:
            register(spark)
            key = f"customer-{args.rows // 2:08d}"
            pq = spark.read.parquet(os.path.join(tmp, "pq"))
            stores = os.path.join(tmp, "stores")

            def lookup() -> list:  # a new load() per lookup, as a user writes it
                return (
                    spark.read.format("iqkit")
                    .option("store", "customers")
                    .option("key", key)
                    .load(stores)
                    .collect()
                )

            def filtered() -> list:  # where() is Spark's filter over every partition
                df = spark.read.format("iqkit").option("store", "customers").load(stores)
                return df.where(F.col("key") == key).collect()

            pq.where(F.col("customer") == key).collect()  # warm-up
            lookup()
            t_pq = min(
                timed(lambda: pq.where(F.col("customer") == key).collect()) for _ in range(3)
            )
            t_iq = min(timed(lookup) for _ in range(3))
            t_where = min(timed(filtered) for _ in range(2))
            for label, took in (
                ("key lookup through Spark (.option('key'))", t_iq),
                ("same as .where(key = ...) (full scan)", t_where),
            ):
                rows_table.append(
                    (
                        label,
                        f"{took * 1e3:.0f} ms",
                        f"{t_pq * 1e3:.0f} ms (Parquet filter)",
                        f"{t_pq / took:.1f}× faster"
                        if took < t_pq
                        else f"{took / t_pq:.1f}× slower",
                        "(info)",
                    )
                )
    spark.stop()
    print(f"# iqkit Spark benchmark — {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    python = sys.version.split()[0]
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {python}, local[2]\n")
    print("| measure | iqkit | reference | ratio | target |")
    print("|---|---|---|---|---|")
    for r in rows_table:
        print("| " + " | ".join(r) + " |")


def _ratio(took: float, reference: float) -> str:
    if took < reference:
        return f"{reference / took:.1f}× faster"
    return f"{took / reference:.1f}× slower"


if __name__ == "__main__":
    main()
