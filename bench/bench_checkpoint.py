"""Spark checkpoints read as iqkit stores (issue 23) against Spark's own state reader.

    .venv/bin/python bench/bench_checkpoint.py [--keys 1000000] [--repeat 5]

Runs a real streaming aggregation (``groupBy("user").agg(sum, count)``, 8 shuffle
partitions, the default HDFS-backed state store provider) over ``--keys`` distinct keys
in two micro-batches (every key, then a tenth of them again), then, in this process:

1. a key lookup: ``spark.read.format("statestore")`` filtered on the key
   (``collect()``), against an iqkit ``KeyQuery`` on an engine that has the version
   open (target: iqkit at least 1,000× faster);
2. the first open of the version: every partition of the version replayed, decoded and
   made ready for queries (``iqkit.open`` + ``approximate_rows``, which opens every
   partition and counts its rows; a new engine each run) against the state reader's full
   read (``spark.read.format("statestore").load(ckpt).count()``) (target: no slower);
3. for information: the first KeyQuery on a new engine (only the owning partition is
   read), an open of a version another engine already built into the cache (what a
   second process pays), and a first full scan (open + every row through a
   ``RangeQuery``).

Every "first" case runs on a new engine over an empty ``IQKIT_CACHE``.

Seconds are medians of ``--repeat`` runs; both sides read files the OS has cached. Each
case's results are checked equal once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_explore import cold_engine, spark_session

import iqkit
from iqkit import KeyQuery, RangeQuery, StateQueryRequest

PARTITIONS = 8


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_of(fn: Callable[[], object], repeat: int) -> float:
    return statistics.median(timed(fn) for _ in range(repeat))


def medians_with_cpu(
    fn: Callable[[], object], repeat: int, cpu: Callable[[], float]
) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds (read off the clock ``cpu``) of
    ``repeat`` runs of ``fn``."""
    walls, cpus = [], []
    for _ in range(repeat):
        c0 = cpu()
        walls.append(timed(fn))
        cpus.append(cpu() - c0)
    return statistics.median(walls), statistics.median(cpus)


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def iqkit_cpu() -> float:
    """CPU seconds of this process and of its children running iqkit's helper process
    (``iqkit.store.checkpoint.prebuild``), which builds partitions beside it."""
    total, me = time.process_time(), str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
            if parent == me and b"checkpoint.prebuild" in (entry / "cmdline").read_bytes():
                total += process_cpu(int(entry.name))
        except OSError:
            continue  # ended meanwhile
    return total


def build(spark, folder: Path, keys: int) -> str:
    """The checkpoint of a two-batch aggregation over ``keys`` keys (module docstring)."""
    from pyspark.sql import functions as F

    inputs, checkpoint = folder / "input", folder / "ckpt"
    spark.conf.set("spark.sql.shuffle.partitions", str(PARTITIONS))
    for batch, (count, step) in enumerate([(keys, 1), (keys // 10, 10)]):
        rows = spark.range(count).select(
            F.format_string("k%08d", F.col("id") * step).alias("user"),
            (F.col("id") % 100).alias("amount"),
        )
        rows.write.parquet(os.fspath(inputs / f"batch={batch}"))
        stream = spark.readStream.schema("user string, amount long").parquet(
            os.fspath(inputs / "*")
        )
        query = (
            stream.groupBy("user")
            .agg(F.sum("amount").alias("total"), F.count("*").alias("n"))
            .writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", os.fspath(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    return os.fspath(checkpoint)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    spark = spark_session()
    out = []
    with tempfile.TemporaryDirectory(prefix="iqkit-ckpt-") as tmp:
        t0 = time.perf_counter()
        checkpoint = build(spark, Path(tmp), args.keys)
        built = time.perf_counter() - t0
        key = f"k{(args.keys // 2) * 1:08d}"
        state = spark.read.format("statestore").load(checkpoint)

        def spark_lookup() -> list:
            return state.where(f"key.user = '{key}'").collect()

        def spark_full() -> int:
            return spark.read.format("statestore").load(checkpoint).count()

        request = StateQueryRequest.in_store("aggregate").with_query(KeyQuery.with_key(key))
        scan = StateQueryRequest.in_store("aggregate").with_query(RangeQuery.with_no_bounds())

        def iq_first_open() -> int:
            with cold_engine(Path(tmp), checkpoint) as engine:
                return engine.approximate_rows("aggregate")

        def iq_reopen() -> int:
            with iqkit.open(checkpoint) as engine:  # the cache the warm-up filled
                return engine.approximate_rows("aggregate")

        def iq_first_scan() -> int:
            with cold_engine(Path(tmp), checkpoint) as engine:
                result = engine.query(scan)
                return sum(sum(1 for _ in p.result) for p in result.partition_results.values())

        def iq_open_on_older() -> float:
            """Seconds to open the newest version (2) where this cache holds version 1:
            only batch 1's delta is read (a tenth of the keys), on version 1's database."""
            folder = Path(tempfile.mkdtemp(dir=tmp, prefix="older-"))
            os.environ["IQKIT_CACHE"] = os.fspath(folder)
            try:
                with iqkit.open(checkpoint, as_of=1) as engine:
                    engine.approximate_rows("aggregate")
                with iqkit.open(checkpoint) as engine:
                    t0 = time.perf_counter()
                    engine.approximate_rows("aggregate")
                    return time.perf_counter() - t0
            finally:
                shutil.rmtree(folder, ignore_errors=True)

        def iq_first_lookup() -> object:
            with cold_engine(Path(tmp), checkpoint) as engine:
                return engine.query(request).only_partition_result().result

        expected = spark_lookup()[0]["value"].asDict()
        os.environ["IQKIT_CACHE"] = os.fspath(Path(tmp) / "warm-cache")
        with iqkit.open(checkpoint) as engine:
            warm = engine.query(request).only_partition_result().result
            assert warm == {k: expected[k] for k in expected}, (warm, expected)
            t_warm = min(timed(lambda e=engine: e.query(request)) for _ in range(200))
        assert iq_first_open() == iq_first_scan() == spark_full()
        spark_lookup()  # warm-up of the state reader's planning
        t_spark_key = median_of(spark_lookup, args.repeat)
        jvm = spark._jvm.java.lang.ProcessHandle.current().pid()
        t_spark_full, cpu_spark_full = medians_with_cpu(
            spark_full, args.repeat, lambda: process_cpu(jvm)
        )
        t_open, cpu_open = medians_with_cpu(iq_first_open, args.repeat, iqkit_cpu)
        t_first_key = median_of(iq_first_lookup, args.repeat)
        iq_reopen()
        t_reopen = median_of(iq_reopen, args.repeat)
        t_scan = median_of(iq_first_scan, args.repeat)
        t_on_older = statistics.median(iq_open_on_older() for _ in range(args.repeat))
        out += [
            ("KeyQuery (version open) vs statestore filtered on the key", t_warm, t_spark_key,
             f"{t_spark_key / t_warm:,.0f}× faster", "≥ 1,000× faster"),
            ("first open of the version (all partitions) vs statestore full read", t_open,
             t_spark_full, f"{t_open / t_spark_full:.2f}× the time", "≤ 1×"),
            ("first KeyQuery on a new engine (one partition read)", t_first_key, t_spark_key,
             f"{t_spark_key / t_first_key:,.1f}× faster", "(info)"),
            ("open of a version another engine built (cache warm)", t_reopen, t_spark_full,
             f"{t_spark_full / t_reopen:,.0f}× faster", "(info)"),
            ("first open of version 2 where the cache holds version 1 (its delta only) vs the "
             "first open of version 2 from nothing", t_on_older, t_open,
             f"{t_on_older / t_open:.2f}× the time", "(info)"),
            ("first full scan (open + every row) vs statestore full read", t_scan,
             t_spark_full, f"{t_scan / t_spark_full:.2f}× the time", "(info)"),
            ("first open, CPU seconds (this process + helper) vs full read (Spark's JVM)", cpu_open,
             cpu_spark_full, f"{cpu_open / cpu_spark_full:.2f}× the CPU", "(info)"),
        ]  # fmt: skip
    spark.stop()
    print(
        f"# checkpoint bench — {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
        f"{args.keys:,} keys, {PARTITIONS} partitions (built in {built:.0f} s), load average "
        f"{os.getloadavg()[0]:.1f} at the end\n"
    )
    print("| measure | iqkit | Spark's state reader | ratio | target |\n|---|---|---|---|---|")
    for label, t_iq, t_ref, ratio, target in out:
        print(f"| {label} | {t_iq * 1000:.3f} ms | {t_ref * 1000:.1f} ms | {ratio} | {target} |")


if __name__ == "__main__":
    sys.exit(main())
