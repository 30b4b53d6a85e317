"""Spark checkpoints read as iqkit stores (issues 23 and 35) against Spark's own state reader.

    .venv/bin/python bench/bench_checkpoint.py [--keys 1000000] [--repeat 5]
    .venv/bin/python bench/bench_checkpoint.py --case agg-rocksdb-changelog --keys 10000000 \\
        --repeat 3 --workdir /tmp/big-agg      # the checkpoint kept (and reused) there
    .venv/bin/python bench/bench_checkpoint.py --case join --keys 10000000 --repeat 3
    .venv/bin/python bench/bench_checkpoint.py --case tws-map --keys 10000000 --repeat 3

Each ``--case`` runs a real streaming query (8 shuffle partitions) in two micro-batches
(every key, then a tenth of the keys again, so the state has deltas or changelogs as a
user's does), writing to the ``noop`` sink:

* ``agg-hdfs`` (issue 23, the default): ``groupBy("user").agg(sum, count)`` over
  ``--keys`` distinct keys, the default HDFS-backed state store provider;
* ``agg-rocksdb-changelog``: the same on the RocksDB provider with changelog
  checkpointing;
* ``join``: a stream-stream inner join on ``lk = rk`` (no watermark: every left row stays
  buffered), ``--keys`` distinct left keys (a tenth of them with a second row in batch 1)
  and a thousandth as many right rows, RocksDB with changelogs; the store is
  ``join.left``;
* ``tws-map``: a Scala ``groupByKey(g).transformWithState`` (``tws_map.scala``, run by
  ``spark-shell``: PySpark's map puts take hours at 10M) whose processor puts each input
  row into a MapState ``amounts`` (user key ``id``); ``--keys`` map entries over
  ``--keys / 10`` grouping keys, RocksDB with changelogs; the store is
  ``transform.amounts``, keyed by (grouping key, user key).

Then, in this process, against ``spark.read.format("statestore")`` (for the join
``joinSide=left``, for the map ``stateVarName=amounts``, flattened as by default):

1. a key lookup: the state reader filtered on the key (``collect()``), against an iqkit
   ``KeyQuery`` on an engine that has the version open (target: iqkit at least 1,000×
   faster; 10,000× for ``agg-rocksdb-changelog``);
2. the first open of the version: every partition of the version replayed, decoded and
   made ready for queries (``iqkit.open`` + ``approximate_rows``, which opens every
   partition and counts its rows; a new engine each run) against the state reader's full
   read (``count()``) (target: no slower for ``agg-hdfs``, at most half for
   ``agg-rocksdb-changelog``);
3. the peak memory of that first open: the same open in a child process (a fresh
   interpreter, an empty cache), its ``VmHWM`` read from ``/proc/self/status`` at the
   end; Spark's JVM's ``VmHWM`` at the end of the run beside it;
4. for information: the first KeyQuery on a new engine (only the owning partition is
   read), an open of a version another engine already built into the cache (what a
   second process pays), the first open of version 2 where the cache holds version 1,
   and (``agg-hdfs``, or ``--scan``) a first full scan (open + every row through a
   ``RangeQuery``).

Every "first" case runs on a new engine over an empty ``IQKIT_CACHE``.

Seconds are medians of ``--repeat`` runs (Spark's: ``--spark-repeat``, its first run
counted, as at 10M keys each run takes minutes); both sides read files the OS has cached.
Each case's results are checked equal once.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PARTITIONS = 8
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
#: Map entries per grouping key in the ``tws-map`` case.
PER_GROUP = 10


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


def peak_kib(pid: int | str = "self") -> int:
    """The peak resident set (``VmHWM``, KiB) of process ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


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


def run_query(spark, query_df, checkpoint: Path, mode: str) -> None:
    """``query_df`` run to the end of its input (``availableNow``) into the noop sink."""
    query = (
        query_df.writeStream.format("noop")
        .outputMode(mode)
        .option("checkpointLocation", os.fspath(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def batches(keys: int) -> list[tuple[int, int]]:
    """(count, step) of each micro-batch: every key, then every tenth key again."""
    return [(keys, 1), (keys // 10, 10)]


def build_agg(spark, folder: Path, keys: int) -> None:
    """A two-batch aggregation over ``keys`` keys (module docstring)."""
    from pyspark.sql import functions as F

    inputs = folder / "input"
    for batch, (count, step) in enumerate(batches(keys)):
        rows = spark.range(count).select(
            F.format_string("k%08d", F.col("id") * step).alias("user"),
            (F.col("id") % 100).alias("amount"),
        )
        rows.write.parquet(os.fspath(inputs / f"batch={batch}"))
        stream = spark.readStream.schema("user string, amount long").parquet(
            os.fspath(inputs / "*")
        )
        aggregated = stream.groupBy("user").agg(
            F.sum("amount").alias("total"), F.count("*").alias("n")
        )
        run_query(spark, aggregated, folder / "ckpt", "update")


def build_join(spark, folder: Path, keys: int) -> None:
    """A two-batch stream-stream inner join with ``keys`` buffered left keys."""
    from pyspark.sql import functions as F

    for batch, (count, step) in enumerate(batches(keys)):
        left = spark.range(count).select(
            F.format_string("k%08d", F.col("id") * step).alias("lk"),
            (F.col("id") + batch * keys).alias("lid"),
            (F.col("id") % 100).alias("lamount"),
        )
        right = spark.range(max(count // 1000, 1)).select(
            F.format_string("k%08d", F.col("id") * step * 1000 + 1).alias("rk"),
            (F.col("id") % 7).alias("ramount"),
        )
        left.write.parquet(os.fspath(folder / "left" / f"batch={batch}"))
        right.write.parquet(os.fspath(folder / "right" / f"batch={batch}"))
        lstream = spark.readStream.schema("lk string, lid long, lamount long").parquet(
            os.fspath(folder / "left" / "*")
        )
        rstream = spark.readStream.schema("rk string, ramount long").parquet(
            os.fspath(folder / "right" / "*")
        )
        joined = lstream.join(rstream, F.expr("lk = rk"), "inner")
        run_query(spark, joined, folder / "ckpt", "append")


def build_tws_map(spark, folder: Path, keys: int) -> None:
    """A two-batch Scala ``transformWithState`` with ``keys`` map entries (module
    docstring), run by ``spark-shell`` beside this session: ``tws_map.scala`` says why."""
    import pyspark

    shell = Path(pyspark.__file__).parent / "bin" / "spark-shell"
    env = dict(
        os.environ, TWS_FOLDER=os.fspath(folder), TWS_KEYS=str(keys), TWS_PER_GROUP=str(PER_GROUP)
    )
    script = os.fspath(Path(__file__).with_name("tws_map.scala"))
    out = subprocess.run(
        [os.fspath(shell), "--master", "local[2]", "--driver-memory", "4g",
         "--conf", "spark.ui.enabled=false", "-I", script],
        env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if "TWS-BUILT" not in out.stdout:
        tail = out.stdout[-3000:] + out.stderr[-3000:]
        raise RuntimeError(f"spark-shell did not build the map state:\n{tail}")


def _plain_rows(rows: list[dict]) -> list[str]:
    """Buffered join rows without ``matched``, as sorted JSON texts (an order-free list)."""
    return sorted(
        json.dumps({k: v for k, v in r.items() if k != "matched"}, sort_keys=True) for r in rows
    )


@dataclass(frozen=True)
class Case:
    """One ``--case``: how its checkpoint is made and how each side looks a key up."""

    build: Callable[[Any, Path, int], None]
    provider: str | None  # None: Spark's default (HDFS-backed)
    store: str
    options: dict[str, str]  # the state reader's
    key_target: float  # KeyQuery at least this many times faster
    open_target: float | None  # first open at most this share of the full read
    scan: bool  # measure the first full scan by default

    def key(self, keys: int) -> Any:
        middle = keys // 2
        if self is CASES["tws-map"]:
            return (f"g{middle // PER_GROUP:08d}", middle)
        return f"k{middle:08d}"

    def where(self, key: Any) -> str:
        if self is CASES["tws-map"]:
            return f"key.g = '{key[0]}' AND user_map_key.id = {key[1]}"
        if self is CASES["join"]:
            return f"key.field0 = '{key}'"
        return f"key.user = '{key}'"

    def same(self, iq: Any, spark_rows: list) -> bool:
        """Whether iqkit's value for the key is what the state reader read for it."""
        rows = [r.asDict(recursive=True) for r in spark_rows]
        if self is CASES["join"]:
            return _plain_rows(iq) == _plain_rows([r["value"] for r in rows])
        if self is CASES["tws-map"]:
            return len(rows) == 1 and iq == rows[0]["user_map_value"]
        return len(rows) == 1 and iq == rows[0]["value"]


CASES = {
    "agg-hdfs": Case(build_agg, None, "aggregate", {}, 1_000, 1.0, True),
    "agg-rocksdb-changelog": Case(build_agg, ROCKSDB, "aggregate", {}, 10_000, 0.5, False),
    "join": Case(build_join, ROCKSDB, "join.left", {"joinSide": "left"}, 1_000, None, False),
    "tws-map": Case(
        build_tws_map, ROCKSDB, "transform.amounts", {"stateVarName": "amounts"}, 1_000, None, False
    ),
}


def child_open(checkpoint: str, store: str) -> None:
    """``--child-open``: the first open of ``checkpoint``'s newest version in this fresh
    process over an empty ``IQKIT_CACHE`` (the parent's choice); prints the seconds, the
    rows and this process's peak resident set as JSON."""
    import iqkit

    t0 = time.perf_counter()
    with iqkit.open(checkpoint) as engine:
        rows = engine.approximate_rows(store)
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "rows": rows, "vmhwm_kib": peak_kib()}))


def open_in_child(folder: Path, checkpoint: str, store: str) -> dict:
    """``child_open`` in a new interpreter over a new, empty cache folder."""
    cache = Path(tempfile.mkdtemp(dir=folder, prefix="child-cache-"))
    try:
        env = dict(os.environ, IQKIT_CACHE=os.fspath(cache))
        out = subprocess.run(
            [sys.executable, __file__, "--child-open", checkpoint, store],
            env=env, check=True, capture_output=True, text=True,
        )  # fmt: skip
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def checkpoint_in(spark, case: Case, folder: Path, keys: int) -> tuple[str, float | None]:
    """The case's checkpoint under ``folder`` (made there unless a finished one is there
    already: made again costs minutes at 10M keys) and the seconds making it took."""
    checkpoint = folder / "ckpt"
    if (checkpoint / "commits" / "1").exists():
        return os.fspath(checkpoint), None
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if case.provider:
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", case.provider)
        spark.conf.set(CHANGELOG, "true")
    t0 = time.perf_counter()
    case.build(spark, folder, keys)
    return os.fspath(checkpoint), time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), default="agg-hdfs")
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--workdir", help="make (or reuse) the checkpoint here instead of a temporary folder"
    )
    parser.add_argument(
        "--spark-repeat", type=int, help="runs of each Spark reference (default --repeat)"
    )
    parser.add_argument("--scan", action="store_true", help="measure the first full scan too")
    parser.add_argument("--child-open", nargs=2, metavar=("CHECKPOINT", "STORE"))
    args = parser.parse_args()
    if args.child_open:
        return child_open(*args.child_open)
    from bench_explore import spark_session

    case = CASES[args.case]
    spark = spark_session()
    spark.conf.set("spark.sql.shuffle.partitions", str(PARTITIONS))
    with tempfile.TemporaryDirectory(prefix="iqkit-ckpt-") as tmp:
        folder = Path(args.workdir) if args.workdir else Path(tmp) / "case"
        checkpoint, built = checkpoint_in(spark, case, folder, args.keys)
        out = measure(spark, case, Path(tmp), checkpoint, args)
        jvm_peak = peak_kib(spark._jvm.java.lang.ProcessHandle.current().pid())
    spark.stop()
    made = "reused" if built is None else f"made in {built:.0f} s"
    size = sum(f.stat().st_size for f in Path(checkpoint).rglob("*") if f.is_file())
    print(
        f"# checkpoint bench {args.case} — {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{os.cpu_count()} cores, {args.keys:,} keys, {PARTITIONS} partitions (checkpoint "
        f"{size / 2**20:,.0f} MiB, {made}), Spark's JVM peak {jvm_peak / 2**20:.2f} GiB, "
        f"load average {os.getloadavg()[0]:.1f} at the end\n"
    )
    print("| measure | iqkit | Spark's state reader | ratio | target |\n|---|---|---|---|---|")
    for label, t_iq, t_ref, ratio, target in out:
        ref = f"{t_ref * 1000:,.1f} ms" if t_ref is not None else ""
        print(f"| {label} | {t_iq * 1000:,.3f} ms | {ref} | {ratio} | {target} |")


def measure(spark, case: Case, tmp: Path, checkpoint: str, args) -> list[tuple]:
    """The module docstring's measures of ``case`` on ``checkpoint``, as table rows."""
    from bench_explore import cold_engine

    import iqkit
    from iqkit import KeyQuery, RangeQuery, StateQueryRequest

    key = case.key(args.keys)
    reader = spark.read.format("statestore")
    for name, value in case.options.items():
        reader = reader.option(name, value)
    state = reader.load(checkpoint)

    def spark_lookup() -> list:
        return state.where(case.where(key)).collect()

    def spark_full() -> int:
        return reader.load(checkpoint).count()

    request = StateQueryRequest.in_store(case.store).with_query(KeyQuery.with_key(key))
    scan = StateQueryRequest.in_store(case.store).with_query(RangeQuery.with_no_bounds())

    def iq_first_open() -> int:
        with cold_engine(tmp, checkpoint) as engine:
            return engine.approximate_rows(case.store)

    def iq_reopen() -> int:
        with iqkit.open(checkpoint) as engine:  # the cache the warm-up filled
            return engine.approximate_rows(case.store)

    def iq_first_scan() -> int:
        with cold_engine(tmp, checkpoint) as engine:
            result = engine.query(scan)
            return sum(sum(1 for _ in p.result) for p in result.partition_results.values())

    def iq_open_on_older() -> float:
        """Seconds to open the newest version (2) where this cache holds version 1: only
        batch 1's delta is read (a tenth of the keys), on version 1's database."""
        folder = Path(tempfile.mkdtemp(dir=tmp, prefix="older-"))
        os.environ["IQKIT_CACHE"] = os.fspath(folder)
        try:
            with iqkit.open(checkpoint, as_of=1) as engine:
                engine.approximate_rows(case.store)
            with iqkit.open(checkpoint) as engine:
                t0 = time.perf_counter()
                engine.approximate_rows(case.store)
                return time.perf_counter() - t0
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def iq_first_lookup() -> object:
        with cold_engine(tmp, checkpoint) as engine:
            return engine.query(request).only_partition_result().result

    # Spark's first lookup and full read are samples too (``--spark-repeat`` in all):
    # at 10M keys each takes minutes, and its planning is a small part of that.
    t0 = time.perf_counter()
    expected = spark_lookup()
    spark_key_times = [time.perf_counter() - t0]
    os.environ["IQKIT_CACHE"] = os.fspath(tmp / "warm-cache")
    with iqkit.open(checkpoint) as engine:
        warm = engine.query(request).only_partition_result().result
        assert case.same(warm, expected), (warm, expected)
        t_warm = min(timed(lambda e=engine: e.query(request)) for _ in range(200))
    assert iq_first_lookup() == warm
    jvm = spark._jvm.java.lang.ProcessHandle.current().pid()
    c0, t0 = process_cpu(jvm), time.perf_counter()
    full = spark_full()
    spark_full_times, spark_full_cpus = [time.perf_counter() - t0], [process_cpu(jvm) - c0]
    # iqkit counts keys; the state reader a join side's buffered rows (one per value)
    keys = (
        reader.load(checkpoint).select("key").distinct().count()
        if case.options.get("joinSide")
        else full
    )
    child = open_in_child(tmp, checkpoint, case.store)
    # approximate_rows is RocksDB's estimate: exact for the SSTs one build writes, and
    # for a map store one row per (grouping key, user key), as the flattened read.
    assert iq_first_open() == child["rows"] == keys, (child["rows"], keys)
    spark_repeat = args.spark_repeat or args.repeat
    spark_key_times += [timed(spark_lookup) for _ in range(spark_repeat - 1)]
    t_spark_key = statistics.median(spark_key_times)
    for _ in range(spark_repeat - 1):
        c0 = process_cpu(jvm)
        spark_full_times.append(timed(spark_full))
        spark_full_cpus.append(process_cpu(jvm) - c0)
    t_spark_full = statistics.median(spark_full_times)
    cpu_spark_full = statistics.median(spark_full_cpus)
    t_open, cpu_open = medians_with_cpu(iq_first_open, args.repeat, iqkit_cpu)
    t_first_key = median_of(iq_first_lookup, args.repeat)
    iq_reopen()
    t_reopen = median_of(iq_reopen, args.repeat)
    t_on_older = statistics.median(iq_open_on_older() for _ in range(args.repeat))
    key_ratio = t_spark_key / t_warm
    met = "met" if key_ratio >= case.key_target else "MISSED"
    out = [
        ("KeyQuery (version open) vs statestore filtered on the key", t_warm, t_spark_key,
         f"{key_ratio:,.0f}× faster", f"≥ {case.key_target:,}× {met}"),
    ]  # fmt: skip
    open_ratio = t_open / t_spark_full
    target = "(info)"
    if case.open_target is not None:
        met = "met" if open_ratio <= case.open_target else "MISSED"
        target = f"≤ {case.open_target:g}× {met}"
    out += [
        ("first open of the version (all partitions) vs statestore full read", t_open,
         t_spark_full, f"{open_ratio:.2f}× the time", target),
        (f"first open in a child process: peak memory (VmHWM) {child['vmhwm_kib'] / 2**20:.2f}"
         " GiB", child["seconds"], t_spark_full,
         f"{child['seconds'] / t_spark_full:.2f}× the time", "(recorded)"),
        ("first KeyQuery on a new engine (one partition read)", t_first_key, t_spark_key,
         f"{t_spark_key / t_first_key:,.1f}× faster", "(info)"),
        ("open of a version another engine built (cache warm)", t_reopen, t_spark_full,
         f"{t_spark_full / t_reopen:,.0f}× faster", "(info)"),
        ("first open of version 2 where the cache holds version 1 (its delta only) vs the "
         "first open of version 2 from nothing", t_on_older, t_open,
         f"{t_on_older / t_open:.2f}× the time", "(info)"),
        ("first open, CPU seconds (this process + helper) vs full read (Spark's JVM)", cpu_open,
         cpu_spark_full, f"{cpu_open / cpu_spark_full:.2f}× the CPU", "(info)"),
    ]  # fmt: skip
    if case.scan or args.scan:
        assert iq_first_scan() == keys
        t_scan = median_of(iq_first_scan, args.repeat)
        out.append(
            ("first full scan (open + every row) vs statestore full read", t_scan,
             t_spark_full, f"{t_scan / t_spark_full:.2f}× the time", "(info)")
        )  # fmt: skip
    return out


if __name__ == "__main__":
    sys.exit(main())
