"""The floors under issue 22's Spark targets: what any reader or writer of a store's
layout costs in Spark on this machine, measured beside iqkit and the Parquet reference in
one process.

    .venv/bin/python bench/bench_spark_floors.py [--rows 1000000] [--write-rows 2000000]

Why this exists: issue 22 asks ``spark.read.format("iqkit")`` + ``count()`` for at most
1.5× ``spark.read.parquet`` + ``count()``, and both Spark writers for at least 0.7× the
throughput of ``df.write.parquet``. The product contract makes ``format("iqkit")`` a Spark *Python*
data source (available as soon as iqkit is installed, whatever the order of session
creation: a JVM source would need its jar on the classpath before the session starts).
This bench times, on the same rows as ``bench_explore.py``:

Reads (median of ``--repeat``, ``--rows`` keys in 8 store partitions):
  * the reference: ``spark.read.parquet`` of the rows + ``count()``;
  * a Python data source that reads nothing: its two tasks yield the same number of rows
    built from ``numpy.arange`` (the least any Python data source does for those rows);
  * Spark's own Parquet reader over the store's columnar twins (no merge of a partition's
    files, no Python): the least a JVM reader of the store would do;
  * iqkit.

Writes (best of 3, ``--write-rows`` rows, cached DataFrame):
  * the reference: ``df.write.parquet``;
  * a Python data source writer that only counts the Arrow batches Spark hands it;
  * Spark's own Parquet writer producing one of the two things a store write must produce,
    the twins: rows sorted by (store partition, key), one file per store partition
    (``pmod(hash(key), 8)`` and ``partitionBy``), zstd;
  * ``write_store`` and ``df.write.format("iqkit")``, which write the SSTs and the twins.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench_explore import (
    PARTITIONS,
    WRITE_RUNS,
    iqkit_writes,
    spark_records,
    spark_session,
    timed,
)
from pyspark.sql import functions as F
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

from iqkit.spark import write_store

#: Tasks of the do-nothing reader: as many as iqkit's read of 8 small partitions uses
#: here (``read_tasks.spread``: as many as the driver's cores, 2).
READ_TASKS = 2


class _ReadyRows(DataSource):
    """A Python data source whose tasks yield ``rows`` rows of the records' columns made
    from ``numpy.arange`` (nothing is read): the floor of any Python data source."""

    @classmethod
    def name(cls) -> str:
        return "iqkit_bench_ready_rows"

    def schema(self) -> str:
        return "partition int, key string, price double, qty bigint, tag string"

    def reader(self, schema: Any) -> DataSourceReader:
        return _ReadyRowsReader(int(self.options["rows"]))

    def writer(self, schema: Any, overwrite: bool) -> _CountingWriter:
        return _CountingWriter()


class _ReadyRowsReader(DataSourceReader):
    def __init__(self, rows: int) -> None:
        self.rows = rows

    def partitions(self) -> list[InputPartition]:
        share = -(-self.rows // READ_TASKS)
        return [
            InputPartition((i * share, min(self.rows, (i + 1) * share))) for i in range(READ_TASKS)
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        lo, hi = partition.value
        for start in range(lo, hi, 65_536):
            ids = np.arange(start, min(hi, start + 65_536), dtype=np.int64)
            text = pa.array(ids).cast(pa.string())
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array((ids % PARTITIONS).astype(np.int32)),
                    pc.binary_join_element_wise("k", pc.utf8_lpad(text, 8, "0"), ""),
                    pa.array((ids * 7919 % 10_000) / 100),
                    pa.array(ids % 50),
                    pc.binary_join_element_wise("tag", pc.utf8_lpad(text, 2, "0"), ""),
                ],
                names=["partition", "key", "price", "qty", "tag"],
            )


class _Counted(WriterCommitMessage):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class _CountingWriter(DataSourceArrowWriter):
    """Counts the Arrow batches Spark hands a Python writer: the hand-off's floor."""

    def write(self, iterator: Iterator[Any]) -> _Counted:
        return _Counted(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass


def median_of(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up: the first run in the process pays planning workers' start
    return statistics.median(timed(fn) for _ in range(repeat))


def measure_reads(spark: Any, folder: Path, rows: int, repeat: int) -> list[tuple]:
    root, ref = os.fspath(folder / "root"), os.fspath(folder / "records.parquet")
    df = spark_records(spark, rows)
    write_store(df, root, "records", key="key", partitions=PARTITIONS, progress=False)
    df.write.parquet(ref)
    twins = sorted(glob.glob(f"{root}/records/sst/*/*.parquet"))
    cases: dict[str, Callable[[], int]] = {
        "spark.read.parquet + count() (reference)": lambda: spark.read.parquet(ref).count(),
        "Python data source yielding ready-made rows": lambda: (
            spark.read.format(_ReadyRows.name()).option("rows", rows).load().count()
        ),
        "spark.read.parquet of the store's twins (no merge)": lambda: spark.read.parquet(
            *twins
        ).count(),
        "spark.read.format('iqkit') + count()": lambda: (
            spark.read.format("iqkit").option("store", "records").load(root).count()
        ),
    }
    counts = {label: fn() for label, fn in cases.items()}
    if len(set(counts.values())) != 1:
        sys.exit(f"the read cases count different rows: {counts}")
    took = {label: median_of(fn, repeat) for label, fn in cases.items()}
    t_ref = took["spark.read.parquet + count() (reference)"]
    return [
        (f"read, {rows:,} rows: {label}", f"{t:.3f} s", f"{t / t_ref:.2f}× the reference")
        for label, t in took.items()
    ]


def measure_writes(spark: Any, folder: Path, rows: int) -> list[tuple]:
    df = spark_records(spark, rows).cache()
    df.count()
    cases: dict[str, Callable[[int], object]] = {
        "df.write.parquet (reference)": lambda i: df.write.mode("overwrite").parquet(
            f"{folder}/w-parquet"
        ),
        "Python data source writer counting its batches": lambda i: (
            df.write.format(_ReadyRows.name()).mode("append").save()
        ),
        "Spark's Parquet writer, twins only: sorted, a file per store partition": lambda i: (
            df.withColumn("p", F.expr(f"pmod(hash(key), {PARTITIONS})"))
            .sortWithinPartitions("p", "key")
            .write.mode("overwrite")
            .partitionBy("p")
            .option("compression", "zstd")
            .parquet(f"{folder}/w-twins")
        ),
        **{f"{label} (SSTs and twins)": fn for label, fn in iqkit_writes(df, folder).items()},
    }
    took = {
        label: min(timed(lambda fn=fn, i=i: fn(i)) for i in range(WRITE_RUNS))
        for label, fn in cases.items()
    }
    t_ref = took["df.write.parquet (reference)"]
    return [
        (f"write, {rows:,} rows: {label}", f"{t:.2f} s", f"{t_ref / t:.2f}× the throughput")
        for label, t in took.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--write-rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    spark = spark_session()
    spark.dataSource.register(_ReadyRows)
    with tempfile.TemporaryDirectory(prefix="iqkit-floors-") as tmp:
        folder = Path(tmp)
        out = measure_reads(spark, folder, args.rows, args.repeat)
        out += measure_writes(spark, folder, args.write_rows)
    spark.stop()
    print(
        f"# Spark floors — {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f} at the end\n"
    )
    print("| case | time | ratio |\n|---|---|---|")
    for case in out:
        print("| " + " | ".join(case) + " |")


if __name__ == "__main__":
    main()
