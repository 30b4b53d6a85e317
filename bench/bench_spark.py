"""Spark write speed: ``write_store`` against Spark writing the same DataFrame as Parquet.

    .venv/bin/python bench/bench_spark.py [--rows 2000000] [--partitions 8]

local[2], the same cached DataFrame for both writers, in one process; rows per second
and the ratio (target: iqkit ≥ 0.5× Parquet's rate). With the ``iqkit`` data source
available it also times a key lookup through ``spark.read.format("iqkit")`` against
Spark filtering the same data in Parquet.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=8)
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
        t_parquet = timed(lambda: df.write.mode("overwrite").parquet(os.path.join(tmp, "pq")))
        t_iqkit = timed(
            lambda: write_store(
                df,
                os.path.join(tmp, "stores"),
                "customers",
                key="customer",
                partitions=args.partitions,
            )
        )
        rate_pq, rate_iq = args.rows / t_parquet, args.rows / t_iqkit
        rows_table.append(
            (
                f"write {args.rows:,} rows, {args.partitions} partitions",
                f"{rate_iq:,.0f} rows/s ({t_iqkit:.1f} s)",
                f"{rate_pq:,.0f} rows/s ({t_parquet:.1f} s)",
                f"{rate_iq / rate_pq:.2f}×",
                "≥ 0.5×",
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
            store = (
                spark.read.format("iqkit")
                .option("store", "customers")
                .load(os.path.join(tmp, "stores"))
            )
            pq.where(F.col("customer") == key).collect()  # warm-up
            t_pq = min(
                timed(lambda: pq.where(F.col("customer") == key).collect()) for _ in range(3)
            )
            t_iq = min(timed(lambda: store.where(F.col("key") == key).collect()) for _ in range(3))
            rows_table.append(
                (
                    "key lookup through Spark",
                    f"{t_iq * 1e3:.0f} ms",
                    f"{t_pq * 1e3:.0f} ms (Parquet filter)",
                    f"{t_pq / t_iq:.1f}× faster" if t_iq < t_pq else f"{t_iq / t_pq:.1f}× slower",
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


if __name__ == "__main__":
    main()
