"""Exploration speed (issue 22): scans, aggregates, joins and first queries of a store,
as ratios against DuckDB (or Spark) over Parquet of the very same rows.

    .venv/bin/python bench/bench_explore.py [--rows 1000000] [--repeat 3] [--spark]
    .venv/bin/python bench/bench_explore.py --profile store-batches   # cProfile of one case
    .venv/bin/python bench/bench_explore.py --spark-writes --rows 2000000  # only case 6's writes
    .venv/bin/python bench/bench_explore.py --spark-read   # only case 6's read (records)

Builds two stores of ``--rows`` string keys in 8 partitions: ``records`` (JSON records
``{"price": float, "qty": int, "tag": short str}``, their columns declared in the
manifest's value schema, as a Spark write records them) and ``numbers`` (``int64`` values);
writes the same rows, with the same columns as a scan of the store (``partition, key,
...``), to one Parquet file each (pyarrow, zstd). Then, in this one process, for each
store:

1. an aggregate through ``iqkit.sql`` vs the same SQL on DuckDB over the Parquet file;
2. the whole store to Arrow: ``SELECT *`` through ``iqkit.sql``, and
   ``iqkit.tables.store_batches(...).read_all()``, vs DuckDB ``read_parquet`` to Arrow;
3. a join with a 10,000-row pandas DataFrame through ``iqkit.sql`` vs DuckDB;
4. a ~1% prefix scan to Arrow (``PrefixScanQuery`` + ``iqkit.tables.collect``, what
   ``%iq prefix`` runs) vs DuckDB ``WHERE key LIKE 'prefix%'``;
5. the first KeyQuery of a version vs a warm one (target: 2× warm + 5 ms);
6. with ``--spark``: ``spark.read.format("iqkit")`` + ``count()`` vs
   ``spark.read.parquet`` + ``count()``, and ``write_store`` / ``df.write.format("iqkit")``
   of ``--rows`` rows vs ``df.write.parquet`` (throughput);
7. disk: the store's ``sst/`` and ``chain/`` bytes vs the Parquet file.

Every iqkit case is *cold*, as the issue's targets are: each run gets an empty
``IQKIT_CACHE`` folder, a new engine and a new ``SQLSession`` (so every partition's
database is built and nothing is kept from a previous run); the time runs from
``iqkit.open`` to the result, as DuckDB's runs from ``duckdb.connect`` to the result.
Both sides read files the OS has in its page cache. Seconds are medians of ``--repeat``
runs (DuckDB and warm cases after one warm-up run). Each case's results are checked equal
once (aggregates value by value, scans and joins by row count and key set).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib
import math
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from bench_core import best, print_table

import iqkit
from iqkit import KeyQuery, PrefixScanQuery, StateQueryRequest
from iqkit.sqlsession import SQLSession
from iqkit.tables import collect, store_batches

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

PARTITIONS = 8
FRAME = 10_000
TAGS = tuple(f"tag{i:02d}" for i in range(16))
#: Per store: value serde, the aggregate (``{t}`` is the table), a column the join returns.
STORES = {
    "records": (
        "json",
        "SELECT tag, sum(price * qty) AS total, count(*) AS n FROM {t} GROUP BY tag ORDER BY tag",
        "price",
    ),
    "numbers": (
        "int64",
        "SELECT value % 16 AS g, sum(value) AS total, count(*) AS n FROM {t} GROUP BY g ORDER BY g",
        "value",
    ),
}
#: The records store's value schema (Spark DDL), as a Spark writer records it.
RECORD_SCHEMA = "price double, qty bigint, tag string"
JOIN = "SELECT t.key, t.{col}, p.name FROM {t} t JOIN people p ON p.key = t.key"
Row = tuple[str, str, str, str, str]


def key_of(i: int, width: int) -> str:
    return f"k{i:0{width}d}"


def build(root: Path, folder: Path, rows: int, width: int, names: tuple[str, ...]) -> float:
    """The stores ``names`` (one StoreWriter commit each) and their Parquet files; seconds
    taken."""
    t0 = time.perf_counter()
    for name in names:
        serde = STORES[name][0]
        # The records' columns are declared (what a Spark write records): a typed store.
        properties = {"value_schema": RECORD_SCHEMA} if serde == "json" else None
        iqkit.create_store(
            root,
            name,
            partitions=PARTITIONS,
            key_serde="string",
            value_serde=serde,
            properties=properties,
        )
        with iqkit.StoreWriter(root, name) as w:
            for i in range(rows):
                if serde == "json":
                    value = {"price": (i * 7919 % 10_000) / 100, "qty": i % 50, "tag": TAGS[i % 16]}
                else:
                    value = i * 3 - rows
                w.put(key_of(i, width), value)
    took = time.perf_counter() - t0
    with cold_engine(folder) as engine:  # the Parquet files hold exactly the store's scan
        for name in names:
            pq.write_table(
                store_batches(engine, name).read_all(), parquet(root, name), compression="zstd"
            )
    return took


def parquet(root: Path, name: str) -> str:
    return os.fspath(root.parent / f"{name}.parquet")


class cold_engine:
    """A fresh engine over an empty ``IQKIT_CACHE`` folder (removed on exit), on ``root``
    (default: ``folder / "root"``)."""

    def __init__(self, folder: Path, root: str | Path | None = None) -> None:
        self.cache = Path(tempfile.mkdtemp(dir=folder))
        self.root = folder / "root" if root is None else root

    def __enter__(self) -> iqkit.StateEngine:
        os.environ["IQKIT_CACHE"] = os.fspath(self.cache)
        # Cold as a new process is: no file known whole yet (store/integrity.py; absent
        # from the code before checksums, which this bench is run against in A/B).
        with contextlib.suppress(ImportError):
            importlib.import_module("iqkit.store.integrity").forget_verified()
        self.engine = iqkit.open(self.root)
        return self.engine

    def __exit__(self, *exc: object) -> None:
        self.engine.close()
        shutil.rmtree(self.cache, ignore_errors=True)


def cold_times(
    fn: Callable[[iqkit.StateEngine], object], folder: Path, repeat: int
) -> tuple[float, object]:
    """Median seconds of ``repeat`` cold runs of ``fn`` (engine opened inside the timing)."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        with cold_engine(folder) as engine:
            out = fn(engine)
            times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def duck(sql: str, people: pd.DataFrame | None = None) -> pa.Table:
    """``sql`` on a new DuckDB connection (``people`` registered when given)."""
    con = duckdb.connect(":memory:")
    try:
        if people is not None:
            con.register("people", people)
        return con.sql(sql).to_arrow_table()  # duckdb >= 1.5: a Table (.arrow() is a reader)
    finally:
        con.close()


def session_sql(
    sql: str, people: pd.DataFrame | None = None
) -> Callable[[iqkit.StateEngine], pa.Table]:
    """``sql`` through a new ``SQLSession`` on the engine, to Arrow."""

    def run(engine: iqkit.StateEngine) -> pa.Table:
        with SQLSession(engine=engine) as session:
            if people is not None:
                session.register("people", people)
            return session.query_arrow(sql)

    return run


def prefix_scan(name: str, prefix: str) -> Callable[[iqkit.StateEngine], pa.Table]:
    query = PrefixScanQuery.with_prefix(prefix)
    request = StateQueryRequest.in_store(name).with_query(query)

    def run(engine: iqkit.StateEngine) -> pa.Table:
        return collect(engine.query(request), engine.manifest(name), query=query).table

    return run


def same_aggregate(a: pa.Table, b: pa.Table) -> bool:
    rows_a, rows_b = a.to_pylist(), b.to_pylist()
    return len(rows_a) == len(rows_b) and all(
        list(ra) == list(rb)
        and all(
            math.isclose(ra[c], rb[c], rel_tol=1e-9) if isinstance(ra[c], float) else ra[c] == rb[c]
            for c in ra
        )
        for ra, rb in zip(rows_a, rows_b, strict=True)
    )


def same_keys(a: pa.Table, b: pa.Table) -> bool:
    return a.num_rows == b.num_rows and sorted(a["key"].to_pylist()) == sorted(b["key"].to_pylist())


def row(label: str, t_iq: float, t_ref: float, ref: str, target: float | None) -> Row:
    ratio = t_iq / t_ref
    verdict = (
        "(info)" if target is None else f"≤ {target:g}× " + ("met" if ratio <= target else "MISSED")
    )
    return (label, fmt(t_iq), f"{fmt(t_ref)} ({ref})", f"{ratio:.1f}×", verdict)


def fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def measure_store(name: str, folder: Path, args: argparse.Namespace, width: int) -> list[Row]:
    _, aggregate, col = STORES[name]
    path = parquet(folder / "root", name)
    pq_table = f"read_parquet('{path}')"
    step = max(1, args.rows // FRAME)
    people = pd.DataFrame({"key": [key_of(i, width) for i in range(0, args.rows, step)][:FRAME]})
    people["name"] = [f"person {i}" for i in range(len(people))]
    digits = max(1, width - round(math.log10(max(1.0, args.rows / 100))))
    prefix = "k" + "0" * (digits - 1) + "1"
    out: list[Row] = []

    def pair(
        label: str,
        iq: Callable,
        ref_sql: str,
        check: Callable,
        ref: str = "DuckDB over Parquet",
        target: float | None = 2.0,
        people_ref: pd.DataFrame | None = None,
    ) -> pa.Table:
        t_iq, got = cold_times(iq, folder, args.repeat)
        t_ref = best(lambda: duck(ref_sql, people_ref), args.repeat)
        want = duck(ref_sql, people_ref)
        if not check(got, want):
            sys.exit(f"iqkit and DuckDB differ: {name}: {label}")
        out.append(row(f"{name}: {label}", t_iq, t_ref, ref, target))
        return got

    pair(
        "aggregate through iqkit.sql, cold",
        session_sql(aggregate.format(t=name)),
        aggregate.format(t=pq_table),
        same_aggregate,
    )
    with cold_engine(folder) as engine, SQLSession(engine=engine) as session:
        session.query_arrow(aggregate.format(t=name))
        t_again = best(lambda: session.query_arrow(aggregate.format(t=name)), args.repeat)
    t_ref = best(lambda: duck(aggregate.format(t=pq_table)), args.repeat)
    out.append(
        row(
            f"{name}: same aggregate again, same SQLSession (snapshot)",
            t_again,
            t_ref,
            "DuckDB over Parquet",
            None,
        )
    )
    whole = pair(
        "SELECT * to Arrow through iqkit.sql, cold",
        session_sql(f"SELECT * FROM {name}"),
        f"SELECT * FROM {pq_table}",
        same_keys,
    )
    if whole.num_rows != args.rows:
        sys.exit(f"{name}: the store holds {whole.num_rows:,} rows, not {args.rows:,}")
    pair(
        "store_batches(...).read_all(), cold",
        lambda e: store_batches(e, name).read_all(),
        f"SELECT * FROM {pq_table}",
        same_keys,
    )
    pair(
        f"join with a {len(people):,}-row DataFrame through iqkit.sql, cold",
        session_sql(JOIN.format(t=name, col=col), people),
        JOIN.format(t=pq_table, col=col),
        same_keys,
        people_ref=people,
    )
    scanned = pair(
        "1% prefix scan to Arrow (PrefixScanQuery + collect), cold",
        prefix_scan(name, prefix),
        f"SELECT * FROM {pq_table} WHERE key LIKE '{prefix}%'",
        same_keys,
    )
    out[-1] = (
        out[-1][0].replace("1%", f"{scanned.num_rows:,}-key ({scanned.num_rows / args.rows:.1%})"),
        *out[-1][1:],
    )
    with cold_engine(folder) as engine:
        run = prefix_scan(name, prefix)
        t_warm = best(lambda: run(engine), args.repeat)
    out.append(
        row(
            f"{name}: same prefix scan, warm engine",
            t_warm,
            best(lambda: duck(f"SELECT * FROM {pq_table} WHERE key LIKE '{prefix}%'"), args.repeat),
            "DuckDB over Parquet",
            None,
        )
    )

    key = key_of(args.rows // 2, width)
    request = StateQueryRequest.in_store(name).with_query(KeyQuery.with_key(key).skip_cache())

    def lookup(engine: iqkit.StateEngine) -> object:
        result = engine.query(request).only_partition_result()
        assert result.is_success and result.result is not None, result.failure_message
        return result.result

    t_first, _ = cold_times(lookup, folder, args.repeat)
    with cold_engine(folder) as engine:
        t_warm = best(lambda: lookup(engine), 200)
    allowed = 2 * t_warm + 0.005
    out.append(
        (
            f"{name}: first KeyQuery of a version ({PARTITIONS} partitions), cold",
            fmt(t_first),
            f"{fmt(t_warm)} (warm KeyQuery)",
            f"{t_first / t_warm:,.0f}×",
            f"≤ 2× warm + 5 ms = {fmt(allowed)} " + ("met" if t_first <= allowed else "MISSED"),
        )
    )

    store = folder / "root" / name
    size = sum(
        f.stat().st_size for d in ("sst", "chain") for f in (store / d).rglob("*") if f.is_file()
    )
    pq_size = os.path.getsize(path)
    out.append(
        (
            f"{name}: disk, store sst/ + chain/ vs Parquet (zstd)",
            f"{size / 2**20:.1f} MiB",
            f"{pq_size / 2**20:.1f} MiB (Parquet)",
            f"{size / pq_size:.1f}×",
            "(info; twins ≤ +60% of the store)",
        )
    )
    return out


def spark_session() -> SparkSession:
    """The benchmark's local[2] session (as bench_spark.py), with the data source."""
    from pyspark.sql import SparkSession

    from iqkit.spark.datasource import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(PARTITIONS))
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def measure_spark(
    folder: Path, rows: int, repeat: int, *, reads: bool = True, writes: bool = True
) -> list[Row]:
    """Spark reads of the ``records`` store and its Parquet file (unless not ``reads``),
    and writes of ``rows`` rows (unless not ``writes``)."""
    spark = spark_session()
    out = measure_spark_reads(spark, folder, repeat) if reads else []
    if writes:
        out += measure_spark_writes(spark, folder, rows)
    spark.stop()
    return out


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_spark_reads(spark: SparkSession, folder: Path, repeat: int) -> list[Row]:
    root = os.fspath(folder / "root")
    out: list[Row] = []

    def iq_count() -> int:
        return spark.read.format("iqkit").option("store", "records").load(root).count()

    def pq_count() -> int:
        return spark.read.parquet(parquet(folder / "root", "records")).count()

    if iq_count() != pq_count():
        sys.exit("Spark counts differ between the store and Parquet")
    t_iq = statistics.median(timed(iq_count) for _ in range(repeat))
    t_pq = statistics.median(timed(pq_count) for _ in range(repeat))
    out.append(
        row(
            "Spark: spark.read.format('iqkit') + count() (records)",
            t_iq,
            t_pq,
            "spark.read.parquet + count()",
            1.5,
        )
    )
    return out


#: Runs of each Spark write; the best counts.
WRITE_RUNS = 3


def spark_records(spark: SparkSession, rows: int) -> DataFrame:
    """``rows`` rows of the records' columns (``key``, ``price``, ``qty``, ``tag``) as a
    Spark DataFrame: what the Spark writes write."""
    from pyspark.sql import functions as F

    return spark.range(rows).select(
        F.format_string("k%08d", F.col("id")).alias("key"),
        ((F.col("id") * 7919 % 10_000) / 100).alias("price"),
        (F.col("id") % 50).alias("qty"),
        F.concat(F.lit("tag"), F.lpad((F.col("id") % 16).cast("string"), 2, "0")).alias("tag"),
    )


def iqkit_writes(df: DataFrame, folder: Path) -> dict[str, Callable[[int], object]]:
    """iqkit's two Spark writers of ``df`` under ``folder``, by label; run ``i`` writes a
    new store of its own."""
    from iqkit.spark import write_store

    return {
        "write_store": lambda i: write_store(
            df, f"{folder}/spark-ws", f"w{i}", key="key", partitions=PARTITIONS, progress=False
        ),
        "df.write.format('iqkit')": lambda i: (
            df.write.format("iqkit")
            .mode("append")
            .option("store", f"f{i}")
            .option("key", "key")
            .option("partitions", PARTITIONS)
            .save(f"{folder}/spark-ds")
        ),
    }


def measure_spark_writes(spark: SparkSession, folder: Path, rows: int) -> list[Row]:
    """``write_store`` and ``df.write.format("iqkit")`` against ``df.write.parquet`` of
    the same ``rows`` rows, best of ``WRITE_RUNS`` each."""

    out: list[Row] = []
    df = spark_records(spark, rows).cache()
    df.count()
    writes = {
        "df.write.parquet": lambda i: df.write.mode("overwrite").parquet(f"{folder}/spark-pq"),
        **iqkit_writes(df, folder),
    }
    # The first write of each in this process pays Spark's JIT and Python worker start:
    # the best of three runs is the steady state a notebook user sees after the first
    # writes (with two, the second still ran partly before the JIT: 3.9 s against 3.3 s).
    took = {
        label: min(timed(lambda fn=fn, i=i: fn(i)) for i in range(WRITE_RUNS))
        for label, fn in writes.items()
    }
    t_pq = took["df.write.parquet"]
    for label in ("write_store", "df.write.format('iqkit')"):
        ratio = t_pq / took[label]
        out.append(
            (
                f"Spark: {label}, {rows:,} rows ({PARTITIONS} partitions), best of {WRITE_RUNS}",
                f"{rows / took[label]:,.0f} rows/s ({fmt(took[label])})",
                f"{rows / t_pq:,.0f} rows/s ({fmt(t_pq)}, df.write.parquet)",
                f"{ratio:.2f}× throughput",
                "≥ 0.7× " + ("met" if ratio >= 0.7 else "MISSED"),
            )
        )
    return out


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", type=int, default=int(os.environ.get("IQKIT_BENCH_ROWS", 1_000_000))
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--spark", action="store_true", help="also the Spark rows (minutes)")
    parser.add_argument(
        "--spark-writes",
        action="store_true",
        help="only the Spark write rows (no store is built)",
    )
    parser.add_argument(
        "--spark-read",
        action="store_true",
        help="only the Spark read of the records store against spark.read.parquet",
    )
    parser.add_argument(
        "--profile",
        choices=("store-batches", "first-key"),
        help="only cProfile one cold case of the records store",
    )
    args = parser.parse_args()
    width = max(7, len(str(args.rows - 1)))
    outer_cache = os.environ.get("IQKIT_CACHE")
    if args.spark_writes:
        with tempfile.TemporaryDirectory() as tmp:
            table = measure_spark(Path(tmp), args.rows, args.repeat, reads=False)
        print_table("Spark writes", f"commit {commit()}; {args.rows:,} rows", table)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        names = ("records",) if args.spark_read else tuple(STORES)
        build_s = build(folder / "root", folder, args.rows, width, names)
        if args.profile:
            profile(args.profile, folder)
            return
        table: list[Row] = []
        if args.spark_read:
            table.extend(measure_spark(folder, args.rows, args.repeat, writes=False))
        else:
            for name in STORES:
                table.extend(measure_store(name, folder, args, width))
        if args.spark:
            table.extend(measure_spark(folder, args.rows, args.repeat))
    if outer_cache is not None:
        os.environ["IQKIT_CACHE"] = outer_cache
    load = os.getloadavg()[0]
    print_table(
        "exploration",
        f"commit {commit()}; duckdb {duckdb.__version__}; {args.rows:,} keys per store, "
        f"{PARTITIONS} partitions (built in {build_s:.0f} s); median of {args.repeat} runs, "
        f"iqkit cold (new engine, empty IQKIT_CACHE, new SQLSession) unless marked; "
        f"load average at the end {load:.1f}",
        table,
    )


def profile(case: str, folder: Path) -> None:
    """The top of a cProfile of one cold case on the records store (cumulative time).
    No SQL case: a ``SQLSession`` runs statements on its worker thread, which cProfile
    does not see; ``store_batches`` is the stream the session hands DuckDB."""
    fn = {
        "store-batches": lambda e: store_batches(e, "records").read_all(),
        "first-key": lambda e: e.query(
            StateQueryRequest.in_store("records").with_query(KeyQuery.with_key("k0000001"))
        ),
    }[case]
    with cold_engine(folder) as engine:
        prof = cProfile.Profile()
        prof.runcall(fn, engine)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
