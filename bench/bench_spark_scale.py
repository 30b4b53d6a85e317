"""Spark at 20M rows (issue 36): ``spark.read.format("iqkit")`` and both Spark writers
against Spark's Parquet doing the same work, in one process, taking turns.

    .venv/bin/python bench/bench_spark_scale.py [--rows 20m] [--master 'local[2]']
        [--partitions 8] [--repeat 1] [--markdown] [--event-log DIR]
    .venv/bin/python bench/bench_spark_scale.py --rows 2m --master 'local-cluster[2,1,2048]'

The targets (issue 36), at 20M rows on ``local[2]`` and once on ``local-cluster[2,1,2048]``:

* ``spark.read.format("iqkit")`` + ``agg(sum("total"))`` ≤ 1.5× ``spark.read.parquet``
  + the same sum (the Parquet files the reference writer below wrote). For information,
  the same read of the store ``df.write.format`` wrote, and with ``.schema("total
  double")``: PySpark 4.3 tells a Python data source no column it prunes, so every
  column of the store crosses from Python to the JVM unless the schema names fewer;
* ``write_store`` and ``df.write.format("iqkit")`` ≥ 0.8× the throughput of the same
  rows written as the store lays them out:
  ``df.repartition(n, key).sortWithinPartitions(key).write.parquet`` (zstd, set on the
  write: Spark's default codec is snappy; the store's twins are zstd).

The rows are the issue's store: a string key ``user000000000``… (a scrambled order, as a
real key column comes: the id times a large prime modulo the row count, so unique),
``total`` a random double in [0, 1000), ``n`` a random long, ``region`` one of 200
random names (``bench_scale.regions``). Spark makes them (``spark.range`` in
``--input-partitions`` partitions, default the session's default parallelism, and
``rand`` with fixed seeds) and the DataFrame is cached and counted before any timing:
every writer reads the very same rows from the same place, and the time taken is the
write's, not that of making random numbers or reading a source file (which would add
the same seconds to both sides and pull every ratio towards 1).

The format is never registered: ``format("iqkit")`` must work as installed
(``pyspark_iqkit``). Before the timed rounds each writer and reader runs once on a small
DataFrame (``--warmup-rows``): Spark's Python workers are started and the JVM's code is
compiled, which at this size is noise. Then ``--repeat`` rounds; each round writes with
the reference and both iqkit writers (the order reversed every other round), then reads
with both readers, alternating; figures are medians over the rounds. Each sum is checked
against the cached DataFrame's own (a wrong number stops the bench).

Memory: the driver gets ``--driver-memory`` (4g): under ``local[2]`` the cache lives in
the driver's JVM. Under ``local-cluster[N,C,M]`` each executor gets the M MiB its
worker has, and the cache lives there. The peak resident memory of this process and all
it started (JVMs, Python workers), sampled every half second, is in the table.

``local-cluster`` writes its executors' folders under ``$SPARK_HOME/work``: the bench
points ``SPARK_HOME`` at a folder of symlinks to the installed pyspark under ``--work``
(the few lines of ``tests/spark/cluster.py``'s ``_spark_home``, copied: that module is
the test suite's driver process and imports the tests' helpers).

``--markdown`` writes the table into BENCHMARKS.md's section "Spark at 20M rows
(issue 36)", one table per (rows, master): a re-run replaces its own.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_core import print_table
from bench_explore import commit, fmt
from bench_scale import parse_size, regions

BENCH_MD = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"
SECTION = "## Spark at 20M rows (issue 36) — `bench/bench_spark_scale.py`"
#: Scrambles the ids into the keys' order (coprime with the row count: checked).
PRIME = 999_999_937
SEED = 36
Row = tuple[str, str, str, str, str]


# -- the session and the rows ------------------------------------------------------------------
def spark_home(home: Path) -> Path:
    """A SPARK_HOME of symlinks to the installed pyspark's entries, so that
    ``local-cluster`` workers make their folders here (``tests/spark/cluster.py``)."""
    import pyspark

    installed = Path(pyspark.__file__).parent
    home.mkdir(parents=True, exist_ok=True)
    for entry in installed.iterdir():
        if entry.name not in ("work", "__pycache__") and not (home / entry.name).exists():
            (home / entry.name).symlink_to(entry)
    return home


def session(args: argparse.Namespace, work: Path) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(args.master)
        .appName("iqkit-bench-spark-scale")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
    )
    cluster = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*(\d+)\]", args.master)
    if cluster:
        os.environ["SPARK_HOME"] = str(spark_home(work / "spark-home"))
        builder = builder.config("spark.executor.memory", f"{cluster[3]}m")
    if args.event_log:
        Path(args.event_log).mkdir(parents=True, exist_ok=True)
        builder = builder.config("spark.eventLog.enabled", "true").config(
            "spark.eventLog.dir", str(Path(args.event_log).resolve())
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if cluster:  # the executors register a moment after the session starts
        tracker = spark.sparkContext._jsc.sc().statusTracker()
        deadline = time.monotonic() + 120
        while len(tracker.getExecutorInfos()) < int(cluster[1]) + 1:  # + the driver
            if time.monotonic() > deadline:
                sys.exit(f"{cluster[1]} executors did not register in 120 s")
            time.sleep(0.2)
    return spark


def rows_frame(spark: Any, rows: int, partitions: int) -> Any:
    """The issue's rows (module docstring), ``partitions`` Spark partitions, not cached."""
    from pyspark.sql import functions as F

    if math.gcd(PRIME, rows) != 1:
        sys.exit(f"--rows must not be a multiple of {PRIME}")
    names = regions(__import__("numpy").random.default_rng(SEED))
    width = max(9, len(str(rows - 1)))
    scrambled = F.pmod(F.col("id") * F.lit(PRIME), F.lit(rows)).cast("string")
    return spark.range(0, rows, 1, partitions).select(
        F.concat(F.lit("user"), F.lpad(scrambled, width, "0")).alias("key"),
        (F.rand(SEED) * 1000).alias("total"),
        (F.rand(SEED + 1) * 1000).cast("long").alias("n"),
        F.element_at(
            F.array(*[F.lit(name) for name in names]),
            (F.floor(F.rand(SEED + 2) * len(names)) + 1).cast("int"),
        ).alias("region"),
    )


# -- memory ------------------------------------------------------------------------------------
class PeakMemory:
    """The largest summed RSS of this process and its descendants, sampled every
    ``every`` seconds in a thread; ``mark(label)`` starts a new phase's peak."""

    def __init__(self, every: float = 0.5) -> None:
        self.every = every
        self.peaks: dict[str, int] = {}
        self.label = "start"
        self._stop = threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def mark(self, label: str) -> None:
        self.label = label

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            rss = self._tree_rss()
            self.peaks[self.label] = max(self.peaks.get(self.label, 0), rss)

    def _tree_rss(self) -> int:
        children: dict[int, list[int]] = {}
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(proc.name))
        total, todo = 0, [os.getpid()]
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            with contextlib.suppress(OSError, IndexError, ValueError):  # it ended
                total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * self._page
        return total


# -- the cases -----------------------------------------------------------------------------------
def timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def writers(df: Any, folder: Path, partitions: int) -> dict[str, Callable[[str], object]]:
    """The three writers of ``df``; each call writes a new store (or Parquet folder)
    named by its argument."""
    from iqkit.spark import write_store

    return {
        "reference": lambda name: (
            df.repartition(partitions, "key")
            .sortWithinPartitions("key")
            .write.mode("overwrite")
            .option("compression", "zstd")
            .parquet(f"{folder}/parquet/{name}")
        ),
        "write_store": lambda name: write_store(
            df, f"{folder}/ws", name, key="key", partitions=partitions, progress=False
        ),
        "datasource": lambda name: (
            df.write.format("iqkit")
            .mode("append")
            .option("store", name)
            .option("key", "key")
            .option("partitions", partitions)
            .save(f"{folder}/ds")
        ),
    }


def readers(spark: Any) -> dict[str, Callable[[str], float]]:
    """Sum of ``total``: of Parquet files (a folder), or of a store (``root:store``):
    ``iqkit`` as a user writes it, ``narrowed`` with ``.schema("total double")`` (a
    Python data source is told no column Spark prunes: only a schema narrows what the
    tasks read and send)."""
    from pyspark.sql import functions as F

    def iqkit_sum(where: str, schema: str | None = None) -> float:
        root, store = where.rsplit(":", 1)
        reader = spark.read.format("iqkit")
        if schema is not None:
            reader = reader.schema(schema)
        df = reader.option("store", store).load(root)
        return df.agg(F.sum("total")).collect()[0][0]

    return {
        "Parquet": lambda path: spark.read.parquet(path).agg(F.sum("total")).collect()[0][0],
        "iqkit": iqkit_sum,
        "narrowed": lambda where: iqkit_sum(where, "total double"),
    }


def check_sum(label: str, got: float, want: float) -> None:
    if got is None or not math.isclose(got, want, rel_tol=1e-9):
        sys.exit(f"{label}: sum(total) is {got!r}, the cached rows sum to {want!r}")


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run(args: argparse.Namespace, work: Path) -> tuple[list[Row], str]:
    from pyspark.sql import functions as F

    spark = session(args, work)
    peak = PeakMemory()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    input_parts = args.input_partitions or spark.sparkContext.defaultParallelism
    df = rows_frame(spark, args.rows, input_parts).cache()
    peak.mark("cache")
    t_cache, count = timed(df.count)
    want = df.agg(F.sum("total")).collect()[0][0]
    print(f"cached {count:,} rows in {input_parts} partitions in {t_cache:.1f} s", file=sys.stderr)
    path = write_path(df)

    # Warm-up: every writer and reader once on a small frame (Python workers, JIT).
    peak.mark("warm-up")
    small = rows_frame(spark, args.warmup_rows, input_parts).cache()
    small_want = small.agg(F.sum("total")).collect()[0][0]
    warm = work / "warm"
    for name, write in writers(small, warm, args.partitions).items():
        write("w")
        print(f"warm-up write: {name}", file=sys.stderr)
    read = readers(spark)
    check_sum("warm-up Parquet", read["Parquet"](f"{warm}/parquet/w"), small_want)
    check_sum("warm-up iqkit", read["iqkit"](f"{warm}/ws:w"), small_want)
    small.unpersist()
    shutil.rmtree(warm)

    folder = work / "out"
    write = writers(df, folder, args.partitions)
    times: dict[str, list[float]] = {name: [] for name in write}
    order = list(write)
    for r in range(args.repeat):
        last = r == args.repeat - 1
        for name in order if r % 2 == 0 else order[::-1]:
            peak.mark(f"write: {name}")
            took, _ = timed(lambda name=name, r=r: write[name](f"r{r}"))
            times[name].append(took)
            print(f"round {r}: {name} wrote in {took:.2f} s", file=sys.stderr)
        if not last:  # keep the disk use of one round
            shutil.rmtree(folder / "parquet" / f"r{r}")
            shutil.rmtree(folder / "ws" / f"r{r}")
            shutil.rmtree(folder / "ds" / f"r{r}")
    final = f"r{args.repeat - 1}"
    sizes = {
        "reference": folder_bytes(folder / "parquet" / final),
        "write_store": folder_bytes(folder / "ws" / final),
        "datasource": folder_bytes(folder / "ds" / final),
    }
    sources = {
        "Parquet": f"{folder}/parquet/{final}",
        "iqkit": f"{folder}/ws:{final}",
        "iqkit (datasource's store)": f"{folder}/ds:{final}",
        "narrowed": f"{folder}/ws:{final}",
    }
    reads: dict[str, list[float]] = {name: [] for name in sources}
    for name, where in sources.items():  # untimed first reads: each path's planning warm
        check_sum(f"read {name}", read[name.split()[0]](where), want)
    for r in range(args.repeat):
        for name in sources if r % 2 == 0 else list(sources)[::-1]:
            peak.mark(f"read: {name}")
            took, got = timed(lambda name=name: read[name.split()[0]](sources[name]))
            check_sum(f"read {name}", got, want)
            reads[name].append(took)
            print(f"round {r}: {name} read in {took:.2f} s", file=sys.stderr)
    peak.stop()
    spark.stop()
    load_after = Path("/proc/loadavg").read_text().split()[:3]

    med = {k: statistics.median(v) for k, v in {**times, **reads}.items()}
    rate = {k: args.rows / med[k] for k in times}
    out: list[Row] = []
    ref_w = med["reference"]
    for name, label in (
        ("write_store", "`write_store`"),
        ("datasource", '`df.write.format("iqkit")`'),
    ):
        ratio = ref_w / med[name]
        out.append(
            (
                f"{label}, {args.rows:,} rows into {args.partitions} partitions",
                f"{fmt(med[name])} ({rate[name]:,.0f} rows/s)",
                f"{fmt(ref_w)} ({rate['reference']:,.0f} rows/s; repartition + sort + "
                "zstd Parquet)",
                f"{ratio:.2f}× the throughput",
                "≥ 0.8× " + ("met" if ratio >= 0.8 else "MISSED"),
            )
        )
    ref_r = reads.pop("Parquet")
    t_ref_r = statistics.median(ref_r)
    for name, label, target in (
        ("iqkit", '`spark.read.format("iqkit")` + `sum(total)`', 1.5),
        ("iqkit (datasource's store)", "same, of the store `df.write.format` wrote", None),
        ("narrowed", 'same, `.schema("total double")`: only the summed column', None),
    ):
        ratio = med[name] / t_ref_r
        verdict = (
            "(info)"
            if target is None
            else f"≤ {target:g}× " + ("met" if ratio <= target else "MISSED")
        )
        out.append(
            (
                label,
                fmt(med[name]),
                f"{fmt(t_ref_r)} (`spark.read.parquet` + `sum(total)`)",
                f"{ratio:.2f}×",
                verdict,
            )
        )
    mib = 2**20
    out.append(
        (
            "bytes on disk: `write_store`'s store, `df.write.format`'s",
            f"{sizes['write_store'] / mib:,.0f} MiB, {sizes['datasource'] / mib:,.0f} MiB",
            f"{sizes['reference'] / mib:,.0f} MiB (the reference's Parquet)",
            f"{sizes['write_store'] / sizes['reference']:.1f}×",
            "(info)",
        )
    )
    worst = max(peak.peaks.items(), key=lambda kv: kv[1])
    out.append(
        (
            "peak RSS, this process and all it started (JVMs, Python workers)",
            f"{worst[1] / 2**30:.1f} GiB (during {worst[0]})",
            "",
            "",
            "(info)",
        )
    )
    runs = "; ".join(
        f"{k}: " + ", ".join(f"{t:.1f}" for t in v) for k, v in {**times, **reads}.items()
    )
    runs += f"; Parquet read: {', '.join(f'{t:.1f}' for t in ref_r)}"
    note = (
        f"commit {commit()}; `{args.master}`, driver memory {args.driver_memory}; "
        f"{args.rows:,} cached rows in {input_parts} Spark partitions ({path}); medians of "
        f"{args.repeat} round(s), seconds per run: {runs}; load average "
        f"{' '.join(load_before)} before, {' '.join(load_after)} after"
    )
    return out, note


def write_path(df: Any) -> str:
    """Which path ``write_store`` takes for ``df`` (``batch_in_place``)."""
    try:
        from iqkit.spark.batch_in_place import IN_PLACE_MAX_PARTITIONS, planned_partitions
    except ImportError:
        return "write_store shuffles"
    parts = planned_partitions(df)
    if parts is not None and parts <= IN_PLACE_MAX_PARTITIONS:
        return "write_store writes in place, no shuffle"
    return "write_store shuffles"


# -- BENCHMARKS.md ---------------------------------------------------------------------------------
def write_markdown(heading: str, table: str) -> None:
    """The section in BENCHMARKS.md: the table under ``heading`` replaced, others kept."""
    text = BENCH_MD.read_text()
    head, found, rest = text.partition(SECTION)
    body, nxt, tail = rest.partition("\n## ")
    kept = dict(re.findall(r"(?ms)^### (.+?)\n(.*?)(?=^### |\Z)", body)) if found else {}
    kept[heading] = table
    section = (
        f"{SECTION}\n\nIssue 36's Spark targets, measured by `bench/bench_spark_scale.py` "
        "(its docstring says how): the writers against "
        "`df.repartition(n, key).sortWithinPartitions(key).write.parquet` (zstd), the "
        "reader against `spark.read.parquet` of that output, each with `sum(total)`; one "
        "process, the cases taking turns. One table per size and master, each from one "
        "run (a re-run replaces its own).\n\n"
        + "".join(f"### {h}\n{kept[h].strip()}\n\n" for h in sorted(kept, key=_size_first))
    )
    if not found:
        BENCH_MD.write_text(text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n")
    else:
        BENCH_MD.write_text(head + section.rstrip("\n") + "\n" + (nxt + tail if nxt else ""))


def _size_first(heading: str) -> tuple[int, str]:
    """Tables by row count, the largest first, then by master."""
    rows = re.match(r"[\d,]+", heading)
    return (-int(rows[0].replace(",", "")) if rows else 0, heading)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=parse_size, default=20_000_000, help="20m, 2000000")
    parser.add_argument("--master", default="local[2]", help="or local-cluster[2,1,2048]")
    parser.add_argument("--partitions", type=int, default=8, help="store partitions")
    parser.add_argument("--repeat", type=int, default=1, help="timed rounds (median)")
    parser.add_argument(
        "--input-partitions", type=int, default=0, help="default: the default parallelism"
    )
    parser.add_argument("--warmup-rows", type=parse_size, default=200_000)
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a new one in /tmp)")
    parser.add_argument("--event-log", help="a folder: Spark's event log is written there")
    parser.add_argument("--markdown", action="store_true", help="write into BENCHMARKS.md")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="iqkit-spark-scale-", dir=args.work))
    try:
        table, note = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines: list[str] = []
    print_table("Spark at scale", note, table, out=lines.append)
    print("\n".join(lines))
    if args.markdown:
        when = f"Run on {time.strftime('%Y-%m-%d at %H:%M', time.gmtime())} UTC. "
        write_markdown(f"{args.rows:,} rows, `{args.master}`", when + "\n".join(lines[1:]))


if __name__ == "__main__":
    main()
